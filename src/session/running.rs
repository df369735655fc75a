//! A cell in the worker: sending one (the primitive a call's cell, a
//! rebuild's re-run and a queued cell all use), and following the running
//! cell until it finishes, asks for input or a wait runs out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::time::Instant as TokioInstant;

use super::error::SessionError;
use super::inbox::RunningCell;
use super::lifecycle::{Pending, running_report};
use super::manager::SessionManager;
use super::report::{CellReport, CellStatus, Images};
use super::source::StoredSource;
use super::state::{Session, SessionState};
use crate::output::Capture;
use crate::output::log::CellLog;
use crate::worker::{Language, Worker};

impl SessionManager {
    /// Sends cell `number` running `source` and makes it the running cell;
    /// returns the output that arrived since the previous cell finished.
    pub(super) fn send_cell(
        &self,
        sess: &Session,
        st: &mut SessionState,
        worker: &Worker,
        number: u64,
        source: Arc<StoredSource>,
    ) -> Result<Capture, SessionError> {
        // Taken before the cell starts: whatever is there was written
        // after the previous cell finished.
        let mut background = worker.take_output();
        let late = background.take_log();
        let last_cell = st.inbox.last();
        st.kept.add_late(last_cell, late);
        worker.start_cell_log(self.limits.cell_log_bytes);
        let background_images = st.kept.take_background_images();
        if matches!(
            st.lifecycle.pending(),
            Some(Pending::Crashed | Pending::KernelRestarted)
        ) {
            // Not rebuilt: this cell starts a new path in the fresh interpreter.
            st.clear_path();
        }
        worker
            .send(&source.as_source().request(number))
            .map_err(|source| SessionError::Worker {
                session: sess.name.clone(),
                source,
            })?;
        st.inbox.delivered = None;
        st.last_used = Instant::now();
        let mut run = self.new_running_cell(number, sess.language, source);
        run.parent = st.head();
        run.images.extend(background_images, self.limits.max_images);
        st.inbox.running = Some(run);
        Ok(background)
    }

    /// The record of a cell just sent to the worker.
    pub(super) fn new_running_cell(
        &self,
        number: u64,
        lang: Language,
        source: Arc<StoredSource>,
    ) -> RunningCell {
        RunningCell {
            number,
            parent: None,
            code: source.as_source().describe(),
            source,
            replay: false,
            started: Instant::now(),
            prompt: None,
            output: Capture::new(
                self.spec.output_head_bytes,
                self.spec.output_tail_bytes,
                lang.output_tool(),
            ),
            images: Images::default(),
            log: CellLog::new(number),
            stop_notes: Vec::new(),
            killed_by_ferrepl: false,
            tool_calls: 0,
            early: Default::default(),
        }
    }

    pub(super) fn next_wake(&self, worker: &Worker, deadline: TokioInstant) -> TokioInstant {
        match worker.exit_info() {
            // Once past, `refresh` has taken the death in already.
            Some(e) if e.at + self.limits.crash_grace > Instant::now() => {
                let at = TokioInstant::from_std(e.at + self.limits.crash_grace);
                at.min(deadline)
            }
            _ => deadline,
        }
    }

    /// Returns when the running cell finishes, asks for input, or `wait` runs out.
    pub(super) async fn collect(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        self.watch(sess, worker, wait, |st, timed_out| {
            if let Some(rb) = st.lifecycle.rebuild() {
                // The queued cell (if any) runs once it is done.
                return timed_out.then(|| running_report(&sess.name, sess.language, rb));
            }
            if let Some(done) = st.inbox.completed.take() {
                let notes = std::mem::take(&mut st.notes);
                let done = done.with_notes_first(notes);
                st.inbox.delivered = Some(done.clone());
                return Some(Ok(done));
            }
            let Some(run) = st.inbox.running.as_mut() else {
                // Another call took the result first (perhaps one whose
                // client is gone): this one gets it too.
                return Some(
                    st.inbox
                        .redelivery()
                        .ok_or_else(|| SessionError::Idle(sess.language, sess.name.clone())),
                );
            };
            if run.prompt.is_none() && !timed_out {
                return None;
            }
            if run.prompt.is_none() {
                run.absorb(worker.take_output());
            }
            let (status, prompt) = match &run.prompt {
                Some((p, _)) => (CellStatus::WaitingInput, Some(p.clone())),
                None => (CellStatus::Running, None),
            };
            let report = CellReport {
                status,
                session: sess.name.clone(),
                language: sess.language,
                cell: run.number,
                output: run.output.take().render(),
                background: None,
                value: None,
                error: None,
                prompt,
                elapsed_ms: run.started.elapsed().as_secs_f64() * 1000.0,
                images: run.images.take(),
                notes: Vec::new(),
            };
            run.early.add(&report);
            let notes = std::mem::take(&mut st.notes);
            Some(Ok(report.with_notes_first(notes)))
        })
        .await
    }

    /// Re-checks the session whenever its worker reports something, a
    /// rebuild ends (and when a crash's grace runs out) until `check` gives
    /// an answer; `check` is told whether `wait` has passed.
    pub(super) async fn watch<T>(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        wait: Duration,
        mut check: impl FnMut(&mut SessionState, bool) -> Option<T>,
    ) -> T {
        let deadline = TokioInstant::now() + wait;
        let mut rx = worker.subscribe();
        let mut changed = sess.changed.subscribe();
        loop {
            rx.borrow_and_update();
            changed.borrow_and_update();
            {
                let mut st = sess.lock();
                self.refresh(sess, &mut st);
                if let Some(answer) = check(&mut st, TokioInstant::now() >= deadline) {
                    return answer;
                }
            }
            let wake = self.next_wake(worker, deadline);
            tokio::select! {
                _ = rx.changed() => {}
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}
