//! Limits: wait windows, interrupts and their escalation, the cell time
//! limit, the memory/process watch and the idle reaper.

use nix::sys::signal::Signal;

use super::*;

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
                let workers: Vec<(String, Arc<crate::worker::Worker>)> = this
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
                        st.running.is_none() && st.rebuild.is_none() && st.last_used.elapsed() > ttl
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

    /// SIGINT to the running cell; escalates to a second SIGINT, then a kill.
    /// Returns the cell's final result.
    /// During a rebuild: stops it, and the queued cell does not run.
    pub async fn interrupt(self: &Arc<Self>, name: &str) -> Result<CellReport, SessionError> {
        let sess = self.existing(name)?;
        if let Some(stopped) = self.interrupt_rebuild(&sess).await {
            return stopped;
        }
        let (worker, cell) = {
            let mut st = sess.lock();
            self.refresh(&sess, &mut st);
            let Some(run) = &st.running else {
                if let Some(done) = st.completed.take() {
                    let notes = std::mem::take(&mut st.notes);
                    let done = done.with_notes_first(notes);
                    st.delivered = Some(done.clone());
                    return Ok(
                        done.with_note("The cell had already finished; nothing was interrupted.")
                    );
                }
                return Err(SessionError::Idle(sess.language, sess.name.clone()));
            };
            let cell = run.number;
            match &st.worker {
                Some(w) => (w.clone(), cell),
                None => return Err(SessionError::Idle(sess.language, sess.name.clone())),
            }
        };
        self.stop_cell(&sess, &worker, cell, None).await;
        self.collect(&sess, &worker, Duration::ZERO).await
    }

    /// Stops cell `cell`: SIGINT, again after a grace period, then SIGKILL.
    /// The outcome is left as the session's completed result, annotated.
    pub(super) async fn stop_cell(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        cell: u64,
        reason: Option<String>,
    ) {
        let grace = self.limits.interrupt_grace;
        // Notes go on the running cell before each step, so whichever call
        // collects the result (this one or a concurrent wait) carries them.
        if let Some(reason) = reason {
            self.annotate_running(sess, cell, reason, false);
        }
        for attempt in 0..2 {
            if attempt == 1 {
                self.annotate_running(
                    sess,
                    cell,
                    "The cell ignored the first interrupt; a second one was sent.".to_string(),
                    false,
                );
            }
            worker.signal_group(Signal::SIGINT);
            if self.wait_cell_gone(sess, worker, cell, grace).await {
                return;
            }
        }
        self.annotate_running(
            sess,
            cell,
            format!(
                "The cell did not stop after two interrupts over {:.0} s (it swallows KeyboardInterrupt or is stuck in native code), so its interpreter was killed. All variables of session '{}' are lost; the next call starts a fresh interpreter.",
                grace.as_secs_f64() * 2.0,
                sess.name
            ),
            true,
        );
        worker.signal_group(Signal::SIGKILL);
        let bound = self.limits.crash_grace + Duration::from_secs(5);
        self.wait_cell_gone(sess, worker, cell, bound).await;
    }

    pub(super) fn annotate_running(&self, sess: &Session, cell: u64, note: String, killing: bool) {
        let mut st = sess.lock();
        if let Some(run) = st.running.as_mut().filter(|r| r.number == cell) {
            run.stop_notes.push(note);
            run.killed_by_ferrepl |= killing;
        }
    }

    /// Waits until cell `cell` is no longer running (finished or crashed).
    pub(super) async fn wait_cell_gone(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        cell: u64,
        wait: Duration,
    ) -> bool {
        self.watch(sess, worker, wait, |st, timed_out| {
            let gone = st.running.as_ref().map(|r| r.number) != Some(cell);
            (gone || timed_out).then_some(gone)
        })
        .await
    }

    /// Enforces --max-cell-seconds on one cell.
    pub(super) fn arm_time_limit(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        cell: u64,
    ) {
        let Some(limit) = self.limits.max_cell else {
            return;
        };
        let this = self.clone();
        let sess = sess.clone();
        let worker = worker.clone();
        tokio::spawn(async move {
            if this.wait_cell_gone(&sess, &worker, cell, limit).await {
                return;
            }
            crate::metrics::limit_kill(crate::metrics::Limit::CellTime);
            let reason = format!(
                "Cell {cell} ran past the time limit of {:.0} s (--max-cell-seconds) and was interrupted.",
                limit.as_secs_f64()
            );
            this.stop_cell(&sess, &worker, cell, Some(reason)).await;
        });
    }
}
