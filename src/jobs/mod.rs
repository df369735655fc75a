//! Shell jobs: `/bin/sh -c COMMAND` in the background, on pipes or a pty,
//! each in its own process group, with bounded output that is kept in full
//! for shell_output, and the same wait semantics as Python cells.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant as TokioInstant;

use crate::output::log::CellLog;
use crate::output::{Capture, LogSink, RenderedOutput, Stream};
use crate::sandbox::cgroup::Cgroup;
use crate::worker::ExitInfo;

/// Limits and defaults of shell jobs.
#[derive(Debug, Clone)]
pub struct JobConfig {
    pub workdir: PathBuf,
    pub output_head_bytes: usize,
    pub output_tail_bytes: usize,
    pub log_dir: PathBuf,
    pub log_bytes: u64,
    /// Jobs running at once.
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
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(
        "no job '{0}'; shell_wait {{}} lists the jobs (finished jobs are dropped after a while)"
    )]
    NotFound(String),
    #[error(
        "{running} jobs are running, the limit (--max-jobs); wait for one with shell_wait or stop one with shell_wait {{job, signal: \"TERM\"}}"
    )]
    TooMany { running: usize },
    #[error("cannot start the job: {0}")]
    Spawn(String),
    #[error("{0}")]
    Invalid(String),
    #[error("job {0} has finished; its stdin is closed")]
    Finished(String),
    #[error("job {0}: its stdin is closed (eof was sent, or stdin text was given at start)")]
    StdinClosed(String),
    #[error("job {job}: writing to its stdin failed: {error}")]
    Write { job: String, error: String },
    #[error("unknown signal '{0}'; use a name such as TERM, KILL, INT, HUP or a number")]
    BadSignal(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Still running; collect it with shell_wait.
    Running,
    /// Exited (see exit_code / signal).
    Exited,
}

/// What a job call returns.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub job: String,
    pub command: String,
    pub status: JobStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub pid: u32,
    pub pty: bool,
    pub output: RenderedOutput,
    pub elapsed_ms: f64,
    pub notes: Vec<String>,
}

impl JobReport {
    pub fn is_error(&self) -> bool {
        self.status == JobStatus::Exited && self.exit_code != Some(0)
    }
}

type Stdin = Box<dyn AsyncWrite + Send + Unpin>;

struct JobState {
    capture: Capture,
    log: CellLog,
    exit: Option<ExitInfo>,
    open_streams: usize,
    finished_at: Option<Instant>,
    notes: Vec<String>,
    /// Kernel-enforced limits, until the job exits.
    cgroup: Option<Arc<Cgroup>>,
}

pub struct Job {
    id: String,
    command: String,
    pid: u32,
    pty: bool,
    started: Instant,
    stdin: tokio::sync::Mutex<Option<Stdin>>,
    /// The job's private temporary directory (HOME, TMPDIR), removed when
    /// it exits.
    home: Option<PathBuf>,
    state: Mutex<JobState>,
    changed: watch::Sender<u64>,
}

impl Job {
    fn lock(&self) -> MutexGuard<'_, JobState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn signal(&self, sig: Signal) {
        if self.pid > 0 && self.lock().exit.is_none() {
            let _ = killpg(Pid::from_raw(self.pid as i32), sig);
        }
    }

    /// SIGKILL to the process group and to every descendant, so children
    /// that left the group (`setsid`, daemons) go too.
    fn kill_all(&self) {
        let (alive, cgroup) = {
            let st = self.lock();
            (st.exit.is_none(), st.cgroup.clone())
        };
        if self.pid > 0 && alive {
            crate::sandbox::watch::kill_tree(self.pid);
        }
        if let Some(group) = cgroup {
            group.kill_all();
        }
    }

    fn done(&self, grace: Duration) -> bool {
        let st = self.lock();
        match &st.exit {
            Some(e) => st.open_streams == 0 || e.at.elapsed() >= grace,
            None => false,
        }
    }

    /// A report with the output not returned before.
    fn report(&self, grace: Duration) -> JobReport {
        let finished = self.done(grace);
        let mut st = self.lock();
        let mut output = st.capture.take();
        let segments = output.take_log();
        st.log.add_all(segments);
        let exit = st.exit.clone().filter(|_| finished);
        let notes = std::mem::take(&mut st.notes);
        JobReport {
            job: self.id.clone(),
            command: self.command.clone(),
            status: if exit.is_some() {
                JobStatus::Exited
            } else {
                JobStatus::Running
            },
            exit_code: exit.as_ref().and_then(|e| e.code),
            signal: exit.as_ref().and_then(|e| e.signal).map(signal_name),
            pid: self.pid,
            pty: self.pty,
            output: output.render(),
            elapsed_ms: match (&exit, st.finished_at) {
                (Some(_), Some(at)) => at.duration_since(self.started).as_secs_f64() * 1000.0,
                _ => self.started.elapsed().as_secs_f64() * 1000.0,
            },
            notes,
        }
    }
}

