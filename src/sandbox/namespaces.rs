//! Private namespaces for one sandboxed process tree: its own mount, PID,
//! IPC and UTS namespaces (and network namespace when the network is off),
//! entered by the launcher before it forks the namespace's PID 1.
//!
//! The file system view is built from nothing: a fresh tmpfs becomes the
//! root (pivot_root), and only what the plan names is bound into it, each
//! path at its own place and read-only unless the plan makes it writable
//! (the workspace, the process's temporary directory, --allow-write). The
//! plan's symlinks and small files (`/etc/passwd`, `/etc/group`) are
//! written into it, `/dev` is a fresh tmpfs with a few host devices, a
//! private devpts and a private `/dev/shm`, and `/proc` is the new PID
//! namespace's own. The old root is detached: nothing else is reachable.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::userns::Idmapping;
use super::{Bind, MountPlan};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
/// Read-only, without set-uid and devices: what the system and every
/// exposed read-only path become.
const MOUNT_ATTR_LOCKED: u64 = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Host devices every sandbox gets.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Parts of the new /proc that stay read-only even for a uid-0 session.
const PROC_READ_ONLY: &[&str] = &[
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];

/// Why the namespaces or the file system view inside them could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("cannot create a user namespace: {0}")]
    UserNamespace(io::Error),
    #[error("write {path}: {source}")]
    Write {
        path: &'static str,
        source: io::Error,
    },
    #[error("bad path {}", .0.display())]
    BadPath(PathBuf),
    #[error(transparent)]
    Nul(#[from] std::ffi::NulError),
    /// A mount system call on `path` failed.
    #[error("{what} {}: {source}", .path.display())]
    Syscall {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("mkdir {}: {source}", .path.display())]
    Mkdir { path: PathBuf, source: io::Error },
    #[error("cannot make mount point {}: {source}", .path.display())]
    MountPoint { path: PathBuf, source: io::Error },
    #[error("symlink /dev/{link}: {source}")]
    Symlink {
        link: &'static str,
        source: io::Error,
    },
}

fn cstr(path: &Path) -> Result<CString, NamespaceError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| NamespaceError::BadPath(path.to_path_buf()))
}

/// `what` on `path` failed with the last OS error.
fn os_err(what: &'static str, path: &Path) -> NamespaceError {
    let source = io::Error::last_os_error();
    NamespaceError::Syscall {
        what,
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn write_file(path: &'static str, data: &str) -> Result<(), NamespaceError> {
    std::fs::write(path, data).map_err(|source| NamespaceError::Write { path, source })
}

/// Makes the detached tree `tree` an idmapped mount (before it is attached).
fn set_idmap(tree: &OwnedFd, userns: &OwnedFd, path: &Path) -> Result<(), NamespaceError> {
    use std::os::fd::AsRawFd;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: mount_setattr on an fd we own with an owned struct.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(os_err("idmap the mount of", path));
    }
    Ok(())
}

/// The namespaces PID 1 is cloned into. (Cloned rather than unshared: a
/// process that unshares a PID namespace sees the pid of every signal's
/// sender as 0 from then on, and the launcher must tell the server's
/// signals from others'.)
pub fn clone_flags(network: bool) -> nix::sched::CloneFlags {
    use nix::sched::CloneFlags;
    let mut flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    if !network {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    flags
}

fn mount(
    src: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), NamespaceError> {
    let src = src.map(CString::new).transpose()?;
    let fstype = fstype.map(CString::new).transpose()?;
    let data = data.map(CString::new).transpose()?;
    let target_c = cstr(target)?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is a valid NUL-terminated string or null.
    let rc = unsafe {
        libc::mount(
            ptr(&src),
            target_c.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data) as *const libc::c_void,
        )
    };
    if rc != 0 {
        return Err(os_err("mount on", target));
    }
    Ok(())
}

/// A new instance of the pseudo file system `fstype` (tmpfs, devpts, proc)
/// on `target`.
fn mount_new(
    fstype: &str,
    target: &Path,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), NamespaceError> {
    mount(Some(fstype), target, Some(fstype), flags, data)
}

/// `mount_new` on a directory made for it.
fn mount_new_dir(
    fstype: &str,
    dir: &Path,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), NamespaceError> {
    mount_point(dir, true)?;
    mount_new(fstype, dir, flags, Some(data))
}

/// A detached recursive copy of the mount tree at `path`.
fn clone_tree(path: &Path) -> Result<OwnedFd, NamespaceError> {
    let c = cstr(path)?;
    // SAFETY: open_tree with a valid path; the fd is owned on success.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(os_err("open_tree", path));
    }
    // SAFETY: the kernel returned a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn attach(tree: &OwnedFd, target: &Path) -> Result<(), NamespaceError> {
    use std::os::fd::AsRawFd;
    let c = cstr(target)?;
    let empty = c"";
    // SAFETY: move_mount of a detached tree fd onto a valid path.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(os_err("move_mount onto", target));
    }
    Ok(())
}

