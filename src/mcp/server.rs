//! The MCP tool surface: schemas, descriptions and dispatch to sessions.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;

use crate::worker::Language;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, GetPromptRequestParams,
    GetPromptResponse, GetTaskParams, GetTaskResult, Implementation, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, tool_handler};

use super::args;
use super::call::Call;
use super::error::{ToolError, ToolResult};
use super::groups::ToolGroups;
use super::render;
use super::schema;
use super::surface;
use crate::jobs::JobManager;
use crate::session::report::CellReport;
use crate::session::{SessionError, SessionManager};

/// The server's instructions: the rules every tool shares, said once.
const INSTRUCTIONS: &str = "Python sessions whose variables persist between calls; each session is its own interpreter process, \
created on first use (session defaults to \"default\"). A result ends with a status line: ok, error, running, waiting_input, interrupted or crashed. \
A call returns within wait_s (seconds; default {default}, at most {max}); a cell still going then returns 'running' and keeps running: \
python_wait collects it, answers its input() or interrupts it.";

/// R's tools take Python's argument types; what their arguments mean in R
/// is said here ("" drops a Python-only description).
const R_ARGUMENT_DOCS: &[(&str, &str, &str)] = &[
    ("r_exec", "code", "R code; values print as in the console."),
    ("r_wait", "input", "Answers readline()."),
    ("r_wait", "eof", ""),
    ("r_wait", "interrupt", ""),
    ("r_inspect", "name", "e.g. \"df$x\"."),
    // Said by Python's tools, which R's sit beside.
    ("r_exec", "parent", ""),
    ("r_output", "grep", ""),
    ("r_output", "limit", ""),
    ("r_complete", "cursor", ""),
    // The same window as python_output.
    ("shell_output", "grep", ""),
    ("shell_output", "limit", ""),
];

/// Added to the instructions when R is enabled.
const R_INSTRUCTIONS: &str = " R sessions (default \"r\"): the r_ tools, alike.";

/// What every transport session's server is built from.
#[derive(Clone)]
pub struct AppParts {
    manager: Arc<SessionManager>,
    jobs: Arc<JobManager>,
    files: crate::files::Workspace,
    groups: ToolGroups,
    /// --structured-content.
    structured: bool,
    /// The exposed tools with portable schemas, built once: over HTTP every
    /// connection gets its own server.
    router: ToolRouter<FerreplServer>,
    /// The tenant's MCP tasks, which outlive their connections.
    tasks: Arc<super::tasks::TaskStore>,
    /// The viewer's address, for python_sessions status (never a token).
    viewer_url: Option<String>,
}

impl AppParts {
    pub fn new(
        manager: Arc<SessionManager>,
        jobs: Arc<JobManager>,
        files: crate::files::Workspace,
        groups: ToolGroups,
        structured: bool,
        upstream_servers: &[String],
    ) -> Self {
        let mut router = FerreplServer::router(&groups, structured);
        if let Some(route) = router.map.get_mut("python_sessions") {
            // Only a server with --kernels pays for the word.
            let mut input = (*route.attr.input_schema).clone();
            match manager.kernel_names() {
                names if names.is_empty() => schema::remove_property(&mut input, "kernel"),
                names => schema::describe_property(
                    &mut input,
                    "kernel",
                    &format!("create on a Jupyter kernel: {}", names.join(", ")),
                ),
            }
            route.attr.input_schema = Arc::new(input);
        }
        FerreplServer::offer_kernel_exec(&mut router, &manager.other_kernels());
        if !upstream_servers.is_empty() {
            // Only a server with upstreams pays for these words.
            let servers = upstream_servers.join(", ");
            for (tool, line) in [
                ("python_exec", surface::PYTHON_CODE_TOOLS),
                ("r_exec", surface::R_CODE_TOOLS),
            ] {
                if let Some(route) = router.map.get_mut(tool) {
                    let base = route.attr.description.as_deref().unwrap_or("");
                    route.attr.description =
                        Some(format!("{base} {}", line.replace("{servers}", &servers)).into());
                }
            }
        }
        // Each working task follows one cell or job.
        let (max_jobs, job_ttl) = jobs.limits();
        let tasks = super::tasks::TaskStore::new(manager.max_sessions() + max_jobs, job_ttl);
        Self {
            manager,
            jobs,
            files,
            groups,
            structured,
            router,
            tasks: Arc::new(tasks),
            viewer_url: None,
        }
    }

    /// Names the viewer (--viewer) in python_sessions status.
    pub fn with_viewer(mut self, url: Option<String>) -> Self {
        self.viewer_url = url;
        self
    }
}

