//! Streamable HTTP transport: loopback by default, Host and Origin
//! validated, bearer tokens deciding the tenant, TCP_NODELAY on every
//! connection. `/mcp` serves the token's tenant, `/t/<tenant>/mcp` the same
//! when the path names it (a router hashes on the path); `/healthz`,
//! `/readyz` and `/metrics` follow the same rules here, and are served
//! without them on `--metrics-addr`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use rmcp::transport::streamable_http_server::session::SessionId;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::budgets::{FrontDoor, Principal};
use super::listener::{ClientAddr, Connection};
use super::probes;
use crate::config::settings::Settings;
use crate::mcp::server::FerreplServer;
use crate::session::DEFAULT_SESSION;
use crate::tenants::{Instance, Tenant};

type McpService = StreamableHttpService<FerreplServer, LocalSessionManager>;

mod body;
use body::{closing, meter_body, share_refusal};

/// A tenant's MCP endpoint and its transport sessions (a tenant's
/// `Mcp-Session-Id` means nothing to another tenant's endpoint).
#[derive(Clone)]
struct Endpoint {
    service: McpService,
    /// For requests of the stateless protocol (no connection).
    stateless: McpService,
    sessions: Arc<LocalSessionManager>,
    /// Held by one initialize at a time (see `admit_connection`).
    initializing: Arc<tokio::sync::Mutex<()>>,
}

pub(super) struct HttpState {
    pub(super) instance: Arc<Instance>,
    endpoints: Mutex<HashMap<Tenant, Endpoint>>,
    config: StreamableHttpServerConfig,
    per_client: bool,
    /// An MCP connection with no request for this long ends (--http-session-idle).
    session_idle: std::time::Duration,
    /// How long a per-client session outlives its client (--client-grace).
    client_grace: std::time::Duration,
    /// Transport sessions one tenant may hold open (--max-connections).
    max_connections: usize,
    pub(super) origin_rules: probes::OriginRules,
    /// What each principal holds of the front door.
    door: Arc<FrontDoor>,
}

/// The listening sockets of `--http` and `--metrics-addr`, bound once the
/// start-up checks have passed and before any session starts: an address
/// in use is refused with nothing started.
pub struct Listeners {
    main: tokio::net::TcpListener,
    metrics: Option<tokio::net::TcpListener>,
}

impl Listeners {
    pub async fn bind(addr: SocketAddr, settings: &Settings) -> anyhow::Result<Self> {
        let main = super::bind::listen("--http", addr, "--http PORT").await?;
        let metrics = match settings.serving.metrics_addr {
            Some(at) => {
                Some(super::bind::listen("--metrics-addr", at, "--metrics-addr ADDR").await?)
            }
            None => None,
        };
        Ok(Self { main, metrics })
    }
}

pub async fn serve(
    listeners: Listeners,
    settings: &Settings,
    instance: Arc<Instance>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Listeners {
        main: listener,
        metrics,
    } = listeners;
    let local = listener.local_addr()?;
    // Checked before anything started (startup::preflight); again here, as
    // the last word before the socket is served.
    crate::startup::preflight::exposure(local, instance.needs_token())?;
    let origin_rules = probes::OriginRules::new(settings);
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(origin_rules.hosts.clone())
        .with_allowed_origins(origin_rules.origins.clone())
        .with_max_request_body_bytes(settings.serving.max_request_bytes)
        .with_cancellation_token(transport_stop(&instance, &shutdown));
    let state = Arc::new(HttpState {
        instance: instance.clone(),
        endpoints: Mutex::new(HashMap::new()),
        config,
        per_client: settings.serving.per_client,
        session_idle: settings.serving.session_idle,
        client_grace: settings.serving.client_grace,
        max_connections: settings.serving.max_streams,
        origin_rules,
        door: FrontDoor::new(&instance.base().settings.http),
    });
    end_revoked_connections(&instance, &state.door, &shutdown);
    let router = Router::new()
        .route("/mcp", any(mcp_of_token))
        .route("/t/{tenant}/mcp", any(mcp_of_path))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics_of_caller))
        .layer(middleware::from_fn(super::json_reply::prefer_json_replies))
        .layer(middleware::from_fn_with_state(state.clone(), meter_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            probes::check_host_and_origin,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state.clone());

    if let Some(metrics) = metrics {
        serve_open_probes(metrics, state.clone(), shutdown.clone())?;
    }

    tracing::info!("listening on http://{local}/mcp");
    let bounds = instance.base().settings.http.clone();
    let server = super::listener::serve(listener, router, bounds, shutdown.clone());
    tokio::select! {
        () = server => Ok(()),
        _ = async {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!("HTTP connections still open {} s after shutdown began; closing them", SHUTDOWN_GRACE.as_secs());
            Ok(())
        }
    }
}

