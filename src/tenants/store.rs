//! The store that keeps a tenant's sessions across restarts: one SQLite
//! file per (workspace, tenant) in the state directory.

use crate::config::Config;
use crate::session;

/// The store that keeps sessions across restarts (--state-dir, --resume).
/// Sessions work without it: a store that cannot be used is a warning,
/// unless the operator named its directory.
pub fn open(
    cfg: &Config,
    workdir: &std::path::Path,
    principal: &str,
) -> anyhow::Result<session::Durability> {
    use crate::store::{Opened, Store, StoreConfig};
    let mut durable = session::Durability::off();
    durable.max_cells = cfg.resume_max_cells.max(1);
    durable.new_conversation = cfg.http.is_none();
    durable.max_tree = cfg.state_max_cells.max(1);
    durable.checkpoints = cfg.checkpoints;
    durable.checkpoint_min =
        std::time::Duration::from_secs_f64(cfg.checkpoint_min_ms.clamp(0.0, 86_400_000.0) / 1000.0);
    durable.max_time = crate::units::seconds(cfg.resume_max_seconds, "--resume-max-seconds")?;
    if cfg.resume == "off" {
        return Ok(durable);
    }
    let Some(dir) = cfg.state_dir.clone().or_else(default_state_dir) else {
        tracing::warn!(
            "sessions are not kept across restarts: no HOME or XDG_STATE_HOME; pass --state-dir"
        );
        return Ok(durable);
    };
    let keep = crate::units::seconds(cfg.state_keep_days * 86400.0, "--state-keep-days")?;
    let opened = Store::open(&StoreConfig {
        dir,
        workspace: workdir.to_path_buf(),
        principal: principal.into(),
        max_cells_per_session: cfg.state_max_cells.max(1),
        keep,
        max_sessions: cfg.max_sessions.max(1) * 4,
        max_bytes: cfg.state_max_mb.max(1).saturating_mul(1 << 20),
    });
    match opened {
        Ok(Opened::Ready(store)) => {
            tracing::info!(
                "sessions of {principal} are kept across restarts in {}",
                store.path().display()
            );
            durable.states = store.states();
            durable.state_cap = cfg.state_max_mb.max(1).saturating_mul(1 << 20);
            durable.store = Some(store);
        }
        Ok(Opened::Locked { path, holder_pid }) => {
            let holder =
                holder_pid.map_or_else(|| "pid unknown".to_string(), |p| format!("pid {p}"));
            tracing::warn!(
                "another ferrepl ({holder}) keeps this workspace's sessions in {}; this server's sessions are not kept across restarts",
                path.display()
            );
            durable.unkept = Some(format!(
                "Another ferrepl ({holder}) keeps this workspace's sessions and their saved states; this server's sessions are not kept across restarts, and it leaves the other's alone."
            ));
        }
        Err(e) if cfg.state_dir.is_some() => {
            return Err(anyhow::anyhow!("--state-dir: {e}"));
        }
        Err(e) => tracing::warn!("sessions are not kept across restarts: {e}"),
    }
    Ok(durable)
}

/// $XDG_STATE_HOME/ferrepl, else ~/.local/state/ferrepl.
fn default_state_dir() -> Option<std::path::PathBuf> {
    let absolute = |v: std::ffi::OsString| {
        let p = std::path::PathBuf::from(v);
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

/// The state directory as named (or its default), whatever --resume says
/// (nothing is created).
pub fn named_dir(cfg: &Config) -> Option<std::path::PathBuf> {
    cfg.state_dir.clone().or_else(default_state_dir)
}

/// Where the stores live (nothing is created).
pub fn dir_path(cfg: &Config) -> Option<std::path::PathBuf> {
    if cfg.resume == "off" {
        return None;
    }
    cfg.state_dir.clone().or_else(default_state_dir)
}

/// The directory the stores live in, created (0700) and checked now (not a
/// link, this user's, not writable by others), before anything is written
/// there and so that start-up can hide it from every session. Its path
/// with no link in it; None when sessions are not kept. A default one that
/// fails the checks keeps nothing (a warning); a named one is refused.
pub fn dir(cfg: &Config) -> anyhow::Result<Option<std::path::PathBuf>> {
    let Some(dir) = dir_path(cfg) else {
        return Ok(None);
    };
    match crate::store::check_state_dir(&dir) {
        Ok(real) => Ok(Some(real)),
        Err(e) if cfg.state_dir.is_some() => Err(anyhow::anyhow!("--state-dir: {e}")),
        Err(e) => {
            tracing::warn!("sessions are not kept across restarts: {e}");
            Ok(None)
        }
    }
}
