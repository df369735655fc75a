//! The streamable HTTP transport: the same tools over HTTP, Host/Origin
//! validation, and the bearer token.

use crate::support::{
    Client, HttpServer, ToolOutput, call, exec_args, http_exchange, mcp_post_headers,
    mcp_session_id, raw_http, raw_post_mcp,
};
use serde_json::json;

async fn exec(client: &Client, code: &str) -> ToolOutput {
    call(client.peer(), "python_exec", json!({ "code": code })).await
}

#[tokio::test]
async fn http_runs_cells_with_state_errors_and_crash_recovery() {
    let mut server = HttpServer::start(&[], &[]).await;
    let client = server.connect(None).await;

    let first = exec(&client, "x = 41").await;
    first.assert_ok();
    assert_eq!(first.cell(), 1);
    let second = exec(&client, "x + 1").await;
    second.assert_ok();
    assert_eq!(second.value(), Some("42"));
    assert_eq!(second.cell(), 2);

    let printed = exec(&client, "print('over http')").await;
    printed.assert_ok();
    assert_eq!(printed.str_field("stdout"), "over http\n");

    let failed = exec(&client, "1/0").await;
    failed.assert_raised("ZeroDivisionError");

    let other = call(client.peer(), "python_exec", exec_args("h2", "x")).await;
    other.assert_raised("NameError");

    let crash = exec(&client, "import os; os._exit(3)").await;
    assert!(crash.is_error, "{crash:#?}");
    assert_eq!(crash.status(), "crashed", "{crash:#?}");

    let after = exec(&client, "'alive'").await;
    after.assert_ok();
    assert_eq!(after.value(), Some("'alive'"));
    assert!(
        after.text.to_lowercase().contains("lost"),
        "the first cell after a crash must say the state was lost: {:?}",
        after.text
    );
    exec(&client, "x").await.assert_raised("NameError");

    let listing = call(client.peer(), "python_sessions", json!({})).await;
    assert!(!listing.is_error, "{listing:#?}");
    let names: Vec<&str> = listing.structured["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions array: {listing:#?}"))
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert!(
        names.contains(&"default") && names.contains(&"h2"),
        "{names:?}"
    );

    server.assert_alive();
    let _ = client.cancel().await;
}

#[tokio::test]
async fn http_rejects_a_foreign_origin() {
    let server = HttpServer::start(&[], &[]).await;

    // The same request without an Origin is accepted, so a rejection below is
    // due to the Origin alone.
    let (plain, head) = raw_post_mcp(server.port, &mcp_post_headers(server.port)).await;
    assert!(
        (200..300).contains(&plain),
        "a local request without Origin must be accepted, got {plain}: {head}"
    );

    let mut headers = mcp_post_headers(server.port);
    headers.push(("Origin", "http://evil.example".to_string()));
    let (status, head) = raw_post_mcp(server.port, &headers).await;
    assert!(
        (400..500).contains(&status),
        "Origin http://evil.example must be refused with a 4xx, got {status}: {head}"
    );
}

#[tokio::test]
async fn http_rejects_a_foreign_host() {
    let server = HttpServer::start(&[], &[]).await;
    for host in ["evil.example", &format!("evil.example:{}", server.port)] {
        let mut headers = mcp_post_headers(server.port);
        headers[0] = ("Host", host.to_string());
        let (status, head) = raw_post_mcp(server.port, &headers).await;
        assert!(
            (400..500).contains(&status),
            "Host {host} must be refused with a 4xx, got {status}: {head}"
        );
    }
    let (ok, head) = raw_post_mcp(server.port, &mcp_post_headers(server.port)).await;
    assert!(
        (200..300).contains(&ok),
        "Host 127.0.0.1:PORT must be accepted, got {ok}: {head}"
    );
}

