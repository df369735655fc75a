//! python_install: packages into a session's virtual environment, as a job.

use std::sync::Arc;

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};

use super::shell::job_result;
use crate::jobs::{Job, JobSpec, JobStatus};
use crate::mcp::args::{Parameters, secs};
use crate::mcp::call::Call;
use crate::mcp::error::{ToolError, ToolResult};
use crate::mcp::server::FerreplServer;
use crate::mcp::surface::InstallParams;
use crate::mcp::surface::JobOutput;

/// Puts a line before a result's text.
pub(super) fn prepend(result: &mut CallToolResult, line: &str) {
    if let Some(rmcp::model::ContentBlock::Text(t)) = result.content.first_mut() {
        t.text = format!("{line}\n{}", t.text);
    }
}

/// How to go on with an install still running.
const INSTALL_HINT: &str = "call python_install again for this session to keep waiting for it.";

pub(super) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Run first in the install job, inside the sandbox like the install itself
/// (the interpreter may be any file the agent wrote): refuses interpreters
/// that are not a virtual environment, saying what to do instead.
const VENV_CHECK: &str = "import sys,os,sysconfig as c;sys.prefix==sys.base_prefix and sys.exit(\"ferrepl: \"+sys.executable+(\" is externally managed (PEP 668)\" if os.path.exists(os.path.join(c.get_path(\"stdlib\"),\"EXTERNALLY-MANAGED\")) else \" is not a virtual environment\")+\"; ferrepl installs only into venvs: restart ferrepl with --venv DIR, or run python3 -m venv .venv in the workspace and python_sessions {action: create, session: ..., venv: .venv}\")";

/// Whether pip would build `spec` from source even with `--only-binary
/// :all:`, which it ignores for direct references: a URL, `name @ URL`, a
/// local path or directory that is not a wheel (pip takes a bare name for a
/// directory when one of that name exists in its working directory, the
/// workspace).
fn would_build(spec: &str, workdir: &std::path::Path) -> bool {
    let s = spec.trim();
    let target = match s
        .split_once(" @ ")
        .or_else(|| s.split_once('@').filter(|(_, r)| r.contains("://")))
    {
        Some((_, url)) => url.trim(),
        None => s,
    };
    let local = target.starts_with(['.', '/', '~'])
        || target.contains('/')
        || workdir.join(target).exists();
    let direct = target.contains("://") || local;
    let path = target.split(['#', '?']).next().unwrap_or(target);
    direct && !path.to_ascii_lowercase().ends_with(".whl")
}

#[tool_router(router = packages_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(output_schema = schema_for_output::<JobOutput>())]
    async fn python_install(&self, args: Parameters<InstallParams>, call: Call) -> ToolResult {
        let p = args.0;
        let session = self.session_in(&p.session, crate::worker::Language::Python)?;
        let wait = self.manager.wait_window(secs(p.wait_s));
        if let Some((job, running)) = self.jobs.running_install(&session) {
            // The agent repeats the call after a 'running' result: follow
            // the install under way; two installers in one venv at once
            // would corrupt it.
            let report = self.drive_job(job, wait, call, false).await?;
            let mut result = job_result(&report, INSTALL_HINT);
            if running != p.packages {
                prepend(
                    &mut result,
                    &format!(
                        "[ferrepl] An install into session '{session}' was already under way ({}); this call followed it. \
Install {} once it has finished.",
                        running.join(" "),
                        p.packages.join(" ")
                    ),
                );
            }
            return Ok(result);
        }
        check_packages(&p.packages, self.jobs.installer(), self.jobs.workdir())?;
        let spec = self.install_job(&session, &p.packages, p.upgrade.unwrap_or(false));
        let job = self.jobs.start(spec)?;
        self.jobs
            .set_install(&session, job.clone(), p.packages.clone());
        self.refresh_imports_when_done(&job, &session);
        let report = self.drive_job(job, wait, call, true).await?;
        let mut result = job_result(&report, INSTALL_HINT);
        if report.is_error() && self.jobs.installer().mode == crate::sandbox::Network::Off {
            prepend(
                &mut result,
                "[ferrepl] The installer has no network (--network off): only local wheels install.",
            );
        }
        if report.state.status == JobStatus::Exited && report.state.exit_code == Some(0) {
            let note = match self.manager.refresh_imports(&session).await {
                Ok(()) => format!(
                    "Installed; the packages import in session '{session}' now (no restart needed)."
                ),
                Err(e) => format!(
                    "Installed, but the running session could not refresh its imports ({e}); reset the session (python_sessions) if an import fails."
                ),
            };
            prepend(&mut result, &format!("[ferrepl] {note}"));
        }
        Ok(result)
    }
}

