//! Each principal's share of the front door. Before authentication the
//! principal is the client's address (a trusted proxy's forwarded one);
//! after it, the tenant (without tokens, the address stays the principal).
//! Shares: the connections it holds (a connection belongs to the principal
//! of its latest request: behind a proxy one connection carries many
//! clients' requests in turn), the event streams it has open, and the
//! request body bytes it has buffered, with an instance-wide total for the
//! latter. A principal at its share is refused (429, or 503 for the
//! instance's total, with Retry-After); the others keep theirs.
//!
//! The connections of a tenant, with the token each was last used with, are
//! listed, so that a SIGHUP that removes a tenant or replaces its token
//! ends what they carry at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

use super::listener::Connection;
use crate::config::settings::HttpLimits;
use crate::config::tokens::TokenTable;
use crate::tenants::Tenant;

/// Who a request is charged to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    Peer(IpAddr),
    Tenant(Tenant),
}

impl Principal {
    /// The kind, as metrics label it.
    pub fn kind(&self) -> &'static str {
        match self {
            Principal::Peer(_) => "peer",
            Principal::Tenant(_) => "tenant",
        }
    }
}

/// Which share refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    Connections,
    Streams,
    Buffered,
    /// The instance's total of buffered bytes.
    BufferedTotal,
}

impl Share {
    pub fn as_str(self) -> &'static str {
        match self {
            Share::Connections => "connections",
            Share::Streams => "streams",
            Share::Buffered => "buffered_bytes",
            Share::BufferedTotal => "buffered_bytes_total",
        }
    }

    /// Seconds a refused client should wait.
    pub fn retry_after(self) -> u64 {
        match self {
            Share::Buffered | Share::BufferedTotal => 1,
            Share::Connections | Share::Streams => 5,
        }
    }
}

#[derive(Default)]
struct Ledger {
    connections: HashMap<Principal, usize>,
    streams: HashMap<Principal, usize>,
    buffered: HashMap<Principal, usize>,
    buffered_total: usize,
}

fn add(map: &mut HashMap<Principal, usize>, p: &Principal, n: usize) {
    *map.entry(p.clone()).or_insert(0) += n;
}

fn sub(map: &mut HashMap<Principal, usize>, p: &Principal, n: usize) {
    if let Some(v) = map.get_mut(p) {
        *v = v.saturating_sub(n);
        if *v == 0 {
            map.remove(p);
        }
    }
}

/// A connection's tenant and the token it was last used with.
struct Live {
    tenant: Tenant,
    token: Option<String>,
    connection: Weak<Connection>,
}

/// The shares in force and what each principal holds.
pub struct FrontDoor {
    per_peer_connections: usize,
    tenant_connections: usize,
    streams: usize,
    buffered_total: usize,
    buffered_share: usize,
    ledger: Mutex<Ledger>,
    live: Mutex<HashMap<u64, Live>>,
}

/// What a connection is charged to, released when it ends (or is charged
/// to another principal).
struct Holder {
    door: Arc<FrontDoor>,
    principal: Principal,
    connection: u64,
}

impl Drop for Holder {
    fn drop(&mut self) {
        sub(&mut self.door.ledger().connections, &self.principal, 1);
        self.door.live_map().remove(&self.connection);
    }
}

/// An open event stream of a principal, released when its body ends.
pub struct StreamSlot {
    door: Arc<FrontDoor>,
    principal: Principal,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        sub(&mut self.door.ledger().streams, &self.principal, 1);
    }
}

