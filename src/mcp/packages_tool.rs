//! python_install: packages into a session's virtual environment, as a job.

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::{CallToolResult, RequestMetaObject};
use rmcp::{ErrorData as McpError, Peer, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::args::{Parameters, Seconds, secs};
use super::render;
use super::server::{FerreplServer, session_name};
use super::shell_tools::JobOutput;
use crate::jobs::{JobSpec, JobStatus};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct InstallParams {
    /// Package names or requirement specifiers ("pandas", "numpy>=2"), or paths of local
    /// wheel / sdist files or project directories.
    pub packages: Vec<String>,
    /// The session whose interpreter gets the packages. Default "default".
    #[serde(default)]
    pub session: Option<String>,
    /// Upgrade packages that are already installed. Default false.
    #[serde(default)]
    pub upgrade: Option<bool>,
    /// Seconds to wait before returning status "running" (the install goes on; collect it
    /// with shell_wait on the returned job). Default 30.
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Run first in the install job, inside the sandbox like the install itself
/// (the interpreter may be any file the agent wrote): refuses interpreters
/// that are not a virtual environment, saying what to do instead.
const VENV_CHECK: &str = "import sys,os,sysconfig as c;sys.prefix==sys.base_prefix and sys.exit(\"ferrepl: \"+sys.executable+(\" is externally managed (PEP 668)\" if os.path.exists(os.path.join(c.get_path(\"stdlib\"),\"EXTERNALLY-MANAGED\")) else \" is not a virtual environment\")+\"; ferrepl installs only into venvs: restart ferrepl with --venv DIR, or run python3 -m venv .venv in the workspace and python_sessions {action: create, name: ..., venv: .venv}\")";

#[tool_router(router = packages_router, vis = "pub(super)")]
impl FerreplServer {
    #[tool(
        description = "Install Python packages into a session's virtual environment (uv when available, else pip), as a job \
with a wait window: returns when done (the packages then import in the running session, no restart needed) or with status \
'running' (collect with shell_wait). Names, specifiers or local wheel/sdist paths. Refuses interpreters that are not a venv: \
start ferrepl with --venv DIR, or create a session with python_sessions create venv=... \
Example: {\"packages\": [\"requests\", \"./dist/mypkg-0.1-py3-none-any.whl\"]}.",
        output_schema = schema_for_output::<JobOutput>(),
        annotations(title = "Install packages", read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = true)
    )]
    async fn python_install(
        &self,
        Parameters(p): Parameters<InstallParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let session = session_name(&p.session).to_string();
        if p.packages.is_empty() {
            return Ok(render::tool_error(
                "packages is empty: name at least one package or wheel path",
            ));
        }
        if let Some(bad) = p
            .packages
            .iter()
            .find(|s| s.trim().is_empty() || s.starts_with('-'))
        {
            return Ok(render::tool_error(format!(
                "'{bad}' is not a package: pass names, specifiers or paths only (no installer options)"
            )));
        }
        let python = self.manager.session_python(&session);
        let upgrade = if p.upgrade.unwrap_or(false) {
            " --upgrade"
        } else {
            ""
        };
        let packages: Vec<String> = p.packages.iter().map(|s| shell_quote(s)).collect();
        let uv = crate::worker::python::uv();
        let check = format!(
            "{} -I -c {} && ",
            shell_quote(&python.display().to_string()),
            shell_quote(VENV_CHECK)
        );
        let settings = self.jobs.installer();
        let quoted = |flags: Vec<String>| {
            flags
                .iter()
                .map(|f| shell_quote(f))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let (command, shown) = match &uv {
            Some(uv) => {
                let head = format!(
                    "{} pip install --python {}{upgrade}",
                    shell_quote(&uv.display().to_string()),
                    shell_quote(&python.display().to_string()),
                );
                (
                    format!(
                        "{head} {} {}",
                        quoted(settings.uv_flags()),
                        packages.join(" ")
                    ),
                    format!("{head} {}", packages.join(" ")),
                )
            }
            None => {
                let head = format!(
                    "{} -m pip install{upgrade}",
                    shell_quote(&python.display().to_string()),
                );
                (
                    format!(
                        "{head} {} {}",
                        quoted(settings.pip_flags()),
                        packages.join(" ")
                    ),
                    format!("{head} {}", packages.join(" ")),
                )
            }
        };
        let spec = JobSpec {
            shown: Some(shown),
            command: format!("{check}{command}"),
            env: settings.env().into_iter().collect(),
            egress: true,
            ..JobSpec::default()
        };
        let job = match self.jobs.start(spec) {
            Ok(j) => j,
            Err(e) => return Ok(render::tool_error(e)),
        };
        // Whenever the install ends, the running session sees the new packages.
        {
            let (jobs, manager, job, session) = (
                self.jobs.clone(),
                self.manager.clone(),
                job.clone(),
                session.clone(),
            );
            tokio::spawn(async move {
                while jobs.status_of(&job).is_none() {
                    jobs.changed(&job).await;
                }
                if jobs.status_of(&job) == Some(0)
                    && let Err(e) = manager.refresh_imports(&session).await
                {
                    tracing::warn!("refreshing imports after install: {e}");
                }
            });
        }
        let wait = self.manager.wait_window(secs(p.wait_s));
        let mut result = self
            .drive_job(job.clone(), wait, meta, peer, ct, true)
            .await;
        let done_ok = result.structured_content.as_ref().is_some_and(|v| {
            v.get("status") == Some(&serde_json::json!(JobStatus::Exited))
                && v.get("exit_code") == Some(&serde_json::json!(0))
        });
        if done_ok {
            let note = match self.manager.refresh_imports(&session).await {
                Ok(()) => format!(
                    "Installed; the packages import in session '{session}' now (no restart needed)."
                ),
                Err(e) => format!(
                    "Installed, but the running session could not refresh its imports ({e}); python_reset if an import fails."
                ),
            };
            if let Some(rmcp::model::ContentBlock::Text(t)) = result.content.first_mut() {
                t.text = format!("[ferrepl] {note}\n{}", t.text);
            }
        }
        Ok(result)
    }
}
