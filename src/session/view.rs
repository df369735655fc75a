//! What the live viewer (`src/viewer`) reads of sessions: a snapshot of a
//! session's cells on a branch, its running cell with the output so far, a
//! cell's full output and images, the cells other clients ran in its
//! kernel, and the watch channels that say when to look again. Nothing
//! here changes what the agent can tell: no session's last use is touched
//! (the idle reaper is not held off), no worker is started, no result or
//! note is taken; pending worker events are applied, as python_sessions
//! does.

use serde::Serialize;

use std::sync::Arc;

use super::export;
pub use super::foreign_shown::{FOREIGN_SHOWN, ForeignView};
use super::lineage::PathCell;
use super::manager::SessionManager;
use super::source::StoredSource;
use super::state::{Session, SessionState};
use crate::output::log::Piece;
use crate::worker::Language;
use crate::worker::protocol::PyError;

/// Bytes of a running cell's output a snapshot carries (its end).
pub const LIVE_TAIL_BYTES: usize = 64 * 1024;

/// One finished cell as the viewer shows it.
#[derive(Debug, Clone, Serialize)]
pub struct CellView {
    pub cell: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<u64>,
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<f64>,
    pub code: String,
    /// Bytes of code cut from the end (not shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_cut: Option<u64>,
    /// Its outputs are still kept (false: only its code and status are).
    pub kept: bool,
    pub stdout: String,
    pub stderr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<PyError>,
    /// Images kept (served one by one by index).
    pub images: usize,
    /// Its full output log is kept and has something in it (`cell_text`).
    pub full_output: bool,
    /// Other cells that ran on the same parent: where the history branches.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<u64>,
}

/// The running cell, as it changes: how long it has run, the prompt of an
/// input() it waits on, its output so far (the code comes once per cell,
/// in [`RunningCode`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunningView {
    pub cell: u64,
    pub elapsed_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Bytes of output so far.
    pub output_bytes: u64,
    /// The last of them as text, when they changed since the look the
    /// caller knew (absent: as before).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<String>,
}

/// The code of a cell that started running (shown up to [`CODE_SHOWN_BYTES`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunningCode {
    pub cell: u64,
    pub code: String,
    /// Bytes of code cut from the end (not shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_cut: Option<u64>,
}

/// A look at the running cell: its code only when the cell is not the one
/// the caller knew.
#[derive(Debug, Clone)]
pub struct RunningLook {
    pub code: Option<RunningCode>,
    pub view: RunningView,
}

/// Bytes of a cell's code the viewer shows (the rest is counted).
pub const CODE_SHOWN_BYTES: usize = 64 * 1024;

/// `code` cut to [`CODE_SHOWN_BYTES`] (at a character), and how many bytes
/// were cut.
pub fn capped_text(code: &str) -> (String, Option<u64>) {
    capped_to(code, CODE_SHOWN_BYTES)
}

/// `text` cut to `max` bytes (at a character), and how many were cut.
pub fn capped_to(text: &str, max: usize) -> (String, Option<u64>) {
    if text.len() <= max {
        return (text.to_string(), None);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_string(), Some((text.len() - end) as u64))
}

/// A session's branch: its cells in execution order.
#[derive(Debug, Clone, Serialize)]
pub struct BranchView {
    pub session: String,
    pub language: Language,
    pub state: &'static str,
    /// The cells of the branch shown, oldest first (ids only).
    pub path: Vec<u64>,
    /// The branch shown is the one the interpreter holds.
    pub current: bool,
    /// The cells of `path` asked for (after the `after` cell, at most `limit`).
    pub cells: Vec<CellView>,
}

impl SessionManager {
    /// A session without touching it (`existing` marks it used).
    fn peek(&self, name: &str) -> Option<Arc<Session>> {
        self.sessions().get(name).cloned()
    }

