//! Workspace files for remote use: every path is confined to the workspace
//! root. The file tools run in the server, outside the sandbox, so an agent
//! may aim them at the server's own files; the rules are:
//!
//! * absolute paths and `..` are refused lexically first (clear messages);
//! * on Linux, every open goes through `openat2(2)` relative to a descriptor
//!   of the root opened at start, with `RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS`: the kernel refuses, atomically, any resolution
//!   that leaves the root (absolute symlinks, `..` or symlinks climbing out,
//!   `/proc` magic links), so a symlink swapped between a check and the open
//!   gains nothing. Directories are created with `mkdirat` and entries
//!   removed with `unlinkat`, relative to descriptors, never by path, and a
//!   recursive walk never follows a symlink;
//! * only regular files are read or written: the entry is first opened with
//!   `O_PATH` (which opens no FIFO or device) and checked, then opened for
//!   real with `O_NONBLOCK | O_NOCTTY` and checked again with `fstat`, so a
//!   FIFO never blocks and a device is never read;
//! * reads stop at a byte limit however much the file holds or grows.
//!
//! Elsewhere (macOS...), the same checks are made on paths (symlinks resolved
//! and compared with the root) and opens use `O_NOFOLLOW | O_NONBLOCK`; a
//! symlink swapped between the check and the open is not excluded there.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(
        "the workspace is read-only (--sandbox read-only): file_write and file_delete are refused"
    )]
    ReadOnly,
    #[error("'{0}' is an absolute path; give a path relative to the workspace root")]
    Absolute(String),
    #[error("'{0}' contains '..'; paths must stay inside the workspace root")]
    ParentDir(String),
    #[error("'{0}' leads outside the workspace root (through a symlink); refused")]
    Escapes(String),
    #[error("'{0}' does not exist in the workspace; file_list shows what is there")]
    NotFound(String),
    #[error("'{path}' is not a regular file (it is {kind}); {tool} {verb} regular files only")]
    NotRegular {
        path: String,
        kind: &'static str,
        tool: &'static str,
        verb: &'static str,
    },
    #[error("'{path}' is a directory; {hint}")]
    IsDir { path: String, hint: &'static str },
    #[error("'{0}' is not a directory; file_read reads files")]
    NotDir(String),
    #[error(
        "'{path}' is {size} bytes, over the {limit}-byte read limit; read part of it with shell_exec (head, sed -n) or python_exec"
    )]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("'{0}' is the workspace root itself; it cannot be deleted")]
    Root(String),
    #[error(
        "'{0}': the directory is not empty; pass recursive=true to delete it with its contents"
    )]
    NotEmpty(String),
    #[error(
        "'{0}' is a symlink to a file that does not exist; file_write does not create files through symlinks"
    )]
    DanglingSymlink(String),
    #[error("'{path}': {error}")]
    Io { path: String, error: String },
}

impl FileError {
    fn io(path: &str, error: impl std::fmt::Display) -> Self {
        FileError::Io {
            path: path.to_string(),
            error: error.to_string(),
        }
    }

    fn not_regular(path: &str, kind: &'static str, write: bool) -> Self {
        FileError::NotRegular {
            path: path.to_string(),
            kind,
            tool: if write { "file_write" } else { "file_read" },
            verb: if write { "writes" } else { "reads" },
        }
    }
}

/// The kind of a directory entry, as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
        }
    }
}

/// One listed entry.
#[derive(Debug, Clone)]
pub struct ListedEntry {
    /// Relative to the workspace root.
    pub path: String,
    pub kind: EntryKind,
    /// Size in bytes, for regular files.
    pub size: Option<u64>,
}

/// A directory listing.
#[derive(Debug, Clone)]
pub struct Listing {
    /// The listed directory, relative to the root ("." for the root).
    pub shown: String,
    pub entries: Vec<ListedEntry>,
    /// True when the listing stopped at a limit.
    pub truncated: bool,
}

/// The bytes of a file read.
#[derive(Debug, Clone)]
pub struct FileData {
    /// The path relative to the root, normalized.
    pub shown: String,
    pub data: Vec<u8>,
}

