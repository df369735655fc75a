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
//! * reads stop at a byte limit however much the file holds or grows;
//! * writes and deletions never touch a protected place
//!   (`sandbox::protected`: `.git`, `.mcp.json`, `.venv`...): the path is
//!   checked as given, then as it resolves (each directory about to be
//!   made, the entry's directory through `/proc/self/fd`, the file opened),
//!   before anything is created, changed or removed; a recursive delete
//!   walks the whole tree first and deletes nothing if it holds one.
//!
//! Elsewhere (macOS...), the same checks are made on paths (symlinks resolved
//! and compared with the root) and opens use `O_NOFOLLOW | O_NONBLOCK`; a
//! symlink swapped between the check and the open is not excluded there.

use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::sandbox::protected::Protected;

mod error;

pub use error::FileError;
use error::counted;

/// Refuses a read of `size` bytes over `limit`.
fn within_limit(rel: &str, size: u64, limit: u64) -> Result<(), FileError> {
    if size > limit {
        return Err(FileError::TooLarge {
            path: rel.to_string(),
            size,
            limit,
        });
    }
    Ok(())
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
    /// The most entries it takes.
    max_entries: usize,
}

impl Listing {
    /// Whether the most entries are listed already (then marked truncated).
    fn full(&mut self) -> bool {
        let full = self.entries.len() >= self.max_entries;
        if full {
            self.truncated = true;
        }
        full
    }

    /// Lists `name` of the directory shown as `prefix`; its shown path.
    fn add(
        &mut self,
        prefix: &str,
        name: &std::ffi::OsStr,
        kind: EntryKind,
        size: Option<u64>,
    ) -> String {
        let shown = join_shown(prefix, name);
        self.entries.push(ListedEntry {
            path: shown.clone(),
            kind,
            size,
        });
        shown
    }
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
pub(crate) const MAX_DIR_NAMES: usize = 100_000;
/// Deepest directory nesting a recursive delete or a disk usage walk
/// descends (one descriptor is held per level).
pub(crate) const MAX_WALK_DEPTH: usize = 256;
/// Most batches of `MAX_DIR_NAMES` names a recursive delete removes from one
/// directory.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const MAX_DELETE_ROUNDS: usize = 64;

/// A write of `data` to a file: its path as given (for messages), checked
/// lexically, and split into its directory and its name.
struct FileWrite<'a> {
    rel: &'a str,
    path: &'a RelPath,
    parent: &'a RelPath,
    name: &'a OsStr,
    data: &'a [u8],
    append: bool,
    /// Clear the file's execute bits before writing (an export: a
    /// notebook or script written over an executable never stays one).
    plain: bool,
    guard: Guard<'a>,
}

/// The protected places a write or deletion may not touch (none when the
/// sandbox is off or read-only, or every place is freed).
#[derive(Debug, Clone, Copy)]
struct Guard<'a>(Option<&'a Protected>);

impl Guard<'_> {
    fn active(&self) -> bool {
        self.0.is_some()
    }

    /// Refuses a change of `place` (absolute; as given or resolved) when it
    /// is or lies in a protected place.
    fn check(&self, rel: &str, place: &Path) -> Result<(), FileError> {
        match self.0.and_then(|p| p.find(place).map(|found| (p, found))) {
            Some((p, found)) => Err(FileError::Protected {
                path: rel.to_string(),
                message: p.refusal(&found),
            }),
            None => Ok(()),
        }
    }

    /// Refuses removing `place` when it is, lies in or holds a protected
    /// place.
    fn check_removal(&self, rel: &str, place: &Path) -> Result<(), FileError> {
        self.check(rel, place)?;
        match self.0.and_then(|p| p.holds(place).map(|found| (p, found))) {
            Some((p, found)) => Err(FileError::Protected {
                path: rel.to_string(),
                message: format!("it holds {}; {}", found.display(), p.refusal(&found)),
            }),
            None => Ok(()),
        }
    }

    /// Refuses deleting the directory `rel` because `found` lies inside it.
    fn holding(&self, rel: &str, found: &Path) -> FileError {
        let message = match self.0.and_then(|p| p.find(found).map(|place| (p, place))) {
            Some((p, place)) => format!(
                "it holds {}; nothing was deleted. {}",
                place.display(),
                p.refusal(&place)
            ),
            None => format!("it holds the protected place {}", found.display()),
        };
        FileError::Protected {
            path: rel.to_string(),
            message,
        }
    }
}

