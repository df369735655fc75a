//! Tools around the interpreter: sessions, history, scripts, completion,
//! namespace edits and the server's status.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::{CallToolResult, RequestMetaObject};
use rmcp::{ErrorData as McpError, Peer, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::args::{Parameters, PathArg, Seconds, secs};
use super::render::{self, CellOutput};
use super::server::{CallContext, FerreplServer, session_name};
use crate::session::{CellSource, HistoryEntry, SessionInfo, SessionOptions};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionAction {
    List,
    Create,
    Delete,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionsParams {
    /// list (default), create or delete.
    #[serde(default)]
    pub action: Option<SessionAction>,
    /// The session to create or delete.
    #[serde(default)]
    pub name: Option<String>,
    /// create: interpreter inside the workspace (or one the operator allowed).
    #[serde(default)]
    pub python: Option<PathBuf>,
    /// create: venv directory inside the workspace (or allowed); its bin/python is used.
    #[serde(default)]
    pub venv: Option<PathBuf>,
    /// create: working directory inside the workspace (relative to it).
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    /// create: extra environment variables for the interpreter.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionsOutput {
    pub sessions: Vec<SessionInfo>,
    /// What a create or delete did, or null for a listing.
    pub message: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct HistoryParams {
    /// Session name. Default "default".
    #[serde(default)]
    pub session: Option<String>,
    /// How many of the latest cells. Default 20.
    #[serde(default)]
    pub last: Option<usize>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct HistoryOutput {
    pub session: String,
    pub cells: Vec<HistoryEntry>,
    /// The cell still running, if any: {cell, code, elapsed_s}.
    pub running: Option<Value>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunFileParams {
    /// Path of the Python script (relative to the session's working directory).
    pub path: PathArg,
    /// Session name. Default "default".
    #[serde(default)]
    pub session: Option<String>,
    /// Command-line arguments: sys.argv[1:].
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Seconds to wait before returning status "running", as in python_exec.
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CompleteParams {
    /// Code being written; completions are for the name or attribute before the cursor.
    pub code: String,
    /// Cursor position in characters (default: the end of code).
    #[serde(default)]
    pub cursor: Option<usize>,
    /// Session name. Default "default".
    #[serde(default)]
    pub session: Option<String>,
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

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NamespaceAction {
    Set,
    Delete,
    Clear,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct NamespaceParams {
    /// set: bind `name` to `value`; delete: remove `names`; clear: remove every user variable
    /// (the interpreter keeps running: imported modules stay loaded).
    pub action: NamespaceAction,
    /// Session name. Default "default".
    #[serde(default)]
    pub session: Option<String>,
    /// set: the variable name.
    #[serde(default)]
    pub name: Option<String>,
    /// set: any JSON value (objects become dicts, arrays lists, null None).
    #[serde(default)]
    pub value: Option<Value>,
    /// delete: the variable names.
    #[serde(default)]
    pub names: Option<Vec<String>>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct NamespaceOutput {
    pub session: String,
    /// The names set or removed.
    pub changed: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StatusOutput {
    pub version: String,
    pub uptime_s: f64,
    /// Default interpreter of new sessions.
    pub python: String,
    pub workdir: String,
    pub sessions: Vec<SessionInfo>,
    /// Shell jobs, running and recently finished.
    pub jobs: Vec<crate::jobs::JobInfo>,
    /// Tool groups exposed (--tools).
    pub tool_groups: Vec<String>,
    /// Configured limits, by flag name.
    pub limits: BTreeMap<String, Value>,
    /// OS-level confinement of workers.
    pub sandbox: String,
}

#[tool_router(router = workspace_router, vis = "pub(super)")]
impl FerreplServer {
    #[tool(
        description = "List sessions, or create / delete one. list: name, state (idle, busy, waiting_input, dead, starting), pid, cells run, memory, uptime, interpreter. \
create: a session with its own interpreter (python or venv), working directory or environment variables. \
delete: end a session and every process it started. Sessions idle past the server's TTL end by themselves. \
Examples: {} ; {\"action\": \"create\", \"name\": \"ml\", \"venv\": \".venv\", \"env\": {\"CUDA_VISIBLE_DEVICES\": \"\"}} ; {\"action\": \"delete\", \"name\": \"ml\"}.",
        output_schema = schema_for_output::<SessionsOutput>(),
        annotations(title = "Sessions", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn python_sessions(
        &self,
        Parameters(p): Parameters<SessionsParams>,
    ) -> Result<CallToolResult, McpError> {
        let message = match p.action.unwrap_or(SessionAction::List) {
            SessionAction::List => None,
            SessionAction::Create => {
                let Some(name) = p.name.as_deref() else {
                    return Ok(render::tool_error("create needs a session name in 'name'"));
                };
                let opts = SessionOptions {
                    python: p.python,
                    venv: p.venv,
                    workdir: p.workdir,
                    env: p.env.unwrap_or_default(),
                };
                match self.manager.create(name, opts).await {
                    Ok(_) => Some(format!(
                        "Session '{name}' created and its interpreter is ready."
                    )),
                    Err(e) => return Ok(render::tool_error(e)),
                }
            }
            SessionAction::Delete => {
                let Some(name) = p.name.as_deref() else {
                    return Ok(render::tool_error("delete needs a session name in 'name'"));
                };
                match self.manager.delete(name) {
                    Ok(msg) => Some(msg),
                    Err(e) => return Ok(render::tool_error(e)),
                }
            }
        };
        let sessions = self.manager.list();
        let mut text = message.clone().map(|m| m + "\n").unwrap_or_default();
        text.push_str(&sessions_table(&sessions));
        Ok(render::structured(
            text,
            &SessionsOutput { sessions, message },
        ))
    }

    #[tool(
        description = "The cells a session ran: number, code, status, elapsed time and the start of the output (newest last). \
Use it to recall what was done, then python_output to read a cell's full output. Example: {\"last\": 5}.",
        output_schema = schema_for_output::<HistoryOutput>(),
        annotations(title = "Cell history", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn python_history(
        &self,
        Parameters(p): Parameters<HistoryParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = session_name(&p.session).to_string();
        let cells = match self.manager.history(&session, p.last) {
            Ok(c) => c,
            Err(e) => return Ok(render::tool_error(e)),
        };
        let running = self.manager.running_cell(&session);
        let mut text = String::new();
        if cells.is_empty() && running.is_none() {
            text.push_str(&format!("session {session}: no cells yet\n"));
        }
        for c in &cells {
            text.push_str(&format!(
                "[cell {} | {} | {:.0} ms]\n{}\n",
                c.cell,
                c.status.as_str(),
                c.elapsed_ms,
                c.code.trim_end()
            ));
            if !c.output_preview.trim().is_empty() {
                text.push_str(&format!(
                    "  => {}\n",
                    c.output_preview.trim_end().replace('\n', "\n     ")
                ));
            }
        }
        if let Some((cell, code, secs)) = &running {
            text.push_str(&format!(
                "[cell {cell} | running | {secs:.1} s]\n{}\n",
                code.trim_end()
            ));
        }
        let out = HistoryOutput {
            session,
            cells,
            running: running.map(|(cell, code, secs)| serde_json::json!({"cell": cell, "code": code, "elapsed_s": secs})),
        };
        Ok(render::structured(text, &out))
    }

    #[tool(
        description = "Run a Python script file inside a session, as __main__ with sys.argv = [path, *args]; its globals stay in \
the session afterwards. Same result and wait/input/interrupt cycle as python_exec. \
Example: {\"path\": \"train.py\", \"args\": [\"--epochs\", \"3\"]}.",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Run a script", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true)
    )]
    async fn python_run_file(
        &self,
        Parameters(p): Parameters<RunFileParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let wait = self.manager.wait_window(secs(p.wait_s));
        let session = session_name(&p.session).to_string();
        let args = p.args.unwrap_or_default();
        let call = CallContext {
            meta,
            peer,
            ct,
            interrupt_on_cancel: true,
        };
        let source = CellSource::File {
            path: p.path.as_str(),
            args: &args,
        };
        let fut = self.manager.exec(&session, source, wait);
        Ok(self.drive(&session, call, fut).await)
    }

    #[tool(
        description = "Completions for the name or attribute before the cursor, from the session's live objects \
(jedi when installed, else rlcompleter). Works while a cell runs. Example: {\"code\": \"df.gro\"} -> groupby.",
        output_schema = schema_for_output::<CompleteOutput>(),
        annotations(title = "Complete code", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn python_complete(
        &self,
        Parameters(p): Parameters<CompleteParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = session_name(&p.session).to_string();
        let reply = match self.manager.complete(&session, &p.code, p.cursor).await {
            Ok(r) => r,
            Err(e) => return Ok(render::tool_error(e)),
        };
        let completions = reply
            .get("completions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = completions
            .iter()
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .collect();
        let out = CompleteOutput {
            session,
            engine: reply
                .get("engine")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            token: reply
                .get("token")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            completions: completions.clone(),
        };
        let text = if names.is_empty() {
            format!("no completions for {:?}", out.token)
        } else {
            names.join("\n")
        };
        Ok(render::structured(text, &out))
    }

    #[tool(
        description = "Change a session's variables without running code: set one from a JSON value, delete some, or clear them all \
(the interpreter keeps running; use python_reset for a fresh one). Refused while a cell runs. \
Examples: {\"action\": \"set\", \"name\": \"config\", \"value\": {\"lr\": 0.1}} ; {\"action\": \"delete\", \"names\": [\"df\"]} ; {\"action\": \"clear\"}.",
        output_schema = schema_for_output::<NamespaceOutput>(),
        annotations(title = "Edit variables", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn python_namespace(
        &self,
        Parameters(p): Parameters<NamespaceParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = session_name(&p.session).to_string();
        let mut args = serde_json::Map::new();
        let action = match p.action {
            NamespaceAction::Set => {
                let Some(name) = p.name else {
                    return Ok(render::tool_error("set needs 'name' (and 'value')"));
                };
                args.insert("name".into(), Value::from(name));
                args.insert("value".into(), p.value.unwrap_or(Value::Null));
                "set"
            }
            NamespaceAction::Delete => {
                let names = p.names.unwrap_or_default();
                if names.is_empty() {
                    return Ok(render::tool_error(
                        "delete needs 'names', a list of variable names",
                    ));
                }
                args.insert("names".into(), Value::from(names));
                "delete"
            }
            NamespaceAction::Clear => "clear",
        };
        args.insert("action".into(), Value::from(action));
        match self.manager.edit_namespace(&session, args).await {
            Ok(reply) => {
                let changed: Vec<String> = reply
                    .get("changed")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let text = match action {
                    "set" => format!("set {} in session {session}", changed.join(", ")),
                    "delete" => format!("deleted {} from session {session}", changed.join(", ")),
                    _ => format!("cleared {} variables from session {session}", changed.len()),
                };
                Ok(render::structured(
                    text,
                    &NamespaceOutput { session, changed },
                ))
            }
            Err(e) => Ok(render::tool_error(e)),
        }
    }

    #[tool(
        description = "ferrepl's status: version, default interpreter, sessions, configured limits, exposed tool groups, \
sandbox state and uptime. Example: {}.",
        output_schema = schema_for_output::<StatusOutput>(),
        annotations(title = "Server status", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn server_status(&self) -> Result<CallToolResult, McpError> {
        let mut status = self.manager.status();
        let sessions = self.manager.list();
        let (max_jobs, job_ttl) = self.jobs.limits();
        status
            .limits
            .insert("max-jobs".into(), Value::from(max_jobs));
        status
            .limits
            .insert("job-ttl".into(), Value::from(job_ttl.as_secs_f64()));
        let out = StatusOutput {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_s: status.uptime_s,
            python: status.python.clone(),
            workdir: status.workdir.clone(),
            sessions,
            jobs: self.jobs.list(),
            tool_groups: self.groups.names(),
            limits: status.limits.clone(),
            sandbox: status.sandbox.clone(),
        };
        let mut text = format!(
            "ferrepl {} | up {:.0} s | python {} | workdir {}\ntools: {}\nsandbox: {}\n",
            out.version,
            out.uptime_s,
            out.python,
            out.workdir,
            out.tool_groups.join(", "),
            out.sandbox
        );
        text.push_str("limits:");
        for (k, v) in &out.limits {
            text.push_str(&format!(" {k}={v}"));
        }
        text.push('\n');
        text.push_str(&sessions_table(&out.sessions));
        let running = out
            .jobs
            .iter()
            .filter(|j| j.status == crate::jobs::JobStatus::Running)
            .count();
        text.push_str(&format!(
            "jobs: {} running, {} kept\n",
            running,
            out.jobs.len()
        ));
        Ok(render::structured(text, &out))
    }
}

pub(super) fn sessions_table(sessions: &[SessionInfo]) -> String {
    let mut text = String::new();
    if sessions.is_empty() {
        text.push_str("no sessions; python_exec creates one on first use\n");
    }
    for s in sessions {
        let mem = s
            .memory_bytes
            .map(|b| format!("{:.1} MiB", b as f64 / 1048576.0))
            .unwrap_or_else(|| "-".into());
        let running = s
            .running_cell
            .map(|c| format!(", running cell {c}"))
            .unwrap_or_default();
        text.push_str(&format!(
            "{}: {}{running}, pid {}, {} cells, {mem}, up {:.0} s\n",
            s.name,
            s.state,
            s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            s.cells,
            s.uptime_s
        ));
    }
    text
}
