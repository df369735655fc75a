//! The memory and process watch of jobs where no memory cgroup holds them
//! (cgroup v2 hosts, an unprivileged server; it reads /proc, so Linux
//! only): each running job's process tree is measured as sessions' are;
//! past --memory-limit or --max-processes it is killed (again on every
//! tick while anything is left) and its report says why.

use std::sync::Arc;
use std::time::Duration;

use super::JobManager;
use super::job::Job;
use crate::metrics::Limit;

/// How often running jobs are measured.
const EVERY: Duration = Duration::from_millis(100);

impl JobManager {
    /// Starts the watch when jobs have a limit no cgroup enforces; it ends
    /// with the manager.
    pub fn spawn_resource_watch(self: &Arc<Self>) {
        let Some(sandbox) = self.cfg.sandbox.clone().filter(|s| s.enabled()) else {
            return;
        };
        if sandbox.cgroups.as_ref().is_some_and(|c| c.has_memory()) {
            return;
        }
        let (memory, processes) = (sandbox.memory_limit, sandbox.max_processes);
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(this) = this.upgrade() else { return };
                let running: Vec<Arc<Job>> = this
                    .jobs()
                    .values()
                    .filter(|j| j.lock().exit.is_none())
                    .cloned()
                    .collect();
                drop(this);
                if running.is_empty() {
                    continue;
                }
                let _ = tokio::task::spawn_blocking(move || {
                    let snap = crate::sandbox::watch::Snapshot::take();
                    for job in running {
                        let (mut rss, count) = snap.usage(job.root_pid());
                        if memory.is_some_and(|limit| rss > limit) {
                            // Forked workers share pages that RSS counts
                            // in each of them: PSS counts them once.
                            rss = snap.usage_pss(job.root_pid()).0;
                        }
                        if let Some((limit, reason)) = over(rss, count, memory, processes)
                            && job.kill_for(reason.clone())
                        {
                            tracing::warn!("job {}: {reason}", job.id());
                            crate::metrics::limit_kill(limit);
                        }
                    }
                })
                .await;
            }
        });
    }
}

/// Which limit a tree of `count` processes using `rss` bytes went over.
fn over(rss: u64, count: usize, memory: Option<u64>, processes: u64) -> Option<(Limit, String)> {
    if count as u64 > processes {
        return Some((
            Limit::Processes,
            format!(
                "The job went over its limit of {processes} processes (--max-processes; a fork bomb?), so all of them were killed."
            ),
        ));
    }
    let limit = memory.filter(|&limit| rss > limit)?;
    Some((
        Limit::Memory,
        format!(
            "The job went over its memory limit of {} (--memory-limit): its processes used {} MiB, so they were killed.",
            crate::units::human_bytes(limit),
            rss / (1024 * 1024)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::over;

    #[test]
    fn a_tree_over_a_limit_is_named_with_its_flag() {
        assert!(over(10 << 20, 3, Some(100 << 20), 64).is_none());
        let (_, memory) = over(200 << 20, 3, Some(100 << 20), 64).unwrap();
        assert!(
            memory.contains("--memory-limit") && memory.contains("200 MiB"),
            "{memory}"
        );
        let (_, procs) = over(1, 65, None, 64).unwrap();
        assert!(procs.contains("--max-processes"), "{procs}");
        assert!(over(u64::MAX, 1, None, 64).is_none());
    }
}
