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

/// Creates `dir` with mode 0700, which must not exist yet (its parents are
/// made as needed): a process's private home is never one another process
/// was given.
pub fn fresh_private_dir(dir: &Path) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        private_dir(parent)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}

pub struct RuntimeDir {
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

impl RuntimeDir {
    pub fn create() -> anyhow::Result<Self> {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let root = runtime_root();
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
        // Made under a temporary name and locked before it gets its real
        // name, so no other server starting now can take it for stale.
        let pid = std::process::id();
        let path = root.join(pid.to_string());
        let fresh = root.join(format!("{pid}.new"));
        let _ = std::fs::remove_dir_all(&fresh);
        private_dir(&fresh).with_context(|| format!("cannot create {}", fresh.display()))?;
        let lock = File::create(fresh.join("lock"))?;
        if !try_lock(&lock) {
            bail!("cannot lock {}", fresh.display());
        }
        if path.exists() {
            // A dead server that had our pid.
            std::fs::remove_dir_all(&path)?;
        }
        std::fs::rename(&fresh, &path)
            .with_context(|| format!("cannot create {}", path.display()))?;
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

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Where this user's servers keep their runtime directories.
pub fn runtime_root() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("ferrepl-{uid}"))
}

/// The runtime directories of this user's live servers (their lock is
/// held), by pid; none when the root is not this user's own directory.
pub fn live_servers() -> Vec<(u32, PathBuf)> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let root = runtime_root();
    let owned = std::fs::symlink_metadata(&root).is_ok_and(|m| m.is_dir() && m.uid() == uid);
    let Some(entries) = owned.then(|| std::fs::read_dir(&root).ok()).flatten() else {
        return Vec::new();
    };
    let mut live: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path())))
        .filter(|(_, dir)| {
            // Taking the lock (and letting it go at once) means no server holds it.
            File::open(dir.join("lock")).is_ok_and(|f| !try_lock(&f))
        })
        .collect();
    live.sort();
    live
}

/// Removes the directories of servers that are gone.
fn remove_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let dir = entry.path();
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let (pid, starting) = match name.strip_suffix(".new") {
            Some(p) => (p, true),
            None => (name, false),
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        // A directory is stale when its lock can be taken (its server is
        // gone); one still being made belongs to a live pid.
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        let stale = if starting {
            !alive
        } else {
            match File::open(dir.join("lock")) {
                Ok(f) => try_lock(&f),
                Err(_) => !alive,
            }
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
