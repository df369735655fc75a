//! `--viewer` over plain HTTP (raw requests; the browser's side is
//! tests/viewer/browser_check.py): the security headers, pages without
//! data, agent text only inside JSON, Host/Origin/method refusals, names
//! that are paths, huge heads, the client cap, tenants' viewers each seeing
//! their own sessions, one-time tickets, and a stalled viewer that does not
//! slow a cell.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::support::{HttpServer, StdioServer, call, http_exchange, path_str, raw_http};

const ALPHA: &str = "alpha-view-token-0123456789";
const BETA: &str = "beta-view-token-01234567890";
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The viewer's own host name on loopback (its URL's).
pub(crate) const NAMED: &str = "ferrepl-viewer.localhost";

/// The viewer's port, from the line it prints at start.
pub(crate) fn viewer_port(stderr: &str) -> Option<u16> {
    let at = stderr.find("ferrepl viewer: http://ferrepl-viewer.localhost:")?;
    let rest = &stderr[at + "ferrepl viewer: http://ferrepl-viewer.localhost:".len()..];
    rest.split('/').next()?.parse().ok()
}

pub(crate) async fn stdio_viewer(extra: &[&str]) -> (StdioServer, u16) {
    let mut args = vec!["--viewer", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let server = StdioServer::start(&args).await;
    assert!(
        server
            .wait_stderr_contains("ferrepl viewer:", Duration::from_secs(20))
            .await,
        "{}",
        server.stderr_log()
    );
    let port = viewer_port(&server.stderr_log()).expect("the viewer's port");
    (server, port)
}

/// The Host a browser sends (the URL's; connections go to 127.0.0.1).
pub(crate) fn host(port: u16) -> String {
    format!("{NAMED}:{port}")
}

pub(crate) async fn get(port: u16, path: &str, extra: &[(&str, &str)]) -> (u16, String) {
    let h = host(port);
    let mut headers = vec![("Host", h.as_str())];
    headers.extend_from_slice(extra);
    http_exchange(port, "GET", path, &headers, "").await
}

pub(crate) async fn head_of(port: u16, path: &str, extra: &[(&str, &str)]) -> (u16, String) {
    let h = host(port);
    let mut headers = vec![("Host", h.as_str())];
    headers.extend_from_slice(extra);
    raw_http(port, "GET", path, &headers, "").await
}

#[tokio::test]
async fn pages_carry_no_data_and_every_response_the_security_headers() {
    let (server, port) = stdio_viewer(&[]).await;
    server
        .exec("print('<script>window.__pwned=1</script>')\n'</pre><img src=x onerror=alert(1)>'")
        .await;
    for path in [
        "/",
        "/s/default",
        "/api/sessions",
        "/api/s/default",
        "/viewer.js",
    ] {
        let (status, head) = head_of(port, path, &[]).await;
        assert_eq!(status, 200, "{path}: {head}");
        let lower = head.to_ascii_lowercase();
        assert!(
            lower.contains(&format!(
                "content-security-policy: {}",
                CSP.to_ascii_lowercase()
            )),
            "{path}: {head}"
        );
        assert!(
            lower.contains("x-content-type-options: nosniff"),
            "{path}: {head}"
        );
        assert!(
            lower.contains("referrer-policy: no-referrer"),
            "{path}: {head}"
        );
        assert!(
            !lower.contains("access-control-allow-origin"),
            "{path}: {head}"
        );
    }
    let (_, page) = get(port, "/s/default", &[]).await;
    assert!(
        !page.contains("__pwned") && !page.contains("onerror"),
        "{page}"
    );
    let (_, api) = head_of(port, "/api/s/default", &[]).await;
    assert!(
        api.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{api}"
    );
    let (_, body) = get(port, "/api/s/default", &[]).await;
    let view: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let cell = &view["cells"][0];
    assert_eq!(
        cell["stdout"], "<script>window.__pwned=1</script>\n",
        "{view}"
    );
    assert!(
        cell["value"]
            .as_str()
            .is_some_and(|v| v.contains("<img src=x")),
        "{view}"
    );
    // The full output: text/plain with nosniff.
    let (status, head) = head_of(port, "/s/default/cell/1/output.txt", &[]).await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("text/plain"), "{head}");
    // The notebook download.
    let (status, doc) = get(port, "/s/default/export.ipynb", &[]).await;
    assert_eq!(status, 200);
    let nb: serde_json::Value = serde_json::from_str(&doc).expect("a notebook");
    assert_eq!(nb["nbformat"], 4);
}

