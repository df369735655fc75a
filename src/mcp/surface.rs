//! Everything the agent sees of a tool in tools/list, in one place so that
//! every word it reads is weighed together: each tool's description, title
//! and hints (`DOCS`), its arguments (`…Params`: each doc comment becomes an
//! argument's description) and its structured result (`…Output`, sent as
//! structuredContent with --structured-content). The rules all tools share
//! are in the server's instructions (server.rs); a tool's body is the fn of
//! its name in tools/.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::args::{PathArg, Seconds, SignalArg};
use crate::jobs::{JobInfo, JobState};
use crate::session::report::{CellStatus, DisplayInfo};
use crate::session::{ExportFormat, HistoryEntry, SessionInfo};
use crate::worker::Language;
use crate::worker::protocol::PyError;
use Hint::*;

// ---- The tools' words

/// MCP's hints to the client about what a tool does (a hint left out
/// keeps MCP's default: may change things, not idempotent, open world).
#[derive(Debug, Clone, Copy)]
enum Hint {
    ReadOnly,
    NotDestructive,
    Idempotent,
    ClosedWorld,
}

/// Every tool: name, title, hints, description.
#[rustfmt::skip]
const DOCS: &[(&str, &str, &[Hint], &str)] = &[
    ("python_exec", "Run Python", &[],
     "Run Python code in a persistent session. Returns the output (stdout and stderr, subprocesses included), the last expression's repr, and the traceback if it raised. Example: {\"code\": \"import math\\nmath.pi * 2\"}"),
    ("kernel_exec", "Run code on a kernel", &[],
     "Run code in a session on a Jupyter kernel of another language (python_sessions create with kernel): output, images, errors. python_wait and python_output follow it."),
    ("python_wait", "Wait for a cell", &[NotDestructive, ClosedWorld],
     "Follow a cell that returned 'running' or 'waiting_input': its new output once it finishes, asks for input or wait_s passes. Repeats the last result if that was lost."),
    ("python_output", "Read cell output", &[ReadOnly],
     "Read a cell's full output (long results keep only head and tail): a window, or the lines matching grep with context. Example: {\"cell\": 7, \"grep\": \"Error\"}"),
    ("python_inspect", "Inspect variables", &[ReadOnly],
     "A session's variables (type, repr, shape), or one object in detail (name). Works while a cell runs."),
    ("python_sessions", "Sessions", &[ClosedWorld],
     "List sessions, or create one (with its own python, venv, workdir or env), reset one to a fresh interpreter, delete one; status: the server's limits and sandbox. Sessions outlive restarts ('dormant'): resume loads a saved state; rebuild lists the cells it would re-run, side effects too; confirm: true runs them. Example: {\"action\": \"reset\", \"session\": \"ml\"}"),
    ("python_install", "Install packages", &[NotDestructive, Idempotent],
     "Install packages into the session's venv (uv or pip); they import at once, no restart. After 'running', call it again to keep waiting. Example: {\"packages\": [\"pandas\", \"numpy>=2\"]}"),
    ("python_history", "Cell history", &[ReadOnly],
     "The cells a session ran: code, status, time, the start of their output, and their parents (branches)."),
    ("python_export", "Export cells", &[NotDestructive, ClosedWorld],
     "Write a session's branch (its cells that ran ok, root to cell) to a workspace file: a notebook with outputs, or a script. Example: {\"path\": \"a.ipynb\", \"format\": \"ipynb\"}"),
    ("python_run_file", "Run a script", &[],
     "Run a script in a session as __main__ with sys.argv [path, *args]; its globals stay. Like python_exec."),
    ("python_complete", "Complete code", &[ReadOnly],
     "Completions at the cursor from the session's live objects. Example: {\"code\": \"df.gro\"}"),
    ("python_namespace", "Edit variables", &[Idempotent, ClosedWorld],
     "Set a variable from JSON, delete some, or clear all, without running code. Example: {\"action\": \"set\", \"name\": \"cfg\", \"value\": {\"lr\": 0.1}}"),
    ("r_exec", "Run R", &[],
     "Run R code in a persistent session: output, warnings, plots, errors. Example: {\"code\": \"summary(rnorm(9))\"}"),
    ("r_wait", "Wait for an R cell", &[NotDestructive, ClosedWorld],
     "Follow a 'running' or 'waiting_input' R cell: wait, answer readline(), or interrupt."),
    ("r_output", "Read R cell output", &[ReadOnly],
     "An R cell's full output: a window, or the lines matching grep."),
    ("r_inspect", "Inspect R objects", &[ReadOnly],
     "The R session's objects (class, size, str), or one in detail. Between cells only."),
    ("r_install", "Install R packages", &[NotDestructive, Idempotent],
     "Install R packages into the workspace's library; library() finds them at once."),
    ("r_complete", "Complete R code", &[ReadOnly],
     "Completions at the cursor from the R session's live objects."),
    ("shell_exec", "Run a shell command", &[],
     "Run a shell command (sh -c) as a job; returns when it exits or, still running, after wait_s. Example: {\"command\": \"pytest -x -q\"}"),
    ("shell_wait", "Wait for a job", &[ClosedWorld],
     "Follow a job: its new output once it exits or wait_s passes; first types input or sends a signal if given."),
    ("shell_output", "Read job output", &[ReadOnly],
     "Read a job's full output: a window or grep, like python_output."),
    ("file_list", "List files", &[ReadOnly],
     "List a workspace directory as a tree with sizes. Paths in all file tools are relative to the workspace."),
    ("file_read", "Read a file", &[ReadOnly],
     "Read a workspace file: a range of lines of text, or a binary file as a resource with its MIME type."),
    ("file_write", "Write a file", &[ClosedWorld],
     "Write (or append to) a workspace file; parent directories are created."),
    ("file_delete", "Delete a file", &[Idempotent, ClosedWorld],
     "Delete a workspace file or directory."),
];

