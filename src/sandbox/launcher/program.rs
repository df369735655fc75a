//! The program's process: rlimits, the working directory, capabilities,
//! no_new_privs, Landlock and seccomp, then exec (or, for the startup
//! probe, a report of what is active).

use std::ffi::CString;
use std::os::fd::AsRawFd;

#[cfg(target_os = "linux")]
use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetError, RulesetStatus, Scope, path_beneath_rules,
};
use nix::sys::signal::{SigHandler, SigSet, sigaction};

use super::{LaunchError, PROGRAM_SIGNALS, fail, plain_action};
use crate::sandbox::{Applied, Policy};

/// A protection that could not be applied although --sandbox-require asks
/// for every one (or the working directory is missing).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("cannot enter the working directory {dir} inside the sandbox: {source}")]
    WorkingDir { dir: String, source: std::io::Error },
    #[cfg(target_os = "linux")]
    #[error("capabilities: {0}")]
    Capabilities(crate::sandbox::privileges::CapsetError),
    #[error("no_new_privs could not be set")]
    NoNewPrivs,
    #[cfg(target_os = "linux")]
    #[error("Landlock: {0}")]
    Landlock(RulesetError),
    #[cfg(target_os = "linux")]
    #[error("seccomp: {0}")]
    Seccomp(crate::sandbox::seccomp::SeccompError),
    #[cfg(target_os = "linux")]
    #[error(
        "the supervisor of protected places could not start ({0}); it needs seccomp user notification (Linux 5.14 or later); the operator can free the places with --allow-write-protected all"
    )]
    Protection(String),
    #[cfg(target_os = "linux")]
    #[error(
        "cannot start the session's supervisor of protected places: its uid already runs --max-processes ({0}) tasks (RLIMIT_NPROC counts every process and thread of the uid: under a root server, all of the tenant's sessions and jobs); end some of them, or raise --max-processes"
    )]
    Tasks(u64),
    #[cfg(not(target_os = "linux"))]
    #[error("{0} needs Linux")]
    LinuxOnly(&'static str),
}

/// The program's process: confinement, then exec (or, for the probe, a
/// report of what is active).
pub(super) fn start_program(policy: &Policy, program: &[CString]) -> ! {
    // Dispositions and the mask are inherited through exec: the program
    // starts with defaults (Python only handles SIGINT if it is not ignored).
    let dfl = plain_action(SigHandler::SigDfl);
    for sig in PROGRAM_SIGNALS {
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
    fail(exec(policy, program))
}

/// Execs the program with the policy's environment; returns only on failure.
fn exec(policy: &Policy, program: &[CString]) -> LaunchError {
    let env: Vec<CString> = policy
        .env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let path = resolve_program(&program[0], policy);
    let _ = nix::unistd::execve(&path, program, &env);
    let source = std::io::Error::last_os_error();
    LaunchError::Exec {
        program: program[0].clone(),
        source,
    }
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
        if crate::executables::is_executable(&candidate)
            && let Ok(c) = CString::new(candidate.to_string_lossy().into_owned())
        {
            return c;
        }
    }
    program.clone()
}

/// setrlimit's resource type: glibc's own enum, a C int elsewhere.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
type RlimitResource = libc::__rlimit_resource_t;
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
type RlimitResource = libc::c_int;