#[tokio::test]
async fn bad_hosts_origins_methods_names_and_heads_are_refused() {
    let (_server, port) = stdio_viewer(&[]).await;
    let (status, _) = http_exchange(port, "GET", "/", &[("Host", "evil.example")], "").await;
    assert_eq!(status, 403, "a foreign Host (DNS rebinding)");
    let (status, _) = get(port, "/api/sessions", &[("Origin", "http://evil.example")]).await;
    assert_eq!(status, 403, "a foreign Origin");
    let h = host(port);
    let (status, _) = http_exchange(port, "DELETE", "/api/s/default", &[("Host", &h)], "").await;
    assert!(status == 405 || status == 404, "{status}");
    let (status, _) = http_exchange(
        port,
        "POST",
        "/login",
        &[
            ("Host", &h),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "token=x",
    )
    .await;
    assert_eq!(status, 403, "a POST without its Origin");
    for path in [
        "/api/s/..%2F..%2Fetc%2Fpasswd",
        "/api/s/%2e%2e",
        "/s/..%2Fdefault/cell/1/output.txt",
        "/s/default/cell/1/image/0",
        "/s/nosuch/export.ipynb",
        "/j/..%2F..%2Fetc%2Fpasswd/output.txt",
        "/api/s/a%00b",
    ] {
        let (status, body) = get(port, path, &[]).await;
        assert!(status == 404 || status == 400, "{path}: {status} {body}");
        assert!(!body.contains("root:"), "{path}: {body}");
    }
    // A head far past the bound is not served.
    let huge = "x".repeat(200_000);
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let req = format!("GET / HTTP/1.1\r\nHost: {h}\r\nX-Big: {huge}\r\n\r\n");
    let _ = tcp.write_all(req.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut tcp, &mut buf),
    )
    .await;
    let text = String::from_utf8_lossy(&buf);
    assert!(!text.starts_with("HTTP/1.1 200"), "{text}");
    // Still serving.
    assert_eq!(get(port, "/", &[]).await.0, 200);
}

#[tokio::test]
async fn live_streams_are_capped_and_a_stalled_viewer_does_not_slow_a_cell() {
    let (server, port) = stdio_viewer(&["--viewer-max-clients", "1"]).await;
    server.exec("x = 1").await;
    // An event stream that is never read.
    let mut stalled = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let req = format!(
        "GET /events/s/default HTTP/1.1\r\nHost: {}\r\n\r\n",
        host(port)
    );
    stalled.write_all(req.as_bytes()).await.expect("send");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _) = head_of(port, "/events", &[]).await;
    assert_eq!(status, 503, "past --viewer-max-clients");
    let started = Instant::now();
    for _ in 0..5 {
        let out = server
            .exec("for i in range(20000):\n    print('line', i, 'x' * 200)")
            .await;
        assert!(!out.is_error, "{}", out.text);
    }
    let quick = Instant::now();
    server.exec("1 + 1").await;
    assert!(
        quick.elapsed() < Duration::from_secs(3),
        "a cell after the flood took {:?}",
        quick.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    drop(stalled);
}

#[tokio::test]
async fn an_event_stream_gives_the_history_and_resumes_after_last_event_id() {
    let (server, port) = stdio_viewer(&[]).await;
    for code in ["a = 1", "b = 2", "c = 3"] {
        server.exec(code).await;
    }
    let read = |last: Option<&'static str>| async move {
        let h = host(port);
        let mut headers = vec![("Host", h.clone())];
        if let Some(l) = last {
            headers.push(("Last-Event-ID", l.to_string()));
        }
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let mut req = "GET /events/s/default HTTP/1.1\r\n".to_string();
        for (k, v) in &headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        tcp.write_all(req.as_bytes()).await.expect("send");
        let mut buf = vec![0u8; 65536];
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            match tokio::time::timeout(
                Duration::from_millis(300),
                tokio::io::AsyncReadExt::read(&mut tcp, &mut buf),
            )
            .await
            {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    };
    let all = read(None).await;
    for id in ["id: 1\n", "id: 2\n", "id: 3\n"] {
        assert!(all.contains(id), "{all}");
    }
    assert!(all.contains("event: path"), "{all}");
    let resumed = read(Some("2")).await;
    assert!(resumed.contains("id: 3\n"), "{resumed}");
    assert!(
        !resumed.contains("id: 1\n") && !resumed.contains("id: 2\n"),
        "{resumed}"
    );
}

