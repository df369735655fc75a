//! Who may reach the viewer (`--viewer`), through the real binary: the
//! login cookie only on `ferrepl-viewer.localhost` (never on a loopback
//! literal, whose cookies every loopback port gets), the viewer's own
//! Host/Origin rules, Secure behind TLS; viewer tokens reloaded on SIGHUP
//! and a revoked tenant's logins and streams ended; short viewer tokens
//! refused; failed logins throttled; live views shared per tenant; names
//! made of dots.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{HttpServer, http_exchange, path_str, raw_http};
use crate::viewer::{NAMED, get, head_of, host, stdio_viewer, viewer_port};

const ALPHA: &str = "alpha-mcp-token-0123456789";
const BETA: &str = "beta-mcp-token-01234567890";
const ALPHA_VIEW: &str = "alpha-view-token-0123456789";
const BETA_VIEW: &str = "beta-view-token-01234567890";
const WAIT: Duration = Duration::from_secs(20);

/// A server with tenants alpha and beta and their viewer tokens.
async fn tenants_viewer(
    dir: &Path,
    viewer_tokens: &str,
    extra: &[&str],
) -> (HttpServer, u16, std::path::PathBuf, std::path::PathBuf) {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("{ALPHA} alpha\n{BETA} beta\n")).expect("write");
    let views = dir.join("views");
    std::fs::write(&views, viewer_tokens).expect("write");
    let mut args = vec![
        "--auth-token-file",
        path_str(&tokens),
        "--viewer",
        "127.0.0.1:0",
        "--viewer-tokens",
        path_str(&views),
        "--warm-pool",
        "0",
    ];
    args.extend_from_slice(extra);
    let server = HttpServer::start(&args, &[]).await;
    let port = viewer_port(&server.stderr_log()).expect("the viewer's port");
    (server, port, tokens, views)
}

fn both_views() -> String {
    format!("{ALPHA_VIEW} alpha\n{BETA_VIEW} beta\n")
}

/// POST /login with `token` as a browser on `host` would; the response head.
async fn post_login(port: u16, host: &str, token: &str) -> (u16, String) {
    let origin = format!("http://{host}");
    raw_http(
        port,
        "POST",
        "/login",
        &[
            ("Host", host),
            ("Origin", &origin),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("token={token}"),
    )
    .await
}

fn header_of<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A login's cookie ("name=value") from a login response's head.
fn cookie_of(head: &str) -> String {
    header_of(head, "set-cookie")
        .and_then(|v| v.split(';').next())
        .unwrap_or_else(|| panic!("no cookie: {head}"))
        .to_string()
}

async fn login(port: u16, token: &str) -> String {
    let (status, head) = post_login(port, &host(port), token).await;
    assert_eq!(status, 303, "{head}");
    cookie_of(&head)
}

/// An open event stream (its head read, status 200).
async fn open_stream(port: u16, path: &str, cookie: &str) -> tokio::net::TcpStream {
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nCookie: {cookie}\r\n\r\n",
        host(port)
    );
    tcp.write_all(req.as_bytes()).await.expect("send");
    let got = read_until(&mut tcp, "event: ", WAIT).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    tcp
}

