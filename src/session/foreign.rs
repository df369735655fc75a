//! Cells another client ran in a kernel session (an operator's `ferrepl
//! attach`), taken from the worker when a call looks at the session: each
//! becomes a history row marked as another client's, and the agent's next
//! result says its kernel's state moved under it. Never puts them in the
//! session's path: ferrepl cannot replay or branch what it did not run.

use super::kept::HistoryEntry;
use super::manager::SessionManager;
use super::report::CellStatus;
use super::state::SessionState;
use crate::worker::Worker;

/// Who ran a foreign cell, as python_history marks it.
pub(super) const ANOTHER_CLIENT: &str = "another client";
/// The start of the note; a newer one replaces an older unread one.
const NOTE_START: &str = "Someone else (a client attached to this kernel)";

impl SessionManager {
    /// Moves the worker's foreign cells into the history and the notes.
    pub(super) fn take_foreign(&self, st: &mut SessionState, worker: &Worker) {
        let (cells, dropped) = worker.take_foreign();
        if cells.is_empty() && dropped == 0 {
            return;
        }
        let most = self.limits.keep_cells.max(1) * 4;
        let mut ran = cells.len() + dropped;
        for cell in cells {
            let status = if cell.status == "error" {
                CellStatus::Error
            } else {
                CellStatus::Ok
            };
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
