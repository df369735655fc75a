//! Linux file I/O beneath the workspace root fd (openat2).

use std::ffi::{CStr, OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

use super::{
    Entry, EntryKind, FileError, FileWrite, Guard, Listing, MAX_DELETE_ROUNDS, MAX_DIR_NAMES,
    MAX_WALK_DEPTH, RelPath, within_limit,
};

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

/// A directory stream over a duplicate of `dir`'s descriptor.
struct DirStream(std::ptr::NonNull<libc::DIR>);

impl DirStream {
    fn open(dir: &OwnedFd) -> std::io::Result<Self> {
        let dup = dir.try_clone()?;
        let raw = dup.into_raw_fd();
        // SAFETY: `raw` is an open descriptor we own; fdopendir takes
        // it over on success (closed by closedir in Drop).
        let ptr = unsafe { libc::fdopendir(raw) };
        match std::ptr::NonNull::new(ptr) {
            Some(p) => {
                // SAFETY: a fresh stream; reading starts at the start
                // (the duplicate shares the original's offset).
                unsafe { libc::rewinddir(p.as_ptr()) };
                Ok(DirStream(p))
            }
            None => {
                let err = std::io::Error::last_os_error();
                // SAFETY: fdopendir failed, so `raw` is still ours.
                unsafe { libc::close(raw) };
                Err(err)
            }
        }
    }

    /// Every name but `.` and `..`, at most `max` (then `true`).
    fn names(&mut self, max: usize) -> std::io::Result<(Vec<OsString>, bool)> {
        let mut names = Vec::new();
        loop {
            Errno::clear();
            // SAFETY: the stream is open and used by this thread only.
            let entry = unsafe { libc::readdir(self.0.as_ptr()) };
            if entry.is_null() {
                return match Errno::last_raw() {
                    0 => Ok((names, false)),
                    e => Err(std::io::Error::from_raw_os_error(e)),
                };
            }
            // SAFETY: readdir returned a valid entry whose d_name is
            // NUL-terminated; it is copied before the next call.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            if names.len() >= max {
                return Ok((names, true));
            }
            names.push(OsStr::from_bytes(bytes).to_os_string());
        }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: the stream was opened by fdopendir and is closed once.
        unsafe { libc::closedir(self.0.as_ptr()) };
    }
}