/// A server with tenants alpha and beta (tokens `[alpha, beta]`) over HTTP
/// whose viewer tokens are their MCP tokens (a tokens file in `dir`), and
/// `extra` flags.
pub async fn tenants_with_their_mcp_tokens(
    dir: &std::path::Path,
    [alpha, beta]: [&str; 2],
    extra: &[&str],
) -> HttpServer {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("{alpha} alpha\n{beta} beta\n")).expect("write");
    let mut args = vec![
        "--auth-token-file",
        path_str(&tokens),
        "--viewer",
        "127.0.0.1:0",
        "--viewer-tokens",
        path_str(&tokens),
        "--warm-pool",
        "0",
    ];
    args.extend_from_slice(extra);
    HttpServer::start(&args, &[]).await
}

#[tokio::test]
async fn tenants_viewers_see_their_own_sessions_and_tickets_work_once() {
    let dir = tempfile::tempdir().expect("dir");
    let server = tenants_with_their_mcp_tokens(dir.path(), [ALPHA, BETA], &[]).await;
    let log = server.stderr_log();
    let port = viewer_port(&log).expect("viewer port");
    let ticket_of = |tenant: &str| {
        log.lines()
            .find(|l| l.contains(&format!("(tenant {tenant})")))
            .and_then(|l| l.split("ticket=").nth(1))
            .and_then(|t| t.split_whitespace().next())
            .map(str::to_string)
            .expect("a ticket")
    };
    assert!(
        !log.contains(ALPHA) && !log.contains(BETA),
        "no token printed"
    );
    // No cookie, a wrong cookie.
    assert_eq!(get(port, "/api/sessions", &[]).await.0, 401);
    // Pages send a person to the login; data and streams are refused.
    for page in ["/", "/s/default", "/j/1"] {
        let (status, head) = head_of(port, page, &[]).await;
        assert!(status == 303 && head.contains("/login"), "{page}: {head}");
    }
    for data in ["/events/j/1", "/j/1/output.txt", "/events/s/default"] {
        assert_eq!(get(port, data, &[]).await.0, 401, "{data}");
    }
    let wrong = format!("ferrepl_viewer={}", "a".repeat(64));
    assert_eq!(
        get(port, "/api/sessions", &[("Cookie", &wrong)]).await.0,
        401
    );
    assert_eq!(get(port, "/events", &[]).await.0, 401);
    // A ticket, once.
    let ticket = ticket_of("alpha");
    let (status, head) = head_of(port, &format!("/login?ticket={ticket}"), &[]).await;
    assert_eq!(status, 303, "{head}");
    let cookie_line = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .expect("a cookie");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie_line.contains(attr), "{cookie_line}");
    }
    assert!(!cookie_line.contains(ALPHA) && !cookie_line.contains(&ticket));
    let alpha_cookie = cookie_line
        .split_once(':')
        .map(|(_, v)| v.trim())
        .and_then(|v| v.split(';').next())
        .expect("cookie")
        .to_string();
    assert_eq!(
        head_of(port, &format!("/login?ticket={ticket}"), &[])
            .await
            .0,
        403
    );
    // Beta logs in with its token through the form.
    let h = host(port);
    let origin = format!("http://{h}");
    let (status, head) = raw_http(
        port,
        "POST",
        "/login",
        &[
            ("Host", &h),
            ("Origin", &origin),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("token={BETA}"),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    let beta_cookie = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .and_then(|l| l.split_once(':'))
        .and_then(|(_, v)| v.trim().split(';').next())
        .expect("cookie")
        .to_string();
    // Alpha's session.
    let alpha = server.connect(Some(ALPHA)).await;
    call(
        alpha.peer(),
        "python_exec",
        json!({"code": "print('alpha secret')", "session": "secret"}),
    )
    .await;
    let (_, list) = get(port, "/api/sessions", &[("Cookie", &alpha_cookie)]).await;
    assert!(list.contains("\"secret\""), "{list}");
    let (_, list) = get(port, "/api/sessions", &[("Cookie", &beta_cookie)]).await;
    assert!(!list.contains("secret"), "{list}");
    for path in [
        "/api/s/secret",
        "/s/secret/cell/1/output.txt",
        "/s/secret/export.ipynb",
    ] {
        let (status, body) = get(port, path, &[("Cookie", &beta_cookie)]).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(!body.contains("alpha secret"));
        let (status, body) = get(port, path, &[("Cookie", &alpha_cookie)]).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
}

#[tokio::test]
async fn a_viewer_off_loopback_or_with_tenants_needs_viewer_tokens() {
    let dir = tempfile::tempdir().expect("dir");
    let secrets = tempfile::tempdir().expect("the server's token");
    let token = secrets.path().join("token");
    std::fs::write(&token, "server-token-0123456789abcdef\n").expect("write");
    let guarded = [
        "--viewer",
        "127.0.0.1:0",
        "--auth-token-file",
        path_str(&token),
    ];
    for args in [vec!["--viewer", "0.0.0.0:0"], guarded.to_vec()] {
        let out = tokio::process::Command::new(crate::support::server_binary())
            .args(&args)
            .arg("--workdir")
            .arg(dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .expect("run");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--viewer-tokens"), "{err}");
    }
}

/// An event stream read by hand: (event, id, data) as they come.
struct Events {
    tcp: tokio::net::TcpStream,
    /// Bytes read and not yet taken apart (the chunked body's framing).
    raw: Vec<u8>,
    /// The body so far, without its framing.
    body: Vec<u8>,
    head_done: bool,
}

impl Events {
    async fn open(port: u16, path: &str, last_id: Option<&str>) -> Events {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n", host(port));
        if let Some(id) = last_id {
            req.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        req.push_str("\r\n");
        tcp.write_all(req.as_bytes()).await.expect("send");
        Events {
            tcp,
            raw: Vec::new(),
            body: Vec::new(),
            head_done: false,
        }
    }

    /// Moves complete chunks from `raw` to `body`.
    fn unframe(&mut self) {
        if !self.head_done {
            let Some(at) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                return;
            };
            let head = String::from_utf8_lossy(&self.raw[..at]).to_string();
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            self.raw.drain(..at + 4);
            self.head_done = true;
        }
        loop {
            let Some(eol) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size = std::str::from_utf8(&self.raw[..eol])
                .ok()
                .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
                .expect("a chunk size");
            if self.raw.len() < eol + 2 + size + 2 {
                return;
            }
            self.body
                .extend_from_slice(&self.raw[eol + 2..eol + 2 + size]);
            self.raw.drain(..eol + 2 + size + 2);
        }
    }

    /// The next event, or None when the stream ends (or 60 s pass: a
    /// guard against a hang, not a timing).
    async fn next(&mut self) -> Option<(String, Option<String>, serde_json::Value)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(at) = self.body.windows(2).position(|w| w == b"\n\n") {
                let frame = String::from_utf8_lossy(&self.body[..at]).to_string();
                self.body.drain(..at + 2);
                let (mut event, mut id, mut data) = (String::new(), None, String::new());
                for line in frame.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_string();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_string());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                let data = serde_json::from_str(&data).expect("JSON data");
                return Some((event, id, data));
            }
            let mut buf = vec![0u8; 256 * 1024];
            let n = tokio::time::timeout_at(
                deadline,
                tokio::io::AsyncReadExt::read(&mut self.tcp, &mut buf),
            )
            .await
            .ok()?
            .ok()?;
            if n == 0 {
                return None;
            }
            self.raw.extend_from_slice(&buf[..n]);
            self.unframe();
        }
    }
}

