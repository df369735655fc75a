//! Directories walked by descriptor beneath the workspace root: the
//! recursive delete (looked through for protected places first), listings
//! and disk usage. Apart from `linux.rs` because walking whole trees (a
//! directory stream, depth and size bounds, entries vanishing mid-walk) is
//! a concern of its own beside opening, reading and writing one file.

use std::ffi::{CStr, OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, ResolveFlag};
use nix::sys::stat::{FileStat, SFlag};
use nix::unistd::UnlinkatFlags;

use super::super::{
    Entry, EntryKind, FileError, Listing, MAX_DELETE_ROUNDS, MAX_DIR_NAMES, MAX_WALK_DEPTH, RelPath,
};
use super::{kind_of, open_beneath, open_error, resolved_path};

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

pub(in crate::files) fn delete(
    root: &OwnedFd,
    e: &Entry<'_>,
    recursive: bool,
) -> Result<(), FileError> {
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

pub(in crate::files) fn list(
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
pub(in crate::files) fn disk_usage(root: &OwnedFd, max_entries: usize) -> Option<u64> {
    let dir = open_child_dir(root.as_fd(), OsStr::new(".")).ok()?;
    let mut bytes = 0u64;
    let mut left = max_entries;
    usage_of(&dir, 0, &mut bytes, &mut left).then_some(bytes)
}

/// An entry that vanished between its listing and its use: nothing to count.
pub(in crate::files) fn gone(e: Errno) -> bool {
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
