//! Each principal's share of the HTTP front door (issue 41), attacked
//! through the real binary as root and as an unprivileged user: one tenant
//! opening more event streams than its share, unauthenticated keep-alive
//! connections, one address holding its connections, unfinished request
//! bodies (and bodies refused while they arrive), a revoked or rotated
//! token's open stream, forwarded clients behind a trusted proxy, and the
//! refusals and shares in /metrics. The limits are small (flags), so each
//! attack is a few dozen sockets (a flood of 160 at most).
//!
//! `mod.rs` holds the tenants' tokens, the server's start and reload, raw
//! HTTP (request heads, response heads, MCP posts and event streams) and
//! /metrics samples; one file per share attacked: `streams.rs` (event
//! streams), `connections.rs` (keep-alives and each address's
//! connections), `buffered_bytes.rs` (unfinished request bodies),
//! `revocation.rs` (revoked and rotated tokens), `proxies.rs` (forwarded
//! clients) and `metrics.rs` (refusals and shares in /metrics).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::front_door::{Ending, read_until_closed, server_pid, tokens_file};
use crate::support::{
    HttpServer, ToolOutput, http_exchange, initialize_body, mcp_session_id, path_str, tail,
};

const ALICE: &str = "shares-alice-0123456789abcdef";
const ALICE_ROTATED: &str = "shares-alice-rotated-0123456789";
const BOB: &str = "shares-bob-0123456789abcdef0";
const CAROL: &str = "shares-carol-0123456789abcdef";
const DAVE: &str = "shares-dave-0123456789abcdef0";
const ERIN: &str = "shares-erin-0123456789abcdef0";
const WRONG: &str = "shares-wrong-0123456789abcdef";

/// How long a response the server owes (not a stream) may take.
const ANSWER: Duration = Duration::from_secs(10);

/// A server with `tenants` (token, tenant) in its tokens file, its metrics
/// on --metrics-addr, no warm pool, and `extra` flags; the directory
/// holding the tokens file, and the file.
async fn start(
    tenants: &[(&str, &str)],
    extra: &[&str],
) -> (HttpServer, tempfile::TempDir, PathBuf) {
    let (dir, tokens) = tokens_file(tenants);
    let mut args = vec![
        "--auth-token-file",
        path_str(&tokens),
        "--metrics-addr",
        "127.0.0.1:0",
        "--warm-pool",
        "0",
    ];
    args.extend_from_slice(extra);
    let server = HttpServer::start(&args, &[]).await;
    (server, dir, tokens)
}

/// Replaces the tokens file at once (a temporary file renamed over it),
/// as an operator's tooling would, so that the server never reads half of it.
fn rewrite_tokens(tokens: &Path, tenants: &[(&str, &str)]) {
    let lines: String = tenants
        .iter()
        .map(|(token, tenant)| format!("{token} {tenant}\n"))
        .collect();
    let temporary = tokens.with_extension("new");
    std::fs::write(&temporary, lines).expect("write the new tokens file");
    std::fs::rename(&temporary, tokens).expect("rename the new tokens file into place");
}

/// Sends SIGHUP to the server; when it was sent.
fn sighup(server: &HttpServer) -> Instant {
    let pid = nix::unistd::Pid::from_raw(server_pid(server) as i32);
    let sent = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP the server");
    sent
}

/// What the server logs once it has reloaded its tokens.
const RELOADED: &str = "SIGHUP: tokens reloaded";

/// Reads `stream` until the server closes it, within a second of the
/// SIGHUP `sent`; how it ended. On a loaded host the server may handle the
/// signal later than that: if its log does not show the reload by then,
/// the second counts from the reload, once the log shows it.
async fn closed_by_reload(server: &HttpServer, stream: &mut TcpStream, sent: Instant) -> Ending {
    let ending = read_until_closed(stream, sent + Duration::from_secs(1)).await;
    if ending.is_closed() || server.stderr_log().contains(RELOADED) {
        return ending;
    }
    assert!(
        server.wait_log(RELOADED, Duration::from_secs(30)).await,
        "no '{RELOADED}' within 30 s of SIGHUP:\n{}",
        tail(&server.stderr_log(), 3000)
    );
    read_until_closed(stream, Instant::now() + Duration::from_secs(1)).await
}

// ------------------------------------------------------------ raw HTTP

