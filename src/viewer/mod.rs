//! `--viewer`: a live, read-only view of the sessions for a person's
//! browser, on a listener of its own (the MCP listener's bounded accept
//! loop, `mcp::transport::listener`, and its Host/Origin rules). The pages
//! are static (embedded HTML, CSS and JS that hold no data); the data comes
//! as JSON and server-sent events, which the page turns into text nodes
//! only: everything shown is written by the agent. Nothing here changes a
//! session (see `session::view`).

mod auth;
mod feed;
mod routes;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::config::tokens::{Tenant, TokenTable};
use crate::tenants::{Instance, TenantApp};

pub use auth::TICKET_TTL;

/// The viewer's listener, bound before anything starts, and who may look.
pub struct Bound {
    listener: tokio::net::TcpListener,
    access: auth::Access,
    pub url: String,
}

/// Refusals from the flags alone: a viewer off loopback or on a server with
/// tenants needs `--viewer-tokens`, whose tenants must be of the server's kind.
pub fn check(cfg: &Config, server_tokens: &TokenTable) -> anyhow::Result<Option<TokenTable>> {
    let Some(addr) = cfg.viewer else {
        return Ok(None);
    };
    let Some(file) = &cfg.viewer_tokens else {
        if server_tokens.has_tenants() {
            anyhow::bail!(
                "--viewer on a server with tenants needs --viewer-tokens FILE (lines 'TOKEN TENANT'): each tenant's viewer sees only its own sessions"
            );
        }
        if !addr.ip().is_loopback() {
            anyhow::bail!(
                "--viewer {addr} is not a loopback address: give --viewer-tokens FILE, or listen on 127.0.0.1"
            );
        }
        return Ok(None);
    };
    let tokens = TokenTable::read(file).map_err(|e| anyhow::anyhow!("--viewer-tokens {e}"))?;
    if tokens.has_tenants() != server_tokens.has_tenants() {
        anyhow::bail!(
            "--viewer-tokens {}: name tenants ('TOKEN TENANT' lines) exactly when the server has tenants (--auth-token-file)",
            file.display()
        );
    }
    Ok(Some(tokens))
}

/// Binds `--viewer` (after `check`).
pub async fn bind(cfg: &Config, tokens: Option<TokenTable>) -> anyhow::Result<Option<Bound>> {
    let Some(addr) = cfg.viewer else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--viewer: cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    Ok(Some(Bound {
        listener,
        access: auth::Access::new(tokens),
        url: url_of(local),
    }))
}

/// The address a person opens (a wildcard address as loopback).
fn url_of(local: SocketAddr) -> String {
    let ip = match local.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        ip => ip.to_string(),
    };
    format!("http://{ip}:{}/", local.port())
}

impl Bound {
    /// What the person reads on stderr: the URL, and with viewer tokens a
    /// one-time login link per tenant (never a token).
    pub fn announce(&self) -> anyhow::Result<String> {
        if !self.access.needs_login() {
            return Ok(format!("ferrepl viewer: {}\n", self.url));
        }
        let mut out = format!(
            "ferrepl viewer: {} (log in with a viewer token, or open a link below once, within {} minutes)\n",
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

    /// Serves the viewer until shutdown.
    pub fn spawn(self, cfg: &Config, instance: Arc<Instance>, shutdown: CancellationToken) {
        let max_clients = cfg.viewer_max_clients.max(1);
        let mut bounds = instance.base().settings.http;
        // A page, its script and style, the API and an event stream each.
        bounds.max_connections = max_clients * 4 + 8;
        let viewer = Arc::new(Viewer {
            instance,
            access: self.access,
            rules: crate::mcp::transport::probes::OriginRules::new(cfg),
            streams: Arc::new(tokio::sync::Semaphore::new(max_clients)),
            shutdown: shutdown.clone(),
        });
        let router = routes::router(viewer);
        tracing::info!("viewer on {}", self.url);
        tokio::spawn(crate::mcp::transport::listener::serve(
            self.listener,
            router,
            bounds,
            shutdown,
        ));
    }
}

pub(crate) struct Viewer {
    instance: Arc<Instance>,
    access: auth::Access,
    rules: crate::mcp::transport::probes::OriginRules,
    /// One permit per live event stream (--viewer-max-clients).
    streams: Arc<tokio::sync::Semaphore>,
    shutdown: CancellationToken,
}

impl Viewer {
    /// The tenant's parts if it has started (a viewer never starts one).
    fn app(&self, tenant: &Tenant) -> Option<Arc<TenantApp>> {
        self.instance
            .live()
            .into_iter()
            .find(|a| &a.tenant == tenant)
    }
}

/// A session name or job id as the tools accept them (nothing else is
/// looked up; never a path).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_reachable_address() {
        assert_eq!(
            url_of("0.0.0.0:80".parse().expect("addr")),
            "http://127.0.0.1:80/"
        );
        assert_eq!(url_of("[::1]:8".parse().expect("addr")), "http://[::1]:8/");
        assert!(valid_name("default-1.x"));
        assert!(!valid_name("a/b") && !valid_name("") && !valid_name("%2e"));
    }
}