#[derive(Clone)]
pub struct FerreplServer {
    pub(crate) manager: Arc<SessionManager>,
    pub(crate) jobs: Arc<JobManager>,
    pub(crate) files: crate::files::Workspace,
    pub(crate) groups: ToolGroups,
    structured: bool,
    /// The session an omitted `session` argument names.
    default_session: String,
    tool_router: ToolRouter<Self>,
    pub(super) tasks: Arc<super::tasks::TaskStore>,
    /// Per-client: the connection's own sessions, let go when the last
    /// clone of this server (the connection's) is dropped.
    _client: Option<Arc<crate::session::clients::ClientSessions>>,
    pub(crate) viewer_url: Option<String>,
}

impl FerreplServer {
    /// The server of one MCP connection; `default_session` is what an omitted
    /// `session` argument means for it.
    pub fn new(app: &AppParts, default_session: String) -> Self {
        Self {
            manager: app.manager.clone(),
            jobs: app.jobs.clone(),
            files: app.files.clone(),
            groups: app.groups.clone(),
            structured: app.structured,
            default_session,
            tool_router: app.router.clone(),
            tasks: app.tasks.clone(),
            _client: None,
            viewer_url: app.viewer_url.clone(),
        }
    }

    /// The server of one connection under `--default-session per-client`:
    /// its default sessions (`default-N`, `r-N`) end after it, `grace` at
    /// most after it is gone.
    pub fn per_client(app: &AppParts, n: u64, grace: std::time::Duration) -> Self {
        let mut server = Self::new(app, format!("{}-{n}", crate::session::DEFAULT_SESSION));
        let names = vec![server.default_session.clone(), format!("r-{n}")];
        let owned = crate::session::clients::ClientSessions::new(&app.manager, names, grace);
        server._client = Some(Arc::new(owned));
        server
    }

    /// The tools `groups` expose, with schemas every client accepts and each
    /// `wait_s` saying its bounds; output schemas only with `structured`.
    fn router(groups: &ToolGroups, structured: bool) -> ToolRouter<Self> {
        let mut router = Self::python_router()
            + Self::sessions_router()
            + Self::more_router()
            + Self::shell_router()
            + Self::packages_router()
            + Self::r_router()
            + Self::kernel_router()
            + Self::r_packages_router()
            + Self::file_router();
        router.map.retain(|name, _| groups.exposes(name));
        for route in router.map.values_mut() {
            let tool = &mut route.attr;
            let mut input = (*tool.input_schema).clone();
            schema::portable(&mut input);
            if !groups.languages().contains(&Language::R) {
                // Python-only servers do not pay for R's words.
                schema::remove_property(&mut input, "language");
            }
            for (name, property, doc) in R_ARGUMENT_DOCS
                .iter()
                .chain(super::tools::kernel::ARGUMENT_DOCS)
            {
                if tool.name == *name {
                    schema::describe_property(&mut input, property, doc);
                }
            }
            tool.input_schema = Arc::new(input);
            if let Some((description, annotations)) = surface::docs_of(&tool.name) {
                tool.description = Some(description.into());
                tool.annotations = Some(annotations);
            }
            tool.output_schema = match (structured, tool.output_schema.take()) {
                (true, Some(out)) => {
                    let mut out = (*out).clone();
                    schema::portable(&mut out);
                    Some(Arc::new(out))
                }
                _ => None,
            };
        }
        router
    }

    /// The server's instructions, with R's line when R tools are exposed.
    fn instructions(&self) -> String {
        // wait_s's bounds, said once here rather than in every tool's schema.
        let (default, max) = self.manager.wait_bounds();
        let mut text = INSTRUCTIONS
            .replace("{default}", &format!("{default:.0}"))
            .replace("{max}", &format!("{max:.0}"));
        if self.groups.languages().contains(&Language::R) {
            text.push_str(R_INSTRUCTIONS);
        }
        text
    }

    /// The session a `session` argument names (omitted or empty: this
    /// connection's default).
    pub(crate) fn session_name(&self, s: &Option<String>) -> String {
        s.as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(&self.default_session)
            .to_string()
    }

    /// The session a `session` argument names for a tool of `lang`
    /// (omitted: that language's default), refused if it is another
    /// language's session.
    pub(crate) fn session_in(
        &self,
        s: &Option<String>,
        lang: Language,
    ) -> Result<String, crate::session::SessionError> {
        let name = match s.as_deref().filter(|s| !s.is_empty()) {
            Some(name) => {
                // A gone client's session, named by a call: taken over.
                self.manager.claim(name);
                name.to_string()
            }
            None => crate::session::default_for(lang, &self.default_session),
        };
        self.manager.check_language(&name, lang)?;
        Ok(name)
    }
}

