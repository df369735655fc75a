//! Running `--preinstall` for one tenant's kept venv, in the background
//! from the tenant's start: skipped when the stamp says the same list is in
//! already; else the venv is made (in the sandbox, as for any session) and
//! the packages installed by an install job like python_install's (the same
//! proxy, index and wheels-only rules), then stamped. The log says when it
//! starts and how it ended (the installer's tail, redacted, when it
//! failed); a failure never stops the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::jobs::JobManager;
use crate::worker::LaunchSpec;
use crate::worker::preinstall::{self, MAX_PREINSTALL_TIME, Preinstall, PreinstallState};
use crate::worker::session_venv::SessionVenv;

/// Most bytes of the installer's output a failure's log line carries.
const LOG_TAIL_BYTES: usize = 2000;

/// Starts the preinstall of `venv` (which holds its [`Preinstall`]).
pub fn spawn(
    venv: Arc<SessionVenv>,
    jobs: Arc<JobManager>,
    spec: LaunchSpec,
    start_timeout: Duration,
) {
    let Some(state) = venv.preinstall.clone() else {
        return;
    };
    tokio::spawn(async move {
        let ended = run(&venv, &state, &jobs, &spec, start_timeout).await;
        if let Err(why) = ended {
            state.set(PreinstallState::Failed {
                job: match state.state() {
                    PreinstallState::Running { job, .. } => job,
                    _ => None,
                },
                why,
            });
        }
    });
}

async fn run(
    venv: &SessionVenv,
    state: &Preinstall,
    jobs: &JobManager,
    spec: &LaunchSpec,
    start_timeout: Duration,
) -> Result<(), String> {
    let specs = &state.specs;
    let dir = venv.dir.display();
    if venv.python().is_file() && preinstall::is_stamped(&venv.dir, &venv.base, specs) {
        tracing::info!(
            "preinstall: {} already in the sessions' venv {dir}; nothing to install",
            specs.join(" ")
        );
        state.set(PreinstallState::Done);
        return Ok(());
    }
    let started = Instant::now();
    tracing::info!(
        "preinstall: installing {} into the sessions' venv {dir}",
        specs.join(" ")
    );
    if let Some(gate) = crate::test_hooks::preinstall_gate() {
        while !gate.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    venv.ensure(spec, start_timeout).await.map_err(|e| {
        tracing::warn!("preinstall failed: the sessions' venv {dir} could not be made: {e}");
        format!("the sessions' venv could not be made: {e}")
    })?;
    let install =
        crate::jobs::install::install_spec(jobs.installer(), &venv.python(), specs, specs, false);
    let job = jobs.start(install).map_err(|e| {
        tracing::warn!("preinstall failed: its install job did not start: {e}");
        format!("its install job did not start: {e}")
    })?;
    // python_install into the default session follows it instead of
    // running a second installer in the same venv.
    jobs.set_install(crate::session::DEFAULT_SESSION, job.clone(), specs.clone());
    state.set(PreinstallState::Running {
        since: Instant::now(),
        job: Some(job.id().to_string()),
    });
    let report = jobs.wait(&job, MAX_PREINSTALL_TIME).await;
    if jobs.status_of(&job).is_none() {
        let _ = jobs.kill(job.id(), nix::sys::signal::Signal::SIGKILL).await;
        tracing::warn!(
            "preinstall failed: still installing after {} s; killed (install the rest with python_install)",
            MAX_PREINSTALL_TIME.as_secs()
        );
        return Err(format!(
            "it ran over {} s and was stopped",
            MAX_PREINSTALL_TIME.as_secs()
        ));
    }
    if report.is_error() || report.state.exit_code != Some(0) {
        let secrets = crate::output::redact::Secrets::of(
            jobs.installer()
                .credentials
                .iter()
                .flat_map(|c| c.secrets().iter().cloned())
                .chain(jobs.installer().unusable.iter().cloned()),
        );
        let tail = secrets.redact(tail(&report.output.combined, LOG_TAIL_BYTES));
        tracing::warn!(
            "preinstall failed ({}) after {:.1} s; sessions start without it. The installer said:\n{tail}",
            report.state.describe(),
            started.elapsed().as_secs_f64()
        );
        return Err(report.state.describe());
    }
    if let Err(e) = preinstall::write_stamp(&venv.dir, &venv.base, specs) {
        // Only costs a reinstall at the next start.
        tracing::warn!("preinstall: cannot record it beside {dir}: {e}");
    }
    tracing::info!(
        "preinstall done in {:.1} s: {} in the sessions' venv {dir}",
        started.elapsed().as_secs_f64(),
        specs.join(" ")
    );
    state.set(PreinstallState::Done);
    Ok(())
}

/// The last `max` bytes of `text` (at a character boundary).
fn tail(text: &str, max: usize) -> String {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].trim().to_string()
}
