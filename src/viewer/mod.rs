//! `--viewer`: a live, read-only view of the sessions for a person's
//! browser, on a listener of its own (the MCP listener's bounded accept
//! loop, `crate::serve::listener`, with Host/Origin rules of its own:
//! `hosts`). The pages are static (embedded HTML, CSS and JS that hold no
//! data); the data comes as JSON and server-sent events, which the page
//! turns into text nodes only: everything shown is written by the agent.
//! Nothing here changes a session (see `session::view`).

mod auth;
mod feed;
mod hosts;
mod routes;
mod throttle;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::settings::Settings;
use crate::config::tokens::{Tenant, TokenTable};
use crate::tenants::{Instance, TenantApp};

pub use auth::TICKET_TTL;
pub use hosts::NAMED_HOST;

/// The viewer's listener, bound before anything starts, and who may look.
pub struct Bound {
    listener: tokio::net::TcpListener,
    access: auth::Access,
    rules: hosts::Rules,
    pub url: String,
    /// Said when the URL is another name's (`--viewer-allow-host`).
    local: Option<SocketAddr>,
}

/// Refusals from the flags alone: a viewer off loopback or on a server with
/// tenants needs `--viewer-tokens`, whose tenants must be of the server's
/// kind and whose tokens are long enough; `--viewer-allow-host` must parse.
pub fn check(
    settings: &Settings,
    server_tokens: &TokenTable,
) -> anyhow::Result<Option<TokenTable>> {
    let Some(addr) = settings.viewer.addr else {
        return Ok(None);
    };
    hosts::Rules::new(addr, &settings.viewer.allow_hosts)
        .map_err(|e| anyhow::anyhow!("--viewer-allow-host {e}"))?;
    let Some(file) = &settings.viewer.tokens else {
        if server_tokens.has_tenants() {
            anyhow::bail!(
                "--viewer on a server with tenants needs --viewer-tokens FILE (lines 'TOKEN TENANT'): each tenant's viewer sees only its own sessions"
            );
        }
        if !server_tokens.is_empty() {
            // Its sessions are behind a token: so is their view.
            anyhow::bail!(
                "--viewer on a server with --auth-token-file needs --viewer-tokens FILE (a token of its own, 16 characters at least): without one, anyone who reaches the viewer would see the sessions the token guards"
            );
        }
        if !addr.ip().is_loopback() {
            anyhow::bail!(
                "--viewer {addr} is not a loopback address: give --viewer-tokens FILE, or listen on 127.0.0.1"
            );
        }
        return Ok(None);
    };
    // Cookies are not kept apart by port (docs/security.md): where an
    // agent can serve on the viewer's host, another tenant's person must
    // log in only under a name of the viewer's own behind TLS.
    let agents_serve = settings.sandbox.network == crate::sandbox::Network::On
        || settings.sandbox.mode == crate::sandbox::SandboxMode::Off;
    if server_tokens.has_tenants()
        && agents_serve
        && !settings
            .viewer
            .allow_hosts
            .iter()
            .any(|h| h.trim().starts_with("https://"))
    {
        anyhow::bail!(
            "--viewer with tenants and --network on (or --sandbox off): an agent's web server on this host could be sent another tenant's viewer cookie; serve the viewer behind TLS under a name of its own (--viewer-allow-host https://NAME: cookies are then set only there), or keep --network off"
        );
    }
    read_tokens(file, server_tokens).map(Some)
}

/// `--viewer-tokens` read and checked (at start and on SIGHUP).
fn read_tokens(file: &std::path::Path, server_tokens: &TokenTable) -> anyhow::Result<TokenTable> {
    let tokens = TokenTable::read(file).map_err(|e| anyhow::anyhow!("--viewer-tokens {e}"))?;
    tokens
        .check_min_len()
        .map_err(|e| anyhow::anyhow!("--viewer-tokens {}: {e}", file.display()))?;
    if tokens.has_tenants() != server_tokens.has_tenants() {
        anyhow::bail!(
            "--viewer-tokens {}: name tenants ('TOKEN TENANT' lines) exactly when the server has tenants (--auth-token-file)",
            file.display()
        );
    }
    if tokens.shares_a_token_with(server_tokens) {
        tracing::warn!(
            "--viewer-tokens {}: a viewer token is also an MCP token; a browser's login form is no place for an MCP token, give the viewer tokens of its own",
            file.display()
        );
    }
    Ok(tokens)
}

