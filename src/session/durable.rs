//! Sessions that outlive their interpreter or the server, in the store:
//! each session's settings and head, and each finished cell as it joins
//! the path and the tree; what a crashed interpreter's session offers to
//! rebuild. Rebuilding: `rebuild.rs` (the re-run) and `resume.rs` (the
//! call that needs it); branching: `branch.rs`; stored sessions coming
//! back at start: `stored.rs`.

use std::time::SystemTime;

use serde_json::Value;

use super::error::SessionError;
use super::inbox::RunningCell;
use super::lineage::{PathCell, ranges};
use super::manager::SessionManager;
use super::report::{CellReport, CellStatus};
use super::source::{HISTORY_PREVIEW_CHARS, StoredSource};
use super::state::{Session, SessionState};
use crate::store::{CellRecord, SessionRecord};

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl SessionManager {
    /// Writes a session's settings to the store.
    pub(super) fn persist_session(&self, sess: &Session) {
        let Some(store) = &self.durable.store else {
            return;
        };
        let head = sess.lock().head();
        store.put_session(SessionRecord {
            name: sess.name.clone(),
            language: sess.language.key().to_string(),
            options: serde_json::to_value(sess.options.clone().unwrap_or_default())
                .unwrap_or_default(),
            head,
        });
    }

    pub(super) fn persist_head(&self, sess: &Session, head: Option<u64>) {
        if let Some(store) = &self.durable.store {
            store.set_head(&sess.name, head);
        }
    }

    pub(super) fn forget_stored(&self, name: &str) {
        if let Some(store) = &self.durable.store {
            store.delete_session(name);
        }
    }

    /// A finished cell joins the interpreter's path and the store.
    pub(super) fn record_cell(
        &self,
        sess: &Session,
        st: &mut SessionState,
        run: &RunningCell,
        report: &CellReport,
    ) {
        let source = run.source.clone();
        let replayable = source.size() <= crate::store::MAX_CODE_BYTES;
        let node = PathCell {
            id: run.number,
            parent: run.parent,
            hash: st.lineage.hash_of(run.number, run.parent, &source),
            source: source.clone(),
            status: report.status,
            replayable,
            tool_calls: run.tool_calls > 0,
        };
        if report.status != CellStatus::Crashed {
            st.lineage.extend_path(node.clone());
        }
        st.lineage.add_to_tree(node, self.durable.max_tree);
        let Some(store) = &self.durable.store else {
            return;
        };
        let summary = st
            .kept
            .history()
            .back()
            .filter(|h| h.cell == run.number)
            .map(|h| h.output_preview.clone())
            .unwrap_or_default();
        let images: Vec<Value> = report
            .images
            .info
            .iter()
            .map(|i| serde_json::json!({"mime": i.mime, "bytes": i.bytes, "width": i.width, "height": i.height}))
            .collect();
        store.put_cell(
            &sess.name,
            CellRecord {
                id: run.number,
                parent: run.parent,
                source: stored_source(&source, run.tool_calls),
                replayable,
                status: report.status.as_str().to_string(),
                elapsed_ms: report.elapsed_ms,
                finished_unix: now_unix(),
                summary: summary.chars().take(HISTORY_PREVIEW_CHARS * 2).collect(),
                images: Value::Array(images),
            },
            report.status != CellStatus::Crashed,
        );
    }

    /// The offer made when an interpreter died under a cell.
    pub(super) fn restore_offer(&self, sess: &Session, st: &SessionState) -> Option<String> {
        let ids: Vec<u64> = st
            .lineage
            .path()
            .iter()
            .filter(|c| c.status == CellStatus::Ok && c.replayable)
            .map(|c| c.id)
            .collect();
        if ids.is_empty() {
            return None;
        }
        Some(format!(
            "To rebuild its variables, call python_sessions {{action: \"rebuild\", session: \"{}\", confirm: true}} before any other cell: it re-runs cells {}, and what they did outside the session happens again.",
            sess.name,
            ranges(&ids)
        ))
    }
}

/// A stored session whose settings the current policy refuses cannot run.
pub(super) fn refused(sess: &Session) -> Result<(), SessionError> {
    match &sess.refused {
        Some(refusal) => Err(SessionError::Invalid(refusal.clone())),
        None => Ok(()),
    }
}

/// The refusal of stored session `name`, whose settings the current
/// policy refuses for `why`.
pub(super) fn policy_refusal(name: &str, why: &str) -> String {
    format!(
        "session '{name}' was stored with settings the current policy refuses ({why}); delete it (python_sessions action=delete) and create it again"
    )
}

/// A cell's source as the store keeps it, with how many tool calls it made
/// (the source's own form ignores the extra key when read back).
fn stored_source(source: &StoredSource, tool_calls: u64) -> Value {
    let mut value = serde_json::to_value(source).unwrap_or_default();
    if tool_calls > 0
        && let Value::Object(map) = &mut value
    {
        map.insert("tool_calls".into(), Value::from(tool_calls));
    }
    value
}

/// Whether a stored cell's source says it called tools.
pub(super) fn stored_tool_calls(source: &Value) -> bool {
    source
        .get("tool_calls")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        > 0
}
