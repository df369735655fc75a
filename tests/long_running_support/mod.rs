//! Harness and shared scenarios for the long-running-cell tests
//! (`tests/long_running.rs` over stdio, `tests/long_running_http.rs` over
//! streamable HTTP).
//!
//! The client here is not the unit handler `()` of `tests/common`: it records
//! every `notifications/progress` it receives, so the progress tests can
//! check what the server sent while a cell ran. Everything else (result
//! parsing, HTTP server start-up, process checks) comes from `tests/common`.
//!
//! Synchronisation with the Python code under test goes through files in a
//! temporary directory: a cell announces that it reached a point by writing a
//! "marker" file, and waits at a "gate" until the test creates the gate file.
//! So no test depends on how fast the machine is.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientRequest, ProgressNotificationParam, ProgressToken, Request,
    ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestHandle, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use crate::common::{self, CALL_TIMEOUT, HttpServer, START_TIMEOUT, ToolOutput};

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

pub type Client = RunningService<RoleClient, Recorder>;

// ------------------------------------------------------------------ server

enum Process {
    Stdio {
        child: Child,
        stderr: Arc<Mutex<String>>,
        _workdir: tempfile::TempDir,
    },
    Http(HttpServer),
}

/// One ferrepl server process and a connected, progress-recording client.
pub struct Server {
    pub client: Client,
    pub recorder: Recorder,
    process: Process,
    /// Where the test and the cells exchange marker and gate files.
    files: tempfile::TempDir,
}

