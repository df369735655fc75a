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

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, kill, sigaction};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use super::{Applied, Policy};

pub const LAUNCH_ARG: &str = "__ferrepl-launch";

/// The process the signals are passed to (the program, or the namespace's
/// PID 1), for the signal handlers.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The server that started us; its signals go to the whole process group.
static SERVER: AtomicI32 = AtomicI32::new(0);
fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("ferrepl launcher: {msg}");
    std::process::exit(127);
}

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

fn term_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    set
}

/// Reads the policy: `@FILE` (written by the server in its private state
/// directory and removed here) or inline JSON.
fn read_policy(arg: &str) -> Result<Policy, String> {
    let text = match arg.strip_prefix('@') {
        Some(path) => {
            use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
            // Only a regular file of ours, never through a symlink or a FIFO.
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)
                .map_err(|e| format!("{path}: {e}"))?;
            let meta = file.metadata().map_err(|e| format!("{path}: {e}"))?;
            // SAFETY: geteuid has no preconditions.
            if !meta.is_file()
                || meta.uid() != unsafe { libc::geteuid() }
                || meta.mode() & 0o077 != 0
            {
                return Err(format!("{path}: not a private policy file"));
            }
            let mut text = String::new();
            std::io::Read::read_to_string(&mut file, &mut text)
                .map_err(|e| format!("{path}: {e}"))?;
            let _ = std::fs::remove_file(path);
            text
        }
        None => arg.to_string(),
    };
    serde_json::from_str(&text).map_err(|e| format!("bad policy: {e}"))
}

/// Entry point of `ferrepl __ferrepl-launch @POLICY -- PROGRAM ARGS...`.
pub fn run(args: &[String]) -> ! {
    let usage = "usage: __ferrepl-launch @POLICY -- PROGRAM [ARGS...]";
    let (Some(policy_arg), Some(sep)) = (args.first(), args.get(1)) else {
        fail(usage);
    };
    if sep != "--" || args.len() < 3 {
        fail(usage);
    }
    // A session of its own: no controlling terminal of the server's (the
    // operator's terminal must not be reachable through /dev/tty). The
    // server already made one between fork and exec; this covers anyone
    // else starting the launcher (it fails harmlessly for a session leader).
    // SAFETY: setsid has no memory effects.
    unsafe {
        libc::setsid();
    }
    let policy = read_policy(policy_arg).unwrap_or_else(|e| fail(e));
    let program: Vec<CString> = args[2..]
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| fail(format!("bad argument: {e}")));
    // Die with the server, even when it is SIGKILLed. (The death signal is
    // tied to the server thread that forked us: the runtime's threads live
    // as long as the server.)
    // SAFETY: prctl(PR_SET_PDEATHSIG) has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    }
    let parent = nix::unistd::getppid().as_raw();
    if policy.server_pid != 0 && parent != policy.server_pid as i32 {
        fail("the server is gone");
    }
    // Before the fork, so the program and all it starts are counted.
    for procs in &policy.cgroup_procs {
        if let Err(e) = std::fs::write(procs, "0") {
            if policy.require {
                fail(format!("cannot join cgroup {procs}: {e}"));
            }
            eprintln!("ferrepl launcher: cannot join cgroup {procs}: {e}");
        }
    }
    SERVER.store(parent, Ordering::SeqCst);
    #[cfg(target_os = "linux")]
    if policy.mounts.is_some()
        && let Err(e) = super::namespaces::enter_user()
    {
        fail(e);
    }
    let status_pipe = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => fail(format!("pipe: {e}")),
    };
    // Held back until the handlers are in place, so a SIGTERM right after
    // the fork cannot kill the launcher and orphan the program.
    let _ = term_signals().thread_block();
    #[cfg(target_os = "linux")]
    if policy.mounts.is_some() {
        let (read_end, write_end) = status_pipe;
        let mut write_end = Some(write_end);
        let mut stack = vec![0u8; 4 << 20];
        let start_init = Box::new(|| -> isize {
            match write_end.take() {
                Some(w) => init(&policy, &program, w),
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
            Ok(child) => supervise(child, read_end, false),
            Err(e) => fail(format!(
                "cannot create mount/PID/IPC/UTS{} namespaces: {e}",
                if policy.network { "" } else { "/network" }
            )),
        }
    }
    // SAFETY: the launcher is single-threaded here (no runtime was started).
    match unsafe { fork() } {
        Err(e) => fail(format!("fork failed: {e}")),
        Ok(ForkResult::Child) => {
            drop(status_pipe.0);
            drop(status_pipe.1);
            start_program(&policy, &program)
        }
        Ok(ForkResult::Parent { child }) => {
            drop(status_pipe.1);
            supervise(child, status_pipe.0, true)
        }
    }
}

/// The program's process: confinement, then exec (or, for the probe, a
/// report of what is active).
fn start_program(policy: &Policy, program: &[CString]) -> ! {
    // Dispositions and the mask are inherited through exec: the program
    // starts with defaults (Python only handles SIGINT if it is not ignored).
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for sig in [
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTERM,
        Signal::SIGHUP,
    ] {
        // SAFETY: restoring default dispositions.
        unsafe {
            let _ = sigaction(sig, &dfl);
        }
    }
    let _ = SigSet::all().thread_unblock();
    let mut applied = apply(policy).unwrap_or_else(|e| fail(e));
    if policy.probe {
        applied.namespaces = policy.mounts.is_some();
        applied.network_blocked = !policy.network && network_blocked();
        println!("{}", serde_json::to_string(&applied).unwrap_or_default());
        std::process::exit(0);
    }
    let env: Vec<CString> = policy
        .env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let path = resolve_program(&program[0], policy);
    let _ = nix::unistd::execve(&path, program, &env);
    fail(format!(
        "cannot execute {:?}: {}",
        program[0],
        std::io::Error::last_os_error()
    ));
}

/// An absolute program path: as given when it has a slash, else searched in
/// the program's PATH.
fn resolve_program(program: &CString, policy: &Policy) -> CString {
    let bytes = program.as_bytes();
    if bytes.contains(&b'/') {
        return program.clone();
    }
    let name = String::from_utf8_lossy(bytes).into_owned();
    let path = policy.env.get("PATH").cloned().unwrap_or_default();
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = std::path::Path::new(dir).join(&name);
        if candidate.is_file()
            && let Ok(c) = CString::new(candidate.to_string_lossy().into_owned())
        {
            return c;
        }
    }
    program.clone()
}