/// `/healthz`, `/readyz` and `/metrics` on `listener` without token or
/// Host checks (--metrics-addr), until shutdown.
fn serve_open_probes(
    listener: tokio::net::TcpListener,
    state: Arc<HttpState>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!(
        "health and metrics on http://{}/metrics",
        listener.local_addr()?
    );
    // Bounded like the main listener: it is often reachable by more than
    // the monitoring.
    let bounds = state.instance.base().settings.http.clone();
    tokio::spawn(super::listener::serve(
        listener,
        probes::open_router(state),
        bounds,
        shutdown,
    ));
    Ok(())
}

/// After each token reload (SIGHUP), the connections last used with a
/// token that no longer names their tenant are closed, with the streams
/// they carry; the tenant's sessions stay (a replaced token) or are
/// revoked by the instance (a removed tenant).
fn end_revoked_connections(
    instance: &Arc<Instance>,
    door: &Arc<FrontDoor>,
    shutdown: &CancellationToken,
) {
    let (instance, door, shutdown) = (instance.clone(), door.clone(), shutdown.clone());
    let mut reloads = instance.watch_reloads();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = reloads.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let closed = door.revoke(&instance.tokens());
                    if closed > 0 {
                        tracing::info!("SIGHUP: {closed} HTTP connection(s) of revoked or replaced tokens closed");
                    }
                }
            }
        }
    });
}

/// The token that ends rmcp's transport sessions: cancelled once shutdown
/// has begun and every tool call has been answered (bounded), and a moment
/// later, so that an answer on its way out (a drained cell's result) is
/// written before its stream is closed. Until then the listener only stops
/// taking connections.
fn transport_stop(instance: &Arc<Instance>, shutdown: &CancellationToken) -> CancellationToken {
    let stop = CancellationToken::new();
    let (instance, shutdown, token) = (instance.clone(), shutdown.clone(), stop.clone());
    tokio::spawn(async move {
        shutdown.cancelled().await;
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        while instance.calls_in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        tokio::time::sleep(ANSWER_FLUSH).await;
        token.cancel();
    });
    stop
}

/// Time for an answer already made to be written before streams close.
const ANSWER_FLUSH: std::time::Duration = std::time::Duration::from_millis(200);

/// How long open HTTP connections (SSE streams) may delay the exit.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

impl HttpState {
    /// The tenant's endpoint, made (and the tenant started, on a blocking
    /// thread: other tenants' requests go on meanwhile) on first use.
    async fn endpoint(&self, tenant: &Tenant) -> Result<Endpoint, String> {
        if let Some(e) = self.endpoints().get(tenant) {
            return Ok(e.clone());
        }
        let (instance, wanted) = (self.instance.clone(), tenant.clone());
        let app = tokio::task::spawn_blocking(move || instance.tenant(&wanted))
            .await
            .map_err(|e| format!("the tenant's start failed: {e}"))?
            .map_err(|e| format!("{e:#}"))?;
        let mut endpoints = self.endpoints();
        // Another request for this tenant may have made it meanwhile.
        if let Some(e) = endpoints.get(tenant) {
            return Ok(e.clone());
        }
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(self.session_idle);
        let sessions = Arc::new(sessions);
        let shared = {
            let app = app.clone();
            move || Ok(FerreplServer::new(&app.parts, DEFAULT_SESSION.to_string()))
        };
        // Sessions belong to the tenant, not to the connection: a client
        // that reconnects finds its sessions. With per-client, each
        // connection's omitted `session` is its own; a stateless request
        // has no connection, so it gets the shared one.
        let (service, stateless) = if self.per_client {
            let clients = AtomicU64::new(0);
            let grace = self.client_grace;
            let per_connection = move || {
                let n = clients.fetch_add(1, Ordering::Relaxed) + 1;
                Ok(FerreplServer::per_client(&app.parts, n, grace))
            };
            (
                StreamableHttpService::new(per_connection, sessions.clone(), self.config.clone()),
                StreamableHttpService::new(shared, Default::default(), self.config.clone()),
            )
        } else {
            let service = StreamableHttpService::new(shared, sessions.clone(), self.config.clone());
            (service.clone(), service)
        };
        let endpoint = Endpoint {
            service,
            stateless,
            sessions,
            initializing: Default::default(),
        };
        endpoints.insert(tenant.clone(), endpoint.clone());
        Ok(endpoint)
    }

