//! What a session keeps of its finished cells: their full output logs
//! (--output-keep-cells), the rows of python_history, their results for
//! exports and the viewer, and images drawn after their cell had finished.

use std::collections::VecDeque;

use super::report::{CellReport, CellStatus, Images};
use super::source::HISTORY_PREVIEW_CHARS;
use crate::output::log::{CellLog, Segment};
use crate::worker::protocol::{Image, PyError};

/// A row of `python_history`.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct HistoryEntry {
    pub cell: u64,
    /// The cell whose state it ran on (none: a fresh interpreter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<u64>,
    /// On the branch the interpreter holds now.
    pub current: bool,
    /// The cell's code (truncated past 4000 characters).
    pub code: String,
    pub status: CellStatus,
    pub elapsed_ms: f64,
    /// The start of the cell's output (or its value, or its error).
    pub output_preview: String,
    /// Who ran it when not this session's agent ("another client": a
    /// Jupyter client attached to its kernel); such a row's cell is 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// What is kept of recent cells' results for exports (bounded per session).
#[derive(Debug, Clone)]
pub(super) struct KeptResult {
    pub cell: u64,
    pub stdout: String,
    pub stderr: String,
    pub value: Option<String>,
    pub error: Option<PyError>,
    /// (mime, base64).
    pub images: Vec<(String, String)>,
}

impl KeptResult {
    fn size(&self) -> usize {
        self.stdout.len()
            + self.stderr.len()
            + self.value.as_ref().map_or(0, String::len)
            + self
                .images
                .iter()
                .map(|(m, d)| m.len() + d.len())
                .sum::<usize>()
    }
}

/// What a running cell's results returned before it ended (a wait that
/// ran out, an input() prompt): its result at the end holds only what came
/// after, and the kept result must hold the whole cell.
#[derive(Debug, Default)]
pub(super) struct EarlyParts {
    stdout: String,
    stderr: String,
    images: Vec<(String, String)>,
    bytes: usize,
    cut: bool,
}

/// Where a cell's early results were cut from what is kept.
const EARLY_CUT: &str = "[earlier output not kept here; the cell's full output has it]\n";

/// Bytes of a cell's early results kept (text and images).
const MAX_EARLY_BYTES: usize = 4 << 20;

impl EarlyParts {
    /// Adds a `running`/`waiting_input` result, within [`MAX_EARLY_BYTES`].
    pub(super) fn add(&mut self, report: &CellReport) {
        let out = &report.output;
        for (text, to) in [
            (&out.stdout, &mut self.stdout),
            (&out.stderr, &mut self.stderr),
        ] {
            if self.bytes + text.len() > MAX_EARLY_BYTES {
                self.cut = true;
            } else {
                to.push_str(text);
                self.bytes += text.len();
            }
        }
        for image in &report.images.shown {
            let size = image.mime.len() + image.base64.len();
            if self.bytes + size > MAX_EARLY_BYTES {
                self.cut = true;
            } else {
                self.images.push((image.mime.clone(), image.base64.clone()));
                self.bytes += size;
            }
        }
    }
}

/// Results kept for exports: at most this many bytes per session, the
/// oldest dropped first (their cells are exported without outputs).
const MAX_KEPT_BYTES: usize = 32 << 20;

#[derive(Debug, Default)]
pub(super) struct KeptResults {
    items: VecDeque<KeptResult>,
    bytes: usize,
}

impl KeptResults {
    /// Keeps a finished cell's result, after what its earlier results
    /// returned.
    pub(super) fn keep(&mut self, report: &CellReport, early: EarlyParts) {
        let EarlyParts {
            mut stdout,
            mut stderr,
            mut images,
            cut,
            ..
        } = early;
        if cut {
            stdout.push_str(EARLY_CUT);
        }
        stdout.push_str(&report.output.stdout);
        stderr.push_str(&report.output.stderr);
        images.extend(
            report
                .images
                .shown
                .iter()
                .map(|i| (i.mime.clone(), i.base64.clone())),
        );
        let kept = KeptResult {
            cell: report.cell,
            stdout,
            stderr,
            value: report.value.clone(),
            error: report.error.clone(),
            images,
        };
        self.bytes += kept.size();
        self.items.push_back(kept);
        while self.bytes > MAX_KEPT_BYTES {
            let Some(old) = self.items.pop_front() else {
                break;
            };
            self.bytes -= old.size();
        }
    }

