//! Attacks on the HTTP front door, before any token is checked (run as root
//! and as an unprivileged user): a flood of connections that never finish
//! their request head, more connections than the listener takes, a request
//! body that never arrives, a keep-alive connection left idle, and a soft
//! open-files limit low enough for a flood to exhaust. A legitimate client
//! (another peer address, a call in progress) must be served throughout.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::{HttpServer, Launch, call, http_exchange, initialize_body, path_str};

const ALPHA: &str = "front-door-alpha-0123456789abcdef";
const BETA: &str = "front-door-beta-0123456789abcdef";

/// A tokens file naming `tenants` (token, tenant), in a directory kept as
/// long as the returned guard.
pub(super) fn tokens_file(tenants: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a directory for the tokens file");
    let path = dir.path().join("tokens");
    let lines: String = tenants
        .iter()
        .map(|(token, tenant)| format!("{token} {tenant}\n"))
        .collect();
    std::fs::write(&path, lines).expect("write the tokens file");
    (dir, path)
}

/// A server with tenant alpha (and beta), its metrics on a port of their
/// own, no warm pool, and `extra` flags.
async fn start(extra: &[&str]) -> (HttpServer, tempfile::TempDir) {
    let (dir, tokens) = tokens_file(&[(ALPHA, "alpha"), (BETA, "beta")]);
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
    (server, dir)
}

pub(super) fn server_pid(server: &HttpServer) -> u32 {
    server.child.id().expect("the server's pid (it is running)")
}

/// `ferrepl_http_refusals_total{reason}` for every reason, from the
/// `--metrics-addr` listener.
async fn refusals(server: &HttpServer) -> HashMap<String, u64> {
    let port = server
        .metrics_port
        .expect("the --metrics-addr listener's port in the log");
    let (status, body) = http_exchange(port, "GET", "/metrics", &[("Host", "127.0.0.1")], "").await;
    assert_eq!(status, 200, "GET /metrics: {body}");
    let counts: HashMap<String, u64> = body
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("ferrepl_http_refusals_total{")?;
            let reason = rest.split("reason=\"").nth(1)?.split('"').next()?;
            let value = l.rsplit(' ').next()?.parse::<f64>().ok()?;
            Some((reason.to_string(), value as u64))
        })
        .collect();
    assert!(
        !counts.is_empty(),
        "no ferrepl_http_refusals_total in /metrics:\n{body}"
    );
    counts
}

async fn refusal_count(server: &HttpServer, reason: &str) -> u64 {
    let all = refusals(server).await;
    *all.get(reason)
        .unwrap_or_else(|| panic!("no ferrepl_http_refusals_total{{reason=\"{reason}\"}}: {all:?}"))
}

/// How a connection ended, as its client saw it.
#[derive(Debug)]
pub(super) enum Ending {
    /// EOF after these bytes (maybe none).
    Closed(Vec<u8>),
    /// Reset (or another read error) after these bytes.
    Reset(std::io::Error, Vec<u8>),
    /// Still open at the deadline, after these bytes.
    Open(Vec<u8>),
}

impl Ending {
    pub(super) fn is_closed(&self) -> bool {
        !matches!(self, Ending::Open(_))
    }

    /// How the connection ended, for messages.
    pub(super) fn how(&self) -> String {
        match self {
            Ending::Closed(_) => "EOF".to_string(),
            Ending::Reset(e, _) => format!("read error: {e}"),
            Ending::Open(_) => "still open".to_string(),
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Ending::Closed(b) | Ending::Reset(_, b) | Ending::Open(b) => b,
        }
    }
}

/// Reads `stream` until the server closes it (EOF or a reset) or until
/// `deadline`.
pub(super) async fn read_until_closed<R: AsyncReadExt + Unpin>(
    stream: &mut R,
    deadline: Instant,
) -> Ending {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return Ending::Open(seen),
            Ok(Ok(0)) => return Ending::Closed(seen),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => return Ending::Reset(e, seen),
        }
    }
}

