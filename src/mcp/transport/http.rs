//! Streamable HTTP transport at /mcp: loopback by default, Host and Origin
//! validated, optional bearer token, TCP_NODELAY on every connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use rmcp::transport::streamable_http_server::session::SessionId;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, DefaultSession};
use crate::mcp::server::FerreplServer;
use crate::session::DEFAULT_SESSION;

pub async fn serve(
    addr: SocketAddr,
    cfg: &Config,
    app: crate::mcp::server::AppParts,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let token = cfg.auth_token.clone().filter(|t| !t.is_empty());
    if !addr.ip().is_loopback() && token.is_none() {
        anyhow::bail!(
            "--http {addr} is not a loopback address: anyone on the network could run code. Pass --auth-token-file FILE (or FERREPL_AUTH_TOKEN), or bind 127.0.0.1"
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;

    let config = transport_config(cfg, &shutdown);
    let transport_sessions = Arc::new(LocalSessionManager::default());
    let per_client = cfg.default_session == DefaultSession::PerClient;
    let clients = AtomicU64::new(0);
    let service = StreamableHttpService::new(
        move || {
            // Sessions belong to whoever holds the token, not to the
            // connection: a client that reconnects finds its sessions. With
            // per-client, each connection's omitted `session` is its own.
            let default = if per_client {
                let n = clients.fetch_add(1, Ordering::Relaxed) + 1;
                format!("{DEFAULT_SESSION}-{n}")
            } else {
                DEFAULT_SESSION.to_string()
            };
            Ok(FerreplServer::new(&app, default))
        },
        transport_sessions.clone(),
        config,
    );
    let router = Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn(super::json_reply::prefer_json_replies))
        .layer(middleware::from_fn_with_state(
            transport_sessions,
            session_delete_answers_no_content,
        ))
        .layer(middleware::from_fn_with_state(
            token.map(Arc::new),
            require_token,
        ));

    tracing::info!("listening on http://{local}/mcp");
    let server = axum::serve(
        listener.tap_io(|tcp| {
            // Without it every response waits on delayed ACKs (~40 ms a call).
            let _ = tcp.set_nodelay(true);
        }),
        router,
    )
    .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    tokio::select! {
        r = server => r.context("HTTP server failed"),
        _ = async {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!("HTTP connections still open {} s after shutdown began; closing them", SHUTDOWN_GRACE.as_secs());
            Ok(())
        }
    }
}

/// Loopback names for Host and Origin plus the operator's additions, the
/// request size limit, and shutdown.
fn transport_config(cfg: &Config, shutdown: &CancellationToken) -> StreamableHttpServerConfig {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1", "[::1]"]
        .map(String::from)
        .to_vec();
    hosts.extend(cfg.allow_hosts.iter().cloned());
    let mut origins: Vec<String> = ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
        .map(String::from)
        .to_vec();
    origins.extend(cfg.allow_origins.iter().cloned());
    StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .with_max_request_body_bytes(cfg.max_request_bytes)
        .with_cancellation_token(shutdown.child_token())
}

/// How long open HTTP connections (SSE streams) may delay the exit.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

async fn require_token(
    State(token): State<Option<Arc<String>>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(token) = token else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => next.run(req).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token: send 'Authorization: Bearer <token>' with the token ferrepl was started with (--auth-token)\n",
        )
            .into_response(),
    }
}

/// A DELETE of a transport session that does not exist (ended, or never
/// was) gets 404, as the protocol says, so a client knows to start over;
/// rmcp would accept it. A successful DELETE gets 204: rmcp answers 202, which
/// clients (the official Python SDK among them) log as a failed termination.
async fn session_delete_answers_no_content(
    State(sessions): State<Arc<LocalSessionManager>>,
    req: Request,
    next: Next,
) -> Response {
    let is_delete = req.method() == axum::http::Method::DELETE;
    if is_delete
        && let Some(id) = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
    {
        let known = sessions
            .has_session(&SessionId::from(id.to_string()))
            .await
            .unwrap_or(false);
        if !known {
            return (
                StatusCode::NOT_FOUND,
                "no such MCP session (it ended or never existed); initialize a new one\n",
            )
                .into_response();
        }
    }
    let mut response = next.run(req).await;
    if is_delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
    }
    response
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
