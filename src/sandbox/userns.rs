//! User namespaces: the one a launcher without CAP_SYS_ADMIN enters first
//! (mapping its own ids, and as root of a pod's namespace the program's
//! uid too), and the ones that give idmapped mounts their mapping (a
//! file's owner on disk shown as the program's uid). Split from
//! `namespaces`, which builds the mount, PID, IPC and UTS view.

use std::io;
use std::os::fd::OwnedFd;

use super::MountPlan;
use super::namespaces::{NamespaceError, write_file};

/// Whether this process holds CAP_SYS_ADMIN in its user namespace.
fn has_sys_admin() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let v = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(v.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// Without CAP_SYS_ADMIN, enters a user namespace first; it grants the
/// capabilities the other namespaces and the mounts need, inside it only.
/// The caller's uid and gid are mapped to themselves, so files keep their
/// owner; root there (root of a pod's own user namespace) also maps the
/// program's `identity`, which CAP_SETUID and CAP_SETGID allow.
pub fn enter_user(identity: Option<super::Identity>) -> Result<(), NamespaceError> {
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    if uid == 0 && has_sys_admin() {
        return Ok(());
    }
    if let Some(id) = identity.filter(|id| uid == 0 && id.uid != 0) {
        return enter_mapped(id);
    }
    // SAFETY: unshare has no memory effects.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        return Err(NamespaceError::UserNamespace(io::Error::last_os_error()));
    }
    write_file("/proc/self/setgroups", "deny")?;
    write_file("/proc/self/uid_map", &format!("{uid} {uid} 1"))?;
    write_file("/proc/self/gid_map", &format!("{gid} {gid} 1"))?;
    Ok(())
}

/// Root without CAP_SYS_ADMIN: a user namespace mapping root and the
/// program's `id` to themselves. Only a process holding CAP_SETUID and
/// CAP_SETGID in this namespace may write such maps, so a child left here
/// writes them (mapping root also takes CAP_SETFCAP). Where it cannot,
/// root alone is mapped and the program's switch to `id` fails later.
fn enter_mapped(id: super::Identity) -> Result<(), NamespaceError> {
    use std::io::{Read, Write};
    let pipe_err = |source| NamespaceError::Write {
        path: "pipe",
        source,
    };
    let (go_r, go_w) = std::io::pipe().map_err(pipe_err)?;
    let (done_r, done_w) = std::io::pipe().map_err(pipe_err)?;
    // SAFETY: the launcher is single-threaded; the child only reads,
    // writes files and exits.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(NamespaceError::UserNamespace(e.into())),
        Ok(nix::unistd::ForkResult::Child) => {
            drop((go_w, done_r));
            let (mut go_r, mut done_w) = (go_r, done_w);
            let mut byte = [0u8; 1];
            let ok = go_r.read_exact(&mut byte).is_ok() && {
                let dir = format!("/proc/{}", nix::unistd::getppid());
                let uids = format!("0 0 1\n{} {} 1", id.uid, id.uid);
                let gids = format!("0 0 1\n{} {} 1", id.gid, id.gid);
                std::fs::write(format!("{dir}/uid_map"), uids).is_ok()
                    && std::fs::write(format!("{dir}/gid_map"), gids).is_ok()
            };
            let _ = done_w.write_all(if ok { b"1" } else { b"0" });
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop((go_r, done_w));
            let (mut go_w, mut done_r) = (go_w, done_r);
            // SAFETY: unshare has no memory effects.
            let unshared = unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0;
            let err = io::Error::last_os_error();
            let mut byte = [0u8; 1];
            let mapped = unshared
                && go_w.write_all(b"1").is_ok()
                && done_r.read_exact(&mut byte).is_ok()
                && byte[0] == b'1';
            drop(go_w);
            let _ = nix::sys::wait::waitpid(child, None);
            if !unshared {
                return Err(NamespaceError::UserNamespace(err));
            }
            if !mapped {
                write_file("/proc/self/uid_map", "0 0 1")?;
                write_file("/proc/self/setgroups", "deny")?;
                write_file("/proc/self/gid_map", "0 0 1")?;
            }
            Ok(())
        }
    }
}

/// The idmappings the plan's binds need, for a program running as
/// `program`: one user namespace per owner. Made before PID 1 is cloned
/// (the children that make them are found in this PID namespace's /proc).
pub fn idmappings(
    plan: &MountPlan,
    program: super::Identity,
) -> Result<Vec<Idmapping>, NamespaceError> {
    let mut made: Vec<Idmapping> = Vec::new();
    for owner in plan.binds.iter().filter_map(|b| b.idmap) {
        if !made.iter().any(|(o, _)| *o == owner) {
            made.push((owner, idmap_userns(owner, program)?));
        }
    }
    Ok(made)
}

/// An owner on disk and the user namespace that shows its files as the
/// program's.
pub type Idmapping = (super::Identity, OwnedFd);

/// A user namespace whose only mapping shows `owner`'s files as the
/// program's (`shown`): the idmapping of a mount. Made by a child that
/// waits while its maps are written, and kept by a descriptor.
fn idmap_userns(owner: super::Identity, shown: super::Identity) -> Result<OwnedFd, NamespaceError> {
    use std::io::{Read, Write};
    let fail = |what: &'static str| move |source| NamespaceError::Write { path: what, source };
    let (ready_r, ready_w) = std::io::pipe().map_err(fail("pipe"))?;
    let (go_r, go_w) = std::io::pipe().map_err(fail("pipe"))?;
    // SAFETY: PID 1 is single-threaded; the child only unshares, writes,
    // reads and exits.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(NamespaceError::Write {
            path: "fork",
            source: e.into(),
        }),
        Ok(nix::unistd::ForkResult::Child) => {
            drop((ready_r, go_w));
            let mut ready_w = ready_w;
            let mut go_r = go_r;
            // SAFETY: unshare has no memory effects.
            let ok = unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0;
            let _ = ready_w.write_all(if ok { b"1" } else { b"0" });
            let _ = go_r.read(&mut [0u8; 1]);
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop((ready_w, go_r));
            let mut ready_r = ready_r;
            let mut byte = [0u8; 1];
            let made = ready_r.read_exact(&mut byte).is_ok() && byte[0] == b'1';
            let result = if made {
                let dir = format!("/proc/{child}");
                let maps = std::fs::write(
                    format!("{dir}/uid_map"),
                    format!("{} {} 1", owner.uid, shown.uid),
                )
                .and_then(|()| {
                    std::fs::write(
                        format!("{dir}/gid_map"),
                        format!("{} {} 1", owner.gid, shown.gid),
                    )
                })
                .and_then(|()| std::fs::File::open(format!("{dir}/ns/user")));
                maps.map(OwnedFd::from)
                    .map_err(fail("an idmapping's user namespace"))
            } else {
                Err(NamespaceError::UserNamespace(io::Error::other(
                    "for an idmapped mount",
                )))
            };
            drop(go_w);
            let _ = nix::sys::wait::waitpid(child, None);
            result
        }
    }
}
