//! Shared helpers for the ferrepl integration tests.
//!
//! Every test starts its own server process. The stdio helper owns the child
//! process itself (rather than letting rmcp spawn it) so that a test can close
//! the server's stdin and then watch the server exit on its own, and so that
//! every line the server writes on stdout is checked to be a JSON-RPC message
//! before it is handed to the rmcp client.
//!
//! ## Which tool surface a test server has
//!
//! The server exposes only the `python` and `packages` tool groups and sends
//! no `structuredContent` unless told otherwise. Most tests exercise every
//! tool and read results through `ToolOutput::structured`, so the launchers
//! here start the *full* surface by default:
//!
//! - `server_command()`, `StdioServer::start*`, `HttpServer::start`: the
//!   server with `FERREPL_TOOLS=all` and `FERREPL_STRUCTURED_CONTENT=true`
//!   in its environment (every tool group, structured results and output
//!   schemas). Explicit arguments such as `--tools python` still override
//!   the tool groups; `envs` given to a launcher override both variables.
//! - `server_command_plain()`, `StdioServer::start_plain*`,
//!   `HttpServer::start_plain`: the server as a user starts it, with
//!   neither variable set (the default `python,packages` groups, text-only
//!   results), for tests of the default tool surface.

#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{Peer, RoleClient, ServiceError, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// Upper bound for one tool call. Only hit when the server hangs: it turns a
/// hang into a failure with the server's stderr attached.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound for the server to start (initialize handshake, or HTTP listen).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for a process to go away after it was told to.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

pub type Client = RunningService<RoleClient, ()>;

/// The string fields of a structured cell result that the server leaves out
/// when they are empty.
const OMITTED_WHEN_EMPTY: &[&str] = &["stdout", "stderr"];

/// The parts of a tool result the tests look at.
#[derive(Debug, Clone)]
pub struct ToolOutput {
    pub is_error: bool,
    /// `structured_content`, or `Value::Null` when absent.
    pub structured: Value,
    /// The first content block's text (empty when there is none).
    pub text: String,
    pub raw: CallToolResult,
}

impl ToolOutput {
    pub fn from_result(raw: CallToolResult) -> Self {
        let text = raw
            .content
            .first()
            .and_then(|block| block.as_text())
            .map(|t| t.text.clone())
            .unwrap_or_default();
        ToolOutput {
            is_error: raw.is_error.unwrap_or(false),
            structured: raw.structured_content.clone().unwrap_or(Value::Null),
            text,
            raw,
        }
    }

    /// `structured[key]` as a string, or a panic that shows the whole result.
    /// A cell result leaves out an empty `stdout` or `stderr`: for those two
    /// keys, absent from a structured result, this is "".
    pub fn str_field(&self, key: &str) -> &str {
        if OMITTED_WHEN_EMPTY.contains(&key)
            && self
                .structured
                .as_object()
                .is_some_and(|o| !o.contains_key(key))
        {
            return "";
        }
        self.structured[key]
            .as_str()
            .unwrap_or_else(|| panic!("structured_content.{key} is not a string in {self:#?}"))
    }

    /// The `notes` of a structured result (none when the key is left out).
    pub fn notes(&self) -> Vec<String> {
        self.string_list("notes")
    }

    /// The `display` entries of a structured result (none when left out).
    pub fn display(&self) -> Vec<Value> {
        match &self.structured["display"] {
            Value::Null if self.structured.is_object() => Vec::new(),
            Value::Array(items) => items.clone(),
            other => panic!("structured_content.display is not an array ({other}) in {self:#?}"),
        }
    }

    /// `structured[key]`, an array of strings left out when empty.
    fn string_list(&self, key: &str) -> Vec<String> {
        match &self.structured[key] {
            Value::Null if self.structured.is_object() => Vec::new(),
            Value::Array(items) => items
                .iter()
                .map(|n| {
                    n.as_str()
                        .unwrap_or_else(|| panic!("{key} holds a non-string in {self:#?}"))
                        .to_string()
                })
                .collect(),
            other => panic!("structured_content.{key} is not an array ({other}) in {self:#?}"),
        }
    }

    pub fn status(&self) -> &str {
        self.str_field("status")
    }

