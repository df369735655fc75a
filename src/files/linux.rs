//! Linux file I/O beneath the workspace root fd (openat2).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

use super::{FileError, FileWrite, Guard, RelPath, within_limit};

/// How often an open is retried when the kernel reports a concurrent
/// rename during a `..`-safe resolution (EAGAIN).
const RETRIES: usize = 16;

/// openat2 beneath `dir`: never leaves it, never through a magic link.
/// `O_CLOEXEC` is always added.
fn open_beneath(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: OFlag,
    extra: ResolveFlag,
) -> nix::Result<OwnedFd> {
    let mut how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS | extra);
    if flags.contains(OFlag::O_CREAT) {
        how = how.mode(Mode::from_bits_truncate(0o666));
    }
    let mut attempt = 0;
    loop {
        match nix::fcntl::openat2(dir, path, how) {
            Err(Errno::EAGAIN | Errno::EINTR) if attempt < RETRIES => attempt += 1,
            result => return result,
        }
    }
}

/// An open's failure as the agent sees it.
fn open_error(rel: &str, e: Errno) -> FileError {
    match e {
        // EXDEV: the resolution left the root (or met an absolute
        // symlink); ELOOP: a magic link, or a symlink loop.
        Errno::EXDEV | Errno::ELOOP => FileError::Escapes(rel.to_string()),
        Errno::ENOENT => FileError::NotFound(rel.to_string()),
        Errno::ENOSYS => FileError::io(
            rel,
            "openat2 is not available (Linux 5.6 or later is needed)",
        ),
        other => FileError::io(rel, other.desc()),
    }
}

fn kind_of(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// "a FIFO", "a character device"... for messages.
fn describe(kind: SFlag) -> &'static str {
    match kind {
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFLNK => "a symlink",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFREG => "a regular file",
        _ => "of an unknown type",
    }
}

/// Refuses anything but a regular file.
fn require_regular(rel: &str, st: &FileStat, write: bool) -> Result<(), FileError> {
    match kind_of(st) {
        SFlag::S_IFREG => Ok(()),
        SFlag::S_IFDIR => Err(FileError::is_dir(rel, write)),
        other => Err(FileError::not_regular(rel, describe(other), write)),
    }
}

fn fstat(rel: &str, fd: &OwnedFd) -> Result<FileStat, FileError> {
    nix::sys::stat::fstat(fd).map_err(|e| FileError::io(rel, e.desc()))
}

/// Where a descriptor of ours resolved to, as the kernel names it (the
/// server's view: the host's paths, as the protected places are).
fn resolved_path(rel: &str, fd: &OwnedFd) -> Result<std::path::PathBuf, FileError> {
    use std::os::fd::AsRawFd;
    match std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) {
        Ok(path) if path.is_absolute() => Ok(path),
        _ => Err(FileError::io(
            rel,
            "cannot tell where this path resolves (/proc/self/fd is unreadable), so it could be a protected place; refused (mount /proc for the server)",
        )),
    }
}

/// Refuses when what `fd` resolved to (joined with `name`) is protected.
fn check_resolved(
    guard: Guard<'_>,
    rel: &str,
    fd: &OwnedFd,
    name: Option<&OsStr>,
) -> Result<(), FileError> {
    if !guard.active() {
        return Ok(());
    }
    let mut place = resolved_path(rel, fd)?;
    if let Some(name) = name {
        place.push(name);
    }
    guard.check(rel, &place)
}

