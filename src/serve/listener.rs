//! The HTTP accept loop: every connection is bounded before anyone is
//! authenticated. A connection must finish each request head within the
//! header timeout (counted from its first byte, or from its opening), and
//! one with no request in flight is closed after the idle timeout; a
//! request body must arrive within the header timeout's multiple (a slow
//! body holds nothing for long). Connections are capped in total and, when
//! per peer address (not a trusted proxy's: the address it forwards is the
//! client, see [`ClientAddr`]); past a cap a new connection is answered 503
//! or 429 with Retry-After and closed at once. Each request carries its
//! [`Connection`], which the layers above charge to a principal and close
//! (a revoked token).
//! A response still being sent (an SSE stream, a call in progress) is never
//! cut for taking long, only when the peer stops reading it (the socket's
//! buffer full for the write timeout). HTTP is parsed by hyper; nothing
//! here reads a byte of it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

pub use crate::config::settings::HttpLimits as Bounds;

mod activity;

use activity::{Activity, Deadline, Tracked, Watched};

/// Why a connection was refused or closed, as counted in
/// `ferrepl_http_refusals_total{reason}`.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    MaxConnections,
    PerPeer,
    HeaderTimeout,
    IdleTimeout,
    BodyTimeout,
    WriteTimeout,
}

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::PerPeer => "per_peer",
            Refusal::HeaderTimeout => "header_timeout",
            Refusal::IdleTimeout => "idle_timeout",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::WriteTimeout => "write_timeout",
        }
    }
}

/// The client a request comes from: the peer, or, when the peer is a
/// trusted proxy (`--http-trusted-proxy`), the address it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

/// The connection a request came on: what the layers above attach to it
/// (the principal it is charged to) lives as long as it, and they may close
/// it (a token revoked on SIGHUP).
pub struct Connection {
    pub id: u64,
    close: CancellationToken,
    attached: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

impl Connection {
    /// Ends the connection (and so any stream it carries) at once.
    pub fn close(&self) {
        self.close.cancel();
    }

    /// Whether it was closed.
    pub fn is_closed(&self) -> bool {
        self.close.is_cancelled()
    }

    /// A connection of no socket, whose attachments go when it is dropped.
    #[cfg(test)]
    pub fn for_tests() -> Arc<Connection> {
        Arc::new(Connection {
            id: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            close: CancellationToken::new(),
            attached: Mutex::new(None),
        })
    }

    /// Replaces what is attached (dropping the old one), or returns what
    /// `f` makes of the current one.
    pub fn with_attached<R>(
        &self,
        f: impl FnOnce(&mut Option<Box<dyn std::any::Any + Send>>) -> R,
    ) -> R {
        let mut attached = self.attached.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut attached)
    }
}

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Drops what is attached to a connection when its task ends.
struct Release(Arc<Connection>);

impl Drop for Release {
    fn drop(&mut self) {
        let attached = self.0.with_attached(Option::take);
        drop(attached);
    }
}