/// Binds `--viewer` (after `check`).
pub async fn bind(
    settings: &Settings,
    tokens: Option<TokenTable>,
) -> anyhow::Result<Option<Bound>> {
    let Some(addr) = settings.viewer.addr else {
        return Ok(None);
    };
    let listener =
        crate::serve::bind::listen("--viewer", addr, "--viewer ADDR (port 0 picks a free one)")
            .await?;
    let local = listener.local_addr()?;
    let rules = hosts::Rules::new(local, &settings.viewer.allow_hosts)
        .map_err(|e| anyhow::anyhow!("--viewer-allow-host {e}"))?;
    Ok(Some(Bound {
        listener,
        access: auth::Access::new(tokens, settings.viewer.tokens.clone()),
        url: rules.url(),
        local: (!settings.viewer.allow_hosts.is_empty()).then_some(local),
        rules,
    }))
}

/// The URL `doctor` shows for `--viewer ADDR` (port 0 as it is).
pub fn url_for(settings: &Settings, addr: SocketAddr) -> String {
    hosts::Rules::new(addr, &settings.viewer.allow_hosts)
        .map(|r| r.url())
        .unwrap_or_else(|_| format!("http://{addr}/"))
}

impl Bound {
    /// What the person reads on stderr: the URL, and with viewer tokens a
    /// one-time login link per tenant (never a token).
    pub fn announce(&self) -> anyhow::Result<String> {
        let on = self
            .local
            .map(|l| format!(" (served on {l})"))
            .unwrap_or_default();
        if !self.access.needs_login() {
            return Ok(format!("ferrepl viewer: {}{on}\n", self.url));
        }
        let mut out = format!(
            "ferrepl viewer: {}{on} (log in with a viewer token, or open a link below once, within {} minutes)\n",
            self.url,
            TICKET_TTL.as_secs() / 60
        );
        for tenant in self.access.tenants() {
            let ticket = self.access.ticket(&tenant).context("no random ticket")?;
            let who = match &tenant {
                Tenant::Sole => String::new(),
                Tenant::Named(n) => format!(" (tenant {n})"),
            };
            out.push_str(&format!("  {}login?ticket={ticket}{who}\n", self.url));
        }
        Ok(out)
    }

    /// Serves the viewer until shutdown; the handle reloads its tokens.
    pub fn spawn(
        self,
        settings: &Settings,
        instance: Arc<Instance>,
        shutdown: CancellationToken,
    ) -> Arc<Viewer> {
        let max_clients = settings.viewer.max_clients.max(1);
        let mut bounds = instance.base().settings.http.clone();
        // A page, its script and style, the API and an event stream each.
        bounds.max_connections = max_clients * 4 + 8;
        // A browser that stops reading (a sleeping laptop) lets its
        // connection go sooner than an MCP client would.
        bounds.write_timeout = bounds.write_timeout.min(std::time::Duration::from_secs(20));
        let viewer = Arc::new(Viewer {
            instance,
            access: self.access,
            rules: self.rules,
            streams: Arc::new(tokio::sync::Semaphore::new(max_clients)),
            max_clients,
            held: Arc::new(Mutex::new(HashMap::new())),
            shutdown: shutdown.clone(),
        });
        let router = routes::router(viewer.clone());
        tracing::info!("viewer on {}", self.url);
        tokio::spawn(crate::serve::listener::serve(
            self.listener,
            router,
            bounds,
            shutdown,
        ));
        viewer
    }
}

pub struct Viewer {
    instance: Arc<Instance>,
    access: auth::Access,
    rules: hosts::Rules,
    /// One permit per live event stream (--viewer-max-clients).
    streams: Arc<tokio::sync::Semaphore>,
    max_clients: usize,
    /// Live streams per tenant (an entry only while it holds one).
    held: Arc<Mutex<HashMap<Tenant, usize>>>,
    shutdown: CancellationToken,
}

/// A live stream's place: a permit, the tenant's count, and the signal
/// that ends it when its tenant's logins end.
pub(crate) struct StreamSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    held: Arc<Mutex<HashMap<Tenant, usize>>>,
    tenant: Tenant,
    pub ended: CancellationToken,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