/// Opens the regular file at `path` (relative to `dir`, symlinks
/// followed beneath it unless `nofollow`) with `flags`: first with
/// O_PATH, which opens no FIFO or device, to check its type, then for
/// real, checked again on the descriptor.
fn open_regular(
    dir: BorrowedFd<'_>,
    rel: &str,
    path: &Path,
    flags: OFlag,
    nofollow: bool,
    write: bool,
) -> Result<OwnedFd, FileError> {
    let follow = if nofollow {
        OFlag::O_NOFOLLOW
    } else {
        OFlag::empty()
    };
    let probe = open_beneath(dir, path, OFlag::O_PATH | follow, ResolveFlag::empty())
        .map_err(|e| open_error(rel, e))?;
    require_regular(rel, &fstat(rel, &probe)?, write)?;
    drop(probe);
    let fd = open_beneath(
        dir,
        path,
        flags | follow | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
        ResolveFlag::empty(),
    )
    .map_err(|e| match e {
        // A FIFO swapped in after the check, opened for writing with
        // no reader.
        Errno::ENXIO => FileError::not_regular(rel, "a FIFO", write),
        Errno::EISDIR => FileError::IsDir {
            path: rel.to_string(),
            hint: "use file_list",
        },
        e => open_error(rel, e),
    })?;
    require_regular(rel, &fstat(rel, &fd)?, write)?;
    Ok(fd)
}

pub(super) fn read(
    root: &OwnedFd,
    rel: &str,
    path: &RelPath,
    limit: u64,
) -> Result<Vec<u8>, FileError> {
    let fd = open_regular(
        root.as_fd(),
        rel,
        &path.path(),
        OFlag::O_RDONLY,
        false,
        false,
    )?;
    let size = u64::try_from(fstat(rel, &fd)?.st_size).unwrap_or(0);
    within_limit(rel, size, limit)?;
    // Never more than limit + 1 bytes, however much the file grows.
    let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::fs::File::from(fd)
        .take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| FileError::io(rel, e))?;
    within_limit(rel, data.len() as u64, limit)?;
    Ok(data)
}

/// The parent directory of a file to write, opened with O_PATH; missing
/// components are created one by one with mkdirat relative to the
/// descriptor of their parent (itself opened beneath the root).
/// No directory is made where a protected place would be (`guard`,
/// checked on the resolved directory it would be made in).
fn ensure_dir(
    root: &OwnedFd,
    rel: &str,
    parent: &RelPath,
    guard: Guard<'_>,
) -> Result<OwnedFd, FileError> {
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    match open_beneath(
        root.as_fd(),
        &parent.path(),
        dir_flags,
        ResolveFlag::empty(),
    ) {
        Err(Errno::ENOENT) => {}
        Err(Errno::ENOTDIR) => {
            return Err(FileError::io(
                rel,
                "a parent of this path is not a directory",
            ));
        }
        other => return other.map_err(|e| open_error(rel, e)),
    }
    let mut current = open_beneath(
        root.as_fd(),
        Path::new("."),
        dir_flags,
        ResolveFlag::empty(),
    )
    .map_err(|e| open_error(rel, e))?;
    let mut prefix = std::path::PathBuf::new();
    for part in &parent.parts {
        prefix.push(part);
        let opened = match open_beneath(root.as_fd(), &prefix, dir_flags, ResolveFlag::empty()) {
            Err(Errno::ENOENT) => {
                check_resolved(guard, rel, &current, Some(part))?;
                match nix::sys::stat::mkdirat(
                    &current,
                    part.as_os_str(),
                    Mode::from_bits_truncate(0o777),
                ) {
                    Ok(()) => {
                        let made =
                            open_beneath(root.as_fd(), &prefix, dir_flags, ResolveFlag::empty());
                        if let Ok(dir) = &made {
                            give_to_owner(root, dir);
                        }
                        made
                    }
                    Err(Errno::EEXIST) => {
                        open_beneath(root.as_fd(), &prefix, dir_flags, ResolveFlag::empty())
                    }
                    Err(e) => return Err(FileError::io(rel, e.desc())),
                }
            }
            other => other,
        };
        current = opened.map_err(|e| match e {
            Errno::ENOTDIR => FileError::io(rel, "a parent of this path is not a directory"),
            e => open_error(rel, e),
        })?;
    }
    Ok(current)
}