async fn assert_token_enforced(server: &HttpServer, token: &str) {
    let port = server.port;

    let (status, head) = raw_post_mcp(port, &mcp_post_headers(port)).await;
    assert_eq!(status, 401, "POST without a token: {head}");

    let mut wrong = mcp_post_headers(port);
    wrong.push(("Authorization", format!("Bearer {token}-wrong")));
    let (status, head) = raw_post_mcp(port, &wrong).await;
    assert_eq!(status, 401, "POST with a wrong token: {head}");

    let host = format!("127.0.0.1:{port}");
    let (status, head) = raw_http(
        port,
        "GET",
        "/mcp",
        &[("Host", &host), ("Accept", "text/event-stream")],
        "",
    )
    .await;
    assert_eq!(status, 401, "GET without a token: {head}");

    let mut right = mcp_post_headers(port);
    right.push(("Authorization", format!("Bearer {token}")));
    let (status, head) = raw_post_mcp(port, &right).await;
    assert!(
        (200..300).contains(&status),
        "POST with the right token must be accepted, got {status}: {head}"
    );

    assert!(
        server.try_connect(None).await.is_err(),
        "an MCP client without the token must not get in"
    );

    let client = server.connect(Some(token)).await;
    let out = exec(&client, "secret_ok = 1\nsecret_ok + 1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("2"));
    let _ = client.cancel().await;
}

#[tokio::test]
async fn http_requires_the_bearer_token_when_one_is_set() {
    let server = HttpServer::start(&["--auth-token", "s3cret-flag"], &[]).await;
    assert_token_enforced(&server, "s3cret-flag").await;
}

#[tokio::test]
async fn http_token_can_come_from_the_environment() {
    let server = HttpServer::start(&[], &[("FERREPL_AUTH_TOKEN", "s3cret-env")]).await;
    assert_token_enforced(&server, "s3cret-env").await;
}

/// Clients end their HTTP session with DELETE /mcp and accept 200 or 204; the
/// official Python SDK logs any other status as a failed termination.
#[tokio::test]
async fn http_session_delete_answers_no_content() {
    let mut server = HttpServer::start(&[], &[]).await;
    let port = server.port;
    let (status, head) = raw_post_mcp(port, &mcp_post_headers(port)).await;
    assert!((200..300).contains(&status), "initialize: {head}");
    let session = mcp_session_id(&head);
    let host = format!("127.0.0.1:{port}");
    let (status, head) = raw_http(
        port,
        "DELETE",
        "/mcp",
        &[("Host", &host), ("Mcp-Session-Id", &session)],
        "",
    )
    .await;
    assert_eq!(status, 204, "DELETE of a live session: {head}");
    // The session is gone: a request in it is answered 404 (the client
    // must start a new one).
    let body = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;
    let (status, head) = raw_http(
        port,
        "POST",
        "/mcp",
        &[
            ("Host", &host),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", &session),
        ],
        body,
    )
    .await;
    assert_eq!(status, 404, "a request in the ended session: {head}");
    server.assert_alive();
}

#[tokio::test]
async fn initialize_is_refused_past_max_connections_and_a_delete_frees_one() {
    let mut server = HttpServer::start(&["--max-connections", "2"], &[]).await;
    let port = server.port;
    let host = format!("127.0.0.1:{port}");
    let headers = mcp_post_headers(port);
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (status, head) = raw_post_mcp(port, &headers).await;
        assert!((200..300).contains(&status), "initialize: {head}");
        sessions.push(mcp_session_id(&head));
    }
    let post = |body: String| {
        let host = host.clone();
        async move {
            let headers = [
                ("Host", host.as_str()),
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
            ];
            http_exchange(port, "POST", "/mcp", &headers, &body).await
        }
    };
    let (status, body) = post(crate::support::initialize_body()).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("--max-connections"), "{body}");
    // Nor does an escaped method name get one past the limit.
    let escaped =
        crate::support::initialize_body().replace("\"initialize\"", "\"\\u0069nitialize\"");
    assert!(escaped.contains("u0069"), "{escaped}");
    let (status, body) = post(escaped).await;
    assert_eq!(status, 503, "{body}");
    // The word alone (in a string, or another method) is not an initialize.
    let (status, body) = post(
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {"x": "initialize"}})
            .to_string(),
    )
    .await;
    assert!(!body.contains("--max-connections"), "{status}: {body}");

    let (status, head) = raw_http(
        port,
        "DELETE",
        "/mcp",
        &[("Host", &host), ("Mcp-Session-Id", &sessions[0])],
        "",
    )
    .await;
    assert_eq!(status, 204, "{head}");
    let client = server.connect(None).await;
    assert!(!exec(&client, "1 + 1").await.is_error);
    server.assert_alive();
}

