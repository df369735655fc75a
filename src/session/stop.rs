//! Stopping a cell: an interrupt (SIGINT, or the interrupt_request of a
//! kernel interrupted by message), a second one after --interrupt-grace,
//! then a kill, each step noted on the cell's result; and the cell time limit
//! (--max-cell-seconds) that stops a cell which runs too long.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::manager::SessionManager;
use super::state::Session;
use crate::worker::Worker;

impl SessionManager {
    /// Stops cell `cell`: an interrupt, again after a grace period, then SIGKILL.
    /// The outcome is left as the session's completed result, annotated.
    pub(super) async fn stop_cell(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        cell: u64,
        reason: Option<String>,
    ) {
        let grace = self.limits.interrupt_grace;
        // Notes go on the running cell before each step, so whichever call
        // collects the result (this one or a concurrent wait) carries them.
        if let Some(reason) = reason {
            self.annotate_running(sess, cell, reason, false);
        }
        for attempt in 0..2 {
            if attempt == 1 {
                self.annotate_running(
                    sess,
                    cell,
                    "The cell ignored the first interrupt; a second one was sent.".to_string(),
                    false,
                );
            }
            let sent = std::time::Instant::now();
            if let Some(note) = worker.interrupt(grace).await {
                self.annotate_running(sess, cell, note, false);
            }
            let left = grace.saturating_sub(sent.elapsed());
            if self.wait_cell_gone(sess, worker, cell, left).await {
                return;
            }
        }
        self.annotate_running(
            sess,
            cell,
            format!(
                "The cell did not stop after two interrupts over {:.0} s (it swallows KeyboardInterrupt or is stuck in native code), so its interpreter was killed. All variables of session '{}' are lost; the next call starts a fresh interpreter.",
                grace.as_secs_f64() * 2.0,
                sess.name
            ),
            true,
        );
        worker.signal_group(Signal::SIGKILL);
        let bound = self.limits.crash_grace + Duration::from_secs(5);
        self.wait_cell_gone(sess, worker, cell, bound).await;
    }

    pub(super) fn annotate_running(&self, sess: &Session, cell: u64, note: String, killing: bool) {
        let mut st = sess.lock();
        if let Some(run) = st.inbox.running.as_mut().filter(|r| r.number == cell) {
            run.stop_notes.push(note);
            run.killed_by_ferrepl |= killing;
        }
    }

    /// Waits until cell `cell` is no longer running (finished or crashed).
    pub(super) async fn wait_cell_gone(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        cell: u64,
        wait: Duration,
    ) -> bool {
        self.watch(sess, worker, wait, |st, timed_out| {
            let gone = st.inbox.running.as_ref().map(|r| r.number) != Some(cell);
            (gone || timed_out).then_some(gone)
        })
        .await
    }

    /// Enforces --max-cell-seconds on one cell.
    pub(super) fn arm_time_limit(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        cell: u64,
    ) {
        let Some(limit) = self.limits.max_cell else {
            return;
        };
        let this = self.clone();
        let sess = sess.clone();
        let worker = worker.clone();
        tokio::spawn(async move {
            if this.wait_cell_gone(&sess, &worker, cell, limit).await {
                return;
            }
            crate::metrics::limit_kill(crate::metrics::Limit::CellTime);
            let reason = format!(
                "Cell {cell} ran past the time limit of {:.0} s (--max-cell-seconds) and was interrupted.",
                limit.as_secs_f64()
            );
            this.stop_cell(&sess, &worker, cell, Some(reason)).await;
        });
    }
}
