//! The settings a session manager runs by, from the command line: the
//! bounds on sessions, cells and waits (`Limits`), and how sessions
//! outlive their interpreter and the server (`Durability`).

use std::time::Duration;

use crate::store::{StatesDir, Store};

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
    /// --sandbox inherit: each call that runs code brings the client's
    /// sandbox policy, which narrows the launch settings' sandbox.
    pub client_sandbox: bool,
}

/// How sessions survive: the store (None with --resume off, or when another
/// server holds this workspace's store) and the bounds on rebuilding.
pub struct Durability {
    pub store: Option<Store>,
    /// --resume-max-cells: the most cells one rebuild re-runs.
    pub max_cells: usize,
    /// --resume-max-seconds: how long one rebuild may take.
    pub max_time: Duration,
    /// --state-max-cells: cells of a session's tree kept (for branching).
    pub max_tree: usize,
    /// --checkpoints: frozen copies kept per Python session (0: none).
    pub checkpoints: usize,
    /// --checkpoint-min-ms: cells quicker than this get no copy.
    pub checkpoint_min: Duration,
    /// Where saved states are kept (beside the store; None without one).
    pub states: Option<std::sync::Arc<StatesDir>>,
    /// --state-max-mb: one saved state, and all of them together.
    pub state_cap: u64,
    /// Why sessions are not kept across restarts though --resume is on
    /// (another server holds the store): said in the default session's
    /// first result.
    pub unkept: Option<String>,
    /// Each server is a new conversation (stdio: a client starts one per
    /// conversation): the stored default sessions come back renamed
    /// `earlier-*` and `default` starts fresh. Over HTTP the token's
    /// shared `default` stays itself across restarts.
    pub new_conversation: bool,
}

impl Durability {
    pub fn off() -> Self {
        Self {
            store: None,
            max_cells: 200,
            max_time: Duration::from_secs(120),
            max_tree: 1000,
            checkpoints: 0,
            checkpoint_min: Duration::from_millis(100),
            states: None,
            state_cap: 512 << 20,
            unkept: None,
            new_conversation: true,
        }
    }
}

/// See `SessionManager::wait_window` (limits.rs); the default is bounded by `max` too.
pub(super) fn wait_window(requested: Option<f64>, default: Duration, max: Duration) -> Duration {
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
mod tests {
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
