//! Per-client default sessions (`--default-session per-client`): each MCP
//! connection's `default-N` (and `r-N`) belongs to it. When the connection
//! ends, its sessions end too, once their last result has been collected,
//! or when the grace period runs out (a running cell keeps running until
//! then). A gone client's session is the first to make room for a new one,
//! also before its grace period ends. A call that names such a session
//! takes it over: it is then an ordinary named session.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::gate::TenantSessions;
use super::manager::SessionManager;

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
                        st.inbox.running.is_none()
                            && st.inbox.completed.is_none()
                            && !st.lifecycle.is_rebuilding()
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

    /// Ends the oldest gone client's session of this tenant (`instance`:
    /// of any tenant) to make room; its name.
    pub(super) fn evict_for_room(&self, instance: bool) -> Option<String> {
        let managers = if instance {
            self.gate.instance.managers()
        } else {
            Vec::new()
        };
        let me: &dyn TenantSessions = self;
        let candidates = managers.iter().map(|m| m.as_ref()).chain([me]);
        let (owner, name) = candidates
            .filter_map(|m| m.oldest_gone().map(|(n, at)| (at, m, n)))
            .min_by_key(|(at, _, _)| *at)
            .map(|(_, m, n)| (m, n))?;
        owner
            .end_gone(&name, "a new session needed its room")
            .then_some(name)
    }
}

/// What the instance's gate asks of this tenant's manager.
impl TenantSessions for SessionManager {
    fn session_count(&self) -> usize {
        self.sessions().len()
    }

    fn top_up_pool(self: Arc<Self>) {
        SessionManager::top_up_pool(&self);
    }

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

    fn oldest_gone(&self) -> Option<(String, Instant)> {
        let map = self.gone.map();
        map.iter()
            .min_by_key(|(_, at)| **at)
            .map(|(name, at)| (name.clone(), *at))
    }
}
