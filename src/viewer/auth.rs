//! Who a viewer's request is. A browser cannot send a bearer header on a
//! navigation or an EventSource, so a viewer token (or a one-time ticket
//! printed at start) is exchanged once for a cookie holding a random
//! session id, never the token: HttpOnly, SameSite=Strict, Path=/. Without
//! viewer tokens (a single-tenant server on loopback) every request is the
//! sole tenant. Logins end when their tenant leaves the viewer tokens or is
//! revoked (SIGHUP), and failed logins are throttled.

use std::collections::HashMap;
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use tokio_util::sync::CancellationToken;

use crate::config::tokens::{Tenant, TokenTable};

/// The cookie's name.
pub const COOKIE: &str = "ferrepl_viewer";
/// How long a ticket printed at start can be used (once).
pub const TICKET_TTL: Duration = Duration::from_secs(10 * 60);
/// How long a browser's login lasts.
const LOGIN_TTL: Duration = Duration::from_secs(12 * 3600);
/// Logins kept at once; with several tenants each holds at most half
/// (its own oldest is forgotten first).
const MAX_LOGINS: usize = 256;
const MAX_TICKETS: usize = 64;

pub struct Access {
    /// None: no viewer tokens, every request is the sole tenant. Some: the
    /// `--viewer-tokens` table, replaced on SIGHUP.
    tokens: Option<RwLock<Arc<TokenTable>>>,
    file: Option<PathBuf>,
    tickets: Mutex<HashMap<String, (Tenant, Instant)>>,
    logins: Mutex<Logins>,
    pub throttle: Throttle,
}

#[derive(Default)]
struct Logins {
    by_id: HashMap<String, (Tenant, Instant)>,
    /// Cancelled when a tenant's logins end: its live streams close. One
    /// per tenant with a login or a stream (tenants of the tokens only).
    ended: HashMap<Tenant, CancellationToken>,
}

/// 32 random bytes as hex, from the kernel.
pub fn random_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Keeps at most `max` entries, dropping expired ones and then the oldest.
fn bound(map: &mut HashMap<String, (Tenant, Instant)>, ttl: Duration, max: usize) {
    map.retain(|_, (_, made)| made.elapsed() < ttl);
    while map.len() >= max {
        if !forget_oldest(map, |_| true) {
            break;
        }
    }
}

/// Forgets the oldest entry whose tenant passes `of`; false: none did.
fn forget_oldest(
    map: &mut HashMap<String, (Tenant, Instant)>,
    of: impl Fn(&Tenant) -> bool,
) -> bool {
    let oldest = map
        .iter()
        .filter(|(_, (t, _))| of(t))
        .min_by_key(|(_, (_, made))| *made)
        .map(|(k, _)| k.clone());
    oldest.is_some_and(|k| map.remove(&k).is_some())
}

impl Access {
    pub fn new(tokens: Option<TokenTable>, file: Option<PathBuf>) -> Self {
        Self {
            tokens: tokens.map(|t| RwLock::new(Arc::new(t))),
            file,
            tickets: Mutex::new(HashMap::new()),
            logins: Mutex::new(Logins::default()),
            throttle: Throttle::default(),
        }
    }

    /// Whether requests must log in.
    pub fn needs_login(&self) -> bool {
        self.tokens.is_some()
    }

