//! python_install: packages into a session's virtual environment, as a job.

use std::sync::Arc;

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};

use super::shell::job_result;
use crate::jobs::{Job, JobSpec, JobStatus};
use crate::mcp::args::Parameters;
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

pub(super) use crate::jobs::install::shell_quote;

#[tool_router(router = packages_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(output_schema = schema_for_output::<JobOutput>())]
    async fn python_install(&self, args: Parameters<InstallParams>, call: Call) -> ToolResult {
        self.client_allows_install(&call)?;
        let p = args.0;
        let session = self.session_in(&p.session, crate::worker::Language::Python)?;
        let wait = call.window(&self.manager, p.wait_s);
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
        let (packages, copies) = self.installable(&p.packages)?;
        if let Err(e) = self.manager.ready_venv(&session).await {
            copies.iter().for_each(|c| drop(std::fs::remove_dir_all(c)));
            return Err(ToolError::new(format!(
                "session '{session}' has no venv to install into: {e}"
            )));
        }
        let upgrade = p.upgrade.unwrap_or(false);
        let mut spec = self.install_job(&session, &packages, &p.packages, upgrade);
        spec.sandbox = self.client_install_sandbox(&call)?;
        spec.extra_read.extend(copies.clone());
        let job = match self.jobs.start(spec) {
            Ok(job) => job,
            Err(e) => {
                copies.iter().for_each(|c| drop(std::fs::remove_dir_all(c)));
                return Err(e.into());
            }
        };
        self.remove_when_done(&job, copies);
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
            let imports = match self.manager.refresh_imports(&session).await {
                Ok(()) => format!("they import in session '{session}' now"),
                Err(e) => format!(
                    "the running session could not refresh its imports ({e}); reset the session (python_sessions) if an import fails"
                ),
            };
            let what = installed(&report.output.combined)
                .unwrap_or_else(|| "the packages (already satisfied or as the log shows)".into());
            let line = format!(
                "Installed {what} in {:.1} s; {imports}. Full log: python_output {{job: \"{}\"}}.",
                report.elapsed_ms / 1000.0,
                report.state.job
            );
            return Ok(short_result(&report, &line));
        }
        Ok(result)
    }
}

impl FerreplServer {
    /// The specs as the installer gets them: each checked, local wheels
    /// replaced by the server's private copies (the directories returned,
    /// shown to the install job read-only).
    fn installable(
        &self,
        packages: &[String],
    ) -> Result<(Vec<String>, Vec<std::path::PathBuf>), ToolError> {
        use super::install_spec::{Install, classify};
        let settings = self.jobs.installer();
        check_packages(packages)?;
        if settings.source_builds {
            return Ok((packages.to_vec(), Vec::new()));
        }
        let mut out = Vec::new();
        let mut copies = Vec::new();
        for spec in packages {
            match classify(spec, self.jobs.workdir()) {
                Install::Index | Install::RemoteWheel => out.push(spec.clone()),
                Install::LocalWheel(rel) => {
                    let (dir, file) = self.copy_wheel(&rel)?;
                    copies.push(dir);
                    out.push(file.display().to_string());
                }
                Install::Builds(what) => {
                    copies.iter().for_each(|c| drop(std::fs::remove_dir_all(c)));
                    return Err(ToolError::new(format!(
                        "'{spec}' is {what}: installs take wheels only (a build backend would run with the installer's network access). \
Name a package (its wheel comes from the index), a .whl file in the workspace or a wheel URL, or ask the operator to start ferrepl with --allow-source-builds."
                    )));
                }
            }
        }
        Ok((out, copies))
    }

