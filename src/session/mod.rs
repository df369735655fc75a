//! Named sessions, each backed by one worker process at a time.
//!
//! Results are pulled, not pushed: worker events wait in the worker's queue
//! until a call (exec, wait, input, interrupt, sessions) looks at the session,
//! so a cell that finishes while nobody waits keeps its result for the next
//! call. Every wait here is bounded and async.

mod cells;
mod checkpoints;
pub mod clients;
mod control;
mod durable;
mod export;
pub mod gate;
mod hints;
mod limits;
mod pool;
mod rebuild;
mod registry;
pub mod report;
mod resume;
mod saved;
mod source;
mod stored;
pub mod view;

use cells::RunningCell;
pub use durable::{Durability, ranges as id_ranges};
pub use export::{Export, ExportFormat};
pub use registry::SessionOptions;
pub use source::{CellSource, StoredSource};

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::output::log::CellLog;
use crate::worker::{self, Language, LaunchSpec, Worker, WorkerError};
use report::{CellReport, Images};

pub const DEFAULT_SESSION: &str = "default";
/// R's shared default session; a client's own is `r-N` beside `default-N`.
pub const DEFAULT_R_SESSION: &str = "r";

/// The language of a default session name (the shared one, or a client's
/// own under `--default-session per-client`): those exist as soon as they
/// are named, so inspecting or resetting one never fails as unknown.
pub fn default_language(name: &str) -> Option<Language> {
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if name == DEFAULT_SESSION || numbered("default-") {
        Some(Language::Python)
    } else if name == DEFAULT_R_SESSION || numbered("r-") {
        Some(Language::R)
    } else {
        None
    }
}

pub fn is_default_name(name: &str) -> bool {
    default_language(name).is_some()
}

/// The default session of `lang` that goes with Python's default `python_default`.
pub fn default_for(lang: Language, python_default: &str) -> String {
    match lang {
        Language::Python => python_default.to_string(),
        Language::R => match python_default.strip_prefix("default-") {
            Some(n) => format!("r-{n}"),
            None => DEFAULT_R_SESSION.to_string(),
        },
    }
}