#[tokio::test]
async fn a_running_cell_sends_its_code_once_and_only_the_end_of_its_output() {
    let (server, port) = stdio_viewer(&[]).await;
    server.exec("x = 1").await;
    let mut events = Events::open(port, "/events/s/default", None).await;
    // A cell whose code is past the cap, printing 50 MB (it spills to disk)
    // while the stream is open.
    let code = format!(
        "# {}\nimport sys, time\nfor i in range(50):\n    sys.stdout.write(str(i) + 'é' * 500_000 + '\\n')\n    sys.stdout.flush()\n    time.sleep(0.05)\nprint('done')",
        "c".repeat(70_000)
    );
    let started = server
        .call("python_exec", json!({"code": code, "wait_s": 0.2}))
        .await;
    assert!(!started.is_error, "{}", started.text);
    let mut codes = Vec::new();
    let mut sizes = Vec::new();
    let mut finished = None;
    while let Some((event, _, data)) = events.next().await {
        match event.as_str() {
            "running_cell" => codes.push(data),
            "running" if data.is_null() => {}
            "running" => {
                assert!(data.get("code").is_none(), "code resent: {data}");
                if let Some(tail) = data["output_tail"].as_str() {
                    assert!(tail.len() <= 64 * 1024, "a tail of {}", tail.len());
                }
                sizes.push(data["output_bytes"].as_u64().expect("bytes"));
            }
            "cell" if data["cell"] == 2 => {
                finished = Some(data);
                break;
            }
            _ => {}
        }
    }
    let finished = finished.expect("the cell's end on the stream");
    assert_eq!(codes.len(), 1, "{codes:?}");
    assert_eq!(codes[0]["cell"], 2);
    let shown = codes[0]["code"].as_str().expect("code");
    assert!(shown.len() <= 64 * 1024, "{}", shown.len());
    assert!(codes[0]["code_cut"].as_u64().is_some_and(|n| n > 4_000));
    assert!(finished["code_cut"].as_u64().is_some_and(|n| n > 4_000));
    let grew = sizes.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(grew >= 2, "output_bytes did not grow along: {sizes:?}");
    assert!(sizes.last().is_some_and(|n| *n > 10_000_000), "{sizes:?}");
    let wait = server.call("python_wait", json!({"wait_s": 60})).await;
    assert!(wait.text.contains("done"), "{}", wait.text);
}

