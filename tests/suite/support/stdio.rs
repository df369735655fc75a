//! A server on the stdio transport with a connected rmcp client.
//!
//! The harness owns the child process itself (rather than letting rmcp
//! spawn it) so that a test can close the server's stdin and then watch the
//! server exit on its own, and so that every line the server writes on
//! stdout is checked to be a JSON-RPC message before it is handed to the
//! rmcp client. The client handler is `()` unless a test needs another one
//! (`Recorder`, which keeps progress notifications).
//!
//! The client starts with the legacy `initialize` handshake unless it is
//! launched with `launch_modern_with`: then it uses `server/discover`
//! (protocol 2026-07-28) and sends its client info and capabilities in
//! every request's `_meta`, as that protocol's clients do.

use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolResult, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::{ClientHandler, ClientLifecycleMode, Peer, RoleClient, ServiceError};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;

use super::launch::{EXIT_TIMEOUT, Launch, START_TIMEOUT, StderrLog};
use super::result::{ToolOutput, call, exec_args, try_call};

/// An rmcp client session; the handler is `()` unless said otherwise.
pub type Client<H = ()> = RunningService<RoleClient, H>;

/// The client lifecycle of protocol 2026-07-28: `server/discover` instead
/// of `initialize`, and the client's protocol version, info and
/// capabilities in every request's `_meta`.
pub fn modern_lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

pub struct StdioServer<H: ClientHandler = ()> {
    pub client: Client<H>,
    /// Killed on drop.
    pub child: Child,
    /// The workspace (`--workdir`, unless the launch left the flag out).
    pub workdir: tempfile::TempDir,
    stderr: StderrLog,
    foreign_stdout: Arc<Mutex<Vec<String>>>,
}

impl StdioServer {
    /// Start `ferrepl` (stdio) with `--workdir <fresh tempdir>` and `args`,
    /// with the full tool surface (see `support::launch`).
    pub async fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[]).await
    }

    pub async fn start_with_env(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::launch(Launch::new(args).envs(envs)).await
    }

    /// Like `start_with_env`, but without `--workdir` (the tempdir is still
    /// created and kept in `workdir`, for the test to pass some other way).
    pub async fn start_without_workdir_flag(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::launch(Launch::new(args).envs(envs).without_workdir_flag()).await
    }

    /// Like `start`, but with the default tool surface: neither
    /// `FERREPL_TOOLS` nor `FERREPL_STRUCTURED_CONTENT` is set.
    pub async fn start_plain(args: &[&str]) -> Self {
        Self::start_plain_with_env(args, &[]).await
    }

    /// Like `start_with_env`, with the default tool surface.
    pub async fn start_plain_with_env(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::launch(Launch::new(args).envs(envs).plain()).await
    }

    /// Start `launch` and connect a client with the unit handler.
    pub async fn launch(launch: Launch) -> Self {
        Self::launch_with(launch, ()).await
    }
}

impl<H: ClientHandler> StdioServer<H> {
    /// Start `launch` on stdio and do the MCP handshake with a client whose
    /// handler is `handler` (the legacy `initialize` lifecycle).
    pub async fn launch_with(launch: Launch, handler: H) -> Self {
        Self::launch_with_lifecycle(launch, handler, ClientLifecycleMode::Initialize).await
    }

    /// Like `launch_with`, with the lifecycle of protocol 2026-07-28: the
    /// client finds the server with `server/discover` (no `initialize`) and
    /// every request carries the client's capabilities in its own `_meta`.
    pub async fn launch_modern_with(launch: Launch, handler: H) -> Self {
        Self::launch_with_lifecycle(launch, handler, modern_lifecycle()).await
    }