/// A connection to the server from `from`, an address of 127/8 (Linux
/// routes all of it to loopback), so that the server sees another peer.
async fn connect_from(from: &str, port: u16) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("a socket");
    let local: SocketAddr = format!("{from}:0").parse().expect("a local address");
    socket
        .bind(local)
        .unwrap_or_else(|e| panic!("bind {local}: {e}"));
    let server: SocketAddr = ([127, 0, 0, 1], port).into();
    tokio::time::timeout(ANSWER, socket.connect(server))
        .await
        .unwrap_or_else(|_| panic!("connect from {from} did not complete within {ANSWER:?}"))
        .unwrap_or_else(|e| panic!("connect from {from}: {e}"))
}

/// A request head: Host, then `headers`, then a Content-Length when a body
/// of `body_len` bytes follows. Keep-alive unless `headers` say otherwise.
fn request_head(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body_len: Option<usize>,
) -> String {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(n) = body_len {
        head.push_str(&format!("Content-Length: {n}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// A response head (and the body of a refusal).
#[derive(Debug)]
struct Head(String);

impl Head {
    /// What follows the head (a refusal's explanation).
    fn body(&self) -> &str {
        self.0.split_once("\r\n\r\n").map_or("", |(_, body)| body)
    }

    fn status(&self) -> u16 {
        self.0
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {:?}", self.0))
    }

    /// The value of header `name` (any case).
    fn header(&self, name: &str) -> Option<&str> {
        let head = self.0.split("\r\n\r\n").next().unwrap_or_default();
        head.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The seconds of its Retry-After, which must be there.
    fn retry_after(&self) -> u64 {
        let value = self
            .header("retry-after")
            .unwrap_or_else(|| panic!("a refusal without Retry-After:\n{}", self.0));
        let seconds: u64 = value
            .parse()
            .unwrap_or_else(|_| panic!("Retry-After {value:?} is not seconds:\n{}", self.0));
        assert!(seconds > 0, "Retry-After 0:\n{}", self.0);
        seconds
    }

    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads a response head off `stream` within `within` (and its body, when
/// it declares a length: a refusal's), or how the connection was found
/// instead (closed, reset, or silent).
async fn read_head(stream: &mut TcpStream, within: Duration) -> Result<Head, Ending> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let mut wanted = None;
    loop {
        if wanted.is_none()
            && let Some(end) = find(&seen, b"\r\n\r\n")
        {
            let head = Head(String::from_utf8_lossy(&seen[..end + 4]).into_owned());
            let length = head
                .header("content-length")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            wanted = Some(end + 4 + length);
        }
        if let Some(total) = wanted
            && seen.len() >= total
        {
            return Ok(Head(String::from_utf8_lossy(&seen[..total]).into_owned()));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return Err(Ending::Open(seen)),
            Ok(Ok(0)) => return Err(Ending::Closed(seen)),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => return Err(Ending::Reset(e, seen)),
        }
    }
}

/// Like `read_head`; a connection that gave none fails the test, saying `what`.
async fn expect_head(stream: &mut TcpStream, what: &str) -> Head {
    match read_head(stream, ANSWER).await {
        Ok(head) => head,
        Err(ending) => panic!(
            "{what}: no response head within {ANSWER:?} ({}; got {:?})",
            ending.how(),
            String::from_utf8_lossy(ending.bytes())
        ),
    }
}

/// The chunks of a chunked body, joined.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = find(body, b"\r\n") {
        let size = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|line| usize::from_str_radix(line.split(';').next()?.trim(), 16).ok())
            .unwrap_or(0);
        body = &body[eol + 2..];
        if size == 0 || body.len() < size {
            break;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[(size + 2).min(body.len())..];
    }
    out
}

/// The headers of an MCP request with `token` (if any) in `session` (if any).
fn mcp_headers<'a>(
    token: Option<&'a str>,
    session: Option<&'a str>,
    auth: &'a mut String,
) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Protocol-Version", "2025-06-18"),
    ];
    if let Some(token) = token {
        *auth = format!("Bearer {token}");
        headers.push(("Authorization", auth.as_str()));
    }
    if let Some(session) = session {
        headers.push(("Mcp-Session-Id", session));
    }
    headers
}

/// POSTs `body` to /mcp with `token` in `session`, on a connection of its
/// own (closed after the answer); the head and the JSON-RPC messages of the
/// answer (a JSON body, or the events of a stream).
async fn mcp_post(
    port: u16,
    token: Option<&str>,
    session: Option<&str>,
    body: &str,
) -> (Head, Vec<Value>) {
    let mut auth = String::new();
    let mut headers = mcp_headers(token, session, &mut auth);
    headers.push(("Connection", "close"));
    let mut stream = connect_from("127.0.0.1", port).await;
    let request = request_head(port, "POST", "/mcp", &headers, Some(body.len())) + body;
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write an MCP request");
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(90), stream.read_to_end(&mut response))
        .await
        .expect("an MCP request answered within 90 s")
        .expect("read an MCP answer");
    let end = find(&response, b"\r\n\r\n").unwrap_or_else(|| {
        panic!(
            "no response head in {:?}",
            String::from_utf8_lossy(&response)
        )
    });
    let head = Head(String::from_utf8_lossy(&response[..end + 4]).into_owned());
    let mut payload = response[end + 4..].to_vec();
    if head
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        payload = dechunk(&payload);
    }
    let text = String::from_utf8_lossy(&payload);
    let messages = if head
        .header("content-type")
        .is_some_and(|v| v.starts_with("text/event-stream"))
    {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str(data.trim()).ok())
            .collect()
    } else {
        serde_json::from_str(&text).into_iter().collect()
    };
    (head, messages)
}

