//! The viewer's routes: static pages (no data in them), JSON, event
//! streams, a cell's full output as plain text, images checked to be PNG
//! or JPEG, the notebook download, the login and the icon. Every response
//! carries a strict CSP and nosniff; the Host and Origin rules are the
//! viewer's own (`hosts`); only GET (and the login's POST) is served.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, DefaultBodyLimit, Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::{Viewer, auth, feed, valid_name};
use crate::config::tokens::Tenant;
use crate::output::log::{LogReader, Piece};

const INDEX: &str = include_str!("pages/index.html");
const SESSION: &str = include_str!("pages/session.html");
const JOB: &str = include_str!("pages/job.html");
const LOGIN: &str = include_str!("pages/login.html");
const CSS: &str = include_str!("pages/viewer.css");
const JS: &str = include_str!("pages/viewer.js");
/// Served without a login: it is the same for everyone and tells nothing.
const FAVICON: &str = include_str!("pages/favicon.svg");

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";
/// The login page's form posts to itself.
const LOGIN_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

pub(super) fn router(viewer: Arc<Viewer>) -> Router {
    let open = Router::new()
        .route(
            "/viewer.css",
            get(|| async { asset("text/css; charset=utf-8", CSS) }),
        )
        .route(
            "/viewer.js",
            get(|| async { asset("text/javascript; charset=utf-8", JS) }),
        )
        .route(
            "/favicon.svg",
            get(|| async { asset("image/svg+xml", FAVICON) }),
        )
        .route("/login", get(login_page).post(login_form))
        .layer(DefaultBodyLimit::max(4096));
    let private = Router::new()
        .route("/", get(|| async { page(INDEX) }))
        .route("/s/{name}", get(session_page))
        .route("/api/sessions", get(sessions))
        .route("/api/s/{name}", get(branch))
        .route("/events", get(feed::index))
        .route("/events/s/{name}", get(feed::session))
        .route("/s/{name}/cell/{cell}/output.txt", get(cell_text))
        .route("/s/{name}/cell/{cell}/image/{index}", get(image))
        .route("/s/{name}/export.ipynb", get(export))
        .route("/j/{id}", get(job_page))
        .route("/events/j/{id}", get(feed::job))
        .route("/j/{id}/output.txt", get(job_text))
        .layer(middleware::from_fn_with_state(
            viewer.clone(),
            require_login,
        ));
    open.merge(private)
        .layer(middleware::from_fn_with_state(
            viewer.clone(),
            check_request,
        ))
        .layer(middleware::from_fn(security_headers))
        .with_state(viewer)
}

/// Host and Origin by the viewer's own rules (`hosts`); a POST must come
/// from a page of ours (its Origin is required); nothing but GET and that
/// POST.
async fn check_request(State(viewer): State<Arc<Viewer>>, req: Request, next: Next) -> Response {
    if let Some(refusal) = viewer.rules.refuse(req.headers()) {
        return text(StatusCode::FORBIDDEN, refusal);
    }
    let method = req.method().clone();
    if method == Method::POST && !req.headers().contains_key(header::ORIGIN) {
        return text(
            StatusCode::FORBIDDEN,
            "a login form comes with its Origin\n",
        );
    }
    if method != Method::GET && method != Method::HEAD && method != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "the viewer is read-only\n");
    }
    next.run(req).await
}