    fn endpoints(&self) -> std::sync::MutexGuard<'_, HashMap<Tenant, Endpoint>> {
        self.endpoints.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn mcp_of_token(State(state): State<Arc<HttpState>>, req: Request) -> Response {
    let Some(tenant) = req.extensions().get::<Tenant>().cloned() else {
        return text(StatusCode::UNAUTHORIZED, "no tenant for this request\n");
    };
    serve_mcp(&state, &tenant, req).await
}

async fn mcp_of_path(
    State(state): State<Arc<HttpState>>,
    Path(named): Path<String>,
    req: Request,
) -> Response {
    let Some(tenant) = req.extensions().get::<Tenant>().cloned() else {
        return text(StatusCode::UNAUTHORIZED, "no tenant for this request\n");
    };
    match &tenant {
        Tenant::Named(n) if *n == named => serve_mcp(&state, &tenant, req).await,
        Tenant::Named(n) => closing(text(
            StatusCode::FORBIDDEN,
            &format!("this token belongs to tenant '{n}', not '{named}'; use /t/{n}/mcp or /mcp\n"),
        )),
        Tenant::Sole => text(
            StatusCode::NOT_FOUND,
            "this server has no tenants (its tokens name none); use /mcp\n",
        ),
    }
}

/// A DELETE of a transport session that does not exist (ended, or never
/// was) gets 404, as the protocol says, so a client knows to start over;
/// rmcp would accept it. A successful DELETE gets 204: rmcp answers 202, which
/// clients (the official Python SDK among them) log as a failed termination.
async fn serve_mcp(state: &HttpState, tenant: &Tenant, req: Request) -> Response {
    let endpoint = match state.endpoint(tenant).await {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(tenant = tenant.name(), "cannot start the tenant: {e}");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "cannot start this tenant's sessions: {e}; retry later or tell the operator\n"
                ),
            );
        }
    };
    let admitted = match admit_connection(state, &endpoint, req).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let (req, service, _turn) = match admitted {
        Admitted::Passed(req) => (req, &endpoint.service, None),
        Admitted::Initialize(req, turn) => (req, &endpoint.service, Some(turn)),
        Admitted::Stateless(req) => (req, &endpoint.stateless, None),
    };
    let is_delete = req.method() == axum::http::Method::DELETE;
    if is_delete
        && let Some(id) = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
    {
        let known = endpoint
            .sessions
            .has_session(&SessionId::from(id.to_string()))
            .await
            .unwrap_or(false);
        if !known {
            return text(
                StatusCode::NOT_FOUND,
                "no such MCP session (it ended or never existed); initialize a new one\n",
            );
        }
    }
    let principal = req.extensions().get::<Principal>().cloned();
    let standalone = req.method() == axum::http::Method::GET;
    if standalone
        && let Some(p) = &principal
        && let Err(share) = state.door.stream_room(p)
    {
        return share_refusal(
            share,
            p,
            "this client holds its share of open event streams (one per MCP connection: --max-connections); close clients you no longer use",
        );
    }
    let mut response = service.handle(req).await.into_response();
    let streaming = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if streaming && let Some(p) = &principal {
        let slot = state.door.stream(p);
        let body = std::mem::take(response.body_mut());
        *response.body_mut() = axum::body::Body::new(Held { body, _slot: slot });
    }
    if is_delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
    }
    response
}

/// A response body that holds its principal's stream slot until it ends.
struct Held {
    body: axum::body::Body,
    _slot: super::budgets::StreamSlot,
}