/// Reads until `needle` arrives, the stream ends or `limit` passes.
async fn read_until(tcp: &mut tokio::net::TcpStream, needle: &str, limit: Duration) -> String {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16384];
    let _ = tokio::time::timeout(limit, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            if String::from_utf8_lossy(&got).contains(needle) {
                return;
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

/// Whether a stream has ended (its last chunk, or the connection closed)
/// within `limit`.
async fn stream_ends(tcp: &mut tokio::net::TcpStream, limit: Duration) -> bool {
    let mut buf = vec![0u8; 16384];
    let mut got = Vec::new();
    tokio::time::timeout(limit, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            if got.ends_with(b"0\r\n\r\n") {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// Sends SIGHUP and waits until the log holds `needle` `n` times.
async fn sighup(server: &HttpServer, needle: &str, n: usize) {
    let pid = nix::unistd::Pid::from_raw(server.child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    let deadline = tokio::time::Instant::now() + WAIT;
    while server.stderr_log().matches(needle).count() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {needle:?} x{n}:\n{}",
            server.stderr_log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn cookies_are_set_only_on_the_viewers_own_name_and_hosts_origins_are_its_own() {
    let dir = tempfile::tempdir().expect("dir");
    let (server, port, _, _) =
        tenants_viewer(dir.path(), &both_views(), &["--allow-host", "evil.example"]).await;
    let log = server.stderr_log();
    assert!(
        log.contains(&format!("ferrepl viewer: http://{NAMED}:{port}/")),
        "{log}"
    );
    let ticket = log
        .lines()
        .find(|l| l.contains("(tenant alpha)"))
        .and_then(|l| l.split("ticket=").nth(1))
        .and_then(|t| t.split_whitespace().next())
        .expect("a ticket")
        .to_string();
    // On a loopback literal: sent to the named host, no cookie, the
    // ticket not used up.
    for literal in ["127.0.0.1", "localhost", "[::1]"] {
        let h = format!("{literal}:{port}");
        let path = format!("/login?ticket={ticket}");
        let (status, head) = raw_http(port, "GET", &path, &[("Host", &h)], "").await;
        assert_eq!(status, 303, "{head}");
        assert_eq!(
            header_of(&head, "location"),
            Some(format!("http://{NAMED}:{port}/login?ticket={ticket}").as_str())
        );
        assert!(header_of(&head, "set-cookie").is_none(), "{head}");
        let (status, head) = post_login(port, &h, ALPHA_VIEW).await;
        assert_eq!(status, 303, "{head}");
        assert!(header_of(&head, "set-cookie").is_none(), "{head}");
        // The form itself is served on the named host only.
        let (status, _) = raw_http(port, "GET", "/login", &[("Host", &h)], "").await;
        assert_eq!(status, 303);
    }
    let (status, head) = head_of(port, &format!("/login?ticket={ticket}"), &[]).await;
    assert_eq!(status, 303, "{head}");
    let cookie_line = header_of(&head, "set-cookie").expect("a cookie");
    assert!(!cookie_line.contains("Secure"), "plain HTTP: {cookie_line}");
    let alpha = cookie_of(&head);
    assert_eq!(
        get(port, "/api/sessions", &[("Cookie", &alpha)]).await.0,
        200
    );
    // Another port of the named host, the MCP listener's --allow-host, a
    // Host without the port: not the viewer's.
    for bad in [
        format!("{NAMED}:{}", port.wrapping_add(1)),
        "evil.example".to_string(),
        format!("evil.example:{port}"),
        NAMED.to_string(),
    ] {
        let (status, body) = http_exchange(port, "GET", "/", &[("Host", &bad)], "").await;
        assert_eq!(status, 403, "{bad}: {body}");
    }
    // An agent's page on another loopback port is not an Origin of ours
    // (the MCP listener accepts http://localhost on any port).
    let h = host(port);
    for origin in [
        format!("http://localhost:{}", port.wrapping_add(1)),
        format!("http://{NAMED}:{}", port.wrapping_add(1)),
        format!("http://127.0.0.1:{port}"),
    ] {
        let (status, _) = raw_http(
            port,
            "POST",
            "/login",
            &[
                ("Host", &h),
                ("Origin", &origin),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &format!("token={BETA_VIEW}"),
        )
        .await;
        assert_eq!(status, 403, "{origin}");
        let (status, _) = get(
            port,
            "/api/sessions",
            &[("Origin", &origin), ("Cookie", &alpha)],
        )
        .await;
        assert_eq!(status, 403, "{origin}");
    }
}

#[tokio::test]
async fn behind_tls_a_named_host_gets_a_secure_cookie() {
    let dir = tempfile::tempdir().expect("dir");
    let views = dir.path().join("views");
    std::fs::write(&views, format!("{ALPHA_VIEW}\n")).expect("write");
    let server = crate::support::StdioServer::start(&[
        "--viewer",
        "127.0.0.1:0",
        "--viewer-tokens",
        path_str(&views),
        "--viewer-allow-host",
        "https://view.example",
    ])
    .await;
    assert!(
        server
            .wait_stderr_contains("served on 127.0.0.1:", WAIT)
            .await
    );
    let log = server.stderr_log();
    assert!(
        log.contains("ferrepl viewer: https://view.example/"),
        "{log}"
    );
    let port: u16 = log
        .split("served on 127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .expect("the port");
    let (status, head) = raw_http(
        port,
        "POST",
        "/login",
        &[
            ("Host", "view.example"),
            ("Origin", "https://view.example"),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("token={ALPHA_VIEW}"),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    let cookie = header_of(&head, "set-cookie").expect("a cookie");
    assert!(cookie.contains("; Secure"), "{cookie}");
    // The same name over plain HTTP is not its Origin.
    let (status, _) = raw_http(
        port,
        "POST",
        "/login",
        &[
            ("Host", "view.example"),
            ("Origin", "http://view.example"),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("token={ALPHA_VIEW}"),
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn a_revoked_tenants_viewer_logins_and_streams_end_on_sighup() {
    let dir = tempfile::tempdir().expect("dir");
    let (server, port, tokens, views) = tenants_viewer(dir.path(), &both_views(), &[]).await;
    let reloaded = "SIGHUP: viewer tokens reloaded";
    let alpha = login(port, ALPHA_VIEW).await;
    let beta = login(port, BETA_VIEW).await;
    let mut alpha_feed = open_stream(port, "/events", &alpha).await;
    let mut beta_feed = open_stream(port, "/events", &beta).await;

    // Gone from the viewer tokens (the server still serves alpha).
    std::fs::write(&views, format!("{BETA_VIEW} beta\n")).expect("write");
    sighup(&server, reloaded, 1).await;
    assert!(
        stream_ends(&mut alpha_feed, Duration::from_secs(5)).await,
        "alpha's stream still open"
    );
    assert_eq!(
        get(port, "/api/sessions", &[("Cookie", &alpha)]).await.0,
        401
    );
    assert_eq!(head_of(port, "/", &[("Cookie", &alpha)]).await.0, 303);
    assert_eq!(post_login(port, &host(port), ALPHA_VIEW).await.0, 403);
    assert_eq!(
        get(port, "/api/sessions", &[("Cookie", &beta)]).await.0,
        200
    );

    // Back in the viewer tokens, then revoked on the server.
    std::fs::write(&views, both_views()).expect("write");
    sighup(&server, reloaded, 2).await;
    let alpha = login(port, ALPHA_VIEW).await;
    let mut alpha_feed = open_stream(port, "/events", &alpha).await;
    std::fs::write(&tokens, format!("{BETA} beta\n")).expect("write");
    sighup(&server, reloaded, 3).await;
    assert!(
        stream_ends(&mut alpha_feed, Duration::from_secs(5)).await,
        "a revoked tenant's stream still open"
    );
    assert_eq!(
        get(port, "/api/sessions", &[("Cookie", &alpha)]).await.0,
        401
    );
    assert_eq!(post_login(port, &host(port), ALPHA_VIEW).await.0, 403);

    // A file that cannot be used keeps the tokens as they were.
    std::fs::write(&views, "short beta\n").expect("write");
    sighup(&server, "viewer tokens were not reloaded", 1).await;
    assert!(server.stderr_log().contains("shorter than 16"));

    // Beta saw none of it: its stream is still open, its login works.
    assert!(
        !stream_ends(&mut beta_feed, Duration::from_millis(500)).await,
        "beta's stream ended"
    );
    assert_eq!(
        get(port, "/api/sessions", &[("Cookie", &beta)]).await.0,
        200
    );
    drop(open_stream(port, "/events", &beta).await);
}

#[tokio::test]
async fn short_viewer_tokens_are_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    // The tokens outside the workspace, where a session could read them.
    let work = tempfile::tempdir().expect("workspace");
    let views = dir.path().join("views");
    std::fs::write(&views, "short\n").expect("write");
    let out = tokio::process::Command::new(crate::support::server_binary())
        .args([
            "--viewer",
            "127.0.0.1:0",
            "--viewer-tokens",
            path_str(&views),
        ])
        .arg("--workdir")
        .arg(work.path())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--viewer-tokens") && err.contains("shorter than 16"),
        "{err}"
    );
}

#[tokio::test]
async fn failed_logins_are_throttled_per_address() {
    let dir = tempfile::tempdir().expect("dir");
    let views = dir.path().join("views");
    std::fs::write(&views, format!("{ALPHA_VIEW}\n")).expect("write");
    let (_server, port) = stdio_viewer(&["--viewer-tokens", path_str(&views)]).await;
    let h = host(port);
    for n in 0..10 {
        let (status, _) = post_login(port, &h, &format!("wrong-token-{n:010}")).await;
        assert_eq!(status, 403, "attempt {n}");
    }
    // Even the right token waits now, and so does a wrong ticket.
    let (status, head) = post_login(port, &h, ALPHA_VIEW).await;
    assert_eq!(status, 429, "{head}");
    let wait: u64 = header_of(&head, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=60).contains(&wait), "{wait}");
    let (status, body) = get(port, &format!("/login?ticket={}", "0".repeat(64)), &[]).await;
    assert_eq!(status, 429);
    assert!(body.contains("try again in"), "{body}");
}

#[tokio::test]
async fn each_tenant_holds_at_most_its_share_of_live_views() {
    let dir = tempfile::tempdir().expect("dir");
    // The viewer tokens are the MCP tokens here: warned about.
    let server = crate::viewer::tenants_with_their_mcp_tokens(
        dir.path(),
        [ALPHA, BETA],
        &["--viewer-max-clients", "2"],
    )
    .await;
    let log = server.stderr_log();
    assert!(log.contains("also an MCP token"), "{log}");
    let port = viewer_port(&log).expect("the viewer's port");
    let alpha = login(port, ALPHA).await;
    let beta = login(port, BETA).await;
    let _first = open_stream(port, "/events", &alpha).await;
    let (status, body) = get(port, "/events", &[("Cookie", &alpha)]).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("share (1 of --viewer-max-clients 2)"),
        "{body}"
    );
    // Beta's place was kept.
    let _second = open_stream(port, "/events", &beta).await;
}

#[tokio::test]
async fn names_made_of_dots_are_not_names() {
    let (_server, port) = stdio_viewer(&[]).await;
    for path in [
        "/s/%2e%2e",
        "/s/.",
        "/api/s/%2e",
        "/s/%2e%2e%2e/export.ipynb",
    ] {
        let (status, _) = get(port, path, &[]).await;
        assert_eq!(status, 404, "{path}");
    }
    assert_eq!(get(port, "/s/default", &[]).await.0, 200);
}

/// With tenants and --network on, an agent's own web server on the
/// viewer's host could be sent another tenant's cookie (cookies ignore
/// ports): such a server starts only with a name behind TLS, and then only
/// that name gets a cookie; a login on the viewer's own address is sent
/// there without one.
#[tokio::test]
async fn with_tenants_and_the_network_on_only_a_name_behind_tls_gets_a_cookie() {
    let dir = tempfile::tempdir().expect("dir");
    let work = tempfile::tempdir().expect("workspace");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{ALPHA} alpha\n{BETA} beta\n")).expect("write");
    let views = dir.path().join("views");
    std::fs::write(&views, both_views()).expect("write");
    let base = [
        "--http",
        "127.0.0.1:0",
        "--auth-token-file",
        path_str(&tokens),
        "--viewer",
        "127.0.0.1:0",
        "--viewer-tokens",
        path_str(&views),
        "--warm-pool",
        "0",
    ];
    for unconfined in [["--network", "on"], ["--sandbox", "off"]] {
        let out = tokio::process::Command::new(crate::support::server_binary())
            .args(base)
            .args(unconfined)
            .arg("--workdir")
            .arg(work.path())
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--viewer-allow-host https://"),
            "{unconfined:?}: {err}"
        );
    }
    let mut args = base[2..].to_vec();
    args.extend([
        "--network",
        "on",
        "--viewer-allow-host",
        "https://view.example",
    ]);
    let server = HttpServer::start(&args, &[]).await;
    let log = server.stderr_log();
    let port: u16 = log
        .split("(served on 127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the viewer's address: {log}"));
    let (status, head) = post_login(port, &format!("{NAMED}:{port}"), ALPHA_VIEW).await;
    assert_eq!(status, 303, "{head}");
    assert_eq!(
        header_of(&head, "location"),
        Some("https://view.example/login"),
        "{head}"
    );
    assert!(!head.to_ascii_lowercase().contains("set-cookie"), "{head}");
    let origin = "https://view.example";
    let (status, head) = raw_http(
        port,
        "POST",
        "/login",
        &[
            ("Host", "view.example"),
            ("Origin", origin),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("token={ALPHA_VIEW}"),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("a cookie on the TLS name: {head}"));
    assert!(cookie.contains("Secure"), "{cookie}");
}

/// The one-time login link printed at start for `tenant` (None: the bare
/// token's).
fn printed_ticket(log: &str, tenant: Option<&str>) -> String {
    log.lines()
        .filter(|l| l.contains("login?ticket="))
        .find(|l| tenant.is_none_or(|t| l.contains(&format!("(tenant {t})"))))
        .and_then(|l| l.split("ticket=").nth(1))
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_else(|| panic!("a ticket for {tenant:?}: {log}"))
        .to_string()
}

/// Logs in with a ticket; the cookie.
async fn ticket_login(port: u16, ticket: &str) -> String {
    let (status, head) = head_of(port, &format!("/login?ticket={ticket}"), &[]).await;
    assert_eq!(status, 303, "{head}");
    cookie_of(&head)
}

/// Replacing a tenant's viewer token ends the logins made with it and
/// with that tenant's tickets, and their streams; the other tenant's
/// logins (its token unchanged) hold.
#[tokio::test]
async fn a_replaced_viewer_token_ends_the_logins_made_with_it_on_sighup() {
    const BETA_VIEW2: &str = "beta-view-token-replaced-0123";
    let dir = tempfile::tempdir().expect("dir");
    let (server, port, _, views) = tenants_viewer(dir.path(), &both_views(), &[]).await;
    let log = server.stderr_log();
    let alpha = login(port, ALPHA_VIEW).await;
    let beta = login(port, BETA_VIEW).await;
    let alpha_ticket = ticket_login(port, &printed_ticket(&log, Some("alpha"))).await;
    let beta_ticket = ticket_login(port, &printed_ticket(&log, Some("beta"))).await;
    let mut beta_feed = open_stream(port, "/events", &beta).await;
    for cookie in [&alpha, &beta, &alpha_ticket, &beta_ticket] {
        assert_eq!(
            get(port, "/api/sessions", &[("Cookie", cookie)]).await.0,
            200
        );
    }

    std::fs::write(&views, format!("{ALPHA_VIEW} alpha\n{BETA_VIEW2} beta\n")).expect("write");
    sighup(&server, "2 viewer login(s) of tenant 'beta' ended", 1).await;
    assert!(
        stream_ends(&mut beta_feed, Duration::from_secs(5)).await,
        "the stream of a replaced token's login still open"
    );
    for cookie in [&beta, &beta_ticket] {
        assert_eq!(
            get(port, "/api/sessions", &[("Cookie", cookie)]).await.0,
            401
        );
    }
    for cookie in [&alpha, &alpha_ticket] {
        assert_eq!(
            get(port, "/api/sessions", &[("Cookie", cookie)]).await.0,
            200
        );
    }
    assert_eq!(post_login(port, &host(port), BETA_VIEW).await.0, 403);
    let beta = login(port, BETA_VIEW2).await;
    assert_eq!(
        get(port, "/api/sessions", &[("Cookie", &beta)]).await.0,
        200
    );
}

/// POST /login with `token` from the local address `from`; the status.
async fn post_login_from(from: [u8; 4], port: u16, token: &str) -> u16 {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((from, 0)))
        .expect("bind a loopback address");
    let mut tcp = socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("connect");
    let h = host(port);
    let body = format!("token={token}");
    let req = format!(
        "POST /login HTTP/1.1\r\nHost: {h}\r\nOrigin: http://{h}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(req.as_bytes()).await.expect("send");
    let head = read_until(&mut tcp, "\r\n\r\n", WAIT).await;
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status: {head}"))
}

/// Other 127/8 addresses are the same peer as 127.0.0.1, and a ticket logs
/// in even when its peer has failed too often.
#[tokio::test]
async fn other_loopback_addresses_share_a_limit_and_a_ticket_still_logs_in() {
    let dir = tempfile::tempdir().expect("dir");
    let views = dir.path().join("views");
    std::fs::write(&views, format!("{ALPHA_VIEW}\n")).expect("write");
    let (server, port) = stdio_viewer(&["--viewer-tokens", path_str(&views)]).await;
    let ticket = printed_ticket(&server.stderr_log(), None);
    for n in 0..10u8 {
        let status =
            post_login_from([127, 0, 0, 2 + n], port, &format!("wrong-token-{n:010}")).await;
        assert_eq!(status, 403, "attempt {n}");
    }
    assert_eq!(post_login(port, &host(port), ALPHA_VIEW).await.0, 429);
    let cookie = ticket_login(port, &ticket).await;
    assert_eq!(
        get(port, "/api/sessions", &[("Cookie", &cookie)]).await.0,
        200
    );
}
