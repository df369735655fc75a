//! Ending a process and everything it started.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::Process;

impl Process {
    /// Sends `signal` to the process group it leads.
    pub fn signal_group(&self, signal: Signal) {
        if self.pid > 0 {
            let _ = killpg(Pid::from_raw(self.pid as i32), signal);
        }
    }

    /// SIGKILL to its process group and to every descendant, so children
    /// that left the group (`setsid`, daemons) go too; and to every member
    /// of its cgroups. `running`: its owner has not seen it exit yet (after
    /// that its pid is no longer its own).
    pub fn kill_all(&self, running: bool) {
        let cgroup = self.cgroup().clone();
        if self.pid > 0 && running {
            crate::sandbox::watch::kill_tree(self.pid);
        }
        if let Some(group) = cgroup {
            group.kill_all();
        }
    }
}
