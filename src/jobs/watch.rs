//! The memory and process watch of jobs (it reads /proc, so Linux only):
//! each running job's process tree is measured as sessions' are; past
//! --memory-limit or --max-processes it is killed (again on every tick while
//! anything is left) and its report says why. Where a memory cgroup holds
//! jobs the kernel enforces memory first, but the process count is this
//! watch's (the pids cgroup is only a ceiling on tasks, threads included).

use std::sync::Arc;
use std::time::Duration;

use super::JobManager;
use super::job::Job;
use crate::sandbox::watch::limit_breach;

/// How often running jobs are measured.
const EVERY: Duration = Duration::from_millis(100);

impl JobManager {
    /// Starts the watch; it ends with the manager.
    pub fn spawn_resource_watch(self: &Arc<Self>) {
        let Some(sandbox) = self.settings.sandbox.clone().filter(|s| s.enabled()) else {
            return;
        };
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
                    let roots: Vec<u32> = running.iter().map(|j| j.root_pid()).collect();
                    let snap = crate::sandbox::watch::Snapshot::of_trees(&roots);
                    for job in running {
                        let (mut rss, count) = snap.usage(job.root_pid());
                        if memory.is_some_and(|limit| rss > limit) {
                            // Forked workers share pages that RSS counts
                            // in each of them: PSS counts them once.
                            rss = snap.usage_pss(job.root_pid()).0;
                        }
                        let Some((limit, what)) = limit_breach(rss, count, memory, processes)
                        else {
                            continue;
                        };
                        let reason = format!("The job {what}.");
                        if job.kill_for(reason.clone()) {
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
