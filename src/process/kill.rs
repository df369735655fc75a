//! Ending a process and everything it started.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::Process;

impl Process {
    /// Sends `signal` to the process group it leads, unless it was reaped
    /// (its pid could then lead another group).
    pub fn signal_group(&self, signal: Signal) {
        let reaped = self.unreaped();
        if !*reaped {
            self.signal_group_now(signal);
        }
    }

    /// `killpg` without the reap check: for the reap itself, which holds
    /// the lock ([`Process::wait`]).
    pub(super) fn signal_group_now(&self, signal: Signal) {
        if self.pid > 0 {
            let _ = killpg(Pid::from_raw(self.pid as i32), signal);
        }
    }

    /// SIGKILL to its process group and to every descendant, so children
    /// that left the group (`setsid`, daemons) go too, while it is not
    /// reaped; and to every member of its cgroups.
    pub fn kill_all(&self) {
        let cgroup = self.cgroup().clone();
        {
            let reaped = self.unreaped();
            if self.pid > 0 && !*reaped {
                crate::sandbox::watch::kill_tree(self.pid);
            }
        }
        if let Some(group) = cgroup {
            group.kill_all();
        }
    }
}
