//! One worker = one interpreter process (Python or R) running the embedded
//! driver of its language.
//!
//! The server talks to it over a Unix socket at the worker's fd 3 (Python)
//! or two pipes at fds 3 and 4 (R), and reads its fds 1 and 2 as pipes. Events that close a span of output are
//! held back until the fence markers for them have come through both pipes,
//! so output is never attributed to the wrong cell (see docs/protocol.md).

mod channel;
mod events;
pub mod kernel;
mod language;
pub mod preinstall;
pub mod protocol;
pub mod python;
pub mod r;
mod readers;
mod requests;
pub mod session_venv;
mod start;
pub mod state;
mod upstream_calls;

pub use upstream_calls::CellCalls;

pub use language::Language;
pub use start::{LaunchSpec, launch, launch_ready};

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use crate::output::{self, Capture, Stream};
pub use crate::process::ExitInfo;
use crate::process::Process;
use channel::Channel;
use protocol::Request;

/// How long an event waits for its fence markers to come through the pipes
/// before it is delivered anyway (only if user code broke the pipes).
const FENCE_GRACE: Duration = Duration::from_secs(5);

static NEXT_WORKER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

#[derive(Debug, Clone)]
pub struct ReadyInfo {
    pub pid: u32,
    pub python_version: String,
    pub executable: String,
}

pub use events::ForeignRun;
pub use protocol::CellEvent;

/// A cell-level event with the output that came before its fence.
#[derive(Debug)]
pub struct FencedEvent {
    pub event: CellEvent,
    pub output: Capture,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("could not start {lang} '{program}': {source}; {hint}", hint = start_hint(*.lang))]
    Spawn {
        lang: Language,
        program: String,
        source: std::io::Error,
    },
    #[error(
        "{lang} '{program}' did not start the ferrepl driver: it exited with {status} before it was ready{stderr}"
    )]
    DiedAtStart {
        lang: Language,
        program: String,
        status: String,
        stderr: String,
    },
    #[error("{lang} '{program}' did not become ready within {secs} s; {hint}", hint = start_hint(*.lang))]
    StartTimeout {
        lang: Language,
        program: String,
        secs: u64,
    },
    #[error("could not start the Jupyter kernel '{kernel}': {reason}")]
    Kernel { kernel: String, reason: String },
    #[error("the worker process has exited; its session must be restarted")]
    Gone,
    #[error("the worker did not answer within {0} s")]
    Timeout(u64),
}

fn start_hint(lang: Language) -> &'static str {
    match lang {
        Language::Python => "pass --python PATH (or set FERREPL_PYTHON) to a working CPython 3.9+",
        Language::R => r::INSTALL_HINT,
    }
}

struct State {
    capture: Capture,
    fence_seen: [u64; 2],
    eof: [bool; 2],
    released: u64,
    events: VecDeque<FencedEvent>,
    ready: Option<ReadyInfo>,
    exit: Option<ExitInfo>,
    control_closed: bool,
    inspect_waiters: HashMap<u64, oneshot::Sender<Value>>,
    next_request_id: u64,
    /// Why ferrepl killed this worker (a resource limit), for the crash report.
    kill_reason: Option<String>,
    /// Its code's calls to upstream MCP servers.
    calls: upstream_calls::Calls,
    /// A save of its state waiting for the bytes (state.rs).
    state_sink: Option<(
        state::StateSink,
        tokio::sync::oneshot::Sender<Result<u64, state::StateError>>,
    )>,
    /// Cells other clients ran in its kernel, not yet taken by the session.
    foreign: VecDeque<ForeignRun>,
    /// Such cells dropped before the session took them (over the bound).
    foreign_dropped: usize,
    /// The last cell whose end was delivered (0: none yet): what another
    /// client's cell that ends now came after.
    last_done: u64,
}