/// Whether the server still holds `stream` open (nothing to read, no EOF).
fn still_open(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(stream.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// The descriptors the server holds: /proc/<pid>/fd where this user may
/// read it (root; the server makes itself non-dumpable, which hides its fd
/// directory from its own unprivileged user), else the server-side TCP
/// sockets of its port that it has not closed (an upper bound of its
/// connections' descriptors: established ones include those not yet
/// accepted).
fn server_descriptors(pid: u32, port: u16) -> usize {
    match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(dir) => dir.count(),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => server_sockets_of_port(port),
        Err(e) => panic!("read /proc/{pid}/fd: {e}"),
    }
}

/// Sockets in /proc/net/tcp whose local port is `port`, in a state where
/// the server has not closed them (established or close-wait).
fn server_sockets_of_port(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let port_hex = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3
                && fields[1].ends_with(&port_hex)
                && (fields[3] == "01" || fields[3] == "08")
        })
        .count()
}

/// Raises this process's soft RLIMIT_NOFILE to its hard limit (capped at
/// 65536); returns the soft limit now in force.
fn raise_own_open_files() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(got, 0, "getrlimit: {}", std::io::Error::last_os_error());
    let wanted = lim.rlim_max.min(65536);
    if lim.rlim_cur < wanted {
        let raised = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return wanted;
        }
    }
    lim.rlim_cur
}

fn own_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A raw `initialize` POST with `token` to /mcp, from a socket bound to
/// `local_ip`; the status line of the answer (or why there was none).
pub(super) async fn initialize_from(
    local_ip: &str,
    port: u16,
    token: &str,
) -> Result<String, String> {
    let socket = TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
    let local: SocketAddr = format!("{local_ip}:0").parse().expect("a local address");
    socket
        .bind(local)
        .map_err(|e| format!("bind {local}: {e}"))?;
    let server: SocketAddr = format!("127.0.0.1:{port}")
        .parse()
        .expect("the server's address");
    let mut stream = socket
        .connect(server)
        .await
        .map_err(|e| format!("connect from {local_ip}: {e}"))?;
    let body = initialize_body();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader
        .read_line(&mut status)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if status.is_empty() {
        return Err("closed without an answer".to_string());
    }
    Ok(status.trim_end().to_string())
}

/// Lines of the server's log reporting a refused or closed connection.
fn refusal_log_lines(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("refused or closed"))
        .count()
}

