//! Cells another client ran in a kernel session (an operator's `ferrepl
//! attach`), taken from the worker when a call or a viewer looks at the
//! session: each becomes a history row marked as another client's, in its
//! place among the agent's cells; the agent's next result says its
//! kernel's state moved under it; and the live viewer gets a numbered copy
//! of the last few (a record of its own, so a viewer's look takes nothing
//! from the agent). Never puts them in the session's path: ferrepl cannot
//! replay or branch what it did not run.

use std::collections::VecDeque;

use super::foreign_shown::ANOTHER_CLIENT;
use super::kept::HistoryEntry;
use super::manager::SessionManager;
use super::report::CellStatus;
use super::state::SessionState;
use crate::worker::{ForeignRun, Worker};

/// The start of the note; a newer one replaces an older unread one.
const NOTE_START: &str = "Someone else (a client attached to this kernel)";

/// The cells taken from the worker at the start of a look, kept one by
/// one as the worker's events of the agent's cells are applied, so each
/// lands after the cell it followed.
pub(super) struct TakenForeign {
    runs: VecDeque<ForeignRun>,
    dropped: usize,
}

impl SessionManager {
    /// The cells other clients ran since the last take.
    pub(super) fn take_foreign(&self, worker: &Worker) -> TakenForeign {
        let (runs, dropped) = worker.take_foreign();
        TakenForeign {
            runs: runs.into(),
            dropped,
        }
    }

    /// Moves the taken cells that ran before the agent's cell `before` (all
    /// of them for None) into the history, the viewer's record and the
    /// notes.
    pub(super) fn keep_foreign(
        &self,
        st: &mut SessionState,
        taken: &mut TakenForeign,
        before: Option<u64>,
    ) {
        let mut ran = std::mem::take(&mut taken.dropped);
        let most = self.limits.keep_cells.max(1) * 4;
        while taken
            .runs
            .front()
            .is_some_and(|r| before.is_none_or(|b| r.after < b))
        {
            let Some(run) = taken.runs.pop_front() else {
                break;
            };
            ran += 1;
            let cell = run.cell;
            let status = if cell.status == "error" {
                CellStatus::Error
            } else {
                CellStatus::Ok
            };
            // A worker none of whose cells ended yet: it ran on what the
            // last cell before that worker left.
            let after = match run.after {
                0 => st.head().unwrap_or(0),
                n => n,
            };
            st.foreign_shown
                .push(after, &cell.code, status, &cell.output);
            let entry = HistoryEntry {
                cell: 0,
                parent: None,
                current: false,
                code: cell.code,
                status,
                elapsed_ms: 0.0,
                output_preview: cell.output,
                by: Some(ANOTHER_CLIENT.to_string()),
            };
            st.kept.add_history(entry, most);
        }
        if ran == 0 {
            return;
        }
        // One note however many looks took cells before the agent's result.
        if let Some(at) = st.notes.iter().position(|n| n.starts_with(NOTE_START)) {
            let earlier = st.notes.remove(at);
            ran += earlier
                .split_whitespace()
                .find_map(|w| w.parse::<usize>().ok())
                .unwrap_or(0);
        }
        let cells = if ran == 1 { "cell" } else { "cells" };
        st.notes.push(format!(
            "{NOTE_START} ran {ran} {cells} in this kernel since your last call (python_history shows them); its variables may differ from what your cells left."
        ));
    }
}
