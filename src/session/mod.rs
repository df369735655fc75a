//! Named sessions, each backed by one worker process at a time.
//!
//! Results are pulled, not pushed: worker events wait in the worker's queue
//! until a call (exec, wait, input, interrupt, sessions) looks at the session,
//! so a cell that finishes while nobody waits keeps its result for the next
//! call. Every wait here is bounded and async.

mod cells;
pub mod report;
mod workspace;

pub use cells::CellSource;
use cells::RunningCell;
pub use workspace::SessionOptions;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::output::log::CellLog;
use crate::worker::{self, LaunchSpec, Worker, WorkerError};
use report::{CellReport, Images};

pub const DEFAULT_SESSION: &str = "default";

/// Whether `name` is a default session (the shared one, or a client's own
/// under `--default-session per-client`): those exist as soon as they are
/// named, so inspecting or resetting one never fails as unknown.
pub fn is_default_name(name: &str) -> bool {
    name == DEFAULT_SESSION
        || name
            .strip_prefix("default-")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Bounds on sessions and waits; see the configuration table in README.md.
#[derive(Debug, Clone)]
pub struct Limits {
    pub default_wait: Duration,
    pub max_wait: Duration,
    pub start_timeout: Duration,
    pub max_sessions: usize,
    pub inspect_timeout: Duration,
    /// How long the server waits for a dead worker's pipes to drain.
    pub crash_grace: Duration,
    /// How long each interrupt step waits before escalating.
    pub interrupt_grace: Duration,
    /// Time limit of one cell (--max-cell-seconds); none by default.
    pub max_cell: Option<Duration>,
    /// Images per result (--max-images).
    pub max_images: usize,
    /// Cells per session whose full output is kept (--output-keep-cells).
    pub keep_cells: usize,
    /// Full-output budget of one cell (--output-log-bytes).
    pub cell_log_bytes: u64,
    /// Sessions idle longer than this are ended (--session-ttl); none when zero.
    pub session_ttl: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(
        "session '{session}' is busy running cell {cell} ({secs:.1} s){waiting}; call python_wait to collect it, or python_wait with interrupt: true to stop it"
    )]
    Busy {
        session: String,
        cell: u64,
        secs: f64,
        waiting: String,
    },
    #[error(
        "no session named '{name}'; existing sessions: {existing}. python_exec creates a session on first use"
    )]
    NotFound { name: String, existing: String },
    #[error("invalid session name '{0}': use 1-64 letters, digits, '_', '-' or '.'")]
    BadName(String),
    #[error(
        "cannot create session '{name}': the limit of {limit} sessions is reached (--max-sessions); reuse a session or reset one"
    )]
    TooMany { name: String, limit: usize },
    #[error("session '{session}': {source}")]
    Worker {
        session: String,
        #[source]
        source: WorkerError,
    },
    #[error("session '{0}' has no running cell and no result waiting; run code with python_exec")]
    Idle(String),
    #[error(
        "session '{session}' is not waiting for input{detail}; python_wait's input only answers a pending input() (status waiting_input)"
    )]
    NotWaitingInput { session: String, detail: String },
    #[error("{0}")]
    Inspect(String),
    #[error("{0}")]
    Invalid(String),
    #[error(
        "session '{session}': {detail}; run a cell with python_exec first, or pass another cell number"
    )]
    NoOutput { session: String, detail: String },
    #[error("the server is shutting down")]
    ShuttingDown,
}

struct SessionState {
    worker: Option<Arc<Worker>>,
    next_cell: u64,
    cells_run: u64,
    running: Option<RunningCell>,
    /// A finished cell whose result no call has returned yet.
    completed: Option<CellReport>,
    /// The last finished result returned, kept until the next cell starts so
    /// that python_wait can give it again if its response was lost.
    delivered: Option<CellReport>,
    notes: Vec<String>,
    /// Images displayed after their cell had finished (by its threads).
    background_images: Images,
    /// Full output of recent finished cells, oldest first.
    logs: VecDeque<CellLog>,
    /// Finished cells, oldest first (bounded).
    history: VecDeque<HistoryEntry>,
    last_cell: u64,
    last_used: Instant,
}

