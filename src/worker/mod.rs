//! One worker = one Python interpreter process running the embedded driver.
//!
//! The server talks to it over a Unix socket at the worker's fd 3 (JSON lines)
//! and reads its fds 1 and 2 as pipes. Events that close a span of output are
//! held back until the fence markers for them have come through both pipes,
//! so output is never attributed to the wrong cell (see docs/protocol.md).

pub mod protocol;
pub mod python;
mod readers;

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};

use crate::output::{self, Capture, Stream};
use protocol::{Event, Image, PyError, Request};

/// The driver is one Python source made of two files (same namespace).
const DRIVER_SOURCE: &str = concat!(
    include_str!("driver.py"),
    "\n",
    include_str!("introspect.py"),
    "\n",
    include_str!("display.py"),
    "\nmain()\n"
);

/// Reads the driver from fd 3 (length line, then source) and runs it in a
/// namespace of its own; the session's variables live in `__main__`.
const BOOTSTRAP: &str = "import socket,sys\n\
_s=socket.socket(fileno=3)\n\
_f=_s.makefile('rb')\n\
_n=int(_f.readline())\n\
exec(compile(_f.read(_n).decode('utf-8'),'<ferrepl-driver>','exec'),{'__name__':'__ferrepl__','_ferrepl_ctl':(_s,_f)})\n";

/// How long an event waits for its fence markers to come through the pipes
/// before it is delivered anyway (only if user code broke the pipes).
const FENCE_GRACE: Duration = Duration::from_secs(5);

static NEXT_WORKER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Everything needed to start a worker; one per interpreter configuration.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub python: PathBuf,
    pub workdir: PathBuf,
    /// Variables set for the interpreter (checked by sandbox::env::check).
    pub env: Vec<(String, String)>,
    pub output_head_bytes: usize,
    pub output_tail_bytes: usize,
    pub max_value_chars: usize,
    pub max_image_bytes: u64,
    /// Directory for spilled output; each worker gets a subdirectory.
    pub log_dir: PathBuf,
    /// Budget of one cell's full output log (--output-log-bytes).
    pub cell_log_bytes: u64,
    /// OS confinement; None or mode off runs the interpreter directly.
    pub sandbox: Option<Arc<crate::sandbox::SandboxConfig>>,
}

#[derive(Debug, Clone)]
pub struct ReadyInfo {
    pub pid: u32,
    pub python_version: String,
    pub executable: String,
}

#[derive(Debug, Clone)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub at: Instant,
}

impl ExitInfo {
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => match Signal::try_from(sig) {
                Ok(s) => format!("signal {sig} ({})", s.as_str()),
                Err(_) => format!("signal {sig}"),
            },
            (None, None) => "an unknown status".to_string(),
        }
    }
}

/// A cell-level event, delivered with the output that came before its fence.
#[derive(Debug)]
pub enum CellEvent {
    Done {
        cell: u64,
        status: String,
        value: Option<String>,
        error: Option<PyError>,
        elapsed_ms: f64,
        output: Capture,
    },
    InputRequest {
        cell: u64,
        prompt: String,
        password: bool,
        output: Capture,
    },
    Display {
        cell: u64,
        image: Image,
        output: Capture,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(
        "could not start the Python interpreter '{python}': {source}; pass --python PATH (or set FERREPL_PYTHON) to a working python3"
    )]
    Spawn {
        python: String,
        source: std::io::Error,
    },
    #[error(
        "the Python interpreter '{python}' did not start the ferrepl driver: it exited with {status} before it was ready{stderr}"
    )]
    DiedAtStart {
        python: String,
        status: String,
        stderr: String,
    },
    #[error(
        "the Python interpreter '{python}' did not become ready within {secs} s; is it a working CPython 3.9+?"
    )]
    StartTimeout { python: String, secs: u64 },
    #[error("the worker process has exited; its session must be restarted")]
    Gone,
    #[error("the worker did not answer within {0} s")]
    Timeout(u64),
}

struct State {
    capture: Capture,
    fence_seen: [u64; 2],
    eof: [bool; 2],
    released: u64,
    events: VecDeque<CellEvent>,
    ready: Option<ReadyInfo>,
    exit: Option<ExitInfo>,
    control_closed: bool,
    inspect_waiters: HashMap<u64, oneshot::Sender<Value>>,
    next_request_id: u64,
    /// Why ferrepl killed this worker (a resource limit), for the crash report.
    kill_reason: Option<String>,
    /// The worker's cgroups (kernel-enforced limits), until it exits.
    cgroup: Option<Arc<crate::sandbox::cgroup::Cgroup>>,
}

