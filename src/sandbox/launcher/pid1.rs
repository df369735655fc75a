//! PID 1 of a sandbox's new PID namespace (cloned by the outer launcher,
//! this binary without exec): builds the file system view, starts the
//! program, reaps orphans, and reports the program's status.

use std::ffi::CString;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use nix::sys::signal::{SigHandler, Signal, kill, sigaction};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use super::{
    CHILD, LaunchError, PROGRAM_SIGNALS, close_fds_except, die_with_parent, fail, plain_action,
    term_signals, wait_for,
};
use crate::sandbox::{Policy, namespaces, pty, relay, userns};

/// In a namespace's PID 1 whose program has a terminal (and so a process
/// group) of its own: the signals the server sends to the launcher's group
/// go on to the program's group.
extern "C" fn on_forward(sig: libc::c_int) {
    // SAFETY: only kill(2) on an atomically loaded pid; errno preserved.
    unsafe {
        let child = CHILD.load(Ordering::SeqCst);
        if child > 0 {
            let errno = *libc::__errno_location();
            libc::kill(-child, sig);
            *libc::__errno_location() = errno;
        }
    }
}

/// What PID 1 holds for the program besides its status pipe.
struct Extras {
    /// The egress relay's listener (installers), and the proxy's socket
    /// opened (O_PATH) before the view was built: it is not in the view.
    relay: Option<(TcpListener, OwnedFd)>,
    /// A terminal of the namespace's own devpts (pty jobs).
    terminal: Option<pty::Inner>,
}

/// PID 1 of the new PID namespace: builds the file system view, starts the
/// program, reaps orphans, and reports the program's status on `status`.
pub(super) fn init(
    policy: &Policy,
    program: &[CString],
    status: OwnedFd,
    idmappings: Vec<userns::Idmapping>,
) -> ! {
    die_with_parent();
    let extras = prepare(policy, &idmappings).unwrap_or_else(|e| fail(e));
    drop(idmappings);
    // SAFETY: single-threaded; the child goes straight to start_program.
    let child = match unsafe { fork() } {
        Err(e) => fail(LaunchError::Fork(e)),
        Ok(ForkResult::Child) => {
            drop(status);
            if let Some(t) = &extras.terminal
                && let Err(e) = t.attach()
            {
                fail(LaunchError::Terminal(e));
            }
            super::program::start_program(policy, program)
        }
        Ok(ForkResult::Parent { child }) => child,
    };
    CHILD.store(child.as_raw(), Ordering::SeqCst);
    let result = serve(policy, extras, child, &status);
    CHILD.store(0, Ordering::SeqCst);
    // Everything else in the namespace goes with the program.
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    while waitpid(None, Some(super::ALL_CHILDREN)).is_ok() {}
    report(status, result)
}

/// Before the program is forked: the file system view, the relay's port
/// (bound before the program starts, so it can connect at once) and the
/// terminal.
fn prepare(policy: &Policy, idmappings: &[userns::Idmapping]) -> Result<Extras, LaunchError> {
    let proxy = match &policy.egress {
        Some(e) => Some(relay::open_proxy(&e.socket)?),
        None => None,
    };
    let program = super::program_identity(policy);
    if let Some(plan) = &policy.mounts {
        namespaces::build(plan, idmappings).map_err(LaunchError::FileSystemView)?;
    }
    let relay = match (&policy.egress, proxy) {
        (Some(e), Some(proxy)) => {
            relay::loopback_up()?;
            Some((relay::listen(e.port)?, proxy))
        }
        _ => None,
    };
    let terminal = if policy.pty {
        Some(pty::open(program).map_err(LaunchError::Pty)?)
    } else {
        None
    };
    Ok(Extras { relay, terminal })
}

/// While the program runs: relays, passes signals on, and waits for it
/// (copying its terminal's bytes, if it has one). Its status.
fn serve(policy: &Policy, extras: Extras, child: Pid, status: &OwnedFd) -> Option<WaitStatus> {
    // Threads only now: the program was forked from a single thread.
    let relay_fds = extras
        .relay
        .as_ref()
        .map(|(l, proxy)| [l.as_raw_fd(), proxy.as_raw_fd()]);
    if let Some((listener, proxy)) = extras.relay {
        relay::spawn(listener, proxy);
    }
    set_handlers(policy.pty);
    let _ = term_signals().thread_unblock();
    let mut keep = vec![status.as_raw_fd()];
    if let Some(t) = &extras.terminal {
        keep.extend([0, 1, t.master_fd()]);
    }
    keep.extend(relay_fds.into_iter().flatten());
    close_fds_except(&keep);
    match extras.terminal {
        Some(t) => t.relay(child),
        None => wait_for(child),
    }
}

/// With a terminal of its own the program leads its own process group,
/// which the server's group signals no longer reach: pass them on.
/// Otherwise PID 1 ignores them (the program gets them from the group).
fn set_handlers(pty: bool) {
    let ignore = plain_action(SigHandler::SigIgn);
    let forward = plain_action(SigHandler::Handler(on_forward));
    // SAFETY: the handler only reads atomics and calls kill(2).
    unsafe {
        for sig in PROGRAM_SIGNALS {
            let _ = sigaction(sig, if pty { &forward } else { &ignore });
        }
    }
}

/// Writes the program's status for the outer launcher, and exits.
fn report(status: OwnedFd, result: Option<WaitStatus>) -> ! {
    let report = match result {
        Some(WaitStatus::Exited(_, code)) => format!("exit {code}"),
        Some(WaitStatus::Signaled(_, sig, _)) => format!("signal {}", sig as i32),
        _ => "exit 1".to_string(),
    };
    let mut file = std::fs::File::from(status);
    let _ = std::io::Write::write_all(&mut file, report.as_bytes());
    drop(file);
    std::process::exit(0);
}