    /// `value` of a python_exec result: `None` for JSON null.
    pub fn value(&self) -> Option<&str> {
        match &self.structured["value"] {
            Value::Null => None,
            Value::String(s) => Some(s.as_str()),
            other => panic!("structured_content.value is neither null nor a string: {other}"),
        }
    }

    pub fn error_type(&self) -> &str {
        self.structured["error"]["type"]
            .as_str()
            .unwrap_or_else(|| panic!("no error.type in {self:#?}"))
    }

    pub fn cell(&self) -> u64 {
        self.structured["cell"]
            .as_u64()
            .unwrap_or_else(|| panic!("structured_content.cell is not an integer in {self:#?}"))
    }

    /// Panics unless this is a successful python_exec result.
    pub fn assert_ok(&self) -> &Self {
        assert!(
            !self.is_error && self.structured["status"] == "ok",
            "expected a successful cell, got {self:#?}"
        );
        self
    }

    /// Panics unless this is a python_exec result for a cell that raised `kind`.
    pub fn assert_raised(&self, kind: &str) -> &Self {
        assert!(self.is_error, "expected is_error=true, got {self:#?}");
        assert_eq!(self.status(), "error", "status of {self:#?}");
        assert_eq!(self.error_type(), kind, "error.type of {self:#?}");
        self
    }
}

/// Build `python_exec` arguments.
pub fn exec_args(session: &str, code: &str) -> Value {
    json!({ "code": code, "session": session })
}

/// Send one tools/call and return rmcp's raw answer (a JSON-RPC error is `Err`).
pub async fn try_call(
    peer: &Peer<RoleClient>,
    tool: &str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    match tokio::time::timeout(CALL_TIMEOUT, peer.call_tool(params)).await {
        Ok(result) => result,
        Err(_) => panic!("tools/call {tool} did not answer within {CALL_TIMEOUT:?}"),
    }
}

/// Send one tools/call that must produce a tool result (not a JSON-RPC error).
pub async fn call(peer: &Peer<RoleClient>, tool: &str, args: Value) -> ToolOutput {
    let shown = args.to_string();
    match try_call(peer, tool, args).await {
        Ok(result) => ToolOutput::from_result(result),
        Err(e) => panic!("tools/call {tool} {shown} failed at the protocol level: {e}"),
    }
}

/// Remove ANSI colour sequences (ESC [ ... letter) from a log line.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The environment that gives a test server the full tool surface: every
/// tool group, and structuredContent in results (see the module header).
pub const FULL_SURFACE_ENV: &[(&str, &str)] = &[
    ("FERREPL_TOOLS", "all"),
    ("FERREPL_STRUCTURED_CONTENT", "true"),
];

/// The ferrepl binary with none of the caller's FERREPL_* settings and the
/// full tool surface (`FULL_SURFACE_ENV`): every tool group and structured
/// results. Arguments (`--tools ...`) override the tool groups.
pub fn server_command() -> Command {
    let mut cmd = server_command_plain();
    cmd.envs(FULL_SURFACE_ENV.iter().copied());
    cmd
}

/// The ferrepl binary with none of the caller's FERREPL_* settings: the
/// default tool surface (`python,packages`, text-only results).
pub fn server_command_plain() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrepl"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("FERREPL_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("NO_COLOR", "1");
    cmd.kill_on_drop(true);
    cmd
}

/// Collect a child's stderr into a shared buffer; call `on_line` for each line.
fn drain_stderr(
    stderr: tokio::process::ChildStderr,
    buffer: Arc<Mutex<String>>,
    mut on_line: impl FnMut(&str) + Send + 'static,
) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line).into_owned();
                    on_line(&text);
                    buffer.lock().expect("stderr buffer lock").push_str(&text);
                }
            }
        }
    });
}

/// The last `max` characters of a log, for failure messages.
fn tail(log: &str, max: usize) -> String {
    let start = log.len().saturating_sub(max);
    let start = (start..=log.len())
        .find(|i| log.is_char_boundary(*i))
        .unwrap_or(log.len());
    log[start..].to_string()
}

// ------------------------------------------------------------------ stdio