/// 2,000 connections from one address that never finish their request head
/// hold neither the server's descriptors nor its tenants: another peer's
/// initialize is answered for each tenant while they are open, the server
/// holds at most its per-peer cap of them, every one is closed within the
/// header timeout, and the log says so in a few lines, not thousands.
#[tokio::test]
async fn a_flood_of_unfinished_request_heads_does_not_lock_out_other_peers() {
    const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
    let (server, _tokens) = start(&[
        "--http-header-timeout",
        "2",
        "--http-max-connections-per-peer",
        "100",
    ])
    .await;
    let (port, pid) = (server.port, server_pid(&server));

    let limit = raise_own_open_files();
    let room = (limit as usize).saturating_sub(own_descriptors() + 200);
    let flood = room.min(2000);
    assert!(
        flood >= 600,
        "this process may open {limit} files, room for only {flood} connections (600 wanted)"
    );

    // The server's descriptors, sampled until the flood is over.
    let done = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (done, most) = (done.clone(), most.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let n = tokio::task::spawn_blocking(move || server_descriptors(pid, port))
                    .await
                    .expect("count the server's descriptors");
                most.fetch_max(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // Each connection sends a head that never ends, then waits for the
    // server to close it (bounded: the header timeout and 5 s).
    let opened = Arc::new(AtomicUsize::new(0));
    let all_opened = Arc::new(tokio::sync::Notify::new());
    let connecting = Arc::new(tokio::sync::Semaphore::new(200));
    let mut floods = Vec::with_capacity(flood);
    for _ in 0..flood {
        let permit = connecting
            .clone()
            .acquire_owned()
            .await
            .expect("the connect semaphore");
        let (opened, all_opened) = (opened.clone(), all_opened.clone());
        floods.push(tokio::spawn(async move {
            let connected = tokio::time::timeout(
                Duration::from_secs(10),
                TcpStream::connect(("127.0.0.1", port)),
            )
            .await;
            drop(permit);
            let mark_opened = || {
                if opened.fetch_add(1, Ordering::AcqRel) + 1 == flood {
                    all_opened.notify_one();
                }
            };
            let mut stream = match connected {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    mark_opened();
                    return Err(format!("connect: {e}"));
                }
                Err(_) => {
                    mark_opened();
                    return Err("connect did not complete within 10 s".to_string());
                }
            };
            let since = Instant::now();
            let head = b"POST /mcp HTTP/1.1\r\nHost: localhost\r\n";
            let wrote = stream.write_all(head).await;
            mark_opened();
            if wrote.is_err() {
                // Closed (reset) before the head was even written.
                return Ok((Duration::ZERO, None));
            }
            let ending =
                read_until_closed(&mut stream, since + HEADER_TIMEOUT + Duration::from_secs(5))
                    .await;
            let took = since.elapsed();
            Ok((took, (!ending.is_closed()).then_some(ending)))
        }));
    }
    tokio::time::timeout(Duration::from_secs(60), all_opened.notified())
        .await
        .expect("the flood's connections were opened within 60 s");

    // Meanwhile another peer initializes for each tenant.
    for (token, tenant) in [(ALPHA, "alpha"), (BETA, "beta")] {
        let asked = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(10), initialize_from("127.0.0.2", port, token))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "tenant {tenant}'s initialize from 127.0.0.2 was not answered within 10 s of a flood from 127.0.0.1; stderr:\n{}",
                    crate::support::tail(&server.stderr_log(), 4000)
                )
            });
        match answer {
            Ok(status) => assert!(
                status.starts_with("HTTP/1.1 200"),
                "tenant {tenant}'s initialize from 127.0.0.2 during the flood: {status} (after {:?})",
                asked.elapsed()
            ),
            Err(e) => panic!(
                "tenant {tenant}'s initialize from 127.0.0.2 during the flood failed: {e}; stderr:\n{}",
                crate::support::tail(&server.stderr_log(), 4000)
            ),
        }
    }

    // Every flood connection is closed within the header timeout (and 5 s).
    let mut failed = Vec::new();
    let mut still_open = Vec::new();
    let mut slowest = Duration::ZERO;
    for task in floods {
        match task.await.expect("a flood connection's task") {
            Err(e) => failed.push(e),
            Ok((took, None)) => slowest = slowest.max(took),
            Ok((took, Some(ending))) => still_open.push((took, ending)),
        }
    }
    done.store(true, Ordering::Relaxed);
    sampler.await.expect("the descriptor sampler");
    assert!(
        failed.is_empty(),
        "{} of {flood} flood connections could not be made, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(
        still_open.is_empty(),
        "{} of {flood} connections with an unfinished head were still open {HEADER_TIMEOUT:?} + 5 s after they opened, e.g. {:?}",
        still_open.len(),
        &still_open[..still_open.len().min(3)]
    );

    let most = most.load(Ordering::Relaxed);
    assert!(
        most < 400,
        "the server held up to {most} descriptors during a flood of {flood} connections (per-peer cap 100)"
    );

    let counts = refusals(&server).await;
    let (per_peer, header) = (counts["per_peer"], counts["header_timeout"]);
    assert!(per_peer > 0, "no per_peer refusal counted: {counts:?}");
    assert!(header > 0, "no header_timeout closing counted: {counts:?}");
    assert!(
        per_peer + header >= flood as u64,
        "each of the {flood} flood connections is refused or closed once: {counts:?}"
    );

    let log = server.stderr_log();
    let lines = refusal_log_lines(&log);
    assert!(
        lines < 40,
        "{lines} log lines about refused connections for one flood:\n{}",
        crate::support::tail(&log, 4000)
    );
    eprintln!(
        "flood of {flood}: server descriptors at most {most}, slowest close {slowest:?}, refusals {counts:?}, {lines} log lines"
    );
}