fn set_attr(path: &Path, set: u64, clear: u64, recursive: bool) -> Result<(), NamespaceError> {
    let c = cstr(path)?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr with a valid path and an owned struct.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(os_err("mount_setattr", path));
    }
    Ok(())
}

/// Makes the directories above `path`.
fn make_parent(path: &Path) -> Result<(), NamespaceError> {
    match path.parent() {
        Some(parent) => std::fs::create_dir_all(parent).map_err(|source| NamespaceError::Mkdir {
            path: parent.to_path_buf(),
            source,
        }),
        None => Ok(()),
    }
}

/// Makes `path` exist as a mount point: a directory, or a file (`dir`
/// false).
fn mount_point(path: &Path, dir: bool) -> Result<(), NamespaceError> {
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    make_parent(path)?;
    let made = if dir {
        std::fs::create_dir(path)
    } else {
        std::fs::File::create(path).map(|_| ())
    };
    made.map_err(|source| NamespaceError::MountPoint {
        path: path.to_path_buf(),
        source,
    })
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

/// A path the policy exposes, cloned while the host's tree is in view.
struct Exposed<'a> {
    bind: &'a Bind,
    tree: OwnedFd,
    dir: bool,
}

impl Exposed<'_> {
    fn path(&self) -> &Path {
        Path::new(&self.bind.path)
    }
}

/// Builds the file system view of this (new) mount namespace: a fresh
/// tmpfs root holding only the plan's binds, links and files, a private
/// `/dev` and `/proc`; then pivots into it and lets the old root go.
pub fn build(plan: &MountPlan, idmappings: &[Idmapping]) -> Result<(), NamespaceError> {
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;

    // Clone what will be exposed before anything covers it.
    let exposed = clone_exposed(plan, idmappings)?;
    let devices = clone_devices(plan)?;

    // The new root is assembled on the process's own temporary directory
    // (a directory that always exists; its contents were cloned above).
    let root = PathBuf::from(&plan.tmp);
    mount_new(
        "tmpfs",
        &root,
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=0755,size=4m"),
    )?;
    let at = |p: &Path| inside(&root, p);
    make_links(plan, &root)?;
    write_files(plan, &root)?;
    expose_all(&exposed, &root)?;
    build_dev(plan, devices, &at(Path::new("/dev")))?;
    // While the old root (and its /proc) is still visible: a user
    // namespace may mount a proc only where one is fully visible.
    build_proc(&at(Path::new("/proc")))?;
    tmp_link(plan, &root)?;
    seal(plan, &root)?;
    pivot(&root)?;
    set_attr(Path::new("/"), MOUNT_ATTR_LOCKED, 0, false)?;
    let name = b"ferrepl";
    // SAFETY: sethostname with a valid buffer, in our own UTS namespace.
    unsafe {
        libc::sethostname(name.as_ptr().cast(), name.len());
    }
    Ok(())
}

/// `path` (absolute) under the new root `root`.
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The plan's symlinks (merged-/usr `/bin`, `/etc/localtime`...).
fn make_links(plan: &MountPlan, root: &Path) -> Result<(), NamespaceError> {
    for link in &plan.links {
        let path = inside(root, Path::new(&link.path));
        make_parent(&path)?;
        std::os::unix::fs::symlink(&link.target, &path).map_err(|source| {
            NamespaceError::MountPoint {
                path: path.clone(),
                source,
            }
        })?;
    }
    Ok(())
}