/// PID 1 of the new PID namespace: builds the file system view, starts the
/// program, reaps orphans, and reports the program's status on `status`.
fn init(policy: &Policy, program: &[CString], status: OwnedFd) -> ! {
    // SAFETY: prctl(PR_SET_PDEATHSIG) has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    }
    #[cfg(target_os = "linux")]
    if let Some(plan) = &policy.mounts
        && let Err(e) = super::namespaces::build(plan)
    {
        fail(format!("cannot build the sandbox's file system view: {e}"));
    }
    #[cfg(target_os = "linux")]
    let relay = match &policy.egress {
        Some(e) => {
            if let Err(err) = super::relay::loopback_up() {
                fail(err);
            }
            Some(super::relay::listen(e.port).unwrap_or_else(|err| fail(err)))
        }
        None => None,
    };
    #[cfg(target_os = "linux")]
    let terminal = if policy.pty {
        Some(super::pty::open().unwrap_or_else(|e| fail(format!("pty: {e}"))))
    } else {
        None
    };
    // SAFETY: single-threaded; the child goes straight to start_program.
    let child = match unsafe { fork() } {
        Err(e) => fail(format!("fork failed: {e}")),
        Ok(ForkResult::Child) => {
            drop(status);
            #[cfg(target_os = "linux")]
            if let Some(t) = &terminal
                && let Err(e) = t.attach()
            {
                fail(e);
            }
            start_program(policy, program)
        }
        Ok(ForkResult::Parent { child }) => child,
    };
    CHILD.store(child.as_raw(), Ordering::SeqCst);
    // Threads only now: the program was forked from a single thread.
    #[cfg(target_os = "linux")]
    let relay_fd = relay.as_ref().map(|l| l.as_raw_fd());
    #[cfg(target_os = "linux")]
    if let (Some(listener), Some(e)) = (relay, &policy.egress) {
        super::relay::spawn(listener, e.socket.clone());
    }
    // With a terminal of its own the program leads its own process group,
    // which the server's group signals no longer reach: pass them on.
    let pty = policy.pty;
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    let forward = SigAction::new(
        SigHandler::Handler(on_forward),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler only reads atomics and calls kill(2).
    unsafe {
        for sig in [
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGTERM,
            Signal::SIGHUP,
        ] {
            let _ = sigaction(sig, if pty { &forward } else { &ignore });
        }
    }
    let _ = term_signals().thread_unblock();
    let mut keep = vec![status.as_raw_fd()];
    #[cfg(target_os = "linux")]
    if let Some(t) = &terminal {
        keep.extend([0, 1, t.master_fd()]);
    }
    #[cfg(target_os = "linux")]
    keep.extend(relay_fd);
    close_fds_except(&keep);
    #[cfg(target_os = "linux")]
    let result = match terminal {
        Some(t) => t.relay(child),
        None => wait_for(child),
    };
    #[cfg(not(target_os = "linux"))]
    let result = wait_for(child);
    CHILD.store(0, Ordering::SeqCst);
    // Everything else in the namespace goes with the program.
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    while waitpid(None, Some(WaitPidFlag::__WALL)).is_ok() {}
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

/// Reaps everything until `child` exits; its status.
fn wait_for(child: Pid) -> Option<WaitStatus> {
    loop {
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
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

/// The outer launcher's life: waits for `child` (the program, or a
/// namespace's PID 1) and exits with the program's status. `forward_terms`:
/// pass SIGTERM/SIGHUP from anyone but the server on to the program. Not
/// with namespaces: the kernel then reports the server's group signals to
/// us with sender pid 0 (it rewrites the shared siginfo for the group
/// members in the child PID namespace), so they cannot be told apart, and
/// passing them on would deliver them twice.
fn supervise(child: Pid, status_pipe: OwnedFd, forward_terms: bool) -> ! {
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
        let on_term_signal = if forward_terms { &term } else { &ignore };
        let _ = sigaction(Signal::SIGTERM, on_term_signal);
        let _ = sigaction(Signal::SIGHUP, on_term_signal);
    }
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

fn close_fds_except(keep: &[i32]) {
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
    if !policy.cwd.is_empty() {
        std::env::set_current_dir(&policy.cwd).map_err(|e| {
            format!(
                "cannot enter the working directory {} inside the sandbox: {e}",
                policy.cwd
            )
        })?;
    }
    #[cfg(target_os = "linux")]
    {
        match super::privileges::drop_all() {
            Ok(empty) => {
                applied.capabilities_dropped = empty && super::privileges::bounding_empty();
            }
            Err(e) if policy.require && !super::privileges::all_empty() => {
                return Err(format!("capabilities: {e}"));
            }
            Err(_) => applied.capabilities_dropped = super::privileges::all_empty(),
        }
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
        match super::seccomp::apply(policy.network || policy.egress.is_some()) {
            Ok(()) => applied.seccomp = true,
            Err(e) if policy.require => return Err(format!("seccomp: {e}")),
            Err(e) => applied.seccomp_error = Some(e),
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
    // An installer may connect to its relay's port only (in a network
    // namespace where nothing else listens).
    let net_rules: Vec<Result<NetPort, landlock::RulesetError>> = match &policy.egress {
        Some(e) if !policy.network => vec![Ok(NetPort::new(e.port, AccessNet::ConnectTcp))],
        _ => Vec::new(),
    };
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
        .add_rules(net_rules)
        .map_err(|e| e.to_string())?
        .restrict_self()
        .map_err(|e| e.to_string())?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "fully enforced".to_string(),
        RulesetStatus::PartiallyEnforced => "partially enforced (older kernel ABI)".to_string(),
        RulesetStatus::NotEnforced => "not enforced (kernel without Landlock)".to_string(),
    })
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