impl FerreplServer {
    /// --sandbox inherit: puts `session` under the call's client policy
    /// (restarting it when that changed) before code runs in it.
    pub(crate) async fn under_client_policy(
        &self,
        call: &Call,
        session: &str,
        lang: Language,
    ) -> Result<(), ToolError> {
        let Some(policy) = call.client_policy(&self.manager).map_err(ToolError::new)? else {
            return Ok(());
        };
        let narrowed = self.manager.narrow(policy, lang)?;
        self.manager
            .apply_client_sandbox(session, lang, narrowed)
            .await?;
        Ok(())
    }

    /// --sandbox inherit: the jobs' sandbox narrowed by the call's client
    /// policy (None: the jobs' own). The kept venv is writable to shell
    /// jobs only as the policy makes every place writable: code planted
    /// there (a `.pth`) runs in every later interpreter.
    pub(crate) fn client_job_sandbox(
        &self,
        call: &Call,
    ) -> Result<Option<Arc<crate::sandbox::SandboxConfig>>, ToolError> {
        self.narrowed_jobs(call, &[])
    }

    /// The same for an install job, which writes the kept venv.
    pub(crate) fn client_install_sandbox(
        &self,
        call: &Call,
    ) -> Result<Option<Arc<crate::sandbox::SandboxConfig>>, ToolError> {
        self.narrowed_jobs(call, &self.manager.own_places())
    }

    fn narrowed_jobs(
        &self,
        call: &Call,
        own: &[std::path::PathBuf],
    ) -> Result<Option<Arc<crate::sandbox::SandboxConfig>>, ToolError> {
        let Some(policy) = call.client_policy(&self.manager).map_err(ToolError::new)? else {
            return Ok(None);
        };
        let ceiling = self.jobs.sandbox().filter(|s| s.enabled()).ok_or_else(|| {
            ToolError::new("--sandbox inherit needs the sandbox, which is off here")
        })?;
        policy
            .check_cwd(&ceiling.workspace)
            .map_err(ToolError::new)?;
        Ok(Some(Arc::new(
            crate::sandbox::client::narrow(ceiling, policy, own).config,
        )))
    }

    /// --sandbox inherit: refuses an install the call's client policy
    /// gives no network, or lets write nothing: an install puts code in
    /// the venv every later interpreter starts (R's library is in the
    /// workspace itself).
    pub(crate) fn client_allows_install(&self, call: &Call) -> Result<(), ToolError> {
        let Some(policy) = call.client_policy(&self.manager).map_err(ToolError::new)? else {
            return Ok(());
        };
        if !policy.may_write(self.files.root()) {
            return Err(ToolError::new(
                "the client's sandbox policy does not let this call write the workspace, and an install writes the session's packages; nothing was installed",
            ));
        }
        if policy.network {
            return Ok(());
        }
        Err(ToolError::new(
            "the client's sandbox policy gives this call no network, and installs need it; nothing was installed. In Codex, set sandbox_workspace_write.network_access = true, or install before, e.g. with a session in a policy that has the network",
        ))
    }

    /// The workspace as the file tools write it under the call's client
    /// policy (--sandbox inherit): read-only unless the policy lets the
    /// workspace be written, its read-only entries inside protected.
    pub(crate) fn client_files(&self, call: &Call) -> Result<crate::files::Workspace, ToolError> {
        let Some(policy) = call.client_policy(&self.manager).map_err(ToolError::new)? else {
            return Ok(self.files.clone());
        };
        let narrowed = self.manager.narrow(policy, self.manager.first_language())?;
        let config = &narrowed.config;
        if config.mode != crate::sandbox::SandboxMode::WorkspaceWrite {
            return Err(ToolError::new(format!(
                "the client's sandbox policy ({}) does not let this call write the workspace; nothing was written",
                narrowed.summary
            )));
        }
        Ok(self
            .files
            .clone()
            .protected(config.protected.clone().map(Arc::new)))
    }

