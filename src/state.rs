//! The server's private state directory: spilled output logs, the sessions'
//! temporary homes, policies handed to launchers. It lives in
//! `$XDG_RUNTIME_DIR/ferrepl-<uid>/<pid>` (else under the temporary
//! directory), mode 0700, hidden from every sandbox; directories of servers
//! that died without cleaning up (SIGKILL) are removed at the next start.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Creates `dir` (and missing parents) with mode 0700.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

pub struct StateDir {
    root: PathBuf,
    path: PathBuf,
    /// Held (flock) while this server lives: a directory whose lock can be
    /// taken belongs to a dead server.
    _lock: File,
}

fn try_lock(file: &File) -> bool {
    // SAFETY: flock on an fd we own.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

impl StateDir {
    pub fn create() -> anyhow::Result<Self> {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute() && d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let root = base.join(format!("ferrepl-{uid}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", root.display())),
        }
        // Someone else's directory (or a symlink planted there) is refused.
        let meta = std::fs::symlink_metadata(&root)?;
        if !meta.is_dir() || meta.uid() != uid {
            bail!(
                "{} is not a directory owned by uid {uid}; remove it or set XDG_RUNTIME_DIR/TMPDIR elsewhere",
                root.display()
            );
        }
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        remove_stale(&root);
        let path = root.join(std::process::id().to_string());
        if path.exists() {
            // A dead server with our pid (remove_stale took its lock).
            std::fs::remove_dir_all(&path)?;
        }
        private_dir(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let lock = File::create(path.join("lock"))?;
        if !try_lock(&lock) {
            bail!("cannot lock {}", path.display());
        }
        Ok(Self {
            root,
            path,
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory holding every server's state (hidden from sandboxes).
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes the directories of servers that are gone.
fn remove_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let dir = entry.path();
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stale = match File::open(dir.join("lock")) {
            Ok(f) => try_lock(&f),
            // No lock file: a server that died while starting, unless it
            // is starting right now.
            Err(_) => !Path::new(&format!("/proc/{pid}")).exists(),
        };
        if stale {
            tracing::info!(
                "removing the state of a server that is gone: {}",
                dir.display()
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