/// The authenticated tenant, as an extension; a page without a login goes
/// to the login, anything else gets 401. An event stream takes a place in
/// its tenant's share of the live views, and ends when its tenant's
/// logins end (a tenant revoked, or gone from the viewer tokens).
async fn require_login(
    State(viewer): State<Arc<Viewer>>,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    match viewer.tenant_of(req.headers()) {
        Some(tenant) if path.starts_with("/events") => match viewer.admit(&tenant, req.headers()) {
            Ok(slot) => {
                req.extensions_mut().insert(tenant);
                until_ended(next.run(req).await, slot)
            }
            Err((status, why)) => text(status, &why),
        },
        Some(tenant) => {
            req.extensions_mut().insert(tenant);
            next.run(req).await
        }
        None if path == "/"
            || (path.starts_with("/s/") || path.starts_with("/j/")) && !path[3..].contains('/') =>
        {
            (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response()
        }
        None => text(StatusCode::UNAUTHORIZED, "log in first: /login\n"),
    }
}

/// The response's body while `slot` is held: it ends when the tenant's
/// logins end, and the slot goes when the body does.
fn until_ended(res: Response, slot: super::StreamSlot) -> Response {
    use futures::StreamExt;
    let (parts, body) = res.into_parts();
    let data = body.into_data_stream();
    let body = futures::stream::unfold((data, slot), |(mut data, slot)| async move {
        let ended = slot.ended.clone();
        tokio::select! {
            () = ended.cancelled() => None,
            item = data.next() => item.map(|item| (item, (data, slot))),
        }
    });
    Response::from_parts(parts, axum::body::Body::from_stream(body))
}

async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    res
}

pub(super) fn text(status: StatusCode, body: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.to_string(),
    )
        .into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn page(body: &'static str) -> Response {
    asset("text/html; charset=utf-8", body)
}

fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "not found\n")
}

async fn session_page(Path(name): Path<String>) -> Response {
    if !valid_name(&name) {
        return not_found();
    }
    page(SESSION)
}

async fn job_page(Path(id): Path<String>) -> Response {
    if !valid_name(&id) {
        return not_found();
    }
    page(JOB)
}

#[derive(Deserialize)]
struct LoginQuery {
    ticket: Option<String>,
}

/// With a ticket: the login, once; without: the form. On a loopback
/// literal (127.0.0.1, localhost), whose cookies every loopback port gets,
/// the login is on `ferrepl-viewer.localhost` instead.
async fn login_page(
    State(viewer): State<Arc<Viewer>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req_headers: HeaderMap,
    uri: Uri,
    Query(q): Query<LoginQuery>,
) -> Response {
    let Some(secure) = cookie_host(&viewer, &req_headers) else {
        return elsewhere(&viewer, &uri);
    };
    let Some(ticket) = q.ticket else {
        let mut res = page(LOGIN);
        res.headers_mut().insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(LOGIN_CSP),
        );
        return res;
    };
    log_in(&viewer, peer.ip(), secure, Some(&ticket), None)
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login_form(
    State(viewer): State<Arc<Viewer>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req_headers: HeaderMap,
    uri: Uri,
    Form(form): Form<LoginForm>,
) -> Response {
    match cookie_host(&viewer, &req_headers) {
        Some(secure) => log_in(&viewer, peer.ip(), secure, None, Some(&form.token)),
        None => elsewhere(&viewer, &uri),
    }
}

/// Some(Secure or not) when a cookie may be set for the request's Host.
fn cookie_host(viewer: &Viewer, req_headers: &HeaderMap) -> Option<bool> {
    viewer
        .rules
        .host_of(req_headers)
        .filter(|m| m.cookie)
        .map(|m| m.https)
}

/// The redirect to the viewer's own name (never a cookie).
fn elsewhere(viewer: &Viewer, uri: &Uri) -> Response {
    let login = match uri.query() {
        Some(q) => format!("/login?{q}"),
        None => "/login".to_string(),
    };
    match viewer.rules.elsewhere(&login) {
        Some(to) => (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response(),
        None => text(StatusCode::FORBIDDEN, "no login on this Host\n"),
    }
}

/// A login by ticket or token. A ticket (256 random bits, single use) is
/// tried before any throttle; a token only unless the peer failed too
/// often lately (or everyone did, and so did the peer): then 429 with
/// Retry-After.
fn log_in(
    viewer: &Viewer,
    peer: IpAddr,
    secure: bool,
    ticket: Option<&str>,
    token: Option<&str>,
) -> Response {
    let now = std::time::Instant::now();
    let throttle = &viewer.access.throttle;
    let serves = |t: &crate::config::tokens::Tenant| viewer.serves(t);
    let login = match ticket {
        Some(ticket) => viewer.access.login(Some(ticket), None, serves),
        None => match throttle.check(peer, now) {
            Err(wait) => return too_many(wait),
            Ok(()) => viewer.access.login(None, token, serves),
        },
    };
    match login {
        Some(id) => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, "/".to_string()),
                (header::SET_COOKIE, auth::Access::set_cookie(&id, secure)),
            ],
        )
            .into_response(),
        None => {
            let waits = throttle.check(peer, now);
            throttle.fail(peer, now);
            match waits {
                Err(wait) => too_many(wait),
                Ok(()) => text(
                    StatusCode::FORBIDDEN,
                    "this ticket or token is not valid (a ticket works once, for a few minutes)\n",
                ),
            }
        }
    }
}

