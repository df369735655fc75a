//! What lets new work in: the instance's draining flag and its session
//! budget over all tenants, and a tenant's workspace quota. Shared by the
//! session managers and job managers of every tenant.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::SessionManager;
use crate::units::human_bytes;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Refusal {
    #[error(
        "this ferrepl instance is draining for a restart and takes no new sessions, cells or jobs; retry in a few seconds (sessions resume from the store on the restarted instance)"
    )]
    Draining,
    #[error(
        "cannot create session '{name}': this instance holds {limit} sessions, its limit over all tenants (--max-sessions); delete or reset a session, or retry later"
    )]
    InstanceFull { name: String, limit: usize },
    #[error(
        "the workspace uses {used} of its {limit} quota (--tenant-disk): new cells and jobs are refused until files are deleted (rm through shell_exec or python)",
        used = human_bytes(*.used),
        limit = human_bytes(*.limit)
    )]
    DiskFull { used: u64, limit: u64 },
}

impl Refusal {
    /// Counted as it is made.
    fn counted(self) -> Self {
        crate::metrics::admission_refusal(match self {
            Refusal::Draining => "draining",
            Refusal::InstanceFull { .. } => "instance_full",
            Refusal::DiskFull { .. } => "disk_full",
        });
        self
    }
}

/// The instance: shared by every tenant.
pub struct Gate {
    draining: AtomicBool,
    /// Tool calls being served: a drain ends only once their answers are
    /// made (a finished cell's result may still be on its way back).
    calls: Arc<AtomicUsize>,
    max_sessions: usize,
    managers: Mutex<Vec<Weak<SessionManager>>>,
    /// Held while a session is counted and added, so that tenants creating
    /// sessions at once cannot overshoot the instance's limit together.
    creating: Mutex<()>,
}

impl Gate {
    pub fn new(max_sessions: usize) -> Arc<Self> {
        Arc::new(Self {
            draining: AtomicBool::new(false),
            calls: Arc::new(AtomicUsize::new(0)),
            max_sessions: max_sessions.max(1),
            managers: Mutex::new(Vec::new()),
            creating: Mutex::new(()),
        })
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Counts a tool call until the guard is dropped.
    pub fn call_started(&self) -> CallGuard {
        self.calls.fetch_add(1, Ordering::SeqCst);
        CallGuard(self.calls.clone())
    }

    /// Tool calls being served now.
    pub fn calls_in_flight(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub(super) fn register(&self, manager: &Arc<SessionManager>) {
        let mut list = self.managers.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|m| m.strong_count() > 0);
        list.push(Arc::downgrade(manager));
    }

    /// Every live manager (one per tenant).
    pub fn managers(&self) -> Vec<Arc<SessionManager>> {
        let list = self.managers.lock().unwrap_or_else(|e| e.into_inner());
        list.iter().filter_map(Weak::upgrade).collect()
    }

    /// Runs `add` (which inserts the session) if the instance has room,
    /// counted over every tenant. Callers must not hold a manager's session
    /// lock: this takes each in turn.
    pub(super) fn admit_session<T>(
        &self,
        name: &str,
        add: impl FnOnce() -> T,
    ) -> Result<T, Refusal> {
        if self.is_draining() {
            return Err(Refusal::Draining.counted());
        }
        let _creating = self.creating.lock().unwrap_or_else(|e| e.into_inner());
        let live: usize = self.managers().iter().map(|m| m.session_count()).sum();
        if live >= self.max_sessions {
            return Err(Refusal::InstanceFull {
                name: name.to_string(),
                limit: self.max_sessions,
            }
            .counted());
        }
        Ok(add())
    }
}

/// A tool call in flight (see [`Gate::call_started`]).
pub struct CallGuard(Arc<AtomicUsize>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Admission for one tenant: the instance's gate and its workspace quota.
pub struct TenantGate {
    pub instance: Arc<Gate>,
    quota: Option<WorkspaceQuota>,
}

impl std::fmt::Debug for TenantGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantGate")
            .field("draining", &self.instance.is_draining())
            .field("quota", &self.quota.as_ref().map(|q| q.limit))
            .finish()
    }
}

impl TenantGate {
    pub fn new(instance: Arc<Gate>, quota: Option<WorkspaceQuota>) -> Arc<Self> {
        Arc::new(Self { instance, quota })
    }

    /// Whether a new cell or job may start now.
    pub fn admit_work(&self) -> Result<(), Refusal> {
        if self.instance.is_draining() {
            return Err(Refusal::Draining.counted());
        }
        if let Some(q) = &self.quota {
            q.check().map_err(Refusal::counted)?;
        }
        Ok(())
    }
}

/// A soft quota on a directory's size: measured in the background every few
/// seconds (the kernel has no per-directory quota without filesystem
/// support), so a burst can overshoot until the next measurement.
pub struct WorkspaceQuota {
    limit: u64,
    used: Arc<AtomicU64>,
}

/// How often the workspace is measured.
const MEASURE_EVERY: Duration = Duration::from_secs(5);
/// Entries visited per measurement at most: a huge tree costs bounded work
/// (and is counted as at least what was seen).
const MAX_ENTRIES: usize = 2_000_000;

impl WorkspaceQuota {
    /// Starts measuring `dir` until the returned quota is dropped.
    pub fn watch(dir: PathBuf, limit: u64) -> Self {
        let used = Arc::new(AtomicU64::new(0));
        let weak = Arc::downgrade(&used);
        tokio::spawn(async move {
            loop {
                let dir = dir.clone();
                let measured = tokio::task::spawn_blocking(move || size_of_tree(&dir, MAX_ENTRIES))
                    .await
                    .unwrap_or(0);
                let Some(used) = weak.upgrade() else { return };
                used.store(measured, Ordering::Relaxed);
                drop(used);
                tokio::time::sleep(MEASURE_EVERY).await;
            }
        });
        Self { limit, used }
    }

    fn check(&self) -> Result<(), Refusal> {
        let used = self.used.load(Ordering::Relaxed);
        if used > self.limit {
            return Err(Refusal::DiskFull {
                used,
                limit: self.limit,
            });
        }
        Ok(())
    }
}

/// Bytes allocated to the files under `dir` (symbolic links not followed,
/// other filesystems included: the workspace may mount them).
pub fn size_of_tree(dir: &std::path::Path, max_entries: usize) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            seen += 1;
            if seen > max_entries {
                return total;
            }
            let Ok(meta) = entry.metadata() else { continue };
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_size_counts_nested_files_and_stops_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a"), vec![1u8; 100_000]).unwrap();
        std::fs::write(dir.path().join("b"), vec![1u8; 50_000]).unwrap();
        let all = size_of_tree(dir.path(), 100);
        assert!(all >= 150_000, "{all}");
        assert!(size_of_tree(dir.path(), 1) < all);
    }

    #[tokio::test]
    async fn quota_refuses_work_once_the_workspace_is_over_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big"), vec![1u8; 64 * 1024]).unwrap();
        let quota = WorkspaceQuota::watch(dir.path().to_path_buf(), 1024);
        let gate = TenantGate::new(Gate::new(4), Some(quota));
        let mut refused = None;
        for _ in 0..200 {
            if let Err(e) = gate.admit_work() {
                refused = Some(e);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let e = refused.expect("the quota must refuse work");
        assert!(e.to_string().contains("--tenant-disk"), "{e}");
        gate.instance.start_draining();
        assert!(matches!(gate.admit_work(), Err(Refusal::Draining)));
    }
}
