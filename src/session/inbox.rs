//! The inbox of a session's cells: the running cell (its output, images
//! and prompt as they arrive), a finished result no call has collected
//! yet, the last one delivered (given again if its response was lost),
//! and the cells' numbers.

use std::sync::Arc;
use std::time::Instant;

use super::kept::EarlyParts;
use super::report::{CellReport, Images};
use super::source::StoredSource;
use crate::output::Capture;
use crate::output::log::CellLog;

pub(super) struct RunningCell {
    pub(super) number: u64,
    /// The cell whose state it ran on.
    pub(super) parent: Option<u64>,
    /// What it runs, kept for re-running it.
    pub(super) source: Arc<StoredSource>,
    /// Re-run by a rebuild: not a new cell of the history or the store.
    pub(super) replay: bool,
    pub(super) started: Instant,
    /// The code (or script) the cell runs, for python_history.
    pub(super) code: String,
    pub(super) prompt: Option<(String, bool)>,
    /// Output of this cell that arrived with events but was not returned yet.
    pub(super) output: Capture,
    /// Images of this cell not returned yet.
    pub(super) images: Images,
    /// The cell's full output so far, for python_output.
    pub(super) log: CellLog,
    /// Why and how ferrepl stopped the cell (interrupt, time limit), for its result.
    pub(super) stop_notes: Vec<String>,
    /// Set when ferrepl killed the interpreter to stop the cell.
    pub(super) killed_by_ferrepl: bool,
    /// Calls its code made to upstream MCP servers (a rebuild skips it).
    pub(super) tool_calls: u64,
    /// What its results returned while it ran, for the kept result.
    pub(super) early: EarlyParts,
}

impl RunningCell {
    pub(super) fn elapsed_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Takes in output that arrived for this cell.
    pub(super) fn absorb(&mut self, mut output: Capture) {
        self.log.add_all(output.take_log());
        self.output.append(output);
    }
}

/// A session's cells in flight and their results.
pub(super) struct Inbox {
    /// The number the next cell gets.
    next: u64,
    /// The last cell that finished (0: none).
    last: u64,
    /// Cells run in this session (re-runs of a rebuild included).
    run: u64,
    pub(super) running: Option<RunningCell>,
    /// A finished cell whose result no call has returned yet.
    pub(super) completed: Option<CellReport>,
    /// The last finished result returned, kept until the next cell starts so
    /// that python_wait can give it again if its response was lost.
    pub(super) delivered: Option<CellReport>,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            next: 1,
            last: 0,
            run: 0,
            running: None,
            completed: None,
            delivered: None,
        }
    }
}

impl Inbox {
    /// The number the next cell gets (taken with `advance` once it is sent
    /// or queued).
    pub(super) fn next_number(&self) -> u64 {
        self.next
    }

    pub(super) fn advance(&mut self) {
        self.next += 1;
    }

    /// The last cell that finished (0: none).
    pub(super) fn last(&self) -> u64 {
        self.last
    }

    pub(super) fn set_last(&mut self, cell: u64) {
        self.last = cell;
    }

    pub(super) fn count_run(&mut self) {
        self.run += 1;
    }

    pub(super) fn cells_run(&self) -> u64 {
        self.run
    }

    /// A stored session's numbers: its newest cell `newest`, `run` cells in all.
    pub(super) fn restore(&mut self, newest: u64, run: u64) {
        self.next = newest + 1;
        self.last = newest;
        self.run = run;
    }

    /// The last finished result, again, saying so.
    pub(super) fn redelivery(&self) -> Option<CellReport> {
        let last = self.delivered.as_ref()?;
        let note = format!(
            "Sent again: this result of cell {} was sent to a call before (that client may not have received it); no cell is running.",
            last.cell
        );
        Some(last.clone().with_note(&note))
    }
}
