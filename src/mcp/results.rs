//! What the agent gets back as structuredContent (with
//! --structured-content): every tool's result type, in one place.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use crate::jobs::{JobInfo, JobState};
use crate::session::report::{CellStatus, DisplayInfo};
use crate::session::{HistoryEntry, SessionInfo};
use crate::worker::protocol::PyError;

// python_exec, python_wait, python_inspect, and the r_ twins (tools/python.rs, tools/r.rs)

#[derive(Debug, Serialize, JsonSchema)]
pub struct InspectOutput {
    pub session: String,
    /// The user's variables (without a name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variables: Option<Vec<Value>>,
    /// Details of one name: type, repr, signature and doc for callables.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
}

// python_output, r_output, shell_output (window.rs)

#[derive(Debug, Serialize, JsonSchema)]
pub struct OutputWindow {
    /// The session (for python_output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The cell (for python_output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell: Option<u64>,
    /// The job (for shell_output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// True while the cell still runs (its output may grow).
    pub running: bool,
    /// Characters and lines of the whole (cleaned) output.
    pub total_chars: u64,
    pub total_lines: u64,
    /// Start of this window (characters, or line number with `lines`).
    pub offset: u64,
    /// The text of the window, or the matching lines with their numbers.
    pub text: String,
    /// Where the next window starts, or null at the end.
    pub next_offset: Option<u64>,
    /// Number of matching lines (grep only).
    pub matches: Option<u64>,
    /// Bytes of output that were not kept (past --output-log-bytes).
    pub dropped_bytes: u64,
}

// shell_exec, shell_wait, shell_output (tools/shell.rs)

/// structuredContent of shell_exec and shell_wait.
#[derive(Debug, Serialize, JsonSchema)]
pub struct JobOutput {
    #[serde(flatten)]
    pub state: JobState,
    /// Output returned by this call (only what was not shown before).
    pub stdout: String,
    pub stderr: String,
    pub output_bytes: u64,
    pub omitted_bytes: u64,
    pub elapsed_ms: f64,
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct JobsOutput {
    pub jobs: Vec<JobInfo>,
}

// python_sessions (tools/sessions.rs)

#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionsOutput {
    pub sessions: Vec<SessionInfo>,
    /// What a create, reset or delete did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The server (action status).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<StatusOutput>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StatusOutput {
    pub version: String,
    pub uptime_s: f64,
    /// Default interpreter of new sessions.
    pub python: String,
    pub workdir: String,
    /// Shell jobs, running and recently finished.
    pub jobs: Vec<JobInfo>,
    /// Tool groups exposed (--tools).
    pub tool_groups: Vec<String>,
    /// Configured limits, by flag name.
    pub limits: BTreeMap<String, Value>,
    /// OS-level confinement of workers.
    pub sandbox: String,
}

// python_history, python_export, python_run_file, python_complete, python_namespace (tools/more.rs)

#[derive(Debug, Serialize, JsonSchema)]
pub struct HistoryOutput {
    pub session: String,
    pub cells: Vec<HistoryEntry>,
    /// The cell still running, if any: {cell, code, elapsed_s}.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<Value>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ExportOutput {
    pub path: String,
    pub cells: Vec<u64>,
    /// Cells of the branch left out: they failed or were interrupted.
    pub skipped: Vec<u64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CompleteOutput {
    pub session: String,
    /// jedi when installed in the session's interpreter, else rlcompleter.
    pub engine: String,
    /// The text being completed.
    pub token: String,
    /// Candidates: {text, kind}.
    pub completions: Vec<Value>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct NamespaceOutput {
    pub session: String,
    /// The names set or removed.
    pub changed: Vec<String>,
}

// file_list, file_read, file_write, file_delete (tools/files.rs)

#[derive(Debug, Serialize, JsonSchema)]
pub struct Entry {
    /// Path relative to the workspace root.
    pub path: String,
    /// file, dir or symlink.
    pub kind: String,
    /// Size in bytes (files).
    pub size: Option<u64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListOutput {
    pub root: String,
    pub entries: Vec<Entry>,
    /// True when the listing stopped at its limit.
    pub truncated: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ReadOutput {
    pub path: String,
    pub bytes: u64,
    /// True for binary files: the content is an embedded resource (base64) instead of text.
    pub binary: bool,
    pub mime_type: String,
    pub total_lines: Option<u64>,
    pub start_line: Option<u64>,
    pub end_line: Option<u64>,
    /// The lines read (text files).
    pub text: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangeOutput {
    pub path: String,
    /// Bytes written (file_write) or 0.
    pub bytes: u64,
    pub message: String,
}

// every cell tool: python_exec, python_wait, python_run_file, r_exec, r_wait (render.rs)

/// structuredContent of python_exec, python_wait and python_run_file (with
/// --structured-content). Empty and null fields are left out.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CellOutput {
    pub status: CellStatus,
    pub session: String,
    pub cell: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stdout: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stderr: String,
    /// repr() of the last expression.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<PyError>,
    /// The input() prompt (waiting_input).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    pub elapsed_ms: f64,
    #[serde(skip_serializing_if = "is_zero")]
    pub output_bytes: u64,
    /// Bytes left out of the middle of the output.
    #[serde(skip_serializing_if = "is_zero")]
    pub omitted_bytes: u64,
    /// Output written after the previous cell finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background_output: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The images (sent as image content blocks).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub display: Vec<DisplayInfo>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