    fn table(&self) -> Option<Arc<TokenTable>> {
        self.tokens
            .as_ref()
            .map(|t| t.read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// A one-time ticket for `tenant`, valid for [`TICKET_TTL`].
    pub fn ticket(&self, tenant: &Tenant) -> std::io::Result<String> {
        let id = random_id()?;
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        bound(&mut tickets, TICKET_TTL, MAX_TICKETS);
        tickets.insert(id.clone(), (tenant.clone(), Instant::now()));
        Ok(id)
    }

    /// A ticket's tenant, once: the ticket is gone after this.
    fn redeem(&self, ticket: &str) -> Option<Tenant> {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let (tenant, made) = tickets.remove(ticket)?;
        (made.elapsed() < TICKET_TTL).then_some(tenant)
    }

    /// A new login (the cookie's value) for a ticket or a token, of a
    /// tenant still in the tokens that `serves` allows.
    pub fn login(
        &self,
        ticket: Option<&str>,
        token: Option<&str>,
        serves: impl Fn(&Tenant) -> bool,
    ) -> Option<String> {
        let table = self.table()?;
        let tenant = match (ticket, token) {
            (Some(t), _) => self.redeem(t)?,
            (None, Some(tok)) => table.tenant_of(tok.trim().as_bytes())?.clone(),
            _ => return None,
        };
        if !table.has(&tenant) || !serves(&tenant) {
            return None;
        }
        let id = random_id().ok()?;
        let share = if table.tenants().len() > 1 {
            MAX_LOGINS / 2
        } else {
            MAX_LOGINS
        };
        let mut logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        let map = &mut logins.by_id;
        map.retain(|_, (_, made)| made.elapsed() < LOGIN_TTL);
        // Its own oldest first; when all are full, the largest tenant's.
        if map.values().filter(|(t, _)| *t == tenant).count() >= share {
            forget_oldest(map, |t| *t == tenant);
        } else if map.len() >= MAX_LOGINS {
            let mut counts: HashMap<&Tenant, usize> = HashMap::new();
            for (t, _) in map.values() {
                *counts.entry(t).or_default() += 1;
            }
            let largest = counts
                .into_iter()
                .max_by_key(|(_, n)| *n)
                .map(|(t, _)| t.clone());
            if let Some(largest) = largest {
                forget_oldest(map, |t| *t == largest);
            }
        }
        map.insert(id.clone(), (tenant, Instant::now()));
        Some(id)
    }

    /// The tenant a request is, from its cookie; None: not logged in.
    pub fn tenant_of(&self, headers: &HeaderMap) -> Option<Tenant> {
        let Some(table) = self.table() else {
            return Some(Tenant::Sole);
        };
        let login = cookie(headers)?;
        let logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        let (tenant, made) = logins.by_id.get(&login)?;
        // A tenant whose viewer tokens are gone is not served.
        (made.elapsed() < LOGIN_TTL && table.has(tenant)).then(|| tenant.clone())
    }

    /// What ends `tenant`'s live streams when its logins end.
    pub fn ended(&self, tenant: &Tenant) -> CancellationToken {
        let mut logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        logins.ended.entry(tenant.clone()).or_default().clone()
    }

    /// Ends the logins (and streams) of tenants no longer in the viewer
    /// tokens or that `serves` refuses; returns those tenants.
    pub fn end_logins(&self, serves: impl Fn(&Tenant) -> bool) -> Vec<Tenant> {
        let table = self.table();
        let keep = |t: &Tenant| table.as_ref().is_none_or(|tab| tab.has(t)) && serves(t);
        let mut logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        logins.by_id.retain(|_, (t, _)| keep(t));
        let mut gone = Vec::new();
        logins.ended.retain(|t, cut| {
            if keep(t) {
                return true;
            }
            cut.cancel();
            gone.push(t.clone());
            false
        });
        gone
    }

    /// Re-reads `--viewer-tokens` with `read` (which checks them); the
    /// table stays as it was on an error. None: no file to reload.
    pub fn reload(
        &self,
        read: impl Fn(&Path) -> anyhow::Result<TokenTable>,
    ) -> anyhow::Result<Option<&Path>> {
        let (Some(lock), Some(file)) = (&self.tokens, &self.file) else {
            return Ok(None);
        };
        let table = read(file)?;
        let mut current = lock.write().unwrap_or_else(|e| e.into_inner());
        if table.has_tenants() != current.has_tenants() {
            anyhow::bail!(
                "{} switches between one tenant and named tenants; restart ferrepl for that",
                file.display()
            );
        }
        *current = Arc::new(table);
        Ok(Some(file))
    }

    /// The Set-Cookie value of a login (Secure when the browser reaches
    /// the viewer over TLS).
    pub fn set_cookie(login: &str, secure: bool) -> String {
        format!(
            "{COOKIE}={login}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
            LOGIN_TTL.as_secs(),
            if secure { "; Secure" } else { "" }
        )
    }

    /// The tenants of the viewer tokens (for the tickets printed at start).
    pub fn tenants(&self) -> Vec<Tenant> {
        self.table().map(|t| t.tenants()).unwrap_or_default()
    }
}

/// Failed logins per peer address and overall, in fixed windows; a peer
/// or the instance past its count waits for the window's end. Bounded: at
/// most [`MAX_PEERS`] addresses are remembered (past that only the overall
/// count applies).
#[derive(Default)]
pub struct Throttle {
    state: Mutex<ThrottleState>,
}

#[derive(Default)]
struct ThrottleState {
    peers: HashMap<IpAddr, Window>,
    all: Window,
}

#[derive(Default, Clone, Copy)]
struct Window {
    start: Option<Instant>,
    fails: u32,
}

const WINDOW: Duration = Duration::from_secs(60);
/// Failed logins a peer address may make per window.
pub const PEER_FAILS: u32 = 10;
/// Failed logins of every peer together per window.
const ALL_FAILS: u32 = 100;
const MAX_PEERS: usize = 1024;

impl Window {
    /// The failures in the window running at `now`, and its time left.
    fn current(&self, now: Instant) -> (u32, Duration) {
        match self.start {
            Some(s) if now.duration_since(s) < WINDOW => {
                (self.fails, WINDOW - now.duration_since(s))
            }
            _ => (0, WINDOW),
        }
    }

    fn fail(&mut self, now: Instant) {
        let (fails, _) = self.current(now);
        if fails == 0 {
            self.start = Some(now);
        }
        self.fails = fails + 1;
    }
}

impl Throttle {
    /// Err(how long to wait) when `peer` or everyone failed too often.
    pub fn check(&self, peer: IpAddr, now: Instant) -> Result<(), Duration> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (all, left) = state.all.current(now);
        if all >= ALL_FAILS {
            return Err(left);
        }
        match state.peers.get(&peer).map(|w| w.current(now)) {
            Some((fails, left)) if fails >= PEER_FAILS => Err(left),
            _ => Ok(()),
        }
    }

    pub fn fail(&self, peer: IpAddr, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.all.fail(now);
        if !state.peers.contains_key(&peer) && state.peers.len() >= MAX_PEERS {
            state.peers.retain(|_, w| w.current(now).0 > 0);
        }
        if state.peers.contains_key(&peer) || state.peers.len() < MAX_PEERS {
            state.peers.entry(peer).or_default().fail(now);
        }
    }
}

/// The value of our cookie among the request's cookies (64 hex digits).
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_logs_in_once_and_a_cookie_names_its_tenant() {
        let tokens = TokenTable::parse("aaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n")
            .expect("tokens");
        let access = Access::new(Some(tokens), None);
        let alice = Tenant::Named("alice".into());
        let ticket = access.ticket(&alice).expect("ticket");
        let login = access.login(Some(&ticket), None, |_| true).expect("login");
        assert!(
            access.login(Some(&ticket), None, |_| true).is_none(),
            "single use"
        );
        let mut headers = HeaderMap::new();
        let value = format!("x=1; {COOKIE}={login}");
        headers.insert(header::COOKIE, value.parse().expect("header"));
        assert_eq!(access.tenant_of(&headers), Some(alice));
        let by_token = access
            .login(None, Some("bbbbbbbbbbbbbbbbbbbb"), |_| true)
            .expect("token login");
        headers.insert(
            header::COOKIE,
            format!("{COOKIE}={by_token}").parse().expect("h"),
        );
        assert_eq!(
            access.tenant_of(&headers),
            Some(Tenant::Named("bob".into()))
        );
        assert!(
            access
                .login(None, Some("wrong-token-wrong-token"), |_| true)
                .is_none()
        );
        headers.insert(
            header::COOKIE,
            format!("{COOKIE}={}", "0".repeat(64)).parse().expect("h"),
        );
        assert_eq!(access.tenant_of(&headers), None);
        assert_eq!(access.tenant_of(&HeaderMap::new()), None);
    }

