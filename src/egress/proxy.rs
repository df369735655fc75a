//! The allow-listing forward proxy: accept loop, request head, policy
//! checks, upstream connection and the idle-bounded relay. See the module
//! documentation in `mod.rs` for what is accepted and refused.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::Semaphore;
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};
use tokio_util::sync::CancellationToken;

use super::{EgressConfig, Host, forbidden_ip, normalize_host};

/// Header lines accepted in a request head (more is answered 431).
const MAX_HEADERS: usize = 100;
/// Time allowed to write a refusal to the client.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// After a refusal, how long (and how much) unread client input is drained
/// so that closing does not reset the connection before the client has read
/// the answer.
const REFUSAL_DRAIN_TIME: Duration = Duration::from_millis(500);
const REFUSAL_DRAIN_BYTES: usize = 256 * 1024;
/// Relay buffer per direction.
const RELAY_BUF: usize = 32 * 1024;
/// Pause after a failed accept (EMFILE and the like) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves until `shutdown` is cancelled. Every refusal is logged (tracing::warn!) with the host.
///
/// Cancelling `shutdown` also closes the connections still open.
#[allow(dead_code)] // wired in by the installer work (issue 11)
pub async fn serve(listener: UnixListener, cfg: Arc<EgressConfig>, shutdown: CancellationToken) {
    let gate = Gate::new(&cfg);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => gate.dispatch(stream, "relay".to_string(), &cfg, &shutdown),
            Err(e) => accept_failed(e, &shutdown).await,
        }
    }
}

/// Also a TCP flavour for tests and tools: same handling on a TcpListener.
#[allow(dead_code)] // wired in by the installer work (issue 11)
pub async fn serve_tcp(listener: TcpListener, cfg: Arc<EgressConfig>, shutdown: CancellationToken) {
    let gate = Gate::new(&cfg);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                gate.dispatch(stream, peer.to_string(), &cfg, &shutdown);
            }
            Err(e) => accept_failed(e, &shutdown).await,
        }
    }
}

async fn accept_failed(e: io::Error, shutdown: &CancellationToken) {
    tracing::warn!("egress proxy: accept failed: {e}");
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = sleep(ACCEPT_BACKOFF) => {}
    }
}

/// Connection limits: `active` bounds the connections served; `rejecting`
/// bounds the short-lived tasks that answer 503 beyond that (past both,
/// a connection is simply closed).
struct Gate {
    active: Arc<Semaphore>,
    rejecting: Arc<Semaphore>,
}

impl Gate {
    fn new(cfg: &EgressConfig) -> Self {
        let n = cfg.max_connections.min(Semaphore::MAX_PERMITS);
        Gate {
            active: Arc::new(Semaphore::new(n)),
            rejecting: Arc::new(Semaphore::new(n.clamp(1, 1024))),
        }
    }

    fn dispatch<S>(
        &self,
        stream: S,
        peer: String,
        cfg: &Arc<EgressConfig>,
        shutdown: &CancellationToken,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let shutdown = shutdown.clone();
        match self.active.clone().try_acquire_owned() {
            Ok(permit) => {
                let cfg = cfg.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = handle(stream, &cfg, &peer) => {}
                    }
                });
            }
            Err(_) => {
                let refusal = Refusal::new(
                    503,
                    format!(
                        "ferrepl: too many egress connections at once ({}); try again later",
                        cfg.max_connections
                    ),
                );
                refusal.log(None, &peer);
                match self.rejecting.clone().try_acquire_owned() {
                    Ok(permit) => {
                        tokio::spawn(async move {
                            let _permit = permit;
                            tokio::select! {
                                _ = shutdown.cancelled() => {}
                                _ = refusal.send(stream) => {}
                            }
                        });
                    }
                    Err(_) => drop(stream),
                }
            }
        }
    }
}

/// A refusal: status, and a one-line message for the body, the reason
/// phrase and the log.
#[derive(Debug)]
struct Refusal {
    status: u16,
    message: String,
}

impl Refusal {
    fn new(status: u16, message: String) -> Self {
        Refusal { status, message }
    }