fn too_many(wait: Duration) -> Response {
    let secs = wait.as_secs().max(1);
    (
        StatusCode::TOO_MANY_REQUESTS,
        [
            (header::RETRY_AFTER, secs.to_string()),
            (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_string()),
        ],
        format!(
            "too many failed logins; try again in {secs} s with the viewer token you were given, or a link printed at start\n"
        ),
    )
        .into_response()
}

/// Bytes of a job's command the list shows (its page shows more).
const LIST_COMMAND_BYTES: usize = 1024;

/// A job's row as JSON, its command cut to `max` bytes (`command_cut`:
/// how many more there are).
pub(super) fn job_row(job: crate::jobs::JobInfo, max: usize) -> serde_json::Value {
    let mut row = serde_json::to_value(&job).unwrap_or_default();
    let (shown, cut) = crate::session::view::capped_to(&job.state.command, max);
    row["command"] = shown.into();
    if let Some(cut) = cut {
        row["command_cut"] = cut.into();
    }
    row
}

/// The sessions and jobs of the caller's tenant, as JSON.
pub(super) fn listing(viewer: &Viewer, tenant: &Tenant) -> serde_json::Value {
    let (sessions, jobs) = match viewer.app(tenant) {
        Some(app) => (
            serde_json::to_value(app.manager.list()).unwrap_or_default(),
            app.jobs
                .list()
                .into_iter()
                .map(|j| job_row(j, LIST_COMMAND_BYTES))
                .collect(),
        ),
        None => (serde_json::json!([]), serde_json::json!([])),
    };
    serde_json::json!({"tenant": tenant.name(), "sessions": sessions, "jobs": jobs})
}

async fn sessions(
    State(viewer): State<Arc<Viewer>>,
    axum::Extension(tenant): axum::Extension<Tenant>,
) -> Response {
    axum::Json(listing(&viewer, &tenant)).into_response()
}

#[derive(Deserialize)]
pub(super) struct BranchQuery {
    pub head: Option<u64>,
    #[serde(default)]
    pub after: u64,
    pub limit: Option<usize>,
}

async fn branch(
    State(viewer): State<Arc<Viewer>>,
    axum::Extension(tenant): axum::Extension<Tenant>,
    Path(name): Path<String>,
    Query(q): Query<BranchQuery>,
) -> Response {
    let Some(app) = viewer.app(&tenant).filter(|_| valid_name(&name)) else {
        return not_found();
    };
    let limit = q.limit.unwrap_or(feed::PAGE).clamp(1, feed::PAGE);
    match app.manager.view_branch(&name, q.head, q.after, limit) {
        Some(view) => axum::Json(view).into_response(),
        None => not_found(),
    }
}

/// Bytes of full output read and sent at a time.
const CHUNK: usize = 64 * 1024;
/// A reader that takes no chunk for this long is dropped.
const SEND_DEADLINE: Duration = Duration::from_secs(5);

/// Agent-written text, never rendered: text/plain with nosniff (see
/// [`chunked`]).
fn plain(pieces: Vec<Piece>) -> Response {
    let mut res = chunked(pieces);
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("inline"),
    );
    res
}

