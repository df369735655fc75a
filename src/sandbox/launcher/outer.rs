//! The outer launcher's life after the fork: a child subreaper that waits
//! for the program (or a namespace's PID 1), passes signals on, and exits
//! with the program's status.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, kill, sigaction};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::{CHILD, SERVER, close_fds_except, plain_action, term_signals, wait_for};

/// SIGTERM/SIGHUP are the program's to handle (a job may trap or ignore
/// them). The server signals the whole process group, which reaches the
/// program directly, so only a signal from anyone else (`kill <pid>` of the
/// launcher) is passed on; passing the server's on too would deliver it
/// twice. Whoever needs everything gone sends SIGKILL to the whole tree.
extern "C" fn on_term(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO; only
    // async-signal-safe calls (kill) are made, and errno is preserved.
    unsafe {
        let sender = if info.is_null() { 0 } else { (*info).si_pid() };
        let child = CHILD.load(Ordering::SeqCst);
        if child > 0 && sender != SERVER.load(Ordering::SeqCst) {
            let errno = nix::errno::Errno::last_raw();
            libc::kill(child, sig);
            nix::errno::Errno::set_raw(errno);
        }
    }
}

/// The outer launcher's life: waits for `child` (the program, or a
/// namespace's PID 1) and exits with the program's status. `forward_terms`:
/// pass SIGTERM/SIGHUP from anyone but the server on to the program. Not
/// with namespaces: the kernel then reports the server's group signals to
/// us with sender pid 0 (it rewrites the shared siginfo for the group
/// members in the child PID namespace), so they cannot be told apart, and
/// passing them on would deliver them twice.
pub(super) fn supervise(child: Pid, status_pipe: OwnedFd, forward_terms: bool) -> ! {
    CHILD.store(child.as_raw(), Ordering::SeqCst);
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER has no memory effects.
    // (Elsewhere orphans go to init; the process group kill still reaches
    // them.)
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    set_handlers(forward_terms);
    let _ = term_signals().thread_unblock();
    // The program's pipes and control socket must close when it goes.
    close_fds_except(&[status_pipe.as_raw_fd()]);
    let status = wait_for(child);
    CHILD.store(0, Ordering::SeqCst);
    sweep();
    // A namespace's PID 1 reports the program's own status.
    let mut report = String::new();
    let mut file = std::fs::File::from(status_pipe);
    let _ = std::io::Read::read_to_string(&mut file, &mut report);
    exit_as_program(&report, status)
}

/// Interrupts are for the program; SIGTERM/SIGHUP are passed on or ignored
/// (see `supervise`).
fn set_handlers(forward_terms: bool) {
    let ignore = plain_action(SigHandler::SigIgn);
    let term = SigAction::new(
        SigHandler::SigAction(on_term),
        SaFlags::SA_SIGINFO,
        SigSet::empty(),
    );
    // SAFETY: the handler only reads atomics and calls kill(2).
    unsafe {
        let _ = sigaction(Signal::SIGINT, &ignore);
        let _ = sigaction(Signal::SIGQUIT, &ignore);
        let on_term_signal = if forward_terms { &term } else { &ignore };
        let _ = sigaction(Signal::SIGTERM, on_term_signal);
        let _ = sigaction(Signal::SIGHUP, on_term_signal);
    }
}

/// Exits as the program did: the status PID 1 reported (`exit N` or
/// `signal N`), else the status of `child` itself.
fn exit_as_program(report: &str, status: Option<WaitStatus>) -> ! {
    if let Some(sig) = report
        .strip_prefix("signal ")
        .and_then(|s| s.parse::<i32>().ok())
        && let Ok(sig) = Signal::try_from(sig)
    {
        reraise(sig);
        std::process::exit(128 + sig as i32);
    }
    if let Some(code) = report
        .strip_prefix("exit ")
        .and_then(|s| s.parse::<i32>().ok())
    {
        std::process::exit(code);
    }
    match status {
        Some(WaitStatus::Exited(_, code)) => std::process::exit(code),
        Some(WaitStatus::Signaled(_, sig, _)) => {
            reraise(sig);
            std::process::exit(128 + sig as i32);
        }
        _ => std::process::exit(1),
    }
}

/// Dies of `sig` (default disposition restored first).
fn reraise(sig: Signal) {
    let dfl = plain_action(SigHandler::SigDfl);
    // SAFETY: restoring the default disposition to re-raise the signal.
    unsafe {
        let _ = sigaction(sig, &dfl);
    }
    let mut set = SigSet::empty();
    set.add(sig);
    let _ = set.thread_unblock();
    let _ = kill(Pid::this(), sig);
}

/// Kills and reaps every descendant (orphans were re-parented to us).
fn sweep() {
    let me = std::process::id();
    for _ in 0..50 {
        let pids = crate::sandbox::watch::descendants(me);
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        while let Ok(ws) = waitpid(None, Some(WaitPidFlag::WNOHANG | super::ALL_CHILDREN)) {
            if ws == WaitStatus::StillAlive {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
