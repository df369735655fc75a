//! The launcher: ferrepl re-executed as `ferrepl __ferrepl-launch POLICY --
//! PROGRAM ARGS...`, before any thread or async runtime exists.
//!
//! It forks. The child applies the policy (rlimits, no_new_privs, Landlock,
//! seccomp) and execs the program. The parent stays as a child subreaper: it
//! ignores SIGINT (interrupts are for the program), passes SIGTERM and SIGHUP
//! on to the program, reaps everything, and when the program exits it kills
//! every process left below it, daemonized ones included, then exits with the
//! program's status (re-raising its signal).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, kill, sigaction};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

use super::{Applied, Policy};

pub const LAUNCH_ARG: &str = "__ferrepl-launch";
pub const PROBE_ARG: &str = "__ferrepl-probe";

/// The program's pid, for the signal handler.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The server that started us; its signals go to the whole process group.
static SERVER: AtomicI32 = AtomicI32::new(0);

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
            let errno = *libc::__errno_location();
            libc::kill(child, sig);
            *libc::__errno_location() = errno;
        }
    }
}

fn term_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    set
}

/// Entry point of `ferrepl __ferrepl-launch POLICY -- PROGRAM ARGS...`.
pub fn run(args: &[String]) -> ! {
    let fail = |msg: String| -> ! {
        eprintln!("ferrepl launcher: {msg}");
        std::process::exit(127);
    };
    let (Some(policy_json), Some(sep)) = (args.first(), args.get(1)) else {
        fail("usage: __ferrepl-launch POLICY -- PROGRAM [ARGS...]".into());
    };
    if sep != "--" || args.len() < 3 {
        fail("usage: __ferrepl-launch POLICY -- PROGRAM [ARGS...]".into());
    }
    let policy: Policy = match serde_json::from_str(policy_json) {
        Ok(p) => p,
        Err(e) => fail(format!("bad policy: {e}")),
    };
    let program: Vec<CString> = match args[2..].iter().map(|a| CString::new(a.as_str())).collect() {
        Ok(p) => p,
        Err(e) => fail(format!("bad argument: {e}")),
    };
    // Before the fork, so the program and all it starts are counted.
    for procs in &policy.cgroup_procs {
        if let Err(e) = std::fs::write(procs, "0") {
            if policy.require {
                fail(format!("cannot join cgroup {procs}: {e}"));
            }
            eprintln!("ferrepl launcher: cannot join cgroup {procs}: {e}");
        }
    }
    SERVER.store(nix::unistd::getppid().as_raw(), Ordering::SeqCst);
    // Held back until the handlers are in place, so a SIGTERM right after
    // the fork cannot kill the launcher and orphan the program.
    let _ = term_signals().thread_block();
    // SAFETY: the launcher is single-threaded here (no runtime was started).
    match unsafe { fork() } {
        Err(e) => fail(format!("fork failed: {e}")),
        Ok(ForkResult::Child) => {
            let _ = term_signals().thread_unblock();
            if let Err(e) = apply(&policy) {
                fail(e);
            }
            let _ = nix::unistd::execvp(&program[0], &program);
            fail(format!("cannot execute {:?}", program[0]));
        }
        Ok(ForkResult::Parent { child }) => supervise(child),
    }
}