/// Past --http-max-connections a new connection is answered 503 with
/// Retry-After and closed at once, and counted; once connections go away,
/// new ones are served again.
#[tokio::test]
async fn past_the_connection_cap_a_new_connection_is_closed_at_once() {
    let (server, _tokens) = start(&[
        "--http-max-connections",
        "20",
        "--http-max-connections-per-peer",
        "0",
        "--http-header-timeout",
        "30",
    ])
    .await;
    let port = server.port;
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(
            TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect one of the 20"),
        );
    }
    // Accepted in the order they were made: the 21st comes after the 20.
    let mut extra = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect the 21st");
    let ending = read_until_closed(&mut extra, Instant::now() + Duration::from_secs(2)).await;
    assert!(
        ending.is_closed(),
        "the 21st connection past --http-max-connections 20 was still open after 2 s: {ending:?}"
    );
    let answer = String::from_utf8_lossy(ending.bytes());
    assert!(
        answer.starts_with("HTTP/1.1 503 ")
            && answer.contains("Retry-After: ")
            && answer.contains("--http-max-connections"),
        "the 21st connection is told why before the close: {answer:?}"
    );
    let open = held.iter().filter(|s| still_open(s)).count();
    assert_eq!(open, 20, "the 20 connections within the cap must stay open");
    let counted = refusal_count(&server, "max_connections").await;
    assert!(counted >= 1, "max_connections not counted");

    drop(held);
    // The server sees them go (polled, bounded), then serves again.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        match initialize_from("127.0.0.1", port, ALPHA).await {
            // Until the server has seen them go, a new connection is still
            // answered 503 at accept.
            Ok(status) if status.starts_with("HTTP/1.1 503") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(status) => break status,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!(
                "no initialize served within 10 s of dropping the 20 connections: {e}; stderr:\n{}",
                crate::support::tail(&server.stderr_log(), 4000)
            ),
        }
    };
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let client = server
        .try_connect_at("/mcp", (), Some(ALPHA))
        .await
        .unwrap_or_else(|e| panic!("connect after the cap freed: {e:#}"));
    drop(client);
}

/// A request body that never arrives whole holds its connection for no
/// more than 6 times the header timeout.
#[tokio::test]
async fn a_request_body_that_never_arrives_is_cut_off() {
    let (server, _tokens) = start(&["--http-header-timeout", "1"]).await;
    let port = server.port;
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nAuthorization: Bearer {ALPHA}\r\n\
         Content-Length: 1000\r\n\r\n{{\"jsonrpc\""
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("write the head and 10 bytes of body");
    let sent = Instant::now();
    let ending = read_until_closed(&mut stream, sent + Duration::from_secs(6 + 5)).await;
    let took = sent.elapsed();
    assert!(
        ending.is_closed(),
        "a body 990 bytes short was still being waited for after {took:?}: {ending:?}"
    );
    let answer = String::from_utf8_lossy(ending.bytes()).into_owned();
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4") || answer.starts_with("HTTP/1.1 5"),
        "the answer to a body that never arrived ({}): {answer}",
        ending.how()
    );
    // The body gets 6 s (6 × the header timeout), not the head's 1 s.
    assert!(
        took >= Duration::from_secs(3),
        "the connection was closed after {took:?}, before the body's time was up: {answer}"
    );
    let counted = refusal_count(&server, "body_timeout").await;
    assert!(counted >= 1, "body_timeout not counted");
}

/// Reads one response (head, and a Content-Length body) off a keep-alive
/// connection; its head.
async fn read_response<R: AsyncBufReadExt + Unpin>(reader: &mut R) -> String {
    let exchange = async {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let length = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0; length];
        reader.read_exact(&mut body).await?;
        Ok::<_, std::io::Error>(head)
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .expect("a response within 30 s")
        .expect("read the response")
}

/// A keep-alive connection with nothing in flight is closed after the idle
/// timeout (and not after the shorter header timeout).
#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let (server, _tokens) =
        start(&["--http-idle-timeout", "3", "--http-header-timeout", "1"]).await;
    let stream = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .expect("connect");
    let mut stream = BufReader::new(stream);
    // The main listener wants the token for /healthz too.
    let request = format!(
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ALPHA}\r\n\r\n"
    );
    stream
        .get_mut()
        .write_all(request.as_bytes())
        .await
        .expect("write GET /healthz");
    let head = read_response(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let answered = Instant::now();
    let ending = read_until_closed(&mut stream, answered + Duration::from_secs(3 + 4)).await;
    let idle = answered.elapsed();
    assert!(
        ending.is_closed(),
        "a keep-alive connection idle for {idle:?} (--http-idle-timeout 3) is still open: {ending:?}"
    );
    assert!(
        ending.bytes().is_empty(),
        "bytes after the response: {:?}",
        String::from_utf8_lossy(ending.bytes())
    );
    assert!(
        idle >= Duration::from_secs(2),
        "an idle connection was closed after {idle:?}: the idle timeout is 3 s (the 1 s header timeout is for request heads)"
    );
    let counts = refusals(&server).await;
    assert!(
        counts["idle_timeout"] >= 1,
        "idle_timeout not counted: {counts:?}"
    );
}

