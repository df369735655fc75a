//! The directory of a store's saved states (`<store>.states/`), opened
//! once beside the store and used only through its descriptor: a state
//! directory swapped for a symbolic link while the server runs redirects
//! none of its writes, and no name in it is ever followed as a link.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;

/// A directory of saved states, held open.
#[derive(Debug)]
pub struct StatesDir {
    fd: OwnedFd,
    /// For messages only.
    shown: PathBuf,
}

/// A file name the directory holds: one path component, no link.
fn plain(name: &str) -> std::io::Result<&str> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(std::io::Error::other(format!("not a file name: {name:?}")));
    }
    Ok(name)
}

impl StatesDir {
    /// Creates (mode 0700) and opens `name` in the directory `parent`
    /// (the store's), never through a link.
    pub(crate) fn open_in(
        parent: &OwnedFd,
        parent_path: &Path,
        name: &str,
    ) -> std::io::Result<Self> {
        match nix::sys::stat::mkdirat(parent, plain(name)?, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = nix::fcntl::openat(
            parent,
            name,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
            Mode::empty(),
        )?;
        let meta = nix::sys::stat::fstat(&fd)?;
        if meta.st_uid != nix::unistd::geteuid().as_raw() || meta.st_mode & 0o077 != 0 {
            nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o700))?;
        }
        Ok(Self {
            fd,
            shown: parent_path.join(name),
        })
    }

    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// `name` created (or emptied) for writing, mode 0600.
    pub fn create(&self, name: &str) -> std::io::Result<File> {
        let fd = nix::fcntl::openat(
            &self.fd,
            plain(name)?,
            OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_TRUNC
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        Ok(File::from(fd))
    }

    /// `name` opened for reading, if it is a regular file.
    pub fn open(&self, name: &str) -> std::io::Result<File> {
        let fd = nix::fcntl::openat(
            &self.fd,
            plain(name)?,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        )?;
        let meta = nix::sys::stat::fstat(&fd)?;
        if meta.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(std::io::Error::other(format!(
                "{name} is not a regular file"
            )));
        }
        // Reads block as files do (O_NONBLOCK only kept a FIFO from hanging the open).
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()))?;
        Ok(File::from(fd))
    }

    pub fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        nix::fcntl::renameat(&self.fd, plain(from)?, &self.fd, plain(to)?)?;
        Ok(())
    }

    pub fn remove(&self, name: &str) {
        if let Ok(name) = plain(name) {
            let _ = nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
    }

    /// Files whose names end in `suffix`: name, size, when last written.
    pub fn list(&self, suffix: &str) -> Vec<(String, u64, SystemTime)> {
        let Ok(dir) = nix::dir::Dir::openat(
            &self.fd,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut dir = dir;
        for entry in dir.iter().flatten() {
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if !name.ends_with(suffix) {
                continue;
            }
            let Ok(st) = nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                continue;
            }
            let when = UNIX_EPOCH
                + Duration::new(
                    u64::try_from(st.st_mtime).unwrap_or(0),
                    u32::try_from(st.st_mtime_nsec).unwrap_or(0),
                );
            out.push((
                name.to_string(),
                u64::try_from(st.st_size).unwrap_or(0),
                when,
            ));
        }
        out
    }
}