/// A child directory of `dir`, for reading, never through a symlink.
fn open_child_dir(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<OwnedFd> {
    open_beneath(
        dir,
        Path::new(name),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
        ResolveFlag::RESOLVE_NO_SYMLINKS,
    )
}

fn lstat_at(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<FileStat> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

pub(super) fn delete(root: &OwnedFd, e: &Entry<'_>, recursive: bool) -> Result<(), FileError> {
    let (rel, name, guard) = (e.rel, e.name, e.guard);
    // The parent may be reached through symlinks inside the root; the
    // entry itself is never followed.
    let dir = open_beneath(
        root.as_fd(),
        &e.parent.path(),
        OFlag::O_PATH | OFlag::O_DIRECTORY,
        ResolveFlag::empty(),
    )
    .map_err(|e| match e {
        Errno::ENOTDIR => FileError::NotFound(rel.to_string()),
        e => open_error(rel, e),
    })?;
    // The entry in its resolved directory: not protected, holding nothing
    // protected.
    let place = if guard.active() {
        let place = resolved_path(rel, &dir)?.join(name);
        guard.check_removal(rel, &place)?;
        Some(place)
    } else {
        None
    };
    let st = lstat_at(dir.as_fd(), name).map_err(|e| match e {
        Errno::ENOENT | Errno::ENOTDIR => FileError::NotFound(rel.to_string()),
        e => FileError::io(rel, e.desc()),
    })?;
    if kind_of(&st) != SFlag::S_IFDIR {
        return nix::unistd::unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| FileError::io(rel, e.desc()));
    }
    let removal_error = |e: Removal| match e {
        Removal::TooDeep => FileError::io(
            rel,
            format!(
                "nested more than {MAX_WALK_DEPTH} directories deep; delete its deepest parts first"
            ),
        ),
        Removal::TooLarge => FileError::io(
            rel,
            format!(
                "a directory in it holds more than {MAX_DIR_NAMES} names, too many to check for protected places before deleting; delete its parts first"
            ),
        ),
        Removal::Protected(found) => guard.holding(rel, &found),
        Removal::Failed(e) => FileError::io(rel, e.desc()),
    };
    if recursive {
        let protect = guard.0.zip(place);
        // Everything is checked before anything is deleted.
        if let Some((protected, place)) = &protect {
            find_protected(dir.as_fd(), name, place, protected, 1).map_err(removal_error)?;
        }
        let watch = protect.as_ref().map(|(p, place)| (*p, place.as_path()));
        remove_contents(dir.as_fd(), name, watch, 1).map_err(removal_error)?;
    }
    nix::unistd::unlinkat(&dir, name, UnlinkatFlags::RemoveDir).map_err(|e| match e {
        Errno::ENOTEMPTY | Errno::EEXIST => FileError::NotEmpty(rel.to_string()),
        e => FileError::io(rel, e.desc()),
    })
}

/// Looks through everything inside `parent/name` (at `place`), never
/// following a symlink, for an entry that is a protected place; deletes
/// nothing. A directory too large or too deep to look through whole is
/// refused too.
fn find_protected(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    place: &std::path::Path,
    protected: &crate::sandbox::protected::Protected,
    depth: usize,
) -> Result<(), Removal> {
    if depth > MAX_WALK_DEPTH {
        return Err(Removal::TooDeep);
    }
    let dir = match open_child_dir(parent, name) {
        Ok(dir) => dir,
        Err(e) if gone(e) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let (names, more) = DirStream::open(&dir)
        .and_then(|mut s| s.names(MAX_DIR_NAMES))
        .map_err(errno_of)?;
    if more {
        return Err(Removal::TooLarge);
    }
    for child in &names {
        let at = place.join(child);
        if protected.find(&at).is_some() {
            return Err(Removal::Protected(at));
        }
        let st = match lstat_at(dir.as_fd(), child) {
            Ok(st) => st,
            Err(e) if gone(e) => continue,
            Err(e) => return Err(e.into()),
        };
        if kind_of(&st) == SFlag::S_IFDIR {
            find_protected(dir.as_fd(), child, &at, protected, depth + 1)?;
        }
    }
    Ok(())
}

/// Removes everything inside `parent/name` (a directory opened without
/// following symlinks), depth first, by descriptor. With `watch` (the
/// protected places and the directory's place), it stops at an entry that
/// is a protected place (one made since `find_protected` looked).
fn remove_contents(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    watch: Option<(&crate::sandbox::protected::Protected, &std::path::Path)>,
    depth: usize,
) -> Result<(), Removal> {
    if depth > MAX_WALK_DEPTH {
        return Err(Removal::TooDeep);
    }
    let dir = open_child_dir(parent, name)?;
    let mut stream = DirStream::open(&dir).map_err(errno_of)?;
    // Batches, so a huge directory is not held in memory at once (the
    // stream is read again after removals); bounded, should entries keep
    // appearing.
    for _ in 0..MAX_DELETE_ROUNDS {
        let (names, more) = stream.names(MAX_DIR_NAMES).map_err(errno_of)?;
        for child in &names {
            let at = watch.map(|(p, place)| (p, place.join(child)));
            if let Some((protected, at)) = &at
                && protected.find(at).is_some()
            {
                return Err(Removal::Protected(at.clone()));
            }
            let st = match lstat_at(dir.as_fd(), child) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let result = if kind_of(&st) == SFlag::S_IFDIR {
                let inner = at.as_ref().map(|(p, at)| (*p, at.as_path()));
                remove_contents(dir.as_fd(), child, inner, depth + 1).and_then(|()| {
                    nix::unistd::unlinkat(&dir, child.as_os_str(), UnlinkatFlags::RemoveDir)
                        .map_err(Removal::from)
                })
            } else {
                nix::unistd::unlinkat(&dir, child.as_os_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(Removal::from)
            };
            match result {
                Ok(()) | Err(Removal::Failed(Errno::ENOENT)) => {}
                Err(e) => return Err(e),
            }
        }
        if !more {
            return Ok(());
        }
        // SAFETY: the stream is open; start over for what is left.
        unsafe { libc::rewinddir(stream.0.as_ptr()) };
    }
    Err(Errno::ENOTEMPTY.into())
}

fn errno_of(e: std::io::Error) -> Errno {
    e.raw_os_error().map(Errno::from_raw).unwrap_or(Errno::EIO)
}

/// Why a recursive delete stopped (or, looking first, would not start).
enum Removal {
    TooDeep,
    /// A directory of more than `MAX_DIR_NAMES` names, not looked through
    /// whole for protected places.
    TooLarge,
    /// An entry that is a protected place (its path).
    Protected(std::path::PathBuf),
    Failed(Errno),
}

impl From<Errno> for Removal {
    fn from(e: Errno) -> Self {
        Removal::Failed(e)
    }
}

pub(super) fn list(
    root: &OwnedFd,
    rel: &str,
    path: &RelPath,
    depth: usize,
    out: &mut Listing,
) -> Result<(), FileError> {
    let dir = open_beneath(
        root.as_fd(),
        &path.path(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NONBLOCK,
        ResolveFlag::empty(),
    )
    .map_err(|e| match e {
        Errno::ENOTDIR => FileError::NotDir(rel.to_string()),
        e => open_error(rel, e),
    })?;
    let shown = out.shown.clone();
    walk(&dir, &shown, depth, out).map_err(|e| FileError::io(rel, e))
}

/// Lists `dir` into `out` (`out.truncated` set when a limit stopped it).
fn walk(dir: &OwnedFd, prefix: &str, depth: usize, out: &mut Listing) -> std::io::Result<()> {
    let (mut names, cut) = DirStream::open(dir)?.names(MAX_DIR_NAMES)?;
    if cut {
        out.truncated = true;
    }
    names.sort();
    for name in names {
        if out.full() {
            return Ok(());
        }
        let Ok(st) = lstat_at(dir.as_fd(), &name) else {
            continue;
        };
        let kind = match kind_of(&st) {
            SFlag::S_IFLNK => EntryKind::Symlink,
            SFlag::S_IFDIR => EntryKind::Dir,
            _ => EntryKind::File,
        };
        let size = (kind_of(&st) == SFlag::S_IFREG).then(|| u64::try_from(st.st_size).unwrap_or(0));
        let shown = out.add(prefix, &name, kind, size);
        // Directories are opened without following symlinks: a symlink
        // swapped in after the stat is not descended.
        if kind == EntryKind::Dir && depth > 1 {
            if let Ok(child) = open_child_dir(dir.as_fd(), &name) {
                walk(&child, &shown, depth - 1, out)?;
            }
            if out.truncated {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Bytes allocated under the root, never through a symlink: each directory
/// is opened by its one name relative to its parent with `O_NOFOLLOW`, so
/// one swapped for a symlink while the walk runs is not descended. `None`
/// when the walk could not finish: a bound (`max_entries` in all, a
/// directory of more than `MAX_DIR_NAMES` names, nesting past
/// `MAX_WALK_DEPTH`) or anything it could not read (a directory made
/// unreadable would hide its contents).
pub(super) fn disk_usage(root: &OwnedFd, max_entries: usize) -> Option<u64> {
    let dir = open_child_dir(root.as_fd(), OsStr::new(".")).ok()?;
    let mut bytes = 0u64;
    let mut left = max_entries;
    usage_of(&dir, 0, &mut bytes, &mut left).then_some(bytes)
}

/// An entry that vanished between its listing and its use: nothing to count.
pub(super) fn gone(e: Errno) -> bool {
    matches!(e, Errno::ENOENT | Errno::ENOTDIR)
}

/// Adds what `dir` holds to `bytes`; false when the walk cannot finish.
/// Names are taken from `left` as a directory is listed, so the names held
/// along the path never exceed it either.
fn usage_of(dir: &OwnedFd, depth: usize, bytes: &mut u64, left: &mut usize) -> bool {
    if depth > MAX_WALK_DEPTH {
        return false;
    }
    let listed = DirStream::open(dir).and_then(|mut stream| stream.names(MAX_DIR_NAMES));
    let Ok((names, false)) = listed else {
        return false;
    };
    let Some(rest) = left.checked_sub(names.len()) else {
        return false;
    };
    *left = rest;
    for name in names {
        let st = match lstat_at(dir.as_fd(), &name) {
            Ok(st) => st,
            Err(e) if gone(e) => continue,
            Err(_) => return false,
        };
        *bytes = bytes.saturating_add(u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512));
        if kind_of(&st) != SFlag::S_IFDIR {
            continue;
        }
        let finished = match open_child_dir(dir.as_fd(), &name) {
            Ok(child) => usage_of(&child, depth + 1, bytes, left),
            // ELOOP: swapped for a symlink since the lstat.
            Err(e) => gone(e) || e == Errno::ELOOP,
        };
        if !finished {
            return false;
        }
    }
    true
}
