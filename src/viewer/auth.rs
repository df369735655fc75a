//! Who a viewer's request is. A browser cannot send a bearer header on a
//! navigation or an EventSource, so a viewer token (or a one-time ticket
//! printed at start) is exchanged once for a cookie holding a random
//! session id, never the token: HttpOnly, SameSite=Strict, Path=/. Without
//! viewer tokens (a single-tenant server on loopback) every request is the
//! sole tenant. A login holds while what made it holds: its token still
//! names its tenant in the viewer tokens (a ticket's: the tenant's tokens
//! are those it was printed with), and the server still serves the tenant;
//! SIGHUP ends the others and the streams opened with them. Failed logins
//! are throttled (a ticket never is).

use std::collections::HashMap;
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
/// Logins kept at once, shared out among the tenants: each holds at most
/// its share ([`login_share`]); a tenant at its share forgets its own
/// oldest, never another's.
const MAX_LOGINS: usize = 256;
/// A tenant's share is never below this (with many tenants the total is
/// then this many a tenant of the token file).
const MIN_LOGIN_SHARE: usize = 8;
/// Tickets kept at once, or as many as there are tenants (one each is
/// printed at start).
const MAX_TICKETS: usize = 64;

pub struct Access {
    /// None: no viewer tokens, every request is the sole tenant. Some: the
    /// `--viewer-tokens` table, replaced on SIGHUP.
    tokens: Option<RwLock<Arc<TokenTable>>>,
    file: Option<PathBuf>,
    tickets: Mutex<HashMap<String, Ticket>>,
    logins: Mutex<HashMap<String, Login>>,
    pub throttle: super::throttle::Throttle,
}

struct Ticket {
    tenant: Tenant,
    made: Instant,
    /// The tokens it was printed with: it is void once its tenant's change.
    table: Arc<TokenTable>,
}

/// What made a login.
enum Source {
    /// A viewer token (kept in memory, as the table keeps it, to check it
    /// still names the tenant; compared in constant time).
    Token(String),
    /// A ticket: the table when it was used; the login ends when the
    /// tenant's tokens are no longer those.
    Ticket(Arc<TokenTable>),
}

struct Login {
    tenant: Tenant,
    made: Instant,
    source: Source,
    /// Cancelled when the login is forgotten (ended, expired or pushed
    /// out): the live streams opened with it close.
    cut: CancellationToken,
}

impl Drop for Login {
    fn drop(&mut self) {
        self.cut.cancel();
    }
}

impl Login {
    /// Whether the login still holds under `table`.
    fn holds(&self, table: &Arc<TokenTable>) -> bool {
        self.made.elapsed() < LOGIN_TTL
            && table.has(&self.tenant)
            && match &self.source {
                Source::Token(token) => table.tenant_of(token.as_bytes()) == Some(&self.tenant),
                Source::Ticket(from) => same_tokens(from, table, &self.tenant),
            }
    }
}

fn same_tokens(from: &Arc<TokenTable>, now: &Arc<TokenTable>, tenant: &Tenant) -> bool {
    Arc::ptr_eq(from, now) || from.same_tokens(now, tenant)
}

/// The logins a tenant may hold when the viewer tokens name `tenants`:
/// all of [`MAX_LOGINS`] for one, half for two, and so on, never below
/// [`MIN_LOGIN_SHARE`].
fn login_share(tenants: usize) -> usize {
    (MAX_LOGINS / tenants.max(1)).max(MIN_LOGIN_SHARE)
}

/// 256 random bits as hex: a ticket or a login's cookie.
fn random_id() -> std::io::Result<String> {
    crate::config::tokens::random_id(32)
}

/// Forgets `tenant`'s oldest login; false: it has none.
fn forget_oldest(logins: &mut HashMap<String, Login>, tenant: &Tenant) -> bool {
    let oldest = logins
        .iter()
        .filter(|(_, l)| l.tenant == *tenant)
        .min_by_key(|(_, l)| l.made)
        .map(|(k, _)| k.clone());
    oldest.is_some_and(|k| logins.remove(&k).is_some())
}