    fn bad_request(what: impl std::fmt::Display) -> Self {
        Refusal::new(400, format!("ferrepl: malformed proxy request: {what}"))
    }

    fn log(&self, host: Option<&Host>, peer: &str) {
        let host = host.map_or_else(|| "-".to_string(), Host::to_string);
        tracing::warn!(
            host = %host,
            peer = %peer,
            status = self.status,
            "egress refused: {}",
            self.message
        );
    }

    fn response(&self) -> Vec<u8> {
        let standard = match self.status {
            400 => "Bad Request",
            403 => "Forbidden",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            501 => "Not Implemented",
            502 => "Bad Gateway",
            503 => "Service Unavailable",
            _ => "Error",
        };
        // The reason phrase carries the message too: pip reports a failed
        // CONNECT as "Tunnel connection failed: <status> <reason>" and never
        // shows the body. Keep it to visible ASCII.
        let reason: String = self
            .message
            .chars()
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        let reason = if reason.is_empty() {
            standard.to_string()
        } else {
            reason
        };
        let body = format!("{}\n", self.message);
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nProxy-Agent: ferrepl\r\n\r\n",
            self.status,
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }

    /// Writes the answer, closes the write side, and drains a little of
    /// what the client still sends so the close is not a reset. Bounded.
    async fn send<S: AsyncRead + AsyncWrite + Unpin>(&self, mut client: S) {
        let response = self.response();
        let wrote = timeout(REFUSAL_WRITE_TIMEOUT, async {
            client.write_all(&response).await?;
            client.flush().await?;
            client.shutdown().await
        })
        .await;
        if !matches!(wrote, Ok(Ok(()))) {
            return;
        }
        let _ = timeout(REFUSAL_DRAIN_TIME, async {
            let mut buf = [0u8; 8192];
            let mut total = 0usize;
            while total < REFUSAL_DRAIN_BYTES {
                match client.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
            }
        })
        .await;
    }
}

/// Serves one client connection: one request, then its tunnel or response.
async fn handle<S>(mut client: S, cfg: &EgressConfig, peer: &str)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut host = None;
    let result = serve_one(&mut client, cfg, peer, &mut host).await;
    if let Err(refusal) = result {
        refusal.log(host.as_ref(), peer);
        refusal.send(client).await;
    }
}

async fn serve_one<S>(
    client: &mut S,
    cfg: &EgressConfig,
    peer: &str,
    host_out: &mut Option<Host>,
) -> Result<(), Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let Some((buf, head)) = read_head(client, cfg).await? else {
        tracing::debug!(peer = %peer, "egress: client closed before a request");
        return Ok(());
    };
    let plan = plan(&head)?;
    let (host, port) = match &plan {
        Plan::Connect { host, port } => (host.clone(), *port),
        Plan::Http { host, port, .. } => (host.clone(), *port),
    };
    *host_out = Some(host.clone());
    authorize(cfg, &host, port)?;
    let mut upstream = connect(cfg, &host, port).await?;
    match plan {
        Plan::Connect { .. } => {
            tracing::debug!(peer = %peer, "egress: CONNECT {host}:{port}");
            let leftover = &buf[head.len..];
            let ready = async {
                client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await?;
                client.flush().await?;
                if !leftover.is_empty() {
                    upstream.write_all(leftover).await?;
                }
                io::Result::Ok(())
            };
            if timeout(cfg.idle_timeout, ready)
                .await
                .is_ok_and(|r| r.is_ok())
            {
                relay(client, upstream, None, cfg.idle_timeout).await;
            }
        }
        Plan::Http {
            head: out_head,
            body_len,
            ..
        } => {
            tracing::debug!(peer = %peer, "egress: {} http://{host}:{port}", head.method);
            let leftover = &buf[head.len..];
            let first = leftover
                .len()
                .min(usize::try_from(body_len).unwrap_or(usize::MAX));
            let sent = async {
                upstream.write_all(&out_head).await?;
                upstream.write_all(&leftover[..first]).await?;
                upstream.flush().await
            };
            if timeout(cfg.idle_timeout, sent)
                .await
                .is_ok_and(|r| r.is_ok())
            {
                let rest = body_len - first as u64;
                relay(client, upstream, Some(rest), cfg.idle_timeout).await;
            }
        }
    }
    Ok(())
}