impl FerreplServer {
    /// The install as a job: the venv check, then uv (when on PATH) or pip
    /// with the installer's flags and environment.
    fn install_job(&self, session: &str, packages: &[String], upgrade: bool) -> JobSpec {
        let settings = self.jobs.installer();
        let python = shell_quote(&self.manager.session_python(session).display().to_string());
        let upgrade = if upgrade { " --upgrade" } else { "" };
        let packages = packages
            .iter()
            .map(|s| shell_quote(s))
            .collect::<Vec<_>>()
            .join(" ");
        let quoted = |flags: Vec<String>| {
            flags
                .iter()
                .map(|f| shell_quote(f))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let (head, flags) = match crate::worker::python::uv() {
            Some(uv) => (
                format!(
                    "{} pip install --python {python}{upgrade}",
                    shell_quote(&uv.display().to_string())
                ),
                quoted(settings.uv_flags()),
            ),
            None => (
                format!("{python} -m pip install{upgrade}"),
                quoted(settings.pip_flags()),
            ),
        };
        let check = format!("{python} -I -c {} && ", shell_quote(VENV_CHECK));
        JobSpec {
            shown: Some(format!("{head} {packages}")),
            command: format!("{check}{head} {flags} {packages}"),
            env: settings.env().into_iter().collect(),
            egress: true,
            reader: Some("shell_output (with --tools shell)"),
            ..JobSpec::default()
        }
    }

    /// Whenever the install ends well, the running session sees the new
    /// packages (also when no call is waiting for it any more).
    fn refresh_imports_when_done(&self, job: &Arc<Job>, session: &str) {
        let (jobs, manager, job, session) = (
            self.jobs.clone(),
            self.manager.clone(),
            job.clone(),
            session.to_string(),
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
}

/// Refuses what is not a package to install: nothing, installer options,
/// and (unless the operator allowed source builds) anything pip would build.
fn check_packages(
    packages: &[String],
    settings: &crate::installer::InstallerSettings,
    workdir: &std::path::Path,
) -> Result<(), ToolError> {
    if packages.is_empty() {
        return Err(ToolError::new(
            "packages is empty: name at least one package or wheel path",
        ));
    }
    if let Some(bad) = packages
        .iter()
        .find(|s| s.trim().is_empty() || s.starts_with('-'))
    {
        return Err(ToolError::new(format!(
            "'{bad}' is not a package: pass names, specifiers or paths only (no installer options)"
        )));
    }
    if !settings.source_builds
        && let Some(bad) = packages.iter().find(|s| would_build(s, workdir))
    {
        return Err(ToolError::new(format!(
            "'{bad}' is a source distribution, project directory or repository: installs take wheels only \
(a build script would run with the installer's network access). Name a package (its wheel comes from the index), \
a .whl file or URL, or ask the operator to start ferrepl with --allow-source-builds."
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::would_build;

    #[test]
    fn direct_references_that_are_not_wheels_would_build() {
        let ws = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(ws.path().join("six")).expect("mkdir");
        let dir = ws.path();
        for spec in [
            "https://example.com/x-1.0.tar.gz",
            "docopt @ https://files.example/docopt-0.6.2.tar.gz",
            "git+https://github.com/a/b",
            "./proj",
            "/abs/proj",
            "dist/x-1.0.tar.gz",
            "six",
        ] {
            assert!(would_build(spec, dir), "{spec}");
        }
        for spec in [
            "numpy",
            "numpy>=2",
            "pandas[excel]==2.2",
            "./dist/x-1.0-py3-none-any.whl",
            "https://files.example/x-1.0-py3-none-any.whl#sha256=ab",
            "x @ https://files.example/x-1.0-py3-none-any.WHL",
        ] {
            assert!(!would_build(spec, dir), "{spec}");
        }
    }
}
