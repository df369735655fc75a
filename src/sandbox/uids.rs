//! The uids a root server gives its sessions, from one table for the whole
//! host (`--uid-table`, default `/var/lib/ferrepl/uids.json`): each key —
//! (state directory, workspace, tenant) — gets a uid of `--tenant-uids` that
//! no other key holds, so two instances (other projects, other state
//! directories) never run sessions as one uid, a restart or a reordered
//! tokens file never moves one, and `--resume` (which governs sessions, not
//! identities) changes nothing. The table is root's: read, changed and
//! written back under `flock`, its directory and file refused unless they
//! are root's and nobody else may write them. A key is dropped, and its uid
//! free again, once its workspace no longer exists and the last server that
//! used it has exited.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::Identity;

mod file;

use file::{lock, open_dir, open_existing_dir, read, write};

/// Where the table is kept unless `--uid-table` says otherwise.
pub const DEFAULT_TABLE: &str = "/var/lib/ferrepl/uids.json";

/// The tenant of a one-tenant server (not a valid tenant name).
pub const SOLE: &str = "*";

/// The table's format.
const VERSION: u32 = 1;

/// Largest table read (40,000 keys of long paths fit).
const MAX_BYTES: u64 = 64 << 20;

/// `START-END`, both within 1..=4294967293.
pub fn parse_range(text: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{text:?}: give START-END, e.g. 20000-59999 (uids above 0)");
    let (a, b) = text.split_once('-').ok_or_else(bad)?;
    let start: u32 = a.trim().parse().map_err(|_| bad())?;
    let end: u32 = b.trim().parse().map_err(|_| bad())?;
    if start == 0 || end < start || end >= u32::MAX - 1 {
        return Err(bad());
    }
    Ok((start, end))
}

/// Why a uid could not be given.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    /// The table, its directory or its lock is not root's alone.
    #[error("{0}")]
    Unsafe(String),
    #[error(
        "cannot {what} {}: {source}; the host's table of session uids must be writable by root (--uid-table, FERREPL_UID_TABLE: a file on a place only root may write)",
        .path.display()
    )]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}: not a table of session uids ({why}); fix the file, or remove it while no ferrepl runs as root (every instance's sessions then get new uids, and tenants' workspaces are given to them at their next start)",
        .path.display()
    )]
    Invalid { path: PathBuf, why: String },
    #[error(
        "no free uid left in --tenant-uids {start}-{end}: {held} of them are held in {} by workspaces that still exist or servers still running (uids in /etc/passwd, /etc/group, /etc/subuid, /etc/subgid or not mapped in this user namespace are skipped); remove the entries of projects no longer served from that file (each names its state directory, workspace and tenant; a removed workspace frees its entry by itself once its server has exited), or give a wider --tenant-uids",
        .path.display()
    )]
    Exhausted {
        path: PathBuf,
        start: u32,
        end: u32,
        held: usize,
    },
}

/// The instance asking: what its keys are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// `--state-dir` (or its default) as named, with no link in it where
    /// it exists; None where there is none (no HOME): whatever `--resume`
    /// says.
    pub state_dir: Option<PathBuf>,
    /// `--workdir`: the sole tenant's workspace, the tenants' root.
    pub workdir: PathBuf,
}

impl Instance {
    /// The workspace of `tenant`: `--workdir` itself for the sole tenant,
    /// `<workdir>/<tenant>` for a named one.
    fn workspace_of(&self, tenant: &str) -> PathBuf {
        if tenant == SOLE {
            self.workdir.clone()
        } else {
            self.workdir.join(tenant)
        }
    }
}

/// The server that last used a key: alive while a process with this pid
/// and start time runs since this boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Server {
    boot: String,
    pid: u32,
    start: u64,
}

impl Server {
    /// This process.
    fn this() -> Option<Self> {
        let pid = std::process::id();
        Some(Self {
            boot: boot_id()?,
            pid,
            start: start_time(pid)?,
        })
    }

    fn alive(&self) -> bool {
        boot_id().as_deref() == Some(self.boot.as_str()) && start_time(self.pid) == Some(self.start)
    }
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// A process's start time (clock ticks after boot: field 22 of its stat).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// One key and its uid.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    uid: u32,
    #[serde(with = "path_json::option")]
    state_dir: Option<PathBuf>,
    #[serde(with = "path_json")]
    workspace: PathBuf,
    tenant: String,
    /// The server that last asked for it (None: not known).
    #[serde(default)]
    server: Option<Server>,
    /// When that was (seconds since the epoch), for the operator pruning.
    #[serde(default)]
    used: u64,
}

impl Entry {
    fn is(&self, state_dir: Option<&Path>, workspace: &Path, tenant: &str) -> bool {
        self.state_dir.as_deref() == state_dir
            && self.workspace == workspace
            && self.tenant == tenant
    }

