//! The live viewer's record of the cells other clients ran in a kernel
//! session: numbered, the last few only, kept apart from the history and
//! the agent's note so a viewer's look takes nothing from the agent. Plain
//! data: `foreign.rs` fills it, `view.rs` reads it.

use std::collections::VecDeque;

use serde::Serialize;

use super::report::CellStatus;

/// Who ran a foreign cell, as python_history and the viewer mark it.
pub(super) const ANOTHER_CLIENT: &str = "another client";
/// Other clients' cells the viewer's record keeps (the oldest go first).
pub const FOREIGN_SHOWN: usize = 32;

/// Another client's cell as the viewer shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ForeignView {
    /// Its number in the session's record (1, 2, …): a viewer that has it
    /// already replaces it rather than showing it twice.
    pub seq: u64,
    /// The agent's cell it ran after (0: before any).
    pub after: u64,
    pub by: &'static str,
    pub code: String,
    /// ok or error.
    pub status: &'static str,
    /// The start of its output, its value or its error.
    pub output: String,
}

/// The viewer's record of other clients' cells: the last [`FOREIGN_SHOWN`].
#[derive(Debug, Default)]
pub(super) struct ForeignShown {
    last_seq: u64,
    cells: VecDeque<ForeignView>,
}

impl ForeignShown {
    pub(super) fn push(&mut self, after: u64, code: &str, status: CellStatus, output: &str) {
        self.last_seq += 1;
        if self.cells.len() >= FOREIGN_SHOWN {
            self.cells.pop_front();
        }
        self.cells.push_back(ForeignView {
            seq: self.last_seq,
            after,
            by: ANOTHER_CLIENT,
            code: code.to_string(),
            status: status.as_str(),
            output: output.to_string(),
        });
    }

    /// The cells kept with a number past `seq`, oldest first.
    pub(super) fn after(&self, seq: u64) -> Vec<ForeignView> {
        self.cells.iter().filter(|c| c.seq > seq).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_viewers_record_is_numbered_and_bounded() {
        let mut shown = ForeignShown::default();
        for i in 0..FOREIGN_SHOWN + 3 {
            shown.push(i as u64, &format!("c{i}"), CellStatus::Ok, "");
        }
        let all = shown.after(0);
        assert_eq!(all.len(), FOREIGN_SHOWN);
        // The oldest went; the numbers go on.
        assert_eq!(all[0].seq, 4);
        assert_eq!(all[0].code, "c3");
        let last = all.last().map(|c| c.seq);
        assert_eq!(last, Some(FOREIGN_SHOWN as u64 + 3));
        let newer = shown.after(FOREIGN_SHOWN as u64 + 1);
        assert_eq!(newer.len(), 2);
        assert_eq!(newer[0].by, ANOTHER_CLIENT);
    }
}
