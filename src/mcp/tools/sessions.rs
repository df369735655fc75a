//! python_sessions: list, create, reset, delete sessions, and the
//! server's status.

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use serde_json::Value;

use crate::mcp::args::Parameters;
use crate::mcp::call::Call;
use crate::mcp::error::{ToolError, ToolResult};
use crate::mcp::render;
use crate::mcp::server::FerreplServer;
use crate::mcp::surface::{SessionAction, SessionsParams};
use crate::mcp::surface::{SessionsOutput, StatusOutput};
use crate::session::{SessionInfo, SessionOptions};

#[tool_router(router = sessions_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(output_schema = schema_for_output::<SessionsOutput>())]
    async fn python_sessions(
        &self,
        Parameters(p): Parameters<SessionsParams>,
        call: Call,
    ) -> ToolResult {
        let action = p.action.unwrap_or(SessionAction::List);
        let named = p.session.as_deref().filter(|s| !s.is_empty());
        // Actions that start an interpreter take the client's policy
        // (--sandbox inherit).
        let starts = match action {
            SessionAction::Create | SessionAction::Reset | SessionAction::Resume => true,
            SessionAction::Rebuild => p.confirm.unwrap_or(false),
            _ => false,
        };
        // A session on a kernel speaks the kernel's language unless told
        // otherwise (then create refuses the mismatch).
        let kernel_lang = p
            .kernel
            .as_deref()
            .and_then(|k| self.manager.kernel_language(k));
        let lang = p
            .language
            .or(kernel_lang)
            .unwrap_or(self.manager.first_language());
        let policy = match starts {
            true => call.client_policy(&self.manager).map_err(ToolError::new)?,
            false => None,
        };
        let narrowed = match policy {
            Some(policy) => Some(self.manager.narrow(policy, lang)?),
            None => None,
        };
        let message = match action {
            SessionAction::List => None,
            SessionAction::Status => return Ok(self.server_status()),
            SessionAction::Create => {
                let Some(name) = named else {
                    return Err(ToolError::new(
                        "create needs the new session's name in 'session'",
                    ));
                };
                let opts = SessionOptions {
                    python: p.python,
                    venv: p.venv,
                    workdir: p.workdir,
                    env: p.env.unwrap_or_default(),
                    language: lang,
                    kernel: p.kernel,
                };
                self.manager.create(name, opts, narrowed).await?;
                Some(format!(
                    "Session '{name}' created and its interpreter is ready."
                ))
            }
            SessionAction::Reset => {
                let name = self.session_name(&p.session);
                self.manager.set_client_sandbox(&name, narrowed);
                Some(self.manager.reset(&name).await?)
            }
            SessionAction::Delete => {
                let Some(name) = named else {
                    return Err(ToolError::new(
                        "delete needs the session's name in 'session'",
                    ));
                };
                Some(self.manager.delete(name)?)
            }
            SessionAction::Resume => {
                let name = self.session_name(&p.session);
                self.manager.set_client_sandbox(&name, narrowed);
                Some(self.manager.resume(&name).await?)
            }
            SessionAction::Rebuild => {
                let name = self.session_name(&p.session);
                self.manager.set_client_sandbox(&name, narrowed);
                Some(
                    self.manager
                        .rebuild(&name, p.confirm.unwrap_or(false))
                        .await?,
                )
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
        if let Some(url) = &self.viewer_url {
            // For the agent to pass on: the person's live view of these
            // sessions (its login is the person's, never in a result).
            text.push_str(&format!(
                "viewer: {url} (a person watches these sessions live there)\n"
            ));
        }
        text.push_str("limits:");
        for (k, v) in &out.limits {
            text.push_str(&format!(" {k}={v}"));
        }
        text.push('\n');
        let kernels = self.manager.kernel_names();
        if !kernels.is_empty() {
            text.push_str(&format!(
                "kernels: {} (a session on a kernel has no checkpoints, branches, saved state, namespace tools or ferrepl.call)\n",
                kernels.join(", ")
            ));
        }
        let (ready, target) = status.warm_pool;
        if target > 0 {
            text.push_str(&format!("warm pool: {ready} ready\n"));
        }
        text.push_str(&sessions_table(&sessions));
        let running = out
            .jobs
            .iter()
            .filter(|j| j.state.status == crate::jobs::JobStatus::Running)
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

pub(crate) fn sessions_table(sessions: &[SessionInfo]) -> String {
    let mut text = String::new();
    if sessions.is_empty() {
        text.push_str("no sessions yet; the first cell run creates one\n");
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
        // Python is the default language; others are marked.
        let lang = match (crate::worker::Language::parse(&s.language), &s.kernel) {
            (_, Some(kernel)) => format!(" [kernel {kernel}]"),
            (Some(crate::worker::Language::Python), None) => String::new(),
            (Some(other), None) => format!(" [{other}]"),
            (None, None) => format!(" [{}]", s.language),
        };
        text.push_str(&format!(
            "{}{lang}: {}{running}, pid {}, {} cells, {mem}, up {:.0} s\n",
            s.name,
            s.state,
            s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            s.cells,
            s.uptime_s
        ));
    }
    text
}