    pub(super) fn get(&self, cell: u64) -> Option<&KeptResult> {
        self.items.iter().rev().find(|k| k.cell == cell)
    }
}

/// Everything a session keeps of finished cells, bounded.
#[derive(Default)]
pub(super) struct KeptOutput {
    /// Full output of recent finished cells, oldest first.
    logs: VecDeque<CellLog>,
    /// Finished cells, oldest first (bounded).
    history: VecDeque<HistoryEntry>,
    /// Recent cells' outputs, values and images, for exports (bounded).
    results: KeptResults,
    /// Images displayed after their cell had finished (by its threads).
    background_images: Images,
}

impl KeptOutput {
    /// Keeps a finished cell's full output, at most `most` cells' in all.
    pub(super) fn keep_log(&mut self, log: CellLog, most: usize) {
        self.logs.push_back(log);
        while self.logs.len() > most {
            self.logs.pop_front();
        }
    }

    /// Output that arrived after cell `cell` finished joins its log.
    pub(super) fn add_late(&mut self, cell: u64, late: Vec<Segment>) {
        if let Some(prev) = self.logs.back_mut().filter(|l| l.cell == cell) {
            prev.add_all(late);
        }
    }

    pub(super) fn log_mut(&mut self, cell: u64) -> Option<&mut CellLog> {
        self.logs.iter_mut().find(|l| l.cell == cell)
    }

    /// Whether `cell` has full output worth a link (an empty log has none).
    pub(super) fn has_log(&self, cell: u64) -> bool {
        self.logs.iter().any(|l| l.cell == cell && !l.is_empty())
    }

    /// The cells whose full output is kept, oldest first.
    pub(super) fn log_cells(&self) -> Vec<u64> {
        self.logs.iter().map(|l| l.cell).collect()
    }

    pub(super) fn clear_logs(&mut self) {
        self.logs.clear();
    }

    /// Adds a row to the history, keeping at most `most`.
    pub(super) fn add_history(&mut self, entry: HistoryEntry, most: usize) {
        self.history.push_back(entry);
        while self.history.len() > most {
            self.history.pop_front();
        }
    }

    /// Adds the row of finished cell `done` (which ran `code` on the state
    /// after `parent`), keeping at most `most`.
    pub(super) fn record_history(
        &mut self,
        done: &CellReport,
        code: String,
        parent: Option<u64>,
        most: usize,
    ) {
        let text = crate::output::text::clean(&done.output.combined);
        let mut preview: String = text.chars().take(HISTORY_PREVIEW_CHARS).collect();
        if text.chars().count() > HISTORY_PREVIEW_CHARS {
            preview.push_str("...");
        }
        if preview.is_empty()
            && let Some(v) = &done.value
        {
            preview = v.chars().take(HISTORY_PREVIEW_CHARS).collect();
        }
        if let Some(e) = &done.error {
            preview.push_str(&format!("\n{}: {}", e.kind, e.message));
        }
        let entry = HistoryEntry {
            cell: done.cell,
            parent,
            current: false,
            code,
            status: done.status,
            elapsed_ms: done.elapsed_ms,
            output_preview: preview,
            by: None,
        };
        self.add_history(entry, most);
    }

    pub(super) fn history(&self) -> &VecDeque<HistoryEntry> {
        &self.history
    }

    /// The latest history row of `cell`.
    pub(super) fn history_of(&self, cell: u64) -> Option<&HistoryEntry> {
        self.history.iter().rev().find(|h| h.cell == cell)
    }

    /// Keeps a finished cell's result for exports.
    pub(super) fn keep_result(&mut self, report: &CellReport, early: EarlyParts) {
        self.results.keep(report, early);
    }

    pub(super) fn results(&self) -> &KeptResults {
        &self.results
    }

    /// An image drawn after its cell had finished: part of the next
    /// cell's result.
    pub(super) fn add_background_image(&mut self, image: Image, limit: usize) {
        self.background_images.add(image, limit);
    }

    pub(super) fn take_background_images(&mut self) -> Images {
        self.background_images.take()
    }
}
