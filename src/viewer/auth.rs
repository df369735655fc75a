//! Who a viewer's request is. A browser cannot send a bearer header on a
//! navigation or an EventSource, so a viewer token (or a one-time ticket
//! printed at start) is exchanged once for a cookie holding a random
//! session id, never the token: HttpOnly, SameSite=Strict, Path=/. Without
//! viewer tokens (a single-tenant server on loopback) every request is the
//! sole tenant.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};

use crate::config::tokens::{Tenant, TokenTable};

/// The cookie's name.
pub const COOKIE: &str = "ferrepl_viewer";
/// How long a ticket printed at start can be used (once).
pub const TICKET_TTL: Duration = Duration::from_secs(10 * 60);
/// How long a browser's login lasts.
const LOGIN_TTL: Duration = Duration::from_secs(12 * 3600);
/// Logins kept at once (the oldest is forgotten first).
const MAX_LOGINS: usize = 256;
const MAX_TICKETS: usize = 64;

pub struct Access {
    /// None: no viewer tokens, every request is the sole tenant.
    tokens: Option<TokenTable>,
    tickets: Mutex<HashMap<String, (Tenant, Instant)>>,
    logins: Mutex<HashMap<String, (Tenant, Instant)>>,
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
        let Some(oldest) = map
            .iter()
            .min_by_key(|(_, (_, made))| *made)
            .map(|(k, _)| k.clone())
        else {
            break;
        };
        map.remove(&oldest);
    }
}

impl Access {
    pub fn new(tokens: Option<TokenTable>) -> Self {
        Self {
            tokens,
            tickets: Mutex::new(HashMap::new()),
            logins: Mutex::new(HashMap::new()),
        }
    }

    /// Whether requests must log in.
    pub fn needs_login(&self) -> bool {
        self.tokens.is_some()
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

    /// A new login (the cookie's value) for a ticket or a token.
    pub fn login(&self, ticket: Option<&str>, token: Option<&str>) -> Option<String> {
        let tenant = match (ticket, token) {
            (Some(t), _) => self.redeem(t)?,
            (None, Some(tok)) => self
                .tokens
                .as_ref()?
                .tenant_of(tok.trim().as_bytes())?
                .clone(),
            _ => return None,
        };
        let id = random_id().ok()?;
        let mut logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        bound(&mut logins, LOGIN_TTL, MAX_LOGINS);
        logins.insert(id.clone(), (tenant, Instant::now()));
        Some(id)
    }

    /// The tenant a request is, from its cookie; None: not logged in.
    pub fn tenant_of(&self, headers: &HeaderMap) -> Option<Tenant> {
        let Some(tokens) = &self.tokens else {
            return Some(Tenant::Sole);
        };
        let login = cookie(headers)?;
        let logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        let (tenant, made) = logins.get(&login)?;
        // A tenant whose viewer tokens are gone is not served.
        (made.elapsed() < LOGIN_TTL && tokens.has(tenant)).then(|| tenant.clone())
    }

    /// The Set-Cookie value of a login.
    pub fn set_cookie(login: &str) -> String {
        format!(
            "{COOKIE}={login}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
            LOGIN_TTL.as_secs()
        )
    }

    /// The tenants of the viewer tokens (for the tickets printed at start).
    pub fn tenants(&self) -> Vec<Tenant> {
        self.tokens
            .as_ref()
            .map(TokenTable::tenants)
            .unwrap_or_default()
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
        let access = Access::new(Some(tokens));
        let alice = Tenant::Named("alice".into());
        let ticket = access.ticket(&alice).expect("ticket");
        let login = access.login(Some(&ticket), None).expect("login");
        assert!(access.login(Some(&ticket), None).is_none(), "single use");
        let mut headers = HeaderMap::new();
        let value = format!("x=1; {COOKIE}={login}");
        headers.insert(header::COOKIE, value.parse().expect("header"));
        assert_eq!(access.tenant_of(&headers), Some(alice));
        let by_token = access
            .login(None, Some("bbbbbbbbbbbbbbbbbbbb"))
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
                .login(None, Some("wrong-token-wrong-token"))
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
    fn without_tokens_every_request_is_the_sole_tenant() {
        let access = Access::new(None);
        assert_eq!(access.tenant_of(&HeaderMap::new()), Some(Tenant::Sole));
        assert!(access.login(None, Some("anything")).is_none());
    }
}