/// The client of a request from `peer`: a trusted proxy's forwarded
/// address (the right-most one that is not itself a trusted proxy, from
/// `Forwarded: for=` or `X-Forwarded-For`), else the peer.
pub fn client_addr(
    peer: IpAddr,
    headers: &axum::http::HeaderMap,
    trusted: &[ipnet::IpNet],
) -> IpAddr {
    let is_trusted = |a: &IpAddr| trusted.iter().any(|n| n.contains(a));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut chain: Vec<IpAddr> = Vec::new();
    for value in headers.get_all("forwarded") {
        let Ok(text) = value.to_str() else { continue };
        for element in text.split(',') {
            for pair in element.split(';') {
                let Some((k, v)) = pair.trim().split_once('=') else {
                    continue;
                };
                if k.trim().eq_ignore_ascii_case("for")
                    && let Some(addr) = forwarded_addr(v.trim().trim_matches('"'))
                {
                    chain.push(addr);
                }
            }
        }
    }
    if chain.is_empty() {
        for value in headers.get_all("x-forwarded-for") {
            let Ok(text) = value.to_str() else { continue };
            chain.extend(text.split(',').filter_map(|a| forwarded_addr(a.trim())));
        }
    }
    chain
        .into_iter()
        .rev()
        .find(|a| !is_trusted(a))
        .unwrap_or(peer)
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:5`,
/// `[::1]`, `[::1]:5`, `::1`.
fn forwarded_addr(text: &str) -> Option<IpAddr> {
    if let Ok(a) = text.parse::<IpAddr>() {
        return Some(a);
    }
    if let Ok(sa) = text.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    text.strip_prefix('[')
        .and_then(|t| t.split_once(']'))
        .and_then(|(a, _)| a.parse().ok())
}

/// Counts a refusal and logs it, at most once per reason every 10 s (with
/// how many there were since).
fn refused(reason: Refusal, peer: IpAddr) {
    crate::metrics::http_refusal(reason.as_str());
    static LAST: Mutex<Vec<(&'static str, Instant, u64)>> = Mutex::new(Vec::new());
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    let key = reason.as_str();
    match last.iter_mut().find(|(k, _, _)| *k == key) {
        Some((_, at, count)) if now.duration_since(*at) < Duration::from_secs(10) => *count += 1,
        Some((_, at, count)) => {
            tracing::warn!(
                "HTTP connection refused or closed ({key}) from {peer}; {} more since the last report",
                *count
            );
            *at = now;
            *count = 0;
        }
        None => {
            tracing::warn!("HTTP connection refused or closed ({key}) from {peer}");
            last.push((key, now, 0));
        }
    }
}

/// Open connections, in total and per peer address.
#[derive(Default)]
struct Open {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// A slot in [`Open`], given back on drop.
struct Slot {
    open: Arc<Mutex<Open>>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.per_peer.remove(&self.peer);
            }
        }
    }
}

fn take_slot(open: &Arc<Mutex<Open>>, peer: IpAddr, bounds: &Bounds) -> Result<Slot, Refusal> {
    let mut o = open.lock().unwrap_or_else(|e| e.into_inner());
    if o.total >= bounds.max_connections {
        return Err(Refusal::MaxConnections);
    }
    let mine = o.per_peer.get(&peer).copied().unwrap_or(0);
    let proxy = bounds.trusted_proxies.iter().any(|n| n.contains(&peer));
    if bounds.max_per_peer > 0 && mine >= bounds.max_per_peer && !proxy {
        return Err(Refusal::PerPeer);
    }
    o.total += 1;
    *o.per_peer.entry(peer).or_insert(0) += 1;
    Ok(Slot {
        open: open.clone(),
        peer,
    })
}

/// Serves `router` on `listener` until `shutdown`, then lets the
/// connections finish their responses (the caller bounds how long).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    shutdown: CancellationToken,
) {
    let open = Arc::new(Mutex::new(Open::default()));
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or memory: back off rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let slot = match take_slot(&open, peer.ip(), &bounds) {
            Ok(slot) => slot,
            Err(reason) => {
                refused(reason, peer.ip());
                answer_refusal(&tcp, reason);
                drop(tcp);
                continue;
            }
        };
        // Without it every response waits on delayed ACKs (~40 ms a call).
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let shutdown = shutdown.clone();
        connections.spawn(serve_connection(
            tcp,
            peer,
            router,
            bounds.clone(),
            shutdown,
            slot,
        ));
    }
    connections.close();
    connections.wait().await;
}

/// A connection refused at accept is told why, if its socket takes the
/// few bytes at once (never waited on), then closed.
fn answer_refusal(tcp: &TcpStream, reason: Refusal) {
    let (status, why) = match reason {
        Refusal::PerPeer => (
            "429 Too Many Requests",
            "this address holds its share of connections (--http-max-connections-per-peer)",
        ),
        _ => (
            "503 Service Unavailable",
            "the server holds all the connections it takes (--http-max-connections)",
        ),
    };
    let body = format!("{why}; retry later\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nRetry-After: 5\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tcp.try_write(response.as_bytes());
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    bounds: Bounds,
    shutdown: CancellationToken,
    _slot: Slot,
) {
    let activity = Activity::new();
    let connection = Arc::new(Connection {
        id: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
        close: CancellationToken::new(),
        attached: Mutex::new(None),
    });
    // What is attached goes when the connection does, whoever still holds
    // the handle (a request's extensions may outlive it).
    let _release = Release(connection.clone());
    let trusted = Arc::new(bounds.trusted_proxies.clone());
    let io = TokioIo::new(Watched {
        tcp,
        activity: activity.clone(),
    });
    let body_time = bounds.header_timeout * 6;
    let service = {
        let activity = activity.clone();
        let connection = connection.clone();
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            activity.request_started();
            let (parts, body) = req.into_parts();
            let body = Body::new(Deadline {
                body: Body::new(body),
                sleep: Box::pin(tokio::time::sleep(body_time)),
                peer: peer.ip(),
            });
            let client = ClientAddr(client_addr(peer.ip(), &parts.headers, &trusted));
            let mut req = Request::from_parts(parts, body);
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            req.extensions_mut().insert(client);
            req.extensions_mut().insert(connection.clone());
            let router = router.clone();
            let activity = activity.clone();
            async move {
                let response = router.oneshot(req).await.unwrap_or_else(|e| match e {});
                let (parts, body) = response.into_parts();
                let tracked = Tracked {
                    body,
                    activity: Some(activity),
                };
                Ok::<_, std::convert::Infallible>(hyper::Response::from_parts(parts, tracked))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(bounds.max_head_bytes.max(8192))
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let wait = match activity.check(&bounds) {
            Ok(wait) => wait,
            Err(reason) => {
                refused(reason, peer.ip());
                return;
            }
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = connection.close.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests;