pub struct Session {
    name: String,
    created: Instant,
    /// Interpreter, directory and environment of this session when they
    /// differ from the server's defaults (python_sessions create).
    spec: Option<Arc<LaunchSpec>>,
    state: Mutex<SessionState>,
    /// Serialises starting a worker for this session.
    start_lock: tokio::sync::Mutex<()>,
}

/// A row of `python_history`.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct HistoryEntry {
    pub cell: u64,
    /// The cell's code (truncated past 4000 characters).
    pub code: String,
    pub status: report::CellStatus,
    pub elapsed_ms: f64,
    /// The start of the cell's output (or its value, or its error).
    pub output_preview: String,
}

/// A row of `python_sessions`.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct SessionInfo {
    pub name: String,
    /// idle, busy, waiting_input, dead or starting.
    pub state: String,
    pub pid: Option<u32>,
    pub cells: u64,
    pub running_cell: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub uptime_s: f64,
    pub python: Option<String>,
}

impl Session {
    fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct SessionManager {
    spec: LaunchSpec,
    limits: Limits,
    sessions: Mutex<BTreeMap<String, Arc<Session>>>,
    spare: Mutex<Option<Arc<Worker>>>,
    shutting_down: AtomicBool,
    started: Instant,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl SessionManager {
    pub fn new(spec: LaunchSpec, limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            spec,
            limits,
            sessions: Mutex::new(BTreeMap::new()),
            spare: Mutex::new(None),
            shutting_down: AtomicBool::new(false),
            started: Instant::now(),
        })
    }