/// A body read from `pieces` a chunk at a time off every lock (blocking
/// reads on the blocking pool). A browser that stops reading holds nothing
/// for long: a chunk it does not take within [`SEND_DEADLINE`] ends the
/// response with an error (the connection is closed, not left looking
/// complete).
fn chunked(pieces: Vec<Piece>) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(2);
    let finished = Arc::new(AtomicBool::new(false));
    let done = finished.clone();
    tokio::spawn(async move {
        let mut reader = LogReader::new(pieces);
        loop {
            let read = tokio::task::spawn_blocking(move || {
                let chunk = reader.next_chunk(CHUNK);
                (reader, chunk)
            })
            .await;
            let Ok((back, chunk)) = read else {
                return;
            };
            reader = back;
            let Some(chunk) = chunk else {
                done.store(true, Ordering::Release);
                return;
            };
            if tx
                .send_timeout(Bytes::from(chunk), SEND_DEADLINE)
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let body = futures::stream::unfold((rx, finished), |(mut rx, finished)| async move {
        match rx.recv().await {
            Some(b) => Some((Ok(b), (rx, finished))),
            None if finished.load(Ordering::Acquire) => None,
            None => Some((
                Err(std::io::Error::other("the reader stalled")),
                (rx, finished),
            )),
        }
    });
    // After an error the stream is not polled again.
    Body::from_stream(body).into_response()
}

async fn cell_text(
    State(viewer): State<Arc<Viewer>>,
    axum::Extension(tenant): axum::Extension<Tenant>,
    Path((name, cell)): Path<(String, u64)>,
) -> Response {
    let Some(app) = viewer.app(&tenant).filter(|_| valid_name(&name)) else {
        return not_found();
    };
    match app.manager.view_cell_text(&name, cell) {
        Some(pieces) => plain(pieces),
        None => text(
            StatusCode::NOT_FOUND,
            "this cell's full output is no longer kept (--output-keep-cells)\n",
        ),
    }
}

async fn image(
    State(viewer): State<Arc<Viewer>>,
    axum::Extension(tenant): axum::Extension<Tenant>,
    Path((name, cell, index)): Path<(String, u64, usize)>,
) -> Response {
    let Some(app) = viewer.app(&tenant).filter(|_| valid_name(&name)) else {
        return not_found();
    };
    let Some((_, data)) = app.manager.view_image(&name, cell, index) else {
        return not_found();
    };
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data.as_bytes()) else {
        return text(StatusCode::UNSUPPORTED_MEDIA_TYPE, "not an image\n");
    };
    match crate::output::image::image_type(&bytes) {
        Some(mime) => ([(header::CONTENT_TYPE, mime)], bytes).into_response(),
        None => text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "only PNG and JPEG images are shown\n",
        ),
    }
}

#[derive(Deserialize)]
struct ExportQuery {
    head: Option<u64>,
}

/// The notebook of the branch shown (`?head=N`, default the current one).
async fn export(
    State(viewer): State<Arc<Viewer>>,
    axum::Extension(tenant): axum::Extension<Tenant>,
    Path(name): Path<String>,
    Query(q): Query<ExportQuery>,
) -> Response {
    let Some(app) = viewer.app(&tenant).filter(|_| valid_name(&name)) else {
        return not_found();
    };
    let file = match q.head {
        Some(head) => format!("{name}-cell{head}.ipynb"),
        None => format!("{name}.ipynb"),
    };
    match app.manager.view_export(&name, q.head) {
        Some(doc) => {
            // Sent like full output: a reader that stalls is let go.
            let len = doc.len();
            let mut res = chunked(vec![Piece::Bytes(doc.into_bytes())]);
            let h = res.headers_mut();
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ipynb+json"),
            );
            if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{file}\"")) {
                h.insert(header::CONTENT_DISPOSITION, v);
            }
            res
        }
        None => not_found(),
    }
}

async fn job_text(
    State(viewer): State<Arc<Viewer>>,
    axum::Extension(tenant): axum::Extension<Tenant>,
    Path(id): Path<String>,
) -> Response {
    let Some(app) = viewer.app(&tenant).filter(|_| valid_name(&id)) else {
        return not_found();
    };
    match app.jobs.view(&id) {
        Some(job) => plain(job.output_pieces()),
        None => not_found(),
    }
}
