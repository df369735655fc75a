//! The MCP tool surface: schemas, descriptions and dispatch to sessions.

use std::sync::Arc;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolResult, Implementation, ProgressNotificationParam, RequestMetaObject,
    ServerCapabilities, ServerConfig,
};
use rmcp::{
    ErrorData as McpError, Peer, RoleServer, ServerHandler, tool, tool_handler, tool_router,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::args::{Parameters, Seconds, secs};
use super::groups::ToolGroups;
use super::output_tool::{self, OutputParams, OutputWindow};
use super::render::{self, CellOutput};
use crate::jobs::JobManager;
use crate::session::report::CellReport;
use crate::session::{DEFAULT_SESSION, SessionError, SessionManager};

/// What a cell call needs from its request besides the arguments.
pub(super) struct CallContext {
    pub(super) meta: RequestMetaObject,
    pub(super) peer: Peer<RoleServer>,
    pub(super) ct: CancellationToken,
    /// Whether a cancellation of this call interrupts the cell (python_exec
    /// only: cancelling a wait just stops waiting).
    pub(super) interrupt_on_cancel: bool,
}

const INSTRUCTIONS: &str = "ferrepl runs Python in persistent sessions: each session is its own interpreter process whose variables persist across calls. \
Run code with python_exec; the result has the output, the value of the last expression and any traceback. \
Long cells: python_exec returns status 'running' after wait_s seconds while the cell keeps going; collect it with python_wait, stop it with python_interrupt. \
A cell that calls input() returns status 'waiting_input' with the prompt; answer with python_input. \
Use separate session names for independent work; python_reset gives a session a fresh interpreter.";

pub(super) fn session_name(s: &Option<String>) -> &str {
    s.as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_SESSION)
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecParams {
    /// Python source to run as one cell. Multi-line code, function and class definitions and
    /// top-level `await` all work. If the last statement is an expression its repr is returned as
    /// the value (a cell of assignments returns no value).
    pub code: String,
    /// Session name: letters, digits, '_', '-', '.'; created on first use. Default "default".
    #[serde(default)]
    pub session: Option<String>,
    /// Seconds to wait for the cell before returning with status "running" (the cell keeps
    /// running; collect it with python_wait). Default 30; capped by the server's maximum.
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionParams {
    /// Session name. Default "default".
    #[serde(default)]
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitParams {
    /// Session name. Default "default".
    #[serde(default)]
    pub session: Option<String>,
    /// Longest time to wait, in seconds, for the cell to finish or ask for input. Default 30.
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct InputParams {
    /// The line to give to the pending input() (without a trailing newline).
    pub text: String,
    /// Session name. Default "default".
    #[serde(default)]
    pub session: Option<String>,
    /// Close the input instead: input() raises EOFError (sys.stdin.read() ends). Default false.
    #[serde(default)]
    pub eof: Option<bool>,
    /// Longest time to wait afterwards, in seconds, like python_wait. Default 30.
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct InspectParams {
    /// Session name. Default "default".
    #[serde(default)]
    pub session: Option<String>,
    /// A variable name or dotted path (e.g. "df" or "model.fit"). Omit to list all user variables.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ResetOutput {
    pub session: String,
    pub message: String,
}

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

/// What every transport session's server is built from.
pub type AppParts = (
    Arc<SessionManager>,
    Arc<JobManager>,
    crate::files::Workspace,
    ToolGroups,
);

#[derive(Clone)]
pub struct FerreplServer {
    pub(super) manager: Arc<SessionManager>,
    pub(super) jobs: Arc<JobManager>,
    pub(super) files: crate::files::Workspace,
    pub(super) groups: ToolGroups,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl FerreplServer {
    pub fn new(
        manager: Arc<SessionManager>,
        jobs: Arc<JobManager>,
        files: crate::files::Workspace,
        groups: ToolGroups,
    ) -> Self {
        let mut router = Self::tool_router()
            + Self::workspace_router()
            + Self::shell_router()
            + Self::packages_router()
            + Self::file_router();
        let names: Vec<String> = router
            .list_all()
            .iter()
            .map(|t| t.name.to_string())
            .collect();
        for name in names {
            if !groups.exposes(&name) {
                router.remove_route(&name);
            }
        }
        Self {
            manager,
            jobs,
            files,
            groups,
            tool_router: router,
        }
    }

    #[tool(
        description = "Run Python code in a persistent session (its own interpreter; variables persist across calls). \
Returns the cell's stdout/stderr (captured at the fd level, so subprocess output is included), the repr of the last expression, \
and the traceback if it raised (isError true). Returns early with status 'running' if the cell outlives wait_s (then use \
python_wait or python_interrupt), or 'waiting_input' if it calls input() (answer with python_input). \
Example: {\"code\": \"import math\\nr = 2\\nmath.pi * r**2\"} -> value '12.566370614359172'.",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Run Python", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true)
    )]
    async fn python_exec(
        &self,
        Parameters(p): Parameters<ExecParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let wait = self.manager.wait_window(secs(p.wait_s));
        let session = session_name(&p.session).to_string();
        let call = CallContext {
            meta,
            peer,
            ct,
            interrupt_on_cancel: true,
        };
        let fut = self
            .manager
            .exec(&session, crate::session::CellSource::Code(&p.code), wait);
        Ok(self.drive(&session, call, fut).await)
    }

    #[tool(
        description = "Wait for the running cell of a session: returns as soon as it finishes or asks for input, or when wait_s runs out \
(status 'running' again). Returns only output not shown before. Use after python_exec returned status 'running'. \
Example: {\"session\": \"train\", \"wait_s\": 60}.",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Wait for a running cell", read_only_hint = true, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn python_wait(
        &self,
        Parameters(p): Parameters<WaitParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let wait = self.manager.wait_window(secs(p.wait_s));
        let session = session_name(&p.session).to_string();
        let call = CallContext {
            meta,
            peer,
            ct,
            interrupt_on_cancel: false,
        };
        let fut = self.manager.wait(&session, wait);
        Ok(self.drive(&session, call, fut).await)
    }

    #[tool(
        description = "Answer a pending input() (also getpass, sys.stdin.readline, pdb) of a cell whose status is 'waiting_input', \
then wait like python_wait. Set eof=true to close the input instead. Example: {\"text\": \"Alice\"}.",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Answer input()", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn python_input(
        &self,
        Parameters(p): Parameters<InputParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let wait = self.manager.wait_window(secs(p.wait_s));
        let eof = p.eof.unwrap_or(false);
        let session = session_name(&p.session).to_string();
        let call = CallContext {
            meta,
            peer,
            ct,
            interrupt_on_cancel: false,
        };
        let fut = self.manager.input(&session, &p.text, eof, wait);
        Ok(self.drive(&session, call, fut).await)
    }

    #[tool(
        description = "Interrupt the running cell of a session (KeyboardInterrupt, like Ctrl-C); the session's variables are kept. \
Returns the cell's final result with status 'interrupted'. If the code ignores interrupts it is interrupted again and then its \
interpreter is killed (the result says so: the state is then lost). Example: {\"session\": \"default\"}.",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Interrupt a cell", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn python_interrupt(
        &self,
        Parameters(p): Parameters<SessionParams>,
    ) -> Result<CallToolResult, McpError> {
        Ok(
            match self.manager.interrupt(session_name(&p.session)).await {
                Ok(report) => render::cell_result(&report),
                Err(e) => render::tool_error(e),
            },
        )
    }

    #[tool(
        description = "Read the full output of a cell (results show at most the first and last ~10 KB of long output). \
A window by character offset (default the first 20000 characters), or by lines with lines=true, or only the lines matching \
a regular expression (grep) with context. Output of the last 50 cells per session is kept. \
Example: {\"cell\": 7, \"grep\": \"Error|Warning\"} or {\"cell\": 7, \"offset\": 20000}.",
        output_schema = schema_for_output::<OutputWindow>(),
        annotations(title = "Read a cell's full output", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn python_output(
        &self,
        Parameters(p): Parameters<OutputParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = session_name(&p.session).to_string();
        let (cell, running, bytes, dropped) = match self.manager.cell_output(&session, p.cell) {
            Ok(found) => found,
            Err(e) => return Ok(render::tool_error(e)),
        };
        let source = output_tool::Source {
            origin: output_tool::Origin::Cell { session, cell },
            running,
            bytes,
            dropped,
        };
        Ok(match output_tool::window(source, &p) {
            Ok(w) => render::structured(output_tool::render(&w, p.lines.unwrap_or(false)), &w),
            Err(e) => render::tool_error(e),
        })
    }

    #[tool(
        description = "Restart a session's Python interpreter: all its variables and imports are cleared (a running cell is stopped). \
Use when state is broken or to start clean. Example: {\"session\": \"default\"}.",
        output_schema = schema_for_output::<ResetOutput>(),
        annotations(title = "Reset a session", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn python_reset(
        &self,
        Parameters(p): Parameters<SessionParams>,
    ) -> Result<CallToolResult, McpError> {
        let name = session_name(&p.session).to_string();
        Ok(match self.manager.reset(&name).await {
            Ok(message) => render::structured(
                message.clone(),
                &ResetOutput {
                    session: name,
                    message,
                },
            ),
            Err(e) => render::tool_error(e),
        })
    }

    #[tool(
        description = "Look at a session's variables without running code. Without 'name': every user variable with its type, \
a short repr and len/shape (modules, imported functions and _private names are left out). With 'name' (a variable or dotted \
path): its type, a longer repr, and for callables the signature and docstring. Works while a cell runs. \
Example: {\"name\": \"df\"}.",
        output_schema = schema_for_output::<InspectOutput>(),
        annotations(title = "Inspect variables", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn python_inspect(
        &self,
        Parameters(p): Parameters<InspectParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = session_name(&p.session).to_string();
        let target = p.name.as_deref().filter(|n| !n.is_empty());
        Ok(match self.manager.inspect(&session, target).await {
            Ok(reply) => {
                let out = InspectOutput {
                    session: session.clone(),
                    variables: reply.get("variables").and_then(Value::as_array).cloned(),
                    detail: reply.get("detail").cloned(),
                };
                render::structured(render_inspect(&out), &out)
            }
            Err(e) => render::tool_error(e),
        })
    }
}

impl FerreplServer {
    /// Runs a cell call to completion while sending progress notifications
    /// (when the request has a progress token) and turning a cancellation
    /// from the client into an interrupt of the cell.
    pub(super) async fn drive(
        &self,
        session: &str,
        call: CallContext,
        fut: impl Future<Output = Result<CellReport, SessionError>>,
    ) -> CallToolResult {
        let token = call.meta.get_progress_token();
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(fut);
        loop {
            tokio::select! {
                result = &mut fut => {
                    return match result {
                        Ok(report) => render::cell_result(&report),
                        Err(e) => render::tool_error(e),
                    };
                }
                _ = ticker.tick(), if token.is_some() => {
                    if let (Some(token), Some((elapsed, line))) = (&token, self.manager.progress(session)) {
                        let message = if line.is_empty() {
                            format!("running for {elapsed:.0} s")
                        } else {
                            format!("running for {elapsed:.0} s: {line}")
                        };
                        let param = ProgressNotificationParam::new(token.clone(), elapsed).with_message(message);
                        if let Err(e) = call.peer.notify_progress(param).await {
                            tracing::debug!("progress notification not sent: {e}");
                        }
                    }
                }
                _ = call.ct.cancelled() => {
                    if !call.interrupt_on_cancel {
                        return render::tool_error("the call was cancelled by the client; the cell keeps running");
                    }
                    // The client gave up on this call: stop the cell, keep the session.
                    let manager = self.manager.clone();
                    let session = session.to_string();
                    tokio::spawn(async move {
                        if let Err(e) = manager.interrupt(&session).await {
                            tracing::debug!("interrupt after cancellation: {e}");
                        }
                    });
                    return render::tool_error("the call was cancelled by the client; the cell was interrupted");
                }
            }
        }
    }
}

const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

fn render_inspect(out: &InspectOutput) -> String {
    let mut text = String::new();
    if let Some(vars) = &out.variables {
        if vars.is_empty() {
            text.push_str(&format!("session {}: no user variables\n", out.session));
        }
        for v in vars {
            let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let mut extra = String::new();
            if let Some(n) = v.get("len").and_then(Value::as_u64) {
                extra.push_str(&format!(" len={n}"));
            }
            if let Some(shape) = v.get("shape") {
                extra.push_str(&format!(" shape={shape}"));
            }
            text.push_str(&format!(
                "{}: {}{extra} = {}\n",
                field("name"),
                field("type"),
                field("repr")
            ));
        }
    }
    if let Some(d) = &out.detail {
        let field = |k: &str| d.get(k).and_then(Value::as_str).map(str::to_string);
        text.push_str(&format!(
            "{}: {}\n",
            field("name").unwrap_or_default(),
            field("type").unwrap_or_default()
        ));
        if let Some(sig) = field("signature") {
            text.push_str(&format!(
                "signature: {}{sig}\n",
                field("name").unwrap_or_default()
            ));
        }
        if let Some(r) = field("repr") {
            text.push_str(&format!("repr: {r}\n"));
        }
        if let Some(doc) = field("doc") {
            text.push_str(&format!("doc:\n{doc}\n"));
        }
        if let Some(file) = field("file") {
            let line = d.get("line").and_then(Value::as_u64).unwrap_or(1);
            text.push_str(&format!("defined in: {file}:{line}\n"));
        }
        if let Some(source) = field("source") {
            text.push_str(&format!("source:\n{source}"));
        }
    }
    text
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for FerreplServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_prompts()
                .build(),
        )
        .with_server_info(Implementation::new("ferrepl", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }
}
