//! Each principal's share of the HTTP front door (issue 41), attacked
//! through the real binary as root and as an unprivileged user: one tenant
//! opening more event streams than its share, unauthenticated keep-alive
//! connections, one address holding its connections, unfinished request
//! bodies (and bodies refused while they arrive), a revoked or rotated
//! token's open stream, forwarded clients behind a trusted proxy, and the
//! refusals and shares in /metrics. The limits are small (flags), so each
//! attack is a few dozen sockets (a flood of 160 at most).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::front_door::{Ending, initialize_from, read_until_closed, server_pid, tokens_file};
use crate::support::{
    HttpServer, ToolOutput, call, http_exchange, initialize_body, mcp_session_id, path_str,
    rss_kib, tail,
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

// ------------------------------------------------------------ 1. streams

/// Tenant alice opens more event streams than her share (--max-connections
/// 8; one MCP session, whose GET /mcp streams rmcp keeps as shadows): the
/// ones past it get 429 with Retry-After, while tenant bob initializes,
/// opens his own stream and runs python_exec. Once alice's streams close,
/// her share is hers again.
#[tokio::test]
async fn one_tenants_event_streams_stop_at_its_share() {
    const SHARE: usize = 8;
    let (server, _dir, _tokens) = start(
        &[(ALICE, "alice"), (BOB, "bob")],
        &[
            "--http-max-connections",
            "64",
            "--http-max-connections-per-peer",
            "0",
            "--max-connections",
            "8",
        ],
    )
    .await;
    let port = server.port;
    let bob = match server.try_connect_at("/mcp", (), Some(BOB)).await {
        Ok(c) => c,
        Err(e) => panic!("bob's client: {e:#}\nstderr:\n{}", server.stderr_log()),
    };
    let session = open_session(port, Some(ALICE)).await;

    let mut held = Vec::new();
    for n in 1..=SHARE {
        let (head, stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
        assert!(
            is_stream(&head),
            "alice's stream {n} of her share of {SHARE}:\n{}",
            head.0
        );
        held.push(stream);
    }
    let mut refused = Vec::new();
    for n in SHARE + 1..=SHARE + 4 {
        let (head, stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
        assert_eq!(
            head.status(),
            429,
            "alice's stream {n}, past her share of {SHARE}:\n{}",
            head.0
        );
        head.retry_after();
        assert!(
            head.body().contains("event streams"),
            "the refusal of a stream says why:\n{}",
            head.0
        );
        refused.push(stream);
    }

    // Bob keeps his: a new MCP session, an event stream, a call.
    let bob_session = open_session(port, Some(BOB)).await;
    let (head, _bob_stream) = open_stream("127.0.0.1", port, Some(BOB), &bob_session, &[]).await;
    assert!(
        is_stream(&head),
        "bob's stream while alice holds her share:\n{}",
        head.0
    );
    let out = call(bob.peer(), "python_exec", json!({ "code": "6 * 7" })).await;
    assert_eq!(out.value(), Some("42"), "bob's python_exec: {out:#?}");

    // Alice's streams end: her whole share comes back once the server sees
    // them go (polled, bounded), and no more than it.
    drop(held);
    drop(refused);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut again = Vec::new();
    while again.len() < SHARE {
        let (head, stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
        if is_stream(&head) {
            again.push(stream);
            continue;
        }
        assert_eq!(head.status(), 429, "{}", head.0);
        assert!(
            Instant::now() < deadline,
            "20 s after alice closed her streams, only {} of her share of {SHARE} came back",
            again.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (head, _stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
    assert_eq!(head.status(), 429, "past her share again:\n{}", head.0);
}

// ------------------------------------------------ 2. unauthenticated keep-alives

/// One unauthenticated (or misdirected) keep-alive request from 127.0.0.1
/// with an answer that closes: the answer's head. A connection refused at
/// accept (this address at its share for a moment: the server had not yet
/// let go of the previous ones) is tried again for up to 3 s.
async fn refused_keep_alive(port: u16, kind: usize) -> (Head, Ending, TcpStream) {
    let deadline = Instant::now() + Duration::from_secs(3);
    let body = initialize_body();
    let (path, token, expected) = match kind % 4 {
        0 => ("/mcp", Some(WRONG), 401),
        1 => ("/mcp", None, 401),
        2 => ("/t/bob/mcp", Some(ALICE), 403),
        _ => ("/healthz", Some(WRONG), 401),
    };
    loop {
        let mut auth = String::new();
        let headers = mcp_headers(token, None, &mut auth);
        let mut stream = connect_from("127.0.0.1", port).await;
        let request = request_head(port, "POST", path, &headers, Some(body.len())) + &body;
        let _ = stream.write_all(request.as_bytes()).await;
        let ending = read_until_closed(&mut stream, Instant::now() + Duration::from_secs(5)).await;
        let text = String::from_utf8_lossy(ending.bytes()).into_owned();
        let head = Head(
            text.split("\r\n\r\n")
                .next()
                .unwrap_or_default()
                .to_string(),
        );
        if text.starts_with("HTTP/1.1 429") && text.contains("--http-max-connections-per-peer") {
            assert!(
                Instant::now() < deadline,
                "127.0.0.1 was still refused at accept 3 s after its earlier connections were answered: they were held"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
            continue;
        }
        assert!(
            text.starts_with(&format!("HTTP/1.1 {expected}")),
            "POST {path} with {token:?}: wanted {expected}, got ({}) {text:?}",
            ending.how()
        );
        return (head, ending, stream);
    }
}

/// Requests that fail authentication (a wrong token, none) or name another
/// tenant are answered with `Connection: close` and their connections
/// closed by the server, so 32 of them, from an address allowed 4
/// connections and each kept open by its client, never lock it out. One
/// address at its share of connections (--http-max-connections-per-peer 4)
/// gets a raw 429 with Retry-After at accept for a 5th; another address is
/// served meanwhile.
#[tokio::test]
async fn unauthenticated_keep_alives_are_closed_and_one_address_cannot_lock_out_another() {
    let (server, _dir, _tokens) = start(
        &[(ALICE, "alice"), (BOB, "bob")],
        &[
            "--http-max-connections",
            "64",
            "--http-max-connections-per-peer",
            "4",
            "--http-header-timeout",
            "30",
        ],
    )
    .await;
    let port = server.port;

    let mut kept = Vec::new();
    for wave in 0..8 {
        let answers =
            futures::future::join_all((0..4).map(|i| refused_keep_alive(port, wave * 4 + i))).await;
        for (head, ending, stream) in answers {
            assert!(
                head.closes(),
                "an answer to a failed authentication without Connection: close:\n{}",
                head.0
            );
            assert!(
                ending.is_closed(),
                "the server held a connection after answering {} (still open 5 s later)",
                head.0.lines().next().unwrap_or_default()
            );
            // The client keeps its end open: only the server's close frees it.
            kept.push(stream);
        }
    }

    // 127.0.0.2 holds its 4 connections (heads not yet sent: 30 s to go).
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from("127.0.0.2", port).await);
    }
    let mut fifth = connect_from("127.0.0.2", port).await;
    let ending = read_until_closed(&mut fifth, Instant::now() + Duration::from_secs(5)).await;
    assert!(
        ending.is_closed(),
        "a 5th connection of 127.0.0.2 past --http-max-connections-per-peer 4 was still open after 5 s: {ending:?}"
    );
    let text = String::from_utf8_lossy(ending.bytes()).into_owned();
    assert!(
        text.starts_with("HTTP/1.1 429"),
        "a 5th connection of 127.0.0.2 ({}): {text:?}",
        ending.how()
    );
    Head(text.clone()).retry_after();

    // Other addresses are served while 127.0.0.2 holds its share.
    for (from, token) in [("127.0.0.3", ALICE), ("127.0.0.1", BOB)] {
        let status = initialize_from(from, port, token)
            .await
            .unwrap_or_else(|e| panic!("initialize from {from}: {e}"));
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "initialize from {from} while 127.0.0.2 is at its share: {status}"
        );
    }
    // The 4 were held, not timed out.
    for stream in &mut held {
        let ending = read_until_closed(stream, Instant::now() + Duration::from_millis(100)).await;
        assert!(
            !ending.is_closed(),
            "a connection of 127.0.0.2 within its share was closed: {ending:?}"
        );
    }
    let body = metrics(&server).await;
    let per_peer = sample(
        &body,
        "ferrepl_http_refusals_total",
        &[("reason", "per_peer")],
    );
    assert!(
        per_peer.is_some_and(|n| n >= 1.0),
        "the refusal at accept is not counted: {per_peer:?}"
    );
    drop(kept);
}

// ------------------------------------------------------------ 3. slow bodies

/// The declared length of each unfinished body: near --max-request-bytes.
const SLOW_LEN: usize = 250_000;

/// A POST of an initialize padded to `SLOW_LEN` bytes, all but its last
/// byte sent.
struct SlowBody {
    stream: TcpStream,
}

/// An initialize, padded with spaces (JSON allows them) to `len` bytes.
fn padded_initialize(len: usize) -> Vec<u8> {
    let mut body = initialize_body().into_bytes();
    assert!(body.len() < len);
    body.resize(len, b' ');
    body
}

impl SlowBody {
    /// Sends, from `from`, the head of a POST with `token` declaring `len`
    /// bytes of body.
    async fn head(from: &str, port: u16, token: &str, len: usize) -> TcpStream {
        let mut auth = String::new();
        let headers = mcp_headers(Some(token), None, &mut auth);
        let mut stream = connect_from(from, port).await;
        stream
            .write_all(request_head(port, "POST", "/mcp", &headers, Some(len)).as_bytes())
            .await
            .expect("write the head of a POST");
        stream
    }

    /// Starts one from `from`: the head, then all of the body but its last
    /// byte.
    async fn start(from: &str, port: u16, token: &str) -> Self {
        let mut stream = Self::head(from, port, token, SLOW_LEN).await;
        let body = padded_initialize(SLOW_LEN);
        tokio::time::timeout(ANSWER, stream.write_all(&body[..SLOW_LEN - 1]))
            .await
            .expect("writing blocked: the server did not read a body within its share")
            .expect("write all but the last byte of a body");
        Self { stream }
    }

    fn local_port(&self) -> u16 {
        self.stream.local_addr().expect("local address").port()
    }

    /// Sends the last byte; the answer's status.
    async fn finish(mut self) -> u16 {
        self.stream
            .write_all(b" ")
            .await
            .expect("write the last byte");
        expect_head(&mut self.stream, "a finished body")
            .await
            .status()
    }
}

/// For the connections of `clients` (their local ports) to the server on
/// `port`: whether every byte they sent has been read by the server (no
/// byte in the server's receive queue nor unacknowledged in the client's
/// send queue, per /proc/net/tcp), each connection still there.
fn all_read(port: u16, clients: &[u16]) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let rows: Vec<(u16, u16, u64, u64)> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port_of = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
            let (tx, rx) = f.get(4)?.split_once(':')?;
            Some((
                port_of(f.get(1)?)?,
                port_of(f.get(2)?)?,
                u64::from_str_radix(tx, 16).ok()?,
                u64::from_str_radix(rx, 16).ok()?,
            ))
        })
        .collect();
    clients.iter().all(|&client| {
        let server_side = rows
            .iter()
            .find(|r| r.0 == port && r.1 == client)
            .is_some_and(|r| r.3 == 0);
        let client_side = rows
            .iter()
            .find(|r| r.0 == client && r.1 == port)
            .is_some_and(|r| r.2 == 0);
        server_side && client_side
    })
}

/// Waits (bounded) until the server has read all that `bodies` sent.
async fn until_read(port: u16, bodies: &[SlowBody], whose: &str) {
    let clients: Vec<u16> = bodies.iter().map(SlowBody::local_port).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut steady = 0;
    while steady < 2 {
        steady = if all_read(port, &clients) {
            steady + 1
        } else {
            0
        };
        assert!(
            Instant::now() < deadline,
            "the server did not read {whose} unfinished bodies within 20 s (refused, or not read?)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` unfinished bodies of `token`, read by the server.
async fn slow_bodies(port: u16, token: &str, n: usize, whose: &str) -> Vec<SlowBody> {
    let mut bodies = Vec::new();
    for _ in 0..n {
        bodies.push(SlowBody::start("127.0.0.1", port, token).await);
    }
    until_read(port, &bodies, whose).await;
    bodies
}

/// The answer to the head of a POST from `from` with `token` declaring
/// `len` bytes, none of which is sent: a refusal comes at once.
async fn refused_head(from: &str, port: u16, token: &str, len: usize, what: &str) -> Head {
    let mut stream = SlowBody::head(from, port, token, len).await;
    expect_head(
        &mut stream,
        &format!("{what} ({len} bytes declared, none sent)"),
    )
    .await
}

/// A whole SLOW_LEN-byte POST with `token`: its status.
async fn whole_body(port: u16, token: &str) -> u16 {
    let mut stream = SlowBody::head("127.0.0.1", port, token, SLOW_LEN).await;
    stream
        .write_all(&padded_initialize(SLOW_LEN))
        .await
        .expect("write a whole body");
    expect_head(&mut stream, "a whole body").await.status()
}

/// Unfinished request bodies count against their principal while they
/// arrive (--max-request-bytes 256 KiB, --http-max-buffered-bytes 4 MiB: a
/// share of 1 MiB): alice's 4 bodies of 250,000 bytes hold her share, and a
/// 5th is refused with 429 before the server reads a byte of it, as are
/// 160 more she sends whole, the server's memory growing by far less than
/// their 40 MB; bob is served. With four tenants at their shares the
/// instance's 4 MiB are held, and bob's big POST gets 503, his call still
/// served. A body that arrives whole stops counting; so does one whose
/// client goes away.
#[tokio::test]
async fn unfinished_bodies_stop_at_each_principals_share_and_the_total() {
    let (server, _dir, _tokens) = start(
        &[
            (ALICE, "alice"),
            (BOB, "bob"),
            (CAROL, "carol"),
            (DAVE, "dave"),
            (ERIN, "erin"),
        ],
        BUFFERED_FLAGS,
    )
    .await;
    let (port, pid) = (server.port, server_pid(&server));
    let bob = match server.try_connect_at("/mcp", (), Some(BOB)).await {
        Ok(c) => c,
        Err(e) => panic!("bob's client: {e:#}\nstderr:\n{}", server.stderr_log()),
    };
    let bob_calls = async || {
        let out = call(bob.peer(), "python_exec", json!({ "code": "6 * 7" })).await;
        assert_eq!(out.value(), Some("42"), "bob's python_exec: {out:#?}");
    };
    bob_calls().await;
    // A whole body near the largest request is served (and the allocator
    // has seen one) before the server's memory is measured.
    assert_eq!(whole_body(port, ALICE).await, 200);
    let baseline = rss_kib(pid);

    // Alice's share: 4 bodies of 250,000 bytes, one byte short each.
    let alice = slow_bodies(port, ALICE, 4, "alice's").await;
    let head = refused_head("127.0.0.1", port, ALICE, SLOW_LEN, "alice's 5th POST").await;
    assert_eq!(
        head.status(),
        429,
        "alice's 5th unfinished body:\n{}",
        head.0
    );
    head.retry_after();
    bob_calls().await;
    let status = initialize_from("127.0.0.1", port, BOB)
        .await
        .unwrap_or_else(|e| panic!("bob's initialize: {e}"));
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "bob's initialize: {status}"
    );

    // 160 more, sent whole, in waves of 20: each refused after its head.
    let mut peak = rss_kib(pid);
    let mut seen_429 = 0;
    for _ in 0..8 {
        let wave = (0..20).map(|_| async {
            let mut stream = SlowBody::head("127.0.0.1", port, ALICE, SLOW_LEN).await;
            let _ =
                tokio::time::timeout(ANSWER, stream.write_all(&padded_initialize(SLOW_LEN))).await;
            read_until_closed(&mut stream, Instant::now() + ANSWER).await
        });
        for ending in futures::future::join_all(wave).await {
            let text = String::from_utf8_lossy(ending.bytes()).into_owned();
            assert!(
                ending.is_closed() && (text.is_empty() || text.starts_with("HTTP/1.1 429")),
                "a body of alice's past her share ({}): {text:?}",
                ending.how()
            );
            seen_429 += usize::from(!text.is_empty());
        }
        peak = peak.max(rss_kib(pid));
    }
    let grown_kib = peak.saturating_sub(baseline);
    eprintln!(
        "server RSS {baseline} KiB before the unfinished bodies, at most {peak} KiB during 160 refused ones ({seen_429} answers read before the reset)"
    );
    // Unbounded, 164 bodies of 250,000 bytes would take 40 MB.
    assert!(
        grown_kib < 12 * 1024,
        "the server grew by {grown_kib} KiB while alice sent 164 bodies of {SLOW_LEN} bytes with a share of 1 MiB"
    );

    // The instance's total: carol, dave and erin at their shares too.
    let mut others = Vec::new();
    for (token, whose) in [(CAROL, "carol's"), (DAVE, "dave's"), (ERIN, "erin's")] {
        others.push(slow_bodies(port, token, 4, whose).await);
    }
    let head = refused_head("127.0.0.1", port, BOB, SLOW_LEN, "bob's big POST").await;
    assert_eq!(
        head.status(),
        503,
        "bob's big POST with the instance's buffered bytes all held:\n{}",
        head.0
    );
    head.retry_after();
    bob_calls().await;

    // A body that arrives whole stops counting: alice's 4 are answered, and
    // 4 new ones fit her share again.
    for body in alice {
        assert_eq!(body.finish().await, 200, "alice's finished body");
    }
    let again = slow_bodies(port, ALICE, 4, "alice's new").await;
    for body in again {
        assert_eq!(body.finish().await, 200, "alice's new body, finished");
    }

    // A body whose client goes away stops counting once the server sees it.
    let carol = others.remove(0);
    drop(carol);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match whole_body(port, CAROL).await {
            200 => break,
            429 if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            status => panic!("carol's POST after her unfinished bodies went away: {status}"),
        }
    }
    let carol = slow_bodies(port, CAROL, 4, "carol's new").await;
    for body in carol {
        assert_eq!(body.finish().await, 200, "carol's new body, finished");
    }

    let body = metrics(&server).await;
    for share in ["buffered_bytes", "buffered_bytes_total"] {
        let n = share_refusals(&body, share, "tenant");
        assert!(n >= 1.0, "no {share} refusal of a tenant counted ({n})");
    }
    drop(others);
}

/// Flags of a server whose principals may each buffer 1 MiB of request
/// bodies (a quarter of 4 MiB), no more than 256 KiB a request.
const BUFFERED_FLAGS: &[&str] = &[
    "--max-request-bytes",
    "262144",
    "--http-max-buffered-bytes",
    "4194304",
    "--http-max-connections",
    "64",
    "--http-max-connections-per-peer",
    "0",
    "--max-connections",
    "32",
    "--http-header-timeout",
    "30",
];

/// POSTs `body` to /mcp with `token` (in `session`, if any) as one chunk of
/// a chunked body, which declares no length; the answer.
async fn chunked_post(port: u16, token: &str, session: Option<&str>, body: &[u8]) -> Head {
    let mut auth = String::new();
    let mut headers = mcp_headers(Some(token), session, &mut auth);
    headers.push(("Transfer-Encoding", "chunked"));
    let mut stream = connect_from("127.0.0.1", port).await;
    let mut request = request_head(port, "POST", "/mcp", &headers, None).into_bytes();
    request.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    request.extend_from_slice(b"\r\n0\r\n\r\n");
    let _ = stream.write_all(&request).await;
    expect_head(&mut stream, "a chunked POST").await
}

/// `what` and its answer, unless the answer is a refusal for the
/// principal's share (429 with Retry-After).
fn not_a_share_refusal(what: &str, head: &Head) -> Option<String> {
    let refusal = head.status() == 429 && head.header("retry-after").is_some();
    (!refusal).then(|| {
        format!(
            "{what}: {} {:?}",
            head.0.lines().next().unwrap_or_default(),
            head.body().trim()
        )
    })
}

/// A body refused while it arrives is refused for its principal's share,
/// as one refused before a byte is read: 429 with Retry-After, not "over
/// --max-request-bytes" (413) nor a server error (500), for a body that
/// declares no length (chunked) and for one of several declared at once
/// that together pass the share (each declared length fitting when its
/// head came).
#[tokio::test]
async fn a_body_refused_while_it_arrives_gets_429_with_retry_after() {
    let (server, _dir, _tokens) = start(&[(ALICE, "alice"), (BOB, "bob")], BUFFERED_FLAGS).await;
    let port = server.port;
    let session = open_session(port, Some(ALICE)).await;
    let mut wrong = Vec::new();

    // Alice at her share, a chunked body of 100,000 bytes does not fit.
    let alice = slow_bodies(port, ALICE, 4, "alice's").await;
    let head = chunked_post(port, ALICE, None, &padded_initialize(100_000)).await;
    wrong.extend(not_a_share_refusal(
        "a chunked initialize of 100,000 bytes, alice at her share",
        &head,
    ));
    let mut list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#.to_vec();
    list.resize(100_000, b' ');
    let head = chunked_post(port, ALICE, Some(&session), &list).await;
    wrong.extend(not_a_share_refusal(
        "a chunked tools/list of 100,000 bytes in her MCP session, alice at her share",
        &head,
    ));
    for body in alice {
        assert_eq!(body.finish().await, 200, "alice's finished body");
    }

    // Five heads declaring 250,000 bytes each come before their bodies:
    // each fits when it comes; the bodies, all but a byte of each, do not.
    let mut five = Vec::new();
    for _ in 0..5 {
        five.push(SlowBody::head("127.0.0.1", port, ALICE, SLOW_LEN).await);
    }
    let body = padded_initialize(SLOW_LEN);
    for stream in &mut five {
        let _ = tokio::time::timeout(ANSWER, stream.write_all(&body[..SLOW_LEN - 1])).await;
    }
    // Those within her share wait for their last byte; the others are
    // answered (and closed).
    let answers = futures::future::join_all(
        five.iter_mut()
            .map(|s| read_head(s, Duration::from_secs(2))),
    )
    .await;
    let mut refused = 0;
    let mut waiting = Vec::new();
    for (stream, answer) in five.into_iter().zip(answers) {
        match answer {
            Ok(head) => {
                refused += 1;
                wrong.extend(not_a_share_refusal(
                    "one of five bodies declared at once, past alice's share as they arrived",
                    &head,
                ));
            }
            Err(Ending::Open(_)) => waiting.push(SlowBody { stream }),
            Err(ending) => wrong.push(format!(
                "one of five bodies declared at once: closed without an answer ({})",
                ending.how()
            )),
        }
    }
    assert!(
        refused >= 1 || !wrong.is_empty(),
        "five bodies of {SLOW_LEN} bytes, all but a byte each, were all held within a share of 1 MiB"
    );
    for body in waiting {
        assert_eq!(
            body.finish().await,
            200,
            "a body within alice's share, finished"
        );
    }
    assert!(
        wrong.is_empty(),
        "bodies refused while they arrived, for alice's share, were not answered 429 with Retry-After:\n{}",
        wrong.join("\n")
    );
}

// ------------------------------------------------------------ 4. revocation

/// A tenant removed from the tokens file (SIGHUP) loses its open event
/// stream at once, within a second; another tenant's stays open, and the
/// removed token gets 401.
#[tokio::test]
async fn a_revoked_tenants_open_stream_is_closed_at_the_reload() {
    let (server, _dir, tokens) = start(&[(ALICE, "alice"), (BOB, "bob")], &[]).await;
    let port = server.port;
    let alice_session = open_session(port, Some(ALICE)).await;
    let bob_session = open_session(port, Some(BOB)).await;
    let (head, mut alice_stream) =
        open_stream("127.0.0.1", port, Some(ALICE), &alice_session, &[]).await;
    assert!(is_stream(&head), "alice's stream:\n{}", head.0);
    let (head, mut bob_stream) = open_stream("127.0.0.1", port, Some(BOB), &bob_session, &[]).await;
    assert!(is_stream(&head), "bob's stream:\n{}", head.0);

    rewrite_tokens(&tokens, &[(BOB, "bob")]);
    let sent = sighup(&server);
    let ending = closed_by_reload(&server, &mut alice_stream, sent).await;
    assert!(
        ending.is_closed(),
        "alice's event stream was still open 1 s after SIGHUP removed her token (and the reload); stderr:\n{}",
        tail(&server.stderr_log(), 3000)
    );
    assert!(
        server.wait_log("tenant 'alice' revoked", ANSWER).await,
        "no revocation in the log:\n{}",
        tail(&server.stderr_log(), 3000)
    );
    let ending =
        read_until_closed(&mut bob_stream, Instant::now() + Duration::from_millis(300)).await;
    assert!(
        !ending.is_closed(),
        "bob's stream was closed with alice's: {ending:?}"
    );
    let (head, _) = mcp_post(port, Some(ALICE), Some(&alice_session), "{}").await;
    assert_eq!(head.status(), 401, "alice's removed token:\n{}", head.0);
    // Bob's session goes on.
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}"#;
    let (head, messages) = mcp_post(port, Some(BOB), Some(&bob_session), list).await;
    assert_eq!(head.status(), 200, "bob's tools/list:\n{}", head.0);
    assert!(
        messages
            .iter()
            .any(|m| m["id"] == 3 && m["result"]["tools"].is_array()),
        "bob's tools/list: {messages:?}"
    );
}

/// A tenant's token replaced (same tenant, new token) and SIGHUP: what was
/// last used with the old token (an event stream, a keep-alive connection)
/// is closed within a second, the old token gets 401, and the new one on
/// the same Mcp-Session-Id finds the tenant's Python session as it was.
#[tokio::test]
async fn a_rotated_tokens_stream_closes_and_the_tenants_session_survives() {
    let (server, _dir, tokens) = start(&[(ALICE, "alice"), (BOB, "bob")], &[]).await;
    let port = server.port;
    let session = open_session(port, Some(ALICE)).await;
    let (head, out) = python(port, ALICE, &session, "x = 41").await;
    assert_eq!(head.status(), 200, "{}", head.0);
    let out = out.expect("a result of x = 41");
    assert!(!out.is_error, "{out:#?}");
    let (head, mut stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
    assert!(is_stream(&head), "alice's stream:\n{}", head.0);
    // A keep-alive connection whose last request had the old token.
    let mut idle = connect_from("127.0.0.1", port).await;
    let auth = format!("Bearer {ALICE}");
    idle.write_all(
        request_head(port, "GET", "/healthz", &[("Authorization", &auth)], None).as_bytes(),
    )
    .await
    .expect("write GET /healthz");
    let head = expect_head(&mut idle, "GET /healthz").await;
    assert_eq!(head.status(), 200, "{}", head.0);
    let bob_session = open_session(port, Some(BOB)).await;
    let (head, mut bob_stream) = open_stream("127.0.0.1", port, Some(BOB), &bob_session, &[]).await;
    assert!(is_stream(&head), "bob's stream:\n{}", head.0);

    rewrite_tokens(&tokens, &[(ALICE_ROTATED, "alice"), (BOB, "bob")]);
    let sent = sighup(&server);
    let ending = closed_by_reload(&server, &mut stream, sent).await;
    assert!(
        ending.is_closed(),
        "alice's stream opened with her replaced token was still open 1 s after SIGHUP (and the reload); stderr:\n{}",
        tail(&server.stderr_log(), 3000)
    );
    let ending = closed_by_reload(&server, &mut idle, sent).await;
    assert!(
        ending.is_closed(),
        "alice's keep-alive connection last used with her replaced token was still open 1 s after SIGHUP (and the reload): {ending:?}"
    );
    let ending =
        read_until_closed(&mut bob_stream, Instant::now() + Duration::from_millis(300)).await;
    assert!(
        !ending.is_closed(),
        "bob's stream was closed with alice's: {ending:?}"
    );

    let (head, _) = python(port, ALICE, &session, "x + 1").await;
    assert_eq!(head.status(), 401, "the replaced token:\n{}", head.0);
    assert!(
        head.closes(),
        "a 401 without Connection: close:\n{}",
        head.0
    );
    let (head, out) = python(port, ALICE_ROTATED, &session, "x + 1").await;
    assert_eq!(
        head.status(),
        200,
        "the new token on alice's MCP session:\n{}",
        head.0
    );
    let out = out.expect("a result of x + 1");
    assert_eq!(
        out.value(),
        Some("42"),
        "alice's session after the rotation: {out:#?}"
    );
    let (head, stream_again) =
        open_stream("127.0.0.1", port, Some(ALICE_ROTATED), &session, &[]).await;
    assert!(
        is_stream(&head),
        "alice's stream with the new token:\n{}",
        head.0
    );
    drop(stream_again);
}

// ------------------------------------------------------------ 6. proxies

/// Behind a trusted proxy (--http-trusted-proxy 127.0.0.1; no tokens, so
/// principals are addresses), each forwarded client has its own share of
/// event streams (--max-connections 2): one at its share gets 429 by either
/// header, the other is served. From an untrusted peer (127.0.0.2) the
/// same headers are ignored: its streams are one principal's.
#[tokio::test]
async fn forwarded_clients_of_a_trusted_proxy_have_shares_of_their_own() {
    let server = HttpServer::start(
        &[
            "--warm-pool",
            "0",
            "--http-trusted-proxy",
            "127.0.0.1",
            "--max-connections",
            "2",
            "--http-max-connections",
            "64",
            "--http-max-connections-per-peer",
            "4",
        ],
        &[],
    )
    .await;
    let port = server.port;
    let session = open_session(port, None).await;
    let stream = async |from: &str, header: (&str, &str)| {
        open_stream(from, port, None, &session, &[header]).await
    };
    let mut held = Vec::new();
    for forwarded in ["198.51.100.1", "198.51.100.1, 127.0.0.1"] {
        let (head, s) = stream("127.0.0.1", ("X-Forwarded-For", forwarded)).await;
        assert!(
            is_stream(&head),
            "X-Forwarded-For {forwarded} within its share:\n{}",
            head.0
        );
        held.push(s);
    }
    for header in [
        ("X-Forwarded-For", "203.0.113.7, 198.51.100.1"),
        ("Forwarded", "for=198.51.100.1;proto=http"),
    ] {
        let (head, s) = stream("127.0.0.1", header).await;
        assert_eq!(
            head.status(),
            429,
            "{header:?}, a client at its share:\n{}",
            head.0
        );
        head.retry_after();
        assert!(
            head.body().contains("event streams"),
            "{header:?}: not the refusal of a stream:\n{}",
            head.0
        );
        held.push(s);
    }
    // The proxy's own address holds 5 connections now, past
    // --http-max-connections-per-peer 4: it is not capped, its clients are.
    let (head, s) = stream("127.0.0.1", ("X-Forwarded-For", "198.51.100.2")).await;
    assert!(is_stream(&head), "another forwarded client:\n{}", head.0);
    held.push(s);

    // An untrusted peer's header names no one: 198.51.100.1 is at its
    // share, 127.0.0.2 is not; and its three streams are one principal's.
    for (n, forwarded) in ["198.51.100.1", "198.51.100.3"].into_iter().enumerate() {
        let (head, s) = stream("127.0.0.2", ("X-Forwarded-For", forwarded)).await;
        assert!(
            is_stream(&head),
            "stream {} of 127.0.0.2 (untrusted, X-Forwarded-For {forwarded}):\n{}",
            n + 1,
            head.0
        );
        held.push(s);
    }
    let (head, s) = stream("127.0.0.2", ("X-Forwarded-For", "198.51.100.4")).await;
    assert_eq!(
        head.status(),
        429,
        "a 3rd stream of 127.0.0.2, whatever it forwards:\n{}",
        head.0
    );
    head.retry_after();
    held.push(s);

    // No tokens: the main listener serves /metrics.
    let (status, body) = http_exchange(port, "GET", "/metrics", &[("Host", "127.0.0.1")], "").await;
    assert_eq!(status, 200, "{body}");
    let n = share_refusals(&body, "streams", "peer");
    assert!(n >= 3.0, "stream refusals of peers counted: {n}");
    drop(held);
}

// ------------------------------------------------------------ 7. metrics

/// /metrics on --metrics-addr counts each refusal by share and principal
/// kind, and shows every share as configured.
#[tokio::test]
async fn metrics_show_each_share_and_its_refusals() {
    let (server, _dir, _tokens) = start(
        &[(ALICE, "alice"), (BOB, "bob"), (CAROL, "carol")],
        &[
            "--http-max-connections",
            "64",
            "--http-max-connections-per-peer",
            "7",
            "--tenant-max-http-connections",
            "5",
            "--max-connections",
            "3",
            "--max-request-bytes",
            "262144",
            "--http-max-buffered-bytes",
            "1048576",
        ],
    )
    .await;
    let port = server.port;
    let body = metrics(&server).await;
    for (limit, value) in [
        ("tenant_max_http_connections", 5.0),
        ("http_max_streams_per_principal", 3.0),
        ("http_max_buffered_bytes", 1_048_576.0),
        ("http_max_buffered_bytes_per_principal", 262_144.0),
        ("http_max_connections_per_peer", 7.0),
    ] {
        assert_eq!(
            sample(&body, "ferrepl_limit", &[("limit", limit)]),
            Some(value),
            "ferrepl_limit{{limit=\"{limit}\"}}"
        );
    }

    // Connections: alice's 5 keep-alive ones hold her share; a 6th request
    // is refused (and its connection closed); bob, from another address,
    // is served.
    let auth = format!("Bearer {ALICE}");
    let healthz = request_head(port, "GET", "/healthz", &[("Authorization", &auth)], None);
    let mut alice = Vec::new();
    for n in 1..=6 {
        let mut s = connect_from("127.0.0.1", port).await;
        s.write_all(healthz.as_bytes())
            .await
            .expect("write GET /healthz");
        let head = expect_head(&mut s, "alice's GET /healthz").await;
        if n <= 5 {
            assert_eq!(
                head.status(),
                200,
                "alice's connection {n} of 5:\n{}",
                head.0
            );
        } else {
            assert_eq!(head.status(), 429, "alice's 6th connection:\n{}", head.0);
            head.retry_after();
            assert!(head.closes(), "{}", head.0);
            assert!(
                head.body().contains("--tenant-max-http-connections"),
                "not the refusal of a tenant's connection:\n{}",
                head.0
            );
        }
        alice.push(s);
    }
    let status = initialize_from("127.0.0.3", port, BOB)
        .await
        .unwrap_or_else(|e| panic!("bob's initialize: {e}"));
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "bob's initialize: {status}"
    );
    // Closed, alice's connections are hers again once the server sees them
    // go (polled, bounded): 5 of them, not 6.
    drop(alice);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut alice = Vec::new();
    while alice.len() < 5 {
        let mut s = connect_from("127.0.0.1", port).await;
        s.write_all(healthz.as_bytes())
            .await
            .expect("write GET /healthz");
        let head = expect_head(&mut s, "alice's GET /healthz").await;
        if head.status() == 200 {
            alice.push(s);
            continue;
        }
        assert_eq!(head.status(), 429, "{}", head.0);
        assert!(
            Instant::now() < deadline,
            "20 s after alice closed her connections only {} of her share of 5 came back",
            alice.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut s = connect_from("127.0.0.1", port).await;
    s.write_all(healthz.as_bytes())
        .await
        .expect("write GET /healthz");
    let head = expect_head(&mut s, "alice's GET /healthz").await;
    assert_eq!(head.status(), 429, "past her share again:\n{}", head.0);

    // Streams: bob's 4th, past --max-connections 3.
    let session = open_session(port, Some(BOB)).await;
    let mut streams = Vec::new();
    for n in 1..=4 {
        let (head, s) = open_stream("127.0.0.3", port, Some(BOB), &session, &[]).await;
        if n <= 3 {
            assert!(is_stream(&head), "bob's stream {n}:\n{}", head.0);
        } else {
            assert_eq!(head.status(), 429, "bob's 4th stream:\n{}", head.0);
        }
        streams.push(s);
    }
    // Buffered bytes: 249,999 of carol's held, another 20,000 declared.
    let slow = SlowBody::start("127.0.0.4", port, CAROL).await;
    until_read(port, std::slice::from_ref(&slow), "carol's").await;
    let head = refused_head(
        "127.0.0.4",
        port,
        CAROL,
        20_000,
        "carol's POST past her share",
    )
    .await;
    assert_eq!(head.status(), 429, "{}", head.0);
    head.retry_after();

    let body = metrics(&server).await;
    for share in ["connections", "streams", "buffered_bytes"] {
        let n = share_refusals(&body, share, "tenant");
        assert!(
            n >= 1.0,
            "ferrepl_http_share_refusals_total{{share=\"{share}\",principal=\"tenant\"}} is {n}:\n{}",
            body.lines()
                .filter(|l| l.contains("share_refusals"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    drop((alice, streams, slow));
}