/// An MCP session of `token` (initialize, then notifications/initialized);
/// its Mcp-Session-Id.
async fn open_session(port: u16, token: Option<&str>) -> String {
    let (head, _) = mcp_post(port, token, None, &initialize_body()).await;
    assert_eq!(head.status(), 200, "initialize:\n{}", head.0);
    let session = mcp_session_id(&head.0);
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (head, _) = mcp_post(port, token, Some(&session), initialized).await;
    assert!(
        (200..300).contains(&head.status()),
        "notifications/initialized:\n{}",
        head.0
    );
    session
}

/// python_exec of `code` in the default session, with `token` on MCP
/// session `session`; the HTTP status and the tool result (if one came).
async fn python(port: u16, token: &str, session: &str, code: &str) -> (Head, Option<ToolOutput>) {
    let request = json!({
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": { "name": "python_exec", "arguments": { "code": code } }
    })
    .to_string();
    let (head, messages) = mcp_post(port, Some(token), Some(session), &request).await;
    let result = messages.into_iter().find(|m| m["id"] == 7).map(|m| {
        let result = m
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("python_exec answered with an error: {m}"));
        ToolOutput::from_result(serde_json::from_value(result).expect("a tool result"))
    });
    (head, result)
}

/// Opens the event stream of MCP session `session` (GET /mcp) from `from`,
/// with `token` and `extra` headers; the answer's head and the connection,
/// left open.
async fn open_stream(
    from: &str,
    port: u16,
    token: Option<&str>,
    session: &str,
    extra: &[(&str, &str)],
) -> (Head, TcpStream) {
    let mut auth = String::new();
    let mut headers = mcp_headers(token, Some(session), &mut auth);
    headers.retain(|(k, _)| *k != "Content-Type");
    headers.iter_mut().for_each(|h| {
        if h.0 == "Accept" {
            h.1 = "text/event-stream";
        }
    });
    headers.extend_from_slice(extra);
    let mut stream = connect_from(from, port).await;
    stream
        .write_all(request_head(port, "GET", "/mcp", &headers, None).as_bytes())
        .await
        .expect("write GET /mcp");
    let head = expect_head(&mut stream, "GET /mcp").await;
    (head, stream)
}

/// Whether `head` opened an event stream.
fn is_stream(head: &Head) -> bool {
    head.status() == 200
        && head
            .header("content-type")
            .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The server's /metrics on its --metrics-addr listener.
async fn metrics(server: &HttpServer) -> String {
    let port = server
        .metrics_port
        .expect("the --metrics-addr listener's port in the log");
    let (status, body) = http_exchange(port, "GET", "/metrics", &[("Host", "127.0.0.1")], "").await;
    assert_eq!(status, 200, "GET /metrics: {body}");
    body
}

/// The value of the sample of `family` whose labels include every one of
/// `labels` (name, value), if there is one.
fn sample(body: &str, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines().find_map(|line| {
        let rest = line.strip_prefix(family)?.strip_prefix('{')?;
        let (inside, value) = rest.split_once("} ")?;
        labels
            .iter()
            .all(|(k, v)| inside.split(',').any(|pair| pair == format!("{k}=\"{v}\"")))
            .then(|| value.trim().parse().ok())?
    })
}

/// `ferrepl_http_share_refusals_total{share,principal}`, 0 when absent.
fn share_refusals(body: &str, share: &str, principal: &str) -> f64 {
    sample(
        body,
        "ferrepl_http_share_refusals_total",
        &[("share", share), ("principal", principal)],
    )
    .unwrap_or(0.0)
}

mod buffered_bytes;
mod connections;
mod metrics;
mod proxies;
mod revocation;
mod streams;
