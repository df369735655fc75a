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
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::sync::mpsc;

    const BOUND: Duration = Duration::from_secs(10);

    fn test_cfg(ports: Vec<u16>) -> EgressConfig {
        let mut cfg = EgressConfig::new(vec!["localhost".to_string()]);
        cfg.ports = ports;
        cfg.allow_private = true;
        cfg
    }

    struct Proxy {
        addr: SocketAddr,
        shutdown: CancellationToken,
    }

    impl Drop for Proxy {
        fn drop(&mut self) {
            self.shutdown.cancel();
        }
    }

    async fn start_proxy(cfg: EgressConfig) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(serve_tcp(listener, Arc::new(cfg), shutdown.clone()));
        Proxy { addr, shutdown }
    }

    /// An upstream that echoes every connection's bytes back.
    async fn start_echo() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        port
    }

    /// A tiny HTTP upstream: sends each request head it reads on `tx`,
    /// answers "hello" and closes.
    async fn start_http() -> (u16, mpsc::UnboundedReceiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut reader = BufReader::new(s);
                    let mut head = String::new();
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push_str(&line);
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let _ = tx.send(head);
                    let mut s = reader.into_inner();
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
                        .await;
                    let _ = s.shutdown().await;
                });
            }
        });
        (port, rx)
    }

    /// Reads everything until the proxy closes.
    async fn read_all(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Sends `request` and returns the whole answer.
    async fn exchange(proxy: &Proxy, request: &[u8]) -> String {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        s.write_all(request).await.unwrap();
        read_all(&mut s).await
    }

    /// Reads a response head (through the blank line), byte by byte.
    async fn read_response_head(s: &mut TcpStream) -> String {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut b).await.unwrap() == 0 {
                break;
            }
            head.push(b[0]);
        }
        String::from_utf8_lossy(&head).into_owned()
    }

    fn status(response: &str) -> u16 {
        response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    fn body(response: &str) -> &str {
        response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    async fn bounded<F: std::future::Future>(f: F) -> F::Output {
        timeout(BOUND, f).await.expect("test timed out")
    }

    #[tokio::test]
    async fn connect_tunnels_both_ways() {
        bounded(async {
            let echo = start_echo().await;
            let proxy = start_proxy(test_cfg(vec![echo])).await;
            let mut s = TcpStream::connect(proxy.addr).await.unwrap();
            // Bytes sent right behind the head are forwarded too.
            s.write_all(
                format!("CONNECT localhost:{echo} HTTP/1.1\r\nHost: localhost:{echo}\r\n\r\nearly")
                    .as_bytes(),
            )
            .await
            .unwrap();
            let head = read_response_head(&mut s).await;
            assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
            let mut got = [0u8; 5];
            s.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"early");
            s.write_all(b"ping").await.unwrap();
            let mut got = [0u8; 4];
            s.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping");
            // Half-close travels upstream; the echo's close comes back.
            s.shutdown().await.unwrap();
            assert_eq!(read_all(&mut s).await, "");
        })
        .await;
    }

    #[tokio::test]
    async fn connect_host_case_and_trailing_dot() {
        bounded(async {
            let echo = start_echo().await;
            let proxy = start_proxy(test_cfg(vec![echo])).await;
            let mut s = TcpStream::connect(proxy.addr).await.unwrap();
            s.write_all(format!("CONNECT LocalHost.:{echo} HTTP/1.1\r\n\r\n").as_bytes())
                .await
                .unwrap();
            assert_eq!(status(&read_response_head(&mut s).await), 200);
        })
        .await;
    }

    #[tokio::test]
    async fn plain_http_is_forwarded_in_origin_form() {
        bounded(async {
            let (port, mut heads) = start_http().await;
            let proxy = start_proxy(test_cfg(vec![port])).await;
            let request = format!(
                "GET http://localhost:{port}/simple/six/?x=1 HTTP/1.1\r\n\
                 Host: evil.example\r\n\
                 User-Agent: pip/24\r\n\
                 Proxy-Connection: keep-alive\r\n\
                 Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
                 Accept: */*\r\n\r\n"
            );
            let response = exchange(&proxy, request.as_bytes()).await;
            assert_eq!(status(&response), 200, "{response}");
            assert_eq!(body(&response), "hello");
            let head = heads.recv().await.unwrap();
            let mut lines = head.split("\r\n");
            assert_eq!(lines.next(), Some("GET /simple/six/?x=1 HTTP/1.1"));
            assert!(
                head.contains(&format!("Host: localhost:{port}\r\n")),
                "{head}"
            );
            assert!(!head.contains("evil.example"), "{head}");
            assert!(head.contains("User-Agent: pip/24\r\n"), "{head}");
            assert!(head.contains("Accept: */*\r\n"), "{head}");
            assert!(head.contains("Connection: close\r\n"), "{head}");
            assert!(!head.to_ascii_lowercase().contains("proxy-"), "{head}");
            assert!(!head.contains("keep-alive"), "{head}");
        })
        .await;
    }

    #[tokio::test]
    async fn plain_http_body_is_forwarded_and_nothing_after_it() {
        bounded(async {
            let echo = start_echo().await;
            // The request is not half-closed upstream (HTTP servers may take
            // that as an abort), so the echo never ends: the idle timeout does.
            let mut cfg = test_cfg(vec![echo]);
            cfg.idle_timeout = Duration::from_millis(500);
            let proxy = start_proxy(cfg).await;
            let mut s = TcpStream::connect(proxy.addr).await.unwrap();
            s.write_all(
                format!(
                    "POST http://localhost:{echo}/up HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789GET http://x/ HTTP/1.1\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
            s.shutdown().await.unwrap();
            let echoed = read_all(&mut s).await;
            assert!(echoed.starts_with(&format!("POST /up HTTP/1.1\r\nHost: localhost:{echo}\r\n")), "{echoed}");
            assert!(echoed.ends_with("Connection: close\r\n\r\n0123456789"), "{echoed}");
        })
        .await;
    }

    #[tokio::test]
    async fn host_not_allowed_is_403_naming_host_and_list() {
        bounded(async {
            let echo = start_echo().await;
            let mut cfg = test_cfg(vec![echo, 443]);
            cfg.allowed_hosts = vec!["localhost".into(), "pypi.org".into()];
            let proxy = start_proxy(cfg).await;
            let response = exchange(&proxy, b"CONNECT Example.COM:443 HTTP/1.1\r\n\r\n").await;
            assert_eq!(status(&response), 403, "{response}");
            assert_eq!(
                body(&response),
                "ferrepl: egress to example.com is not allowed; allowed: localhost, pypi.org; \
                 the operator can add hosts with --allow-host-egress\n"
            );
            // The reason phrase says it too (pip shows only that).
            assert!(
                response.starts_with("HTTP/1.1 403 ferrepl: egress to example.com is not allowed")
            );
            let response = exchange(&proxy, b"GET http://example.com/ HTTP/1.1\r\n\r\n").await;
            assert_eq!(status(&response), 403, "{response}");
            // A bare IP is a host like any other.
            let response = exchange(
                &proxy,
                format!("CONNECT 127.0.0.1:{echo} HTTP/1.1\r\n\r\n").as_bytes(),
            )
            .await;
            assert_eq!(status(&response), 403, "{response}");
            let response = exchange(
                &proxy,
                format!("CONNECT [::1]:{echo} HTTP/1.1\r\n\r\n").as_bytes(),
            )
            .await;
            assert_eq!(status(&response), 403, "{response}");
        })
        .await;
    }

    #[tokio::test]
    async fn port_not_allowed_is_403() {
        bounded(async {
            let echo = start_echo().await;
            let proxy = start_proxy(test_cfg(vec![443])).await;
            let response = exchange(
                &proxy,
                format!("CONNECT localhost:{echo} HTTP/1.1\r\n\r\n").as_bytes(),
            )
            .await;
            assert_eq!(status(&response), 403, "{response}");
            assert!(
                body(&response)
                    .contains(&format!("port {echo} is not allowed; allowed ports: 443"))
            );
            let response = exchange(
                &proxy,
                format!("GET http://localhost:{echo}/ HTTP/1.1\r\n\r\n").as_bytes(),
            )
            .await;
            assert_eq!(status(&response), 403, "{response}");
        })
        .await;
    }

    #[tokio::test]
    async fn private_destination_is_403() {
        bounded(async {
            let echo = start_echo().await;
            let mut cfg = test_cfg(vec![echo]);
            cfg.allow_private = false;
            cfg.allowed_hosts.push("127.0.0.1".into());
            let proxy = start_proxy(cfg).await;
            for target in ["localhost", "127.0.0.1"] {
                let response = exchange(
                    &proxy,
                    format!("CONNECT {target}:{echo} HTTP/1.1\r\n\r\n").as_bytes(),
                )
                .await;
                assert_eq!(status(&response), 403, "{response}");
                assert!(
                    body(&response).contains("resolves to a private or loopback address"),
                    "{response}"
                );
            }
        })
        .await;
    }

    #[tokio::test]
    async fn malformed_and_origin_form_are_400() {
        bounded(async {
            let proxy = start_proxy(test_cfg(vec![80])).await;
            for request in [
                &b"HELLO\r\n\r\n"[..],
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
                b"GET https://localhost/ HTTP/1.1\r\n\r\n",
                b"CONNECT localhost HTTP/1.1\r\n\r\n",
                b"CONNECT localhost:0 HTTP/1.1\r\n\r\n",
                b"CONNECT localhost:99999 HTTP/1.1\r\n\r\n",
                b"CONNECT ::1:443 HTTP/1.1\r\n\r\n",
                b"CONNECT local_host!:443 HTTP/1.1\r\n\r\n",
                b"GET http://localhost/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                b"GET http://user:pw@localhost/ HTTP/1.1\r\n\r\n",
            ] {
                let response = exchange(&proxy, request).await;
                assert_eq!(status(&response), 400, "{request:?} -> {response}");
                assert!(body(&response).starts_with("ferrepl: "), "{response}");
            }
            let response = exchange(
                &proxy,
                b"POST http://localhost/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            )
            .await;
            assert_eq!(status(&response), 501, "{response}");
        })
        .await;
    }

    #[tokio::test]
    async fn head_too_large_is_431() {
        bounded(async {
            let mut cfg = test_cfg(vec![80]);
            cfg.max_head_bytes = 1024;
            let proxy = start_proxy(cfg).await;
            let mut request = b"GET http://localhost/ HTTP/1.1\r\nX-Big: ".to_vec();
            request.extend(std::iter::repeat_n(b'a', 64 * 1024));
            request.extend_from_slice(b"\r\n\r\n");
            let mut s = TcpStream::connect(proxy.addr).await.unwrap();
            // The proxy may answer before taking everything: ignore write errors.
            let (mut r, mut w) = s.split();
            let (_, response) = tokio::join!(w.write_all(&request), async {
                let mut out = Vec::new();
                let _ = r.read_to_end(&mut out).await;
                String::from_utf8_lossy(&out).into_owned()
            });
            assert_eq!(status(&response), 431, "{response}");
        })
        .await;
    }

    #[tokio::test]
    async fn silent_client_gets_408() {
        bounded(async {
            let mut cfg = test_cfg(vec![80]);
            cfg.head_timeout = Duration::from_millis(200);
            let proxy = start_proxy(cfg).await;
            let started = std::time::Instant::now();
            let mut s = TcpStream::connect(proxy.addr).await.unwrap();
            let response = read_all(&mut s).await;
            assert_eq!(status(&response), 408, "{response}");
            assert!(started.elapsed() >= Duration::from_millis(150));
            assert!(started.elapsed() < Duration::from_secs(3));
            // A client that dribbles a partial head gets the same.
            let mut s = TcpStream::connect(proxy.addr).await.unwrap();
            s.write_all(b"GET http://localhost/ HTTP/1.1\r\n")
                .await
                .unwrap();
            assert_eq!(status(&read_all(&mut s).await), 408);
        })
        .await;
    }

    #[tokio::test]
    async fn idle_tunnel_is_closed() {
        bounded(async {
            let echo = start_echo().await;
            let mut cfg = test_cfg(vec![echo]);
            cfg.idle_timeout = Duration::from_millis(300);
            let proxy = start_proxy(cfg).await;
            let mut s = TcpStream::connect(proxy.addr).await.unwrap();
            s.write_all(format!("CONNECT localhost:{echo} HTTP/1.1\r\n\r\n").as_bytes())
                .await
                .unwrap();
            assert_eq!(status(&read_response_head(&mut s).await), 200);
            // Traffic keeps it open past the idle timeout...
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_millis(150)).await;
                s.write_all(b"x").await.unwrap();
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await.unwrap();
            }
            // ...silence closes it.
            let started = std::time::Instant::now();
            let mut b = [0u8; 1];
            assert_eq!(s.read(&mut b).await.unwrap_or(0), 0);
            assert!(started.elapsed() >= Duration::from_millis(200));
        })
        .await;
    }

    #[tokio::test]
    async fn over_max_connections_is_503() {
        bounded(async {
            let mut cfg = test_cfg(vec![80]);
            cfg.max_connections = 1;
            let proxy = start_proxy(cfg).await;
            let mut first = TcpStream::connect(proxy.addr).await.unwrap();
            first.write_all(b"GET http://loc").await.unwrap();
            let response = exchange(&proxy, b"CONNECT localhost:80 HTTP/1.1\r\n\r\n").await;
            assert_eq!(status(&response), 503, "{response}");
            assert!(body(&response).contains("too many egress connections"));
            // Once the first is gone, its slot is free again.
            drop(first);
            let mut ok = false;
            for _ in 0..50 {
                let response = exchange(&proxy, b"HELLO\r\n\r\n").await;
                if status(&response) == 400 {
                    ok = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(ok, "the slot was not released");
        })
        .await;
    }

    #[tokio::test]
    async fn large_body_through_tunnel_is_intact() {
        bounded(async {
            let echo = start_echo().await;
            let proxy = start_proxy(test_cfg(vec![echo])).await;
            let mut s = TcpStream::connect(proxy.addr).await.unwrap();
            s.write_all(format!("CONNECT localhost:{echo} HTTP/1.1\r\n\r\n").as_bytes())
                .await
                .unwrap();
            assert_eq!(status(&read_response_head(&mut s).await), 200);
            let data: Vec<u8> = (0..8 * 1024 * 1024u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
                .collect();
            let (mut r, mut w) = s.split();
            let (_, back) = tokio::join!(
                async {
                    w.write_all(&data).await.unwrap();
                    w.shutdown().await.unwrap();
                },
                async {
                    let mut back = Vec::with_capacity(data.len());
                    r.read_to_end(&mut back).await.unwrap();
                    back
                }
            );
            assert_eq!(back.len(), data.len());
            assert!(back == data, "tunnelled bytes differ");
        })
        .await;
    }

    #[tokio::test]
    async fn connect_failure_is_502() {
        bounded(async {
            // A port nothing listens on (bound then released).
            let port = {
                let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
                l.local_addr().unwrap().port()
            };
            let mut cfg = test_cfg(vec![port]);
            cfg.connect_timeout = Duration::from_secs(3);
            cfg.allowed_hosts.push("no-such-host.invalid".into());
            let proxy = start_proxy(cfg).await;
            let response = exchange(
                &proxy,
                format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n").as_bytes(),
            )
            .await;
            assert_eq!(status(&response), 502, "{response}");
            assert!(
                body(&response).contains("cannot connect to localhost"),
                "{response}"
            );
            let response = exchange(
                &proxy,
                format!("CONNECT no-such-host.invalid:{port} HTTP/1.1\r\n\r\n").as_bytes(),
            )
            .await;
            assert_eq!(status(&response), 502, "{response}");
            assert!(
                body(&response).contains("cannot resolve no-such-host.invalid"),
                "{response}"
            );
        })
        .await;
    }

    #[tokio::test]
    async fn unix_listener_serves_too_and_shutdown_stops_it() {
        bounded(async {
            let echo = start_echo().await;
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("egress.sock");
            let listener = UnixListener::bind(&path).unwrap();
            let shutdown = CancellationToken::new();
            let server = tokio::spawn(serve(
                listener,
                Arc::new(test_cfg(vec![echo])),
                shutdown.clone(),
            ));
            let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
            s.write_all(format!("CONNECT localhost:{echo} HTTP/1.1\r\n\r\nhi").as_bytes())
                .await
                .unwrap();
            let mut got = vec![0u8; "HTTP/1.1 200 Connection established\r\n\r\nhi".len()];
            s.read_exact(&mut got).await.unwrap();
            assert_eq!(got, b"HTTP/1.1 200 Connection established\r\n\r\nhi");
            shutdown.cancel();
            server.await.unwrap();
            // The open tunnel is closed as well.
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
            assert!(rest.is_empty());
        })
        .await;
    }
}