/// Initializes sent all at once cannot overshoot --max-connections: each is
/// admitted in turn, so exactly the limit get a session.
#[tokio::test]
async fn concurrent_initializes_get_exactly_max_connections_sessions() {
    let mut server = HttpServer::start(&["--max-connections", "3"], &[]).await;
    let port = server.port;
    let headers = mcp_post_headers(port);
    let attempts = (0..32).map(|_| raw_post_mcp(port, &headers));
    let statuses: Vec<u16> = futures::future::join_all(attempts)
        .await
        .into_iter()
        .map(|(status, _)| status)
        .collect();
    let admitted = statuses.iter().filter(|s| (200..300).contains(*s)).count();
    let refused = statuses.iter().filter(|s| **s == 503).count();
    assert_eq!((admitted, refused), (3, 29), "{statuses:?}");
    server.assert_alive();
}

/// One keep-alive HTTP/1.1 connection, as an SDK client holds it.
struct KeepAlive {
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
    port: u16,
    session: Option<String>,
}

impl KeepAlive {
    async fn post(&mut self, body: serde_json::Value) -> (String, String) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let body = body.to_string();
        let mut req = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.port,
            body.len()
        );
        if let Some(id) = &self.session {
            req.push_str(&format!(
                "Mcp-Session-Id: {id}\r\nMCP-Protocol-Version: 2025-06-18\r\n"
            ));
        }
        req.push_str("\r\n");
        req.push_str(&body);
        let exchange = async {
            self.stream.get_mut().write_all(req.as_bytes()).await?;
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if self.stream.read_line(&mut line).await? == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let header = |name: &str| {
                head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                })
            };
            let mut content = Vec::new();
            if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
                content.resize(len, 0);
                self.stream.read_exact(&mut content).await?;
            } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
                loop {
                    let mut size = String::new();
                    self.stream.read_line(&mut size).await?;
                    let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                    let mut chunk = vec![0; size + 2];
                    self.stream.read_exact(&mut chunk).await?;
                    if size == 0 {
                        break;
                    }
                    content.extend_from_slice(&chunk[..size]);
                }
            }
            Ok::<_, std::io::Error>((head, String::from_utf8_lossy(&content).into_owned()))
        };
        tokio::time::timeout(crate::support::CALL_TIMEOUT, exchange)
            .await
            .expect("HTTP exchange timed out")
            .expect("HTTP exchange failed")
    }
}

fn content_type(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// Quick calls are answered with plain JSON (so a client that stops reading
/// at its reply keeps its connection); a call that outlasts the reply window
/// still gets the event stream, with its result in it.
#[tokio::test]
async fn quick_calls_get_json_replies_and_long_ones_an_event_stream() {
    let server = HttpServer::start(&[], &[]).await;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
        .await
        .expect("connect");
    let mut conn = KeepAlive {
        stream: tokio::io::BufReader::new(tcp),
        port: server.port,
        session: None,
    };
    let init: serde_json::Value =
        serde_json::from_str(&crate::support::initialize_body()).expect("initialize body");
    let (head, body) = conn.post(init).await;
    assert!(
        content_type(&head).starts_with("application/json"),
        "{head}"
    );
    assert!(body.contains("\"protocolVersion\""), "{body}");
    conn.session = Some(mcp_session_id(&head));
    let (head, _) = conn
        .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    assert!(head.starts_with("HTTP/1.1 202"), "{head}");

    let call = |id: u64, code: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "python_exec", "arguments": {"code": code, "wait_s": 20}}})
    };
    let (head, body) = conn.post(call(2, "40 + 2")).await;
    assert!(
        content_type(&head).starts_with("application/json"),
        "{head}"
    );
    let reply: serde_json::Value = serde_json::from_str(&body).expect("a JSON reply");
    assert_eq!(reply["id"], 2, "{reply}");
    assert!(
        reply["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("42\n")),
        "{reply}"
    );

    // Same connection: longer than the window, so an event stream.
    let (head, body) = conn
        .post(call(3, "import time; time.sleep(1.5); 'slept'"))
        .await;
    assert!(
        content_type(&head).starts_with("text/event-stream"),
        "{head}"
    );
    assert!(
        body.contains("\"id\":3") && body.contains("'slept'"),
        "{body}"
    );
}
