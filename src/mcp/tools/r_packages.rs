//! r_install: R packages from CRAN (or local source tarballs) into the
//! workspace's R library, as a job like python_install.

use rmcp::handler::server::common::schema_for_output;
use rmcp::{tool, tool_router};

use super::packages::{prepend, shell_quote};
use super::shell::job_result;
use crate::jobs::JobSpec;
use crate::mcp::args::Parameters;
use crate::mcp::call::Call;
use crate::mcp::error::{ToolError, ToolResult};
use crate::mcp::server::FerreplServer;
use crate::mcp::surface::JobOutput;
use crate::mcp::surface::RInstallParams;
use crate::worker::{Language, r};

const R_INSTALL_HINT: &str = "call r_install again for this session to keep waiting for it.";

#[tool_router(router = r_packages_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(output_schema = schema_for_output::<JobOutput>())]
    async fn r_install(&self, Parameters(p): Parameters<RInstallParams>, call: Call) -> ToolResult {
        self.client_allows_install(&call)?;
        let session = self.session_in(&p.session, Language::R)?;
        let wait = call.window(&self.manager, p.wait_s);
        // Installs are keyed by session; R's and Python's never share a name.
        if let Some((job, _)) = self.jobs.running_install(&session) {
            let report = self.drive_job(job, wait, call, false).await?;
            return Ok(job_result(&report, R_INSTALL_HINT));
        }
        let (names, files) = split_packages(&p.packages, self.jobs.installer().source_builds)?;
        let mut spec = self.r_install_job(&names, &files);
        spec.sandbox = self.client_install_sandbox(&call)?;
        let job = self.jobs.start(spec)?;
        self.jobs
            .set_install(&session, job.clone(), p.packages.clone());
        let report = self.drive_job(job, wait, call, true).await?;
        let mut result = job_result(&report, R_INSTALL_HINT);
        if report.state.exit_code == Some(0) {
            prepend(
                &mut result,
                &format!(
                    "[ferrepl] Installed into {}; library() finds them in every R session now.",
                    r::LIBRARY
                ),
            );
        }
        Ok(result)
    }
}

impl FerreplServer {
    /// install.packages into the workspace library, then a check that each
    /// package is there (install.packages only warns when one fails).
    fn r_install_job(&self, names: &[String], files: &[String]) -> JobSpec {
        let settings = self.jobs.installer();
        let library = self.jobs.workdir().join(r::LIBRARY);
        let vector = |items: &[String]| {
            let quoted: Vec<String> = items.iter().map(|s| r::quote(s)).collect();
            format!("c({})", quoted.join(","))
        };
        let mut installed: Vec<String> = names.to_vec();
        installed.extend(files.iter().map(|f| package_of_tarball(f)));
        let expr = format!(
            "options(warn = 1); lib <- {lib}; dir.create(lib, recursive = TRUE, showWarnings = FALSE); \
pk <- {names}; fs <- {files}; \
if (length(pk)) install.packages(pk, lib = lib, repos = {repo}); \
if (length(fs)) install.packages(fs, lib = lib, repos = NULL, type = 'source'); \
want <- {want}; miss <- want[!nzchar(vapply(want, function(p) system.file(package = p, lib.loc = lib), ''))]; \
if (length(miss)) {{ message('not installed: ', paste(miss, collapse = ', ')); quit(status = 1) }}",
            lib = r::quote(&library.display().to_string()),
            names = vector(names),
            files = vector(files),
            repo = r::quote(&settings.cran),
            want = vector(&installed),
        );
        let r_bin = self
            .manager
            .interpreter_of(Language::R)
            .display()
            .to_string();
        let shown = format!("install.packages({})", installed.join(", "));
        JobSpec {
            shown: Some(shown),
            command: format!(
                "{} --vanilla --quiet --no-echo -e {}",
                shell_quote(&r_bin),
                shell_quote(&expr)
            ),
            env: settings.env().into_iter().collect(),
            egress: true,
            reader: Some("shell_output (with --tools shell)"),
            ..JobSpec::default()
        }
    }
}

/// CRAN names (letters, digits and dots, starting with a letter) and
/// workspace source tarballs; anything else is refused before a job starts.
/// CRAN names, and (when the operator allows source builds) local source
/// tarballs: a tarball's configure script and Makevars run code of the
/// agent's with the installer's network access, as a Python build backend
/// would. (CRAN on Linux is source-only too, but from the allowed
/// repositories.)
fn split_packages(
    packages: &[String],
    source_builds: bool,
) -> Result<(Vec<String>, Vec<String>), ToolError> {
    if packages.is_empty() {
        return Err(ToolError::new(
            "packages is empty: name at least one R package",
        ));
    }
    let (mut names, mut files) = (Vec::new(), Vec::new());
    for p in packages.iter().map(|p| p.trim()) {
        let is_name = p.len() <= 100
            && p.starts_with(|c: char| c.is_ascii_alphabetic())
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '.');
        let is_file = p.ends_with(".tar.gz")
            && !p.starts_with('-')
            && !p.contains(['\0', '\n'])
            && !p.contains("://");
        match (is_name, is_file) {
            (true, _) => names.push(p.to_string()),
            (_, true) if source_builds => files.push(p.to_string()),
            (_, true) => {
                return Err(ToolError::new(format!(
                    "'{p}' is a local source package: its build scripts would run with the installer's network access. Install CRAN packages by name, or ask the operator to start ferrepl with --allow-source-builds."
                )));
            }
            _ => {
                return Err(ToolError::new(format!(
                    "'{p}' is not an R package: pass CRAN names (e.g. data.table) or paths of .tar.gz source packages in the workspace"
                )));
            }
        }
    }
    Ok((names, files))
}

/// `pkg_1.0.tar.gz` → `pkg`.
fn package_of_tarball(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.split('_').next().unwrap_or(base).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_and_tarballs_pass() {
        let ok = ["data.table", "ggplot2", "dist/mypkg_0.1.tar.gz"].map(String::from);
        let (names, files) = split_packages(&ok, true).expect("valid");
        assert_eq!(names, ["data.table", "ggplot2"]);
        assert_eq!(files, ["dist/mypkg_0.1.tar.gz"]);
        assert_eq!(package_of_tarball(&files[0]), "mypkg");
        for bad in [
            "--configure-args=x",
            "pkg; system('id')",
            "a'b",
            "https://x/y.tar.gz",
            "2pkg",
            "",
        ] {
            assert!(split_packages(&[bad.to_string()], true).is_err(), "{bad}");
        }
        // Without source builds a local tarball is refused, by name.
        let local = ["dist/mypkg_0.1.tar.gz".to_string()];
        let e = split_packages(&local, false).expect_err("a local build");
        assert!(format!("{e:?}").contains("--allow-source-builds"), "{e:?}");
        split_packages(&ok[..2], false).expect("CRAN names need no flag");
    }
}