    /// Start `launch` on stdio and connect a client with `handler` through
    /// `lifecycle`.
    pub async fn launch_with_lifecycle(
        launch: Launch,
        handler: H,
        lifecycle: ClientLifecycleMode,
    ) -> Self {
        let spawned = launch.spawn_stdio();
        let stderr = spawned.stderr;
        let child = spawned.child;

        // Relay the server's stdout to the client line by line, recording any
        // line that is not a JSON-RPC 2.0 message.
        let foreign_stdout = Arc::new(Mutex::new(Vec::new()));
        let server_stdout = spawned.stdout.expect("piped stdout");
        let (client_read, mut relay_write) = tokio::io::duplex(1 << 16);
        let foreign = foreign_stdout.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(server_stdout);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let body = line.strip_suffix(b"\n").unwrap_or(&line);
                        let is_jsonrpc = serde_json::from_slice::<Value>(body)
                            .map(|v| v["jsonrpc"] == "2.0")
                            .unwrap_or(false);
                        if !is_jsonrpc {
                            let shown: String =
                                String::from_utf8_lossy(body).chars().take(200).collect();
                            foreign.lock().expect("foreign lock").push(shown);
                        }
                        if relay_write.write_all(&line).await.is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = relay_write.shutdown().await;
        });

        let server_stdin = spawned.stdin.expect("piped stdin");
        let client = match tokio::time::timeout(
            START_TIMEOUT,
            rmcp::serve_client_with_lifecycle(handler, (client_read, server_stdin), lifecycle),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => panic!(
                "MCP handshake over stdio failed: {e}\nserver stderr:\n{}",
                stderr.tail(4000)
            ),
            Err(_) => panic!(
                "MCP handshake over stdio did not finish within {START_TIMEOUT:?}\nserver stderr:\n{}",
                stderr.tail(4000)
            ),
        };
        StdioServer {
            client,
            child,
            workdir: spawned.workdir,
            stderr,
            foreign_stdout,
        }
    }

    pub fn peer(&self) -> &Peer<RoleClient> {
        self.client.peer()
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server is running")
    }

    pub fn stderr_log(&self) -> String {
        self.stderr.text()
    }

    /// Wait (bounded) until the server's stderr contains `needle`.
    pub async fn wait_stderr_contains(&self, needle: &str, timeout: Duration) -> bool {
        self.stderr.wait_contains(needle, timeout).await
    }

    /// Lines seen on the server's stdout that were not JSON-RPC messages.
    pub fn foreign_stdout_lines(&self) -> Vec<String> {
        self.foreign_stdout.lock().expect("foreign lock").clone()
    }

    pub fn assert_clean_stdout(&self) {
        let foreign = self.foreign_stdout_lines();
        assert!(
            foreign.is_empty(),
            "the server wrote non-MCP lines on its stdout: {foreign:?}"
        );
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

    pub async fn call(&self, tool: &str, args: Value) -> ToolOutput {
        call(self.peer(), tool, args).await
    }

    pub async fn try_call(&self, tool: &str, args: Value) -> Result<CallToolResult, ServiceError> {
        try_call(self.peer(), tool, args).await
    }

    /// python_exec in the default session.
    pub async fn exec(&self, code: &str) -> ToolOutput {
        self.call("python_exec", json!({ "code": code })).await
    }

    /// python_exec in `session`.
    pub async fn exec_in(&self, session: &str, code: &str) -> ToolOutput {
        self.call("python_exec", exec_args(session, code)).await
    }

    /// python_exec in `session` on the state after cell `parent` (a branch).
    pub async fn exec_after(&self, session: &str, parent: Value, code: &str) -> ToolOutput {
        self.call(
            "python_exec",
            json!({"session": session, "code": code, "parent": parent, "wait_s": 30}),
        )
        .await
    }

    /// Close the client side (the server sees EOF on stdin) and wait for the
    /// server to exit on its own, at most `timeout`. Returns its exit status.
    pub async fn close_and_wait_at_most(mut self, timeout: Duration) -> ExitStatus {
        let _ = self.client.close().await;
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => panic!("waiting for the server failed: {e}"),
            Err(_) => panic!(
                "the server did not exit within {timeout:?} after its stdin was closed; stderr:\n{}",
                self.stderr.tail(4000)
            ),
        }
    }

    /// Closes the client side as a client does and asserts the server then
    /// exits on its own, successfully.
    pub async fn stop(self) {
        let status = self.close_and_wait().await;
        assert!(status.success(), "the server exited with {status:?}");
    }

    /// The rows `python_sessions` lists (none if it has no array).
    pub async fn sessions(&self) -> Vec<Value> {
        let listing = self.call("python_sessions", serde_json::json!({})).await;
        assert!(!listing.is_error, "{listing:#?}");
        listing.structured["sessions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `close_and_wait_at_most(EXIT_TIMEOUT)`.
    pub async fn close_and_wait(self) -> ExitStatus {
        self.close_and_wait_at_most(EXIT_TIMEOUT).await
    }

    /// SIGKILL the server, then reap it (at most `timeout`).
    pub async fn sigkill_and_reap(mut self, timeout: Duration) {
        super::procs::sigkill(self.pid());
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("waiting for the killed server failed: {e}"),
            Err(_) => panic!("the server survived SIGKILL for {timeout:?}"),
        }
    }
}
