//! A server on the streamable HTTP transport, rmcp clients connected to it
//! (legacy `initialize`, or with `connect_modern_with` the `server/discover`
//! lifecycle of protocol 2026-07-28), and raw HTTP/1.1 exchanges for what a
//! client library would never send.

use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ClientLifecycleMode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;

use super::launch::{Launch, START_TIMEOUT, StderrLog, strip_ansi};
use super::result::CALL_TIMEOUT;
use super::stdio::{Client, modern_lifecycle};

/// The port in a log line "`<what>` http://127.0.0.1:PORT/...".
fn port_logged(line: &str, what: &str) -> Option<u16> {
    let rest = line.split(&format!("{what} http://127.0.0.1:")).nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

pub struct HttpServer {
    pub port: u16,
    /// The `--metrics-addr` listener's port, when one was asked for (with
    /// port 0 the kernel picks it; it is read from the log).
    pub metrics_port: Option<u16>,
    /// Killed on drop.
    pub child: Child,
    /// The workspace (`--workdir`).
    pub workdir: tempfile::TempDir,
    stderr: StderrLog,
}

impl HttpServer {
    /// Start `ferrepl --http 127.0.0.1:0 --workdir <tempdir> args...`, with
    /// the full tool surface (see `support::launch`), and wait for its
    /// "listening on" log line, which names the port the kernel picked (so
    /// no other process can take it between a check and the bind).
    pub async fn start(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::launch(Launch::new(args).envs(envs)).await
    }

    /// Start `launch` over HTTP (see `start`).
    pub async fn launch(launch: Launch) -> Self {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<u16>();
        let mut ready_tx = Some(ready_tx);
        let spawned = launch.spawn_http(0, move |line| {
            if let Some(port) = port_logged(&strip_ansi(line), "listening on")
                && let Some(tx) = ready_tx.take()
            {
                let _ = tx.send(port);
            }
        });
        let port = match tokio::time::timeout(START_TIMEOUT, ready_rx).await {
            Ok(Ok(port)) => port,
            Ok(Err(_)) => panic!(
                "the HTTP server closed stderr without logging 'listening on'; stderr:\n{}",
                spawned.stderr.tail(4000)
            ),
            Err(_) => panic!(
                "the HTTP server did not log 'listening on' within {START_TIMEOUT:?}; stderr:\n{}",
                spawned.stderr.tail(4000)
            ),
        };
        // The probes' listener is bound and logged before the main one.
        let metrics_port = strip_ansi(&spawned.stderr.text())
            .lines()
            .find_map(|line| port_logged(line, "health and metrics on"));
        HttpServer {
            port,
            metrics_port,
            child: spawned.child,
            workdir: spawned.workdir,
            stderr: spawned.stderr,
        }
    }

    pub fn stderr_log(&self) -> String {
        self.stderr.text()
    }

    /// Waits (bounded) until the server has logged `needle`.
    pub async fn wait_log(&self, needle: &str, timeout: std::time::Duration) -> bool {
        self.stderr.wait_contains(needle, timeout).await
    }

    /// Connect an rmcp streamable-HTTP client with `handler`, optionally
    /// with a bearer token.
    pub async fn try_connect_with<H: ClientHandler>(
        &self,
        handler: H,
        token: Option<&str>,
    ) -> anyhow::Result<Client<H>> {
        self.try_connect_at("/mcp", handler, token).await
    }

    /// Like `try_connect_with`, to the MCP endpoint at `path` (e.g. a
    /// tenant's `/t/<tenant>/mcp`).
    pub async fn try_connect_at<H: ClientHandler>(
        &self,
        path: &str,
        handler: H,
        token: Option<&str>,
    ) -> anyhow::Result<Client<H>> {
        self.try_connect_lifecycle(path, handler, token, ClientLifecycleMode::Initialize)
            .await
    }

    /// Connect an rmcp streamable-HTTP client with `handler` to the MCP
    /// endpoint at `path` through `lifecycle`, optionally with a bearer
    /// token.
    pub async fn try_connect_lifecycle<H: ClientHandler>(
        &self,
        path: &str,
        handler: H,
        token: Option<&str>,
        lifecycle: ClientLifecycleMode,
    ) -> anyhow::Result<Client<H>> {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        // The client's TLS (shared with the server's upstream client) has no
        // provider of its own.
        ferrepl::upstream::ensure_tls();
        let mut config = StreamableHttpClientTransportConfig::with_uri(url);
        if let Some(token) = token {
            config = config.auth_header(token);
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        let client = tokio::time::timeout(
            START_TIMEOUT,
            rmcp::serve_client_with_lifecycle(handler, transport, lifecycle),
        )
        .await
        .map_err(|_| anyhow::anyhow!("MCP handshake over HTTP timed out"))??;
        Ok(client)
    }

    /// Like `try_connect_with`; a failure panics with the server's stderr.
    pub async fn connect_with<H: ClientHandler>(
        &self,
        handler: H,
        token: Option<&str>,
    ) -> Client<H> {
        match self.try_connect_with(handler, token).await {
            Ok(client) => client,
            Err(e) => panic!(
                "MCP initialize over HTTP failed: {e:#}\nserver stderr:\n{}",
                self.stderr.tail(4000)
            ),
        }
    }

    /// Like `connect_with`, with the lifecycle of protocol 2026-07-28: the
    /// client finds the server with `server/discover` (no `initialize`) and
    /// every request carries the client's capabilities in its own `_meta`.
    pub async fn connect_modern_with<H: ClientHandler>(
        &self,
        handler: H,
        token: Option<&str>,
    ) -> Client<H> {
        match self
            .try_connect_lifecycle("/mcp", handler, token, modern_lifecycle())
            .await
        {
            Ok(client) => client,
            Err(e) => panic!(
                "MCP server/discover over HTTP failed: {e:#}\nserver stderr:\n{}",
                self.stderr.tail(4000)
            ),
        }
    }

    /// Connect an rmcp client (unit handler), optionally with a bearer token.
    pub async fn try_connect(&self, token: Option<&str>) -> anyhow::Result<Client> {
        self.try_connect_with((), token).await
    }

    /// Connects an rmcp client (unit handler) with bearer `token` to the
    /// MCP endpoint at `path`; panics with the server's stderr if it cannot.
    pub async fn connect_at(&self, path: &str, token: &str) -> Client {
        match self.try_connect_at(path, (), Some(token)).await {
            Ok(c) => c,
            Err(e) => panic!("connect {path}: {e:#}\nstderr:\n{}", self.stderr_log()),
        }
    }

    pub async fn connect(&self, token: Option<&str>) -> Client {
        self.connect_with((), token).await
    }

    /// Panics (with the server's stderr) if the server process has exited.
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait on the server") {
            panic!(
                "the server exited ({status}); stderr:\n{}",
                self.stderr.tail(4000)
            );
        }
    }
}

