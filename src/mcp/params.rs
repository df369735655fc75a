//! What the agent sends: every tool's arguments, in one place, so that a
//! change to what the agent must write shows here (and in tools/list).
//! Each doc comment becomes the argument's description; keep it short.

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::args::{PathArg, Seconds, SignalArg};
use crate::session::ExportFormat;
use crate::worker::Language;

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
    Restore,
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
