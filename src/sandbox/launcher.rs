//! The launcher: ferrepl re-executed as `ferrepl __ferrepl-launch @POLICY --
//! PROGRAM ARGS...`, before any thread or async runtime exists, with an
//! empty environment (the program's environment is in the policy).
//!
//! It dies with the server (parent-death signal), joins the process's
//! cgroups, and, with namespaces, clones the namespaces' PID 1 (also this
//! binary, no exec), which builds the private file system view and forks the
//! program. The program's process applies rlimits, drops every capability,
//! sets no_new_privs, Landlock and seccomp, and execs. The outer launcher
//! stays as a child subreaper: it ignores SIGINT (interrupts are for the
//! program; the server signals the whole process group), and exits with the
//! program's status (re-raising its signal) once everything below it is
//! gone. When PID 1 of a namespace exits, the kernel kills every process
//! left in it, daemons included.
//!
//! The stages live in their own files: `outer` (the subreaper that stays
//! behind), `pid1` (a namespace's PID 1, Linux only) and `program` (the
//! program's process up to exec).

mod outer;
#[cfg(target_os = "linux")]
mod pid1;
mod program;

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use super::Policy;

pub use program::{ApplyError, apply};

pub const LAUNCH_ARG: &str = "__ferrepl-launch";

/// The process the signals are passed to (the program, or the namespace's
/// PID 1), for the signal handlers.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The server that started us; its signals go to the whole process group.
static SERVER: AtomicI32 = AtomicI32::new(0);

/// The signals a program (or a job's shell) is expected to handle itself.
const PROGRAM_SIGNALS: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGHUP,
];

/// Why the launcher gives up (printed as `ferrepl launcher: <message>`, exit
/// status 127; the startup probe reads the message back).
#[derive(Debug, thiserror::Error)]
enum LaunchError {
    #[error("usage: __ferrepl-launch @POLICY -- PROGRAM [ARGS...]")]
    Usage,
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("bad argument: {0}")]
    Argument(#[from] std::ffi::NulError),
    #[error("the server is gone")]
    ServerGone,
    #[error("cannot join cgroup {procs}: {source}")]
    Cgroup {
        procs: String,
        source: std::io::Error,
    },
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    UserNamespace(super::namespaces::NamespaceError),
    #[error("pipe: {0}")]
    Pipe(nix::Error),
    #[cfg(target_os = "linux")]
    #[error(
        "cannot create mount/PID/IPC/UTS{} namespaces: {source}",
        network_namespace(*.network)
    )]
    Namespaces { network: bool, source: nix::Error },
    #[error("fork failed: {0}")]
    Fork(nix::Error),
    #[cfg(target_os = "linux")]
    #[error("cannot build the sandbox's file system view: {0}")]
    FileSystemView(super::namespaces::NamespaceError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Relay(#[from] super::relay::RelayError),
    #[cfg(target_os = "linux")]
    #[error("pty: {0}")]
    Pty(super::pty::PtyError),
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Terminal(super::pty::PtyError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("cannot execute {program:?}: {source}")]
    Exec {
        program: CString,
        source: std::io::Error,
    },
}

/// A policy that cannot be read.
#[derive(Debug, thiserror::Error)]
enum PolicyError {
    #[error("{path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}: not a private policy file")]
    NotPrivate(String),
    #[error("{0}: the policy file is not the one the server wrote")]
    Changed(String),
    #[error("bad policy: {0}")]
    Parse(#[from] serde_json::Error),
}

/// The network namespace's part of the namespaces' names, when there is one.
#[cfg(target_os = "linux")]
fn network_namespace(network: bool) -> &'static str {
    if network { "" } else { "/network" }
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("ferrepl launcher: {msg}");
    std::process::exit(127);
}

fn term_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    set
}

/// A disposition without flags or a mask.
fn plain_action(handler: SigHandler) -> SigAction {
    SigAction::new(handler, SaFlags::empty(), SigSet::empty())
}

/// waitpid flags for every kind of child (clone children too on Linux).
#[cfg(target_os = "linux")]
const ALL_CHILDREN: WaitPidFlag = WaitPidFlag::__WALL;
#[cfg(not(target_os = "linux"))]
const ALL_CHILDREN: WaitPidFlag = WaitPidFlag::empty();