#[tokio::test]
async fn a_job_page_streams_its_output_and_a_reconnect_resumes() {
    let (server, port) = stdio_viewer(&["--tools", "all"]).await;
    let cmd =
        "for i in 1 2 3 4 5; do echo \"line $i <b>\"; sleep 0.3; done; echo '<script>end</script>'";
    let started = server
        .call("shell_exec", json!({"command": cmd, "wait_s": 0.1}))
        .await;
    assert!(!started.is_error, "{}", started.text);
    let job = started.structured["job"]
        .as_str()
        .expect("job id")
        .to_string();
    let (status, page) = get(port, &format!("/j/{job}"), &[]).await;
    assert_eq!(status, 200);
    assert!(!page.contains("<b>"), "no data in the page");
    let expected: String = (1..=5)
        .map(|i| format!("line {i} <b>\n"))
        .chain(["<script>end</script>\n".to_string()])
        .collect();
    let mut events = Events::open(port, &format!("/events/j/{job}"), None).await;
    let mut text = String::new();
    let mut first_id = None;
    let mut outputs = 0;
    let mut exited = false;
    while !(exited && text == expected) {
        let Some((event, id, data)) = events.next().await else {
            panic!("the stream ended: {text:?}");
        };
        match event.as_str() {
            "job" => {
                assert_eq!(data["command"], cmd);
                exited = data["status"] == "exited";
            }
            "output" => {
                assert_eq!(data["cut"], false);
                assert_eq!(data["from"].as_u64(), Some(text.len() as u64));
                text.push_str(data["text"].as_str().expect("text"));
                outputs += 1;
                if first_id.is_none() && !text.is_empty() {
                    first_id = id.map(|i| (i, text.clone()));
                }
            }
            _ => {}
        }
    }
    assert!(outputs >= 3, "output came along, not at once: {outputs}");
    // A reconnect after the first output gets the rest only.
    let (id, seen) = first_id.expect("an output event's id");
    let mut events = Events::open(port, &format!("/events/j/{job}"), Some(&id)).await;
    let mut rest = String::new();
    while seen.len() + rest.len() < expected.len() {
        let (event, _, data) = events.next().await.expect("an event");
        if event == "output" {
            rest.push_str(data["text"].as_str().expect("text"));
        }
    }
    assert_eq!(format!("{seen}{rest}"), expected);
    let (status, full) = get(port, &format!("/j/{job}/output.txt"), &[]).await;
    assert_eq!(status, 200);
    assert!(full.contains("<script>end</script>"), "{full}");
    // A job with more than the live bound: its end, marked as cut.
    let big = server
        .call(
            "shell_exec",
            json!({"command": "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo tail-mark", "wait_s": 30}),
        )
        .await;
    let big_job = big.structured["job"].as_str().expect("job id").to_string();
    let mut events = Events::open(port, &format!("/events/j/{big_job}"), None).await;
    loop {
        let (event, _, data) = events.next().await.expect("an event");
        if event == "output" {
            assert_eq!(data["cut"], true, "{}", data["from"]);
            let text = data["text"].as_str().expect("text");
            assert!(text.len() <= 64 * 1024 && text.ends_with("tail-mark\n"));
            break;
        }
    }
    // A long command: cut in the list, whole (to 64 KiB) on its page.
    let long = format!(": {}; echo long", "y".repeat(5000));
    let started = server
        .call("shell_exec", json!({"command": long, "wait_s": 10}))
        .await;
    let long_job = started.structured["job"]
        .as_str()
        .expect("job id")
        .to_string();
    let (_, list) = get(port, "/api/sessions", &[]).await;
    let list: serde_json::Value = serde_json::from_str(&list).expect("JSON");
    let row = list["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["job"] == long_job.as_str()))
        .expect("its row");
    assert_eq!(row["command"].as_str().map(str::len), Some(1024), "{row}");
    assert_eq!(row["command_cut"].as_u64(), Some(long.len() as u64 - 1024));
    let mut events = Events::open(port, &format!("/events/j/{long_job}"), None).await;
    let (event, _, data) = events.next().await.expect("an event");
    assert_eq!(event, "job");
    assert_eq!(data["command"], long.as_str());
}

#[tokio::test]
async fn the_download_follows_the_branch_and_full_output_is_not_held_by_a_stalled_reader() {
    let (server, port) = stdio_viewer(&[]).await;
    server.exec("a = 'first'").await;
    server.exec("b = 'second branch'").await;
    let other = server
        .call("python_exec", json!({"code": "c = 'third'", "parent": 1}))
        .await;
    assert!(!other.is_error, "{}", other.text);
    let (status, current) = get(port, "/s/default/export.ipynb", &[]).await;
    assert_eq!(status, 200);
    assert!(current.contains("third") && !current.contains("second branch"));
    let (status, head) = head_of(port, "/s/default/export.ipynb?head=2", &[]).await;
    assert_eq!(status, 200);
    assert!(head.contains("default-cell2.ipynb"), "{head}");
    let (_, branch) = get(port, "/s/default/export.ipynb?head=2", &[]).await;
    assert!(branch.contains("second branch") && !branch.contains("third"));
    assert_eq!(
        get(port, "/s/default/export.ipynb?head=99", &[]).await.0,
        404
    );

    // 20 MB of output asked for and never read: past the send deadline the
    // response ends unfinished instead of waiting on the reader forever.
    server.exec("print('z' * 20_000_000)").await;
    // A small receive buffer (no autotuning): the kernel holds little.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(64 * 1024).expect("rcvbuf");
    let mut tcp = socket
        .connect(([127, 0, 0, 1], port).into())
        .await
        .expect("connect");
    let req = format!(
        "GET /s/default/cell/4/output.txt HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        host(port)
    );
    tcp.write_all(req.as_bytes()).await.expect("send");
    // The stalled reader (the server gives a chunk 5 s).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::io::AsyncReadExt::read_to_end(&mut tcp, &mut got),
    )
    .await;
    assert!(
        read.is_ok(),
        "the response was left open: {} bytes",
        got.len()
    );
    assert!(
        got.len() < 20_000_000 && !got.ends_with(b"0\r\n\r\n"),
        "{} bytes, complete",
        got.len()
    );
    // Read at once, it is whole.
    let (status, full) = get(port, "/s/default/cell/4/output.txt", &[]).await;
    assert_eq!(status, 200);
    assert!(full.matches('z').count() >= 20_000_000);
}

