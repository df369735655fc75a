//! The store that keeps a tenant's sessions across restarts: one SQLite
//! file per (workspace, tenant) in the state directory.

use crate::config::stores::Stores;
use crate::session;

/// The store that keeps sessions across restarts (--state-dir, --resume).
/// Sessions work without it: a store that cannot be used is a warning,
/// unless the operator named its directory.
pub fn open(
    stores: &Stores,
    workdir: &std::path::Path,
    principal: &str,
) -> anyhow::Result<session::Durability> {
    use crate::store::{Opened, Store, StoreConfig};
    let mut durable = session::Durability::off();
    durable.max_cells = stores.resume_max_cells;
    durable.new_conversation = stores.new_conversation;
    durable.max_tree = stores.max_cells;
    durable.checkpoints = stores.checkpoints;
    durable.checkpoint_min = stores.checkpoint_min;
    durable.max_time = stores.resume_max_time;
    if !stores.keep {
        return Ok(durable);
    }
    let Some(dir) = stores.dir() else {
        tracing::warn!(
            "sessions are not kept across restarts: no HOME or XDG_STATE_HOME; pass --state-dir"
        );
        return Ok(durable);
    };
    let opened = Store::open(&StoreConfig {
        dir: dir.to_path_buf(),
        workspace: workdir.to_path_buf(),
        principal: principal.into(),
        max_cells_per_session: stores.max_cells,
        keep: stores.keep_unused,
        max_sessions: stores.max_sessions,
        max_bytes: stores.max_bytes,
    });
    match opened {
        Ok(Opened::Ready(store)) => {
            tracing::info!(
                "sessions of {principal} are kept across restarts in {}",
                store.path().display()
            );
            durable.states = store.states();
            durable.state_cap = stores.max_bytes;
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
        Err(e) if stores.named => {
            return Err(anyhow::anyhow!("--state-dir: {e}"));
        }
        Err(e) => tracing::warn!("sessions are not kept across restarts: {e}"),
    }
    Ok(durable)
}

/// The directory the stores live in, created (0700) and checked now (not a
/// link, this user's, not writable by others), before anything is written
/// there and so that start-up can hide it from every session. Its path
/// with no link in it; None when sessions are not kept. A default one that
/// fails the checks keeps nothing (a warning); a named one is refused.
pub fn dir(stores: &Stores) -> anyhow::Result<Option<std::path::PathBuf>> {
    let Some(dir) = stores.dir() else {
        return Ok(None);
    };
    match crate::store::check_state_dir(dir) {
        Ok(real) => Ok(Some(real)),
        Err(e) if stores.named => Err(anyhow::anyhow!("--state-dir: {e}")),
        Err(e) => {
            tracing::warn!("sessions are not kept across restarts: {e}");
            Ok(None)
        }
    }
}
