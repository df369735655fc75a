//! A server for long-running cells, over either transport, whose client
//! records every `notifications/progress` it receives (the `Recorder`
//! handler), so that tests can check what the server sent while a cell ran.
//!
//! Synchronisation with the Python code under test goes through files in a
//! temporary directory: a cell announces that it reached a point by writing a
//! "marker" file, and waits at a "gate" until the test creates the gate file.
//! So no test depends on how fast the machine is.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientRequest, ProgressNotificationParam, ProgressToken, Request,
    ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestHandle};
use rmcp::{ClientHandler, Peer, RoleClient};
use serde_json::{Value, json};

use super::http::HttpServer;
use super::launch::Launch;
use super::probes::py_path;
use super::procs::wait_for_file_line;
use super::result::{CALL_TIMEOUT, ToolOutput, call};
use super::stdio::{Client, StdioServer};

/// Upper bound for any event a test waits for (a marker file, a progress
/// notification, a session state). Only reached when something is broken.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// How often a bounded wait looks again at something it can only poll
/// (a file, the session listing).
const POLL_EVERY: Duration = Duration::from_millis(20);

// ------------------------------------------------------------------ client

/// A client handler that keeps every progress notification it receives.
#[derive(Clone, Default)]
pub struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    arrived: Arc<tokio::sync::Notify>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().expect("progress lock").push(params);
        self.arrived.notify_waiters();
    }
}

impl Recorder {
    /// Every progress notification received so far for `token`, in order.
    pub fn progress_for(&self, token: &ProgressToken) -> Vec<ProgressNotificationParam> {
        self.progress
            .lock()
            .expect("progress lock")
            .iter()
            .filter(|p| &p.progress_token == token)
            .cloned()
            .collect()
    }

    /// Wait (bounded) until a progress notification for `token` satisfies
    /// `pred`; returns all notifications for `token` received by then.
    pub async fn wait_progress(
        &self,
        token: &ProgressToken,
        pred: impl Fn(&ProgressNotificationParam) -> bool,
    ) -> Vec<ProgressNotificationParam> {
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            // Register interest before looking, so no notification slips by.
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let seen = self.progress_for(token);
            if seen.iter().any(&pred) {
                return seen;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                panic!(
                    "no matching progress notification for {token:?} within {EVENT_TIMEOUT:?}; received: {seen:#?}"
                );
            }
        }
    }
}

// ------------------------------------------------------------------ server

enum Transport {
    Stdio(StdioServer<Recorder>),
    Http {
        server: HttpServer,
        client: Client<Recorder>,
    },
}

/// One ferrepl server process and a connected, progress-recording client.
pub struct LongRunningServer {
    pub recorder: Recorder,
    transport: Transport,
    /// Where the test and the cells exchange marker and gate files.
    files: tempfile::TempDir,
}

impl LongRunningServer {
    /// `ferrepl --workdir <tempdir> args...` over stdio, with the full tool
    /// surface.
    pub async fn stdio(args: &[&str]) -> Self {
        let recorder = Recorder::default();
        let server = StdioServer::launch_with(Launch::new(args), recorder.clone()).await;
        LongRunningServer {
            recorder,
            // Inside the workdir: the sandbox lets cells write only there.
            files: tempfile::tempdir_in(server.workdir.path())
                .expect("create a temporary directory"),
            transport: Transport::Stdio(server),
        }
    }

    /// `ferrepl --http 127.0.0.1:PORT --workdir <tempdir> args...` (the full
    /// tool surface), with a streamable-HTTP client connected to it.
    pub async fn http(args: &[&str]) -> Self {
        let server = HttpServer::start(args, &[]).await;
        let recorder = Recorder::default();
        let client = server.connect_with(recorder.clone(), None).await;
        LongRunningServer {
            recorder,
            // Inside the workdir: the sandbox lets cells write only there.
            files: tempfile::tempdir_in(server.workdir.path())
                .expect("create a temporary directory"),
            transport: Transport::Http { server, client },
        }
    }

    pub fn peer(&self) -> &Peer<RoleClient> {
        match &self.transport {
            Transport::Stdio(server) => server.peer(),
            Transport::Http { client, .. } => client.peer(),
        }
    }

    /// Panics (with the server's stderr) if the server process has exited.
    pub fn assert_alive(&mut self) {
        match &mut self.transport {
            Transport::Stdio(server) => server.assert_alive(),
            Transport::Http { server, .. } => server.assert_alive(),
        }
    }

