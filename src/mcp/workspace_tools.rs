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
use super::server::{CallContext, FerreplServer};
use crate::session::{CellSource, HistoryEntry, SessionInfo, SessionOptions};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionAction {
    List,
    Create,
    Reset,
    Delete,
    Status,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionsParams {
    /// Default list.
    #[serde(default)]
    pub action: Option<SessionAction>,
    #[serde(default, alias = "name")]
    pub session: Option<String>,
    #[serde(default)]
    pub python: Option<PathBuf>,
    #[serde(default)]
    pub venv: Option<PathBuf>,
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
}

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

#[derive(Debug, Deserialize, JsonSchema)]
pub struct HistoryParams {
    #[serde(default)]
    pub session: Option<String>,
    /// How many of the latest cells (default 20).
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
    pub path: PathArg,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CompleteParams {
    pub code: String,
    /// Character offset (default: the end).
    #[serde(default)]
    pub cursor: Option<usize>,
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
    pub action: NamespaceAction,
    #[serde(default)]
    pub session: Option<String>,
    /// set: the variable.
    #[serde(default)]
    pub name: Option<String>,
    /// set: any JSON value.
    #[serde(default)]
    pub value: Option<Value>,
    /// delete: the variables.
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
        description = "List sessions, or create one (with its own python, venv, workdir or env), reset one to a fresh \
interpreter, delete one; status: the server's limits and sandbox. Example: {\"action\": \"reset\", \"session\": \"ml\"}",
        output_schema = schema_for_output::<SessionsOutput>(),
        annotations(title = "Sessions", open_world_hint = false)
    )]
    async fn python_sessions(
        &self,
        Parameters(p): Parameters<SessionsParams>,
    ) -> Result<CallToolResult, McpError> {
        let action = p.action.unwrap_or(SessionAction::List);
        let named = p.session.as_deref().filter(|s| !s.is_empty());
        let message = match action {
            SessionAction::List => None,
            SessionAction::Status => return Ok(self.server_status()),
            SessionAction::Create => {
                let Some(name) = named else {
                    return Ok(render::tool_error(
                        "create needs the new session's name in 'session'",
                    ));
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
            SessionAction::Reset => {
                let name = self.session_name(&p.session);
                match self.manager.reset(&name).await {
                    Ok(message) => Some(message),
                    Err(e) => return Ok(render::tool_error(e)),
                }
            }
            SessionAction::Delete => {
                let Some(name) = named else {
                    return Ok(render::tool_error(
                        "delete needs the session's name in 'session'",
                    ));
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
            &SessionsOutput {
                sessions,
                message,
                server: None,
            },
        ))
    }

    #[tool(
        description = "The cells a session ran: code, status, time and the start of their output.",
        output_schema = schema_for_output::<HistoryOutput>(),
        annotations(title = "Cell history", read_only_hint = true)
    )]
    async fn python_history(
        &self,
        Parameters(p): Parameters<HistoryParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = self.session_name(&p.session);
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
        description = "Run a script in a session as __main__ with sys.argv [path, *args]; its globals stay. Like python_exec.",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Run a script")
    )]
    async fn python_run_file(
        &self,
        Parameters(p): Parameters<RunFileParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let wait = self.manager.wait_window(secs(p.wait_s));
        let session = self.session_name(&p.session);
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
        description = "Completions at the cursor from the session's live objects. Example: {\"code\": \"df.gro\"}",
        output_schema = schema_for_output::<CompleteOutput>(),
        annotations(title = "Complete code", read_only_hint = true)
    )]
    async fn python_complete(
        &self,
        Parameters(p): Parameters<CompleteParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = self.session_name(&p.session);
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
        description = "Set a variable from JSON, delete some, or clear all, without running code. \
Example: {\"action\": \"set\", \"name\": \"cfg\", \"value\": {\"lr\": 0.1}}",
        output_schema = schema_for_output::<NamespaceOutput>(),
        annotations(title = "Edit variables", idempotent_hint = true, open_world_hint = false)
    )]
    async fn python_namespace(
        &self,
        Parameters(p): Parameters<NamespaceParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = self.session_name(&p.session);
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
}

impl FerreplServer {
    /// python_sessions {action: status}: version, interpreter, limits,
    /// sandbox, sessions and jobs.
    fn server_status(&self) -> CallToolResult {
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
        text.push_str(&sessions_table(&sessions));
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
        render::structured(
            text,
            &SessionsOutput {
                sessions,
                message: None,
                server: Some(out),
            },
        )
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
            .map(crate::units::human_bytes)
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