/// Most names read from one directory by file_list (a directory holding
/// more is listed in part, marked truncated).
const MAX_DIR_NAMES: usize = 100_000;
/// Deepest directory nesting a recursive delete descends (one descriptor is
/// held per level).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const MAX_DELETE_DEPTH: usize = 256;
/// Most batches of `MAX_DIR_NAMES` names a recursive delete removes from one
/// directory.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const MAX_DELETE_ROUNDS: usize = 64;

/// A path checked lexically: its normal components.
#[derive(Debug, Clone)]
struct RelPath {
    parts: Vec<OsString>,
}

impl RelPath {
    fn path(&self) -> PathBuf {
        if self.parts.is_empty() {
            PathBuf::from(".")
        } else {
            self.parts.iter().collect()
        }
    }

    fn shown(&self) -> String {
        if self.parts.is_empty() {
            ".".to_string()
        } else {
            self.parts
                .iter()
                .map(|p| p.to_string_lossy())
                .collect::<Vec<_>>()
                .join("/")
        }
    }

    /// The parent directory's components and the final name.
    fn split_last(&self) -> Option<(RelPath, &OsString)> {
        let (name, parent) = self.parts.split_last()?;
        Some((
            RelPath {
                parts: parent.to_vec(),
            },
            name,
        ))
    }
}

fn lexical(rel: &str) -> Result<RelPath, FileError> {
    if rel.contains('\0') {
        return Err(FileError::io(rel, "a path cannot contain a NUL byte"));
    }
    let path = Path::new(rel);
    if path.is_absolute() {
        return Err(FileError::Absolute(rel.to_string()));
    }
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => parts.push(part.to_os_string()),
            Component::CurDir => {}
            Component::ParentDir => return Err(FileError::ParentDir(rel.to_string())),
            Component::RootDir | Component::Prefix(_) => {
                return Err(FileError::Absolute(rel.to_string()));
            }
        }
    }
    Ok(RelPath { parts })
}