    /// A local wheel read through the workspace's own descriptor (a
    /// regular file, never a link out of it) and copied into a directory
    /// of the server's: what the installer reads cannot be swapped.
    fn copy_wheel(&self, rel: &str) -> Result<(std::path::PathBuf, std::path::PathBuf), ToolError> {
        use std::os::unix::fs::PermissionsExt;
        let data = self
            .files
            .read(rel, MAX_WHEEL_BYTES)
            .map_err(|e| ToolError::new(format!("the wheel '{rel}' cannot be read: {e}")))?;
        let name = std::path::Path::new(&data.shown)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "package.whl".into());
        let dir = self.jobs.private_dir("wheels");
        let copied = (|| -> std::io::Result<std::path::PathBuf> {
            crate::state::fresh_private_dir(&dir)?;
            // Readable by the install job's uid (a root server's sessions
            // run as another).
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
            let file = dir.join(&name);
            std::fs::write(&file, &data.data)?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))?;
            Ok(file)
        })();
        match copied {
            Ok(file) => Ok((dir, file)),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(ToolError::new(format!(
                    "cannot copy the wheel '{rel}' for the installer: {e}"
                )))
            }
        }
    }

    /// The wheels' copies go once the install has ended.
    fn remove_when_done(&self, job: &Arc<crate::jobs::Job>, copies: Vec<std::path::PathBuf>) {
        if copies.is_empty() {
            return;
        }
        let (jobs, job) = (self.jobs.clone(), job.clone());
        tokio::spawn(async move {
            while jobs.status_of(&job).is_none() {
                jobs.changed(&job).await;
            }
            for dir in copies {
                let _ = std::fs::remove_dir_all(dir);
            }
        });
    }

    /// The install as a job into the interpreter `session` runs.
    /// `shown`: the packages as the agent named them (a local wheel's copy
    /// is what the installer gets).
    fn install_job(
        &self,
        session: &str,
        packages: &[String],
        shown: &[String],
        upgrade: bool,
    ) -> JobSpec {
        crate::jobs::install::install_spec(
            self.jobs.installer(),
            &self.manager.session_python(session),
            packages,
            shown,
            upgrade,
        )
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

/// A successful install's result: one line for what was installed, the
/// installer's log left out (python_output {job} reads it).
fn short_result(report: &crate::jobs::JobReport, line: &str) -> CallToolResult {
    let mut report = report.clone();
    report.notes.push(line.to_string());
    report.output.combined.clear();
    report.output.stdout.clear();
    report.output.stderr.clear();
    job_result(&report, INSTALL_HINT)
}

/// What an installer's output says it installed ("name version, ..."): pip's
/// "Successfully installed a-1.0 b-2.0", uv's " + a==1.0" lines.
fn installed(log: &str) -> Option<String> {
    let mut found = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("Successfully installed ") {
            for item in rest.split_whitespace() {
                match item.rsplit_once('-') {
                    Some((name, version)) => found.push(format!("{name} {version}")),
                    None => found.push(item.to_string()),
                }
            }
        } else if let Some(rest) = line.trim_start().strip_prefix("+ ")
            && let Some((name, version)) = rest.trim().split_once("==")
        {
            found.push(format!("{name} {version}"));
        }
    }
    (!found.is_empty()).then(|| found.join(", "))
}

/// Largest local wheel copied for the installer.
const MAX_WHEEL_BYTES: u64 = 512 << 20;

/// Refuses what is not a package to install: nothing, installer options.
fn check_packages(packages: &[String]) -> Result<(), ToolError> {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::installed;

    #[test]
    fn what_an_installer_says_it_installed() {
        let pip = "Processing ./a.whl\nInstalling collected packages: six, my-pkg\nSuccessfully installed my-pkg-1.0 six-1.16.0\n";
        assert_eq!(installed(pip).as_deref(), Some("my-pkg 1.0, six 1.16.0"));
        let uv = "Resolved 2 packages in 3ms\nInstalled 2 packages in 4ms\n + numpy==2.1.0\n + six==1.16.0\n";
        assert_eq!(installed(uv).as_deref(), Some("numpy 2.1.0, six 1.16.0"));
        assert_eq!(installed("Requirement already satisfied: six\n"), None);
    }
}