/// An entry to delete: its path as given (for messages), its directory and
/// name, and what it may not touch.
struct Entry<'a> {
    rel: &'a str,
    parent: &'a RelPath,
    name: &'a OsStr,
    guard: Guard<'a>,
}

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
    /// The places no write or deletion may touch (`sandbox::protected`).
    protected: Option<Arc<Protected>>,
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
                protected: None,
                dir: Arc::new(dir),
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            Ok(Self {
                root,
                read_only: false,
                protected: None,
            })
        }
    }

    /// The same workspace, refusing writes and deletions.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// The same workspace, refusing writes and deletions that would touch
    /// a protected place (`None`: nothing is protected).
    pub fn protected(mut self, protected: Option<Arc<Protected>>) -> Self {
        self.protected = protected.filter(|p| !p.is_empty());
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn guard(&self) -> Guard<'_> {
        Guard(self.protected.as_deref())
    }

    /// `path` as given, under the root (links not resolved): refused
    /// before anything is looked at when a protected name is in it.
    fn lexical_place(&self, path: &RelPath) -> PathBuf {
        self.root.join(path.path())
    }

    /// Reads a regular file, at most `limit` bytes (a larger or growing file
    /// is refused, never read past the limit).
    pub fn read(&self, rel: &str, limit: u64) -> Result<FileData, FileError> {
        counted(self.read_beneath(rel, limit))
    }

    fn read_beneath(&self, rel: &str, limit: u64) -> Result<FileData, FileError> {
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
        counted(self.write_beneath(rel, data, append, false))
    }

    /// Writes an export (a notebook, a script) over `rel`: as `write`, and
    /// the file is left without execute bits (one written over an
    /// executable does not stay one).
    pub fn export(&self, rel: &str, data: &[u8]) -> Result<String, FileError> {
        counted(self.write_beneath(rel, data, false, true))
    }

    fn write_beneath(
        &self,
        rel: &str,
        data: &[u8],
        append: bool,
        plain: bool,
    ) -> Result<String, FileError> {
        if self.read_only {
            return Err(FileError::ReadOnly);
        }
        let path = lexical(rel)?;
        let Some((parent, name)) = path.split_last() else {
            return Err(FileError::is_dir(rel, true));
        };
        let guard = self.guard();
        guard.check(rel, &self.lexical_place(&path))?;
        let write = FileWrite {
            rel,
            path: &path,
            parent: &parent,
            name,
            data,
            append,
            plain,
            guard,
        };
        #[cfg(target_os = "linux")]
        linux::write(&self.dir, &write)?;
        #[cfg(not(target_os = "linux"))]
        portable::write(&self.root, &write)?;
        Ok(path.shown())
    }

    /// Deletes an entry (a symlink itself, never what it points to); a
    /// directory with everything in it when `recursive`.
    pub fn delete(&self, rel: &str, recursive: bool) -> Result<String, FileError> {
        counted(self.delete_beneath(rel, recursive))
    }

    fn delete_beneath(&self, rel: &str, recursive: bool) -> Result<String, FileError> {
        if self.read_only {
            return Err(FileError::ReadOnly);
        }
        let path = lexical(rel)?;
        let Some((parent, name)) = path.split_last() else {
            return Err(FileError::Root(rel.to_string()));
        };
        let guard = self.guard();
        guard.check_removal(rel, &self.lexical_place(&path))?;
        let entry = Entry {
            rel,
            parent: &parent,
            name,
            guard,
        };
        #[cfg(target_os = "linux")]
        linux::delete(&self.dir, &entry, recursive)?;
        #[cfg(not(target_os = "linux"))]
        portable::delete(&self.root, &entry, recursive)?;
        Ok(path.shown())
    }

    /// Lists a directory `depth` levels deep (symlinks are listed, never
    /// followed), at most `max_entries` entries.
    pub fn list(&self, rel: &str, depth: usize, max_entries: usize) -> Result<Listing, FileError> {
        counted(self.list_beneath(rel, depth, max_entries))
    }

    fn list_beneath(
        &self,
        rel: &str,
        depth: usize,
        max_entries: usize,
    ) -> Result<Listing, FileError> {
        let path = lexical(rel)?;
        let mut listing = Listing {
            shown: path.shown(),
            entries: Vec::new(),
            truncated: false,
            max_entries,
        };
        #[cfg(target_os = "linux")]
        linux::list(&self.dir, rel, &path, depth, &mut listing)?;
        #[cfg(not(target_os = "linux"))]
        portable::list(&self.root, rel, &path, depth, &mut listing)?;
        Ok(listing)
    }

    /// Bytes allocated to everything in the workspace, symlinks never
    /// followed; `None` when the walk could not finish (more than
    /// `max_entries` entries, a directory too large or nested too deep, or
    /// one it could not read).
    /// Blocking: call it off the async threads.
    pub fn disk_usage(&self, max_entries: usize) -> Option<u64> {
        #[cfg(target_os = "linux")]
        return linux::disk_usage(&self.dir, max_entries);
        #[cfg(not(target_os = "linux"))]
        return portable::disk_usage(&self.root, max_entries);
    }
}

/// The fd-based implementation: openat2 beneath the root's descriptor.
#[cfg(target_os = "linux")]
mod linux;

/// The path-based fallback for systems without openat2: paths are checked
/// (symlinks resolved, compared with the root) and then opened with
/// `O_NOFOLLOW | O_NONBLOCK`. Compiled everywhere so it keeps building.
#[cfg_attr(target_os = "linux", allow(dead_code))]
mod portable;

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
mod tests;