pub struct StdioServer {
    pub client: Client,
    pub child: Child,
    pub workdir: tempfile::TempDir,
    stderr: Arc<Mutex<String>>,
    foreign_stdout: Arc<Mutex<Vec<String>>>,
}

impl StdioServer {
    /// Start `ferrepl` (stdio) with `--workdir <fresh tempdir>` and `args`,
    /// with the full tool surface (see the module header).
    pub async fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[]).await
    }

    pub async fn start_with_env(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::spawn(server_command(), args, envs, true).await
    }

    /// Like `start_with_env`, but without `--workdir` (the tempdir is still
    /// created and kept in `workdir`, for the test to pass some other way).
    pub async fn start_without_workdir_flag(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::spawn(server_command(), args, envs, false).await
    }

    /// Like `start`, but with the default tool surface: neither
    /// `FERREPL_TOOLS` nor `FERREPL_STRUCTURED_CONTENT` is set.
    pub async fn start_plain(args: &[&str]) -> Self {
        Self::start_plain_with_env(args, &[]).await
    }

    /// Like `start_with_env`, with the default tool surface.
    pub async fn start_plain_with_env(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::spawn(server_command_plain(), args, envs, true).await
    }

    async fn spawn(
        mut cmd: Command,
        args: &[&str],
        envs: &[(&str, &str)],
        workdir_flag: bool,
    ) -> Self {
        let workdir = tempfile::tempdir().expect("create a temporary workdir");
        if workdir_flag {
            cmd.arg("--workdir").arg(workdir.path());
        }
        cmd.args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn the ferrepl binary");

        let stderr = Arc::new(Mutex::new(String::new()));
        drain_stderr(
            child.stderr.take().expect("piped stderr"),
            stderr.clone(),
            |_| {},
        );

        // Relay the server's stdout to the client line by line, recording any
        // line that is not a JSON-RPC 2.0 message.
        let foreign_stdout = Arc::new(Mutex::new(Vec::new()));
        let server_stdout = child.stdout.take().expect("piped stdout");
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

        let server_stdin = child.stdin.take().expect("piped stdin");
        let client = match tokio::time::timeout(
            START_TIMEOUT,
            ().serve((client_read, server_stdin)),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => panic!(
                "MCP initialize over stdio failed: {e}\nserver stderr:\n{}",
                tail(&stderr.lock().expect("stderr lock"), 4000)
            ),
            Err(_) => panic!(
                "MCP initialize over stdio did not finish within {START_TIMEOUT:?}\nserver stderr:\n{}",
                tail(&stderr.lock().expect("stderr lock"), 4000)
            ),
        };
        StdioServer {
            client,
            child,
            workdir,
            stderr,
            foreign_stdout,
        }
    }

    pub fn peer(&self) -> &Peer<RoleClient> {
        self.client.peer()
    }

    pub fn stderr_log(&self) -> String {
        self.stderr.lock().expect("stderr lock").clone()
    }

    /// Wait (bounded) until the server's stderr contains `needle`.
    pub async fn wait_stderr_contains(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.stderr_log().contains(needle) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
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
                tail(&self.stderr_log(), 4000)
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

    /// Close the client side (the server sees EOF on stdin) and wait for the
    /// server to exit on its own. Returns its exit status.
    pub async fn close_and_wait(mut self) -> std::process::ExitStatus {
        let _ = self.client.close().await;
        match tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => panic!("waiting for the server failed: {e}"),
            Err(_) => panic!(
                "the server did not exit within {EXIT_TIMEOUT:?} after its stdin was closed; stderr:\n{}",
                tail(&self.stderr_log(), 4000)
            ),
        }
    }
}

// ------------------------------------------------------------------ processes

/// Whether `pid` names a live (non-zombie) process.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // The state letter follows the parenthesised command name.
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next())
                .unwrap_or("?");
            !matches!(state, "Z" | "X" | "x")
        }
    }
}

