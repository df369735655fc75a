//! Kernel sessions a person on the server's machine can attach a Jupyter
//! client to (`ferrepl attach`): the server publishes, in its private
//! runtime directory, one connection file per kernel session (its own
//! copy of what it gave the kernel, with the server's workspace; a
//! tenant's in the tenant's directory there), and the command
//! (setup/attach.rs) finds it among the live servers of this user. Never
//! reads a file a session can write: the kernel's home is the session's.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The index's directory in a server's (or tenant's) runtime directory.
const INDEX_DIR: &str = "attach";
/// Keys the index adds to a connection file; Jupyter clients ignore them.
const WORKDIR_KEY: &str = "ferrepl_workdir";
const SESSION_KEY: &str = "ferrepl_session";
/// The places the server's sessions may write (beyond the workspace):
/// `ferrepl attach` runs no program from them.
const WRITES_KEY: &str = "ferrepl_session_writes";

/// Publishes kernel session `session`'s connection (`info`, as given to
/// the kernel) in `runtime` (the server's or its tenant's directory), with
/// the places beyond `workdir` its sessions may write (`writes`).
/// Failing only costs `ferrepl attach` this session, so it is logged.
pub fn publish(runtime: &Path, session: &str, info: &Value, workdir: &Path, writes: &[PathBuf]) {
    let mut info = info.clone();
    info[WORKDIR_KEY] = Value::from(workdir.display().to_string());
    info[SESSION_KEY] = Value::from(session);
    info[WRITES_KEY] = writes
        .iter()
        .map(|w| Value::from(w.display().to_string()))
        .collect();
    if let Err(e) = write_entry(runtime, session, &info) {
        tracing::warn!(session, error = %e, "cannot publish the kernel's connection for ferrepl attach");
    }
}

fn write_entry(runtime: &Path, session: &str, info: &Value) -> std::io::Result<()> {
    let dir = runtime.join(INDEX_DIR);
    crate::state::private_dir(&dir)?;
    let tmp = dir.join(format!(".{session}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    serde_json::to_writer_pretty(&file, info)?;
    drop(file);
    std::fs::rename(&tmp, entry_path(runtime, session))
}

/// Removes kernel session `session`'s entry (its kernel is gone).
pub fn withdraw(runtime: &Path, session: &str) {
    let _ = std::fs::remove_file(entry_path(runtime, session));
}

fn entry_path(runtime: &Path, session: &str) -> PathBuf {
    // Session names are letters, digits, '_', '-' and '.', never a path.
    runtime.join(INDEX_DIR).join(format!("{session}.json"))
}

/// A kernel session published by a live server.
#[derive(Debug)]
pub(crate) struct Entry {
    pub file: PathBuf,
    pub session: String,
    pub workdir: PathBuf,
    /// The server's pid (its runtime directory's name).
    pub server: u32,
    /// The tenant whose session it is (None: the server's sole tenant),
    /// from the directory the server published it in, never from what
    /// the file says.
    pub tenant: Option<String>,
    /// Where its kernel listens (an ipc socket's path), to tell a live
    /// kernel from one that ended since.
    pub shell_socket: Option<PathBuf>,
    /// The places its server's sessions may write: the workspace first.
    pub session_writes: Vec<PathBuf>,
}

impl Entry {
    fn read(file: PathBuf, server: u32, tenant: Option<String>) -> Option<Self> {
        let text = std::fs::read_to_string(&file).ok()?;
        let info: Value = serde_json::from_str(&text).ok()?;
        let shell_socket = (info["transport"] == "ipc").then(|| {
            PathBuf::from(format!(
                "{}-{}",
                info["ip"].as_str().unwrap_or_default(),
                info["shell_port"]
            ))
        });
        let workdir = PathBuf::from(info[WORKDIR_KEY].as_str()?);
        let mut session_writes = vec![workdir.clone()];
        session_writes.extend(
            info[WRITES_KEY]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(PathBuf::from),
        );
        Some(Self {
            session: info[SESSION_KEY].as_str()?.to_string(),
            workdir,
            session_writes,
            shell_socket,
            file,
            server,
            tenant,
        })
    }

    pub fn kernel_running(&self) -> bool {
        self.shell_socket.as_deref().is_none_or(Path::exists)
    }
}

/// The entries live server `pid` publishes in its directory `server` (its
/// own, and each tenant's in `tenants/NAME/`).
pub(crate) fn entries_of(pid: u32, server: &Path) -> Vec<Entry> {
    let mut dirs: Vec<(PathBuf, Option<String>)> = vec![(server.join(INDEX_DIR), None)];
    if let Ok(tenants) = std::fs::read_dir(server.join("tenants")) {
        dirs.extend(tenants.filter_map(Result::ok).filter_map(|t| {
            let name = t.file_name().to_str()?.to_string();
            Some((t.path().join(INDEX_DIR), Some(name)))
        }));
    }
    dirs.into_iter()
        .filter_map(|(d, tenant)| Some((std::fs::read_dir(d).ok()?, tenant)))
        .flat_map(|(rd, tenant)| {
            rd.filter_map(Result::ok)
                .map(move |e| (e.path(), tenant.clone()))
        })
        .filter(|(p, _)| p.extension().is_some_and(|x| x == "json") && owned_file(p))
        .take(MAX_ENTRIES)
        .filter_map(|(p, tenant)| Entry::read(p, pid, tenant))
        .collect()
}

/// Entries read from one server, at most (sessions are bounded anyway).
const MAX_ENTRIES: usize = 4096;

/// A regular file (not a symlink) owned by this user: what a server of
/// this user wrote.
fn owned_file(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file() && m.uid() == uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_entry_reads_back_and_withdraws() {
        let dir = std::env::temp_dir().join(format!("ferrepl-attach-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let info = serde_json::json!({"transport": "ipc", "ip": "/nonexistent/k", "shell_port": 1});
        publish(
            &dir,
            "k1",
            &info,
            Path::new("/w"),
            &[PathBuf::from("/kept")],
        );
        publish(
            &dir.join("tenants/alpha"),
            "k1",
            &info,
            Path::new("/w/alpha"),
            &[],
        );
        let mut found = entries_of(7, &dir);
        found.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        assert_eq!(found.len(), 2);
        assert_eq!(found[1].tenant.as_deref(), Some("alpha"));
        assert_eq!(found[1].workdir, Path::new("/w/alpha"));
        found.truncate(1);
        assert_eq!(found[0].session, "k1");
        assert_eq!(found[0].server, 7);
        assert_eq!(found[0].tenant, None);
        assert_eq!(found[0].workdir, Path::new("/w"));
        assert_eq!(
            found[0].session_writes,
            [PathBuf::from("/w"), PathBuf::from("/kept")]
        );
        assert_eq!(
            found[0].shell_socket.as_deref(),
            Some(Path::new("/nonexistent/k-1"))
        );
        assert!(!found[0].kernel_running());
        withdraw(&dir, "k1");
        withdraw(&dir.join("tenants/alpha"), "k1");
        assert!(entries_of(7, &dir).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