    /// Its workspace is gone and so is its server: its uid may go to
    /// another key. A workspace that cannot be looked at counts as there.
    fn stale(&self) -> bool {
        let gone = matches!(
            std::fs::symlink_metadata(&self.workspace),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        );
        gone && !self.server.as_ref().is_some_and(Server::alive)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Table {
    version: u32,
    entries: Vec<Entry>,
}

/// Paths as JSON strings, or arrays of bytes where they are not UTF-8 (two
/// such paths must never come out as one key).
mod path_json {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::{Path, PathBuf};

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Text(String),
        Bytes(Vec<u8>),
    }

    fn repr(path: &Path) -> Repr {
        match path.to_str() {
            Some(s) => Repr::Text(s.to_string()),
            None => Repr::Bytes(path.as_os_str().as_bytes().to_vec()),
        }
    }

    fn path(repr: Repr) -> PathBuf {
        match repr {
            Repr::Text(s) => PathBuf::from(s),
            Repr::Bytes(b) => PathBuf::from(std::ffi::OsString::from_vec(b)),
        }
    }

    pub fn serialize<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
        repr(p).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        Repr::deserialize(d).map(path)
    }

    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
            p.as_deref().map(repr).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
            Option::<Repr>::deserialize(d).map(|r| r.map(path))
        }
    }
}

/// The host's table as this instance uses it: its keys' uids, looked up
/// (and given) under the table's lock, remembered for the server's life.
pub struct TenantUids {
    path: PathBuf,
    range: (u32, u32),
    instance: Instance,
    /// Peeking (doctor): nothing is made or written.
    peek: bool,
    /// Uids this server has looked up, by tenant.
    given: Mutex<BTreeMap<String, u32>>,
    /// The table as last read.
    seen: Mutex<Table>,
}