    fn sessions(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the default session and a spare worker without waiting.
    pub fn warm_up(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            match this.get_or_create(DEFAULT_SESSION) {
                Ok(sess) => {
                    if let Err(e) = this.ensure_worker(&sess).await {
                        tracing::warn!("could not start the default session: {e}");
                    }
                }
                Err(e) => tracing::warn!("could not create the default session: {e}"),
            }
        });
    }

    /// The wait window of a call: `requested` seconds (the tool's arguments
    /// checked them finite and not negative) clamped to `--max-wait`, or
    /// `--default-wait`. Total for any input: the clamp comes before the
    /// conversion, which would panic past `u64::MAX` seconds.
    pub fn wait_window(&self, requested: Option<f64>) -> Duration {
        wait_window(requested, self.limits.default_wait, self.limits.max_wait)
    }

    /// `--default-wait` and `--max-wait` in seconds, for the instructions.
    pub fn wait_bounds(&self) -> (f64, f64) {
        (
            self.limits.default_wait.as_secs_f64(),
            self.limits.max_wait.as_secs_f64(),
        )
    }

    fn get_or_create(&self, name: &str) -> Result<Arc<Session>, SessionError> {
        self.get_or_create_with(name, None)
    }

    /// Creates a session (with its own launch settings, if given) unless it exists.
    fn get_or_create_with(
        &self,
        name: &str,
        spec: Option<LaunchSpec>,
    ) -> Result<Arc<Session>, SessionError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(SessionError::ShuttingDown);
        }
        if !valid_name(name) {
            return Err(SessionError::BadName(name.to_string()));
        }
        let mut map = self.sessions();
        if let Some(s) = map.get(name) {
            s.lock().last_used = Instant::now();
            return Ok(s.clone());
        }
        if map.len() >= self.limits.max_sessions {
            return Err(SessionError::TooMany {
                name: name.to_string(),
                limit: self.limits.max_sessions,
            });
        }
        let sess = Arc::new(Session {
            name: name.to_string(),
            created: Instant::now(),
            spec: spec.map(Arc::new),
            state: Mutex::new(SessionState {
                worker: None,
                next_cell: 1,
                cells_run: 0,
                running: None,
                completed: None,
                delivered: None,
                notes: Vec::new(),
                background_images: Images::default(),
                logs: VecDeque::new(),
                history: VecDeque::new(),
                last_cell: 0,
                last_used: Instant::now(),
            }),
            start_lock: tokio::sync::Mutex::new(()),
        });
        map.insert(name.to_string(), sess.clone());
        Ok(sess)
    }

    fn existing(&self, name: &str) -> Result<Arc<Session>, SessionError> {
        let map = self.sessions();
        match map.get(name) {
            Some(s) => {
                s.lock().last_used = Instant::now();
                Ok(s.clone())
            }
            None => Err(SessionError::NotFound {
                name: name.to_string(),
                existing: if map.is_empty() {
                    "none".to_string()
                } else {
                    map.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            }),
        }
    }

    /// A ready worker: the spare if there is one, else a fresh launch.
    async fn acquire_worker(
        self: &Arc<Self>,
        custom: Option<&LaunchSpec>,
    ) -> Result<Arc<Worker>, WorkerError> {
        let timeout = self.limits.start_timeout;
        if let Some(spec) = custom {
            // Own settings: no spare can match them.
            let fresh = worker::launch(spec).await?;
            fresh.wait_ready(timeout).await?;
            return Ok(fresh);
        }
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner()).take();
        let worker = match spare {
            Some(w) if w.exit_info().is_none() => match w.wait_ready(timeout).await {
                Ok(_) => w,
                Err(_) => {
                    let fresh = worker::launch(&self.spec).await?;
                    fresh.wait_ready(timeout).await?;
                    fresh
                }
            },
            _ => {
                let fresh = worker::launch(&self.spec).await?;
                fresh.wait_ready(timeout).await?;
                fresh
            }
        };
        self.refill_spare();
        Ok(worker)
    }

    fn refill_spare(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            if this.shutting_down.load(Ordering::SeqCst) {
                return;
            }
            match worker::launch(&this.spec).await {
                Ok(w) => {
                    let old = this
                        .spare
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .replace(w.clone());
                    if let Some(old) = old {
                        old.kill();
                    }
                    if this.shutting_down.load(Ordering::SeqCst) {
                        w.kill();
                    }
                }
                Err(e) => tracing::debug!("spare worker not started: {e}"),
            }
        });
    }

    /// The session's live worker, starting one if it has none or it died.
    async fn ensure_worker(
        self: &Arc<Self>,
        sess: &Arc<Session>,
    ) -> Result<Arc<Worker>, SessionError> {
        let _guard = sess.start_lock.lock().await;
        {
            let mut st = sess.lock();
            self.refresh(sess, &mut st);
            if let Some(w) = &st.worker {
                match w.exit_info() {
                    None => return Ok(w.clone()),
                    Some(exit) => {
                        if st.running.is_none() {
                            if let Some(reason) = w.take_kill_reason() {
                                st.notes.push(reason);
                            }
                            let note = format!(
                                "The interpreter of session '{}' had exited ({}) after cell {}; its variables were lost. This cell runs in a fresh interpreter.",
                                sess.name,
                                exit.describe(),
                                st.last_cell
                            );
                            st.notes.push(note);
                        }
                        st.worker = None;
                    }
                }
            }
        }
        let worker = self
            .acquire_worker(sess.spec.as_deref())
            .await
            .map_err(|source| SessionError::Worker {
                session: sess.name.clone(),
                source,
            })?;
        if let Some(info) = worker.ready_info() {
            tracing::info!(session = %sess.name, pid = info.pid, python = %info.python_version, "session interpreter started");
        }
        sess.lock().worker = Some(worker.clone());
        Ok(worker)
    }

    /// Restarts a session's interpreter; all its state is cleared.
    pub async fn reset(self: &Arc<Self>, name: &str) -> Result<String, SessionError> {
        let sess = if is_default_name(name) {
            self.get_or_create(name)?
        } else {
            self.existing(name)?
        };
        let (old, stopped) = {
            let mut st = sess.lock();
            st.completed = None;
            st.delivered = None;
            st.notes.clear();
            let stopped = st.running.take().map(|r| r.number);
            (st.worker.take(), stopped)
        };
        if let Some(old) = old {
            old.kill();
        }
        let worker = self.ensure_worker(&sess).await?;
        sess.lock().notes.clear();
        let mut msg = format!(
            "Session '{}' was reset: a fresh interpreter (pid {}) is ready and all earlier variables are gone.",
            sess.name,
            worker.pid()
        );
        if let Some(cell) = stopped {
            msg.push_str(&format!(
                " Cell {cell}, which was still running, was stopped."
            ));
        }
        Ok(msg)
    }

    pub async fn inspect(
        self: &Arc<Self>,
        name: &str,
        target: Option<&str>,
    ) -> Result<Value, SessionError> {
        let sess = if is_default_name(name) {
            self.get_or_create(name)?
        } else {
            self.existing(name)?
        };
        let worker = self.ensure_worker(&sess).await?;
        let mut args = serde_json::Map::new();
        args.insert(
            "name".into(),
            target.map(Value::from).unwrap_or(Value::Null),
        );
        let reply = worker
            .control("inspect", args, self.limits.inspect_timeout)
            .await
            .map_err(|source| SessionError::Worker {
                session: sess.name.clone(),
                source,
            })?;
        if reply.get("ok").and_then(Value::as_bool) != Some(true) {
            let msg = reply
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("inspect failed");
            return Err(SessionError::Inspect(format!(
                "session '{}': {msg}; call python_inspect without a name to list the variables",
                sess.name
            )));
        }
        Ok(reply)
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        // One look at /proc for every session's memory.
        let snap = crate::sandbox::watch::Snapshot::take();
        sessions
            .iter()
            .map(|sess| {
                let mut st = sess.lock();
                self.refresh(sess, &mut st);
                let worker = st.worker.clone();
                let dead = worker.as_ref().is_some_and(|w| w.exit_info().is_some());
                let state = match (&worker, &st.running) {
                    (None, _) => "starting",
                    _ if dead => "dead",
                    (_, Some(r)) if r.prompt.is_some() => "waiting_input",
                    (_, Some(_)) => "busy",
                    _ => "idle",
                };
                SessionInfo {
                    name: sess.name.clone(),
                    state: state.to_string(),
                    pid: worker.as_ref().filter(|_| !dead).map(|w| w.pid()),
                    cells: st.cells_run,
                    running_cell: st.running.as_ref().map(|r| r.number),
                    memory_bytes: worker
                        .as_ref()
                        .filter(|_| !dead)
                        .and_then(|w| w.rss_bytes(&snap)),
                    uptime_s: sess.created.elapsed().as_secs_f64(),
                    python: worker
                        .as_ref()
                        .and_then(|w| w.ready_info())
                        .map(|i| format!("{} ({})", i.executable, i.python_version)),
                }
            })
            .collect()
    }

    /// Ends every worker (whole process groups) and refuses new work.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        let mut workers: Vec<Arc<Worker>> = self
            .sessions()
            .values()
            .filter_map(|s| s.lock().worker.clone())
            .collect();
        if let Some(spare) = self.spare.lock().unwrap_or_else(|e| e.into_inner()).take() {
            workers.push(spare);
        }
        for w in &workers {
            w.kill();
        }
        for w in &workers {
            let mut rx = w.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while w.exit_info().is_none() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
        }
    }
}

