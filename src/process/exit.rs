//! How a process ended, and what is cleaned up after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::Process;
use crate::sandbox::cgroup::Cgroup;

/// How a process ended, and when its owner recorded it.
#[derive(Debug, Clone)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub at: Instant,
}

impl ExitInfo {
    /// The end `status` of an awaited child, recorded now.
    pub fn now(status: std::io::Result<std::process::ExitStatus>) -> Self {
        use std::os::unix::process::ExitStatusExt;
        let (code, signal) = match status {
            Ok(s) => (s.code(), s.signal()),
            Err(_) => (None, None),
        };
        Self {
            code,
            signal,
            at: Instant::now(),
        }
    }

    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => match Signal::try_from(sig) {
                Ok(s) => format!("signal {sig} ({})", s.as_str()),
                Err(_) => format!("signal {sig}"),
            },
            (None, None) => "an unknown status".to_string(),
        }
    }

    /// The name of the signal that ended it (`SIGKILL`), if one did.
    pub fn signal_name(&self) -> Option<String> {
        let sig = self.signal?;
        Some(
            Signal::try_from(sig)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| format!("signal {sig}")),
        )
    }

    /// Whether all of its output is in: every output stream is closed
    /// (`closed`), or `grace` has passed since the exit (descendants that
    /// outlive it may hold the streams open).
    pub fn drained(&self, closed: bool, grace: Duration) -> bool {
        closed || self.at.elapsed() >= grace
    }
}

impl Process {
    /// Its cgroups, taken once it has exited (then [`release`]d).
    pub fn take_cgroup(&self) -> Option<Arc<Cgroup>> {
        self.cgroup().take()
    }

    /// Removes its private temporary directory, off the async threads.
    pub async fn remove_home(&self) {
        if let Some(home) = self.home.clone() {
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(home)).await;
        }
    }
}

/// Empties and removes the cgroups of an exited process, off the async
/// threads: members may take a moment to be reaped.
pub async fn release(cgroup: Option<Arc<Cgroup>>) {
    if let Some(group) = cgroup {
        let _ = tokio::task::spawn_blocking(move || {
            // Counted as the group ends, so each of its kills once, whether
            // or not the watch saw it while the process ran.
            crate::metrics::oom_kills(group.oom_kills());
            drop(group)
        })
        .await;
    }
}