#[tokio::test]
async fn the_icon_is_served_without_a_login_under_the_same_host_origin_and_method_rules() {
    let dir = tempfile::tempdir().expect("dir");
    let server = tenants_with_their_mcp_tokens(dir.path(), [ALPHA, BETA], &[]).await;
    let port = viewer_port(&server.stderr_log()).expect("viewer port");
    // No login: the icon is the same for everyone; data still needs one.
    assert_eq!(get(port, "/api/sessions", &[]).await.0, 401);
    let (status, head) = head_of(port, "/favicon.svg", &[]).await;
    assert_eq!(status, 200, "{head}");
    let lower = head.to_ascii_lowercase();
    for header in [
        "content-type: image/svg+xml".to_string(),
        format!("content-security-policy: {}", CSP.to_ascii_lowercase()),
        "x-content-type-options: nosniff".to_string(),
    ] {
        assert!(lower.contains(&header), "{header}: {head}");
    }
    let (_, icon) = get(port, "/favicon.svg", &[]).await;
    assert!(
        icon.starts_with("<svg") && !icon.contains("<script"),
        "{icon}"
    );
    // A foreign Host or Origin gets the refusal every route gets.
    let refused = http_exchange(port, "GET", "/", &[("Host", "evil.example")], "").await;
    assert_eq!(refused.0, 403);
    let got = http_exchange(port, "GET", "/favicon.svg", &[("Host", "evil.example")], "").await;
    assert_eq!(got, refused, "a foreign Host (DNS rebinding)");
    let origin = [("Origin", "http://evil.example")];
    assert_eq!(
        get(port, "/favicon.svg", &origin).await,
        get(port, "/login", &origin).await,
        "a foreign Origin"
    );
    assert_eq!(get(port, "/favicon.svg", &origin).await.0, 403);
    // Read-only: no other method, with or without an Origin of ours.
    let h = host(port);
    let ours = format!("http://{h}");
    for method in ["PUT", "DELETE", "PATCH", "OPTIONS"] {
        let (status, body) = http_exchange(port, method, "/favicon.svg", &[("Host", &h)], "").await;
        assert_eq!(status, 405, "{method}: {body}");
    }
    let (status, _) = http_exchange(port, "POST", "/favicon.svg", &[("Host", &h)], "").await;
    assert_eq!(status, 403, "a POST without its Origin");
    let (status, _) = http_exchange(
        port,
        "POST",
        "/favicon.svg",
        &[("Host", &h), ("Origin", &ours)],
        "",
    )
    .await;
    assert_eq!(status, 405, "the icon takes no POST");
    // Each page names it.
    let (_, page) = get(port, "/login", &[]).await;
    assert!(
        page.contains("rel=\"icon\" href=\"/favicon.svg\""),
        "{page}"
    );
}

#[tokio::test]
async fn only_a_cell_with_output_offers_its_full_output() {
    let (server, port) = stdio_viewer(&[]).await;
    server.exec("print('printed')").await;
    server.exec("6 * 7").await;
    server.exec("1 / 0").await;
    let (_, body) = get(port, "/api/s/default", &[]).await;
    let view: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let offered: Vec<_> = view["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .map(|c| (c["cell"].as_u64(), c["full_output"].as_bool()))
        .collect();
    assert_eq!(
        offered,
        [
            (Some(1), Some(true)),
            (Some(2), Some(false)),
            (Some(3), Some(false))
        ],
        "{view}"
    );
    // (The body as sent: chunked.)
    let (status, text) = get(port, "/s/default/cell/1/output.txt", &[]).await;
    assert!(
        status == 200 && text.contains("printed\n"),
        "{status} {text}"
    );
}