/// Sets both limits of `resource` to `value`, or to the hard limit this
/// process has where that is lower (a process without CAP_SYS_RESOURCE,
/// as the program is once its capabilities are gone, may only lower it).
/// What it ended up as.
fn set_limit(resource: RlimitResource, value: u64) -> Result<u64, std::io::Error> {
    let mut now = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    if unsafe { libc::getrlimit(resource, &mut now) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let value = (value as libc::rlim_t).min(now.rlim_max);
    let lim = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: setrlimit reads the struct only.
    if unsafe { libc::setrlimit(resource, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(value)
}

/// Applies the policy to this (single-threaded) process; reports what is active.
pub fn apply(policy: &Policy) -> Result<Applied, ApplyError> {
    #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
    let mut applied = Applied::default();
    if !policy.cwd.is_empty() {
        std::env::set_current_dir(&policy.cwd).map_err(|source| ApplyError::WorkingDir {
            dir: policy.cwd.clone(),
            source,
        })?;
    }
    #[cfg(target_os = "linux")]
    {
        use crate::sandbox::privileges;
        match privileges::drop_all(policy.identity) {
            Ok(empty) => {
                applied.capabilities_dropped = empty && privileges::bounding_empty();
            }
            Err(e @ privileges::CapsetError::Identity { .. }) => {
                // Never run on as root when another uid was asked for.
                return Err(ApplyError::Capabilities(e));
            }
            Err(e) if policy.require && !privileges::all_empty() => {
                return Err(ApplyError::Capabilities(e));
            }
            Err(_) => applied.capabilities_dropped = privileges::all_empty(),
        }
        applied.uid = nix::unistd::getuid().as_raw();
    }
    // After the switch of uid: RLIMIT_NPROC binds the session's uid (root
    // is never held to it), and without capabilities no limit can be raised
    // again. Before confine, whose supervisor is forked under them.
    applied.rlimits = set_limits(policy);
    #[cfg(target_os = "linux")]
    confine(policy, &mut applied)?;
    #[cfg(not(target_os = "linux"))]
    if policy.require {
        return Err(ApplyError::LinuxOnly("--sandbox-require"));
    }
    Ok(applied)
}

/// no_new_privs, Landlock and seccomp.
#[cfg(target_os = "linux")]
fn confine(policy: &Policy, applied: &mut Applied) -> Result<(), ApplyError> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) has no memory effects.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == 0 {
        applied.no_new_privs = true;
    } else if policy.require {
        return Err(ApplyError::NoNewPrivs);
    }
    if policy.landlock {
        match landlock(policy) {
            Ok(status) => applied.landlock = status,
            Err(e) if policy.require => return Err(ApplyError::Landlock(e)),
            Err(e) => applied.landlock = format!("unavailable ({e})"),
        }
    }
    // After Landlock (the supervisor shares the program's domain), before
    // the main filter (which denies what the supervisor needs).
    if let Some(protected) = &policy.protected {
        supervise(protected).map_err(|e| match e {
            Some(e) => ApplyError::Protection(e),
            None => ApplyError::Tasks(policy.max_processes.unwrap_or_default()),
        })?;
        applied.protection = Some(Ok(()));
    }
    if policy.seccomp {
        use crate::sandbox::seccomp::Sockets;
        let sockets = if policy.network || policy.egress.is_some() {
            Sockets::Network
        } else if policy.inet_in_netns && policy.mounts.is_some() {
            Sockets::InNetns
        } else {
            Sockets::Unix
        };
        match crate::sandbox::seccomp::apply(sockets) {
            Ok(()) => applied.seccomp = true,
            Err(e) if policy.require => return Err(ApplyError::Seccomp(e)),
            Err(e) => applied.seccomp_error = Some(e.to_string()),
        }
    }
    Ok(())
}

/// Forks the supervisor of protected places, which stays behind as this
/// process's parent in its place (serving until the program exits, then
/// exiting as it did); the program goes on here with the filter that sends
/// its changing calls to it. Err(None): the fork was refused for
/// RLIMIT_NPROC (the uid runs as many tasks as it may).
#[cfg(target_os = "linux")]
fn supervise(protected: &crate::sandbox::protected::Protected) -> Result<(), Option<String>> {
    use crate::sandbox::supervisor;
    let handoff = supervisor::handoff().map_err(|e| Some(format!("socketpair: {e}")))?;
    // SAFETY: the launcher is single-threaded here.
    match unsafe { nix::unistd::fork() } {
        Err(nix::errno::Errno::EAGAIN) => Err(None),
        Err(e) => Err(Some(format!("fork: {e}"))),
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(handoff.theirs);
            supervisor::serve(protected, handoff.ours, child.as_raw())
        }
        Ok(nix::unistd::ForkResult::Child) => {
            drop(handoff.ours);
            die_with_parent_supervisor();
            // A switch of uid left us undumpable, which would keep the
            // supervisor out of our memory and /proc until exec.
            // SAFETY: prctl(PR_SET_DUMPABLE) has no memory effects.
            unsafe {
                libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            }
            let listener = supervisor::install().map_err(|e| Some(e.to_string()))?;
            supervisor::send_fd(&handoff.theirs, listener.as_raw_fd())
                .map_err(|e| Some(format!("handing over the listener: {e}")))?;
            drop(listener);
            drop(handoff.theirs);
            // A first call the supervisor answers (ENOENT for an empty
            // path); ENOSYS would mean nobody serves the filter.
            // SAFETY: mkdir of an empty C string.
            let r = unsafe { libc::mkdir(c"".as_ptr(), 0) };
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ENOENT) if r < 0 => Ok(()),
                _ => Err(Some("the supervisor does not answer".into())),
            }
        }
    }
}