/// The parts of a request head the proxy uses, owned.
struct Head {
    /// Bytes of the head in the buffer (what follows belongs to the body or tunnel).
    len: usize,
    method: String,
    target: String,
    /// Minor HTTP version: 0 or 1.
    version: u8,
    headers: Vec<(String, Vec<u8>)>,
}

/// Reads the request head within `head_timeout` and `max_head_bytes`.
/// Returns the bytes read (head and whatever followed it) and the parsed
/// head, or None when the client closed before completing a head.
async fn read_head<S>(
    client: &mut S,
    cfg: &EgressConfig,
) -> Result<Option<(Vec<u8>, Head)>, Refusal>
where
    S: AsyncRead + Unpin,
{
    let deadline = deadline_after(cfg.head_timeout);
    let mut buf: Vec<u8> = Vec::with_capacity(cfg.max_head_bytes.min(8192));
    let mut chunk = [0u8; 4096];
    loop {
        if !buf.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let head = Head {
                        len,
                        method: req.method.unwrap_or_default().to_string(),
                        target: req.path.unwrap_or_default().to_string(),
                        version: req.version.unwrap_or(1),
                        headers: req
                            .headers
                            .iter()
                            .map(|h| (h.name.to_string(), h.value.to_vec()))
                            .collect(),
                    };
                    return Ok(Some((buf, head)));
                }
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(Refusal::new(
                        431,
                        format!(
                            "ferrepl: the request head has more than {MAX_HEADERS} header lines"
                        ),
                    ));
                }
                Err(e) => return Err(Refusal::bad_request(e)),
            }
        }
        let room = cfg.max_head_bytes.saturating_sub(buf.len());
        if room == 0 {
            return Err(Refusal::new(
                431,
                format!(
                    "ferrepl: the request head exceeds {} bytes",
                    cfg.max_head_bytes
                ),
            ));
        }
        let want = room.min(chunk.len());
        match timeout_at(deadline, client.read(&mut chunk[..want])).await {
            Err(_) => {
                return Err(Refusal::new(
                    408,
                    format!(
                        "ferrepl: the request head did not arrive within {} ms",
                        cfg.head_timeout.as_millis()
                    ),
                ));
            }
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

enum Plan {
    Connect {
        host: Host,
        port: u16,
    },
    Http {
        host: Host,
        port: u16,
        /// The head to send upstream (origin-form, cleaned headers).
        head: Vec<u8>,
        /// Request body bytes to forward (Content-Length).
        body_len: u64,
    },
}

/// Turns a parsed head into what to do, or a 400/501.
fn plan(head: &Head) -> Result<Plan, Refusal> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = parse_authority(&head.target).ok_or_else(|| {
            Refusal::bad_request(format!(
                "CONNECT needs a host:port target, got {:?}",
                shown(&head.target)
            ))
        })?;
        return Ok(Plan::Connect { host, port });
    }
    let target = &head.target;
    let scheme_end = target.find("://");
    let scheme = scheme_end.map(|i| &target[..i]);
    match scheme {
        Some(s) if s.eq_ignore_ascii_case("http") => {}
        Some(s) if s.eq_ignore_ascii_case("https") => {
            return Err(Refusal::bad_request(
                "https:// URLs must go through CONNECT, not plain forwarding",
            ));
        }
        _ => {
            return Err(Refusal::bad_request(format!(
                "this is a forward proxy: use CONNECT host:port or an absolute http:// URL, got {:?}",
                shown(target)
            )));
        }
    }
    let uri: http::Uri = target
        .parse()
        .map_err(|e| Refusal::bad_request(format!("bad URL {:?}: {e}", shown(target))))?;
    let authority = uri
        .authority()
        .ok_or_else(|| Refusal::bad_request(format!("no host in {:?}", shown(target))))?;
    if authority.as_str().contains('@') {
        return Err(Refusal::bad_request(
            "credentials in the URL are not forwarded",
        ));
    }
    let host = normalize_host(authority.host())
        .ok_or_else(|| Refusal::bad_request(format!("bad host in {:?}", shown(target))))?;
    let port = match authority.port() {
        None => 80,
        Some(p) => match p.as_u16() {
            0 => {
                return Err(Refusal::bad_request(format!(
                    "bad port in {:?}",
                    shown(target)
                )));
            }
            p => p,
        },
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let path = if path.is_empty() { "/" } else { path };

    // Content-Length framing only: a chunked body would need parsing to
    // know where this request ends, and nothing may follow it.
    let mut body_len: Option<u64> = None;
    let mut connection_tokens: Vec<String> = Vec::new();
    for (name, value) in &head.headers {
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Refusal::new(
                501,
                "ferrepl: request bodies with Transfer-Encoding are not supported by the egress proxy"
                    .to_string(),
            ));
        }
        if name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(value)
                .ok()
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| Refusal::bad_request("bad Content-Length"))?;
            if body_len.is_some_and(|b| b != v) {
                return Err(Refusal::bad_request("conflicting Content-Length headers"));
            }
            body_len = Some(v);
        }
        if (name.eq_ignore_ascii_case("connection")
            || name.eq_ignore_ascii_case("proxy-connection"))
            && let Ok(v) = std::str::from_utf8(value)
        {
            connection_tokens.extend(
                v.split(',')
                    .map(|t| t.trim().to_ascii_lowercase())
                    .filter(|t| !t.is_empty()),
            );
        }
    }
    const HOP_BY_HOP: [&str; 8] = [
        "host",
        "connection",
        "proxy-connection",
        "proxy-authorization",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
    ];
    let dropped = |name: &str| {
        let lower = name.to_ascii_lowercase();
        HOP_BY_HOP.contains(&lower.as_str())
            // Headers named by Connection are hop-by-hop too, except the
            // ones that frame the request: dropping those would let the
            // body be read upstream as another request.
            || (lower != "content-length" && connection_tokens.contains(&lower))
    };

    let mut out = Vec::with_capacity(head.len + 64);
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(format!(" HTTP/1.{}\r\n", head.version.min(1)).as_bytes());
    // Host comes from the URL, whatever the client's Host header says: the
    // allow-list check applies to the name the upstream sees.
    if port == 80 {
        out.extend_from_slice(format!("Host: {host}\r\n").as_bytes());
    } else {
        out.extend_from_slice(format!("Host: {host}:{port}\r\n").as_bytes());
    }
    for (name, value) in &head.headers {
        if dropped(name) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Plan::Http {
        host,
        port,
        head: out,
        body_len: body_len.unwrap_or(0),
    })
}

