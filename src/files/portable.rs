//! Fallback file I/O by checked paths, for systems without openat2.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{
    Entry, EntryKind, FileError, FileWrite, Guard, Listing, MAX_DIR_NAMES, MAX_WALK_DEPTH, RelPath,
    within_limit,
};

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
        Err(FileError::is_dir(rel, write))
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
    within_limit(rel, meta.len(), limit)?;
    let mut data = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| io(rel, e))?;
    within_limit(rel, data.len() as u64, limit)?;
    Ok(data)
}

pub(super) fn write(root: &Path, w: &FileWrite<'_>) -> Result<(), FileError> {
    let rel = w.rel;
    let lexical_parent = root.join(w.parent.path());
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
    // What would be made, from the nearest existing ancestor resolved.
    let missing = lexical_parent
        .strip_prefix(&ancestor)
        .unwrap_or(Path::new(""));
    w.guard.check(rel, &real.join(missing).join(w.name))?;
    std::fs::create_dir_all(&lexical_parent).map_err(|e| io(rel, e))?;
    let real_parent = existing(root, rel, w.parent)?;
    let mut target = real_parent.join(w.name);
    w.guard.check(rel, &target)?;
    if let Ok(meta) = std::fs::symlink_metadata(&target)
        && meta.file_type().is_symlink()
    {
        target = existing(root, rel, w.path).map_err(|e| match e {
            FileError::NotFound(p) => FileError::DanglingSymlink(p),
            e => e,
        })?;
        w.guard.check(rel, &target)?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(&target) {
        require_regular(rel, &meta, true)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(w.append)
        .custom_flags(flags())
        .open(&target)
        .map_err(|e| io(rel, e))?;
    let meta = file.metadata().map_err(|e| io(rel, e))?;
    require_regular(rel, &meta, true)?;
    if w.plain {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o111 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(mode & !0o7111))
                .map_err(|e| io(rel, e))?;
        }
    }
    if !w.append {
        file.set_len(0).map_err(|e| io(rel, e))?;
    }
    file.write_all(w.data).map_err(|e| io(rel, e))
}

pub(super) fn delete(root: &Path, e: &Entry<'_>, recursive: bool) -> Result<(), FileError> {
    let (rel, guard) = (e.rel, e.guard);
    let real_parent = existing(root, rel, e.parent)?;
    let entry = real_parent.join(e.name);
    guard.check_removal(rel, &entry)?;
    let meta = std::fs::symlink_metadata(&entry).map_err(|e| io(rel, e))?;
    let result = if meta.is_dir() {
        if recursive {
            // Everything is checked before anything is deleted.
            if guard.active() {
                find_protected(rel, &entry, guard, 1)?;
            }
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

/// Refuses a recursive delete of `dir` holding a protected place (symlinks
/// not followed), or too large or deep to look through whole.
fn find_protected(rel: &str, dir: &Path, guard: Guard<'_>, depth: usize) -> Result<(), FileError> {
    if depth > MAX_WALK_DEPTH {
        return Err(FileError::io(
            rel,
            format!(
                "nested more than {MAX_WALK_DEPTH} directories deep; delete its deepest parts first"
            ),
        ));
    }
    let mut count = 0;
    for item in std::fs::read_dir(dir).map_err(|e| io(rel, e))? {
        let item = item.map_err(|e| io(rel, e))?;
        count += 1;
        if count > MAX_DIR_NAMES {
            return Err(FileError::io(
                rel,
                format!(
                    "a directory in it holds more than {MAX_DIR_NAMES} names, too many to check for protected places before deleting; delete its parts first"
                ),
            ));
        }
        let path = item.path();
        if guard.check(rel, &path).is_err() {
            return Err(guard.holding(rel, &path));
        }
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            find_protected(rel, &path, guard, depth + 1)?;
        }
    }
    Ok(())
}

pub(super) fn list(
    root: &Path,
    rel: &str,
    path: &RelPath,
    depth: usize,
    out: &mut Listing,
) -> Result<(), FileError> {
    let dir = existing(root, rel, path)?;
    if !dir.is_dir() {
        return Err(FileError::NotDir(rel.to_string()));
    }
    let shown = out.shown.clone();
    walk(&dir, &shown, depth, out).map_err(|e| io(rel, e))
}

fn walk(dir: &Path, prefix: &str, depth: usize, out: &mut Listing) -> std::io::Result<()> {
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
        if out.full() {
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
        let shown = out.add(prefix, &name, kind, meta.is_file().then_some(meta.len()));
        if kind == EntryKind::Dir && depth > 1 {
            walk(&path, &shown, depth - 1, out)?;
            if out.truncated {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Bytes allocated under `dir`, symlinks not followed (checked by path: a
/// directory swapped for a symlink during the walk is not excluded here);
/// `None` when a bound or an unreadable entry stopped the walk.
pub(super) fn disk_usage(dir: &Path, max_entries: usize) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut left = max_entries;
    // Gone (or replaced by a file) since it was listed: nothing to count.
    let gone = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
        )
    };
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        if depth > MAX_WALK_DEPTH {
            return None;
        }
        let entries = match std::fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) if depth > 0 && gone(&e) => continue,
            Err(_) => return None,
        };
        for entry in entries {
            let entry = entry.ok()?;
            left = left.checked_sub(1)?;
            let meta = match std::fs::symlink_metadata(entry.path()) {
                Ok(meta) => meta,
                Err(e) if gone(&e) => continue,
                Err(_) => return None,
            };
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                stack.push((entry.path(), depth + 1));
            }
        }
    }
    Some(total)
}