/// The program dies with its supervisor (which then can no longer check
/// its calls).
#[cfg(target_os = "linux")]
fn die_with_parent_supervisor() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    }
}

/// The resource limits (no core dumps, ever), set once the process runs as
/// the session's uid; what was set, for the report.
///
/// RLIMIT_NPROC counts every task (processes and threads) of the uid in
/// the process's user namespace: under host root, all of a tenant's
/// sessions and jobs (its uid's); where the launcher made a user namespace
/// (an unprivileged server, root of a pod's namespace), the session's own.
/// The probe reports it without setting it: how many tasks a uid runs at
/// start says nothing of what the kernel allows, and a busy uid must not
/// pass for one sessions cannot run as. A program left as root (a
/// degraded root server) does not get it: it would count the server's own
/// tasks (root of a pod's namespace), or bind nothing (the host's root);
/// the process-tree watch holds it.
fn set_limits(policy: &Policy) -> Vec<String> {
    let mut rlimits = Vec::new();
    let mut set = |resource, value, shown: &dyn Fn(u64) -> String| match set_limit(resource, value)
    {
        Ok(v) if v == value => rlimits.push(shown(v)),
        Ok(v) => rlimits.push(format!("{} (the host's hard limit)", shown(v))),
        Err(e) => rlimits.push(format!("{} NOT set ({e})", shown(value))),
    };
    if let Some(b) = policy.max_file_bytes {
        set(libc::RLIMIT_FSIZE, b, &|v| format!("file size {v} B"));
    }
    if let Some(n) = policy.max_open_files {
        set(libc::RLIMIT_NOFILE, n, &|v| format!("open files {v}"));
    }
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    if let Some(n) = policy.max_processes
        && !root
    {
        let shown = |v: u64| format!("processes {v} (per uid, threads included)");
        if policy.probe {
            rlimits.push(shown(n));
        } else {
            set(libc::RLIMIT_NPROC, n, &shown);
        }
    }
    // No core dumps, ever.
    let _ = set_limit(libc::RLIMIT_CORE, 0);
    rlimits
}

#[cfg(target_os = "linux")]
fn landlock(policy: &Policy) -> Result<String, RulesetError> {
    let abi = ABI::V6;
    let mut ruleset = Ruleset::default()
        .set_compatibility(if policy.require {
            CompatLevel::HardRequirement
        } else {
            CompatLevel::BestEffort
        })
        .handle_access(AccessFs::from_all(abi))?;
    if !policy.network {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
    }
    let ruleset = ruleset.scope(Scope::from_all(abi))?;
    // An installer may connect to its relay's port only (in a network
    // namespace where nothing else listens).
    let net_rules: Vec<Result<NetPort, RulesetError>> = match &policy.egress {
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
        .create()?
        .add_rules(path_beneath_rules(
            existing(&policy.read),
            AccessFs::from_read(abi),
        ))?
        .add_rules(path_beneath_rules(
            existing(&policy.write),
            AccessFs::from_all(abi),
        ))?
        .add_rules(path_beneath_rules(
            existing(&policy.list),
            AccessFs::ReadDir,
        ))?
        .add_rules(net_rules)?
        .restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => crate::sandbox::LANDLOCK_FULL.to_string(),
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
