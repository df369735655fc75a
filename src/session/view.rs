//! What the live viewer (`src/viewer`) reads of sessions: a snapshot of a
//! session's cells on a branch, its running cell with the output so far, a
//! cell's full output and images, and the watch channels that say when to
//! look again. Nothing here changes what the agent can tell: no session's
//! last use is touched (the idle reaper is not held off), no worker is
//! started, no result is taken; pending worker events are applied, as
//! python_sessions does.

use serde::Serialize;

use super::*;
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
    /// Its full output log is kept (`cell_text`).
    pub full_output: bool,
    /// Other cells that ran on the same parent: where the history branches.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<u64>,
}

/// The running cell: its code and the end of its output so far.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunningView {
    pub cell: u64,
    pub code: String,
    pub elapsed_s: f64,
    /// The prompt of an input() it waits on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Bytes of output so far, and the last of them as text.
    pub output_bytes: u64,
    pub output_tail: String,
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
        let current_head = st.path.last().map(|c| c.id);
        let chain: Vec<durable::PathCell> = match head {
            Some(id) if Some(id) != current_head => st.chain_to(id)?.0,
            _ => st.path.clone(),
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
            state: report::session_state(&st),
            path: chain.iter().map(|c| c.id).collect(),
            current,
            cells,
        })
    }

    /// The running cell of session `name` and the end of its output.
    pub fn view_running(&self, name: &str) -> Option<RunningView> {
        let sess = self.peek(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        let worker = st.worker.clone();
        let run = st.running.as_mut()?;
        let mut bytes = run.log.bytes();
        if let Some(w) = worker {
            w.peek_log(&mut bytes);
        }
        let total = bytes.len() as u64;
        let mut start = bytes.len().saturating_sub(LIVE_TAIL_BYTES);
        // Not inside a UTF-8 sequence.
        while start < bytes.len() && (bytes[start] & 0xC0) == 0x80 {
            start += 1;
        }
        Some(RunningView {
            cell: run.number,
            code: run.code.clone(),
            elapsed_s: (run.elapsed_secs() * 10.0).round() / 10.0,
            prompt: run.prompt.as_ref().map(|(p, _)| p.clone()),
            output_bytes: total + run.log.dropped(),
            output_tail: String::from_utf8_lossy(&bytes[start..]).into_owned(),
        })
    }

    /// The full output of a finished cell, or of the running one, while
    /// it is kept (--output-keep-cells).
    pub fn view_cell_text(&self, name: &str, cell: u64) -> Option<Vec<u8>> {
        let sess = self.peek(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        let worker = st.worker.clone();
        if let Some(run) = st.running.as_mut().filter(|r| r.number == cell) {
            let mut bytes = run.log.bytes();
            if let Some(w) = worker {
                w.peek_log(&mut bytes);
            }
            return Some(bytes);
        }
        st.logs
            .iter_mut()
            .find(|l| l.cell == cell)
            .map(|log| log.bytes())
    }

    /// Image `index` of a finished cell, as (mime, base64), while kept.
    pub fn view_image(&self, name: &str, cell: u64, index: usize) -> Option<(String, String)> {
        let sess = self.peek(name)?;
        let st = sess.lock();
        st.kept.get(cell)?.images.get(index).cloned()
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

    /// The notebook of session `name`'s current branch, as python_export
    /// writes it (without marking the session used).
    pub fn view_export(&self, name: &str) -> Option<String> {
        let sess = self.peek(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        Some(export::notebook_of(&sess, &st))
    }
}

fn cell_view(st: &SessionState, c: &durable::PathCell) -> CellView {
    let history = st.history.iter().rev().find(|h| h.cell == c.id);
    let kept = st.kept.get(c.id);
    let code = match history {
        Some(h) => h.code.clone(),
        None => source_code(&c.source),
    };
    let branches = st
        .tree
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
        kept: kept.is_some(),
        stdout: kept.map(|k| k.stdout.clone()).unwrap_or_default(),
        stderr: kept.map(|k| k.stderr.clone()).unwrap_or_default(),
        value: kept.and_then(|k| k.value.clone()),
        error: kept.and_then(|k| k.error.clone()),
        images: kept.map_or(0, |k| k.images.len()),
        full_output: st.logs.iter().any(|l| l.cell == c.id),
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