/// A call that runs longer than both the idle and the header timeout is
/// answered: a response in progress is never cut.
#[tokio::test]
async fn a_call_in_progress_outlives_the_idle_and_header_timeouts() {
    let (server, _tokens) =
        start(&["--http-idle-timeout", "3", "--http-header-timeout", "1"]).await;
    let client = match server.try_connect_at("/mcp", (), Some(ALPHA)).await {
        Ok(c) => c,
        Err(e) => panic!("connect: {e:#}\nstderr:\n{}", server.stderr_log()),
    };
    let began = Instant::now();
    let out = call(
        client.peer(),
        "python_exec",
        json!({ "code": "import time; time.sleep(6); print('done')", "wait_s": 20 }),
    )
    .await;
    let took = began.elapsed();
    assert!(!out.is_error, "{out:#?}");
    let text = format!("{} {}", out.text, out.structured);
    assert!(text.contains("done"), "{out:#?}");
    assert!(
        took >= Duration::from_secs(6),
        "the call took {took:?}, shorter than its sleep"
    );
}

/// The server raises its soft open-files limit to the hard one at start: a
/// soft limit of 256 is what a flood of connections exhausts first.
#[tokio::test]
async fn the_server_raises_its_soft_open_files_limit_to_the_hard_one() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    let hard = lim.rlim_max.min(4096);
    assert!(
        hard > 256,
        "this process's hard NOFILE limit is {}",
        lim.rlim_max
    );
    let (_dir, tokens) = tokens_file(&[(ALPHA, "alpha")]);
    let args = ["--auth-token-file", path_str(&tokens), "--warm-pool", "0"];
    let hook = move || {
        let wanted = libc::rlimit {
            rlim_cur: 256,
            rlim_max: hard,
        };
        // SAFETY: setrlimit is async-signal-safe and reads the struct given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: the hook only calls setrlimit (async-signal-safe).
    let launch = unsafe { Launch::new(&args).pre_exec(hook) };
    let server = HttpServer::launch(launch).await;
    let pid = server_pid(&server);
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/limits: {e}"));
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no 'Max open files' in /proc/{pid}/limits:\n{limits}"));
    let values: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
    let (soft, max) = (values[0], values[1]);
    assert_eq!(
        (soft, max),
        (hard.to_string().as_str(), hard.to_string().as_str()),
        "the server's open-files limits (soft, hard): {line}"
    );
    let log = server.stderr_log();
    let wanted = format!("open files: soft limit raised from 256 to {hard}");
    assert!(log.contains(&wanted), "no '{wanted}' in the log:\n{log}");
}