impl TenantUids {
    /// The table at `path` (absolute): where its directory exists, it and
    /// the table are checked and read now, so a table that is not root's
    /// alone refuses the start. The directory is made (0700) when a uid is
    /// first looked up, or by `prepare`: a server whose sessions run as the
    /// workspace's owner needs none.
    pub fn open(path: &Path, instance: Instance, range: (u32, u32)) -> Result<Self, UidError> {
        if !path.is_absolute() || path.file_name().is_none() {
            return Err(UidError::Unsafe(format!(
                "--uid-table {}: give an absolute path to a file",
                path.display()
            )));
        }
        let table = match std::fs::symlink_metadata(path.parent().unwrap_or(Path::new("/"))) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Table::default(),
            _ => read(&open_dir(path)?, path)?,
        };
        Ok(Self {
            path: path.to_path_buf(),
            range,
            instance,
            peek: false,
            given: Mutex::new(BTreeMap::new()),
            seen: Mutex::new(table),
        })
    }

    /// Makes the table's directory where it is missing, and checks it and
    /// the table: for a server with tenants, whose first uid is looked up
    /// at a tenant's first request, so that a table that cannot be kept
    /// refuses the start instead.
    pub fn prepare(&self) -> Result<(), UidError> {
        if self.peek {
            return Ok(());
        }
        let dir = open_dir(&self.path)?;
        drop(lock(&dir, &self.path)?);
        read(&dir, &self.path).map(drop)
    }

    /// The table as it is, never written (for doctor, which changes
    /// nothing): uids are read, or found as they would be given.
    pub fn peek(path: &Path, instance: Instance, range: (u32, u32)) -> Self {
        let table = path
            .parent()
            .and_then(|d| open_existing_dir(d).ok())
            .and_then(|dir| read(&dir, path).ok())
            .unwrap_or_default();
        Self {
            path: path.to_path_buf(),
            range,
            instance,
            peek: true,
            given: Mutex::new(BTreeMap::new()),
            seen: Mutex::new(table),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The uid (and gid: the same number) of `tenant` of this instance,
    /// given now if its key has none; either way the key is marked used by
    /// this server.
    pub fn identity_of(&self, tenant: &str) -> Result<Identity, UidError> {
        let mut given = self.given.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(uid) = given.get(tenant) {
            return Ok(Identity {
                uid: *uid,
                gid: *uid,
            });
        }
        let workspace = self.instance.workspace_of(tenant);
        let state_dir = self.instance.state_dir.as_deref();
        if self.peek {
            // Peeking: the uid the key has, or would get.
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let uid = match seen
                .entries
                .iter()
                .find(|e| e.is(state_dir, &workspace, tenant))
            {
                Some(e) => e.uid,
                None => self.free_uid(&seen)?,
            };
            return Ok(Identity { uid, gid: uid });
        }
        let dir = &open_dir(&self.path)?;
        let _lock = lock(dir, &self.path)?;
        let mut table = read(dir, &self.path)?;
        table.entries.retain(|e| {
            let stale = !e.is(state_dir, &workspace, tenant) && e.stale();
            if stale {
                tracing::info!(
                    uid = e.uid,
                    "uid table: the workspace {} is gone and no server uses it: its uid is free again",
                    e.workspace.display()
                );
            }
            !stale
        });
        let server = Server::this();
        let used = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let uid = match table
            .entries
            .iter_mut()
            .find(|e| e.is(state_dir, &workspace, tenant))
        {
            Some(entry) => {
                entry.server = server;
                entry.used = used;
                entry.uid
            }
            None => {
                let uid = self.free_uid(&table)?;
                table.entries.push(Entry {
                    uid,
                    state_dir: state_dir.map(Path::to_path_buf),
                    workspace: workspace.clone(),
                    tenant: tenant.to_string(),
                    server,
                    used,
                });
                tracing::info!(
                    uid,
                    table = %self.path.display(),
                    "{} gets a uid of its own",
                    describe_key(tenant, &workspace)
                );
                uid
            }
        };
        write(dir, &self.path, &table)?;
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = table;
        given.insert(tenant.to_string(), uid);
        Ok(Identity { uid, gid: uid })
    }

    /// A uid the start-up probe may try: one this instance holds already,
    /// else the one its next key would get (nothing is given).
    pub fn probe_identity(&self) -> Identity {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let state_dir = self.instance.state_dir.as_deref();
        let uid = seen
            .entries
            .iter()
            .find(|e| {
                e.state_dir.as_deref() == state_dir
                    && e.workspace.starts_with(&self.instance.workdir)
            })
            .map(|e| e.uid)
            .or_else(|| self.free_uid(&seen).ok())
            .unwrap_or(self.range.0);
        Identity { uid, gid: uid }
    }

    /// The lowest uid of the range no key holds and nothing else rules out.
    fn free_uid(&self, table: &Table) -> Result<u32, UidError> {
        let held: std::collections::BTreeSet<u32> = table.entries.iter().map(|e| e.uid).collect();
        let free = Free::read();
        (self.range.0..=self.range.1)
            .find(|u| !held.contains(u) && free.allows(*u))
            .ok_or_else(|| UidError::Exhausted {
                path: self.path.clone(),
                start: self.range.0,
                end: self.range.1,
                held: held.range(self.range.0..=self.range.1).count(),
            })
    }
}

fn describe_key(tenant: &str, workspace: &Path) -> String {
    if tenant == SOLE {
        format!("the workspace {}", workspace.display())
    } else {
        format!("tenant {tenant:?} (workspace {})", workspace.display())
    }
}

/// What rules a uid out: an account or group of that number, a
/// subordinate range, or no mapping in this user namespace.
struct Free {
    sub: Vec<(u32, u32)>,
    mapped: Vec<(u32, u32)>,
}

impl Free {
    fn read() -> Self {
        let mut sub = Vec::new();
        for file in ["/etc/subuid", "/etc/subgid"] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            sub.extend(text.lines().filter_map(|l| {
                let mut f = l.trim().split(':').skip(1);
                let start: u32 = f.next()?.parse().ok()?;
                let count: u32 = f.next()?.parse().ok()?;
                Some((start, start.saturating_add(count)))
            }));
        }
        let mut mapped = Vec::new();
        for file in ["/proc/self/uid_map", "/proc/self/gid_map"] {
            let ranges: Vec<(u32, u32)> = std::fs::read_to_string(file)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| {
                    let mut f = l.split_whitespace();
                    let inside: u32 = f.next()?.parse().ok()?;
                    let _outside: u32 = f.next()?.parse().ok()?;
                    let count: u32 = f.next()?.parse().ok()?;
                    Some((inside, inside.saturating_add(count)))
                })
                .collect();
            if mapped.is_empty() {
                mapped = ranges;
            } else {
                // Both maps must hold it (uid and gid are one number).
                mapped.retain(|m: &(u32, u32)| ranges.iter().any(|r| r.0 <= m.0 && m.1 <= r.1));
            }
        }
        Self { sub, mapped }
    }

    fn allows(&self, id: u32) -> bool {
        let within = |r: &(u32, u32)| r.0 <= id && id < r.1;
        id != 65534
            && !self.sub.iter().any(within)
            && (self.mapped.is_empty() || self.mapped.iter().any(within))
            && nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(id))
                .ok()
                .flatten()
                .is_none()
            && nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(id))
                .ok()
                .flatten()
                .is_none()
    }
}

/// Gives a tenant's workspace (and what is in it) to its uid, once: files
/// the server made there before are the tenant's too. Never follows a
/// symbolic link, never leaves the workspace's file system, and leaves
/// alone files with other names elsewhere (hard links).
pub fn give_workspace(dir: &Path, id: Identity) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let top = std::fs::symlink_metadata(dir)?;
    if top.uid() == id.uid && top.gid() == id.gid {
        return Ok(());
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.dev() != top.dev() || (!meta.is_dir() && meta.nlink() > 1) {
            continue;
        }
        std::os::unix::fs::lchown(&path, Some(id.uid), Some(id.gid))?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