/// What a root server creates in a workspace belongs to the workspace's
/// owner (a tenant's uid, the operator's project's owner), as what the
/// sessions create there does.
fn give_to_owner(root: &OwnedFd, made: &OwnedFd) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let (Ok(owner), Ok(now)) = (nix::sys::stat::fstat(root), nix::sys::stat::fstat(made)) else {
        return;
    };
    // Only what the server itself just made: never another owner's inode
    // swapped in, never a file with other names (a hard link).
    let dir = now.st_mode & libc::S_IFMT == libc::S_IFDIR;
    if (owner.st_uid, owner.st_gid) == (now.st_uid, now.st_gid)
        || now.st_uid != 0
        || now.st_nlink != if dir { 2 } else { 1 }
    {
        return;
    }
    // SAFETY: fchownat on descriptors we own, with an empty path (the
    // descriptor itself, never a name that could be swapped).
    unsafe {
        libc::fchownat(
            std::os::fd::AsRawFd::as_raw_fd(made),
            c"".as_ptr(),
            owner.st_uid,
            owner.st_gid,
            libc::AT_EMPTY_PATH,
        );
    }
}

pub(super) fn write(root: &OwnedFd, w: &FileWrite<'_>) -> Result<(), FileError> {
    let rel = w.rel;
    let dir = ensure_dir(root, rel, w.parent, w.guard)?;
    // The entry in its resolved directory, before anything is opened,
    // created or changed.
    check_resolved(w.guard, rel, &dir, Some(w.name))?;
    let mode = if w.append {
        OFlag::O_WRONLY | OFlag::O_APPEND
    } else {
        OFlag::O_WRONLY
    };
    let name = Path::new(w.name);
    // What is there now, the final component not followed.
    let existing = match open_beneath(
        dir.as_fd(),
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW,
        ResolveFlag::empty(),
    ) {
        Ok(fd) => Some(kind_of(&fstat(rel, &fd)?)),
        Err(Errno::ENOENT) => None,
        Err(e) => return Err(open_error(rel, e)),
    };
    let fd = match existing {
        // A symlink: followed beneath the root (an existing regular file
        // inside it is written; nothing is created through it).
        Some(SFlag::S_IFLNK) => write_through_symlink(root, rel, w.path, mode)?,
        Some(_) => open_regular(dir.as_fd(), rel, name, mode, true, true)?,
        None => {
            match open_beneath(
                dir.as_fd(),
                name,
                mode | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
                ResolveFlag::empty(),
            ) {
                Ok(fd) => {
                    require_regular(rel, &fstat(rel, &fd)?, true)?;
                    give_to_owner(root, &fd);
                    fd
                }
                // A symlink appeared since the check.
                Err(Errno::ELOOP) => write_through_symlink(root, rel, w.path, mode)?,
                Err(Errno::ENXIO) => return Err(FileError::not_regular(rel, "a FIFO", true)),
                Err(Errno::EISDIR) => {
                    return Err(FileError::is_dir(rel, true));
                }
                Err(e) => return Err(open_error(rel, e)),
            }
        }
    };
    // The file opened (through a link, perhaps): checked before a byte of
    // it changes.
    check_resolved(w.guard, rel, &fd, None)?;
    if w.plain {
        drop_exec_bits(rel, &fd)?;
    }
    if !w.append {
        nix::unistd::ftruncate(&fd, 0).map_err(|e| FileError::io(rel, e.desc()))?;
    }
    std::fs::File::from(fd)
        .write_all(w.data)
        .map_err(|e| FileError::io(rel, e))
}

/// Clears a file's execute bits (an export written over an executable).
fn drop_exec_bits(rel: &str, fd: &OwnedFd) -> Result<(), FileError> {
    let mode = fstat(rel, fd)?.st_mode & 0o7777;
    if mode & 0o111 == 0 {
        return Ok(());
    }
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode & !0o7111))
        .map_err(|e| FileError::io(rel, format!("cannot clear its execute bits: {}", e.desc())))
}

fn write_through_symlink(
    root: &OwnedFd,
    rel: &str,
    path: &RelPath,
    mode: OFlag,
) -> Result<OwnedFd, FileError> {
    open_regular(root.as_fd(), rel, &path.path(), mode, false, true).map_err(|e| match e {
        FileError::NotFound(p) => FileError::DanglingSymlink(p),
        e => e,
    })
}

/// Whole trees: recursive delete, listing, disk usage.
pub(super) mod dirs;

pub(super) use dirs::{delete, disk_usage, list};