fn join_shown(prefix: &str, name: &std::ffi::OsStr) -> String {
    let name = name.to_string_lossy();
    if prefix == "." || prefix.is_empty() {
        name.into_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

/// The workspace root and the file operations confined to it.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    /// `--sandbox read-only`: the tools may not change the workspace either.
    read_only: bool,
    #[cfg(target_os = "linux")]
    dir: std::sync::Arc<std::os::fd::OwnedFd>,
}

impl Workspace {
    pub fn new(root: &Path) -> std::io::Result<Self> {
        let root = root.canonicalize()?;
        #[cfg(target_os = "linux")]
        {
            use nix::fcntl::OFlag;
            let dir = nix::fcntl::open(
                &root,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(std::io::Error::from)?;
            Ok(Self {
                root,
                read_only: false,
                dir: std::sync::Arc::new(dir),
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            Ok(Self {
                root,
                read_only: false,
            })
        }
    }

    /// The same workspace, refusing writes and deletions.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Reads a regular file, at most `limit` bytes (a larger or growing file
    /// is refused, never read past the limit).
    pub fn read(&self, rel: &str, limit: u64) -> Result<FileData, FileError> {
        let path = lexical(rel)?;
        #[cfg(target_os = "linux")]
        let data = linux::read(&self.dir, rel, &path, limit)?;
        #[cfg(not(target_os = "linux"))]
        let data = portable::read(&self.root, rel, &path, limit)?;
        Ok(FileData {
            shown: path.shown(),
            data,
        })
    }

    /// Writes (or appends to) a regular file, creating its parent
    /// directories; returns the path as shown.
    pub fn write(&self, rel: &str, data: &[u8], append: bool) -> Result<String, FileError> {
        if self.read_only {
            return Err(FileError::ReadOnly);
        }
        let path = lexical(rel)?;
        let Some((parent, name)) = path.split_last() else {
            return Err(FileError::IsDir {
                path: rel.to_string(),
                hint: "give a file path",
            });
        };
        #[cfg(target_os = "linux")]
        linux::write(&self.dir, rel, &path, &parent, name, data, append)?;
        #[cfg(not(target_os = "linux"))]
        portable::write(&self.root, rel, &path, &parent, name, data, append)?;
        Ok(path.shown())
    }

    /// Deletes an entry (a symlink itself, never what it points to); a
    /// directory with everything in it when `recursive`.
    pub fn delete(&self, rel: &str, recursive: bool) -> Result<String, FileError> {
        if self.read_only {
            return Err(FileError::ReadOnly);
        }
        let path = lexical(rel)?;
        let Some((parent, name)) = path.split_last() else {
            return Err(FileError::Root(rel.to_string()));
        };
        #[cfg(target_os = "linux")]
        linux::delete(&self.dir, rel, &parent, name, recursive)?;
        #[cfg(not(target_os = "linux"))]
        portable::delete(&self.root, rel, &parent, name, recursive)?;
        Ok(path.shown())
    }

    /// Lists a directory `depth` levels deep (symlinks are listed, never
    /// followed), at most `max_entries` entries.
    pub fn list(&self, rel: &str, depth: usize, max_entries: usize) -> Result<Listing, FileError> {
        let path = lexical(rel)?;
        let mut listing = Listing {
            shown: path.shown(),
            entries: Vec::new(),
            truncated: false,
        };
        #[cfg(target_os = "linux")]
        linux::list(&self.dir, rel, &path, depth, max_entries, &mut listing)?;
        #[cfg(not(target_os = "linux"))]
        portable::list(&self.root, rel, &path, depth, max_entries, &mut listing)?;
        Ok(listing)
    }
}

/// The fd-based implementation: openat2 beneath the root's descriptor.
#[cfg(target_os = "linux")]
mod linux {
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
        EntryKind, FileError, ListedEntry, Listing, MAX_DELETE_DEPTH, MAX_DELETE_ROUNDS,
        MAX_DIR_NAMES, RelPath, join_shown,
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
            SFlag::S_IFDIR => Err(FileError::IsDir {
                path: rel.to_string(),
                hint: if write {
                    "give a file path"
                } else {
                    "use file_list"
                },
            }),
            other => Err(FileError::not_regular(rel, describe(other), write)),
        }
    }

    fn fstat(rel: &str, fd: &OwnedFd) -> Result<FileStat, FileError> {
        nix::sys::stat::fstat(fd).map_err(|e| FileError::io(rel, e.desc()))
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
        let too_large = |size| FileError::TooLarge {
            path: rel.to_string(),
            size,
            limit,
        };
        if size > limit {
            return Err(too_large(size));
        }
        // Never more than limit + 1 bytes, however much the file grows.
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        std::fs::File::from(fd)
            .take(limit.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| FileError::io(rel, e))?;
        if data.len() as u64 > limit {
            return Err(too_large(data.len() as u64));
        }
        Ok(data)
    }

    /// The parent directory of a file to write, opened with O_PATH; missing
    /// components are created one by one with mkdirat relative to the
    /// descriptor of their parent (itself opened beneath the root).
    fn ensure_dir(root: &OwnedFd, rel: &str, parent: &RelPath) -> Result<OwnedFd, FileError> {
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
            let opened = match open_beneath(root.as_fd(), &prefix, dir_flags, ResolveFlag::empty())
            {
                Err(Errno::ENOENT) => {
                    match nix::sys::stat::mkdirat(
                        &current,
                        part.as_os_str(),
                        Mode::from_bits_truncate(0o777),
                    ) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(FileError::io(rel, e.desc())),
                    }
                    open_beneath(root.as_fd(), &prefix, dir_flags, ResolveFlag::empty())
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

    pub(super) fn write(
        root: &OwnedFd,
        rel: &str,
        path: &RelPath,
        parent: &RelPath,
        name: &OsStr,
        data: &[u8],
        append: bool,
    ) -> Result<(), FileError> {
        let dir = ensure_dir(root, rel, parent)?;
        let mode = if append {
            OFlag::O_WRONLY | OFlag::O_APPEND
        } else {
            OFlag::O_WRONLY
        };
        let name = Path::new(name);
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
            Some(SFlag::S_IFLNK) => write_through_symlink(root, rel, path, mode)?,
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
                        fd
                    }
                    // A symlink appeared since the check.
                    Err(Errno::ELOOP) => write_through_symlink(root, rel, path, mode)?,
                    Err(Errno::ENXIO) => return Err(FileError::not_regular(rel, "a FIFO", true)),
                    Err(Errno::EISDIR) => {
                        return Err(FileError::IsDir {
                            path: rel.to_string(),
                            hint: "give a file path",
                        });
                    }
                    Err(e) => return Err(open_error(rel, e)),
                }
            }
        };
        if !append {
            nix::unistd::ftruncate(&fd, 0).map_err(|e| FileError::io(rel, e.desc()))?;
        }
        std::fs::File::from(fd)
            .write_all(data)
            .map_err(|e| FileError::io(rel, e))
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

    pub(super) fn delete(
        root: &OwnedFd,
        rel: &str,
        parent: &RelPath,
        name: &OsStr,
        recursive: bool,
    ) -> Result<(), FileError> {
        // The parent may be reached through symlinks inside the root; the
        // entry itself is never followed.
        let dir = open_beneath(
            root.as_fd(),
            &parent.path(),
            OFlag::O_PATH | OFlag::O_DIRECTORY,
            ResolveFlag::empty(),
        )
        .map_err(|e| match e {
            Errno::ENOTDIR => FileError::NotFound(rel.to_string()),
            e => open_error(rel, e),
        })?;
        let st = lstat_at(dir.as_fd(), name).map_err(|e| match e {
            Errno::ENOENT | Errno::ENOTDIR => FileError::NotFound(rel.to_string()),
            e => FileError::io(rel, e.desc()),
        })?;
        if kind_of(&st) != SFlag::S_IFDIR {
            return nix::unistd::unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir)
                .map_err(|e| FileError::io(rel, e.desc()));
        }
        if recursive {
            remove_contents(dir.as_fd(), name, 1).map_err(|e| match e {
                Removal::TooDeep => FileError::io(
                    rel,
                    format!(
                        "nested more than {MAX_DELETE_DEPTH} directories deep; delete its deepest parts first"
                    ),
                ),
                Removal::Failed(e) => FileError::io(rel, e.desc()),
            })?;
        }
        nix::unistd::unlinkat(&dir, name, UnlinkatFlags::RemoveDir).map_err(|e| match e {
            Errno::ENOTEMPTY | Errno::EEXIST => FileError::NotEmpty(rel.to_string()),
            e => FileError::io(rel, e.desc()),
        })
    }

    /// Removes everything inside `parent/name` (a directory opened without
    /// following symlinks), depth first, by descriptor.
    fn remove_contents(parent: BorrowedFd<'_>, name: &OsStr, depth: usize) -> Result<(), Removal> {
        if depth > MAX_DELETE_DEPTH {
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
                let st = match lstat_at(dir.as_fd(), child) {
                    Ok(st) => st,
                    Err(Errno::ENOENT) => continue,
                    Err(e) => return Err(e.into()),
                };
                let result = if kind_of(&st) == SFlag::S_IFDIR {
                    remove_contents(dir.as_fd(), child, depth + 1).and_then(|()| {
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

    /// Why a recursive delete stopped.
    enum Removal {
        TooDeep,
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
        max_entries: usize,
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
        walk(&dir, &shown, depth, max_entries, out).map_err(|e| FileError::io(rel, e))
    }

    /// Lists `dir` into `out` (`out.truncated` set when a limit stopped it).
    fn walk(
        dir: &OwnedFd,
        prefix: &str,
        depth: usize,
        max_entries: usize,
        out: &mut Listing,
    ) -> std::io::Result<()> {
        let (mut names, cut) = DirStream::open(dir)?.names(MAX_DIR_NAMES)?;
        if cut {
            out.truncated = true;
        }
        names.sort();
        for name in names {
            if out.entries.len() >= max_entries {
                out.truncated = true;
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
            let shown = join_shown(prefix, &name);
            out.entries.push(ListedEntry {
                path: shown.clone(),
                kind,
                size: (kind_of(&st) == SFlag::S_IFREG)
                    .then(|| u64::try_from(st.st_size).unwrap_or(0)),
            });
            // Directories are opened without following symlinks: a symlink
            // swapped in after the stat is not descended.
            if kind == EntryKind::Dir && depth > 1 {
                if let Ok(child) = open_child_dir(dir.as_fd(), &name) {
                    walk(&child, &shown, depth - 1, max_entries, out)?;
                }
                if out.truncated {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// The path-based fallback for systems without openat2: paths are checked
/// (symlinks resolved, compared with the root) and then opened with
/// `O_NOFOLLOW | O_NONBLOCK`. Compiled everywhere so it keeps building.
#[cfg_attr(target_os = "linux", allow(dead_code))]
mod portable {
    use std::ffi::OsStr;
    use std::io::{Read, Write};
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    use std::path::{Path, PathBuf};

    use super::{EntryKind, FileError, ListedEntry, Listing, MAX_DIR_NAMES, RelPath, join_shown};

    fn io(rel: &str, e: std::io::Error) -> FileError {
        match e.kind() {
            std::io::ErrorKind::NotFound => FileError::NotFound(rel.to_string()),
            _ => FileError::io(rel, e),
        }
    }

    /// An existing path, symlinks resolved, that must be inside the root.
    fn existing(root: &Path, rel: &str, path: &RelPath) -> Result<PathBuf, FileError> {
        let real = root
            .join(path.path())
            .canonicalize()
            .map_err(|e| io(rel, e))?;
        if !real.starts_with(root) {
            return Err(FileError::Escapes(rel.to_string()));
        }
        Ok(real)
    }

    fn describe(ft: std::fs::FileType) -> &'static str {
        if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_symlink() {
            "a symlink"
        } else {
            "of an unknown type"
        }
    }

    fn require_regular(rel: &str, meta: &std::fs::Metadata, write: bool) -> Result<(), FileError> {
        let ft = meta.file_type();
        if ft.is_file() {
            Ok(())
        } else if ft.is_dir() {
            Err(FileError::IsDir {
                path: rel.to_string(),
                hint: if write {
                    "give a file path"
                } else {
                    "use file_list"
                },
            })
        } else {
            Err(FileError::not_regular(rel, describe(ft), write))
        }
    }

    fn flags() -> i32 {
        libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC
    }

    pub(super) fn read(
        root: &Path,
        rel: &str,
        path: &RelPath,
        limit: u64,
    ) -> Result<Vec<u8>, FileError> {
        let real = existing(root, rel, path)?;
        require_regular(
            rel,
            &std::fs::symlink_metadata(&real).map_err(|e| io(rel, e))?,
            false,
        )?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags())
            .open(&real)
            .map_err(|e| io(rel, e))?;
        let meta = file.metadata().map_err(|e| io(rel, e))?;
        require_regular(rel, &meta, false)?;
        if meta.len() > limit {
            return Err(FileError::TooLarge {
                path: rel.to_string(),
                size: meta.len(),
                limit,
            });
        }
        let mut data = Vec::new();
        file.take(limit.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| io(rel, e))?;
        if data.len() as u64 > limit {
            return Err(FileError::TooLarge {
                path: rel.to_string(),
                size: data.len() as u64,
                limit,
            });
        }
        Ok(data)
    }

    pub(super) fn write(
        root: &Path,
        rel: &str,
        path: &RelPath,
        parent: &RelPath,
        name: &OsStr,
        data: &[u8],
        append: bool,
    ) -> Result<(), FileError> {
        let lexical_parent = root.join(parent.path());
        // The nearest existing ancestor must be inside, before anything is
        // created.
        let mut ancestor = lexical_parent.clone();
        while !ancestor.exists() {
            if !ancestor.pop() {
                break;
            }
        }
        let real = ancestor.canonicalize().map_err(|e| io(rel, e))?;
        if !real.starts_with(root) {
            return Err(FileError::Escapes(rel.to_string()));
        }
        std::fs::create_dir_all(&lexical_parent).map_err(|e| io(rel, e))?;
        let real_parent = existing(root, rel, parent)?;
        let mut target = real_parent.join(name);
        if let Ok(meta) = std::fs::symlink_metadata(&target)
            && meta.file_type().is_symlink()
        {
            target = existing(root, rel, path).map_err(|e| match e {
                FileError::NotFound(p) => FileError::DanglingSymlink(p),
                e => e,
            })?;
        }
        if let Ok(meta) = std::fs::symlink_metadata(&target) {
            require_regular(rel, &meta, true)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .append(append)
            .custom_flags(flags())
            .open(&target)
            .map_err(|e| io(rel, e))?;
        require_regular(rel, &file.metadata().map_err(|e| io(rel, e))?, true)?;
        if !append {
            file.set_len(0).map_err(|e| io(rel, e))?;
        }
        file.write_all(data).map_err(|e| io(rel, e))
    }

    pub(super) fn delete(
        root: &Path,
        rel: &str,
        parent: &RelPath,
        name: &OsStr,
        recursive: bool,
    ) -> Result<(), FileError> {
        let real_parent = existing(root, rel, parent)?;
        let entry = real_parent.join(name);
        let meta = std::fs::symlink_metadata(&entry).map_err(|e| io(rel, e))?;
        let result = if meta.is_dir() {
            if recursive {
                // std's remove_dir_all never follows symlinks.
                std::fs::remove_dir_all(&entry)
            } else {
                std::fs::remove_dir(&entry)
            }
        } else {
            std::fs::remove_file(&entry)
        };
        result.map_err(|e| {
            if meta.is_dir() && e.kind() == std::io::ErrorKind::DirectoryNotEmpty {
                FileError::NotEmpty(rel.to_string())
            } else {
                io(rel, e)
            }
        })
    }

    pub(super) fn list(
        root: &Path,
        rel: &str,
        path: &RelPath,
        depth: usize,
        max_entries: usize,
        out: &mut Listing,
    ) -> Result<(), FileError> {
        let dir = existing(root, rel, path)?;
        if !dir.is_dir() {
            return Err(FileError::NotDir(rel.to_string()));
        }
        let shown = out.shown.clone();
        walk(&dir, &shown, depth, max_entries, out).map_err(|e| io(rel, e))
    }

    fn walk(
        dir: &Path,
        prefix: &str,
        depth: usize,
        max_entries: usize,
        out: &mut Listing,
    ) -> std::io::Result<()> {
        let mut items = Vec::new();
        for item in std::fs::read_dir(dir)? {
            if items.len() >= MAX_DIR_NAMES {
                out.truncated = true;
                break;
            }
            if let Ok(item) = item {
                items.push(item.file_name());
            }
        }
        items.sort();
        for name in items {
            if out.entries.len() >= max_entries {
                out.truncated = true;
                return Ok(());
            }
            let path = dir.join(&name);
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let kind = if meta.file_type().is_symlink() {
                EntryKind::Symlink
            } else if meta.is_dir() {
                EntryKind::Dir
            } else {
                EntryKind::File
            };
            let shown = join_shown(prefix, &name);
            out.entries.push(ListedEntry {
                path: shown.clone(),
                kind,
                size: meta.is_file().then_some(meta.len()),
            });
            if kind == EntryKind::Dir && depth > 1 {
                walk(&path, &shown, depth - 1, max_entries, out)?;
                if out.truncated {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// A MIME type from a file name, for binary reads.
pub fn mime_for(path: &Path) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "whl" => "application/zip",
        "json" => "application/json",
        "csv" => "text/csv",
        "parquet" => "application/vnd.apache.parquet",
        "npy" | "npz" | "pkl" | "pickle" | "bin" => "application/octet-stream",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_refused() {
        let outside = tempfile::tempdir().expect("tempdir");
        let root = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::new(root.path()).expect("workspace");
        std::fs::write(outside.path().join("secret"), "s").expect("write");
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).expect("symlink");
        assert!(matches!(
            ws.read("/etc/passwd", 1024),
            Err(FileError::Absolute(_))
        ));
        assert!(matches!(
            ws.read("a/../../x", 1024),
            Err(FileError::ParentDir(_))
        ));
        assert!(matches!(
            ws.read("link/secret", 1024),
            Err(FileError::Escapes(_))
        ));
        assert!(matches!(
            ws.write("link/new", b"x", false),
            Err(FileError::Escapes(_))
        ));
        assert!(matches!(
            ws.write("link/deeper/new", b"x", false),
            Err(FileError::Escapes(_))
        ));
        assert!(matches!(
            ws.delete("link/secret", false),
            Err(FileError::Escapes(_))
        ));
        assert!(matches!(ws.list("link", 2, 10), Err(FileError::Escapes(_))));
        assert!(!outside.path().join("deeper").exists());
        assert!(!outside.path().join("new").exists());
        assert!(outside.path().join("secret").exists());
        let shown = ws.write("sub/dir/file.txt", b"hi", false).expect("inside");
        assert_eq!(shown, "sub/dir/file.txt");
        assert!(root.path().join("sub/dir/file.txt").is_file());
        assert!(matches!(ws.delete(".", true), Err(FileError::Root(_))));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn special_files_and_deep_trees() {
        let outside = tempfile::tempdir().expect("tempdir");
        let root = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::new(root.path()).expect("workspace");
        nix::unistd::mkfifo(
            &root.path().join("pipe"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .expect("mkfifo");
        // Neither blocks: nobody opens the other end.
        assert!(matches!(
            ws.read("pipe", 100),
            Err(FileError::NotRegular { kind: "a FIFO", .. })
        ));
        assert!(matches!(
            ws.write("pipe", b"x", true),
            Err(FileError::NotRegular { kind: "a FIFO", .. })
        ));
        // A recursive delete removes a symlink to a directory, not its
        // contents.
        std::fs::write(outside.path().join("keep"), "k").expect("write");
        std::fs::create_dir(root.path().join("d")).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), root.path().join("d/out")).expect("symlink");
        ws.delete("d", true).expect("delete d");
        assert!(outside.path().join("keep").exists());
        // Too deep a tree is refused, not overflowing anything.
        let mut deep = root.path().join("deep");
        for _ in 0..MAX_DELETE_DEPTH + 2 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).expect("deep tree");
        let err = ws.delete("deep", true).expect_err("too deep");
        assert!(err.to_string().contains("nested more than"), "{err}");
    }

    #[test]
    fn reads_stop_at_the_limit() {
        let root = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::new(root.path()).expect("workspace");
        std::fs::write(root.path().join("big"), vec![b'a'; 100]).expect("write");
        assert!(matches!(
            ws.read("big", 99),
            Err(FileError::TooLarge { size: 100, .. })
        ));
        let data = ws.read("./big", 100).expect("read");
        assert_eq!(data.data.len(), 100);
        assert_eq!(data.shown, "big");
    }

    #[test]
    fn write_append_symlink_inside_and_delete() {
        let root = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::new(root.path()).expect("workspace");
        ws.write("a/b.txt", b"one\n", false).expect("write");
        ws.write("a/b.txt", b"two\n", true).expect("append");
        assert_eq!(
            std::fs::read_to_string(root.path().join("a/b.txt")).expect("read"),
            "one\ntwo\n"
        );
        // A relative symlink staying inside is followed for reads and writes.
        std::os::unix::fs::symlink("../a/b.txt", root.path().join("a/l")).expect("symlink");
        ws.write("a/l", b"three\n", false).expect("write through");
        assert_eq!(ws.read("a/l", 100).expect("read").data, b"three\n");
        // A dangling symlink is not created through.
        std::os::unix::fs::symlink("nothing", root.path().join("dangling")).expect("symlink");
        assert!(matches!(
            ws.write("dangling", b"x", false),
            Err(FileError::DanglingSymlink(_))
        ));
        assert!(!root.path().join("nothing").exists());
        // Writing over a directory is refused.
        assert!(matches!(
            ws.write("a", b"x", false),
            Err(FileError::IsDir { .. })
        ));
        let listing = ws.list(".", 8, 100).expect("list");
        let paths: Vec<_> = listing.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, vec!["a", "a/b.txt", "a/l", "dangling"]);
        assert!(matches!(ws.delete("a", false), Err(FileError::NotEmpty(_))));
        ws.delete("a", true).expect("delete recursively");
        assert!(!root.path().join("a").exists());
        assert!(matches!(ws.delete("a", true), Err(FileError::NotFound(_))));
    }
}
