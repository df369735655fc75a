//! Fork checkpoints of Python sessions: after a cell that took a while, the
//! idle interpreter forks a frozen copy holding the state right after it
//! (copy-on-write); going back to that cell (`parent`) resumes the copy in
//! place of the live interpreter instead of re-running cells (`branch.rs`).
//! Bounded per session (--checkpoints), least recently used dropped first,
//! never the head's. Copies belong to one interpreter: a new interpreter
//! has none. This file is the copies an interpreter holds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::lineage::PathCell;
use crate::worker::Worker;

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
    pub(super) fn settle(&mut self) {
        if self.asked.is_empty() {
            return;
        }
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
pub(super) fn cell_args(cell: u64) -> serde_json::Map<String, Value> {
    let mut args = serde_json::Map::new();
    args.insert("cell".into(), Value::from(cell));
    args
}

impl Checkpoints {
    /// Asks `worker` for a copy of the state after `cell` (sent now, so it
    /// comes before the next cell's request), then keeps at most `limit`
    /// copies, never dropping `head`'s.
    pub(super) fn ask(&mut self, worker: &Worker, cell: u64, head: Option<u64>, limit: usize) {
        let Ok((_, rx)) = worker.request("checkpoint", cell_args(cell)) else {
            return;
        };
        worker.mark_copies();
        self.held.insert(cell, Instant::now());
        self.refused.remove(&cell);
        self.asked.push((cell, rx));
        self.evict(worker, head, limit);
    }

    /// Drops the least recently used copies beyond `limit` (--checkpoints),
    /// never the copy of the head's cell.
    pub(super) fn evict(&mut self, worker: &Worker, head: Option<u64>, limit: usize) {
        while self.held.len() > limit {
            let victim = self
                .held
                .iter()
                .filter(|(cell, _)| Some(**cell) != head)
                .min_by_key(|(_, used)| **used)
                .map(|(cell, _)| *cell);
            let Some(victim) = victim else { break };
            self.held.remove(&victim);
            let _ = worker.request("drop", cell_args(victim));
        }
    }

    /// Drops the least recently used copy (the session nears its memory
    /// limit); its cell.
    pub(super) fn shed(&mut self, worker: &Worker) -> Option<u64> {
        let cell = self
            .held
            .iter()
            .min_by_key(|(_, used)| **used)
            .map(|(cell, _)| *cell)?;
        self.held.remove(&cell);
        self.refused.insert(
            cell,
            "it was dropped to keep the session under its memory limit".into(),
        );
        let _ = worker.request("drop", cell_args(cell));
        Some(cell)
    }

    /// The copy that holds the state after `c`: its own, or that of
    /// another cell of `tree` that ran the same code on the same state
    /// (same hash).
    pub(super) fn copy_of(&self, c: &PathCell, tree: &BTreeMap<u64, PathCell>) -> Option<u64> {
        if self.held.contains_key(&c.id) {
            return Some(c.id);
        }
        self.held
            .keys()
            .find(|id| tree.get(id).is_some_and(|t| t.hash == c.hash))
            .copied()
    }

    /// The copy of `cell` was resumed; with `head` (the state left behind)
    /// it is the most recently used.
    pub(super) fn resumed(&mut self, cell: u64, head: Option<u64>) {
        let now = Instant::now();
        self.held.insert(cell, now);
        if let Some(h) = head {
            self.held.insert(h, now - Duration::from_millis(1));
        }
    }

    /// The copy of `cell` could not be resumed: it is gone.
    pub(super) fn lost(&mut self, cell: u64) {
        self.held.remove(&cell);
    }
}
