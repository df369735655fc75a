//! The seccomp filter of sandboxed programs: system calls that reach past
//! the sandbox (kernel state, other processes, new namespaces, devices,
//! terminal injection, non-Unix sockets) fail with EPERM.

use std::collections::BTreeMap;

use seccompiler::{
    BackendError, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Why the filters could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("no seccomp support for this architecture")]
    UnsupportedArch,
    #[error(transparent)]
    Build(#[from] BackendError),
    #[error(transparent)]
    Install(#[from] seccompiler::Error),
}

pub(crate) fn target_arch() -> Result<TargetArch, SeccompError> {
    if cfg!(target_arch = "x86_64") {
        Ok(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Ok(TargetArch::aarch64)
    } else {
        Err(SeccompError::UnsupportedArch)
    }
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, BackendError> {
    SeccompRule::new(conds)
}

/// Denied whatever their arguments.
fn always_denied() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_fanotify_init,
        libc::SYS_userfaultfd,
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
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_settimeofday,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        libc::SYS_quotactl,
        libc::SYS_acct,
        libc::SYS_syslog,
        libc::SYS_vhangup,
        libc::SYS_open_by_handle_at,
        libc::SYS_pidfd_getfd,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([libc::SYS_uselib, libc::SYS_ioperm, libc::SYS_iopl]);
    v
}

/// The denials keyed by system call, each with the argument conditions that
/// select the denied calls (no condition: every call).
fn rules(network: Sockets) -> Result<BTreeMap<i64, Vec<SeccompRule>>, BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for sys in always_denied() {
        rules.insert(sys, vec![]);
    }
    // Sockets: Unix only, plus IPv4/IPv6 when the network is on (no packet,
    // netlink, vsock, bluetooth... sockets).
    let mut families = vec![libc::AF_UNIX];
    if network != Sockets::Unix {
        families.extend([libc::AF_INET, libc::AF_INET6]);
    }
    let other_family = |arg: u8, families: &[i32]| -> Result<SeccompRule, BackendError> {
        rule(
            families
                .iter()
                .map(|f| cond(arg, SeccompCmpOp::Ne, *f as u64))
                .collect::<Result<_, _>>()?,
        )
    };
    rules.insert(libc::SYS_socketpair, vec![other_family(0, &families)?]);
    if network == Sockets::InNetns {
        // Route netlink too, which lists the namespace's own interfaces
        // (getifaddrs: libzmq asks it for every address it binds).
        families.push(libc::AF_NETLINK);
        let other_netlink = rule(vec![
            cond(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)?,
            cond(2, SeccompCmpOp::Ne, libc::NETLINK_ROUTE as u64)?,
        ])?;
        rules.insert(
            libc::SYS_socket,
            vec![other_family(0, &families)?, other_netlink],
        );
    } else {
        rules.insert(libc::SYS_socket, vec![other_family(0, &families)?]);
    }
    // Typing into a terminal (another job's, or back into our own shell).
    // (The request type differs between libcs: the casts are not no-ops everywhere.)
    #[allow(clippy::unnecessary_cast)]
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCSTI as u64)?])?,
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCLINUX as u64)?])?,
        ],
    );
    // New namespaces through clone flags; clone3 hides its flags in memory,
    // so it is refused by a second filter with ENOSYS (libc falls back).
    let ns_flags = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWCGROUP,
    ];
    rules.insert(
        libc::SYS_clone,
        ns_flags
            .iter()
            .map(|f| rule(vec![cond(0, SeccompCmpOp::MaskedEq(*f as u64), *f as u64)?]))
            .collect::<Result<_, _>>()?,
    );
    // Device nodes (FIFOs and sockets stay allowed).
    let devices = |arg: u8| -> Result<Vec<SeccompRule>, BackendError> {
        [libc::S_IFCHR, libc::S_IFBLK]
            .iter()
            .map(|kind| {
                rule(vec![cond(
                    arg,
                    SeccompCmpOp::MaskedEq(libc::S_IFMT as u64),
                    *kind as u64,
                )?])
            })
            .collect()
    };
    rules.insert(libc::SYS_mknodat, devices(2)?);
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_mknod, devices(1)?);
    // Set-user-ID and set-group-ID bits: where a session owns another
    // owner's files (an idmapped workspace shows root's as its own), such
    // a program would run as that owner on the host, outside the sandbox.
    // (A file created with them loses them at its first write.)
    let set_id = |arg: u8| -> Result<Vec<SeccompRule>, BackendError> {
        [libc::S_ISUID, libc::S_ISGID]
            .iter()
            .map(|bit| {
                rule(vec![cond(
                    arg,
                    SeccompCmpOp::MaskedEq(*bit as u64),
                    *bit as u64,
                )?])
            })
            .collect()
    };
    rules.insert(libc::SYS_fchmod, set_id(1)?);
    rules.insert(libc::SYS_fchmodat, set_id(2)?);
    // fchmodat2: 452 on every architecture (not yet in libc everywhere).
    rules.insert(452, set_id(2)?);
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_chmod, set_id(1)?);
    Ok(rules)
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: i32,
) -> Result<seccompiler::BpfProgram, SeccompError> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        target_arch()?,
    )?;
    Ok(filter.try_into()?)
}

/// The x32 ABI shares x86_64's audit architecture but numbers its calls
/// with bit 30 set, so the rules keyed on x86_64 numbers would not see them:
/// every x32 call fails with ENOSYS. (32-bit `int 0x80` calls have another
/// architecture and are killed by the main filter's architecture check.)
#[cfg(target_arch = "x86_64")]
fn x32_filter() -> seccompiler::BpfProgram {
    use seccompiler::sock_filter;
    const LD_NR: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS, offset 0 = nr
    const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    const X32_BIT: u32 = 0x4000_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    vec![
        sock_filter {
            code: LD_NR,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: JGE,
            jt: 0,
            jf: 1,
            k: X32_BIT,
        },
        sock_filter {
            code: RET,
            jt: 0,
            jf: 0,
            k: RET_ERRNO | libc::ENOSYS as u32,
        },
        sock_filter {
            code: RET,
            jt: 0,
            jf: 0,
            k: RET_ALLOW,
        },
    ]
}

/// The sockets a program may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sockets {
    /// Unix sockets only (network off).
    Unix,
    /// Unix, IPv4 and IPv6.
    Network,
    /// Those, plus route netlink, inside an empty network namespace of its
    /// own where there is nothing to reach (a Jupyter kernel).
    InNetns,
}

/// Installs the filters on this thread (needs no_new_privs first).
pub fn apply(network: Sockets) -> Result<(), SeccompError> {
    let main = compile(rules(network)?, libc::EPERM)?;
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, vec![]);
    let clone3 = compile(clone3, libc::ENOSYS)?;
    seccompiler::apply_filter(&main)?;
    #[cfg(target_arch = "x86_64")]
    seccompiler::apply_filter(&x32_filter())?;
    Ok(seccompiler::apply_filter(&clone3)?)
}