/// Added to python_exec's and r_exec's descriptions when the operator
/// configured upstream MCP servers (`{servers}`: their names).
pub const PYTHON_CODE_TOOLS: &str = "Code can call MCP tools of {servers}: import ferrepl; ferrepl.tools(server), ferrepl.call(server, tool, **args); only what it prints and its last expression return.";
pub const R_CODE_TOOLS: &str =
    "Code can call MCP tools of {servers}: ferrepl_tools(server), ferrepl_call(server, tool, ...).";

/// The description and annotations of `tool`.
pub fn docs_of(tool: &str) -> Option<(&'static str, ToolAnnotations)> {
    let (_, title, hints, description) = DOCS.iter().find(|(name, ..)| *name == tool)?;
    let mut annotations = ToolAnnotations::with_title(*title);
    for hint in *hints {
        annotations = match hint {
            ReadOnly => annotations.read_only(true),
            NotDestructive => annotations.destructive(false),
            Idempotent => annotations.idempotent(true),
            ClosedWorld => annotations.open_world(false),
        };
    }
    Some((description, annotations))
}

// ---- Arguments

// python_exec, python_wait, python_inspect, and the r_ twins (tools/python.rs, tools/r.rs)

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecParams {
    /// Python code; the last expression's repr is returned.
    pub code: String,
    pub session: Option<String>,
    pub wait_s: Option<Seconds>,
    /// Branch: run on the state after this cell (0: fresh).
    pub parent: Option<u64>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(default)]
pub struct WaitParams {
    pub session: Option<String>,
    pub wait_s: Option<Seconds>,
    /// Answers the pending input().
    pub input: Option<String>,
    /// Close stdin (EOFError).
    pub eof: Option<bool>,
    /// KeyboardInterrupt; variables are kept.
    pub interrupt: Option<bool>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(default)]
pub struct InspectParams {
    pub session: Option<String>,
    /// e.g. "df.columns".
    pub name: Option<String>,
}

// python_output, r_output, shell_output (window.rs)

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(default)]
pub struct OutputParams {
    pub session: Option<String>,
    /// Default: the latest.
    pub cell: Option<u64>,
    /// Or a job's full log.
    pub job: Option<String>,
    #[serde(flatten)]
    pub window: WindowParams,
}

/// What part of an output to read: the window arguments of python_output
/// and shell_output.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(default)]
pub struct WindowParams {
    pub offset: Option<u64>,
    /// Characters (default 20000), or lines if lines is true.
    pub limit: Option<u64>,
    pub lines: Option<bool>,
    /// A regex: only matching lines, with context lines (default 1) around.
    pub grep: Option<String>,
    pub context: Option<u64>,
}