/// A request target cut to a length fit for a one-line message.
fn shown(target: &str) -> &str {
    const MAX: usize = 120;
    if target.len() <= MAX {
        return target;
    }
    let mut end = MAX;
    while !target.is_char_boundary(end) {
        end -= 1;
    }
    &target[..end]
}

/// `host:port` or `[v6]:port`, as in a CONNECT target.
fn parse_authority(target: &str) -> Option<(Host, u16)> {
    let (host, port) = if target.starts_with('[') {
        let close = target.find(']')?;
        let port = target[close + 1..].strip_prefix(':')?;
        (&target[..=close], port)
    } else {
        let (host, port) = target.rsplit_once(':')?;
        if host.contains(':') {
            return None;
        }
        (host, port)
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|&p| p != 0)?;
    Some((normalize_host(host)?, port))
}

fn authorize(cfg: &EgressConfig, host: &Host, port: u16) -> Result<(), Refusal> {
    if !cfg.allows(host) {
        return Err(Refusal::new(
            403,
            format!(
                "ferrepl: egress to {host} is not allowed; allowed: {}; the operator can add hosts with --allow-host-egress",
                cfg.hosts_list()
            ),
        ));
    }
    if !cfg.allows_port(port) {
        return Err(Refusal::new(
            403,
            format!(
                "ferrepl: egress to {host} port {port} is not allowed; allowed ports: {}",
                cfg.ports_list()
            ),
        ));
    }
    Ok(())
}