impl http_body::Body for Held {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// What a request to a tenant's endpoint is, once admitted.
enum Admitted {
    /// In a transport session, or not a JSON POST: rmcp decides.
    Passed(Request),
    /// Opens a transport session: the tenant's initialize turn is held
    /// until rmcp has made it, so parallel ones cannot overshoot the cap.
    Initialize(Request, tokio::sync::OwnedMutexGuard<()>),
    /// A POST of the stateless protocol (no session id, not initialize).
    Stateless(Request),
}

/// An `initialize` (a JSON POST without `Mcp-Session-Id` whose method is
/// initialize) opens a transport session: refused once the tenant holds
/// `--max-connections`. The body is read here (bounded as rmcp bounds it)
/// and handed on.
async fn admit_connection(
    state: &HttpState,
    endpoint: &Endpoint,
    req: Request,
) -> Result<Admitted, Response> {
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if req.method() != axum::http::Method::POST
        || req.headers().contains_key("mcp-session-id")
        || !json
    {
        return Ok(Admitted::Passed(req));
    }
    let (parts, body) = req.into_parts();
    let limit = state.config.max_request_body_bytes;
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return Err(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "the request body is over {limit} bytes (--max-request-bytes) or was cut off\n"
            ),
        ));
    };
    let req = Request::from_parts(parts, axum::body::Body::from(bytes.clone()));
    if !is_initialize(&bytes) {
        return Ok(Admitted::Stateless(req));
    }
    let turn = endpoint.initializing.clone().lock_owned().await;
    let open = endpoint.sessions.sessions.read().await.len();
    if open >= state.max_connections {
        return Err(text(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "{open} MCP connections are open for this tenant, the limit (--max-connections); close clients you no longer use{} and retry\n",
                endpoint
                    .sessions
                    .session_config
                    .keep_alive
                    .map(|idle| format!(
                        " (an idle one ends {} s after its last request)",
                        idle.as_secs()
                    ))
                    .unwrap_or_default()
            ),
        ));
    }
    Ok(Admitted::Initialize(req, turn))
}

/// Whether a JSON-RPC body is an initialize request as rmcp reads it
/// (escapes decoded); a batch holding one counts too, though rmcp refuses
/// batches.
fn is_initialize(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Method {
        method: Option<String>,
    }
    let initialize = |m: &Method| m.method.as_deref() == Some("initialize");
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => serde_json::from_slice::<Vec<Method>>(body)
            .is_ok_and(|batch| batch.iter().any(initialize)),
        _ => serde_json::from_slice::<Method>(body).is_ok_and(|m| initialize(&m)),
    }
}

/// Finds the request's tenant from its bearer token (every request of a
/// server with tokens must have one) and hands it on.
async fn require_token(
    State(state): State<Arc<HttpState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let tokens = state.instance.tokens();
    let client = req.extensions().get::<ClientAddr>().copied();
    let connection = req.extensions().get::<Arc<Connection>>().cloned();
    let (tenant, token, principal) = if tokens.is_empty() {
        // No authentication: the client's address stays the principal.
        let principal = client.map(|c| Principal::Peer(c.0));
        (Tenant::Sole, None, principal)
    } else {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given.and_then(|g| tokens.tenant_of(g.as_bytes()).map(|t| (t.clone(), g))) {
            Some((tenant, g)) => {
                let principal = Principal::Tenant(tenant.clone());
                (tenant, Some(g.to_string()), Some(principal))
            }
            None => {
                return closing(
                    (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "missing or wrong bearer token: send 'Authorization: Bearer <token>' with a token the server was given (--auth-token-file)\n",
                    )
                        .into_response(),
                );
            }
        }
    };
    if let (Some(principal), Some(connection)) = (&principal, &connection) {
        if let Err(share) = state.door.hold(connection, principal, token.as_deref()) {
            return closing(share_refusal(
                share,
                principal,
                "this client holds its share of the server's connections (--tenant-max-http-connections, or --http-max-connections-per-peer without a token); close idle ones",
            ));
        }
        req.extensions_mut().insert(principal.clone());
    }
    req.extensions_mut().insert(tenant);
    next.run(req).await
}

pub(super) fn text(status: StatusCode, body: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::is_initialize;

    #[test]
    fn initialize_is_recognised_as_rmcp_reads_it() {
        assert!(is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#
        ));
        // Escapes are decoded, as rmcp's parser decodes them.
        assert!(is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"\u0069nitialize"}"#
        ));
        assert!(is_initialize(
            br#" [{"method":"ping"},{"method":"initialize"}]"#
        ));
        assert!(!is_initialize(
            br#"{"method":"tools/list","params":{"x":"initialize"}}"#
        ));
        assert!(!is_initialize(b"initialize"));
    }
}