pub struct Worker {
    /// The process ferrepl started: the interpreter, or the sandbox launcher
    /// above it (with the worker's own HOME and TMPDIR and its cgroups).
    process: Process,
    language: Language,
    program: PathBuf,
    ctl: mpsc::Sender<Vec<u8>>,
    /// Requests answered while a cell runs (Python's fd 4); R has one
    /// channel for all.
    side: Option<mpsc::Sender<Vec<u8>>>,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    /// Frozen copies (checkpoints) share its memory: count it as PSS.
    copies: std::sync::atomic::AtomicBool,
    upstream: Option<Arc<crate::upstream::TenantUpstreams>>,
    /// The Jupyter kernel it runs instead of the driver (--kernels).
    kernel: Option<String>,
    /// Its kernel's connection info, for `ferrepl attach`.
    kernel_connection: std::sync::OnceLock<Value>,
    /// Its kernel is interrupted by message, not SIGINT (kernelspec.rs).
    interrupt_by_message: bool,
}

fn stream_index(stream: Stream) -> usize {
    match stream {
        Stream::Stdout | Stream::Meta => 0,
        Stream::Stderr => 1,
    }
}

impl Worker {
    fn new(
        spec: &LaunchSpec,
        process: Process,
        (ctl, side): (mpsc::Sender<Vec<u8>>, Option<mpsc::Sender<Vec<u8>>>),
    ) -> Self {
        let log = output::LogSink {
            dir: Arc::new(spec.log_dir.join(format!("worker-{}", process.pid()))),
            budget: spec.cell_log_bytes,
        };
        let (changed, _) = watch::channel(0u64);
        Worker {
            process,
            language: spec.language,
            program: spec.program.clone(),
            ctl,
            side,
            state: Mutex::new(State {
                capture: Capture::new(
                    spec.output_head_bytes,
                    spec.output_tail_bytes,
                    spec.language.output_tool(),
                )
                .with_log(log),
                fence_seen: [0, 0],
                eof: [false, false],
                released: 0,
                events: VecDeque::new(),
                ready: None,
                exit: None,
                control_closed: false,
                inspect_waiters: HashMap::new(),
                state_sink: None,
                next_request_id: 1,
                kill_reason: None,
                foreign: VecDeque::new(),
                foreign_dropped: 0,
                last_done: 0,
                calls: Default::default(),
            }),
            changed,
            copies: std::sync::atomic::AtomicBool::new(false),
            upstream: spec.upstream.clone(),
            kernel: spec.kernel.as_ref().map(|k| k.name.clone()),
            kernel_connection: std::sync::OnceLock::new(),
            interrupt_by_message: spec.kernel.as_ref().is_some_and(|k| k.interrupt_by_message),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The interpreter's pid as the server sees it (inside its PID
    /// namespace `os.getpid()` says something else).
    pub fn pid(&self) -> u32 {
        let root = self.process.pid();
        self.lock().ready.as_ref().map_or(root, |r| r.pid)
    }

    /// The process ferrepl started and whose tree it watches.
    pub fn root_pid(&self) -> u32 {
        self.process.pid()
    }

    /// Records why ferrepl is about to kill this worker; false when a
    /// reason was recorded already (the first one stands).
    pub fn set_kill_reason(&self, reason: String) -> bool {
        let mut st = self.lock();
        if st.kill_reason.is_some() {
            return false;
        }
        st.kill_reason = Some(reason);
        true
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

    /// Waits until the driver said it is ready (or the process died).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<ReadyInfo, WorkerError> {
        let (lang, program) = (self.language, self.program.display().to_string());
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
            if let Some(kernel) = self.kernel.clone() {
                return Err(WorkerError::Kernel {
                    kernel,
                    reason: format!(
                        "it did not answer within {} s; check that it starts outside ferrepl (jupyter console --kernel NAME)",
                        timeout.as_secs()
                    ),
                });
            }
            return Err(WorkerError::StartTimeout {
                lang,
                program,
                secs: timeout.as_secs(),
            });
        }
        let status = st
            .exit
            .as_ref()
            .map(|e| e.describe())
            .unwrap_or_else(|| "an unknown status".into());
        let text = st.capture.take().render().combined;
        let mut stderr = if text.trim().is_empty() {
            String::new()
        } else {
            format!("; it printed:\n{}", text.trim_end())
        };
        if text.contains("Resource temporarily unavailable")
            || text.contains("can't start new thread")
        {
            // EAGAIN from fork or a thread: RLIMIT_NPROC.
            stderr.push_str(
                "\n(no process or thread could be started: the session's uid runs as many tasks as --max-processes allows, and RLIMIT_NPROC counts every process and thread of the uid, under a root server all of the tenant's sessions and jobs; end some of them, or raise --max-processes)",
            );
        }
        if let Some(kernel) = self.kernel.clone() {
            return Err(WorkerError::Kernel {
                kernel,
                reason: format!("it exited with {status} before it was ready{stderr}"),
            });
        }
        Err(WorkerError::DiedAtStart {
            lang,
            program,
            status,
            stderr,
        })
    }

    pub fn send(&self, request: &Request<'_>) -> Result<(), WorkerError> {
        let line = match serde_json::to_value(request) {
            Ok(Value::Object(map)) => self.encode(&map),
            _ => return Err(WorkerError::Gone),
        };
        let during_cell = matches!(request, Request::Input { .. });
        if matches!(request, Request::Exec { .. }) {
            self.take_cell_calls();
        }
        self.channel_for(during_cell)
            .try_send(line)
            .map_err(|_| WorkerError::Gone)
    }

    /// Where a request goes: one answered while a cell runs to the side
    /// channel (where there is one), cells and checkpoints to the main one.
    fn channel_for(&self, during_cell: bool) -> &mpsc::Sender<Vec<u8>> {
        match &self.side {
            Some(side) if during_cell => side,
            _ => &self.ctl,
        }
    }

    /// One request line in the driver's format.
    fn encode(&self, msg: &serde_json::Map<String, Value>) -> Vec<u8> {
        // A kernel's bridge reads JSON whatever the kernel's language.
        match self.language {
            Language::R if self.kernel.is_none() => r::encode(msg),
            _ => {
                let mut line = serde_json::to_vec(msg).unwrap_or_default();
                line.push(b'\n');
                line
            }
        }
    }

    pub fn language(&self) -> Language {
        self.language
    }

    pub fn pop_event(&self) -> Option<FencedEvent> {
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

    /// Bytes of full output recorded but not taken yet, and those dropped.
    pub fn peek_log_len(&self) -> (u64, u64) {
        self.lock().capture.log_len()
    }

    /// The length of that output, those dropped, and its last `n` bytes,
    /// looked at together.
    pub fn peek_log_tail(&self, n: u64) -> (u64, u64, Vec<u8>) {
        let mut st = self.lock();
        let (len, dropped) = st.capture.log_len();
        let mut out = Vec::new();
        st.capture
            .read_log_range(len.saturating_sub(n), n, &mut out);
        (len, dropped, out)
    }

    /// Where that output's bytes are, to read them without the lock.
    pub fn peek_log_pieces(&self, out: &mut Vec<crate::output::log::Piece>) {
        self.lock().capture.log_pieces(out);
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
        let closed = st.eof[0] && st.eof[1];
        st.exit.as_ref().is_some_and(|e| e.drained(closed, grace))
    }

    pub fn ready_info(&self) -> Option<ReadyInfo> {
        self.lock().ready.clone()
    }

    pub fn signal_group(&self, signal: Signal) {
        self.process.signal_group(signal);
    }

    /// Ends the worker and every process below it (daemonized ones too).
    pub fn kill(&self) {
        self.process.kill_all();
    }

    /// Like `kill`, for a caller that need not wait for the tree to be gone
    /// (a reset): the process group is killed at once, the walk of /proc
    /// for whatever left the group runs on a blocking thread.
    pub fn kill_in_background(self: Arc<Self>) {
        if self.lock().exit.is_none() {
            self.signal_group(Signal::SIGKILL);
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(move || self.kill());
            }
            Err(_) => self.kill(),
        }
    }

    /// A kernel limit (memory, processes) the worker's cgroup reached.
    pub fn cgroup_limit_hit(&self) -> Option<String> {
        self.process.limit_hit()
    }

    /// Resident memory of the worker's whole process tree in `snap` (the
    /// interpreter's own pid may be one of a private PID namespace).
    pub fn rss_bytes(&self, snap: &crate::sandbox::watch::Snapshot) -> Option<u64> {
        let (rss, count) = if self.has_copies() {
            snap.usage_pss(self.process.pid())
        } else {
            snap.usage(self.process.pid())
        };
        (count > 0).then_some(rss)
    }
}