/// Bounds on sessions and waits; see the configuration table in README.md.
#[derive(Debug, Clone)]
pub struct Limits {
    pub default_wait: Duration,
    pub max_wait: Duration,
    pub start_timeout: Duration,
    pub max_sessions: usize,
    /// `max_sessions` is a tenant's share (--tenant-max-sessions), not the
    /// instance's limit: said in the refusal.
    pub sessions_share: bool,
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
    /// Python workers kept started ahead of need (--warm-pool).
    pub warm_pool: usize,
    /// Cells reach no network (sandboxed, --network packages or off): a
    /// cell that fails to reach a host is told why.
    pub cells_offline: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(
        "session '{session}' is busy running cell {cell} ({secs:.1} s){waiting}; call {wait} to collect it, or {wait} with interrupt: true to stop it",
        wait = .lang.wait_tool()
    )]
    Busy {
        lang: Language,
        session: String,
        cell: u64,
        secs: f64,
        waiting: String,
    },
    #[error(
        "no session named '{name}'; existing sessions: {existing}. python_exec or r_exec creates a session on first use"
    )]
    NotFound { name: String, existing: String },
    #[error(
        "session '{session}' is {has} session; {wanted} tools cannot use it. Pass another session name (omit it for {wanted}'s default, '{default}')",
        has = .has.with_article(),
        default = default_for(*.wanted, DEFAULT_SESSION)
    )]
    WrongLanguage {
        session: String,
        has: Language,
        wanted: Language,
    },
    #[error(
        "{0} sessions are not enabled on this server; the operator can add them with --languages python,r"
    )]
    LanguageOff(Language),
    #[error("invalid session name '{0}': use 1-64 letters, digits, '_', '-' or '.'")]
    BadName(String),
    #[error(
        "cannot create session '{name}': {whose} {limit} sessions, {limit_name}; reuse, reset or delete a session (python_sessions list), or retry later",
        whose = if *.share { "this tenant holds" } else { "this server holds" },
        limit_name = if *.share { "its share of the instance (--tenant-max-sessions)" } else { "its limit (--max-sessions)" }
    )]
    TooMany {
        name: String,
        limit: usize,
        share: bool,
    },
    #[error("session '{session}': {source}")]
    Worker {
        session: String,
        #[source]
        source: WorkerError,
    },
    #[error(
        "session '{1}' has no running cell and no result waiting; run code with {exec}",
        exec = .0.exec_tool()
    )]
    Idle(Language, String),
    #[error(
        "session '{session}' is not waiting for input{detail}; {wait}'s input only answers a pending {call} (status waiting_input)",
        wait = .lang.wait_tool(),
        call = .lang.input_call()
    )]
    NotWaitingInput {
        lang: Language,
        session: String,
        detail: String,
    },
    #[error("{0}")]
    Inspect(String),
    /// A rebuild runs: what it re-runs and how to follow or stop it.
    #[error("{0}")]
    Rebuilding(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Env(#[from] crate::sandbox::env::EnvError),
    #[error(
        "session '{session}': {detail}; run a cell with {exec} first, or pass another cell number",
        exec = .lang.exec_tool()
    )]
    NoOutput {
        lang: Language,
        session: String,
        detail: String,
    },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Refused(#[from] gate::Refusal),
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
    /// The cells whose effects the interpreter holds, oldest first: what a
    /// rebuild re-runs, and where the next cell's parent comes from.
    path: Vec<durable::PathCell>,
    path_bytes: usize,
    /// Its oldest cells were dropped (bounds), so it cannot be rebuilt whole.
    path_cut: bool,
    /// Why the interpreter does not hold the path (dormant, crashed, a
    /// branch to rebuild).
    pending: Option<durable::Pending>,
    /// Finished cells by id, each with its parent: the branches (bounded).
    tree: BTreeMap<u64, durable::PathCell>,
    /// The frozen copies the live interpreter holds.
    checkpoints: checkpoints::Checkpoints,
    /// Cells at the start of the path the interpreter holds already (a
    /// rebuild after resuming an ancestor's checkpoint re-runs the rest).
    skip: usize,
    /// Recent cells' outputs, values and images, for exports (bounded).
    kept: export::KeptResults,
    /// A rebuild under way (a task of its own), and the cell queued after it.
    rebuild: Option<resume::Rebuilding>,
    /// The last rebuild's id, account, and whether a cell was queued after it.
    rebuilt: Option<(u64, String, bool)>,
    /// The last cell whose state is saved (saved.rs): none to save until
    /// another cell runs.
    saved_cell: Option<u64>,
}

impl SessionState {
    fn fresh() -> Self {
        SessionState {
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
            path: Vec::new(),
            path_bytes: 0,
            path_cut: false,
            pending: None,
            tree: BTreeMap::new(),
            checkpoints: checkpoints::Checkpoints::default(),
            skip: 0,
            kept: export::KeptResults::default(),
            rebuild: None,
            rebuilt: None,
            saved_cell: None,
        }
    }
}

pub struct Session {
    name: String,
    language: Language,
    created: Instant,
    /// Interpreter, directory and environment of this session when they
    /// differ from the server's defaults (python_sessions create).
    spec: Option<Arc<LaunchSpec>>,
    /// The options it was created with, as the store keeps them.
    options: Option<SessionOptions>,
    /// Set when a stored session's options are refused by the current
    /// policy: it cannot be resumed.
    refused: Option<String>,
    state: Mutex<SessionState>,
    /// Serialises starting a worker (or a rebuild) for this session.
    start_lock: tokio::sync::Mutex<()>,
    /// Bumped when a rebuild ends, for calls waiting on the session.
    changed: tokio::sync::watch::Sender<u64>,
}

/// A row of `python_history`.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct HistoryEntry {
    pub cell: u64,
    /// The cell whose state it ran on (none: a fresh interpreter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<u64>,
    /// On the branch the interpreter holds now.
    pub current: bool,
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
    /// idle, busy, waiting_input, dead, starting, dormant (kept from
    /// before a restart; its first use rebuilds it), or rebuilding.
    pub state: String,
    pub pid: Option<u32>,
    pub cells: u64,
    pub running_cell: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub uptime_s: f64,
    pub language: Language,
    /// The interpreter's path and version.
    pub interpreter: Option<String>,
}