    /// Starts a cell (python_exec, python_run_file, r_exec) in the language
    /// of the tool called and follows it; a client cancel interrupts it.
    pub(crate) async fn run_cell(
        &self,
        session: &Option<String>,
        (source, parent): (crate::session::CellSource<'_>, Option<u64>),
        wait_s: Option<args::Seconds>,
        call: Call,
    ) -> ToolResult {
        let lang = call.language();
        let wait = call.window(&self.manager, wait_s);
        let session = self.session_in(session, lang)?;
        self.manager
            .check_cell_tool(&session, call.by_kernel_exec())?;
        self.under_client_policy(&call, &session, lang).await?;
        let fut = self.manager.exec(&session, lang, source, parent, wait);
        self.drive(&session, (call, true), fut).await
    }

    /// Runs a cell call to completion while sending progress notifications
    /// (when the request has a progress token) and turning a cancellation
    /// from the client into an interrupt of the cell when
    /// `interrupt_on_cancel` (python_exec; a cancelled wait only stops
    /// waiting).
    pub(crate) async fn drive(
        &self,
        session: &str,
        (call, interrupt_on_cancel): (Call, bool),
        fut: impl Future<Output = Result<CellReport, SessionError>>,
    ) -> ToolResult {
        let mut ticker = call.ticker();
        tokio::pin!(fut);
        loop {
            tokio::select! {
                result = &mut fut => {
                    return Ok(render::cell_result(&result?));
                }
                _ = ticker.tick(), if call.wants_progress() => {
                    if let Some((elapsed, line)) = self.manager.progress(session) {
                        call.report(elapsed, "", &line).await;
                    }
                }
                _ = call.cancelled() => {
                    if !interrupt_on_cancel {
                        return Err(ToolError::new("the call was cancelled by the client; the cell keeps running"));
                    }
                    // The client gave up on this call: stop the cell (or the
                    // rebuild it was queued after), keep the session.
                    let manager = self.manager.clone();
                    let session = session.to_string();
                    tokio::spawn(async move {
                        if let Err(e) = manager.cancel(&session).await {
                            tracing::debug!("interrupt after cancellation: {e}");
                        }
                    });
                    return Err(ToolError::new("the call was cancelled by the client; the cell was interrupted"));
                }
            }
        }
    }
}

impl FerreplServer {
    /// Runs a call through the tool router and finishes its result: without
    /// structuredContent unless asked for, argument errors in plain words,
    /// ignored arguments named.
    pub(super) async fn route(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        unknown: Option<String>,
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
            if let Some(note) = unknown {
                args::add_note(result, note);
            }
        }
        Ok(response)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for FerreplServer {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let started = std::time::Instant::now();
        let _in_flight = self.manager.call_started();
        // The label is resolved before the request moves into the router:
        // a `&'static str`, so nothing is allocated per call.
        let tool = crate::metrics::tool_label(&request.name, super::groups::tool_names());
        if self.tool_router.get(&request.name).is_none() {
            let listed = self.tool_router.list_all();
            let names = listed.iter().map(|t| t.name.as_ref());
            let message = super::groups::unknown_tool(&request.name, names);
            let outcome = crate::metrics::ToolOutcome::ProtocolError;
            crate::metrics::tool_call(tool, outcome, started.elapsed());
            return Err(McpError::invalid_params(message, None));
        }
        let unknown = self
            .tool_router
            .get(&request.name)
            .and_then(|t| args::unknown_arguments_note(t, request.arguments.as_ref()));
        if super::tasks::wanted(&request.name, &context)
            && let Some(opened) = self.tasks.open(&request.name)
        {
            // Counted when its task ends.
            return self
                .call_as_task(opened, request, context, unknown, started)
                .await;
        }
        let response = match self.route(request, context, unknown).await {
            Ok(response) => response,
            Err(e) => {
                let outcome = crate::metrics::ToolOutcome::ProtocolError;
                crate::metrics::tool_call(tool, outcome, started.elapsed());
                return Err(e);
            }
        };
        let outcome = match &response {
            CallToolResponse::Complete(r) if r.is_error == Some(true) => {
                crate::metrics::ToolOutcome::Error
            }
            _ => crate::metrics::ToolOutcome::Ok,
        };
        crate::metrics::tool_call(tool, outcome, started.elapsed());
        Ok(response)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        Ok(GetTaskResult::new(self.tasks.get(&request.task_id)?))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks.update(&request.task_id)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks.cancel(&request.task_id)
    }

    // Resources and prompts are advertised with empty lists (some clients
    // ask for them); a name from elsewhere is an unknown one, answered as
    // the specification says (-32602 naming it; SEP-2164 for resources),
    // not as a method the server lacks.
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        Err(McpError::invalid_params(
            format!(
                "resource not found: {} (this server lists no resources)",
                request.uri
            ),
            Some(serde_json::json!({ "uri": request.uri })),
        ))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        Err(McpError::invalid_params(
            format!(
                "prompt not found: {} (this server lists no prompts)",
                request.name
            ),
            None,
        ))
    }

    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_prompts()
            .enable_tasks()
            .build();
        if self.manager.inherits_client_sandbox() {
            // Codex sends its sandbox policy with each call only to a
            // server that asks for it so.
            capabilities.experimental = Some(
                [(
                    crate::sandbox::client::META_KEY.to_string(),
                    Default::default(),
                )]
                .into(),
            );
        }
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("ferrepl", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.instructions())
    }
}