    /// Session `name`'s branch ending at `head` (default: the current
    /// one), with the cells after `after`, at most `limit` of them.
    pub fn view_branch(
        &self,
        name: &str,
        head: Option<u64>,
        after: u64,
        limit: usize,
    ) -> Option<BranchView> {
        let sess = self.peek(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        let current_head = st.lineage.path().last().map(|c| c.id);
        let chain: Vec<PathCell> = match head {
            Some(id) if Some(id) != current_head => st.lineage.chain_to(id)?.0,
            _ => st.lineage.path().to_vec(),
        };
        let current = head.is_none() || head == current_head;
        let cells = chain
            .iter()
            .filter(|c| c.id > after)
            .take(limit)
            .map(|c| cell_view(&st, c))
            .collect();
        Some(BranchView {
            session: sess.name.clone(),
            language: sess.language,
            state: st.summary(),
            path: chain.iter().map(|c| c.id).collect(),
            current,
            cells,
        })
    }

    /// The running cell of session `name`. `known` is the (cell, output
    /// bytes) of the caller's last look: the code comes only for another
    /// cell, the output's end only when the byte count changed, and only
    /// that end is read (from memory or the spill files' ends: at most
    /// [`LIVE_TAIL_BYTES`], never the whole log).
    pub fn view_running(&self, name: &str, known: Option<(u64, u64)>) -> Option<RunningLook> {
        let sess = self.peek(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        let worker = st.worker.clone();
        let run = st.inbox.running.as_mut()?;
        let (mut pending, mut pending_dropped) =
            worker.as_ref().map_or((0, 0), |w| w.peek_log_len());
        let logged = run.log.len();
        let mut output_bytes = logged + pending + run.log.dropped() + pending_dropped;
        let same_cell = known.is_some_and(|(cell, _)| cell == run.number);
        let output_tail = if same_cell && known.is_some_and(|(_, n)| n == output_bytes) {
            None
        } else {
            // The end of the worker's part (taken with its length at once:
            // the worker's reader moves it on), then of the cell's log.
            let want = LIVE_TAIL_BYTES as u64;
            let mut end = Vec::new();
            if let Some(w) = &worker {
                (pending, pending_dropped, end) = w.peek_log_tail(want);
                output_bytes = logged + pending + run.log.dropped() + pending_dropped;
            }
            let need = want.saturating_sub(end.len() as u64);
            let mut bytes = Vec::with_capacity(LIVE_TAIL_BYTES);
            run.log
                .read_range(logged.saturating_sub(need), need, &mut bytes);
            bytes.extend_from_slice(&end);
            // Not inside a UTF-8 sequence at either end (the rest of one
            // cut at the end is still to come).
            let start = crate::output::log::utf8_start(&bytes);
            let end = crate::output::log::utf8_end(&bytes).max(start);
            Some(String::from_utf8_lossy(&bytes[start..end]).into_owned())
        };
        let code = (!same_cell).then(|| {
            let (code, code_cut) = capped_text(&source_code(&run.source));
            RunningCode {
                cell: run.number,
                code,
                code_cut,
            }
        });
        Some(RunningLook {
            code,
            view: RunningView {
                cell: run.number,
                elapsed_s: (run.elapsed_secs() * 10.0).round() / 10.0,
                prompt: run.prompt.as_ref().map(|(p, _)| p.clone()),
                output_bytes,
                output_tail,
            },
        })
    }

    /// Where the full output of a finished cell, or of the running one, is
    /// (while it is kept, --output-keep-cells): copies of the parts in
    /// memory and the spill files, read later without the session's lock.
    pub fn view_cell_text(&self, name: &str, cell: u64) -> Option<Vec<Piece>> {
        let sess = self.peek(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        let worker = st.worker.clone();
        let mut pieces = Vec::new();
        if let Some(run) = st.inbox.running.as_mut().filter(|r| r.number == cell) {
            run.log.pieces(&mut pieces);
            if let Some(w) = worker {
                w.peek_log_pieces(&mut pieces);
            }
            return Some(pieces);
        }
        let log = st.kept.log_mut(cell)?;
        log.pieces(&mut pieces);
        Some(pieces)
    }

    /// The cells other clients ran in session `name`'s kernel that the
    /// session still keeps for the viewer, numbered past `seq`, oldest
    /// first (at most [`FOREIGN_SHOWN`]). Taking them from the worker moves
    /// them into the history and the agent's next note, as a call's look
    /// does: the agent is told all the same.
    pub fn view_foreign(&self, name: &str, seq: u64) -> Option<Vec<ForeignView>> {
        let sess = self.peek(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        Some(st.foreign_shown.after(seq))
    }

    /// Image `index` of a finished cell, as (mime, base64), while kept.
    pub fn view_image(&self, name: &str, cell: u64, index: usize) -> Option<(String, String)> {
        let sess = self.peek(name)?;
        let st = sess.lock();
        st.kept.results().get(cell)?.images.get(index).cloned()
    }

    /// Receivers that wake when session `name` changes: its worker's state
    /// (output, events, exit) and the session's own (rebuilds). Taken anew
    /// after each wake-up: a reset gives the session another worker.
    pub fn view_watch(
        &self,
        name: &str,
    ) -> Option<(
        Option<tokio::sync::watch::Receiver<u64>>,
        tokio::sync::watch::Receiver<u64>,
    )> {
        let sess = self.peek(name)?;
        let worker = sess.lock().worker.as_ref().map(|w| w.subscribe());
        Some((worker, sess.changed.subscribe()))
    }

    /// The notebook of session `name`'s branch ending at `head` (default:
    /// the current one), as python_export writes it (without marking the
    /// session used); None for no such session or cell.
    pub fn view_export(&self, name: &str, head: Option<u64>) -> Option<String> {
        let sess = self.peek(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        export::notebook_of(&sess, &st, head)
    }
}

fn cell_view(st: &SessionState, c: &PathCell) -> CellView {
    let history = st.kept.history_of(c.id);
    let kept = st.kept.results().get(c.id);
    // The source itself (the history keeps a shorter preview).
    let (code, code_cut) = capped_text(&source_code(&c.source));
    let branches = st
        .lineage
        .tree()
        .values()
        .filter(|o| o.parent == c.parent && o.id != c.id)
        .map(|o| o.id)
        .collect();
    CellView {
        cell: c.id,
        parent: c.parent,
        status: c.status.as_str(),
        elapsed_ms: history.map(|h| h.elapsed_ms),
        code,
        code_cut,
        kept: kept.is_some(),
        stdout: kept.map(|k| k.stdout.clone()).unwrap_or_default(),
        stderr: kept.map(|k| k.stderr.clone()).unwrap_or_default(),
        value: kept.and_then(|k| k.value.clone()),
        error: kept.and_then(|k| k.error.clone()),
        images: kept.map_or(0, |k| k.images.len()),
        full_output: st.kept.has_log(c.id),
        branches,
    }
}

fn source_code(source: &StoredSource) -> String {
    match source {
        StoredSource::Code { code } => code.clone(),
        StoredSource::File { file, args } => {
            let mut line = format!("# run_file {file}");
            for a in args {
                line.push(' ');
                line.push_str(a);
            }
            line
        }
    }
}