    // -------------------------------------------------------------- files

    /// A path in the test's exchange directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.files.path().join(name)
    }

    /// Python code that writes the marker file `name` (one line).
    pub fn py_mark(&self, name: &str) -> String {
        format!(
            "open({}, 'w').write('reached\\n')",
            py_path(&self.file(name))
        )
    }

    /// Python code (one line, no indentation) that blocks until the test
    /// opens gate `name`.
    pub fn py_gate(&self, name: &str) -> String {
        format!(
            "while not __import__('os').path.exists({}): __import__('time').sleep(0.02)",
            py_path(&self.file(name))
        )
    }

    /// Let every cell waiting at gate `name` go on.
    pub fn open_gate(&self, name: &str) {
        std::fs::write(self.file(name), "go\n").expect("create a gate file");
    }

    /// Wait (bounded) until a cell wrote the marker file `name`.
    pub async fn wait_marker(&self, name: &str) {
        wait_for_file_line(&self.file(name), EVENT_TIMEOUT).await;
    }

    // -------------------------------------------------------------- calls

    pub async fn call(&self, tool: &str, args: Value) -> ToolOutput {
        call(self.peer(), tool, args).await
    }

    /// python_exec `code` in `session`, with `wait_s` when given.
    pub async fn exec(&self, session: &str, code: &str, wait_s: Option<f64>) -> ToolOutput {
        let mut args = json!({ "code": code, "session": session });
        if let Some(w) = wait_s {
            args["wait_s"] = json!(w);
        }
        self.call("python_exec", args).await
    }

    pub async fn wait(&self, session: &str, wait_s: f64) -> ToolOutput {
        self.call(
            "python_wait",
            json!({ "session": session, "wait_s": wait_s }),
        )
        .await
    }

    /// python_wait answering the pending input() with `text`.
    pub async fn input(&self, session: &str, text: &str) -> ToolOutput {
        self.call("python_wait", json!({ "session": session, "input": text }))
            .await
    }

    /// python_wait interrupting the running cell.
    pub async fn interrupt(&self, session: &str) -> ToolOutput {
        self.call(
            "python_wait",
            json!({ "session": session, "interrupt": true }),
        )
        .await
    }

    /// The `python_sessions` row of `name`.
    pub async fn session_row(&self, name: &str) -> Value {
        super::session_row(self.peer(), name).await
    }

    /// The interpreter pid of session `name`, which must have one.
    pub async fn pid(&self, name: &str) -> u32 {
        super::session_pid(self.peer(), name).await
    }

    /// Wait (bounded) until python_sessions shows session `name` in `state`.
    /// The state changes inside the server with no notification, so this polls.
    pub async fn wait_state(&self, name: &str, state: &str) -> Value {
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            let row = self.session_row(name).await;
            if row["state"] == state {
                return row;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "session {name} did not become {state} within {EVENT_TIMEOUT:?}; last row: {row:#}"
            );
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Send a tools/call without waiting for its answer (see `start_call`).
    pub async fn start_call(&self, tool: &str, args: Value) -> RequestHandle<RoleClient> {
        start_call(self.peer(), tool, args).await
    }
}

/// Send a tools/call without waiting for its answer; the handle gives the
/// request's progress token, can be cancelled, or awaited with `finish`.
pub async fn start_call(
    peer: &Peer<RoleClient>,
    tool: &str,
    args: Value,
) -> RequestHandle<RoleClient> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    peer.send_cancellable_request(
        ClientRequest::CallToolRequest(Request::new(params)),
        PeerRequestOptions::no_options(),
    )
    .await
    .unwrap_or_else(|e| panic!("could not send tools/call {tool}: {e}"))
}

/// The answer to a call sent with `start_call`.
pub async fn finish(handle: RequestHandle<RoleClient>) -> ToolOutput {
    match tokio::time::timeout(CALL_TIMEOUT, handle.await_response()).await {
        Ok(Ok(ServerResult::CallToolResult(result))) => ToolOutput::from_result(result),
        Ok(Ok(other)) => panic!("tools/call answered with something else: {other:?}"),
        Ok(Err(e)) => panic!("tools/call failed at the protocol level: {e}"),
        Err(_) => panic!("tools/call did not answer within {CALL_TIMEOUT:?}"),
    }
}
