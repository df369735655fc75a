//! Fork checkpoints of Python sessions: after a cell that took a while, the
//! idle interpreter forks a frozen copy holding the state right after it
//! (copy-on-write); going back to that cell (`parent`) resumes the copy in
//! place of the live interpreter instead of re-running cells. Bounded per
//! session (--checkpoints), least recently used dropped first, never the
//! head's. Copies belong to one interpreter: a new interpreter has none.

use super::durable::{PathCell, Pending};
use super::report::CellStatus;
use super::*;

/// How long a switch to a checkpoint may take (the driver forks and hands
/// its descriptors over; far less in practice).
const SWITCH_TIMEOUT: Duration = Duration::from_secs(30);

/// The frozen copies of one interpreter's states, by cell.
#[derive(Default)]
pub(super) struct Checkpoints {
    /// Cell -> when it was last taken or resumed.
    held: BTreeMap<u64, Instant>,
    /// Requests not answered yet: a refusal (threads running) removes the cell.
    asked: Vec<(u64, tokio::sync::oneshot::Receiver<Value>)>,
    /// Why a cell has no copy, for the account of a rebuild.
    refused: BTreeMap<u64, String>,
}

impl Checkpoints {
    pub(super) fn clear(&mut self) {
        *self = Checkpoints::default();
    }

    /// Why the cells of `chain` that asked for a copy have none (the
    /// interpreter refused: threads), for the agent.
    pub(super) fn why_none(&self, chain: &[PathCell]) -> Option<String> {
        let (cell, why) = chain
            .iter()
            .rev()
            .find_map(|c| self.refused.get(&c.id).map(|w| (c.id, w)))?;
        Some(format!(
            "Cell {cell} has no checkpoint: {why}; the cells up to it are re-run in a fresh interpreter, where threads they start run again."
        ))
    }

    /// Takes in the driver's answers to checkpoint requests.
    fn settle(&mut self) {
        let mut still = Vec::new();
        for (cell, mut rx) in self.asked.drain(..) {
            match rx.try_recv() {
                Ok(reply) if reply.get("ok").and_then(Value::as_bool) == Some(true) => {}
                Ok(reply) => {
                    self.held.remove(&cell);
                    let why = reply
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("the interpreter refused")
                        .to_string();
                    self.refused.insert(cell, why);
                }
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => still.push((cell, rx)),
                Err(_) => {
                    self.held.remove(&cell);
                }
            }
        }
        self.asked = still;
    }
}

/// `{cell}`, the argument of the driver's checkpoint requests.
fn cell_args(cell: u64) -> serde_json::Map<String, Value> {
    let mut args = serde_json::Map::new();
    args.insert("cell".into(), Value::from(cell));
    args
}

impl SessionManager {
    /// After cell `cell` finished: a frozen copy of the state, if the cell
    /// was worth one (ok, long enough, a Python interpreter with copies on).
    pub(super) fn checkpoint_after(
        &self,
        sess: &Session,
        st: &mut SessionState,
        cell: u64,
        report: &CellReport,
    ) {
        let limit = self.durable.checkpoints;
        if limit == 0
            || sess.language != Language::Python
            || report.status != CellStatus::Ok
            || report.elapsed_ms < self.durable.checkpoint_min.as_secs_f64() * 1000.0
        {
            return;
        }
        let Some(worker) = st.worker.clone() else {
            return;
        };
        // Sent now, so it comes before the next cell's request.
        let Ok((_, rx)) = worker.request("checkpoint", cell_args(cell)) else {
            return;
        };
        worker.mark_copies();
        st.checkpoints.held.insert(cell, Instant::now());
        st.checkpoints.refused.remove(&cell);
        st.checkpoints.asked.push((cell, rx));
        self.evict(st, &worker);
    }

    /// Drops the least recently used copies beyond --checkpoints, never
    /// the copy of the head's cell.
    fn evict(&self, st: &mut SessionState, worker: &Worker) {
        let head = st.head();
        while st.checkpoints.held.len() > self.durable.checkpoints {
            let victim = st
                .checkpoints
                .held
                .iter()
                .filter(|(cell, _)| Some(**cell) != head)
                .min_by_key(|(_, used)| **used)
                .map(|(cell, _)| *cell);
            let Some(victim) = victim else { break };
            st.checkpoints.held.remove(&victim);
            let _ = worker.request("drop", cell_args(victim));
        }
    }

    /// Drops the least recently used copy of session `name` (its memory
    /// nears the session's limit).
    pub(super) fn shed_copy(&self, name: &str) {
        let Some(sess) = self.sessions().get(name).cloned() else {
            return;
        };
        let mut st = sess.lock();
        let Some(worker) = st.worker.clone() else {
            return;
        };
        let victim = st
            .checkpoints
            .held
            .iter()
            .min_by_key(|(_, used)| **used)
            .map(|(cell, _)| *cell);
        if let Some(cell) = victim {
            st.checkpoints.held.remove(&cell);
            st.checkpoints.refused.insert(
                cell,
                "it was dropped to keep the session under its memory limit".into(),
            );
            let _ = worker.request("drop", cell_args(cell));
            tracing::info!(session = %name, cell, "checkpoint dropped: the session nears its memory limit");
        }
    }

    /// Answers to checkpoint requests, taken in by `refresh`.
    pub(super) fn settle_checkpoints(&self, st: &mut SessionState) {
        if !st.checkpoints.asked.is_empty() {
            st.checkpoints.settle();
        }
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
            self.settle_checkpoints(&mut st);
            if st.pending.is_some() || st.running.is_some() {
                return None;
            }
            let worker = st.worker.clone().filter(|w| w.exit_info().is_none())?;
            // The copy of a cell of the chain, or of another cell that ran
            // the same code on the same state (same hash).
            let copy_of = |c: &PathCell| {
                if st.checkpoints.held.contains_key(&c.id) {
                    return Some(c.id);
                }
                st.checkpoints
                    .held
                    .keys()
                    .find(|id| st.tree.get(id).is_some_and(|t| t.hash == c.hash))
                    .copied()
            };
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
                let now = Instant::now();
                st.checkpoints.held.insert(cell, now);
                if let Some(h) = head.filter(|_| self.durable.checkpoints > 1) {
                    st.checkpoints
                        .held
                        .insert(h, now - Duration::from_millis(1));
                }
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
                st.checkpoints.held.remove(&cell);
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
        for cell in chain {
            st.extend_path(cell);
        }
        st.skip = holds;
        if holds < st.path.len() {
            st.pending = Some(Pending::Branch(target));
        }
        if let Some(worker) = st.worker.clone() {
            self.evict(&mut st, &worker);
        }
    }
}