/// Wait (bounded) for `pid` to disappear; true once it is gone.
pub async fn wait_process_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if !process_alive(pid) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Wait (bounded) for a file to exist and hold a full line; returns its text.
pub async fn wait_for_file_line(path: &std::path::Path, timeout: Duration) -> String {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} did not appear within {timeout:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ------------------------------------------------------------------ HTTP

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

pub struct HttpServer {
    pub port: u16,
    pub child: Child,
    pub workdir: tempfile::TempDir,
    stderr: Arc<Mutex<String>>,
}

impl HttpServer {
    /// Start `ferrepl --http 127.0.0.1:PORT --workdir <tempdir> args...`,
    /// with the full tool surface (see the module header), and wait for its
    /// "listening on" log line. The port is picked free just before; if
    /// something grabbed it in between, another one is tried.
    pub async fn start(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::start_from(server_command, args, envs).await
    }

    /// Like `start`, but with the default tool surface: neither
    /// `FERREPL_TOOLS` nor `FERREPL_STRUCTURED_CONTENT` is set.
    pub async fn start_plain(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::start_from(server_command_plain, args, envs).await
    }

    async fn start_from(base: fn() -> Command, args: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_start(base(), free_port(), args, envs).await {
                Ok(server) => return server,
                Err(log) if attempt < 3 && log.to_lowercase().contains("in use") => continue,
                Err(log) => panic!("the HTTP server did not start: {log}"),
            }
        }
    }

    async fn try_start(
        mut cmd: Command,
        port: u16,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<Self, String> {
        let workdir = tempfile::tempdir().expect("create a temporary workdir");
        cmd.arg("--http")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--workdir")
            .arg(workdir.path())
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn the ferrepl binary");

        let stderr = Arc::new(Mutex::new(String::new()));
        let needle = format!("listening on http://127.0.0.1:{port}/mcp");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let mut ready_tx = Some(ready_tx);
        drain_stderr(
            child.stderr.take().expect("piped stderr"),
            stderr.clone(),
            move |line| {
                if strip_ansi(line).contains(&needle)
                    && let Some(tx) = ready_tx.take()
                {
                    let _ = tx.send(());
                }
            },
        );
        match tokio::time::timeout(START_TIMEOUT, ready_rx).await {
            Ok(Ok(())) => Ok(HttpServer {
                port,
                child,
                workdir,
                stderr,
            }),
            Ok(Err(_)) => Err(format!(
                "it closed stderr without logging 'listening on http://127.0.0.1:{port}/mcp'; stderr:\n{}",
                tail(&stderr.lock().expect("stderr lock"), 4000)
            )),
            Err(_) => Err(format!(
                "it did not log 'listening on http://127.0.0.1:{port}/mcp' within {START_TIMEOUT:?}; stderr:\n{}",
                tail(&stderr.lock().expect("stderr lock"), 4000)
            )),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn stderr_log(&self) -> String {
        self.stderr.lock().expect("stderr lock").clone()
    }

    /// Connect an rmcp streamable-HTTP client, optionally with a bearer token.
    pub async fn try_connect(&self, token: Option<&str>) -> anyhow::Result<Client> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.url());
        if let Some(token) = token {
            config = config.auth_header(token);
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        let client = tokio::time::timeout(START_TIMEOUT, ().serve(transport))
            .await
            .map_err(|_| anyhow::anyhow!("MCP initialize over HTTP timed out"))??;
        Ok(client)
    }

    pub async fn connect(&self, token: Option<&str>) -> Client {
        match self.try_connect(token).await {
            Ok(client) => client,
            Err(e) => panic!(
                "MCP initialize over HTTP failed: {e:#}\nserver stderr:\n{}",
                tail(&self.stderr_log(), 4000)
            ),
        }
    }

    /// Panics (with the server's stderr) if the server process has exited.
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait on the server") {
            panic!(
                "the server exited ({status}); stderr:\n{}",
                tail(&self.stderr_log(), 4000)
            );
        }
    }
}