/// SIGKILL once the parent is gone (Linux; elsewhere the server's process
/// group kill on exit does it).
fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) has no memory effects.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    }
}

/// The SHA-256 of a policy, in hex.
pub fn digest(policy: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(policy)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Reads the policy: `@FILE#SHA256` (written by the server in its private
/// state directory, removed here, and refused unless its digest is the one
/// on our command line) or inline JSON.
fn read_policy(arg: &str) -> Result<Policy, PolicyError> {
    let text = match arg.strip_prefix('@') {
        Some(file) => {
            let (path, sum) = file
                .rsplit_once('#')
                .ok_or_else(|| PolicyError::Changed(file.to_string()))?;
            let text = read_policy_file(path)?;
            if digest(text.as_bytes()) != sum {
                return Err(PolicyError::Changed(path.to_string()));
            }
            text
        }
        None => arg.to_string(),
    };
    Ok(serde_json::from_str(&text)?)
}

/// Only a regular file of ours, never through a symlink or a FIFO.
fn read_policy_file(path: &str) -> Result<String, PolicyError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file_error = |source| PolicyError::File {
        path: path.to_string(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(file_error)?;
    let meta = file.metadata().map_err(file_error)?;
    // SAFETY: geteuid has no preconditions.
    if !meta.is_file() || meta.uid() != unsafe { libc::geteuid() } || meta.mode() & 0o077 != 0 {
        return Err(PolicyError::NotPrivate(path.to_string()));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text).map_err(file_error)?;
    let _ = std::fs::remove_file(path);
    Ok(text)
}

/// A pipe whose ends close on exec.
fn cloexec_pipe() -> nix::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    #[cfg(target_os = "linux")]
    return nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC);
    #[cfg(not(target_os = "linux"))]
    {
        use nix::fcntl::{FcntlArg, FdFlag, fcntl};
        let (read, write) = nix::unistd::pipe()?;
        fcntl(&read, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
        fcntl(&write, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
        Ok((read, write))
    }
}

/// Entry point of `ferrepl __ferrepl-launch @POLICY -- PROGRAM ARGS...`.
pub fn run(args: &[String]) -> ! {
    let (policy, program) = prepare(args).unwrap_or_else(|e| fail(e));
    let status_pipe = cloexec_pipe().unwrap_or_else(|e| fail(LaunchError::Pipe(e)));
    // Held back until the handlers are in place, so a SIGTERM right after
    // the fork cannot kill the launcher and orphan the program.
    let _ = term_signals().thread_block();
    #[cfg(target_os = "linux")]
    if policy.mounts.is_some() {
        clone_pid1(&policy, &program, status_pipe);
    }
    fork_program(&policy, &program, status_pipe)
}

/// Everything before the fork: the arguments, a session of our own, the
/// policy, the tie to the server, the cgroups and (with namespaces) the
/// user namespace.
fn prepare(args: &[String]) -> Result<(Policy, Vec<CString>), LaunchError> {
    let (Some(policy_arg), Some(sep)) = (args.first(), args.get(1)) else {
        return Err(LaunchError::Usage);
    };
    if sep != "--" || args.len() < 3 {
        return Err(LaunchError::Usage);
    }
    // A session of its own: no controlling terminal of the server's (the
    // operator's terminal must not be reachable through /dev/tty). The
    // server already made one between fork and exec; this covers anyone
    // else starting the launcher (it fails harmlessly for a session leader).
    // SAFETY: setsid has no memory effects.
    unsafe {
        libc::setsid();
    }
    let policy = read_policy(policy_arg)?;
    let program: Vec<CString> = args[2..]
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()?;
    // Die with the server, even when it is SIGKILLed. (The death signal is
    // tied to the server thread that forked us: the runtime's threads live
    // as long as the server.)
    die_with_parent();
    let parent = nix::unistd::getppid().as_raw();
    if policy.server_pid != 0 && parent != policy.server_pid as i32 {
        return Err(LaunchError::ServerGone);
    }
    // Before the fork, so the program and all it starts are counted.
    join_cgroups(&policy)?;
    SERVER.store(parent, Ordering::SeqCst);
    #[cfg(target_os = "linux")]
    if policy.mounts.is_some() {
        super::userns::enter_user(policy.identity).map_err(LaunchError::UserNamespace)?;
    }
    Ok((policy, program))
}

/// Moves this process into the policy's cgroups; a failure is fatal only
/// with --sandbox-require.
fn join_cgroups(policy: &Policy) -> Result<(), LaunchError> {
    for procs in &policy.cgroup_procs {
        if let Err(source) = std::fs::write(procs, "0") {
            let error = LaunchError::Cgroup {
                procs: procs.clone(),
                source,
            };
            if policy.require {
                return Err(error);
            }
            eprintln!("ferrepl launcher: {error}");
        }
    }
    Ok(())
}

/// With namespaces: clones their PID 1, which reports the program's status
/// on the pipe, and supervises it.
#[cfg(target_os = "linux")]
fn clone_pid1(policy: &Policy, program: &[CString], status_pipe: (OwnedFd, OwnedFd)) -> ! {
    let (read_end, write_end) = status_pipe;
    let idmappings = match &policy.mounts {
        Some(plan) => super::userns::idmappings(plan, program_identity(policy))
            .unwrap_or_else(|e| fail(LaunchError::FileSystemView(e))),
        None => Vec::new(),
    };
    let mut pid1_args = Some((write_end, idmappings));
    let mut stack = vec![0u8; 4 << 20];
    let start_init = Box::new(|| -> isize {
        match pid1_args.take() {
            Some((w, idmappings)) => pid1::init(policy, program, w, idmappings),
            None => 1,
        }
    });
    // SAFETY: single-threaded; the child runs `init` on its own copy of
    // the memory (no CLONE_VM) and never returns into our frames.
    let child = unsafe {
        nix::sched::clone(
            start_init,
            &mut stack,
            super::namespaces::clone_flags(policy.network),
            Some(libc::SIGCHLD),
        )
    };
    match child {
        Ok(child) => outer::supervise(child, read_end, false),
        Err(source) => fail(LaunchError::Namespaces {
            network: policy.network,
            source,
        }),
    }
}

/// The uid and gid the program runs as.
#[cfg(target_os = "linux")]
fn program_identity(policy: &Policy) -> super::Identity {
    policy.identity.unwrap_or(super::Identity {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    })
}

/// Without namespaces: forks the program and supervises it.
fn fork_program(policy: &Policy, program: &[CString], status_pipe: (OwnedFd, OwnedFd)) -> ! {
    // SAFETY: the launcher is single-threaded here (no runtime was started).
    match unsafe { fork() } {
        Err(e) => fail(LaunchError::Fork(e)),
        Ok(ForkResult::Child) => {
            drop(status_pipe.0);
            drop(status_pipe.1);
            program::start_program(policy, program)
        }
        Ok(ForkResult::Parent { child }) => {
            drop(status_pipe.1);
            outer::supervise(child, status_pipe.0, true)
        }
    }
}

/// Reaps everything until `child` exits; its status.
fn wait_for(child: Pid) -> Option<WaitStatus> {
    loop {
        match waitpid(None, Some(ALL_CHILDREN)) {
            Ok(ws @ (WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)))
                if pid == child =>
            {
                return Some(ws);
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
}

pub(crate) fn close_fds_except(keep: &[i32]) {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|fd| !keep.contains(fd)) {
        // SAFETY: closing descriptors this process no longer uses.
        unsafe {
            libc::close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` as a private policy file (the launcher removes it).
    fn write_policy(path: &std::path::Path, text: &[u8]) {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .expect("write the policy");
        std::io::Write::write_all(&mut file, text).expect("write the policy");
    }

    #[test]
    fn a_policy_file_that_is_not_the_servers_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("policy-1.json");
        let json = serde_json::to_vec(&Policy::default()).expect("json");
        let arg = format!("@{}#{}", path.display(), digest(&json));
        write_policy(&path, &json);
        read_policy(&arg).expect("the server's own policy");
        assert!(!path.exists(), "the launcher removes the file");
        // Swapped for another policy (landlock and seccomp off, say).
        let other = serde_json::to_vec(&Policy {
            landlock: true,
            ..Policy::default()
        })
        .expect("json");
        write_policy(&path, &other);
        assert!(matches!(read_policy(&arg), Err(PolicyError::Changed(_))));
        // No digest at all.
        write_policy(&path, &json);
        let bare = format!("@{}", path.display());
        assert!(matches!(read_policy(&bare), Err(PolicyError::Changed(_))));
    }
}
