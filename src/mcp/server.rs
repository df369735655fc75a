//! The MCP tool surface: schemas, descriptions and dispatch to sessions.

use std::sync::Arc;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    ProgressNotificationParam, RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{
    ErrorData as McpError, Peer, RoleServer, ServerHandler, tool, tool_handler, tool_router,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::args::{self, Parameters, Seconds, secs};
use super::groups::ToolGroups;
use super::output_tool::{self, OutputParams, OutputWindow};
use super::render::{self, CellOutput};
use super::schema;
use crate::jobs::JobManager;
use crate::session::report::CellReport;
use crate::session::{SessionError, SessionManager};

/// What a cell call needs from its request besides the arguments.
pub(super) struct CallContext {
    pub(super) meta: RequestMetaObject,
    pub(super) peer: Peer<RoleServer>,
    pub(super) ct: CancellationToken,
    /// Whether a cancellation of this call interrupts the cell (python_exec
    /// only: cancelling a wait just stops waiting).
    pub(super) interrupt_on_cancel: bool,
}

/// The server's instructions: the rules every tool shares, said once.
const INSTRUCTIONS: &str = "Python sessions whose variables persist between calls; each session is its own interpreter process, \
created on first use (session defaults to \"default\"). A result ends with a status line: ok, error, running, waiting_input, interrupted or crashed. \
A call returns within wait_s; a cell still going then returns 'running' and keeps running: \
python_wait collects it, answers its input() or interrupts it.";

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecParams {
    /// Python code; the last expression's repr is returned.
    pub code: String,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitParams {
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub wait_s: Option<Seconds>,
    /// Answers the pending input().
    #[serde(default)]
    pub input: Option<String>,
    /// Close stdin (EOFError).
    #[serde(default)]
    pub eof: Option<bool>,
    /// KeyboardInterrupt; variables are kept.
    #[serde(default)]
    pub interrupt: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct InspectParams {
    #[serde(default)]
    pub session: Option<String>,
    /// e.g. "df.columns".
    #[serde(default)]
    pub name: Option<String>,
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
#[derive(Clone)]
pub struct AppParts {
    pub manager: Arc<SessionManager>,
    pub jobs: Arc<JobManager>,
    pub files: crate::files::Workspace,
    pub groups: ToolGroups,
    /// --structured-content.
    pub structured: bool,
}

#[derive(Clone)]
pub struct FerreplServer {
    pub(super) manager: Arc<SessionManager>,
    pub(super) jobs: Arc<JobManager>,
    pub(super) files: crate::files::Workspace,
    pub(super) groups: ToolGroups,
    structured: bool,
    /// The session an omitted `session` argument names.
    default_session: String,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl FerreplServer {
    /// The server of one MCP connection; `default_session` is what an omitted
    /// `session` argument means for it.
    pub fn new(app: &AppParts, default_session: String) -> Self {
        let mut router = Self::tool_router()
            + Self::workspace_router()
            + Self::shell_router()
            + Self::packages_router()
            + Self::file_router();
        router.map.retain(|name, _| app.groups.exposes(name));
        let (default_wait, max_wait) = app.manager.wait_bounds();
        let wait_doc =
            format!("Seconds to wait (default {default_wait:.0}, at most {max_wait:.0}).");
        for route in router.map.values_mut() {
            let tool = &mut route.attr;
            let mut input = (*tool.input_schema).clone();
            schema::portable(&mut input);
            schema::describe_property(&mut input, "wait_s", &wait_doc);
            tool.input_schema = Arc::new(input);
            tool.output_schema = match (app.structured, tool.output_schema.take()) {
                (true, Some(out)) => {
                    let mut out = (*out).clone();
                    schema::portable(&mut out);
                    Some(Arc::new(out))
                }
                _ => None,
            };
        }
        Self {
            manager: app.manager.clone(),
            jobs: app.jobs.clone(),
            files: app.files.clone(),
            groups: app.groups.clone(),
            structured: app.structured,
            default_session,
            tool_router: router,
        }
    }

    /// The session a `session` argument names (omitted or empty: this
    /// connection's default).
    pub(super) fn session_name(&self, s: &Option<String>) -> String {
        s.as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(&self.default_session)
            .to_string()
    }

    #[tool(
        description = "Run Python code in a persistent session. Returns the output (stdout and stderr, subprocesses included), \
the last expression's repr, and the traceback if it raised. Example: {\"code\": \"import math\\nmath.pi * 2\"}",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Run Python")
    )]
    async fn python_exec(
        &self,
        Parameters(p): Parameters<ExecParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let wait = self.manager.wait_window(secs(p.wait_s));
        let session = self.session_name(&p.session);
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
        description = "Follow a cell that returned 'running' or 'waiting_input': its new output once it finishes, asks \
for input or wait_s passes. Repeats the last result if that was lost.",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Wait for a cell", destructive_hint = false, open_world_hint = false)
    )]
    async fn python_wait(
        &self,
        Parameters(p): Parameters<WaitParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let wait = self.manager.wait_window(secs(p.wait_s));
        let session = self.session_name(&p.session);
        let interrupt = p.interrupt.unwrap_or(false);
        let eof = p.eof.unwrap_or(false);
        if interrupt && (p.input.is_some() || eof) {
            return Ok(render::tool_error(
                "give either input/eof or interrupt, not both",
            ));
        }
        if interrupt {
            return Ok(match self.manager.interrupt(&session).await {
                Ok(report) => render::cell_result(&report),
                Err(e) => render::tool_error(e),
            });
        }
        let call = CallContext {
            meta,
            peer,
            ct,
            interrupt_on_cancel: false,
        };
        if p.input.is_some() || eof {
            let text = p.input.unwrap_or_default();
            let fut = self.manager.input(&session, &text, eof, wait);
            return Ok(self.drive(&session, call, fut).await);
        }
        let fut = self.manager.wait(&session, wait);
        Ok(self.drive(&session, call, fut).await)
    }

    #[tool(
        description = "Read a cell's full output (long results keep only head and tail): a window, or the lines matching \
grep with context. Example: {\"cell\": 7, \"grep\": \"Error\"}",
        output_schema = schema_for_output::<OutputWindow>(),
        annotations(title = "Read cell output", read_only_hint = true)
    )]
    async fn python_output(
        &self,
        Parameters(p): Parameters<OutputParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = self.session_name(&p.session);
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
        Ok(match output_tool::window(source, &p.window()) {
            Ok(w) => render::structured(output_tool::render(&w, p.lines.unwrap_or(false)), &w),
            Err(e) => render::tool_error(e),
        })
    }

    #[tool(
        description = "A session's variables (type, repr, shape), or one object in detail (name). Works while a cell runs.",
        output_schema = schema_for_output::<InspectOutput>(),
        annotations(title = "Inspect variables", read_only_hint = true)
    )]
    async fn python_inspect(
        &self,
        Parameters(p): Parameters<InspectParams>,
    ) -> Result<CallToolResult, McpError> {
        let session = self.session_name(&p.session);
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
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let tcc = ToolCallContext::new(self, request, context);
        let mut response = self.tool_router.call(tcc).await?;
        if let CallToolResponse::Complete(result) = &mut response {
            if !self.structured {
                result.structured_content = None;
            } else if let Some(value) = &mut result.structured_content {
                // Optional fields are left out rather than null: the output
                // schemas do not allow null (see schema.rs).
                schema::strip_nulls(value);
            }
            args::plain_argument_error(result);
        }
        Ok(response)
    }

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
