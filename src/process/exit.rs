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
    /// Waits until `child` (this process) exits and reaps it. With
    /// `end_group`, its process group is killed first, while the exited
    /// leader still holds its pid (and so the group's id). The reap waits
    /// for signals on their way to the pid ([`Process::signal_group`],
    /// [`Process::kill_all`]), so none reaches a process that got the pid
    /// since. Where the kernel has no pidfd, the exit is awaited by reaping,
    /// and a signal sent just then could still go astray.
    pub async fn wait(
        &self,
        child: &mut tokio::process::Child,
        end_group: bool,
    ) -> std::io::Result<std::process::ExitStatus> {
        #[cfg(target_os = "linux")]
        if let Some(exit) = pidfd::Exit::watch(self.pid)
            && exit.wait().await
        {
            loop {
                let reaped = self.reaping().await;
                if let Some(status) = self.reap(child, end_group, reaped) {
                    return status;
                }
                // Exited but not yet waitable (a tracer holds it).
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let status = child.wait().await;
        if end_group {
            self.signal_group_now(Signal::SIGKILL);
        }
        *self.reaped.write().unwrap_or_else(|e| e.into_inner()) = true;
        status
    }

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

/// The reap under the lock (Linux: the exit is known before it, through a
/// pidfd).
#[cfg(target_os = "linux")]
impl Process {
    /// Reaps the exited `child` under `reaped` (ending its group first with
    /// `end_group`); None while it cannot be reaped yet.
    fn reap(
        &self,
        child: &mut tokio::process::Child,
        end_group: bool,
        mut reaped: std::sync::RwLockWriteGuard<'_, bool>,
    ) -> Option<std::io::Result<std::process::ExitStatus>> {
        if end_group {
            self.signal_group_now(Signal::SIGKILL);
        }
        let status = child.try_wait().transpose()?;
        *reaped = true;
        Some(status)
    }

    /// The reap's side of the lock, taken without blocking the async thread
    /// while a kill walks the process tree under the read side.
    async fn reaping(&self) -> std::sync::RwLockWriteGuard<'_, bool> {
        loop {
            if let Some(guard) = self.try_reaping() {
                return guard;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn try_reaping(&self) -> Option<std::sync::RwLockWriteGuard<'_, bool>> {
        match self.reaped.try_write() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
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

/// A process's exit, seen through a pidfd: readable once the process has
/// exited, before it is reaped.
#[cfg(target_os = "linux")]
mod pidfd {
    use std::os::fd::{FromRawFd, OwnedFd};

    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;

    pub struct Exit(AsyncFd<OwnedFd>);

    impl Exit {
        /// None where the kernel has no pidfd_open (before 5.3) or `pid` is
        /// not there.
        pub fn watch(pid: u32) -> Option<Self> {
            if pid == 0 {
                return None;
            }
            // SAFETY: pidfd_open takes a pid and flags and returns a new fd
            // or -1; it touches no memory of ours.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
            if fd < 0 {
                return None;
            }
            // SAFETY: the fd was just returned to us and nothing else owns it.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            // SAFETY: the OwnedFd is a valid open fd and stays the same one
            // for the AsyncFd's whole life (it owns it).
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                .ok()
                .map(Exit)
        }

        /// Returns once the process has exited: true; false when the pidfd
        /// can no longer be watched (the runtime is shutting down).
        pub async fn wait(&self) -> bool {
            self.0.readable().await.is_ok()
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::ffi::OsString;
    use std::path::Path;
    use std::time::Duration;

    use tokio::io::AsyncReadExt;

    use crate::process::{Launch, Spawned, Stdio, spawn};

    /// `sh -c script`, unconfined, with the pid of the background process
    /// it printed on its first line.
    async fn start(script: &str) -> (Spawned, i32) {
        let dir = std::env::temp_dir();
        let args: Vec<OsString> = vec!["-c".into(), script.into()];
        let mut spawned = spawn(Launch {
            program: Path::new("/bin/sh"),
            args: &args,
            cwd: &dir,
            env: &[],
            sandbox: None,
            inherit_env: true,
            home: dir.join("unused"),
            label: "t",
            egress: false,
            extra_read: &[],
            files: &[],
            inet_in_netns: false,
            stdio: Stdio::Pipes {
                stdin: false,
                control: Vec::new(),
            },
        })
        .expect("spawn sh");
        let mut line = Vec::new();
        let stdout = &mut spawned.outputs[0].1;
        let mut byte = [0u8; 1];
        while stdout.read(&mut byte).await.expect("read stdout") == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let pid = String::from_utf8_lossy(&line)
            .trim()
            .parse()
            .expect("a pid");
        (spawned, pid)
    }

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    async fn gone(pid: i32) -> bool {
        for _ in 0..400 {
            if !alive(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        false
    }

    #[tokio::test]
    async fn the_group_ends_before_the_reap_and_no_signal_follows_it() {
        let (mut sp, background) = start("sleep 600 & echo $!; exit 3").await;
        let status = sp.process.wait(&mut sp.child, true).await.expect("wait");
        assert_eq!(status.code(), Some(3));
        assert!(*sp.process.unreaped(), "marked reaped");
        assert!(
            gone(background).await,
            "the group's sleep outlived the reap"
        );
        // Reaped: its pid is no longer its own, so nothing is sent to it.
        sp.process.signal_group(nix::sys::signal::Signal::SIGKILL);
        sp.process.kill_all();
    }

    #[tokio::test]
    async fn without_end_group_the_group_is_left_alone() {
        let (mut sp, background) = start("sleep 600 & echo $!; exit 0").await;
        sp.process.wait(&mut sp.child, false).await.expect("wait");
        assert!(
            alive(background),
            "a job's background process must be left to finish"
        );
        // SAFETY: kill(2) has no memory effects.
        unsafe { libc::kill(background, libc::SIGKILL) };
    }
}
