//! What lets new work in: the instance's draining flag and its session
//! budget over all tenants, and a tenant's workspace quota. Shared by the
//! session managers and job managers of every tenant.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::files::Workspace;
use crate::units::human_bytes;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Refusal {
    #[error(
        "the operator revoked this tenant's token: ferrepl starts no new sessions, cells or jobs for it; ask the operator for a valid token"
    )]
    Revoked,
    #[error(
        "this ferrepl instance is draining for a restart and takes no new sessions, cells or jobs; retry in a few seconds (sessions resume from the store on the restarted instance)"
    )]
    Draining,
    #[error(
        "cannot create session '{name}': this instance holds {limit} sessions, its limit over all tenants (--max-sessions); delete or reset a session, or retry later"
    )]
    InstanceFull { name: String, limit: usize },
    #[error(
        "this instance runs {limit} jobs over all tenants, its limit (--max-jobs); wait for one with shell_wait, stop one with shell_wait {{job, signal: \"TERM\"}}, or retry later"
    )]
    InstanceJobsFull { limit: usize },
    #[error(
        "this tenant runs {limit} jobs, its share of the instance (--tenant-max-jobs); wait for one with shell_wait, stop one with shell_wait {{job, signal: \"TERM\"}}, or retry later"
    )]
    TenantJobsFull { limit: usize },
    #[error(
        "the workspace and the sessions' temporary directories (HOME, TMPDIR) use {used} of their {limit} quota (--tenant-disk): new cells and jobs are refused until files are deleted (rm through shell_exec or python)",
        used = human_bytes(*.used),
        limit = human_bytes(*.limit)
    )]
    DiskFull { used: u64, limit: u64 },
    #[error(
        "the workspace and the sessions' temporary directories (HOME, TMPDIR) could not be measured against their {limit} quota (--tenant-disk): they hold more than {max_entries} entries, a directory of more than {max_names} or nesting deeper than {max_depth}, or a directory ferrepl cannot read (chmod 000?); new cells and jobs are refused until that is fixed (rm or chmod through shell_exec or python)",
        limit = human_bytes(*.limit),
        max_names = crate::files::MAX_DIR_NAMES,
        max_depth = crate::files::MAX_WALK_DEPTH
    )]
    DiskUncounted { max_entries: usize, limit: u64 },
}

impl Refusal {
    /// Counted as it is made.
    fn counted(self) -> Self {
        crate::metrics::admission_refusal(match self {
            Refusal::Revoked => "revoked",
            Refusal::Draining => "draining",
            Refusal::InstanceFull { .. } => "instance_full",
            Refusal::InstanceJobsFull { .. } => "jobs_full",
            Refusal::TenantJobsFull { .. } => "tenant_jobs_full",
            Refusal::DiskFull { .. } | Refusal::DiskUncounted { .. } => "disk_full",
        });
        self
    }
}

/// What the instance asks of each tenant's session manager (the manager
/// implements it in `clients.rs`): the gate counts and wakes tenants
/// without depending on what a manager is.
pub trait TenantSessions: Send + Sync {
    /// Sessions of this tenant, dormant ones included.
    fn session_count(&self) -> usize;
    /// Refills this tenant's warm pool if it is short.
    fn top_up_pool(self: Arc<Self>);
    /// The session of a gone client that went first, if any, and when.
    fn oldest_gone(&self) -> Option<(String, Instant)>;
    /// Ends a gone client's session (if it still is one); whether it did.
    fn end_gone(&self, name: &str, why: &str) -> bool;
}

/// The instance: shared by every tenant.
pub struct Gate {
    draining: AtomicBool,
    /// Tool calls being served: a drain ends only once their answers are
    /// made (a finished cell's result may still be on its way back).
    calls: Arc<AtomicUsize>,
    max_sessions: usize,
    /// Jobs running over all tenants, at most `max_jobs`: each may use
    /// --memory-limit, so they count toward the instance's ceiling.
    jobs: Arc<AtomicUsize>,
    max_jobs: usize,
    managers: Mutex<Vec<Weak<dyn TenantSessions>>>,
    /// Interpreters in the warm pools over all tenants, at most
    /// `max_pooled` (--warm-pool): idle memory no tenant count can multiply.
    pooled: Arc<AtomicUsize>,
    max_pooled: usize,
    /// Held while a session is counted and added, so that tenants creating
    /// sessions at once cannot overshoot the instance's limit together.
    creating: Mutex<()>,
}

