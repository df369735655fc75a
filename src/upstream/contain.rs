//! Keeping a stdio upstream server's whole process tree inside ferrepl's
//! lifetime, also when ferrepl is SIGKILLed: a parent-death signal reaches
//! only the direct child, and `npx` starts grandchildren that may detach
//! (setsid). So the server runs under this binary in the mode
//! [`CONTAIN_ARG`]: it dies with ferrepl, and starts the server as the child
//! of PID 1 of a new PID namespace; when PID 1 ends, the kernel ends every
//! process in the namespace. Without namespaces (not root and no user
//! namespaces) the server runs directly, in its own process group.

use std::ffi::CString;

/// argv[1] of the containment mode: `ferrepl __ferrepl-upstream -- CMD ARGS...`.
pub const CONTAIN_ARG: &str = "__ferrepl-upstream";

/// Runs the containment mode (never returns). `args`: after [`CONTAIN_ARG`].
pub fn run(args: &[String]) -> ! {
    let program: Vec<CString> = args
        .iter()
        .skip_while(|a| *a != "--")
        .skip(1)
        .filter_map(|a| CString::new(a.as_bytes()).ok())
        .collect();
    if program.is_empty() {
        eprintln!("ferrepl {CONTAIN_ARG}: no command after --");
        std::process::exit(2);
    }
    #[cfg(target_os = "linux")]
    linux::contain(&program);
    #[cfg(not(target_os = "linux"))]
    exec(&program);
}

fn exec(program: &[CString]) -> ! {
    let err = nix::unistd::execvp(&program[0], program);
    eprintln!(
        "ferrepl: cannot run {:?}: {}",
        program[0],
        err.map_or_else(|e| e.to_string(), |_| String::new())
    );
    std::process::exit(127);
}

#[cfg(target_os = "linux")]
mod linux {
    use std::ffi::CString;

    use nix::sched::{CloneFlags, unshare};
    use nix::sys::wait::{WaitStatus, waitpid};
    use nix::unistd::{ForkResult, Pid, fork, getgid, getuid};

    fn die_with_parent() {
        // SAFETY: prctl(PR_SET_PDEATHSIG) has no memory effects.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        }
    }

    /// A new PID namespace for the children: directly as root, else inside
    /// a user namespace mapping only this user.
    fn new_pid_namespace() -> bool {
        if unshare(CloneFlags::CLONE_NEWPID).is_ok() {
            return true;
        }
        let (uid, gid) = (getuid(), getgid());
        if unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWPID).is_err() {
            return false;
        }
        let write = |path: &str, text: String| std::fs::write(path, text).is_ok();
        write("/proc/self/setgroups", "deny".into())
            && write("/proc/self/uid_map", format!("{uid} {uid} 1"))
            && write("/proc/self/gid_map", format!("{gid} {gid} 1"))
    }

    /// Exit with the status `status` describes (a signal as 128 + it).
    fn exit_like(status: WaitStatus) -> ! {
        match status {
            WaitStatus::Exited(_, code) => std::process::exit(code),
            WaitStatus::Signaled(_, sig, _) => std::process::exit(128 + sig as i32),
            _ => std::process::exit(1),
        }
    }

    /// Waits for `child`, reaping any other process meanwhile.
    fn wait_for(child: Pid) -> WaitStatus {
        loop {
            match waitpid(None, None) {
                Ok(status) if status.pid() == Some(child) => return status,
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return WaitStatus::Exited(child, 1),
            }
        }
    }

    pub(super) fn contain(program: &[CString]) -> ! {
        die_with_parent();
        if !new_pid_namespace() {
            eprintln!(
                "ferrepl: no PID namespace for the upstream server (not root, no user namespaces): its processes end with ferrepl only while they stay in its process group"
            );
            super::exec(program);
        }
        // SAFETY: single-threaded here (no runtime was started).
        match unsafe { fork() } {
            Err(e) => {
                eprintln!("ferrepl: fork: {e}");
                std::process::exit(1);
            }
            Ok(ForkResult::Parent { child }) => exit_like(wait_for(child)),
            Ok(ForkResult::Child) => {}
        }
        // PID 1 of the namespace: ends with the launcher above, and with it
        // every process of the namespace.
        die_with_parent();
        // SAFETY: single-threaded.
        match unsafe { fork() } {
            Err(e) => {
                eprintln!("ferrepl: fork: {e}");
                std::process::exit(1);
            }
            Ok(ForkResult::Parent { child }) => exit_like(wait_for(child)),
            Ok(ForkResult::Child) => super::exec(program),
        }
    }
}
