//! Connection limits: how many connections the proxy serves at once, how
//! many of them one principal (a tenant, by the listener it came in on)
//! and one client (a relay, by its pid) may hold, and the answer past them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::handle;
use super::refusal::Refusal;
use crate::egress::EgressConfig;

/// Who a connection came from.
pub(super) struct Client<'a> {
    /// How the log names it.
    pub(super) peer: String,
    /// The tenant whose listener it came in on (None: no share of its own).
    pub(super) principal: Option<&'a str>,
    /// Which client of that listener (a relay's pid, a TCP peer's address).
    pub(super) key: String,
}

/// `active` bounds the connections served, `shares` those of one
/// principal (`max_per_principal`) and of one client (`max_per_client`);
/// `rejecting` bounds the short-lived tasks that answer 503 beyond that
/// (past both, a connection is simply closed).
pub(super) struct Gate {
    active: Arc<Semaphore>,
    rejecting: Arc<Semaphore>,
    shares: Arc<Shares>,
}

/// Connections each principal and each client holds; an entry lives while
/// it holds one, so there are never more entries than connections served.
#[derive(Default)]
struct Shares(Mutex<HashMap<String, usize>>);

/// One connection of a share, given back on drop.
struct Share {
    shares: Arc<Shares>,
    key: String,
}

impl Shares {
    fn take(self: &Arc<Self>, key: String, limit: Option<usize>) -> Option<Share> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.get(&key).copied().unwrap_or(0);
        if limit.is_some_and(|limit| n >= limit) {
            return None;
        }
        held.insert(key.clone(), n + 1);
        Some(Share {
            shares: self.clone(),
            key,
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.shares.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

impl Gate {
    pub(super) fn new(rules: &EgressConfig) -> Self {
        let n = rules.max_connections.min(Semaphore::MAX_PERMITS);
        Gate {
            active: Arc::new(Semaphore::new(n)),
            rejecting: Arc::new(Semaphore::new(n.clamp(1, 1024))),
            shares: Arc::default(),
        }
    }

    /// Serves `stream` if every limit has room, else answers 503 saying
    /// which limit it met.
    pub(super) fn dispatch<S>(
        &self,
        stream: S,
        client: Client<'_>,
        rules: &Arc<EgressConfig>,
        shutdown: &CancellationToken,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let shutdown = shutdown.clone();
        let principal = client.principal.unwrap_or("");
        // Keys of the two kinds never collide: a principal's ends in '/'.
        let tenant = match client.principal {
            Some(p) => self
                .shares
                .take(format!("{p}/"), rules.max_per_principal)
                .map(Some),
            None => Some(None),
        };
        let own = tenant.as_ref().and_then(|_| {
            self.shares
                .take(format!("{principal}/{}", client.key), rules.max_per_client)
        });
        let permit = own
            .as_ref()
            .and_then(|_| self.active.clone().try_acquire_owned().ok());
        let peer = client.peer;
        let (tenant, own, permit) = match (tenant, own, permit) {
            (Some(tenant), Some(own), Some(permit)) => (tenant, own, permit),
            (tenant, own, _) => {
                let message = match (tenant, own) {
                    (None, _) => format!(
                        "ferrepl: this tenant's sessions and jobs already hold {} egress connections at once; close some, or try again later",
                        rules.max_per_principal.unwrap_or_default()
                    ),
                    (Some(_), None) => format!(
                        "ferrepl: this session or job already holds {} egress connections at once; close some, or try again later",
                        rules.max_per_client.unwrap_or_default()
                    ),
                    (Some(_), Some(_)) => format!(
                        "ferrepl: too many egress connections at once ({}); try again later",
                        rules.max_connections
                    ),
                };
                self.refuse(stream, Refusal::new(503, message), &peer, rules, shutdown);
                return;
            }
        };
        let rules = rules.clone();
        tokio::spawn(async move {
            let _held = (permit, tenant, own);
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = handle(stream, &rules, &peer) => {}
            }
        });
    }

    fn refuse<S>(
        &self,
        stream: S,
        refusal: Refusal,
        peer: &str,
        rules: &EgressConfig,
        shutdown: CancellationToken,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        refusal.log(rules.audience(), None, peer);
        match self.rejecting.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(async move {
                    let _permit = permit;
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = refusal.send(stream) => {}
                    }
                });
            }
            Err(_) => drop(stream),
        }
    }
}

#[cfg(test)]
mod tests;
