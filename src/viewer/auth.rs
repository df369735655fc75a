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
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaa";
    const A2: &str = "aaaaaaaaaaaaaaaaaaa2";
    const B: &str = "bbbbbbbbbbbbbbbbbbbb";
    const B2: &str = "bbbbbbbbbbbbbbbbbbb2";

    fn access(tokens: &str) -> Access {
        let table = TokenTable::parse(tokens).expect("tokens");
        Access::new(Some(table), Some(PathBuf::from("/viewer-tokens")))
    }

    fn with_cookie(login: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = format!("x=1; {COOKIE}={login}");
        headers.insert(header::COOKIE, value.parse().expect("header"));
        headers
    }

    fn named(name: &str) -> Tenant {
        Tenant::Named(name.into())
    }

    /// SIGHUP with `tokens` as the new file: the tenants whose logins ended.
    fn sighup(access: &Access, tokens: &str) -> Vec<(Tenant, usize)> {
        let text = tokens.to_string();
        access
            .reload(|_| TokenTable::parse(&text).map_err(anyhow::Error::msg))
            .expect("reload");
        access.end_logins(|_| true)
    }

    #[test]
    fn a_ticket_logs_in_once_and_a_cookie_names_its_tenant() {
        let access = access(&format!("{A} alice\n{B} bob\n"));
        let alice = named("alice");
        let ticket = access.ticket(&alice).expect("ticket");
        let login = access.login(Some(&ticket), None, |_| true).expect("login");
        assert!(
            access.login(Some(&ticket), None, |_| true).is_none(),
            "single use"
        );
        assert_eq!(access.tenant_of(&with_cookie(&login)), Some(alice));
        let by_token = access.login(None, Some(B), |_| true).expect("token login");
        assert_eq!(
            access.tenant_of(&with_cookie(&by_token)),
            Some(named("bob"))
        );
        assert!(
            access
                .login(None, Some("wrong-token-wrong-token"), |_| true)
                .is_none()
        );
        assert_eq!(access.tenant_of(&with_cookie(&"0".repeat(64))), None);
        assert_eq!(access.tenant_of(&HeaderMap::new()), None);
    }

    #[test]
    fn a_rotated_token_ends_the_logins_made_with_it_and_a_changed_tenant_its_tickets() {
        const C: &str = "cccccccccccccccccccc";
        let access = access(&format!("{A} alice\n{A2} alice\n{B} bob\n{C} carol\n"));
        let (alice, bob, carol) = (named("alice"), named("bob"), named("carol"));
        let by_a = access.login(None, Some(A), |_| true).expect("a");
        let by_a2 = access.login(None, Some(A2), |_| true).expect("a2");
        let by_b = access.login(None, Some(B), |_| true).expect("b");
        let by_ticket = |tenant: &Tenant| {
            let ticket = access.ticket(tenant).expect("ticket");
            access
                .login(Some(&ticket), None, |_| true)
                .expect("ticket login")
        };
        let (alice_t, bob_t, carol_t) = (by_ticket(&alice), by_ticket(&bob), by_ticket(&carol));
        let cut = |login: &str, tenant: &Tenant| {
            access
                .ended(&with_cookie(login), tenant, |_| true)
                .expect("a live login")
        };
        let cuts = [
            cut(&by_a, &alice),
            cut(&by_b, &bob),
            cut(&bob_t, &bob),
            cut(&alice_t, &alice),
        ];
        let (kept_a2, kept_carol) = (cut(&by_a2, &alice), cut(&carol_t, &carol));
        let late_ticket = access.ticket(&bob).expect("ticket");

        // A is gone (A2 stays), B becomes B2, carol's tokens stay.
        let gone = sighup(&access, &format!("{A2} alice\n{B2} bob\n{C} carol\n"));
        assert!(gone.contains(&(alice.clone(), 2)), "{gone:?}");
        assert!(gone.contains(&(bob.clone(), 2)), "{gone:?}");
        assert_eq!(gone.len(), 2, "{gone:?}");
        let is = |login: &str| access.tenant_of(&with_cookie(login));
        assert_eq!(is(&by_a), None);
        assert_eq!(
            is(&by_a2),
            Some(alice.clone()),
            "its token is still alice's"
        );
        assert_eq!(is(&by_b), None);
        assert_eq!(is(&alice_t), None, "alice's tokens changed");
        assert_eq!(is(&bob_t), None);
        assert_eq!(is(&carol_t), Some(carol.clone()), "carol's did not");
        assert!(cuts.iter().all(CancellationToken::is_cancelled));
        assert!(!kept_a2.is_cancelled() && !kept_carol.is_cancelled());
        assert!(
            access.login(Some(&late_ticket), None, |_| true).is_none(),
            "a ticket printed with bob's old tokens"
        );
        assert!(access.login(None, Some(B), |_| true).is_none());
        assert!(access.login(None, Some(B2), |_| true).is_some());

        // A token moved to another tenant does not keep its logins.
        let by_a2_again = access.login(None, Some(A2), |_| true).expect("a2");
        sighup(&access, &format!("{A2} bob\n{B2} alice\n{C} carol\n"));
        assert_eq!(is(&by_a2_again), None);
        assert_eq!(is(&carol_t), Some(carol));
    }

    #[test]
    fn rotating_a_bare_token_ends_its_logins() {
        let access = access(&format!("{A}\n"));
        let old = access.login(None, Some(A), |_| true).expect("a");
        let ticket = access.ticket(&Tenant::Sole).expect("ticket");
        let by_ticket = access.login(Some(&ticket), None, |_| true).expect("t");
        assert_eq!(sighup(&access, &format!("{A}\n")), vec![]);
        assert_eq!(access.tenant_of(&with_cookie(&old)), Some(Tenant::Sole));
        assert_eq!(sighup(&access, &format!("{B}\n")), vec![(Tenant::Sole, 2)]);
        assert_eq!(access.tenant_of(&with_cookie(&old)), None);
        assert_eq!(access.tenant_of(&with_cookie(&by_ticket)), None);
    }

    #[test]
    fn a_stream_never_starts_on_a_login_that_has_ended() {
        let access = access(&format!("{A} alice\n{B} bob\n"));
        let alice = named("alice");
        let login = access.login(None, Some(A), |_| true).expect("a");
        let headers = with_cookie(&login);
        // The request was let in as alice...
        assert_eq!(access.tenant_of(&headers), Some(alice.clone()));
        // ...then SIGHUP ended alice's logins before its stream began.
        sighup(&access, &format!("{B} bob\n"));
        assert!(access.ended(&headers, &alice, |_| true).is_none());
        // Revoked on the server (the viewer tokens as they were).
        let bob = named("bob");
        let login = access.login(None, Some(B), |_| true).expect("b");
        let headers = with_cookie(&login);
        assert!(access.ended(&headers, &bob, |t| t != &bob).is_none());
        assert!(
            access.ended(&headers, &alice, |_| true).is_none(),
            "not alice's"
        );
        let cut = access.ended(&headers, &bob, |_| true).expect("live");
        assert!(!cut.is_cancelled());
        assert_eq!(access.end_logins(|t| t != &bob), vec![(bob, 1)]);
        assert!(cut.is_cancelled());
        // Without viewer tokens a stream ends only with the server.
        let open = Access::new(None, None);
        assert!(
            open.ended(&HeaderMap::new(), &Tenant::Sole, |_| true)
                .is_some()
        );
    }

    #[test]
    fn every_tenant_of_a_large_file_gets_a_working_ticket() {
        let n = MAX_TICKETS * 2;
        let tokens: String = (0..n)
            .map(|i| format!("token-number-{i:08} t{i}\n"))
            .collect();
        let access = access(&tokens);
        let tickets: Vec<(Tenant, String)> = access
            .tenants()
            .into_iter()
            .map(|t| {
                let ticket = access.ticket(&t).expect("ticket");
                (t, ticket)
            })
            .collect();
        assert_eq!(tickets.len(), n);
        for (tenant, ticket) in tickets {
            let login = access.login(Some(&ticket), None, |_| true).expect("login");
            assert_eq!(access.tenant_of(&with_cookie(&login)), Some(tenant));
        }
    }

    #[test]
    fn each_tenant_holds_its_own_share_and_pushes_out_only_its_own_logins() {
        let access = access(&format!("{A} alice\n{B} bob\ncccccccccccccccccccc carol\n"));
        let share = login_share(3);
        assert_eq!(share, MAX_LOGINS / 3);
        assert_eq!(
            (login_share(1), login_share(2)),
            (MAX_LOGINS, MAX_LOGINS / 2)
        );
        assert_eq!(login_share(1000), MIN_LOGIN_SHARE);
        let bob = access.login(None, Some(B), |_| true).expect("bob");
        let first_carol = access
            .login(None, Some("cccccccccccccccccccc"), |_| true)
            .expect("carol");
        for _ in 0..MAX_LOGINS * 2 {
            access.login(None, Some(A), |_| true).expect("alice");
        }
        for _ in 1..share {
            access
                .login(None, Some("cccccccccccccccccccc"), |_| true)
                .expect("carol");
        }
        let count = |t: &str| {
            let logins = access.logins.lock().expect("lock");
            logins.values().filter(|l| l.tenant == named(t)).count()
        };
        assert_eq!(
            (count("alice"), count("bob"), count("carol")),
            (share, 1, share)
        );
        assert_eq!(access.tenant_of(&with_cookie(&bob)), Some(named("bob")));
        assert_eq!(
            access.tenant_of(&with_cookie(&first_carol)),
            Some(named("carol"))
        );
        // At its share, carol's own oldest goes.
        access
            .login(None, Some("cccccccccccccccccccc"), |_| true)
            .expect("carol");
        assert_eq!(access.tenant_of(&with_cookie(&first_carol)), None);
        assert_eq!(access.tenant_of(&with_cookie(&bob)), Some(named("bob")));
        assert_eq!(count("carol"), share);
    }

    #[test]
    fn with_two_tenants_each_holds_half_and_revoked_logins_end_their_streams() {
        let access = access(&format!("{A} alice\n{B} bob\n"));
        let bob_login = access.login(None, Some(B), |_| true).expect("bob");
        for _ in 0..MAX_LOGINS {
            access.login(None, Some(A), |_| true).expect("alice");
        }
        let (alice, bob) = (named("alice"), named("bob"));
        assert_eq!(
            access.tenant_of(&with_cookie(&bob_login)),
            Some(bob.clone())
        );
        let alice_logins: Vec<String> = {
            let logins = access.logins.lock().expect("lock");
            logins
                .iter()
                .filter(|(_, l)| l.tenant == alice)
                .map(|(k, _)| k.clone())
                .collect()
        };
        assert_eq!(alice_logins.len(), MAX_LOGINS / 2);
        let cut = access
            .ended(&with_cookie(&alice_logins[0]), &alice, |_| true)
            .expect("alice");
        let kept = access
            .ended(&with_cookie(&bob_login), &bob, |_| true)
            .expect("bob");
        let gone = access.end_logins(|t| t != &alice);
        assert_eq!(gone, vec![(alice.clone(), MAX_LOGINS / 2)]);
        assert!(cut.is_cancelled() && !kept.is_cancelled());
        assert!(
            access.login(None, Some(A), |t| t != &alice).is_none(),
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