/// Has the default session start `sleep 300` and returns the HOST pids of
/// (worker, sleep), both checked alive: what a shutdown must take down.
/// (Inside the session, pids are those of its private PID namespace.)
pub async fn worker_with_a_sleeping_child(server: &StdioServer) -> (u32, u32) {
    let started = server
        .exec(&format!(
            "import subprocess\n_sleeper = subprocess.Popen(['sleep', '300'])\n{PID_PROBE_LINES}\n\
             '%s %d %d' % (_pid_ns, _os.getpid(), _sleeper.pid)"
        ))
        .await;
    started.assert_ok();
    let (namespace, inner) = parse_namespaced_pids(started.value());
    let [worker_inner, sleep_inner] = inner[..] else {
        panic!("expected two pids in {:?}", started.value());
    };
    let worker_pid = host_pid_in_namespace(&namespace, worker_inner);
    let sleep_pid = host_pid_in_namespace(&namespace, sleep_inner);
    let server_pid = server.child.id().expect("the server is running");
    for (what, pid) in [("worker", worker_pid), ("sleep", sleep_pid)] {
        assert!(
            descendants(server_pid).contains(&pid),
            "the {what} (host pid {pid}) is not a descendant of the server {server_pid}"
        );
        assert!(process_alive(pid), "the {what} (host pid {pid}) is alive");
    }
    (worker_pid, sleep_pid)
}

// ------------------------------------------------------------------ pid namespaces
//
// Every session and shell job runs in a PID namespace of its own: the pids a
// cell or a job prints (`os.getpid()`, `Popen(...).pid`, `$!`) are pids of
// that namespace. The helpers below translate them to the pids the test (in
// the server's namespace) sees, through `/proc/<pid>/status` `NSpid:` (the
// process's pid in each namespace it is in, outermost first).

/// How long the translation waits for a just-started process to show up.
const HOST_PID_TIMEOUT: Duration = Duration::from_secs(10);

/// Python lines defining `_os` and `_pid_ns`, the interpreter's PID
/// namespace as `pid:[inode]` (the same string the test reads from
/// `/proc/<pid>/ns/pid` on its side).
pub const PID_PROBE_LINES: &str = "import os as _os\n_pid_ns = _os.readlink('/proc/self/ns/pid')";

/// A cell's code whose value is `'pid:[inode] <pid>'`: the interpreter's PID
/// namespace and its pid there (parse with `parse_namespaced_pids`).
pub fn pid_probe_code() -> String {
    format!("{PID_PROBE_LINES}\n'%s %d' % (_pid_ns, _os.getpid())")
}

/// Parses a cell value `'pid:[inode] PID PID...'` into the namespace and
/// the pids.
pub fn parse_namespaced_pids(value: Option<&str>) -> (String, Vec<u32>) {
    let text = value
        .unwrap_or_else(|| panic!("expected 'pid:[inode] PID...' as the cell's value, got None"))
        .trim()
        .trim_matches(|c| c == '\'' || c == '"');
    let mut words = text.split_whitespace();
    let namespace = words
        .next()
        .filter(|w| w.starts_with("pid:["))
        .unwrap_or_else(|| panic!("no pid namespace at the start of {text:?}"))
        .to_string();
    let pids = words
        .map(|w| {
            w.parse::<u32>()
                .unwrap_or_else(|_| panic!("{w:?} is not a pid in {text:?}"))
        })
        .collect();
    (namespace, pids)
}

/// The pids of `pid` in each PID namespace it is in, outermost (the test's)
/// first, innermost (its own) last; None when it is gone.
pub fn ns_pids(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Vec<u32> = line
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    (!pids.is_empty()).then_some(pids)
}