impl Server {
    /// `ferrepl --workdir <tempdir> args...` over stdio, with the full tool
    /// surface (`common::server_command`).
    pub async fn stdio(args: &[&str]) -> Self {
        let workdir = tempfile::tempdir().expect("create a temporary workdir");
        // Every tool group and structured results, as in tests/common.
        let mut cmd = common::server_command();
        cmd.arg("--workdir")
            .arg(workdir.path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn the ferrepl binary");

        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let server_stderr = child.stderr.take().expect("piped stderr");
        tokio::spawn(async move {
            let mut lines = BufReader::new(server_stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = sink.lock().expect("stderr lock");
                log.push_str(&line);
                log.push('\n');
            }
        });

        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take().expect("piped stdin");
        let recorder = Recorder::default();
        let client = match tokio::time::timeout(
            START_TIMEOUT,
            recorder.clone().serve((stdout, stdin)),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => panic!(
                "MCP initialize over stdio failed: {e}\nserver stderr:\n{}",
                stderr.lock().expect("stderr lock")
            ),
            Err(_) => panic!(
                "MCP initialize over stdio took longer than {START_TIMEOUT:?}\nserver stderr:\n{}",
                stderr.lock().expect("stderr lock")
            ),
        };
        Server {
            client,
            recorder,
            // Inside the workdir: the sandbox lets cells write only there.
            files: tempfile::tempdir_in(workdir.path()).expect("create a temporary directory"),
            process: Process::Stdio {
                child,
                stderr,
                _workdir: workdir,
            },
        }
    }

    /// `ferrepl --http 127.0.0.1:PORT --workdir <tempdir> args...` (the full
    /// tool surface, `common::HttpServer::start`), with a streamable-HTTP
    /// client connected to it.
    pub async fn http(args: &[&str]) -> Self {
        let http = HttpServer::start(args, &[]).await;
        let recorder = Recorder::default();
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(http.url()),
        );
        let client = match tokio::time::timeout(START_TIMEOUT, recorder.clone().serve(transport))
            .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => panic!(
                "MCP initialize over HTTP failed: {e}\nserver stderr:\n{}",
                http.stderr_log()
            ),
            Err(_) => panic!(
                "MCP initialize over HTTP took longer than {START_TIMEOUT:?}\nserver stderr:\n{}",
                http.stderr_log()
            ),
        };
        Server {
            client,
            recorder,
            // Inside the workdir: the sandbox lets cells write only there.
            files: tempfile::tempdir_in(http.workdir.path()).expect("create a temporary directory"),
            process: Process::Http(http),
        }
    }

    pub fn peer(&self) -> &Peer<RoleClient> {
        self.client.peer()
    }

    pub fn stderr_log(&self) -> String {
        match &self.process {
            Process::Stdio { stderr, .. } => stderr.lock().expect("stderr lock").clone(),
            Process::Http(http) => http.stderr_log(),
        }
    }

    /// Panics (with the server's stderr) if the server process has exited.
    pub fn assert_alive(&mut self) {
        match &mut self.process {
            Process::Http(http) => http.assert_alive(),
            Process::Stdio { child, stderr, .. } => {
                if let Some(status) = child.try_wait().expect("try_wait on the server") {
                    panic!(
                        "the server exited ({status}); stderr:\n{}",
                        stderr.lock().expect("stderr lock")
                    );
                }
            }
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
            py_str(&self.file(name))
        )
    }

    /// Python code (one line, no indentation) that blocks until the test
    /// opens gate `name`.
    pub fn py_gate(&self, name: &str) -> String {
        format!(
            "while not __import__('os').path.exists({}): __import__('time').sleep(0.02)",
            py_str(&self.file(name))
        )
    }

    /// Let every cell waiting at gate `name` go on.
    pub fn open_gate(&self, name: &str) {
        std::fs::write(self.file(name), "go\n").expect("create a gate file");
    }

    /// Wait (bounded) until a cell wrote the marker file `name`.
    pub async fn wait_marker(&self, name: &str) {
        common::wait_for_file_line(&self.file(name), EVENT_TIMEOUT).await;
    }

    // -------------------------------------------------------------- calls

    pub async fn call(&self, tool: &str, args: Value) -> ToolOutput {
        common::call(self.peer(), tool, args).await
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
        let listing = self.call("python_sessions", json!({})).await;
        assert!(!listing.is_error, "python_sessions failed: {listing:#?}");
        listing.structured["sessions"]
            .as_array()
            .unwrap_or_else(|| panic!("python_sessions has no sessions array: {listing:#?}"))
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("session {name} is not listed: {listing:#?}"))
    }

    /// The interpreter pid of session `name`, which must have one.
    pub async fn pid(&self, name: &str) -> u32 {
        let row = self.session_row(name).await;
        row["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or_else(|| panic!("session {name} has no pid: {row:#}"))
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

    /// Send a tools/call without waiting for its answer; the handle gives the
    /// request's progress token, can be cancelled, or awaited with `finish`.
    pub async fn start_call(&self, tool: &str, args: Value) -> RequestHandle<RoleClient> {
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Value::Object(map) = args {
            params = params.with_arguments(map);
        }
        self.peer()
            .send_cancellable_request(
                ClientRequest::CallToolRequest(Request::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await
            .unwrap_or_else(|e| panic!("could not send tools/call {tool}: {e}"))
    }
}

/// The answer to a call sent with `Server::start_call`.
pub async fn finish(handle: RequestHandle<RoleClient>) -> ToolOutput {
    match tokio::time::timeout(CALL_TIMEOUT, handle.await_response()).await {
        Ok(Ok(ServerResult::CallToolResult(result))) => ToolOutput::from_result(result),
        Ok(Ok(other)) => panic!("tools/call answered with something else: {other:?}"),
        Ok(Err(e)) => panic!("tools/call failed at the protocol level: {e}"),
        Err(_) => panic!("tools/call did not answer within {CALL_TIMEOUT:?}"),
    }
}

/// A Python string literal for `path` (JSON string syntax is valid Python).
pub fn py_str(path: &Path) -> String {
    serde_json::to_string(path.to_str().expect("utf-8 temp path")).expect("json string")
}

/// All notes of a cell result, joined (a result without notes leaves the
/// key out: none).
pub fn notes(out: &ToolOutput) -> String {
    let notes = &out.structured["notes"];
    if notes.is_null() && out.structured.is_object() {
        return String::new();
    }
    notes
        .as_array()
        .unwrap_or_else(|| panic!("structured_content.notes is not an array in {out:#?}"))
        .iter()
        .map(|n| n.as_str().expect("notes are strings").to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Panics unless `out` is a tool-level failure ("error: ...", no structure)
/// whose text contains every one of `needles`.
pub fn assert_refused(out: &ToolOutput, needles: &[&str]) {
    assert!(out.is_error, "expected a refused call, got {out:#?}");
    assert!(
        out.text.starts_with("error: "),
        "a refused call's text starts with 'error: ': {out:#?}"
    );
    assert!(
        out.structured.is_null(),
        "a refused call has no structured_content: {out:#?}"
    );
    for needle in needles {
        assert!(
            out.text.contains(needle),
            "the refusal does not mention {needle:?}: {out:#?}"
        );
    }
}

/// Panics unless `out` is a result with `status` (and a matching is_error).
pub fn assert_status(out: &ToolOutput, status: &str) {
    assert!(
        out.structured.is_object(),
        "expected a cell result with status {status}, got {out:#?}"
    );
    assert_eq!(out.status(), status, "status of {out:#?}");
    let error_status = matches!(status, "error" | "interrupted" | "crashed");
    assert_eq!(out.is_error, error_status, "is_error of {out:#?}");
}

// ------------------------------------------------------------------ scenarios
// Each one runs against a fresh server, over either transport.

/// A cell outliving its wait window returns `running` with the output so far;
/// python_wait then returns the rest, and only the rest.
pub async fn scenario_wait_window(srv: &Server) {
    let code = format!(
        "print('start', flush=True)\n{}\nprint('end')\n'done'",
        srv.py_gate("finish")
    );
    let first = srv.exec("default", &code, Some(1.0)).await;
    assert_status(&first, "running");
    assert!(first.str_field("stdout").contains("start"), "{first:#?}");
    assert!(!first.str_field("stdout").contains("end"), "{first:#?}");
    assert!(first.value().is_none(), "{first:#?}");
    assert!(
        first.text.contains("python_wait"),
        "a running result tells how to go on: {first:#?}"
    );

    srv.open_gate("finish");
    let rest = srv.wait("default", 30.0).await;
    assert_status(&rest, "ok");
    assert!(rest.str_field("stdout").contains("end"), "{rest:#?}");
    assert!(
        !rest.str_field("stdout").contains("start"),
        "python_wait must return only new output: {rest:#?}"
    );
    assert_eq!(rest.value(), Some("'done'"));
    assert_eq!(rest.cell(), first.cell(), "same cell: {first:#?} {rest:#?}");
    assert_eq!(rest.str_field("session"), "default");

    // Its result was collected: waiting again gives the same result again,
    // saying so (for a client whose response was lost), and runs nothing.
    let again = srv.wait("default", 1.0).await;
    assert_status(&again, "ok");
    assert_eq!(again.cell(), first.cell(), "same cell: {again:#?}");
    assert_eq!(again.value(), Some("'done'"), "{again:#?}");
    assert!(
        notes(&again).contains("Delivered again"),
        "a repeated result says it was delivered before: {again:#?}"
    );
}

/// input() makes the call return `waiting_input` with the prompt, and
/// python_wait {input} answers it.
pub async fn scenario_input(srv: &Server) {
    // No wait_s: the default window (30 s) is far longer than the test, so a
    // waiting_input status shows the call returned on the prompt itself.
    let asked = srv
        .exec(
            "default",
            "name = input(\"Name: \")\nprint(\"hello\", name)",
            None,
        )
        .await;
    assert_status(&asked, "waiting_input");
    assert_eq!(asked.structured["prompt"], "Name: ", "{asked:#?}");
    assert!(
        asked.text.contains("python_wait {input: ...}"),
        "{asked:#?}"
    );

    let answered = srv.input("default", "Alice").await;
    assert_status(&answered, "ok");
    assert!(
        answered.str_field("stdout").contains("hello Alice"),
        "{answered:#?}"
    );
    assert_eq!(answered.cell(), asked.cell());
    assert!(answered.structured["prompt"].is_null(), "{answered:#?}");

    // The answer stays in the session.
    let kept = srv.exec("default", "name", None).await;
    kept.assert_ok();
    assert_eq!(kept.value(), Some("'Alice'"));
}

/// python_wait {interrupt: true} stops a cell with KeyboardInterrupt and keeps the state
/// and the interpreter.
pub async fn scenario_interrupt(srv: &Server, body: &str, marker: &str) {
    srv.exec("default", "kept = 42", None).await.assert_ok();
    let pid_before = srv.pid("default").await;

    let code = format!("{}\n{body}", srv.py_mark(marker));
    let running = srv.exec("default", &code, Some(0.3)).await;
    assert_status(&running, "running");
    // The interrupt must hit the loop itself, not the start of the cell.
    srv.wait_marker(marker).await;

    let stopped = srv.interrupt("default").await;
    assert_status(&stopped, "interrupted");
    assert_eq!(stopped.error_type(), "KeyboardInterrupt", "{stopped:#?}");
    assert_eq!(stopped.cell(), running.cell());
    let traceback = stopped.structured["error"]["traceback"]
        .as_str()
        .unwrap_or_else(|| panic!("no traceback: {stopped:#?}"));
    assert!(traceback.contains("<cell"), "{traceback}");
    assert!(
        !traceback.contains("ferrepl-driver"),
        "the traceback shows driver frames: {traceback}"
    );

    let after = srv.exec("default", "kept", None).await;
    after.assert_ok();
    assert_eq!(after.value(), Some("42"), "state must survive: {after:#?}");
    assert_eq!(
        srv.pid("default").await,
        pid_before,
        "an interrupt keeps the interpreter"
    );

    // Nothing runs now: interrupting is refused.
    let idle = srv.interrupt("default").await;
    assert_refused(&idle, &["no running cell"]);
}

/// A call carrying a progress token gets notifications/progress with the
/// latest output line while the cell runs.
pub async fn scenario_progress(srv: &Server) {
    // The cell keeps printing steps until the test has seen a progress
    // notification with one of them, so the test does not depend on timing.
    let code = format!(
        "import os, time\n\
         for i in range(1000):\n\
         \x20   print('step', i, flush=True)\n\
         \x20   if os.path.exists({}):\n\
         \x20       break\n\
         \x20   time.sleep(0.2)\n\
         'steps done'",
        py_str(&srv.file("enough"))
    );
    let handle = srv
        .start_call(
            "python_exec",
            json!({ "code": code, "session": "default", "wait_s": 60 }),
        )
        .await;
    let token = handle.progress_token.clone();
    srv.recorder
        .wait_progress(&token, |p| {
            p.message.as_deref().is_some_and(|m| m.contains("step"))
        })
        .await;
    srv.open_gate("enough");

    let result = finish(handle).await;
    assert_status(&result, "ok");
    assert_eq!(result.value(), Some("'steps done'"));

    let seen = srv.recorder.progress_for(&token);
    assert!(!seen.is_empty());
    for pair in seen.windows(2) {
        assert!(
            pair[1].progress > pair[0].progress,
            "progress values must increase: {seen:#?}"
        );
    }
}
