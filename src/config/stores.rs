//! Where sessions are kept across restarts and the bounds on keeping and
//! rebuilding them (--state-dir, --resume and the --state-*/--resume-*
//! flags), checked once at start so that a bad value is refused before any
//! tenant's first request.

use std::path::PathBuf;
use std::time::Duration;

use super::Flags;
use crate::units::seconds;

/// The stores' settings, ready for `tenants::store::open`.
#[derive(Debug, Clone)]
pub struct Stores {
    /// The directory as named by --state-dir, or its default, whatever
    /// --resume says (the uid table's key uses it); nothing is created.
    pub named_dir: Option<PathBuf>,
    /// The operator named it: a directory that fails its checks is refused
    /// rather than warned about.
    pub named: bool,
    /// --resume on.
    pub keep: bool,
    /// --resume-max-cells, --resume-max-seconds.
    pub resume_max_cells: usize,
    pub resume_max_time: Duration,
    /// --state-max-cells: cells kept per session's tree.
    pub max_cells: usize,
    /// --checkpoints, --checkpoint-min-ms.
    pub checkpoints: usize,
    pub checkpoint_min: Duration,
    /// --state-keep-days: an unused store is removed after this long.
    pub keep_unused: Duration,
    /// Sessions one store keeps (four times --max-sessions).
    pub max_sessions: usize,
    /// --state-max-mb: the store's size, and one saved state's and all
    /// saved states' together.
    pub max_bytes: u64,
    /// Each stdio server is a new conversation (over HTTP the token's
    /// shared default keeps its name across restarts).
    pub new_conversation: bool,
}

impl Stores {
    pub fn from_flags(flags: &Flags) -> anyhow::Result<Self> {
        Ok(Self {
            named_dir: flags.state_dir.clone().or_else(default_dir),
            named: flags.state_dir.is_some(),
            keep: flags.resume != "off",
            resume_max_cells: flags.resume_max_cells.max(1),
            resume_max_time: seconds(flags.resume_max_seconds, "--resume-max-seconds")?,
            max_cells: flags.state_max_cells.max(1),
            checkpoints: flags.checkpoints,
            checkpoint_min: Duration::from_secs_f64(
                flags.checkpoint_min_ms.clamp(0.0, 86_400_000.0) / 1000.0,
            ),
            keep_unused: seconds(flags.state_keep_days * 86400.0, "--state-keep-days")?,
            max_sessions: flags.max_sessions.max(1).saturating_mul(4),
            max_bytes: flags.state_max_mb.max(1).saturating_mul(1 << 20),
            new_conversation: flags.http.is_none(),
        })
    }

    /// Where the stores live when sessions are kept (nothing is created).
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.named_dir.as_deref().filter(|_| self.keep)
    }
}

/// $XDG_STATE_HOME/ferrepl, else ~/.local/state/ferrepl.
fn default_dir() -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| {
        let p = PathBuf::from(v);
        p.is_absolute().then_some(p)
    };
    std::env::var_os("XDG_STATE_HOME")
        .and_then(absolute)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(absolute)
                .map(|h| h.join(".local/state"))
        })
        .map(|d| d.join("ferrepl"))
}