impl FrontDoor {
    pub fn new(limits: &HttpLimits) -> Arc<Self> {
        Arc::new(Self {
            per_peer_connections: limits.max_per_peer,
            tenant_connections: limits.tenant_connections,
            streams: limits.principal_streams,
            buffered_total: limits.buffered_total,
            buffered_share: limits.buffered_share,
            ledger: Mutex::new(Ledger::default()),
            live: Mutex::new(HashMap::new()),
        })
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn live_map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connections `principal` may hold (0: no share of its own).
    fn connection_share(&self, principal: &Principal) -> usize {
        match principal {
            Principal::Peer(_) => self.per_peer_connections,
            Principal::Tenant(Tenant::Named(_)) => self.tenant_connections,
            Principal::Tenant(Tenant::Sole) => 0,
        }
    }

    /// Charges `connection` to `principal` (used with `token`), unless the
    /// principal holds its share of connections already.
    pub fn hold(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        principal: &Principal,
        token: Option<&str>,
    ) -> Result<(), Share> {
        let already = connection.with_attached(|attached| {
            attached
                .as_ref()
                .and_then(|a| a.downcast_ref::<Holder>())
                .is_some_and(|h| h.principal == *principal)
        });
        if !already {
            let share = self.connection_share(principal);
            {
                let mut ledger = self.ledger();
                let held = ledger.connections.get(principal).copied().unwrap_or(0);
                if share > 0 && held >= share {
                    return Err(Share::Connections);
                }
                add(&mut ledger.connections, principal, 1);
            }
            let holder = Holder {
                door: self.clone(),
                principal: principal.clone(),
                connection: connection.id,
            };
            // The previous holder (another principal's) is released here,
            // outside the ledger's lock.
            let previous = connection.with_attached(|attached| attached.replace(Box::new(holder)));
            drop(previous);
        }
        if let Principal::Tenant(tenant) = principal {
            self.live_map().insert(
                connection.id,
                Live {
                    tenant: tenant.clone(),
                    token: token.map(str::to_string),
                    connection: Arc::downgrade(connection),
                },
            );
        }
        Ok(())
    }

    /// Whether `principal` may open another event stream.
    pub fn stream_room(&self, principal: &Principal) -> Result<(), Share> {
        let held = self.ledger().streams.get(principal).copied().unwrap_or(0);
        if held >= self.streams {
            return Err(Share::Streams);
        }
        Ok(())
    }

    /// Counts an event stream of `principal` until the slot is dropped.
    pub fn stream(self: &Arc<Self>, principal: &Principal) -> StreamSlot {
        add(&mut self.ledger().streams, principal, 1);
        StreamSlot {
            door: self.clone(),
            principal: principal.clone(),
        }
    }

    /// Whether `n` more bytes of `principal` fit its share and the total.
    fn room(&self, ledger: &Ledger, principal: &Principal, n: usize) -> Result<(), Share> {
        let held = ledger.buffered.get(principal).copied().unwrap_or(0);
        if held.saturating_add(n) > self.buffered_share {
            return Err(Share::Buffered);
        }
        if ledger.buffered_total.saturating_add(n) > self.buffered_total {
            return Err(Share::BufferedTotal);
        }
        Ok(())
    }

    fn reserve(&self, principal: &Principal, n: usize) -> Result<(), Share> {
        let mut ledger = self.ledger();
        self.room(&ledger, principal, n)?;
        add(&mut ledger.buffered, principal, n);
        ledger.buffered_total += n;
        Ok(())
    }

    fn release(&self, principal: &Principal, n: usize) {
        let mut ledger = self.ledger();
        sub(&mut ledger.buffered, principal, n);
        ledger.buffered_total = ledger.buffered_total.saturating_sub(n);
    }

    /// Holds `n` bytes of `principal`'s share (a body's declared length, or
    /// 0 to grow as a body arrives) until the hold is dropped.
    pub fn hold_bytes(
        self: &Arc<Self>,
        principal: &Principal,
        n: usize,
    ) -> Result<BytesHeld, Share> {
        self.reserve(principal, n)?;
        Ok(BytesHeld {
            door: self.clone(),
            principal: principal.clone(),
            held: n,
        })
    }

    /// After a token reload: closes every connection last used with a
    /// token that no longer names its tenant (a tenant removed, a token
    /// replaced). How many were closed.
    pub fn revoke(&self, tokens: &TokenTable) -> usize {
        let stale: Vec<Weak<Connection>> = self
            .live_map()
            .values()
            .filter(|live| match &live.token {
                Some(token) => tokens.tenant_of(token.as_bytes()) != Some(&live.tenant),
                None => false,
            })
            .map(|live| live.connection.clone())
            .collect();
        let mut closed = 0;
        for connection in stale.iter().filter_map(Weak::upgrade) {
            connection.close();
            closed += 1;
        }
        closed
    }
}

/// Bytes of a principal's share held for a request body, given back on drop.
pub struct BytesHeld {
    door: Arc<FrontDoor>,
    principal: Principal,
    held: usize,
}

impl BytesHeld {
    /// Holds `n` bytes in all (more as the body grows past its first hold).
    pub fn grow_to(&mut self, n: usize) -> Result<(), Share> {
        if n <= self.held {
            return Ok(());
        }
        let more = n - self.held;
        if let Err(share) = self.door.reserve(&self.principal, more) {
            crate::metrics::http_share_refusal(share.as_str(), self.principal.kind());
            return Err(share);
        }
        self.held = n;
        Ok(())
    }
}

impl Drop for BytesHeld {
    fn drop(&mut self) {
        self.door.release(&self.principal, self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> HttpLimits {
        HttpLimits {
            header_timeout: std::time::Duration::from_secs(1),
            idle_timeout: std::time::Duration::from_secs(1),
            write_timeout: std::time::Duration::from_secs(1),
            max_connections: 8,
            max_per_peer: 2,
            max_head_bytes: 1024,
            trusted_proxies: Vec::new(),
            tenant_connections: 2,
            principal_streams: 1,
            buffered_total: 100,
            buffered_share: 60,
        }
    }

    #[test]
    fn bytes_are_held_per_principal_and_in_all() {
        let door = FrontDoor::new(&limits());
        let alice = Principal::Tenant(Tenant::Named("alice".into()));
        let bob = Principal::Tenant(Tenant::Named("bob".into()));
        let carol = Principal::Peer("192.0.2.1".parse().expect("ip"));
        door.reserve(&alice, 60).expect("alice's share");
        assert_eq!(door.reserve(&alice, 1), Err(Share::Buffered));
        door.reserve(&bob, 40).expect("bob's part of the total");
        assert_eq!(door.reserve(&carol, 1), Err(Share::BufferedTotal));
        door.release(&alice, 60);
        door.reserve(&carol, 50).expect("room again");
        assert_eq!(door.ledger().buffered_total, 90);
    }

    #[test]
    fn a_connection_belongs_to_its_latest_principal_and_revocation_closes_it() {
        let door = FrontDoor::new(&limits());
        let alice = Principal::Tenant(Tenant::Named("alice".into()));
        let bob = Principal::Tenant(Tenant::Named("bob".into()));
        let (c1, c2, c3) = (
            Connection::for_tests(),
            Connection::for_tests(),
            Connection::for_tests(),
        );
        door.hold(&c1, &alice, Some("alice-token-0123456789"))
            .expect("one");
        door.hold(&c1, &alice, Some("alice-token-0123456789"))
            .expect("the same again costs nothing");
        door.hold(&c2, &alice, Some("alice-token-0123456789"))
            .expect("two");
        assert_eq!(
            door.hold(&c3, &alice, Some("alice-token-0123456789")),
            Err(Share::Connections)
        );
        door.hold(&c3, &bob, Some("bob-token-0123456789"))
            .expect("bob's own share");
        // A proxy's connection carries bob's request next: alice's slot goes.
        door.hold(&c2, &bob, Some("bob-token-0123456789"))
            .expect("bob's second");
        door.hold(&c3, &alice, Some("alice-token-0123456789"))
            .expect("alice has room again");
        // alice's token replaced, bob's kept: her connections close, his stay.
        let tokens =
            TokenTable::parse("alice-new-token-0123456789 alice\nbob-token-0123456789 bob\n")
                .expect("tokens");
        assert_eq!(door.revoke(&tokens), 2);
        assert!(c1.is_closed() && c3.is_closed() && !c2.is_closed());
        drop((c1, c2, c3));
        assert!(door.ledger().connections.is_empty());
        assert!(door.live_map().is_empty());
    }

    #[test]
    fn a_body_holds_its_declared_length_and_grows_within_the_share() {
        let door = FrontDoor::new(&limits());
        let alice = Principal::Tenant(Tenant::Named("alice".into()));
        let mut held = door.hold_bytes(&alice, 50).expect("declared");
        assert_eq!(door.hold_bytes(&alice, 20).err(), Some(Share::Buffered));
        held.grow_to(40).expect("within what is held");
        held.grow_to(60).expect("to the share");
        assert_eq!(held.grow_to(61), Err(Share::Buffered));
        drop(held);
        assert_eq!(door.ledger().buffered_total, 0, "given back on drop");
    }

    #[test]
    fn streams_are_counted_until_their_slot_goes() {
        let door = FrontDoor::new(&limits());
        let alice = Principal::Tenant(Tenant::Named("alice".into()));
        let bob = Principal::Tenant(Tenant::Named("bob".into()));
        let slot = door.stream(&alice);
        assert_eq!(door.stream_room(&alice), Err(Share::Streams));
        door.stream_room(&bob).expect("bob's own share");
        drop(slot);
        door.stream_room(&alice).expect("released");
    }
}