// ------------------------------------------------------------------ raw HTTP

/// The body of an MCP `initialize` request, for raw tests.
pub fn initialize_body() -> String {
    json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": { "name": "ferrepl-raw-test", "version": "0" }
        }
    })
    .to_string()
}

/// Connects to 127.0.0.1:`port` and sends one HTTP/1.1 request: `headers`
/// as given, then Content-Length and `Connection: close`.
async fn send_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the HTTP server");
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write the HTTP request");
    stream
}

/// The status code of a response; panics without a status line.
fn status_of(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("no HTTP status line in response: {response:?}"))
}

/// Like `raw_http`, reading the whole response: its status and body.
pub async fn http_exchange(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let exchange = async {
        let mut stream = send_request(port, method, path, headers, body).await;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .expect("read the HTTP response");
        let response = String::from_utf8_lossy(&response).into_owned();
        let status = status_of(&response);
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    };
    tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .expect("HTTP exchange timed out")
}

/// Send one HTTP/1.1 request by hand to 127.0.0.1:`port` and return the
/// response's status code and head. `headers` must include Host when wanted:
/// nothing is added but Content-Length and `Connection: close`.
pub async fn raw_http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let exchange = async {
        let mut stream = send_request(port, method, path, headers, body).await;
        // Read the response head only; the body may be a stream.
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.expect("read the HTTP response");
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        (status_of(&head), head)
    };
    tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .expect("raw HTTP exchange timed out")
}

/// Headers of a well-formed MCP POST from a local client.
pub fn mcp_post_headers(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("Host", format!("127.0.0.1:{port}")),
        ("Content-Type", "application/json".to_string()),
        ("Accept", "application/json, text/event-stream".to_string()),
    ]
}

/// `raw_http` POST of an `initialize` to /mcp, with owned header values.
pub async fn raw_post_mcp(port: u16, headers: &[(&'static str, String)]) -> (u16, String) {
    let borrowed: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    raw_http(port, "POST", "/mcp", &borrowed, &initialize_body()).await
}

/// The `Mcp-Session-Id` header of a response head; panics when missing.
pub fn mcp_session_id(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no Mcp-Session-Id header in {head}"))
}