/// The plan's files (`/etc/passwd`, `/etc/group`), world-readable.
fn write_files(plan: &MountPlan, root: &Path) -> Result<(), NamespaceError> {
    use std::os::unix::fs::PermissionsExt;
    for file in &plan.files {
        let path = inside(root, Path::new(&file.path));
        make_parent(&path)?;
        let made = std::fs::write(&path, &file.content)
            .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)));
        made.map_err(|source| NamespaceError::MountPoint {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// `/tmp` leads to the process's own temporary directory, unless the view
/// already has a `/tmp` (a workspace beneath it).
fn tmp_link(plan: &MountPlan, root: &Path) -> Result<(), NamespaceError> {
    let tmp = root.join("tmp");
    if std::fs::symlink_metadata(&tmp).is_ok() {
        return Ok(());
    }
    std::os::unix::fs::symlink(&plan.tmp, &tmp).map_err(|source| NamespaceError::MountPoint {
        path: tmp.clone(),
        source,
    })
}

/// Makes the plan's sealed directories execute-only: the paths through
/// them work, listing them does not (not even for a uid-0 session, which
/// has no capability to override it). Only directories of the new root's
/// own tmpfs: a bound path keeps its modes.
fn seal(plan: &MountPlan, root: &Path) -> Result<(), NamespaceError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let own = std::fs::metadata(root)
        .map_err(|source| NamespaceError::MountPoint {
            path: root.to_path_buf(),
            source,
        })?
        .dev();
    for dir in &plan.sealed {
        let path = inside(root, Path::new(dir));
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() && m.dev() == own => {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o111)).map_err(
                    |source| NamespaceError::MountPoint {
                        path: path.clone(),
                        source,
                    },
                )?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Makes `root` the root of this mount namespace and detaches the old one
/// (with every host mount under it).
fn pivot(root: &Path) -> Result<(), NamespaceError> {
    std::env::set_current_dir(root).map_err(|source| NamespaceError::Syscall {
        what: "chdir",
        path: root.to_path_buf(),
        source,
    })?;
    let dot = c".";
    // SAFETY: pivot_root and umount2 with valid strings; the old root is
    // stacked on "." and detached at once.
    unsafe {
        if libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) != 0 {
            return Err(os_err("pivot_root to", root));
        }
        if libc::umount2(dot.as_ptr(), libc::MNT_DETACH) != 0 {
            return Err(os_err("detach the old root from", root));
        }
    }
    std::env::set_current_dir("/").map_err(|source| NamespaceError::Syscall {
        what: "chdir",
        path: PathBuf::from("/"),
        source,
    })
}

/// The exposed paths that exist, outermost first; idmapped where the plan
/// says.
fn clone_exposed<'a>(
    plan: &'a MountPlan,
    idmappings: &[Idmapping],
) -> Result<Vec<Exposed<'a>>, NamespaceError> {
    let mut exposed = Vec::new();
    for bind in &plan.binds {
        let path = Path::new(&bind.path);
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let tree = clone_tree(path)?;
        if let Some(owner) = bind.idmap {
            let Some((_, userns)) = idmappings.iter().find(|(o, _)| *o == owner) else {
                return Err(NamespaceError::BadPath(path.to_path_buf()));
            };
            set_idmap(&tree, userns, path)?;
        }
        exposed.push(Exposed {
            bind,
            tree,
            dir: meta.is_dir(),
        });
    }
    exposed.sort_by_key(|e| depth(e.path()));
    Ok(exposed)
}

/// The standard host devices and the operator's, those that exist.
fn clone_devices(plan: &MountPlan) -> Result<Vec<(PathBuf, OwnedFd)>, NamespaceError> {
    let mut devices = Vec::new();
    for dev in DEVICES
        .iter()
        .map(|d| format!("/dev/{d}"))
        .chain(plan.devices.iter().cloned())
    {
        let path = PathBuf::from(dev);
        if path.exists() {
            let tree = clone_tree(&path)?;
            devices.push((path, tree));
        }
    }
    Ok(devices)
}

/// The exposed paths at their place in the new root, outermost first (a
/// path inside another is attached on top of it).
fn expose_all(exposed: &[Exposed], root: &Path) -> Result<(), NamespaceError> {
    for e in exposed {
        expose(e, &inside(root, e.path()))?;
    }
    Ok(())
}

/// Puts an exposed path in place at `target`.
fn expose(exposed: &Exposed, target: &Path) -> Result<(), NamespaceError> {
    mount_point(target, exposed.dir)?;
    attach(&exposed.tree, target)?;
    if exposed.bind.writable {
        // The clone keeps the host's flags (a read-only submount stays
        // read-only); only set-uid and devices are taken away.
        set_attr(target, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, true)
    } else {
        set_attr(target, MOUNT_ATTR_LOCKED, 0, true)
    }
}

/// A private `/dev` at `dev` (the new root's): a tmpfs with the host's
/// standard devices, a devpts and a `/dev/shm` of its own.
fn build_dev(
    plan: &MountPlan,
    devices: Vec<(PathBuf, OwnedFd)>,
    dev: &Path,
) -> Result<(), NamespaceError> {
    mount_point(dev, true)?;
    mount_new(
        "tmpfs",
        dev,
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=0755,size=1m"),
    )?;
    for (host, tree) in &devices {
        let path = inside(dev, host.strip_prefix("/dev").unwrap_or(host));
        mount_point(&path, false)?;
        attach(tree, &path)?;
        // Read-only at the mount: the node's mode and owner are the host's
        // and must not change; reading and writing the device still work.
        set_attr(&path, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, false)?;
    }
    mount_new_dir(
        "devpts",
        &dev.join("pts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    )?;
    mount_new_dir(
        "tmpfs",
        &dev.join("shm"),
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("mode=1777,size={}", plan.shm_bytes.max(1 << 20)),
    )?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(link))
            .map_err(|source| NamespaceError::Symlink { link, source })?;
    }
    set_attr(dev, MOUNT_ATTR_RDONLY, 0, false)
}

/// The new PID namespace's own `/proc` at `proc_dir`.
fn build_proc(proc_dir: &Path) -> Result<(), NamespaceError> {
    mount_point(proc_dir, true)?;
    mount_new(
        "proc",
        proc_dir,
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?;
    for p in PROC_READ_ONLY {
        let path = inside(
            proc_dir,
            Path::new(p).strip_prefix("/proc").unwrap_or(Path::new(p)),
        );
        if !path.exists() {
            continue;
        }
        let s = path.to_string_lossy();
        mount(Some(&s), &path, None, libc::MS_BIND | libc::MS_REC, None)?;
        set_attr(&path, MOUNT_ATTR_LOCKED, 0, true)?;
    }
    Ok(())
}
