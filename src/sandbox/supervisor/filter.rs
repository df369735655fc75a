//! The program's filter that sends its creating and changing calls to the
//! supervisor, installed with a new listener.

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd};

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

use crate::sandbox::seccomp::{SeccompError, target_arch};

/// The marker seccompiler compiles as the match action, rewritten to
/// SECCOMP_RET_USER_NOTIF.
const MARK: u32 = 0x0fe7;

/// Calls that change the file system whatever their arguments.
fn always() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_mkdirat,
        libc::SYS_mknodat,
        libc::SYS_symlinkat,
        libc::SYS_linkat,
        libc::SYS_renameat,
        libc::SYS_renameat2,
        libc::SYS_unlinkat,
        libc::SYS_truncate,
        libc::SYS_fchmodat,
        452, // fchmodat2
        libc::SYS_fchmod,
        libc::SYS_bind,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_mkdir,
        libc::SYS_mknod,
        libc::SYS_symlink,
        libc::SYS_link,
        libc::SYS_rename,
        libc::SYS_unlink,
        libc::SYS_rmdir,
        libc::SYS_creat,
        libc::SYS_chmod,
    ]);
    v
}

/// Opens that may write or create: any of these flag bits set.
const WRITING_FLAGS: [i32; 4] = [libc::O_WRONLY, libc::O_RDWR, libc::O_CREAT, libc::O_TRUNC];

fn rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in always() {
        rules.insert(nr, Vec::new());
    }
    let writing = |arg: u8| -> Result<Vec<SeccompRule>, SeccompError> {
        WRITING_FLAGS
            .iter()
            .map(|bit| {
                let cond = SeccompCondition::new(
                    arg,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::MaskedEq(*bit as u64),
                    *bit as u64,
                )?;
                Ok(SeccompRule::new(vec![cond])?)
            })
            .collect()
    };
    rules.insert(libc::SYS_openat, writing(2)?);
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_open, writing(1)?);
    Ok(rules)
}

/// The filter as BPF, its match action turned into a user notification.
fn program() -> Result<seccompiler::BpfProgram, SeccompError> {
    let filter = SeccompFilter::new(
        rules()?,
        SeccompAction::Allow,
        SeccompAction::Trace(MARK),
        target_arch()?,
    )?;
    let mut program: seccompiler::BpfProgram = filter.try_into()?;
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    let marked = libc::SECCOMP_RET_TRACE | MARK;
    for insn in program.iter_mut() {
        if insn.code == RET && insn.k == marked {
            insn.k = libc::SECCOMP_RET_USER_NOTIF;
        }
    }
    Ok(program)
}

/// Installs the filter on this thread (no_new_privs first) and returns its
/// listener; openat2, whose flags lie in memory, fails with ENOSYS (libc
/// and Python fall back to openat).
pub fn install() -> Result<OwnedFd, SeccompError> {
    let program = program()?;
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: the program outlives the call; the kernel copies it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(SeccompError::Install(seccompiler::Error::Seccomp(
            std::io::Error::last_os_error(),
        )));
    }
    // SAFETY: the kernel returned a new descriptor.
    let listener = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut openat2 = BTreeMap::new();
    openat2.insert(libc::SYS_openat2, Vec::new());
    let enosys = SeccompFilter::new(
        openat2,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        target_arch()?,
    )?;
    let enosys: seccompiler::BpfProgram = enosys.try_into()?;
    seccompiler::apply_filter(&enosys)?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_marker_becomes_a_notification_and_nothing_else_is_changed() {
        let program = super::program().expect("compiles");
        let notify = program
            .iter()
            .filter(|i| i.code == 0x06 && i.k == libc::SECCOMP_RET_USER_NOTIF)
            .count();
        assert!(notify > 0);
        assert!(
            !program
                .iter()
                .any(|i| i.code == 0x06 && i.k & 0xffff_0000 == libc::SECCOMP_RET_TRACE)
        );
    }
}
