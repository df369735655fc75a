//! A session: its name, language and launch settings, and its state
//! behind one lock, in parts that each own their concern: the worker, the
//! inbox of cells (`inbox.rs`), what is kept of finished cells
//! (`kept.rs`), the lineage of cells (`lineage.rs`), the interpreter's
//! checkpoints (`checkpoints.rs`) and the lifecycle (`lifecycle.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::checkpoints::Checkpoints;
use super::error::SessionError;
use super::foreign_shown::ForeignShown;
use super::inbox::{Inbox, RunningCell};
use super::kept::KeptOutput;
use super::lifecycle::{Lifecycle, Rebuilding, rebuilding_error};
use super::lineage::Lineage;
use crate::worker::{Language, LaunchSpec, Worker};

/// What a session holds, behind its lock.
pub(super) struct SessionState {
    pub(super) worker: Option<Arc<Worker>>,
    pub(super) inbox: Inbox,
    /// Notes for the agent's next result.
    pub(super) notes: Vec<String>,
    pub(super) kept: KeptOutput,
    pub(super) last_used: Instant,
    pub(super) lineage: Lineage,
    /// The frozen copies the live interpreter holds.
    pub(super) checkpoints: Checkpoints,
    pub(super) lifecycle: Lifecycle,
    /// --sandbox inherit: the client's policy the session runs under (set
    /// by the last call that ran code), and the one its worker was
    /// launched under.
    pub(super) client: Option<Arc<crate::sandbox::client::Narrowed>>,
    pub(super) worker_under: Option<String>,
    /// Other clients' cells as the live viewer shows them (`foreign.rs`).
    pub(super) foreign_shown: ForeignShown,
}

impl SessionState {
    pub(super) fn fresh() -> Self {
        SessionState {
            worker: None,
            inbox: Inbox::default(),
            notes: Vec::new(),
            kept: KeptOutput::default(),
            last_used: Instant::now(),
            lineage: Lineage::default(),
            checkpoints: Checkpoints::default(),
            lifecycle: Lifecycle::default(),
            client: None,
            worker_under: None,
            foreign_shown: ForeignShown::default(),
        }
    }

    /// The last cell of the path the interpreter holds.
    pub(super) fn head(&self) -> Option<u64> {
        self.lineage.head()
    }

    /// A fresh interpreter holds no path, and nothing is pending.
    pub(super) fn clear_path(&mut self) {
        self.lineage.clear();
        self.lifecycle.clear_pending();
    }

    /// The session's state as `python_sessions` lists it and the metrics
    /// count it (one of `report::SESSION_STATES`).
    pub(super) fn summary(&self) -> &'static str {
        let worker = self.worker.as_ref();
        let dead = worker.is_some_and(|w| w.exit_info().is_some());
        if self.lifecycle.is_rebuilding() {
            return "rebuilding";
        }
        match (worker, &self.inbox.running) {
            (_, None) if self.lifecycle.is_dormant() => "dormant",
            (None, _) => "starting",
            _ if dead => "dead",
            (_, Some(r)) if r.prompt.is_some() => "waiting_input",
            (_, Some(_)) => "busy",
            _ => "idle",
        }
    }
}

pub struct Session {
    pub(super) name: String,
    pub(super) language: Language,
    pub(super) created: Instant,
    /// Interpreter, directory and environment of this session when they
    /// differ from the server's defaults (python_sessions create).
    pub(super) spec: Option<Arc<LaunchSpec>>,
    /// The options it was created with, as the store keeps them.
    pub(super) options: Option<SessionOptions>,
    /// Set when a stored session's options are refused by the current
    /// policy: it cannot be resumed, and this is the refusal its calls get.
    pub(super) refused: Option<String>,
    pub(super) state: Mutex<SessionState>,
    /// Serialises starting a worker (or a rebuild) for this session.
    pub(super) start_lock: tokio::sync::Mutex<()>,
    /// Bumped when a rebuild ends, for calls waiting on the session.
    pub(super) changed: tokio::sync::watch::Sender<u64>,
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
    /// python or r; on a kernel of another language, the kernel's own
    /// (its kernelspec's `language`, e.g. bash).
    pub language: String,
    /// The interpreter's path and version.
    pub interpreter: Option<String>,
    /// The Jupyter kernel it runs on (--kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
}

impl Session {
    /// The Jupyter kernel it runs on, if any (--kernels); a stored one's
    /// even when this server no longer offers it.
    pub(super) fn kernel(&self) -> Option<&str> {
        self.spec
            .as_ref()
            .and_then(|s| s.kernel.as_ref())
            .map(|k| k.name.as_str())
            .or_else(|| self.options.as_ref()?.kernel.as_deref())
    }

    /// The language it speaks as listed: its kernel's own when that is
    /// neither Python nor R (its cells are routed as Python's).
    pub(super) fn listed_language(&self) -> String {
        self.spec
            .as_ref()
            .and_then(|s| s.kernel.as_ref()?.other_language.clone())
            .unwrap_or_else(|| self.language.key().to_string())
    }

    pub(super) fn new(
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

    pub(super) fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the calls waiting on this session (see `SessionManager::watch`).
    pub(super) fn touch(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The state of a session not shared yet (being built).
    pub(super) fn state_mut(&mut self) -> &mut SessionState {
        self.state.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// Why a call that needs the interpreter idle cannot run now: a rebuild
    /// under way, or a running cell.
    pub(super) fn busy_now(&self, st: &SessionState) -> Option<SessionError> {
        if let Some(rb) = st.lifecycle.rebuild() {
            return Some(self.rebuilding_error(rb));
        }
        st.inbox.running.as_ref().map(|run| self.busy(run))
    }

    pub(super) fn busy(&self, run: &RunningCell) -> SessionError {
        let wait = self.language.wait_tool();
        SessionError::Busy {
            lang: self.language,
            session: self.name.clone(),
            cell: run.number,
            secs: run.started.elapsed().as_secs_f64(),
            waiting: match &run.prompt {
                Some((p, _)) => {
                    format!(
                        " and is waiting for input (prompt {p:?}); answer it with {wait} {{input: ...}}"
                    )
                }
                None => String::new(),
            },
        }
    }

    /// The refusal of a call that cannot run while `rb` runs.
    pub(super) fn rebuilding_error(&self, rb: &Rebuilding) -> SessionError {
        rebuilding_error(&self.name, self.language, rb)
    }
}

/// Settings of a session created with python_sessions create (kept in the
/// store, and checked again against the policy when it is resumed).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SessionOptions {
    pub python: Option<PathBuf>,
    pub venv: Option<PathBuf>,
    pub workdir: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub language: Language,
    /// The installed Jupyter kernel it runs on (--kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
}

impl SessionOptions {
    /// No settings of its own (a default session, or one created plain).
    pub(super) fn is_plain(&self) -> bool {
        self.python.is_none()
            && self.venv.is_none()
            && self.workdir.is_none()
            && self.env.is_empty()
            && self.kernel.is_none()
    }
}