/// Resolves `host`, refuses it if any address is private (unless the
/// config allows that), and connects to the checked addresses in order
/// within `connect_timeout` overall.
async fn connect(cfg: &EgressConfig, host: &Host, port: u16) -> Result<TcpStream, Refusal> {
    let deadline = deadline_after(cfg.connect_timeout);
    let addrs: Vec<SocketAddr> = match host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(name) => {
            match timeout_at(deadline, tokio::net::lookup_host((name.as_str(), port))).await {
                Err(_) => {
                    return Err(Refusal::new(
                        502,
                        format!("ferrepl: cannot resolve {host}: timed out"),
                    ));
                }
                Ok(Err(e)) => {
                    return Err(Refusal::new(
                        502,
                        format!("ferrepl: cannot resolve {host}: {e}"),
                    ));
                }
                Ok(Ok(addrs)) => addrs.collect(),
            }
        }
    };
    if addrs.is_empty() {
        return Err(Refusal::new(
            502,
            format!("ferrepl: cannot resolve {host}: no addresses"),
        ));
    }
    if !cfg.allow_private
        && let Some(bad) = addrs.iter().find(|a| forbidden_ip(a.ip()))
    {
        return Err(Refusal::new(
            403,
            format!(
                "ferrepl: egress to {host} is not allowed: it resolves to a private or loopback address ({})",
                bad.ip()
            ),
        ));
    }
    let mut last_error = String::from("no address tried");
    for addr in &addrs {
        match timeout_at(deadline, TcpStream::connect(addr)).await {
            Err(_) => {
                last_error = format!("{addr}: timed out");
                break;
            }
            Ok(Err(e)) => last_error = format!("{addr}: {e}"),
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
        }
    }
    Err(Refusal::new(
        502,
        format!("ferrepl: cannot connect to {host} port {port}: {last_error}"),
    ))
}

fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// When either direction last moved bytes (ms since `start`).
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Completes once nothing moved for `idle`.
    async fn idle(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = last
                .checked_add(idle)
                .unwrap_or_else(|| deadline_after(idle));
            if Instant::now() >= deadline {
                return;
            }
            sleep_until(deadline).await;
        }
    }
}

/// Copies bytes both ways until both directions ended, either failed, or
/// neither moved a byte for `idle`. With `client_limit`, only that many
/// more bytes go from the client upstream (the rest of a request body);
/// anything after is read and discarded.
async fn relay<C, U>(client: C, upstream: U, client_limit: Option<u64>, idle: Duration)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (client_r, client_w) = tokio::io::split(client);
    let (up_r, up_w) = tokio::io::split(upstream);
    let activity = Activity::new();
    let both = async {
        tokio::try_join!(
            pump(client_r, up_w, client_limit, &activity),
            pump(up_r, client_w, None, &activity),
        )
    };
    tokio::select! {
        r = both => {
            if let Err(e) = r {
                tracing::debug!("egress: tunnel ended: {e}");
            }
        }
        _ = activity.idle(idle) => {
            tracing::debug!("egress: tunnel idle for {} ms, closed", idle.as_millis());
        }
    }
}

/// One direction of a relay.
async fn pump<R, W>(mut r: R, mut w: W, limit: Option<u64>, activity: &Activity) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; RELAY_BUF];
    let mut remaining = limit;
    loop {
        if remaining == Some(0) {
            // The request is complete: one request per connection, so what
            // follows is not forwarded. Keep reading to notice the close.
            loop {
                if r.read(&mut buf).await? == 0 {
                    return Ok(());
                }
            }
        }
        let n = r.read(&mut buf).await?;
        if n == 0 {
            let _ = w.shutdown().await;
            return Ok(());
        }
        activity.touch();
        let n = match remaining {
            Some(rem) => usize::try_from(rem).map_or(n, |rem| n.min(rem)),
            None => n,
        };
        let mut off = 0;
        while off < n {
            let k = w.write(&buf[off..n]).await?;
            if k == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            off += k;
            activity.touch();
        }
        w.flush().await?;
        if let Some(rem) = remaining.as_mut() {
            *rem -= n as u64;
        }
    }
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
