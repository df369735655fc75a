//! Branching: a cell's `parent` sends the session to the state after
//! another cell, by resuming a fork checkpoint of it (or of its nearest
//! ancestor that has one) in place of the live interpreter, else to a
//! fresh interpreter where the next call rebuilds it (`resume.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::checkpoints::cell_args;
use super::error::SessionError;
use super::lifecycle::Pending;
use super::lineage::{PathCell, ranges};
use super::manager::SessionManager;
use super::state::Session;

/// How long a switch to a checkpoint may take (the driver forks and hands
/// its descriptors over; far less in practice).
const SWITCH_TIMEOUT: Duration = Duration::from_secs(30);

impl SessionManager {
    /// A cell's `parent`: unless the interpreter holds the state right after
    /// cell `target` (0: a fresh interpreter), it goes there: by resuming
    /// the checkpoint of `target` or of its nearest ancestor that has one,
    /// else in a fresh interpreter; the next step re-runs what is missing.
    pub(super) async fn branch_to(
        &self,
        sess: &Arc<Session>,
        target: u64,
    ) -> Result<(), SessionError> {
        let _guard = sess.start_lock.lock().await;
        let (chain, cut) = {
            let mut st = sess.lock();
            self.refresh(sess, &mut st);
            if let Some(busy) = sess.busy_now(&st) {
                return Err(busy);
            }
            if st.head().unwrap_or(0) == target && st.lifecycle.pending().is_none() {
                return Ok(());
            }
            if target == 0 {
                (Vec::new(), false)
            } else {
                st.lineage.chain_to(target).ok_or_else(|| {
                    let ids: Vec<u64> = st.lineage.tree().keys().copied().collect();
                    SessionError::Invalid(format!(
                        "parent {target} is not a finished cell of session '{}' (its cells: {}); python_history lists them with their parents, 0 means a fresh interpreter",
                        sess.name,
                        if ids.is_empty() { "none".to_string() } else { ranges(&ids) }
                    ))
                })?
            }
        };
        if !cut
            && !chain.is_empty()
            && let Some(holds) = self.resume_checkpoint(sess, &chain, target).await
        {
            self.after_resume(sess, chain, holds, target);
            self.persist_head(sess, Some(target));
            return Ok(());
        }
        let old = {
            let mut st = sess.lock();
            if let Some(note) = st.checkpoints.why_none(&chain) {
                st.notes.push(note);
            }
            st.clear_path();
            st.lineage.set_path(chain, cut);
            st.lifecycle.set_pending(Pending::Branch(target));
            st.inbox.completed = None;
            st.checkpoints.clear();
            st.worker.take()
        };
        if let Some(old) = old {
            old.kill();
        }
        self.persist_head(sess, (target != 0).then_some(target));
        Ok(())
    }

    /// Goes to the state after the last cell of `chain` that has a copy in
    /// the live interpreter: the copy takes the live one's place (which
    /// leaves a copy of its own state behind). Returns how many cells of
    /// `chain` the interpreter then holds, or None when no copy was used.
    pub(super) async fn resume_checkpoint(
        &self,
        sess: &Arc<Session>,
        chain: &[PathCell],
        target: u64,
    ) -> Option<usize> {
        let (worker, idx, copy, head) = {
            let mut st = sess.lock();
            st.checkpoints.settle();
            if st.lifecycle.pending().is_some() || st.inbox.running.is_some() {
                return None;
            }
            let worker = st.worker.clone().filter(|w| w.exit_info().is_none())?;
            // The copy of a cell of the chain, or of another cell that ran
            // the same code on the same state (same hash).
            let copy_of = |c: &PathCell| st.checkpoints.copy_of(c, st.lineage.tree());
            let (idx, copy) = chain
                .iter()
                .enumerate()
                .rev()
                .find_map(|(i, c)| copy_of(c).map(|copy| (i, copy)))?;
            (worker, idx, copy, st.head())
        };
        let cell = copy;
        let same = if cell == chain[idx].id {
            String::new()
        } else {
            format!(" (cell {cell} ran the same code on the same state)")
        };
        let started = Instant::now();
        let mut args = cell_args(cell);
        if let Some(h) = head.filter(|_| self.durable.checkpoints > 1) {
            args.insert("head".into(), Value::from(h));
        }
        let reply = worker.control("switch", args, SWITCH_TIMEOUT).await;
        let mut st = sess.lock();
        match reply {
            Ok(r) if r.get("ok").and_then(Value::as_bool) == Some(true) => {
                if let Some(pid) = r.get("pid").and_then(Value::as_u64) {
                    worker.set_live_pid(pid as u32);
                }
                let left = head.filter(|_| self.durable.checkpoints > 1);
                st.checkpoints.resumed(cell, left);
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                let reached = chain[idx].id;
                st.notes.push(if reached == target {
                    format!(
                        "Session '{}' switched to the state after cell {target} by resuming its checkpoint{same} in {ms:.1} ms; nothing was re-run.",
                        sess.name
                    )
                } else {
                    format!(
                        "Resumed the checkpoint of cell {reached}{same} (an ancestor) in {ms:.1} ms."
                    )
                });
                Some(idx + 1)
            }
            other => {
                tracing::debug!(session = %sess.name, cell, ?other, "checkpoint not resumed");
                st.checkpoints.lost(cell);
                None
            }
        }
    }

    /// After a resume: the path is `chain` and the bounds hold.
    pub(super) fn after_resume(
        &self,
        sess: &Session,
        chain: Vec<PathCell>,
        holds: usize,
        target: u64,
    ) {
        let mut st = sess.lock();
        st.clear_path();
        st.lineage.set_path(chain, false);
        st.lineage.set_skip(holds);
        if holds < st.lineage.path().len() {
            st.lifecycle.set_pending(Pending::Branch(target));
        }
        if let Some(worker) = st.worker.clone() {
            let head = st.head();
            st.checkpoints
                .evict(&worker, head, self.durable.checkpoints);
        }
    }
}
