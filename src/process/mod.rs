//! The processes ferrepl starts: Python workers, shell jobs and package
//! installs. Every one is started, watched and ended here, the same way:
//! under the sandbox launcher (which sets the parent-death signal, moves
//! itself into the process's cgroups and applies the policy) when the
//! sandbox is on; as the leader of a session of its own, so also of its own
//! process group; with exactly the environment its policy gives it.
//!
//! `spawn` starts one (`spawn.rs`); its owner keeps the [`Process`], waits
//! for the child's exit with [`Process::wait`] (which never reaps it while a
//! signal is on its way to its pid), records it with [`ExitInfo::now`],
//! cleans up with [`Process::remove_home`] and [`release`] (`exit.rs`), and
//! ends it with [`Process::signal_group`] and [`Process::kill_all`]
//! (`kill.rs`).

mod exit;
mod kill;
mod spawn;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use crate::sandbox::cgroup::Cgroup;

pub use exit::{ExitInfo, release};
pub use spawn::{CONTROL_FD, Input, Launch, Output, Spawned, Stdio, spawn};

/// A started process and what it owns until it exits.
#[derive(Debug)]
pub struct Process {
    /// The process ferrepl started: the program itself, or the sandbox
    /// launcher above it. It leads its session and process group.
    pid: u32,
    /// Its private temporary directory (HOME, TMPDIR) under the sandbox.
    home: Option<PathBuf>,
    /// Its cgroups (kernel-enforced limits), until it exits.
    cgroup: Mutex<Option<Arc<Cgroup>>>,
    /// True once it is reaped: its pid may then name another process, so
    /// nothing is sent to it. Signals are sent under the read lock, the
    /// reap happens under the write lock ([`Process::wait`]).
    reaped: RwLock<bool>,
}

impl Process {
    /// The pid of the process ferrepl started (0 if it was never known).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Held while a signal goes to its pid: it is not reaped meanwhile.
    fn unreaped(&self) -> RwLockReadGuard<'_, bool> {
        self.reaped.read().unwrap_or_else(|e| e.into_inner())
    }

    fn cgroup(&self) -> MutexGuard<'_, Option<Arc<Cgroup>>> {
        self.cgroup.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A kernel limit (memory) its cgroups reached, while it runs.
    pub fn limit_hit(&self) -> Option<String> {
        let group = self.cgroup().clone()?;
        group.limit_hit()
    }
}
