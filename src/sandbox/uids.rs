//! The uids a root server gives its sessions: one per tenant, from
//! --tenant-uids, allocated once and kept by name in the state directory,
//! so a reordered tokens file or a restart never moves one, and a uid is
//! never given to another name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::Identity;

/// The file in the state directory.
pub const FILE: &str = "tenant-uids.json";

/// The key of the one-tenant server's own uid (not a valid tenant name).
pub const SOLE: &str = "*";

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
    #[error("{}: {source}; fix or remove it (tenants then get new uids, and their workspaces are given to them at their next start)", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a uid table: {source}; fix or remove it", .path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot save {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "no free uid left in --tenant-uids {0}-{1} (uids in /etc/passwd, /etc/group, /etc/subuid, /etc/subgid or not mapped in this user namespace are skipped); give a wider range"
    )]
    Exhausted(u32, u32),
}

/// The uid table: names to uids, loaded at start, saved at each new one.
pub struct TenantUids {
    file: Option<PathBuf>,
    range: (u32, u32),
    table: Mutex<BTreeMap<String, u32>>,
}

impl TenantUids {
    /// The table kept in `dir` (None: kept in memory only, with a warning).
    pub fn open(dir: Option<&Path>, range: (u32, u32)) -> Result<Self, UidError> {
        let file = dir.map(|d| d.join(FILE));
        let table = match &file {
            Some(path) => load(path)?,
            None => {
                tracing::warn!(
                    "tenants' uids are not kept across restarts without a state directory (--resume off)"
                );
                BTreeMap::new()
            }
        };
        Ok(Self {
            file,
            range,
            table: Mutex::new(table),
        })
    }

    /// The table as kept in `dir`, never saved (for doctor, which changes
    /// nothing).
    pub fn peek(dir: Option<&Path>, range: (u32, u32)) -> Self {
        let table = dir
            .and_then(|d| load(&d.join(FILE)).ok())
            .unwrap_or_default();
        Self {
            file: None,
            range,
            table: Mutex::new(table),
        }
    }

    /// The uid (and gid: the same number) of `name`, allocated now if new.
    pub fn identity_of(&self, name: &str) -> Result<Identity, UidError> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(uid) = table.get(name) {
            return Ok(Identity {
                uid: *uid,
                gid: *uid,
            });
        }
        // Other servers may share the state directory: allocate under a
        // lock, from the table as it is on disk now.
        let _lock = match &self.file {
            Some(path) => {
                let lock = lock(path)?;
                for (k, v) in load(path)? {
                    table.insert(k, v);
                }
                if let Some(uid) = table.get(name) {
                    return Ok(Identity {
                        uid: *uid,
                        gid: *uid,
                    });
                }
                Some(lock)
            }
            None => None,
        };
        let taken: Vec<u32> = table.values().copied().collect();
        let free = Free::read();
        let uid = (self.range.0..=self.range.1)
            .find(|u| !taken.contains(u) && free.allows(*u))
            .ok_or(UidError::Exhausted(self.range.0, self.range.1))?;
        table.insert(name.to_string(), uid);
        if let Some(path) = &self.file
            && let Err(e) = save(path, &table)
        {
            table.remove(name);
            return Err(e);
        }
        tracing::info!(uid, "tenant {name:?} gets its own uid");
        Ok(Identity { uid, gid: uid })
    }

    /// A uid the start-up probe may try (not given to anyone).
    pub fn probe_identity(&self) -> Identity {
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let uid = table.values().next().copied().unwrap_or(self.range.0);
        Identity { uid, gid: uid }
    }
}

/// An exclusive lock beside the table, held while the file is dropped.
fn lock(path: &Path) -> Result<std::fs::File, UidError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let lock_path = path.with_extension("lock");
    let err = |source| UidError::Write {
        path: lock_path.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&lock_path)
        .map_err(err)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok(file)
}

fn load(path: &Path) -> Result<BTreeMap<String, u32>, UidError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let read_err = |source| UidError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(read_err(e)),
    };
    if !file.metadata().map_err(read_err)?.is_file() {
        return Err(read_err(std::io::Error::other("not a regular file")));
    }
    let mut text = String::new();
    (&mut file)
        .take(1 << 20)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    let table: BTreeMap<String, u32> =
        serde_json::from_str(&text).map_err(|source| UidError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
    // Root, nobody, or one uid for two names would undo the boundary.
    let mut seen: Vec<u32> = table.values().copied().collect();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != table.len() || seen.iter().any(|u| *u == 0 || *u == 65534) {
        return Err(read_err(std::io::Error::other(
            "it gives uid 0, 65534 or one uid to two names",
        )));
    }
    Ok(table)
}

/// Written beside, then renamed over: a crash leaves the old table or the new.
fn save(path: &Path, table: &BTreeMap<String, u32>) -> Result<(), UidError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let write_err = |source| UidError::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("json.new");
    let _ = std::fs::remove_file(&tmp);
    let json = serde_json::to_vec_pretty(table).map_err(|e| write_err(e.into()))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(write_err)?;
    file.write_all(&json)
        .and_then(|()| file.sync_all())
        .map_err(write_err)?;
    std::fs::rename(&tmp, path).map_err(write_err)
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
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        assert_eq!(parse_range("20000-59999"), Ok((20000, 59999)));
        for bad in ["0-10", "10-5", "x", "5", "1-4294967295"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_name_keeps_its_uid_and_no_uid_serves_two_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let range = (3_000_000, 3_000_010);
        let uids = TenantUids::open(Some(dir.path()), range).expect("open");
        let a = uids.identity_of("alice").expect("alice");
        let b = uids.identity_of("bob").expect("bob");
        assert_ne!(a.uid, b.uid);
        assert_eq!(uids.identity_of("alice").expect("again").uid, a.uid);
        // Reopened (a restart): the same uids, and a new name gets a new one.
        let again = TenantUids::open(Some(dir.path()), range).expect("reopen");
        assert_eq!(again.identity_of("bob").expect("bob").uid, b.uid);
        let c = again.identity_of("carol").expect("carol");
        assert!(c.uid != a.uid && c.uid != b.uid);
    }

    #[test]
    fn a_full_range_is_refused_with_the_way_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let uids = TenantUids::open(Some(dir.path()), (3_000_000, 3_000_000)).expect("open");
        uids.identity_of("alice").expect("alice");
        let err = uids.identity_of("bob").expect_err("no uid left");
        assert!(err.to_string().contains("wider range"), "{err}");
    }

    #[test]
    fn a_planted_symlink_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "{\"x\": 1}").expect("write");
        std::os::unix::fs::symlink(&target, dir.path().join(FILE)).expect("symlink");
        assert!(TenantUids::open(Some(dir.path()), (3_000_000, 3_000_010)).is_err());
    }
}