fn supervise(child: Pid) -> ! {
    CHILD.store(child.as_raw(), Ordering::SeqCst);
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    let term = SigAction::new(
        SigHandler::SigAction(on_term),
        SaFlags::SA_SIGINFO,
        SigSet::empty(),
    );
    // SAFETY: the handler only reads atomics and calls kill(2).
    unsafe {
        let _ = sigaction(Signal::SIGINT, &ignore);
        let _ = sigaction(Signal::SIGQUIT, &ignore);
        let _ = sigaction(Signal::SIGTERM, &term);
        let _ = sigaction(Signal::SIGHUP, &term);
    }
    let _ = term_signals().thread_unblock();
    // The program's pipes and control socket must close when it goes.
    close_fds_from(0);
    let mut status: Option<WaitStatus> = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(ws @ (WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)))
                if pid == child =>
            {
                status = Some(ws);
                break;
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    CHILD.store(0, Ordering::SeqCst);
    sweep();
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
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
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
        let pids = super::watch::descendants(me);
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        while let Ok(ws) = waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
            if ws == WaitStatus::StillAlive {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn close_fds_from(first: i32) {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|fd| *fd >= first) {
        // SAFETY: closing descriptors this process no longer uses.
        unsafe {
            libc::close(fd);
        }
    }
}

fn set_limit(resource: libc::__rlimit_resource_t, value: u64) {
    let lim = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: setrlimit reads the struct only.
    unsafe {
        libc::setrlimit(resource, &lim);
    }
}

/// Applies the policy to this (single-threaded) process; reports what is active.
pub fn apply(policy: &Policy) -> Result<Applied, String> {
    let mut applied = Applied::default();
    set_limit(libc::RLIMIT_CORE, 0);
    if let Some(b) = policy.max_file_bytes {
        set_limit(libc::RLIMIT_FSIZE, b);
        applied.rlimits.push(format!("file size {b} B"));
    }
    if let Some(n) = policy.max_open_files {
        set_limit(libc::RLIMIT_NOFILE, n);
        applied.rlimits.push(format!("open files {n}"));
    }
    // SAFETY: getuid has no preconditions.
    if let Some(n) = policy.max_processes
        && unsafe { libc::getuid() } != 0
    {
        set_limit(libc::RLIMIT_NPROC, n);
        applied.rlimits.push(format!("processes {n} (per user)"));
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) has no memory effects.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == 0 {
        applied.no_new_privs = true;
    } else if policy.require {
        return Err("no_new_privs could not be set".into());
    }
    if policy.landlock {
        match landlock(policy) {
            Ok(status) => applied.landlock = status,
            Err(e) if policy.require => return Err(format!("Landlock: {e}")),
            Err(e) => applied.landlock = format!("unavailable ({e})"),
        }
    }
    if policy.seccomp {
        match seccomp(policy) {
            Ok(()) => applied.seccomp = true,
            Err(e) if policy.require => return Err(format!("seccomp: {e}")),
            Err(e) => applied.seccomp_error = Some(e),
        }
    }
    for (k, v) in &policy.env {
        // SAFETY: single-threaded; nothing else reads the environment now.
        unsafe {
            std::env::set_var(k, v);
        }
    }
    Ok(applied)
}

fn landlock(policy: &Policy) -> Result<String, String> {
    let abi = ABI::V6;
    let mut ruleset = Ruleset::default()
        .set_compatibility(if policy.require {
            CompatLevel::HardRequirement
        } else {
            CompatLevel::BestEffort
        })
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| e.to_string())?;
    if !policy.network {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(|e| e.to_string())?;
    }
    let ruleset = ruleset
        .scope(Scope::from_all(abi))
        .map_err(|e| e.to_string())?;
    let existing = |paths: &[String]| -> Vec<String> {
        paths
            .iter()
            .filter(|p| std::path::Path::new(p).exists())
            .cloned()
            .collect()
    };
    let status = ruleset
        .create()
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules(
            existing(&policy.read),
            AccessFs::from_read(abi),
        ))
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules(
            existing(&policy.write),
            AccessFs::from_all(abi),
        ))
        .map_err(|e| e.to_string())?
        .restrict_self()
        .map_err(|e| e.to_string())?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "fully enforced".to_string(),
        RulesetStatus::PartiallyEnforced => "partially enforced (older kernel ABI)".to_string(),
        RulesetStatus::NotEnforced => "not enforced (kernel without Landlock)".to_string(),
    })
}

fn target_arch() -> Result<TargetArch, String> {
    if cfg!(target_arch = "x86_64") {
        Ok(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Ok(TargetArch::aarch64)
    } else {
        Err("no seccomp support for this architecture".into())
    }
}

fn seccomp(policy: &Policy) -> Result<(), String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let always = [
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_setns,
        libc::SYS_unshare,
    ];
    for sys in always {
        rules.insert(sys, vec![]);
    }
    if !policy.network {
        let family = |f: i32| {
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, f as u64)
                .and_then(|c| SeccompRule::new(vec![c]))
                .map_err(|e| e.to_string())
        };
        rules.insert(
            libc::SYS_socket,
            vec![family(libc::AF_INET)?, family(libc::AF_INET6)?],
        );
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        target_arch()?,
    )
    .map_err(|e| e.to_string())?;
    let program: seccompiler::BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    seccompiler::apply_filter(&program).map_err(|e| e.to_string())
}

/// `ferrepl __ferrepl-probe POLICY`: applies the policy to itself and prints
/// what is active as JSON (the server runs this once at start).
pub fn probe(args: &[String]) -> ! {
    let policy: Policy = match args.first().map(|p| serde_json::from_str(p)) {
        Some(Ok(p)) => p,
        _ => {
            eprintln!("usage: __ferrepl-probe POLICY");
            std::process::exit(2);
        }
    };
    match apply(&policy) {
        Ok(mut applied) => {
            applied.network_blocked = !policy.network && network_blocked();
            println!("{}", serde_json::to_string(&applied).unwrap_or_default());
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

fn network_blocked() -> bool {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0");
    let tcp = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
        std::time::Duration::from_millis(200),
    );
    let _ = tcp.as_ref().map(|s| s.as_raw_fd());
    sock.is_err()
        && tcp
            .err()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
}