/// A tenant's share of `total` when there are `tenants`: half, at least 1
/// (the server's other fair shares, `config::settings::Shares`).
fn share(total: usize, tenants: usize) -> usize {
    if tenants > 1 {
        (total / 2).max(1)
    } else {
        total
    }
}

impl Viewer {
    /// The tenant's parts if it has started (a viewer never starts one).
    fn app(&self, tenant: &Tenant) -> Option<Arc<TenantApp>> {
        self.instance
            .live()
            .into_iter()
            .find(|a| &a.tenant == tenant)
    }

    /// Whether the server still serves `tenant` (its MCP tokens were not
    /// all removed).
    fn serves(&self, tenant: &Tenant) -> bool {
        matches!(tenant, Tenant::Sole) || self.instance.tokens().has(tenant)
    }

    /// The logged-in tenant of a request, if the server still serves it.
    fn tenant_of(&self, headers: &axum::http::HeaderMap) -> Option<Tenant> {
        self.access.tenant_of(headers).filter(|t| self.serves(t))
    }

    /// A place for one more live stream of `tenant`, logged in by the
    /// request's cookie (`headers`): its login must still hold (401
    /// otherwise), then its share, then the instance's
    /// --viewer-max-clients (503; the refusal says which). The stream ends
    /// when that login does.
    pub(crate) fn admit(
        &self,
        tenant: &Tenant,
        headers: &axum::http::HeaderMap,
    ) -> Result<StreamSlot, (axum::http::StatusCode, String)> {
        use axum::http::StatusCode;
        let Some(ended) = self.access.ended(headers, tenant, |t| self.serves(t)) else {
            return Err((StatusCode::UNAUTHORIZED, "log in first: /login\n".into()));
        };
        let share = share(self.max_clients, self.access.tenants().len());
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mine = held.get(tenant).copied().unwrap_or(0);
        if mine >= share {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "this tenant's live views are at its share ({share} of --viewer-max-clients {}); close one of its tabs\n",
                    self.max_clients
                ),
            ));
        }
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "too many live views are open (--viewer-max-clients {}); close a tab or try later\n",
                    self.max_clients
                ),
            ));
        };
        *held.entry(tenant.clone()).or_insert(0) += 1;
        Ok(StreamSlot {
            _permit: permit,
            held: self.held.clone(),
            tenant: tenant.clone(),
            ended,
        })
    }

    /// The viewer tokens as they are now (secrets to redact).
    pub fn token_secrets(&self) -> Vec<String> {
        self.access.token_secrets()
    }

    /// SIGHUP, after the server's tokens: `--viewer-tokens` again (kept as
    /// they were when they cannot be read), then the logins that no longer
    /// hold end (a token gone or moved to another tenant, a ticket's
    /// tenant whose tokens changed, a tenant gone or revoked on the
    /// server), and the streams opened with them.
    pub fn reload(&self) {
        match self
            .access
            .reload(|file| read_tokens(file, &self.instance.tokens()))
        {
            Ok(Some(file)) => {
                tracing::info!("SIGHUP: viewer tokens reloaded from {}", file.display())
            }
            Ok(None) => {}
            Err(e) => tracing::error!(
                "SIGHUP: the viewer tokens were not reloaded (the previous ones stay): {e:#}"
            ),
        }
        let ended = self.access.end_logins(|t| self.serves(t));
        for (tenant, n) in ended {
            tracing::info!(
                tenant = tenant.name(),
                "SIGHUP: {n} viewer login(s) of tenant '{}' ended",
                tenant.name()
            );
        }
    }
}

/// A session name or job id as the tools accept them (nothing else is
/// looked up; never a path, so never only dots).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.bytes().all(|b| b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_never_paths() {
        assert!(valid_name("default-1.x") && valid_name("a..b") && valid_name(".x"));
        assert!(!valid_name("a/b") && !valid_name("") && !valid_name("%2e"));
        for dots in [".", "..", "..."] {
            assert!(!valid_name(dots), "{dots}");
        }
    }

    #[test]
    fn with_several_tenants_each_gets_half_at_least_one() {
        assert_eq!(share(16, 1), 16);
        assert_eq!(share(16, 3), 8);
        assert_eq!(share(1, 2), 1);
        assert_eq!(share(3, 2), 1);
    }
}
