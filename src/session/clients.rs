//! Per-client default sessions (`--default-session per-client`): each MCP
//! connection's `default-N` (and `r-N`) belongs to it. When the connection
//! ends, its sessions end too, once their last result has been collected,
//! or when the grace period runs out (a running cell keeps running until
//! then). A gone client's session is the first to make room for a new one,
//! also before its grace period ends. A call that names such a session
//! takes it over: it is then an ordinary named session.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::SessionManager;

/// Sessions whose client is gone, by name, with when it went.
#[derive(Default)]
pub(super) struct GoneClients(std::sync::Mutex<BTreeMap<String, Instant>>);

impl GoneClients {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Held by a connection's server: dropped when rmcp drops the connection
/// (closed, deleted or idle past --http-session-idle), it lets the
/// connection's sessions go.
pub struct ClientSessions {
    manager: Weak<SessionManager>,
    names: Vec<String>,
    grace: Duration,
}

impl ClientSessions {
    pub fn new(manager: &Arc<SessionManager>, names: Vec<String>, grace: Duration) -> Self {
        Self {
            manager: Arc::downgrade(manager),
            names,
            grace,
        }
    }
}

impl Drop for ClientSessions {
    fn drop(&mut self) {
        let Some(manager) = self.manager.upgrade() else {
            return;
        };
        // Dropped inside the runtime (rmcp's connection task); without one
        // (a test, a shutdown) the idle reaper ends them instead.
        if tokio::runtime::Handle::try_current().is_ok() {
            manager.client_gone(std::mem::take(&mut self.names), self.grace);
        }
    }
}

impl SessionManager {
    /// The client of `names` is gone: each of them that exists ends once it
    /// has no running cell and no result to collect, or after `grace`.
    pub(super) fn client_gone(self: &Arc<Self>, names: Vec<String>, grace: Duration) {
        let now = Instant::now();
        for name in names {
            let Some(sess) = self.sessions().get(&name).cloned() else {
                continue;
            };
            self.gone.map().insert(name.clone(), now);
            let this = Arc::downgrade(self);
            let deadline = tokio::time::Instant::now() + grace;
            let mut changed = sess.changed.subscribe();
            tokio::spawn(async move {
                loop {
                    let Some(manager) = this.upgrade() else {
                        return;
                    };
                    if manager.gone.map().get(&name) != Some(&now) {
                        return; // taken over, ended, or gone again
                    }
                    let settled = {
                        let st = sess.lock();
                        st.running.is_none() && st.completed.is_none() && st.rebuild.is_none()
                    };
                    let late = tokio::time::Instant::now() >= deadline;
                    if settled || late {
                        manager.end_gone(
                            &name,
                            if late {
                                "its grace period ran out"
                            } else {
                                "its last result was collected"
                            },
                        );
                        return;
                    }
                    drop(manager);
                    tokio::select! {
                        _ = changed.changed() => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
            });
        }
    }

    /// A call named `name`: if its client is gone, the caller takes it over.
    pub fn claim(&self, name: &str) {
        self.gone.map().remove(name);
    }

    /// Ends a gone client's session (if it still is one).
    fn end_gone(&self, name: &str, why: &str) -> bool {
        if self.gone.map().remove(name).is_none() {
            return false;
        }
        match self.delete(name) {
            Ok(_) => {
                tracing::info!("session '{name}' ended: its client disconnected and {why}");
                true
            }
            Err(_) => false,
        }
    }

    /// The session of a gone client that went first, if any, and when.
    fn oldest_gone(&self) -> Option<(String, Instant)> {
        let map = self.gone.map();
        map.iter()
            .min_by_key(|(_, at)| **at)
            .map(|(name, at)| (name.clone(), *at))
    }

    /// Ends the oldest gone client's session of this tenant (`instance`:
    /// of any tenant) to make room; its name.
    pub(super) fn evict_for_room(&self, instance: bool) -> Option<String> {
        let managers = if instance {
            self.gate.instance.managers()
        } else {
            Vec::new()
        };
        let candidates = managers.iter().map(|m| m.as_ref()).chain([self]);
        let (owner, name) = candidates
            .filter_map(|m| m.oldest_gone().map(|(n, at)| (at, m, n)))
            .min_by_key(|(at, _, _)| *at)
            .map(|(_, m, n)| (m, n))?;
        owner
            .end_gone(&name, "a new session needed its room")
            .then_some(name)
    }
}