impl Gate {
    pub fn new(max_sessions: usize, max_jobs: usize, max_pooled: usize) -> Arc<Self> {
        Arc::new(Self {
            pooled: Arc::new(AtomicUsize::new(0)),
            max_pooled,
            draining: AtomicBool::new(false),
            calls: Arc::new(AtomicUsize::new(0)),
            max_sessions: max_sessions.max(1),
            jobs: Arc::new(AtomicUsize::new(0)),
            max_jobs: max_jobs.max(1),
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
    pub fn call_started(&self) -> Slot {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Slot(self.calls.clone(), None)
    }

    /// Tool calls being served now.
    pub fn calls_in_flight(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// A slot for one more running job, held until it exits.
    pub fn job_slot(&self) -> Result<Slot, Refusal> {
        if !take_one(&self.jobs, self.max_jobs) {
            return Err(Refusal::InstanceJobsFull {
                limit: self.max_jobs,
            }
            .counted());
        }
        Ok(Slot(self.jobs.clone(), None))
    }

    /// A place in the instance's warm pool for one more interpreter, held
    /// while it waits there; None when the pools hold --warm-pool already.
    pub(super) fn pool_slot(&self) -> Option<Slot> {
        take_one(&self.pooled, self.max_pooled).then(|| Slot(self.pooled.clone(), None))
    }

    /// A pooled interpreter left its pool (taken, died): every tenant whose
    /// pool is short may take the place, not only the one that used it.
    pub(super) fn pool_place_freed(&self) {
        for manager in self.managers() {
            manager.top_up_pool();
        }
    }

    /// Counts `manager` in from now on; `load` first adds its stored
    /// sessions, given how many the instance has room for (counted under the
    /// same lock as new sessions, so tenants starting at once cannot
    /// overshoot --max-sessions with what they bring back).
    pub(super) fn register<M: TenantSessions + 'static>(
        &self,
        manager: &Arc<M>,
        load: impl FnOnce(usize),
    ) {
        let _creating = self.creating.lock().unwrap_or_else(|e| e.into_inner());
        load(self.max_sessions.saturating_sub(self.live_sessions()));
        let mut list = self.managers.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|m| m.strong_count() > 0);
        let manager: Arc<dyn TenantSessions> = manager.clone();
        let manager = Arc::downgrade(&manager);
        list.push(manager);
    }

    /// Sessions of every tenant, dormant ones included.
    fn live_sessions(&self) -> usize {
        self.managers().iter().map(|m| m.session_count()).sum()
    }

    /// Every live manager (one per tenant).
    pub fn managers(&self) -> Vec<Arc<dyn TenantSessions>> {
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
        if self.live_sessions() >= self.max_sessions {
            return Err(Refusal::InstanceFull {
                name: name.to_string(),
                limit: self.max_sessions,
            }
            .counted());
        }
        Ok(add())
    }
}

/// Adds one to `count` unless it has reached `max`; whether it did.
fn take_one(count: &AtomicUsize, max: usize) -> bool {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

/// One unit of a count (a call in flight, a running job: the instance's,
/// and the tenant's), given back when dropped.
pub struct Slot(Arc<AtomicUsize>, Option<Arc<AtomicUsize>>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        if let Some(tenant) = &self.1 {
            tenant.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Admission for one tenant: the instance's gate, its workspace quota, and
/// whether its tokens are gone from the token file.
pub struct TenantGate {
    pub instance: Arc<Gate>,
    quota: Option<WorkspaceQuota>,
    revoked: AtomicBool,
    /// Its running jobs, at most its share (--tenant-max-jobs): one tenant
    /// cannot take every job slot of the instance.
    jobs: Arc<AtomicUsize>,
    max_jobs: usize,
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
    /// `max_jobs`: the tenant's share of the instance's jobs.
    pub fn new(instance: Arc<Gate>, quota: Option<WorkspaceQuota>, max_jobs: usize) -> Arc<Self> {
        Arc::new(Self {
            instance,
            quota,
            revoked: AtomicBool::new(false),
            jobs: Arc::new(AtomicUsize::new(0)),
            max_jobs: max_jobs.max(1),
        })
    }

    /// A slot for one more running job: the tenant's share first, then the
    /// instance's budget; held until the job exits.
    pub fn job_slot(&self) -> Result<Slot, Refusal> {
        if !take_one(&self.jobs, self.max_jobs) {
            return Err(Refusal::TenantJobsFull {
                limit: self.max_jobs,
            }
            .counted());
        }
        match self.instance.job_slot() {
            Ok(mut slot) => {
                slot.1 = Some(self.jobs.clone());
                Ok(slot)
            }
            Err(e) => {
                self.jobs.fetch_sub(1, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// Sets whether the tenant's tokens are revoked. Set before its work is
    /// ended, and checked again by whatever registers new work, so a
    /// request already past the token check cannot slip work in between.
    /// Returns whether it was revoked before.
    pub fn set_revoked(&self, revoked: bool) -> bool {
        self.revoked.swap(revoked, Ordering::SeqCst)
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::SeqCst)
    }

    /// Refused when the tenant's tokens were revoked.
    pub fn check_revoked(&self) -> Result<(), Refusal> {
        if self.is_revoked() {
            return Err(Refusal::Revoked.counted());
        }
        Ok(())
    }

    /// Whether a new cell or job may start now.
    pub fn admit_work(&self) -> Result<(), Refusal> {
        self.check_revoked()?;
        if self.instance.is_draining() {
            return Err(Refusal::Draining.counted());
        }
        if let Some(q) = &self.quota {
            q.check().map_err(Refusal::counted)?;
        }
        Ok(())
    }
}

/// A soft quota on a workspace's size: measured in the background every few
/// seconds (the kernel has no per-directory quota without filesystem
/// support), so a burst can overshoot until the next measurement.
pub struct WorkspaceQuota {
    limit: u64,
    /// The last measurement; `UNCOUNTED` when the walk could not finish
    /// (refused: what it could not see could hide any amount of data).
    used: Arc<AtomicU64>,
}

/// How often the workspace is measured (then it waits for its turn: one
/// walk at a time over the instance).
const MEASURE_EVERY: Duration = Duration::from_secs(5);
/// Entries visited per measurement at most: a huge tree costs bounded work.
const MAX_ENTRIES: usize = 2_000_000;
const UNCOUNTED: u64 = u64::MAX;

/// One measurement at a time over the instance: a walk holds a descriptor
/// per directory level and its names, so tenants' walks do not add up.
static MEASURING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

impl WorkspaceQuota {
    /// Starts measuring `areas` (a tenant's workspace and its temporary
    /// directories) until the returned quota is dropped.
    pub fn watch(areas: Vec<Workspace>, limit: u64) -> Self {
        let used = Arc::new(AtomicU64::new(0));
        let weak = Arc::downgrade(&used);
        tokio::spawn(async move {
            loop {
                if weak.strong_count() == 0 {
                    return;
                }
                let areas = areas.clone();
                let Ok(turn) = MEASURING.acquire().await else {
                    return;
                };
                let measured = tokio::task::spawn_blocking(move || {
                    let sizes = areas.iter().map(|a| a.disk_usage(MAX_ENTRIES));
                    sizes.sum::<Option<u64>>().unwrap_or(UNCOUNTED)
                })
                .await
                .unwrap_or(UNCOUNTED);
                drop(turn);
                let Some(used) = weak.upgrade() else { return };
                used.store(measured, Ordering::Relaxed);
                drop(used);
                tokio::time::sleep(MEASURE_EVERY).await;
            }
        });
        Self { limit, used }
    }

    fn check(&self) -> Result<(), Refusal> {
        let limit = self.limit;
        match self.used.load(Ordering::Relaxed) {
            UNCOUNTED => Err(Refusal::DiskUncounted {
                max_entries: MAX_ENTRIES,
                limit,
            }),
            used if used > limit => Err(Refusal::DiskFull { used, limit }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_usage_counts_nested_files_follows_no_symlink_and_stops_at_the_bound() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![1u8; 1_000_000]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a"), vec![1u8; 100_000]).unwrap();
        std::fs::write(dir.path().join("b"), vec![1u8; 50_000]).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        let all = ws.disk_usage(100).unwrap();
        assert!((150_000..1_000_000).contains(&all), "{all}");
        assert_eq!(
            ws.disk_usage(2),
            None,
            "a walk cut short is not a measurement"
        );
    }

    #[tokio::test]
    async fn quota_refuses_work_once_workspace_and_temporary_area_together_are_over_it() {
        // Each under the quota, together over it.
        let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
        for dir in &dirs {
            std::fs::write(dir.path().join("big"), vec![1u8; 48 * 1024]).unwrap();
        }
        let areas = dirs.iter().map(|d| Workspace::new(d.path()).unwrap());
        let areas: Vec<Workspace> = areas.collect();
        let quota = WorkspaceQuota::watch(areas, 64 * 1024);
        let gate = TenantGate::new(Gate::new(4, 4, 1), Some(quota), 4);
        let e = first_refusal(&gate).await;
        assert!(matches!(e, Refusal::DiskFull { .. }), "{e}");
        assert!(e.to_string().contains("--tenant-disk"), "{e}");
        gate.instance.start_draining();
        assert!(matches!(gate.admit_work(), Err(Refusal::Draining)));
    }

    #[test]
    fn a_tenant_takes_at_most_its_share_of_the_jobs() {
        let instance = Gate::new(4, 3, 1);
        let alice = TenantGate::new(instance.clone(), None, 2);
        let bob = TenantGate::new(instance, None, 2);
        let a1 = alice.job_slot().expect("alice 1");
        let _a2 = alice.job_slot().expect("alice 2");
        let e = alice.job_slot().err().expect("alice is at her share");
        assert!(e.to_string().contains("--tenant-max-jobs"), "{e}");
        let _b1 = bob.job_slot().expect("bob still gets one");
        let e = bob.job_slot().err().expect("the instance is full");
        assert!(matches!(e, Refusal::InstanceJobsFull { .. }), "{e}");
        drop(a1);
        bob.job_slot().expect("a slot given back serves bob");
    }

    #[test]
    fn the_warm_pools_hold_at_most_the_instance_places() {
        let instance = Gate::new(4, 4, 2);
        let first = instance.pool_slot().expect("place 1");
        let _second = instance.pool_slot().expect("place 2");
        assert!(instance.pool_slot().is_none(), "a third place");
        drop(first);
        assert!(
            instance.pool_slot().is_some(),
            "a freed place is taken again"
        );
    }

    #[test]
    fn a_revoked_tenant_is_refused_until_reinstated() {
        let gate = TenantGate::new(Gate::new(4, 4, 1), None, 4);
        assert!(gate.admit_work().is_ok());
        gate.set_revoked(true);
        let e = gate.admit_work().expect_err("revoked");
        assert!(matches!(e, Refusal::Revoked), "{e}");
        assert!(e.to_string().contains("revoked"), "{e}");
        // Revocation is checked before draining: it is the lasting reason.
        gate.instance.start_draining();
        assert!(matches!(gate.admit_work(), Err(Refusal::Revoked)));
        gate.set_revoked(false);
        assert!(matches!(gate.admit_work(), Err(Refusal::Draining)));
    }

    #[tokio::test]
    async fn a_workspace_too_big_to_measure_is_refused() {
        let quota = WorkspaceQuota {
            limit: 1 << 40,
            used: Arc::new(AtomicU64::new(UNCOUNTED)),
        };
        let gate = TenantGate::new(Gate::new(4, 4, 1), Some(quota), 4);
        let e = first_refusal(&gate).await;
        assert!(matches!(e, Refusal::DiskUncounted { .. }), "{e}");
        assert!(e.to_string().contains("could not be measured"), "{e}");
    }

    /// The first refusal of new work, waiting for the background measurement.
    async fn first_refusal(gate: &TenantGate) -> Refusal {
        for _ in 0..500 {
            if let Err(e) = gate.admit_work() {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the quota never refused work");
    }
}