pub struct Worker {
    /// The process ferrepl started: the interpreter, or the sandbox launcher
    /// above it. It leads the process group.
    pid: u32,
    /// The worker's own temporary directory (HOME, TMPDIR) under the sandbox.
    home: Option<PathBuf>,
    python: PathBuf,
    ctl: mpsc::Sender<Vec<u8>>,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

fn stream_index(stream: Stream) -> usize {
    match stream {
        Stream::Stdout | Stream::Meta => 0,
        Stream::Stderr => 1,
    }
}

fn random_hex() -> String {
    let state = std::hash::RandomState::new();
    let mut out = String::new();
    for i in 0..2u64 {
        let mut h = state.build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// Starts a worker process. Every worker is started here, so a later sandbox
/// wraps exactly this one place.
pub async fn launch(spec: &LaunchSpec) -> Result<Arc<Worker>, WorkerError> {
    let spawn_err = |source| WorkerError::Spawn {
        python: spec.python.display().to_string(),
        source,
    };
    let (parent_end, child_end) = std::os::unix::net::UnixStream::pair().map_err(spawn_err)?;
    let nonce = random_hex();
    let launch_no = NEXT_WORKER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let python_args: Vec<OsString> = vec!["-c".into(), BOOTSTRAP.into()];
    let mut home = None;
    let mut cgroup = None;
    let mut env: Vec<(String, String)> = vec![
        ("FERREPL_NONCE".into(), nonce.clone()),
        (
            "FERREPL_MAX_VALUE_CHARS".into(),
            spec.max_value_chars.to_string(),
        ),
        (
            "FERREPL_MAX_IMAGE_BYTES".into(),
            spec.max_image_bytes.to_string(),
        ),
    ];
    if std::env::var_os("MPLBACKEND").is_none() {
        env.push(("MPLBACKEND".into(), "Agg".into()));
    }
    env.extend(spec.env.iter().cloned());
    let mut cmd = match spec.sandbox.as_deref().filter(|s| s.enabled()) {
        Some(sandbox) => {
            // Its own HOME and TMPDIR, writable, removed when it exits.
            let tmp = spec.log_dir.join(format!("home-{launch_no}"));
            crate::state::private_dir(&tmp).map_err(spawn_err)?;
            let mut policy =
                sandbox.policy(&tmp, &spec.workdir, sandbox.environment(Some(&tmp), &env));
            cgroup = sandbox
                .cgroup_for(&mut policy, &format!("w{launch_no}"))
                .map(Arc::new);
            let (exe, args) = sandbox
                .wrap(&policy, &spec.python, &python_args)
                .map_err(spawn_err)?;
            home = Some(tmp);
            let mut c = tokio::process::Command::new(exe);
            c.args(args).env_clear();
            c
        }
        None => {
            let mut c = tokio::process::Command::new(&spec.python);
            c.args(&python_args);
            match spec.sandbox.as_deref() {
                Some(sandbox) => {
                    c.env_clear().envs(sandbox.environment(None, &env));
                }
                None => {
                    c.envs(env);
                }
            }
            c
        }
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .current_dir(&spec.workdir)
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
    cmd.fd_mappings(vec![FdMapping {
        parent_fd: OwnedFd::from(child_end),
        child_fd: 3,
    }])
    .map_err(|e| spawn_err(std::io::Error::other(e.to_string())))?;
    let mut child = cmd.spawn().map_err(spawn_err)?;
    // The Command holds the child's end of the socket until dropped.
    drop(cmd);
    let pid = child.id().unwrap_or(0);

    parent_end.set_nonblocking(true).map_err(spawn_err)?;
    let sock = UnixStream::from_std(parent_end).map_err(spawn_err)?;
    let (read_half, mut write_half) = sock.into_split();
    let (ctl_tx, mut ctl_rx) = mpsc::channel::<Vec<u8>>(64);
    let (changed, _) = watch::channel(0u64);
    let worker = Arc::new(Worker {
        pid,
        home,
        python: spec.python.clone(),
        ctl: ctl_tx,
        state: Mutex::new(State {
            capture: Capture::new(
                spec.output_head_bytes,
                spec.output_tail_bytes,
                "python_output",
            )
            .with_log(output::LogSink {
                dir: Arc::new(spec.log_dir.join(format!("worker-{pid}"))),
                budget: spec.cell_log_bytes,
            }),
            fence_seen: [0, 0],
            eof: [false, false],
            released: 0,
            events: VecDeque::new(),
            ready: None,
            exit: None,
            control_closed: false,
            inspect_waiters: HashMap::new(),
            next_request_id: 1,
            kill_reason: None,
            cgroup,
        }),
        changed,
    });

    let mut first = format!("{}\n", DRIVER_SOURCE.len()).into_bytes();
    first.extend_from_slice(DRIVER_SOURCE.as_bytes());
    tokio::spawn(async move {
        if write_half.write_all(&first).await.is_err() {
            return;
        }
        while let Some(msg) = ctl_rx.recv().await {
            if write_half.write_all(&msg).await.is_err() {
                break;
            }
        }
    });
    if let Some(out) = child.stdout.take() {
        tokio::spawn(readers::read_pipe(
            out,
            Stream::Stdout,
            worker.clone(),
            nonce.clone(),
        ));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(readers::read_pipe(
            err,
            Stream::Stderr,
            worker.clone(),
            nonce.clone(),
        ));
    }
    tokio::spawn(readers::read_control(read_half, worker.clone()));
    tokio::spawn(readers::watch_exit(child, worker.clone()));
    Ok(worker)
}

impl Worker {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The interpreter's pid as the server sees it (inside its PID
    /// namespace `os.getpid()` says something else).
    pub fn pid(&self) -> u32 {
        self.lock().ready.as_ref().map_or(self.pid, |r| r.pid)
    }

    /// The process ferrepl started and whose tree it watches.
    pub fn root_pid(&self) -> u32 {
        self.pid
    }

    /// Records why ferrepl is about to kill this worker.
    pub fn set_kill_reason(&self, reason: String) {
        let mut st = self.lock();
        if st.kill_reason.is_none() {
            st.kill_reason = Some(reason);
        }
    }

    /// Why ferrepl killed this worker; given out once, for one report.
    pub fn take_kill_reason(&self) -> Option<String> {
        self.lock().kill_reason.take()
    }

    /// A receiver that wakes on any change of this worker's state.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    async fn wait_until(&self, mut ready: impl FnMut(&State) -> bool) {
        let mut rx = self.changed.subscribe();
        loop {
            rx.borrow_and_update();
            if ready(&self.lock()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn handle_event(&self, event: Event) {
        if let Some((fence, fenced)) = event.fence() {
            let need = [
                fenced.iter().any(|s| s == "stdout"),
                fenced.iter().any(|s| s == "stderr"),
            ];
            let reached =
                |s: &State| (0..2).all(|i| !need[i] || s.eof[i] || s.fence_seen[i] >= fence);
            if tokio::time::timeout(FENCE_GRACE, self.wait_until(reached))
                .await
                .is_err()
            {
                tracing::warn!(
                    pid = self.pid,
                    fence,
                    "output fence did not arrive; delivering the event anyway"
                );
            }
            let mut st = self.lock();
            let output = st.capture.take();
            st.released = st.released.max(fence);
            let cell_event = match event {
                Event::Done {
                    cell,
                    status,
                    value,
                    error,
                    elapsed_ms,
                    ..
                } => CellEvent::Done {
                    cell,
                    status,
                    value,
                    error,
                    elapsed_ms,
                    output,
                },
                Event::InputRequest {
                    cell,
                    prompt,
                    password,
                    ..
                } => CellEvent::InputRequest {
                    cell,
                    prompt,
                    password,
                    output,
                },
                Event::Display {
                    cell,
                    mime,
                    data,
                    bytes,
                    width,
                    height,
                    sha,
                    ..
                } => CellEvent::Display {
                    cell,
                    image: Image {
                        mime,
                        base64: data,
                        bytes,
                        width,
                        height,
                        sha,
                    },
                    output,
                },
                _ => return,
            };
            st.events.push_back(cell_event);
            drop(st);
            self.bump();
            return;
        }
        match event {
            Event::Ready {
                pid,
                python,
                executable,
            } => {
                // Shown and signalled from outside: the host's pid, not the
                // one inside the sandbox's PID namespace.
                let root = self.pid;
                let pid =
                    tokio::task::spawn_blocking(move || crate::sandbox::watch::host_pid(root, pid))
                        .await
                        .ok()
                        .flatten()
                        .unwrap_or(pid);
                self.lock().ready = Some(ReadyInfo {
                    pid,
                    python_version: python,
                    executable,
                });
                self.bump();
            }
            Event::Reply { id, body } => {
                if let Some(tx) = self.lock().inspect_waiters.remove(&id) {
                    let _ = tx.send(body);
                }
            }
            _ => {}
        }
    }

    /// Waits until the driver said it is ready (or the process died).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<ReadyInfo, WorkerError> {
        let python = self.python.display().to_string();
        let done = tokio::time::timeout(
            timeout,
            self.wait_until(|s| s.ready.is_some() || (s.exit.is_some() && s.eof[1])),
        )
        .await;
        let mut st = self.lock();
        if let Some(info) = &st.ready {
            return Ok(info.clone());
        }
        if done.is_err() {
            drop(st);
            self.kill();
            return Err(WorkerError::StartTimeout {
                python,
                secs: timeout.as_secs(),
            });
        }
        let status = st
            .exit
            .as_ref()
            .map(|e| e.describe())
            .unwrap_or_else(|| "an unknown status".into());
        let text = st.capture.take().render().combined;
        let stderr = if text.trim().is_empty() {
            String::new()
        } else {
            format!("; it printed:\n{}", text.trim_end())
        };
        Err(WorkerError::DiedAtStart {
            python,
            status,
            stderr,
        })
    }

    pub fn send(&self, request: &Request<'_>) -> Result<(), WorkerError> {
        let mut line = serde_json::to_vec(request).map_err(|_| WorkerError::Gone)?;
        line.push(b'\n');
        self.ctl.try_send(line).map_err(|_| WorkerError::Gone)
    }

    /// A request answered by the driver's control thread (it works while a
    /// cell runs): `op` plus the fields of `args`.
    pub async fn control(
        &self,
        op: &str,
        args: serde_json::Map<String, Value>,
        timeout: Duration,
    ) -> Result<Value, WorkerError> {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut st = self.lock();
            if st.control_closed || st.exit.is_some() {
                return Err(WorkerError::Gone);
            }
            let id = st.next_request_id;
            st.next_request_id += 1;
            st.inspect_waiters.insert(id, tx);
            id
        };
        let mut msg = args;
        msg.insert("op".into(), Value::from(op));
        msg.insert("id".into(), Value::from(id));
        let mut line = serde_json::to_vec(&msg).map_err(|_| WorkerError::Gone)?;
        line.push(b'\n');
        self.ctl.try_send(line).map_err(|_| WorkerError::Gone)?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(WorkerError::Gone),
            Err(_) => {
                self.lock().inspect_waiters.remove(&id);
                Err(WorkerError::Timeout(timeout.as_secs()))
            }
        }
    }

    pub fn pop_event(&self) -> Option<CellEvent> {
        self.lock().events.pop_front()
    }

    /// Output that has arrived and is not part of a delivered event yet.
    pub fn take_output(&self) -> Capture {
        self.lock().capture.take()
    }

    /// The last non-empty line of output not yet returned, for progress messages.
    pub fn last_output_line(&self) -> Option<String> {
        self.lock().capture.last_line()
    }

    /// Returns output taken by an event that no cell claimed, so it is
    /// reported as background output instead of being lost.
    pub fn put_back_output(&self, output: Capture) {
        let mut st = self.lock();
        let later = st.capture.take();
        st.capture.append(output);
        st.capture.append(later);
    }

    /// Appends the full output recorded but not yet taken by any call.
    pub fn peek_log(&self, out: &mut Vec<u8>) {
        self.lock().capture.read_log(out);
    }

    /// Gives the next cell a fresh budget for its full output log.
    pub fn start_cell_log(&self, budget: u64) {
        self.lock().capture.set_log_budget(budget);
    }

    pub fn exit_info(&self) -> Option<ExitInfo> {
        self.lock().exit.clone()
    }

    /// True once the process has exited and both pipes are drained (or the
    /// grace period for descendants holding them open has passed).
    pub fn fully_exited(&self, grace: Duration) -> bool {
        let st = self.lock();
        match &st.exit {
            Some(e) => (st.eof[0] && st.eof[1]) || e.at.elapsed() >= grace,
            None => false,
        }
    }

    pub fn ready_info(&self) -> Option<ReadyInfo> {
        self.lock().ready.clone()
    }

    pub fn signal_group(&self, signal: Signal) {
        if self.pid > 0 {
            let _ = killpg(Pid::from_raw(self.pid as i32), signal);
        }
    }

    /// Ends the worker and every process below it (daemonized ones too).
    pub fn kill(&self) {
        let (alive, cgroup) = {
            let st = self.lock();
            (st.exit.is_none(), st.cgroup.clone())
        };
        if alive {
            crate::sandbox::watch::kill_tree(self.pid);
        }
        if let Some(group) = cgroup {
            group.kill_all();
        }
    }

    /// A kernel limit (memory, processes) the worker's cgroup reached.
    pub fn cgroup_limit_hit(&self) -> Option<String> {
        let group = self.lock().cgroup.clone()?;
        group.limit_hit()
    }

    /// Resident memory of the worker's whole process tree in `snap` (the
    /// interpreter's own pid may be one of a private PID namespace).
    pub fn rss_bytes(&self, snap: &crate::sandbox::watch::Snapshot) -> Option<u64> {
        let (rss, count) = snap.usage(self.pid);
        (count > 0).then_some(rss)
    }
}
