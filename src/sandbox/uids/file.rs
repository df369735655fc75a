//! The table's file on disk: its directory and file refused unless they
//! are root's and nobody else may write them, the `flock` held while the
//! table is read, changed and written back, the reading (bounded, checked)
//! and the atomic write. Apart from `uids.rs`, which decides who gets
//! which uid, because keeping a root-owned file safe is a concern of its own.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use super::{MAX_BYTES, Table, UidError, VERSION, describe_key};

/// The table's directory, made 0700 if missing (its parent must exist),
/// opened without following a link at its last component, and refused
/// unless it is a directory of root's (this server's user) that neither
/// group nor others may write.
pub(super) fn open_dir(path: &Path) -> Result<OwnedFd, UidError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    if let Err(e) = std::fs::symlink_metadata(dir)
        && e.kind() == std::io::ErrorKind::NotFound
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(|source| UidError::Io {
                what: "create the directory",
                path: dir.to_path_buf(),
                source,
            })?;
    }
    open_existing_dir(dir)
}

pub(super) fn open_existing_dir(dir: &Path) -> Result<OwnedFd, UidError> {
    use nix::fcntl::OFlag;
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => UidError::Unsafe(format!(
            "{}, the directory of the host's table of session uids, is a symbolic link or not a directory; give --uid-table a file in a directory of root's",
            dir.display()
        )),
        e => UidError::Io {
            what: "open",
            path: dir.to_path_buf(),
            source: e.into(),
        },
    })?;
    check_owned(&fd, dir, "directory")?;
    Ok(fd)
}

/// Refuses what is not root's (this server's user) or that group or
/// others may write.
pub(super) fn check_owned(fd: &impl AsFd, path: &Path, kind: &str) -> Result<(), UidError> {
    let meta = nix::sys::stat::fstat(fd).map_err(|e| UidError::Io {
        what: "inspect",
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let euid = nix::unistd::geteuid().as_raw();
    let want = if kind == "directory" {
        libc::S_IFDIR
    } else {
        libc::S_IFREG
    };
    if meta.st_mode & libc::S_IFMT != want || meta.st_uid != euid || meta.st_mode & 0o022 != 0 {
        return Err(UidError::Unsafe(format!(
            "{}: the host's table of session uids (its {kind}) must be a {kind} of uid {euid} that group and others may not write, and it is {} of uid {} with mode {:o}; a table anyone else could write could give two instances one uid: fix its owner and mode (chown {euid}, chmod go-w) or give --uid-table a file of root's",
            path.display(),
            if meta.st_mode & libc::S_IFMT == libc::S_IFDIR {
                "a directory"
            } else if meta.st_mode & libc::S_IFMT == libc::S_IFREG {
                "a file"
            } else {
                "something else"
            },
            meta.st_uid,
            meta.st_mode & 0o7777
        )));
    }
    Ok(())
}

pub(super) fn name_of(path: &Path) -> &std::ffi::OsStr {
    path.file_name().unwrap_or(path.as_os_str())
}

/// The table's lock (`<file>.lock`), taken exclusively; released when the
/// returned file is dropped.
pub(super) fn lock(dir: &OwnedFd, path: &Path) -> Result<std::fs::File, UidError> {
    use nix::fcntl::OFlag;
    let mut name = name_of(path).to_os_string();
    name.push(".lock");
    let lock_path = path.with_file_name(&name);
    let io = |what, source| UidError::Io {
        what,
        path: lock_path.clone(),
        source,
    };
    let fd = nix::fcntl::openat(
        dir,
        name.as_os_str(),
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| io("create", e.into()))?;
    check_owned(&fd, &lock_path, "file")?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io("lock", std::io::Error::last_os_error()));
    }
    Ok(std::fs::File::from(fd))
}

/// The table (empty where there is no file yet), checked.
pub(super) fn read(dir: &OwnedFd, path: &Path) -> Result<Table, UidError> {
    use nix::fcntl::OFlag;
    let fd = match nix::fcntl::openat(
        dir,
        name_of(path),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => {
            return Ok(Table {
                version: VERSION,
                entries: Vec::new(),
            });
        }
        Err(nix::errno::Errno::ELOOP) => {
            return Err(UidError::Unsafe(format!(
                "{}: the host's table of session uids is a symbolic link; remove it (ferrepl makes the file itself) or give --uid-table the file itself",
                path.display()
            )));
        }
        Err(e) => {
            return Err(UidError::Io {
                what: "open",
                path: path.to_path_buf(),
                source: e.into(),
            });
        }
    };
    check_owned(&fd, path, "file")?;
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(MAX_BYTES)
        .read_to_string(&mut text)
        .map_err(|source| UidError::Io {
            what: "read",
            path: path.to_path_buf(),
            source,
        })?;
    let invalid = |why: String| UidError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    let table: Table = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    if table.version != VERSION {
        return Err(invalid(format!(
            "version {}, this ferrepl reads {VERSION}",
            table.version
        )));
    }
    // Root, nobody, or one uid for two keys would undo the boundary.
    let mut uids = std::collections::BTreeSet::new();
    for (i, e) in table.entries.iter().enumerate() {
        if e.uid == 0 || e.uid == 65534 {
            return Err(invalid(format!("it gives uid {}", e.uid)));
        }
        if !uids.insert(e.uid) {
            return Err(invalid(format!("it gives uid {} twice", e.uid)));
        }
        let twice = table.entries[..i]
            .iter()
            .any(|o| o.is(e.state_dir.as_deref(), &e.workspace, &e.tenant));
        if twice {
            return Err(invalid(format!(
                "{} has two entries",
                describe_key(&e.tenant, &e.workspace)
            )));
        }
    }
    Ok(table)
}

/// Written beside (`<file>.new`, created afresh, 0600), then renamed over:
/// a crash leaves the old table or the new.
pub(super) fn write(dir: &OwnedFd, path: &Path, table: &Table) -> Result<(), UidError> {
    use nix::fcntl::OFlag;
    let mut name = name_of(path).to_os_string();
    name.push(".new");
    let io = |what, source| UidError::Io {
        what,
        path: path.with_file_name(&name),
        source,
    };
    let _ = nix::unistd::unlinkat(
        dir,
        name.as_os_str(),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    );
    let json = serde_json::to_vec_pretty(table).map_err(|e| io("encode", e.into()))?;
    let fd = nix::fcntl::openat(
        dir,
        name.as_os_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| io("create", e.into()))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(&json)
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_all())
        .map_err(|e| io("write", e))?;
    nix::fcntl::renameat(dir, name.as_os_str(), dir, name_of(path))
        .map_err(|e| io("rename", e.into()))?;
    let _ = nix::unistd::fsync(dir);
    Ok(())
}