impl Access {
    pub fn new(tokens: Option<TokenTable>, file: Option<PathBuf>) -> Self {
        Self {
            tokens: tokens.map(|t| RwLock::new(Arc::new(t))),
            file,
            tickets: Mutex::new(HashMap::new()),
            logins: Mutex::new(HashMap::new()),
            throttle: super::throttle::Throttle::default(),
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

    /// A one-time ticket for `tenant`, valid for [`TICKET_TTL`] while the
    /// tenant's viewer tokens stay as they are.
    pub fn ticket(&self, tenant: &Tenant) -> std::io::Result<String> {
        let table = self
            .table()
            .ok_or_else(|| std::io::Error::other("no viewer tokens"))?;
        let max = MAX_TICKETS.max(table.tenants().len());
        let id = random_id()?;
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        tickets.retain(|_, t| t.made.elapsed() < TICKET_TTL);
        while tickets.len() >= max {
            let oldest = tickets
                .iter()
                .min_by_key(|(_, t)| t.made)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => tickets.remove(&k),
                None => break,
            };
        }
        tickets.insert(
            id.clone(),
            Ticket {
                tenant: tenant.clone(),
                made: Instant::now(),
                table,
            },
        );
        Ok(id)
    }

    /// A ticket's tenant, once: the ticket is gone after this.
    fn redeem(&self, ticket: &str, table: &Arc<TokenTable>) -> Option<Tenant> {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let t = tickets.remove(ticket)?;
        (t.made.elapsed() < TICKET_TTL && same_tokens(&t.table, table, &t.tenant))
            .then_some(t.tenant)
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
        let (tenant, source) = match (ticket, token) {
            (Some(t), _) => (self.redeem(t, &table)?, Source::Ticket(table.clone())),
            (None, Some(tok)) => {
                let tok = tok.trim();
                let tenant = table.tenant_of(tok.as_bytes())?.clone();
                (tenant, Source::Token(tok.to_string()))
            }
            _ => return None,
        };
        if !table.has(&tenant) || !serves(&tenant) {
            return None;
        }
        let id = random_id().ok()?;
        let share = login_share(table.tenants().len());
        let mut logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        logins.retain(|_, l| l.made.elapsed() < LOGIN_TTL);
        // Its own oldest go; another tenant's never do.
        while logins.values().filter(|l| l.tenant == tenant).count() >= share {
            if !forget_oldest(&mut logins, &tenant) {
                break;
            }
        }
        logins.insert(
            id.clone(),
            Login {
                tenant,
                made: Instant::now(),
                source,
                cut: CancellationToken::new(),
            },
        );
        Some(id)
    }

    /// The tenant a request is, from its cookie; None: not logged in.
    pub fn tenant_of(&self, headers: &HeaderMap) -> Option<Tenant> {
        let Some(table) = self.table() else {
            return Some(Tenant::Sole);
        };
        let login = cookie(headers)?;
        let logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        let login = logins.get(&login)?;
        login.holds(&table).then(|| login.tenant.clone())
    }

    /// What ends a live stream of the request's login (of `tenant`): None
    /// when that login no longer holds or `serves` refuses its tenant,
    /// checked under the lock that ending logins takes, so a stream never
    /// starts on a login SIGHUP has just ended. Without viewer tokens
    /// nothing ends one.
    pub fn ended(
        &self,
        headers: &HeaderMap,
        tenant: &Tenant,
        serves: impl Fn(&Tenant) -> bool,
    ) -> Option<CancellationToken> {
        let Some(table) = self.table() else {
            return Some(CancellationToken::new());
        };
        let login = cookie(headers)?;
        let logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        let login = logins.get(&login)?;
        (login.tenant == *tenant && login.holds(&table) && serves(tenant))
            .then(|| login.cut.clone())
    }

    /// Ends the logins (and their streams) that no longer hold under the
    /// viewer tokens or whose tenant `serves` refuses; returns how many
    /// ended of each tenant.
    pub fn end_logins(&self, serves: impl Fn(&Tenant) -> bool) -> Vec<(Tenant, usize)> {
        let Some(table) = self.table() else {
            return Vec::new();
        };
        let mut logins = self.logins.lock().unwrap_or_else(|e| e.into_inner());
        let mut gone: Vec<(Tenant, usize)> = Vec::new();
        logins.retain(|_, l| {
            if l.holds(&table) && serves(&l.tenant) {
                return true;
            }
            match gone.iter_mut().find(|(t, _)| *t == l.tenant) {
                Some((_, n)) => *n += 1,
                None => gone.push((l.tenant.clone(), 1)),
            }
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

    /// The viewer tokens (for the redactor; none without a file).
    pub fn token_secrets(&self) -> Vec<String> {
        self.table().map(|t| t.secrets()).unwrap_or_default()
    }

    /// The tenants of the viewer tokens (for the tickets printed at start).
    pub fn tenants(&self) -> Vec<Tenant> {
        self.table().map(|t| t.tenants()).unwrap_or_default()
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
mod tests;
