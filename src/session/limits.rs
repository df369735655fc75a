//! Limits: wait windows, the memory/process watch (checkpoints give way
//! first) and the idle reaper (--session-ttl). Stopping a cell and the
//! cell time limit: `stop.rs`.

use std::sync::Arc;
use std::time::Duration;

use super::manager::SessionManager;
use super::settings::wait_window;
use crate::worker::Worker;

impl SessionManager {
    /// The wait window of a call: `requested` seconds (the tool's arguments
    /// checked them finite and not negative) clamped to `--max-wait`, or
    /// `--default-wait`. Total for any input: the clamp comes before the
    /// conversion, which would panic past `u64::MAX` seconds.
    pub fn wait_window(&self, requested: Option<f64>) -> Duration {
        wait_window(requested, self.limits.default_wait, self.limits.max_wait)
    }

    /// Sessions this manager (a tenant's) holds at most.
    pub fn max_sessions(&self) -> usize {
        self.limits.max_sessions
    }

    /// `--default-wait` and `--max-wait` in seconds, for the instructions.
    pub fn wait_bounds(&self) -> (f64, f64) {
        (
            self.limits.default_wait.as_secs_f64(),
            self.limits.max_wait.as_secs_f64(),
        )
    }

    /// Watches every session's process tree: past the memory limit or the
    /// process limit, the tree is killed and the crash report says why.
    pub fn spawn_resource_watch(self: &Arc<Self>) {
        let Some(sandbox) = self.spec.sandbox.clone().filter(|s| s.enabled()) else {
            return;
        };
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(this) = this.upgrade() else {
                    return;
                };
                let workers: Vec<(String, Arc<Worker>)> = this
                    .sessions()
                    .iter()
                    .filter_map(|(name, s)| s.lock().worker.clone().map(|w| (name.clone(), w)))
                    .filter(|(_, w)| w.exit_info().is_none())
                    .collect();
                if workers.is_empty() {
                    continue;
                }
                let sandbox = sandbox.clone();
                let shed = tokio::task::spawn_blocking(move || {
                    let roots: Vec<u32> = workers.iter().map(|(_, w)| w.root_pid()).collect();
                    let snap = crate::sandbox::watch::Snapshot::of_trees(&roots);
                    let mut shed = Vec::new();
                    for (name, w) in workers {
                        let (rss, count) = if w.has_copies() {
                            snap.usage_pss(w.root_pid())
                        } else {
                            snap.usage(w.root_pid())
                        };
                        let reason = if let Some(hit) = w.cgroup_limit_hit() {
                            Some((
                                crate::metrics::Limit::Memory,
                                format!(
                                    "Session '{name}' {hit}, so all of its processes were killed."
                                ),
                            ))
                        } else {
                            crate::sandbox::watch::limit_breach(
                                rss,
                                count,
                                sandbox.memory_limit,
                                sandbox.max_processes,
                            )
                            .map(|(limit, what)| (limit, format!("Session '{name}' {what}.")))
                        };
                        if let Some((limit, reason)) = reason {
                            // The watch sees a dying tree again on the next
                            // tick: counted once, with the first reason.
                            if w.set_kill_reason(reason.clone()) {
                                tracing::warn!("{reason}");
                                crate::metrics::limit_kill(limit);
                            }
                            w.kill();
                        } else if w.has_copies()
                            && sandbox
                                .memory_limit
                                .is_some_and(|limit| rss > limit / 4 * 3)
                        {
                            // Checkpoints give way before the session would
                            // hit its limit.
                            shed.push(name);
                        }
                    }
                    shed
                })
                .await
                .unwrap_or_default();
                for name in shed {
                    this.shed_copy(&name);
                }
            }
        });
    }

    /// Ends sessions that have been idle longer than --session-ttl.
    pub fn spawn_reaper(self: &Arc<Self>) {
        let Some(ttl) = self.limits.session_ttl else {
            return;
        };
        let this = Arc::downgrade(self);
        let every = (ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(this) = this.upgrade() else {
                    return;
                };
                let idle: Vec<String> = this
                    .sessions()
                    .iter()
                    .filter(|(_, s)| {
                        let st = s.lock();
                        st.inbox.running.is_none()
                            && !st.lifecycle.is_rebuilding()
                            && st.last_used.elapsed() > ttl
                    })
                    .map(|(name, _)| name.clone())
                    .collect();
                for name in idle {
                    tracing::info!(session = %name, "ending session idle longer than --session-ttl");
                    // Its state saved, it stays in the store and comes back
                    // when its name is used again; else it is deleted.
                    if !this.end_saved(&name).await {
                        let _ = this.delete(&name);
                    }
                }
            }
        });
    }

    /// Drops the least recently used copy of session `name` (its memory
    /// nears the session's limit).
    pub(super) fn shed_copy(&self, name: &str) {
        let Some(sess) = self.sessions().get(name).cloned() else {
            return;
        };
        let mut st = sess.lock();
        let Some(worker) = st.worker.clone() else {
            return;
        };
        if let Some(cell) = st.checkpoints.shed(&worker) {
            tracing::info!(session = %name, cell, "checkpoint dropped: the session nears its memory limit");
        }
    }
}