fn signal_name(sig: i32) -> String {
    Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
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

/// A row of shell_jobs.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct JobInfo {
    pub job: String,
    pub command: String,
    /// running or exited.
    pub status: JobStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub pid: u32,
    pub pty: bool,
    pub age_s: f64,
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
}

/// An install job and the packages it installs.
type Install = (Arc<Job>, Vec<String>);

pub struct JobManager {
    cfg: JobConfig,
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
    next_id: AtomicU64,
    /// The install job started last for each session (python_install), so a
    /// repeated call waits on it instead of starting another.
    installs: Mutex<BTreeMap<String, Install>>,
}

impl JobManager {
    pub fn new(cfg: JobConfig) -> Arc<Self> {
        Arc::new(Self {
            cfg,
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
        let keep = self.cfg.keep_finished;
        jobs.retain(|_, j| j.lock().finished_at.is_none_or(|at| at.elapsed() < keep));
        let finished: Vec<u64> = jobs
            .iter()
            .filter(|(_, j)| j.lock().finished_at.is_some())
            .map(|(id, _)| *id)
            .collect();
        if finished.len() > self.cfg.max_kept {
            for id in &finished[..finished.len() - self.cfg.max_kept] {
                jobs.remove(id);
            }
        }
    }

    /// What to start for `/bin/sh -c command`: the launcher under the
    /// sandbox (with a private temporary HOME for the job), and the job's
    /// cgroups when the kernel limits can be enforced that way.
    fn shell_command(
        &self,
        spec: &JobSpec,
        cwd: &std::path::Path,
        n: u64,
    ) -> Result<(ShellCommand, Option<Cgroup>), JobError> {
        let args: Vec<std::ffi::OsString> = vec!["-c".into(), spec.command.clone().into()];
        let sh = PathBuf::from("/bin/sh");
        let env = job_env(spec);
        let spawn_err = |e: std::io::Error| JobError::Spawn(e.to_string());
        match self.cfg.sandbox.as_deref() {
            Some(sandbox) if sandbox.enabled() => {
                let tmp = self.cfg.log_dir.join(format!("job-home-{n}"));
                crate::state::private_dir(&tmp).map_err(spawn_err)?;
                let mut policy = sandbox.policy(&tmp, cwd, sandbox.environment(Some(&tmp), &env));
                policy.pty = spec.pty && policy.mounts.is_some();
                if spec.egress
                    && let (Some(relay), Some(plan)) = (&sandbox.egress, policy.mounts.as_mut())
                {
                    plan.binds.push(crate::sandbox::Bind {
                        path: relay.socket.clone(),
                        writable: true,
                    });
                    policy.egress = Some(relay.clone());
                }
                let cgroup = sandbox.cgroup_for(&mut policy, &format!("j{n}"));
                let (program, args) = sandbox.wrap(&policy, &sh, &args).map_err(spawn_err)?;
                let shell = ShellCommand {
                    program,
                    args,
                    env: BTreeMap::new(),
                };
                Ok((shell, cgroup))
            }
            Some(sandbox) => Ok((
                ShellCommand {
                    program: sh,
                    args,
                    env: sandbox.environment(None, &env),
                },
                None,
            )),
            None => Ok((
                ShellCommand {
                    program: sh,
                    args,
                    env: env.into_iter().collect(),
                },
                None,
            )),
        }
    }

    pub fn start(&self, spec: JobSpec) -> Result<Arc<Job>, JobError> {
        self.prune();
        let running = self
            .jobs()
            .values()
            .filter(|j| j.lock().exit.is_none())
            .count();
        if running >= self.cfg.max_running {
            return Err(JobError::TooMany { running });
        }
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("j{n}");
        crate::sandbox::env::check(&spec.env).map_err(JobError::Invalid)?;
        let cwd = match &spec.cwd {
            Some(c) => crate::sandbox::paths::normalize(c, &self.cfg.workdir),
            None => self.cfg.workdir.clone(),
        };
        let real = cwd.canonicalize().map_err(|_| {
            JobError::Invalid(format!(
                "cwd '{}' does not exist; give a directory inside the workspace",
                cwd.display()
            ))
        })?;
        if !real.is_dir() || !real.starts_with(&self.cfg.workdir) {
            return Err(JobError::Invalid(format!(
                "cwd '{}' is not a directory inside the workspace {}; jobs start only there",
                cwd.display(),
                self.cfg.workdir.display()
            )));
        }
        let cwd = real;
        let sink = LogSink {
            dir: Arc::new(self.cfg.log_dir.join(format!("job-{n}"))),
            budget: self.cfg.log_bytes,
        };
        let reader = spec.reader.unwrap_or("shell_output");
        let capture = Capture::new(
            self.cfg.output_head_bytes,
            self.cfg.output_tail_bytes,
            reader,
        )
        .with_log(sink);
        let (shell, cgroup) = self.shell_command(&spec, &cwd, n)?;
        let spawned = if spec.pty {
            spawn_pty(&cwd, shell)
        } else {
            spawn_pipes(&cwd, shell)
        }
        .map_err(|e| JobError::Spawn(e.to_string()))?;
        let (changed, _) = watch::channel(0u64);
        let job = Arc::new(Job {
            id,
            command: spec.shown.clone().unwrap_or_else(|| spec.command.clone()),
            pid: spawned.child.id().unwrap_or(0),
            pty: spec.pty,
            started: Instant::now(),
            stdin: tokio::sync::Mutex::new(None),
            home: self
                .cfg
                .sandbox
                .as_deref()
                .filter(|s| s.enabled())
                .map(|_| self.cfg.log_dir.join(format!("job-home-{n}"))),
            state: Mutex::new(JobState {
                capture,
                log: CellLog::new(n),
                exit: None,
                open_streams: spawned.outputs.len(),
                finished_at: None,
                notes: Vec::new(),
                cgroup: cgroup.map(Arc::new),
            }),
            changed,
        });
        for (stream, reader) in spawned.outputs {
            tokio::spawn(read_output(job.clone(), stream, reader));
        }
        tokio::spawn(watch_exit(job.clone(), spawned.child));
        let mut stdin = spawned.stdin;
        let initial = spec.stdin.clone();
        let job2 = job.clone();
        tokio::spawn(async move {
            if let (Some(text), Some(w)) = (initial, stdin.as_mut()) {
                let _ = w.write_all(text.as_bytes()).await;
                let _ = w.flush().await;
                if spec.pty {
                    // Ctrl-D: end of input for the program on the terminal.
                    let _ = w.write_all(b"\x04").await;
                } else {
                    stdin = None;
                }
            }
            *job2.stdin.lock().await = stdin;
        });
        self.jobs().insert(n, job.clone());
        Ok(job)
    }

    /// Returns when the job exits or `wait` runs out, with new output.
    pub async fn wait(&self, job: &Arc<Job>, wait: Duration) -> JobReport {
        let deadline = TokioInstant::now() + wait;
        let mut rx = job.changed.subscribe();
        let grace = self.cfg.drain_grace;
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
            let target = job.clone();
            let _ = tokio::task::spawn_blocking(move || target.kill_all()).await;
        } else {
            job.signal(signal);
        }
        let mut report = self.wait(&job, Duration::from_secs(2)).await;
        if report.status == JobStatus::Running && signal == Signal::SIGTERM {
            let target = job.clone();
            let _ = tokio::task::spawn_blocking(move || target.kill_all()).await;
            let mut more = self.wait(&job, Duration::from_secs(5)).await;
            more.notes.push(
                "The job ignored SIGTERM for 2 s; it and every process it started were sent SIGKILL.".into(),
            );
            report = merge(report, more);
        }
        Ok(report)
    }

    pub fn list(&self) -> Vec<JobInfo> {
        self.prune();
        self.jobs()
            .values()
            .map(|j| {
                let st = j.lock();
                JobInfo {
                    job: j.id.clone(),
                    command: j.command.clone(),
                    status: if st.exit.is_some() {
                        JobStatus::Exited
                    } else {
                        JobStatus::Running
                    },
                    exit_code: st.exit.as_ref().and_then(|e| e.code),
                    signal: st.exit.as_ref().and_then(|e| e.signal).map(signal_name),
                    pid: j.pid,
                    pty: j.pty,
                    age_s: j.started.elapsed().as_secs_f64(),
                }
            })
            .collect()
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

    /// Where jobs start: the workspace.
    pub fn workdir(&self) -> &std::path::Path {
        &self.cfg.workdir
    }

    /// How package installers run.
    pub fn installer(&self) -> &crate::installer::InstallerSettings {
        &self.cfg.installer
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
        (self.cfg.max_running, self.cfg.keep_finished)
    }
}

impl Job {
    pub fn id(&self) -> &str {
        &self.id
    }
}

fn merge(mut first: JobReport, second: JobReport) -> JobReport {
    let mut combined = first.output.combined.clone();
    combined.push_str(&second.output.combined);
    first.output.combined = combined;
    first.output.stdout.push_str(&second.output.stdout);
    first.output.stderr.push_str(&second.output.stderr);
    first.output.total_bytes += second.output.total_bytes;
    first.output.omitted_bytes += second.output.omitted_bytes;
    first.notes.extend(second.notes);
    JobReport {
        output: first.output,
        notes: first.notes,
        ..second
    }
}

struct Spawned {
    child: tokio::process::Child,
    outputs: Vec<(Stream, Box<dyn AsyncRead + Send + Unpin>)>,
    stdin: Option<Stdin>,
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

/// A program to start, with exactly the environment given.
struct ShellCommand {
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
    env: BTreeMap<String, String>,
}

fn spawn_pipes(cwd: &std::path::Path, shell: ShellCommand) -> std::io::Result<Spawned> {
    let mut cmd = tokio::process::Command::new(&shell.program);
    cmd.args(&shell.args)
        .env_clear()
        .envs(&shell.env)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // A session of its own (so also its own process group, with its pid as
    // id): no session or job may reach the server's controlling terminal,
    // which is often the operator's.
    // SAFETY: setsid is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let mut outputs: Vec<(Stream, Box<dyn AsyncRead + Send + Unpin>)> = Vec::new();
    if let Some(out) = child.stdout.take() {
        outputs.push((Stream::Stdout, Box::new(out)));
    }
    if let Some(err) = child.stderr.take() {
        outputs.push((Stream::Stderr, Box::new(err)));
    }
    let stdin = child.stdin.take().map(|s| Box::new(s) as Stdin);
    Ok(Spawned {
        child,
        outputs,
        stdin,
    })
}

fn spawn_pty(cwd: &std::path::Path, shell: ShellCommand) -> std::io::Result<Spawned> {
    let to_io = |e: pty_process::Error| std::io::Error::other(e.to_string());
    let (pty, pts) = pty_process::open().map_err(to_io)?;
    pty.resize(pty_process::Size::new(40, 120)).map_err(to_io)?;
    let cmd = pty_process::Command::new(&shell.program)
        .args(&shell.args)
        .env_clear()
        .envs(&shell.env)
        .current_dir(cwd)
        .kill_on_drop(true);
    let child = cmd.spawn(pts).map_err(to_io)?;
    let (read, write) = pty.into_split();
    Ok(Spawned {
        child,
        outputs: vec![(Stream::Stdout, Box::new(read))],
        stdin: Some(Box::new(write)),
    })
}

async fn read_output(job: Arc<Job>, stream: Stream, mut reader: Box<dyn AsyncRead + Send + Unpin>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // A pty reports EIO once the last process on the terminal has gone.
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        job.lock().capture.push(stream, &buf[..n]);
        job.bump();
    }
    job.lock().open_streams -= 1;
    job.bump();
}

async fn watch_exit(job: Arc<Job>, mut child: tokio::process::Child) {
    let status = child.wait().await;
    let (code, signal) = match status {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            (s.code(), s.signal())
        }
        Err(_) => (None, None),
    };
    let cgroup = job.lock().cgroup.take();
    if let Some(group) = &cgroup {
        let notes = [group.limit_hit(), group.task_limit_note()];
        job.lock()
            .notes
            .extend(notes.into_iter().flatten().map(|n| format!("The job {n}.")));
    }
    {
        let mut st = job.lock();
        st.exit = Some(ExitInfo {
            code,
            signal,
            at: Instant::now(),
        });
        st.finished_at = Some(Instant::now());
    }
    job.bump();
    if let Some(home) = job.home.clone() {
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(home)).await;
    }
    if let Some(group) = cgroup {
        // Emptied and removed off the async threads: members may take a
        // moment to be reaped.
        let _ = tokio::task::spawn_blocking(move || drop(group)).await;
    }
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
}
