//! Shell jobs: `/bin/sh -c COMMAND` in the background, on pipes or a pty,
//! each in its own process group, with bounded output that is kept in full
//! for shell_output, and the same wait semantics as Python cells.

pub mod install;
mod job;
mod report;
mod watch;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant as TokioInstant;

use crate::output::{Capture, LogSink};
use crate::process::{self, Launch, Spawned, Stdio};

pub use job::Job;
pub use report::{JobInfo, JobReport, JobState, JobStatus};

/// Limits and defaults of shell jobs.
#[derive(Debug, Clone)]
pub struct JobConfig {
    pub workdir: PathBuf,
    pub output_head_bytes: usize,
    pub output_tail_bytes: usize,
    pub log_dir: PathBuf,
    pub log_bytes: u64,
    /// Jobs running at once over the instance (--max-jobs; enforced by the
    /// gate), for the status.
    pub max_running: usize,
    /// Finished jobs are dropped after this long, and beyond `max_kept`.
    pub keep_finished: Duration,
    pub max_kept: usize,
    /// How long a finished job's pipes may stay open (held by its background
    /// children) before its result is returned anyway.
    pub drain_grace: Duration,
    /// The same confinement as sessions (the launcher wraps /bin/sh).
    pub sandbox: Option<Arc<crate::sandbox::SandboxConfig>>,
    /// How package installers run (python_install).
    pub installer: Arc<crate::installer::InstallerSettings>,
    /// Draining and the workspace quota (none: always admitted).
    pub gate: Option<Arc<crate::session::gate::TenantGate>>,
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(
        "no job '{0}'; shell_wait {{}} lists the jobs (finished jobs are dropped after a while)"
    )]
    NotFound(String),
    #[error("cannot start the job: {0}")]
    Spawn(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Env(#[from] crate::sandbox::env::EnvError),
    #[error("job {0} has finished; its stdin is closed")]
    Finished(String),
    #[error("job {0}: its stdin is closed (eof was sent, or stdin text was given at start)")]
    StdinClosed(String),
    #[error("job {job}: writing to its stdin failed: {error}")]
    Write { job: String, error: String },
    #[error("unknown signal '{0}'; use a name such as TERM, KILL, INT, HUP or a number")]
    BadSignal(String),
    #[error(transparent)]
    Refused(#[from] crate::session::gate::Refusal),
}

pub fn parse_signal(s: &str) -> Result<Signal, JobError> {
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| JobError::BadSignal(s.to_string()));
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>()
        .map_err(|_| JobError::BadSignal(s.to_string()))
}

/// How to start a job.
#[derive(Debug, Default)]
pub struct JobSpec {
    pub command: String,
    /// What the job is shown as, when not `command` itself.
    pub shown: Option<String>,
    /// A package installer: reaches the package indexes through the egress
    /// proxy (with `--network packages`), nothing else.
    pub egress: bool,
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    /// Written to stdin, which is then closed.
    pub stdin: Option<String>,
    pub pty: bool,
    /// The tool that reads the job's whole output (default shell_output).
    pub reader: Option<&'static str>,
    /// Directories of the server's the job may read (an install's copies
    /// of local wheels).
    pub extra_read: Vec<PathBuf>,
    /// The client's narrowing of the jobs' sandbox (--sandbox inherit);
    /// None: the jobs' own.
    pub sandbox: Option<Arc<crate::sandbox::SandboxConfig>>,
}

/// An install job and the packages it installs.
type Install = (Arc<Job>, Vec<String>);

pub struct JobManager {
    settings: JobConfig,
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
    next_id: AtomicU64,
    /// The install job started last for each session (python_install), so a
    /// repeated call waits on it instead of starting another.
    installs: Mutex<BTreeMap<String, Install>>,
}

impl JobManager {
    pub fn new(settings: JobConfig) -> Arc<Self> {
        Arc::new(Self {
            settings,
            jobs: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            installs: Mutex::new(BTreeMap::new()),
        })
    }

    fn jobs(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Job>>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn find(&self, id: &str) -> Result<Arc<Job>, JobError> {
        let n = id.trim_start_matches(['j', 'J']).parse::<u64>().ok();
        n.and_then(|n| self.jobs().get(&n).cloned())
            .ok_or_else(|| JobError::NotFound(id.to_string()))
    }

    /// Drops finished jobs past their retention.
    fn prune(&self) {
        let mut jobs = self.jobs();
        let keep = self.settings.keep_finished;
        jobs.retain(|_, j| j.lock().finished_at.is_none_or(|at| at.elapsed() < keep));
        let finished: Vec<u64> = jobs
            .iter()
            .filter(|(_, j)| j.lock().finished_at.is_some())
            .map(|(id, _)| *id)
            .collect();
        if finished.len() > self.settings.max_kept {
            for id in &finished[..finished.len() - self.settings.max_kept] {
                jobs.remove(id);
            }
        }
    }

    pub fn start(&self, spec: JobSpec) -> Result<Arc<Job>, JobError> {
        if let Some(gate) = &self.settings.gate {
            gate.admit_work()?;
        }
        self.prune();
        // The instance's job budget (--max-jobs) is the gate's.
        let slot = match &self.settings.gate {
            Some(gate) => Some(gate.job_slot()?),
            None => None,
        };
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        crate::sandbox::env::check(&spec.env)?;
        let cwd = self.job_cwd(spec.cwd.as_deref())?;
        let sink = LogSink {
            dir: Arc::new(self.settings.log_dir.join(format!("job-{n}"))),
            budget: self.settings.log_bytes,
        };
        let reader = spec.reader.unwrap_or("shell_output");
        let capture = Capture::new(
            self.settings.output_head_bytes,
            self.settings.output_tail_bytes,
            reader,
        )
        .with_log(sink);
        let spawned = self.spawn(&spec, &cwd, n)?;
        let command = spec.shown.clone().unwrap_or_else(|| spec.command.clone());
        let job = Job::follow(n, command, spec.pty, capture, spawned, spec.stdin, slot);
        self.jobs().insert(n, job.clone());
        // Revoked while it started: `end_all` may have passed before the
        // job was in the table.
        if let Some(Err(refused)) = self.settings.gate.as_ref().map(|g| g.check_revoked()) {
            job.kill_for(refused.to_string());
            return Err(refused.into());
        }
        // Installers are the only jobs that get the egress proxy.
        let kind = if spec.egress {
            crate::metrics::JobKind::Install
        } else {
            crate::metrics::JobKind::Shell
        };
        crate::metrics::job_started(kind);
        Ok(job)
    }

    /// Where a job asked to start in `cwd` starts: an existing directory
    /// inside the workspace, symbolic links resolved.
    fn job_cwd(&self, cwd: Option<&Path>) -> Result<PathBuf, JobError> {
        let cwd = match cwd {
            Some(c) => crate::sandbox::paths::normalize(c, &self.settings.workdir),
            None => self.settings.workdir.clone(),
        };
        let real = cwd.canonicalize().map_err(|_| {
            JobError::Invalid(format!(
                "cwd '{}' does not exist; give a directory inside the workspace",
                cwd.display()
            ))
        })?;
        if !real.is_dir() || !real.starts_with(&self.settings.workdir) {
            if !real.starts_with(&self.settings.workdir) {
                crate::metrics::sandbox_refusal(crate::metrics::SandboxRefusal::Cwd);
            }
            return Err(JobError::Invalid(format!(
                "cwd '{}' is not a directory inside the workspace {}; jobs start only there",
                cwd.display(),
                self.settings.workdir.display()
            )));
        }
        Ok(real)
    }

    /// Starts `/bin/sh -c command` for job `n`, on pipes or a terminal.
    fn spawn(&self, spec: &JobSpec, cwd: &Path, n: u64) -> Result<Spawned, JobError> {
        let args: Vec<OsString> = vec!["-c".into(), spec.command.clone().into()];
        let stdio = if spec.pty {
            Stdio::Pty {
                rows: 40,
                cols: 120,
            }
        } else {
            Stdio::Pipes {
                stdin: true,
                control: Vec::new(),
            }
        };
        process::spawn(Launch {
            program: Path::new("/bin/sh"),
            args: &args,
            cwd,
            env: &job_env(spec),
            sandbox: spec.sandbox.as_deref().or(self.settings.sandbox.as_deref()),
            inherit_env: false,
            home: self.settings.log_dir.join(format!("job-home-{n}")),
            label: &format!("j{n}"),
            egress: spec.egress,
            extra_read: &spec.extra_read,
            files: &[],
            inet_in_netns: false,
            stdio,
        })
        .map_err(|e| JobError::Spawn(e.to_string()))
    }

    /// Returns when the job exits or `wait` runs out, with new output.
    pub async fn wait(&self, job: &Arc<Job>, wait: Duration) -> JobReport {
        let deadline = TokioInstant::now() + wait;
        let mut rx = job.changed.subscribe();
        let grace = self.settings.drain_grace;
        loop {
            rx.borrow_and_update();
            if job.done(grace) || TokioInstant::now() >= deadline {
                return job.report(grace);
            }
            let exit_at = job.lock().exit.as_ref().map(|e| e.at + grace);
            let wake = match exit_at {
                Some(at) => TokioInstant::from_std(at).min(deadline),
                None => deadline,
            };
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    pub fn get(&self, id: &str) -> Result<Arc<Job>, JobError> {
        self.find(id)
    }

    pub async fn input(&self, id: &str, text: &str, eof: bool) -> Result<Arc<Job>, JobError> {
        let job = self.find(id)?;
        if job.lock().exit.is_some() {
            return Err(JobError::Finished(job.id.clone()));
        }
        let mut guard = job.stdin.lock().await;
        let Some(w) = guard.as_mut() else {
            return Err(JobError::StdinClosed(job.id.clone()));
        };
        let mut data = text.as_bytes().to_vec();
        if !text.is_empty() && !text.ends_with('\n') {
            data.push(if job.pty { b'\r' } else { b'\n' });
        }
        if eof && job.pty {
            data.push(0x04);
        }
        let write = async {
            w.write_all(&data).await?;
            w.flush().await
        };
        match tokio::time::timeout(Duration::from_secs(5), write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(JobError::Write {
                    job: job.id.clone(),
                    error: e.to_string(),
                });
            }
            Err(_) => {
                return Err(JobError::Write {
                    job: job.id.clone(),
                    error: "the program does not read its input (the pipe is full)".into(),
                });
            }
        }
        if eof && !job.pty {
            *guard = None;
        }
        drop(guard);
        Ok(job)
    }

    /// Signals the job's process group; a TERM that is ignored for two
    /// seconds is followed by KILL. Returns the final (or current) report.
    pub async fn kill(&self, id: &str, signal: Signal) -> Result<JobReport, JobError> {
        let job = self.find(id)?;
        if job.lock().exit.is_some() {
            return Ok(self.wait(&job, Duration::ZERO).await);
        }
        if signal == Signal::SIGKILL {
            job.kill_all_off_thread().await;
        } else {
            job.signal(signal);
        }
        let mut report = self.wait(&job, Duration::from_secs(2)).await;
        if report.state.status == JobStatus::Running && signal == Signal::SIGTERM {
            job.kill_all_off_thread().await;
            let mut more = self.wait(&job, Duration::from_secs(5)).await;
            more.notes.push(
                "The job ignored SIGTERM for 2 s; it and every process it started were sent SIGKILL.".into(),
            );
            report = report.merge(more);
        }
        Ok(report)
    }

    /// How many jobs are running and how many have exited (kept for
    /// reading), for the metrics: no reports built, nothing pruned.
    pub fn state_counts(&self) -> Vec<(&'static str, u64)> {
        let jobs = self.jobs();
        let running = jobs.values().filter(|j| j.lock().exit.is_none()).count() as u64;
        let total = jobs.len() as u64;
        vec![("running", running), ("exited", total - running)]
    }

    pub fn list(&self) -> Vec<JobInfo> {
        self.prune();
        self.jobs()
            .values()
            .map(|j| JobInfo::new(j, j.lock().exit.as_ref()))
            .collect()
    }

    /// Job `id` for the viewer: nothing pruned, nothing taken.
    pub fn view(&self, id: &str) -> Option<Arc<Job>> {
        self.find(id).ok()
    }

    /// The job's full output so far and the bytes not kept.
    pub fn output(&self, id: &str) -> Result<(Arc<Job>, Vec<u8>, u64, bool), JobError> {
        let job = self.find(id)?;
        let mut st = job.lock();
        let mut bytes = st.log.bytes();
        st.capture.read_log(&mut bytes);
        let running = st.exit.is_none();
        let dropped = st.log.dropped();
        drop(st);
        Ok((job, bytes, dropped, running))
    }

    /// Elapsed seconds and the latest output line of a running job.
    pub fn progress(&self, job: &Job) -> Option<(f64, String)> {
        let st = job.lock();
        if st.exit.is_some() {
            return None;
        }
        Some((
            job.started.elapsed().as_secs_f64(),
            st.capture.last_line().unwrap_or_default(),
        ))
    }

    pub fn interrupt(&self, job: &Job) {
        job.signal(Signal::SIGINT);
    }

    /// Kills every running job, with `reason` in its report. Returns how
    /// many were running.
    pub fn end_all(&self, reason: &str) -> usize {
        let jobs: Vec<Arc<Job>> = self.jobs().values().cloned().collect();
        let reason = format!("{reason}, so ferrepl killed the job.");
        jobs.iter().filter(|j| j.kill_for(reason.clone())).count()
    }

    pub fn shutdown(&self) {
        for job in self.jobs().values() {
            job.kill_all();
        }
    }

    /// The exit code of a finished job (-1 when killed by a signal), or None
    /// while it runs.
    pub fn status_of(&self, job: &Job) -> Option<i32> {
        job.lock().exit.as_ref().map(|e| e.code.unwrap_or(-1))
    }

    /// Resolves at the job's next state change.
    pub async fn changed(&self, job: &Job) {
        let mut rx = job.changed.subscribe();
        rx.borrow_and_update();
        if job.lock().exit.is_none() {
            let _ = rx.changed().await;
        }
    }

    /// A new directory name of the server's own (never made before),
    /// for files it hands a job.
    pub fn private_dir(&self, what: &str) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        self.settings
            .log_dir
            .join(format!("{what}-{n}-{}", std::process::id()))
    }

    /// Where jobs start: the workspace.
    /// The sandbox jobs run under (a client's policy narrows it).
    pub fn sandbox(&self) -> Option<&crate::sandbox::SandboxConfig> {
        self.settings.sandbox.as_deref()
    }

    pub fn workdir(&self) -> &std::path::Path {
        &self.settings.workdir
    }

    /// How package installers run.
    pub fn installer(&self) -> &crate::installer::InstallerSettings {
        &self.settings.installer
    }

    /// The install job still running for `session`, if any, and the
    /// packages it installs.
    pub fn running_install(&self, session: &str) -> Option<Install> {
        let mut installs = self.installs.lock().unwrap_or_else(|e| e.into_inner());
        // Finished installs go; the map holds at most one per live install.
        installs.retain(|_, (job, _)| job.lock().exit.is_none());
        installs.get(session).cloned()
    }

    /// Records the install job just started for `session`.
    pub fn set_install(&self, session: &str, job: Arc<Job>, packages: Vec<String>) {
        let mut installs = self.installs.lock().unwrap_or_else(|e| e.into_inner());
        installs.insert(session.to_string(), (job, packages));
    }

    /// The job limits, for server_status.
    pub fn limits(&self) -> (usize, Duration) {
        (self.settings.max_running, self.settings.keep_finished)
    }
}

/// The job's own variables (the agent's, already checked), over defaults.
fn job_env(spec: &JobSpec) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PAGER".into(), "cat".into()),
        ("GIT_PAGER".into(), "cat".into()),
    ];
    if spec.pty {
        env.push(("TERM".into(), "xterm-256color".into()));
    }
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(parse_signal("TERM").ok(), Some(Signal::SIGTERM));
        assert_eq!(parse_signal("sigkill").ok(), Some(Signal::SIGKILL));
        assert_eq!(parse_signal("2").ok(), Some(Signal::SIGINT));
        assert!(parse_signal("NOPE").is_err());
    }

    fn manager(dir: &Path) -> Arc<JobManager> {
        JobManager::new(JobConfig {
            workdir: dir.to_path_buf(),
            output_head_bytes: 4096,
            output_tail_bytes: 4096,
            log_dir: dir.join("logs"),
            log_bytes: 1 << 20,
            max_running: 4,
            keep_finished: Duration::from_secs(60),
            max_kept: 10,
            drain_grace: Duration::from_millis(100),
            sandbox: None,
            installer: Arc::new(crate::installer::InstallerSettings {
                index_url: String::new(),
                extra_index_urls: Vec::new(),
                credentials: Vec::new(),
                unusable: Vec::new(),
                cert: None,
                allowed_hosts: Vec::new(),
                source_builds: false,
                mode: crate::sandbox::Network::Off,
                cran: String::new(),
            }),
            gate: None,
        })
    }

    #[tokio::test]
    async fn state_counts_running_and_exited() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().canonicalize().expect("canonical tempdir");
        let jobs = manager(&dir);
        assert_eq!(jobs.state_counts(), vec![("running", 0), ("exited", 0)]);
        let quick = jobs
            .start(JobSpec {
                command: "exit 0".into(),
                ..JobSpec::default()
            })
            .expect("start");
        let slow = jobs
            .start(JobSpec {
                command: "sleep 30".into(),
                ..JobSpec::default()
            })
            .expect("start");
        jobs.wait(&quick, Duration::from_secs(10)).await;
        assert_eq!(jobs.state_counts(), vec![("running", 1), ("exited", 1)]);
        let outside = jobs.start(JobSpec {
            command: "true".into(),
            cwd: Some("/".into()),
            ..JobSpec::default()
        });
        assert!(outside.is_err());
        jobs.kill(&slow.id, Signal::SIGKILL).await.expect("kill");
        assert_eq!(jobs.state_counts(), vec![("running", 0), ("exited", 2)]);
        let text = crate::metrics::render(&[], false);
        assert!(text.contains(r#"ferrepl_jobs_started_total{kind="shell"} "#));
        assert!(!text.contains(r#"ferrepl_sandbox_refusals_total{kind="cwd"} 0"#));
    }
}