/// See [`SessionManager::wait_window`].
fn wait_window(requested: Option<f64>, default: Duration, max: Duration) -> Duration {
    match requested {
        Some(s) if s.is_finite() && s >= 0.0 => {
            if s >= max.as_secs_f64() {
                max
            } else {
                Duration::try_from_secs_f64(s).map_or(max, |d| d.min(max))
            }
        }
        _ => default,
    }
}

#[cfg(test)]
mod wait_window_tests {
    use super::*;

    #[test]
    fn wait_windows_are_clamped_before_conversion() {
        let (default, max) = (Duration::from_secs(30), Duration::from_secs(600));
        let w = |s| wait_window(s, default, max);
        assert_eq!(w(None), default);
        assert_eq!(w(Some(1.5)), Duration::from_millis(1500));
        assert_eq!(w(Some(-0.0)), Duration::ZERO);
        assert_eq!(w(Some(1e300)), max);
        assert_eq!(w(Some(f64::MAX)), max);
        assert_eq!(w(Some(u64::MAX as f64 * 2.0)), max);
        assert_eq!(w(Some(f64::NAN)), default);
        assert_eq!(w(Some(f64::INFINITY)), default);
        assert_eq!(w(Some(-1.0)), default);
        let huge_max = Duration::MAX;
        assert_eq!(wait_window(Some(1e300), default, huge_max), huge_max);
    }
}
