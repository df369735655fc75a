//! Where a filtered call's path leads, worked out before the call is made:
//! the caller's own names (`/proc/self`, `/dev/fd`) turned into the
//! supervisor's spelling of them, the directory a relative path starts
//! from, and the entry (directory opened, last name) the check and the call
//! both use. Kept apart from the calls themselves because it is the one
//! place the caller's spelling of a path is interpreted.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use super::super::{cstring, fd_path, open_at};

/// Where a call's path leads: its directory, opened, and its last name.
pub(super) struct Entry {
    pub(super) parent: OwnedFd,
    pub(super) parent_path: PathBuf,
    pub(super) last: Vec<u8>,
    /// The path ended in `/`: the entry must be a directory.
    pub(super) dir_only: bool,
}

impl Entry {
    /// The resolved place, for the check.
    pub(super) fn place(&self) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        self.parent_path
            .join(std::ffi::OsStr::from_bytes(&self.last))
    }

    /// `.` or `..`: the entry is a directory that already exists.
    pub(super) fn is_dot(&self) -> bool {
        self.last == b"." || self.last == b".."
    }

    pub(super) fn last_c(&self) -> std::ffi::CString {
        cstring(&self.last)
    }

    /// The entry itself, opened O_PATH (following a last link or not).
    pub(super) fn object(&self, follow: bool) -> Result<OwnedFd, i32> {
        let mut flags = libc::O_PATH;
        if !follow {
            flags |= libc::O_NOFOLLOW;
        }
        if self.dir_only {
            flags |= libc::O_DIRECTORY;
        }
        open_at(self.parent.as_raw_fd(), &self.last_c(), flags, 0)
    }
}

/// The caller's view of `path` as seen from the supervisor: its own
/// `/proc/self` and `/dev/fd` are the caller's.
pub(super) fn caller_path(pid: libc::pid_t, path: &[u8]) -> Vec<u8> {
    // `//proc/self`, `/proc/./self`: one spelling for the prefixes below
    // (empty and `.` components dropped; `..` kept for the kernel).
    if path.is_empty() {
        return Vec::new();
    }
    let absolute = path.starts_with(b"/");
    let parts: Vec<&[u8]> = path
        .split(|b| *b == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .collect();
    let mut plain: Vec<u8> = if absolute { b"/".to_vec() } else { Vec::new() };
    plain.extend_from_slice(&parts.join(&b'/'));
    if plain.is_empty() {
        plain.push(b'.');
    }
    let dir_only = path.ends_with(b"/") || path.ends_with(b"/.");
    if dir_only && !plain.ends_with(b"/") {
        plain.push(b'/');
    }
    let path = plain.as_slice();
    let swaps: [(&[u8], String); 6] = [
        (b"/proc/self/", format!("/proc/{pid}/")),
        (b"/proc/thread-self/", format!("/proc/{pid}/task/{pid}/")),
        (b"/dev/fd/", format!("/proc/{pid}/fd/")),
        (b"/dev/stdin", format!("/proc/{pid}/fd/0")),
        (b"/dev/stdout", format!("/proc/{pid}/fd/1")),
        (b"/dev/stderr", format!("/proc/{pid}/fd/2")),
    ];
    for (from, to) in swaps {
        if let Some(rest) = path.strip_prefix(from) {
            let mut out = to.into_bytes();
            out.extend_from_slice(rest);
            return out;
        }
    }
    if path == b"/proc/self" {
        return format!("/proc/{pid}").into_bytes();
    }
    path.to_vec()
}

/// The directory a relative path starts from: the caller's `dirfd` or
/// working directory.
pub(super) fn start_dir(pid: libc::pid_t, dirfd: i32) -> Result<OwnedFd, i32> {
    let proc = if dirfd == libc::AT_FDCWD {
        format!("/proc/{pid}/cwd")
    } else if dirfd >= 0 {
        format!("/proc/{pid}/fd/{dirfd}")
    } else {
        return Err(libc::EBADF);
    };
    open_at(
        libc::AT_FDCWD,
        &cstring(proc.as_bytes()),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )
    .map_err(|e| if e == libc::ENOENT { libc::EBADF } else { e })
}

/// `path` from `base` (None: the path must be absolute) as an entry.
pub(super) fn entry_at(base: Option<&OwnedFd>, path: &[u8]) -> Result<Entry, i32> {
    if path.is_empty() {
        return Err(libc::ENOENT);
    }
    let mut trimmed = path;
    while trimmed.len() > 1 && trimmed.ends_with(b"/") {
        trimmed = &trimmed[..trimmed.len() - 1];
    }
    let dir_only = trimmed.len() != path.len();
    let (dir, last): (&[u8], &[u8]) = match trimmed.iter().rposition(|b| *b == b'/') {
        None => (b".", trimmed),
        Some(0) if trimmed.len() == 1 => (b"/", b"."),
        Some(0) => (b"/", &trimmed[1..]),
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
    };
    let base_fd = if dir.starts_with(b"/") {
        libc::AT_FDCWD
    } else {
        base.map(|b| b.as_raw_fd()).ok_or(libc::ENOENT)?
    };
    let parent = open_at(base_fd, &cstring(dir), libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let parent_path = fd_path(&parent).ok_or(libc::ENOENT)?;
    Ok(Entry {
        parent,
        parent_path,
        last: last.to_vec(),
        dir_only,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_own_names_are_its_own() {
        assert_eq!(caller_path(42, b"/proc/self/fd/3"), b"/proc/42/fd/3");
        assert_eq!(caller_path(42, b"/dev/stdout"), b"/proc/42/fd/1");
        assert_eq!(caller_path(42, b"/dev/fd/7"), b"/proc/42/fd/7");
        assert_eq!(caller_path(42, b"/proc/self"), b"/proc/42");
        assert_eq!(caller_path(42, b"/ws/x"), b"/ws/x");
        assert_eq!(caller_path(42, b"proc/self/x"), b"proc/self/x");
        assert_eq!(caller_path(42, b"//proc/./self//fd/3"), b"/proc/42/fd/3");
        assert_eq!(caller_path(42, b"./a//b/./"), b"a/b/");
        assert_eq!(caller_path(42, b"x/."), b"x/");
        assert_eq!(caller_path(42, b"."), b".");
        assert_eq!(
            caller_path(42, b""),
            b"",
            "an empty path stays empty (ENOENT)"
        );
        assert_eq!(caller_path(42, b"/"), b"/");
    }

    #[test]
    fn a_path_splits_into_its_directory_and_last_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        std::fs::create_dir(root.join("a")).expect("a");
        std::os::unix::fs::symlink("a", root.join("g")).expect("link");
        let base = open_at(
            libc::AT_FDCWD,
            &cstring(root.as_os_str().as_encoded_bytes()),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )
        .expect("base");
        let e = entry_at(Some(&base), b"g/new.txt").expect("entry");
        assert_eq!(
            e.place(),
            root.join("a/new.txt"),
            "the directory is resolved"
        );
        let e = entry_at(Some(&base), b"a/sub//").expect("entry");
        assert!(e.dir_only);
        assert_eq!(e.place(), root.join("a/sub"));
        let abs = format!("{}/g", root.display());
        let e = entry_at(None, abs.as_bytes()).expect("entry");
        assert_eq!(e.place(), root.join("g"), "the last name is not followed");
        assert_eq!(entry_at(Some(&base), b"").err(), Some(libc::ENOENT));
        assert_eq!(
            entry_at(Some(&base), b"missing/x").err(),
            Some(libc::ENOENT)
        );
    }
}
