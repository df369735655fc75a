//! Ending sessions: one (python_sessions delete, a gone client's, the idle
//! reaper's), every interpreter of a tenant whose token was revoked, and
//! all of them at shutdown (their states saved first).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::error::SessionError;
use super::is_default_name;
use super::lifecycle::ended_note;
use super::manager::SessionManager;
use super::state::Session;
use crate::worker::Worker;

impl SessionManager {
    /// Kills the interpreter of every session (its cells end crashed, with
    /// `reason` among their notes) and the warm pool's; the sessions stay.
    /// Returns how many sessions' interpreters were killed.
    pub fn end_all(&self, reason: &str) -> usize {
        for spare in self.pool.drain() {
            spare.kill();
        }
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        let mut ended = 0;
        for sess in sessions {
            let Some(worker) = sess.lock().worker.clone() else {
                continue;
            };
            if worker.exit_info().is_none() {
                worker.set_kill_reason(format!(
                    "{reason}, so ferrepl ended session '{}'.",
                    sess.name
                ));
                worker.kill();
                ended += 1;
            }
        }
        ended
    }

    /// Ends every worker (whole process groups) and refuses new work.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        // Before the interpreters end: they hold what is saved.
        self.save_all().await;
        let mut workers: Vec<Arc<Worker>> = self
            .sessions()
            .values()
            .filter_map(|s| s.lock().worker.clone())
            .collect();
        workers.extend(self.pool.drain());
        for w in &workers {
            w.kill();
        }
        if let Some(store) = &self.durable.store {
            // Blocking, bounded: the process is about to exit.
            if !store.flush(Duration::from_secs(2)) {
                tracing::warn!("the session store did not finish writing within 2 s");
            }
        }
        for w in &workers {
            let mut rx = w.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while w.exit_info().is_none() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
        }
    }

    /// Ends a session: its interpreter and everything it started.
    pub fn delete(&self, name: &str) -> Result<String, SessionError> {
        let sess = self.existing(name)?;
        self.sessions().remove(name);
        self.forget_stored(name);
        self.forget_state(name);
        let mut st = sess.lock();
        let rebuild = st.lifecycle.take_rebuild().map(|rb| ended_note(&rb));
        let running = st
            .inbox
            .running
            .take()
            .filter(|r| !r.replay)
            .map(|r| r.number);
        if let Some(w) = st.worker.take() {
            if w.kernel_connection().is_some() {
                crate::attach::withdraw(&self.spec.log_dir, name);
            }
            w.kill();
        }
        st.kept.clear_logs();
        drop(st);
        sess.touch();
        let mut msg = format!("Session '{name}' was deleted; its interpreter and processes ended.");
        if let Some(cell) = running {
            msg.push_str(&format!(" Cell {cell}, which was running, was stopped."));
        }
        msg.extend(rebuild);
        if is_default_name(name) {
            msg.push_str(" The next call without a session name starts a fresh default session.");
        }
        Ok(msg)
    }
}