/// `pid:[inode]`, the PID namespace of `pid`; None when it is gone.
pub fn pid_namespace(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// Every pid in the test's /proc.
fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The parent of `pid`, from /proc/<pid>/stat.
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// The live descendants of `ancestor` (not itself), as host pids.
pub fn descendants(ancestor: u32) -> Vec<u32> {
    let parents: std::collections::HashMap<u32, u32> = all_pids()
        .into_iter()
        .filter_map(|pid| Some((pid, parent_pid(pid)?)))
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![ancestor];
    while let Some(parent) = frontier.pop() {
        for (&pid, &ppid) in &parents {
            if ppid == parent && pid != ancestor && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found.retain(|pid| process_alive(*pid));
    found
}

/// Polls (bounded) until `candidates` yields exactly one pid; panics with
/// `what` when none shows up, or at once when several match.
fn unique_pid(what: &str, candidates: impl Fn() -> Vec<u32>) -> u32 {
    let deadline = std::time::Instant::now() + HOST_PID_TIMEOUT;
    loop {
        match candidates()[..] {
            [pid] => return pid,
            [] => {}
            ref several => panic!("{what} is ambiguous: host pids {several:?} all match"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: no such live process within {HOST_PID_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The host pid of the live descendant of `ancestor` (e.g. the server's pid,
/// or a job's launcher) whose pid in its own namespace is `inner`. Panics
/// when there is none (after a short bounded wait) or several (two sessions
/// each have a pid 2: pass a narrower ancestor, or use
/// `host_pid_in_namespace`).
pub fn host_pid(ancestor: u32, inner: u32) -> u32 {
    unique_pid(
        &format!("the descendant of {ancestor} with pid {inner} in its own PID namespace"),
        || {
            descendants(ancestor)
                .into_iter()
                .filter(|pid| ns_pids(*pid).and_then(|p| p.last().copied()) == Some(inner))
                .collect()
        },
    )
}

/// The host pid of the live process that is `inner` in the PID namespace
/// `namespace` (`pid:[inode]`, as `PID_PROBE_LINES` reads it in a session).
pub fn host_pid_in_namespace(namespace: &str, inner: u32) -> u32 {
    unique_pid(
        &format!("the process with pid {inner} in {namespace}"),
        || {
            all_pids()
                .into_iter()
                .filter(|pid| {
                    ns_pids(*pid).and_then(|p| p.last().copied()) == Some(inner)
                        && pid_namespace(*pid).as_deref() == Some(namespace)
                        && process_alive(*pid)
                })
                .collect()
        },
    )
}

/// The host pid of the interpreter of `session` (started if need be), found
/// from a cell's own view of its pid and namespace.
pub async fn session_host_pid(server: &StdioServer, session: &str) -> u32 {
    let out = server.exec_in(session, &pid_probe_code()).await;
    out.assert_ok();
    let (namespace, pids) = parse_namespaced_pids(out.value());
    host_pid_in_namespace(&namespace, pids[0])
}

/// The PID namespace (`pid:[inode]`) of `session`'s interpreter.
pub async fn session_pid_namespace(server: &StdioServer, session: &str) -> String {
    let out = server.exec_in(session, &pid_probe_code()).await;
    out.assert_ok();
    parse_namespaced_pids(out.value()).0
}

/// A pid printed as a cell's value.
pub fn parse_pid(value: Option<&str>) -> u32 {
    value
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or_else(|| panic!("expected a pid as the cell's value, got {value:?}"))
}

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
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse::<u16>().ok())
            .unwrap_or_else(|| panic!("no HTTP status line in response: {head:?}"));
        (status, head)
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

/// `raw_http` with owned header values.
pub async fn raw_post_mcp(port: u16, headers: &[(&'static str, String)]) -> (u16, String) {
    let borrowed: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    raw_http(port, "POST", "/mcp", &borrowed, &initialize_body()).await
}

// ------------------------------------------------------------ probes

/// A string no other test (or test run) uses, for markers and decoys.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}{}x{}x{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A Python string literal for `s` (JSON strings are valid Python literals
/// for the ASCII paths and markers used here).
pub fn py(s: impl AsRef<str>) -> String {
    serde_json::to_string(s.as_ref()).expect("encode a string")
}

pub fn py_path(p: &Path) -> String {
    py(p.to_str().expect("a UTF-8 path"))
}

/// Python prelude of the probing cells: `attempt(label, fn)` prints one line
/// `label: OK <repr>` or `label: <ExceptionType> errno=<n>`.
pub const ATTEMPT: &str = r#"
import os
def attempt(label, fn):
    try:
        r = fn()
        print(f"{label}: OK {r!r}", flush=True)
    except BaseException as e:
        print(f"{label}: {type(e).__name__} errno={getattr(e, 'errno', None)}", flush=True)
"#;

/// The argv of a process as the test sees it, or None when it is gone.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    if !process_alive(pid) {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if raw.is_empty() {
        return None;
    }
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Live processes (seen from the test) with `marker` as one of their arguments.
pub fn processes_with_arg(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| cmdline(*pid).is_some_and(|argv| argv.iter().any(|a| a == marker)))
        .collect()
}
