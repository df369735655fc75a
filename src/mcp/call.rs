//! What a tool call takes from its request besides the arguments: the
//! language of the tool it called (a body shared by `python_x` and its R
//! twin `r_x` serves the one it was called by), the client's progress token
//! and its cancellation, and whether it runs in an MCP task (tasks.rs).
//! Tools name it as one argument (`call: Call`); rmcp fills it in.

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::mcp::args::{Seconds, secs};
use crate::mcp::tasks::{TASK_WAIT, TaskLink};
use crate::sandbox::client::{self, ClientPolicy};
use crate::session::SessionManager;
use crate::worker::Language;

/// How often a call that runs long reports progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) struct Call {
    language: Language,
    /// Called as kernel_exec: code for a kernel of another language.
    by_kernel_exec: bool,
    progress: Option<ProgressToken>,
    peer: Peer<RoleServer>,
    ct: CancellationToken,
    /// In a task: the work is followed to its end and progress becomes the
    /// task's status message.
    task: Option<TaskLink>,
    /// The client's sandbox policy from `_meta` (--sandbox inherit), if the
    /// call carried one; an error when it cannot be read.
    client_policy: Option<Result<ClientPolicy, String>>,
}

impl<S> FromContextPart<ToolCallContext<'_, S>> for Call {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, McpError> {
        let request = &context.request_context;
        Ok(Self {
            language: crate::mcp::groups::language_of(&context.name),
            by_kernel_exec: context.name == "kernel_exec",
            progress: request.meta.get_progress_token(),
            peer: request.peer.clone(),
            ct: request.ct.clone(),
            task: request.extensions.get::<TaskLink>().cloned(),
            client_policy: ClientPolicy::from_meta(&request.meta),
        })
    }
}

impl Call {
    pub(crate) fn language(&self) -> Language {
        self.language
    }

    pub(crate) fn by_kernel_exec(&self) -> bool {
        self.by_kernel_exec
    }

    /// A ticker for progress reports: it never fires when the client asked
    /// for none (a select arm guarded by [`Call::wants_progress`]).
    pub(crate) fn ticker(&self) -> tokio::time::Interval {
        let start = tokio::time::Instant::now() + PROGRESS_EVERY;
        let mut ticker = tokio::time::interval_at(start, PROGRESS_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker
    }

    /// The client's sandbox policy for a call that starts or runs code:
    /// None when the server does not take it (an explicit --sandbox);
    /// refused when it takes it and the call has none or a malformed one.
    pub(crate) fn client_policy(
        &self,
        manager: &SessionManager,
    ) -> Result<Option<&ClientPolicy>, String> {
        if !manager.inherits_client_sandbox() {
            return Ok(None);
        }
        match &self.client_policy {
            None => Err(client::missing()),
            Some(Err(e)) => Err(e.clone()),
            Some(Ok(policy)) => Ok(Some(policy)),
        }
    }

    pub(crate) fn wants_progress(&self) -> bool {
        self.progress.is_some() || self.task.is_some()
    }

    /// How long the call waits for its cell or job: `wait_s` within
    /// `--max-wait`, or in a task until the work ends.
    pub(crate) fn window(
        &self,
        manager: &SessionManager,
        wait_s: Option<Seconds>,
    ) -> std::time::Duration {
        match self.task {
            Some(_) => TASK_WAIT,
            None => manager.wait_window(secs(wait_s)),
        }
    }

    /// Reports that `what` (a cell when empty) has run `elapsed` seconds,
    /// with its last line of output; a client that cannot take it only
    /// misses a report.
    pub(crate) async fn report(&self, elapsed: f64, what: &str, line: &str) {
        if self.progress.is_none() && self.task.is_none() {
            return;
        }
        let mut message = if what.is_empty() {
            format!("running for {elapsed:.0} s")
        } else {
            format!("{what} running for {elapsed:.0} s")
        };
        if !line.is_empty() {
            message.push_str(": ");
            message.push_str(line);
        }
        if let Some(task) = &self.task {
            // A task's progress is read with tasks/get.
            task.set_status(message);
            return;
        }
        let Some(token) = &self.progress else {
            return;
        };
        let param = ProgressNotificationParam::new(token.clone(), elapsed).with_message(message);
        if let Err(e) = self.peer.notify_progress(param).await {
            tracing::debug!("progress notification not sent: {e}");
        }
    }

    /// Resolves when the client cancels the call.
    pub(crate) async fn cancelled(&self) {
        self.ct.cancelled().await
    }
}