impl Session {
    fn new(
        name: &str,
        language: Language,
        spec: Option<LaunchSpec>,
        options: Option<SessionOptions>,
    ) -> Self {
        Session {
            name: name.to_string(),
            language,
            created: Instant::now(),
            spec: spec.map(Arc::new),
            options,
            refused: None,
            state: Mutex::new(SessionState::fresh()),
            start_lock: tokio::sync::Mutex::new(()),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the calls waiting on this session (see `SessionManager::watch`).
    fn touch(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

pub struct SessionManager {
    spec: LaunchSpec,
    /// False when --languages leaves Python out: no Python session (and no
    /// pooled worker) is ever started.
    python_on: bool,
    /// How R sessions start; None when R is not enabled (--languages).
    r_spec: Option<LaunchSpec>,
    limits: Limits,
    durable: Durability,
    sessions: Mutex<BTreeMap<String, Arc<Session>>>,
    pool: Arc<pool::WarmPool>,
    /// While the default sessions start: the pool is not filled yet
    /// (warm_up starts it).
    warming: AtomicBool,
    shutting_down: AtomicBool,
    started: Instant,
    /// Draining, the instance's session budget, the workspace quota.
    gate: Arc<gate::TenantGate>,
    /// Stored sessions not brought back at start (no room): one comes back
    /// when its name is next used, instead of a fresh session overwriting
    /// its stored cells.
    left_stored: Mutex<std::collections::BTreeSet<String>>,
    /// Per-client default sessions whose client is gone.
    gone: clients::GoneClients,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl SessionManager {
    pub fn new(
        spec: LaunchSpec,
        python_on: bool,
        r_spec: Option<LaunchSpec>,
        limits: Limits,
        durable: Durability,
        gate: Arc<gate::TenantGate>,
    ) -> Arc<Self> {
        let pool = Arc::new(pool::WarmPool::new(
            limits.warm_pool,
            limits.start_timeout,
            gate.instance.clone(),
        ));
        let manager = Self {
            spec,
            python_on,
            r_spec,
            limits,
            durable,
            sessions: Mutex::new(BTreeMap::new()),
            pool,
            warming: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            started: Instant::now(),
            gate,
            left_stored: Mutex::new(Default::default()),
            gone: Default::default(),
        };
        let manager = Arc::new(manager);
        let stored = manager.read_stored();
        manager
            .gate
            .instance
            .register(&manager, |room| manager.add_stored(stored, room));
        manager
    }

    fn sessions(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How sessions of `lang` start, if that language is enabled.
    pub(super) fn spec_for(&self, lang: Language) -> Option<&LaunchSpec> {
        match lang {
            Language::Python => self.python_on.then_some(&self.spec),
            Language::R => self.r_spec.as_ref(),
        }
    }

    /// The language of a session created without one: Python unless it is off.
    pub fn first_language(&self) -> Language {
        if self.python_on || self.r_spec.is_none() {
            Language::Python
        } else {
            Language::R
        }
    }

    /// Refuses a session of another language than the tool's (a session
    /// that does not exist yet is fine: the tool creates it).
    pub fn check_language(&self, name: &str, lang: Language) -> Result<(), SessionError> {
        if self.spec_for(lang).is_none() {
            return Err(SessionError::LanguageOff(lang));
        }
        let has = match self.sessions().get(name) {
            Some(s) => s.language,
            None => default_language(name).unwrap_or(lang),
        };
        if has != lang {
            return Err(SessionError::WrongLanguage {
                session: name.to_string(),
                has,
                wanted: lang,
            });
        }
        Ok(())
    }
}

/// See [`SessionManager::wait_window`]; the default is bounded by `max` too.
fn wait_window(requested: Option<f64>, default: Duration, max: Duration) -> Duration {
    match requested {
        Some(s) if s.is_finite() && s >= 0.0 => {
            if s >= max.as_secs_f64() {
                max
            } else {
                Duration::try_from_secs_f64(s).map_or(max, |d| d.min(max))
            }
        }
        _ => default.min(max),
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
        let small_max = Duration::from_secs(2);
        assert_eq!(wait_window(None, default, small_max), small_max);
        let huge_max = Duration::MAX;
        assert_eq!(wait_window(Some(1e300), default, huge_max), huge_max);
    }
}
