//! The state directory the stores live in: opened once, checked (not a
//! link, this user's, not writable by others) and reached through its
//! descriptor; the locks that keep one server per store; the removal of
//! stores nobody used for longer than the retention. Apart from `mod.rs`,
//! which is the store itself, because keeping a shared directory safe is a
//! concern of its own.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{StoreError, io};

/// Creates the state directory `dir` if missing and checks it as a store
/// opens it (not a link, this user's, not writable by others); its path
/// with no link in it. Start-up calls it before anything is written there.
pub fn check_state_dir(dir: &Path) -> Result<PathBuf, StoreError> {
    StateDir::open(dir).map(|d| d.real)
}

/// The state directory, opened once (its last component not followed) and
/// checked, then reached through its descriptor: nothing a session could
/// plant later (a symbolic link, another directory) redirects the
/// server's writes. `real` is its path with no link in it, for SQLite.
pub(super) struct StateDir {
    pub(super) fd: std::os::fd::OwnedFd,
    pub(super) real: PathBuf,
}

impl StateDir {
    /// Creates `dir` mode 0700 if missing; an existing one must be a
    /// directory (not a symbolic link) of this user, not writable by
    /// others, since the store holds the code sessions ran. (Group-writable
    /// is allowed: a Kubernetes fsGroup volume is.)
    pub(super) fn open(dir: &Path) -> Result<Self, StoreError> {
        use nix::fcntl::OFlag;
        let shown = dir.display();
        if std::fs::symlink_metadata(dir).is_err() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io("create directory", dir))?;
            // The umask may have taken bits off; 0700 is what we mean.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io("set the mode of", dir))?;
        }
        let fd = nix::fcntl::open(
            dir,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| match e {
            nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => StoreError::Unsafe(format!(
                "the state directory {shown} is a symbolic link or not a directory; point --state-dir at the directory itself"
            )),
            e => io("open", dir)(e.into()),
        })?;
        let meta = nix::sys::stat::fstat(&fd).map_err(|e| io("inspect", dir)(e.into()))?;
        let euid = nix::unistd::geteuid().as_raw();
        if meta.st_uid != euid {
            return Err(StoreError::Unsafe(format!(
                "the state directory {shown} is owned by uid {}, not by this user (uid {euid}); point --state-dir at a directory of your own",
                meta.st_uid
            )));
        }
        if meta.st_mode & 0o002 != 0 {
            return Err(StoreError::Unsafe(format!(
                "the state directory {shown} is writable by others (mode {:o}); run chmod o-w on it or use another --state-dir",
                meta.st_mode & 0o7777
            )));
        }
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap_or_else(|_| dir.to_path_buf());
        Ok(Self { fd, real })
    }

    /// Opens `name` in the directory (never through a link), creating it
    /// mode 0600; it must be a regular file of this user. An existing file
    /// keeps its content.
    pub(super) fn create_private(&self, name: &str) -> Result<File, StoreError> {
        use nix::fcntl::OFlag;
        let path = self.real.join(name);
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_RDWR
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC
                | OFlag::O_NONBLOCK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| io("create", &path)(e.into()))?;
        let meta = nix::sys::stat::fstat(&fd).map_err(|e| io("inspect", &path)(e.into()))?;
        if meta.st_mode & libc::S_IFMT != libc::S_IFREG
            || meta.st_uid != nix::unistd::geteuid().as_raw()
        {
            return Err(StoreError::Unsafe(format!(
                "{} is not a regular file of this user; remove it",
                path.display()
            )));
        }
        Ok(File::from(fd))
    }

    /// Makes `name` mode 0600 if it exists (never through a link).
    pub(super) fn restrict(&self, name: &str) -> Result<(), StoreError> {
        match self.create_existing(name) {
            Ok(Some(file)) => file
                .set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(io("restrict", &self.real.join(name))),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `name` opened if it exists as a regular file of this user.
    pub(super) fn create_existing(&self, name: &str) -> Result<Option<File>, StoreError> {
        use nix::fcntl::OFlag;
        match nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            nix::sys::stat::Mode::empty(),
        ) {
            Ok(fd) => {
                let meta = nix::sys::stat::fstat(&fd)
                    .map_err(|e| io("inspect", &self.real.join(name))(e.into()))?;
                if meta.st_mode & libc::S_IFMT != libc::S_IFREG
                    || meta.st_uid != nix::unistd::geteuid().as_raw()
                {
                    return Err(StoreError::Unsafe(format!(
                        "{} is not a regular file of this user; remove it",
                        self.real.join(name).display()
                    )));
                }
                Ok(Some(File::from(fd)))
            }
            Err(nix::errno::Errno::ENOENT) => Ok(None),
            Err(e) => Err(io("open", &self.real.join(name))(e.into())),
        }
    }

    /// Removes `name` from the directory if it is a regular file of this
    /// user (never what a link points to).
    pub(super) fn remove(&self, name: &str) {
        use nix::fcntl::AtFlags;
        let ours =
            nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|m| {
                m.st_mode & libc::S_IFMT == libc::S_IFREG
                    && m.st_uid == nix::unistd::geteuid().as_raw()
            });
        if ours {
            let _ = nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
    }

    /// When `name` was last written (None: no such file of ours).
    pub(super) fn modified(&self, name: &str) -> Option<std::time::SystemTime> {
        use nix::fcntl::AtFlags;
        let m = nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        let secs = u64::try_from(m.st_mtime).ok()?;
        Some(std::time::UNIX_EPOCH + Duration::from_secs(secs))
    }
}

/// Takes the lock `name` in the directory, recording this pid in it:
/// Ok(Err(pid)) when another process holds it (with its pid, if it wrote
/// one).
pub(super) fn lock(dir: &StateDir, name: &str) -> Result<Result<File, Option<u32>>, StoreError> {
    let path = dir.real.join(name);
    let mut file = dir.create_private(name)?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io("lock", &path)(e));
        }
        let mut text = String::new();
        let pid = file
            .read_to_string(&mut text)
            .ok()
            .and_then(|_| text.trim().parse().ok());
        return Ok(Err(pid));
    }
    file.set_len(0)
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .map_err(io("write", &path))?;
    Ok(Ok(file))
}

/// Removes the stores of other workspaces (gone, or not used) that nobody
/// wrote for longer than `keep` and no server holds: retention by age,
/// across workspaces. Only regular files of this user, named through the
/// directory's descriptor.
pub(super) fn remove_unused(dir: &StateDir, keep: Duration) {
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.fd.as_raw_fd())) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let unused = |name: &str| {
        dir.modified(name)
            .is_none_or(|t| now.duration_since(t).unwrap_or_default() > keep)
    };
    for entry in entries.filter_map(Result::ok) {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !name.ends_with(".sqlite3")
            || dir.modified(&name).is_none()
            || !unused(&name)
            || !unused(&format!("{name}-wal"))
        {
            continue;
        }
        // Held while removing, so no server opens it meanwhile.
        let lock_name = format!("{name}.lock");
        let Ok(Ok(_held)) = lock(dir, &lock_name) else {
            continue;
        };
        for suffix in ["", "-wal", "-shm"] {
            dir.remove(&format!("{name}{suffix}"));
        }
        dir.remove(&lock_name);
        tracing::info!(
            "removed the unused session store {}",
            dir.real.join(&name).display()
        );
    }
}