    #[test]
    fn failed_logins_wait_per_address_and_overall_and_the_memory_is_bounded() {
        let t = Throttle::default();
        let now = Instant::now();
        let (a, b): (IpAddr, IpAddr) = (
            "10.0.0.1".parse().expect("ip"),
            "10.0.0.2".parse().expect("ip"),
        );
        for _ in 0..PEER_FAILS {
            assert!(t.check(a, now).is_ok());
            t.fail(a, now);
        }
        let wait = t.check(a, now).expect_err("a waits");
        assert!(wait <= WINDOW && wait > Duration::ZERO);
        assert!(t.check(b, now).is_ok(), "b does not");
        assert!(t.check(a, now + WINDOW).is_ok(), "a new window");
        for n in 0..(ALL_FAILS as usize + MAX_PEERS) {
            let peer = IpAddr::from([10, 1, (n >> 8) as u8, n as u8]);
            t.fail(peer, now);
        }
        assert!(t.check(b, now).is_err(), "everyone waits");
        let state = t.state.lock().expect("lock");
        assert!(state.peers.len() <= MAX_PEERS);
    }

    #[test]
    fn a_tenant_holds_at_most_half_the_logins_and_ended_logins_end_streams() {
        let tokens = TokenTable::parse("aaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n")
            .expect("tokens");
        let access = Access::new(Some(tokens), None);
        let bob = access
            .login(None, Some("bbbbbbbbbbbbbbbbbbbb"), |_| true)
            .expect("bob");
        for _ in 0..MAX_LOGINS {
            access
                .login(None, Some("aaaaaaaaaaaaaaaaaaaa"), |_| true)
                .expect("alice");
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            format!("{COOKIE}={bob}").parse().expect("h"),
        );
        assert_eq!(
            access.tenant_of(&headers),
            Some(Tenant::Named("bob".into()))
        );
        let alice = Tenant::Named("alice".into());
        let count = |t: &Tenant| {
            let logins = access.logins.lock().expect("lock");
            logins.by_id.values().filter(|(x, _)| x == t).count()
        };
        assert_eq!(count(&alice), MAX_LOGINS / 2);
        let cut = access.ended(&alice);
        let kept = access.ended(&Tenant::Named("bob".into()));
        let gone = access.end_logins(|t| t != &alice);
        assert_eq!(gone, vec![alice.clone()]);
        assert!(cut.is_cancelled() && !kept.is_cancelled());
        assert_eq!(count(&alice), 0);
        assert!(
            access
                .login(None, Some("aaaaaaaaaaaaaaaaaaaa"), |t| t != &alice)
                .is_none(),
            "a tenant the server no longer serves"
        );
    }

    #[test]
    fn without_tokens_every_request_is_the_sole_tenant() {
        let access = Access::new(None, None);
        assert_eq!(access.tenant_of(&HeaderMap::new()), Some(Tenant::Sole));
        assert!(access.login(None, Some("anything"), |_| true).is_none());
    }
}