// shell_exec, shell_wait, shell_output (tools/shell.rs)

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShellExecParams {
    pub command: String,
    pub wait_s: Option<Seconds>,
    /// Working directory inside the workspace.
    pub cwd: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    /// Given to stdin, then closed.
    pub stdin: Option<String>,
    /// Run in a terminal.
    pub pty: Option<bool>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(default)]
pub struct ShellWaitParams {
    /// e.g. "j3"; omit to list jobs.
    pub job: Option<String>,
    pub wait_s: Option<Seconds>,
    /// A line for stdin; returns at once unless wait_s is given.
    pub input: Option<String>,
    pub eof: Option<bool>,
    /// To its process group, e.g. TERM (then KILL after 2 s).
    pub signal: Option<SignalArg>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShellOutputParams {
    pub job: String,
    #[serde(flatten)]
    pub window: WindowParams,
}

// python_sessions (tools/sessions.rs)

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionAction {
    List,
    Create,
    Reset,
    Delete,
    // `restore`, its old name, ran at once; it now answers first too.
    #[serde(alias = "restore")]
    Rebuild,
    Resume,
    Status,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(default)]
pub struct SessionsParams {
    /// Default list.
    pub action: Option<SessionAction>,
    #[serde(alias = "name")]
    pub session: Option<String>,
    pub python: Option<PathBuf>,
    pub venv: Option<PathBuf>,
    pub workdir: Option<PathBuf>,
    pub env: Option<BTreeMap<String, String>>,
    pub language: Option<Language>,
    pub kernel: Option<String>,
    pub confirm: Option<bool>,
}

// python_history, python_export, python_run_file, python_complete, python_namespace (tools/more.rs)

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(default)]
pub struct HistoryParams {
    pub session: Option<String>,
    /// How many of the latest cells (default 20).
    pub last: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExportParams {
    pub path: PathArg,
    pub format: ExportFormat,
    pub session: Option<String>,
    /// Last cell (default: the current).
    pub cell: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunFileParams {
    pub path: PathArg,
    pub session: Option<String>,
    pub args: Option<Vec<String>>,
    pub wait_s: Option<Seconds>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CompleteParams {
    pub code: String,
    /// Character offset (default: the end).
    pub cursor: Option<usize>,
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NamespaceAction {
    Set,
    Delete,
    Clear,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct NamespaceParams {
    pub action: NamespaceAction,
    pub session: Option<String>,
    /// set: the variable.
    pub name: Option<String>,
    /// set: any JSON value.
    pub value: Option<Value>,
    /// delete: the variables.
    pub names: Option<Vec<String>>,
}

// python_install (tools/packages.rs)

#[derive(Debug, Deserialize, JsonSchema)]
pub struct InstallParams {
    /// Names, specifiers or wheel paths.
    pub packages: Vec<String>,
    pub session: Option<String>,
    pub upgrade: Option<bool>,
    pub wait_s: Option<Seconds>,
}

// r_install (tools/r_packages.rs)

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RInstallParams {
    /// CRAN package names, or .tar.gz source packages in the workspace.
    pub packages: Vec<String>,
    pub session: Option<String>,
    pub wait_s: Option<Seconds>,
}

// file_list, file_read, file_write, file_delete (tools/files.rs)

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(default)]
pub struct ListParams {
    pub path: Option<String>,
    /// Levels to descend (default 2).
    pub depth: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadParams {
    pub path: String,
    pub start_line: Option<usize>,
    /// Default 2000.
    pub line_count: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WriteParams {
    pub path: String,
    pub text: Option<String>,
    /// Binary content instead of text.
    pub base64: Option<String>,
    pub append: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DeleteParams {
    pub path: String,
    /// Needed for a non-empty directory.
    pub recursive: Option<bool>,
}

// ---- Results

// python_inspect, r_inspect (tools/python.rs)

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

#[cfg(test)]
mod tests {
    #[test]
    fn every_tool_has_its_words_once() {
        let names: Vec<&str> = crate::mcp::groups::tool_names().collect();
        for name in &names {
            assert!(super::docs_of(name).is_some(), "{name} has no description");
        }
        assert_eq!(
            super::DOCS.len(),
            names.len(),
            "a description without a tool"
        );
    }
}
