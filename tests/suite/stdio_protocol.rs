//! The stdio transport at the byte level: every line a client writes gets the
//! JSON-RPC answer it is owed (parse errors, invalid UTF-8, oversized lines,
//! batches, malformed messages, unknown methods), bad notifications get none,
//! blank lines and CRLF are accepted, and nothing but JSON reaches stdout.
//! Also: SIGTERM and SIGINT to the server end its workers and their children.
//!
//! These tests spawn the server binary themselves and speak JSON-RPC by hand,
//! since an MCP client library would never send the bytes under test.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use crate::support::{
    Launch, StderrLog, StdioServer, initialize_body, process_alive, tail, wait_process_gone,
    worker_with_a_sleeping_child,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Upper bound for any single read or write on the server's pipes; only hit
/// when the server hangs (or stays silent where it owes an answer).
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for the server, and the processes it started, to go away.
const GONE_TIMEOUT: Duration = Duration::from_secs(30);
/// The line limit the protocol tests run the server with.
const MAX_REQUEST_BYTES: usize = 4096;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// A ferrepl server on stdio, spoken to byte by byte.
struct RawServer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr: StderrLog,
    /// Every line read from stdout so far (without its newline).
    lines: Vec<Vec<u8>>,
    _workdir: tempfile::TempDir,
}

impl RawServer {
    /// Start the binary as `StdioServer` does (`Launch`: a fresh
    /// `--workdir`, no FERREPL_* variables from the caller, NO_COLOR) with
    /// `args`, and do the MCP handshake by hand.
    async fn start(args: &[&str]) -> Self {
        let spawned = Launch::new(args).spawn_stdio();
        let mut server = RawServer {
            stdin: spawned.stdin,
            stdout: BufReader::new(spawned.stdout.expect("piped stdout")),
            child: spawned.child,
            stderr: spawned.stderr,
            lines: Vec::new(),
            _workdir: spawned.workdir,
        };
        server.initialize().await;
        server
    }

    fn stderr_log(&self) -> String {
        self.stderr.text()
    }

    /// Panic with `what` and the tail of the server's stderr.
    fn fail(&self, what: &str) -> ! {
        let log = self.stderr_log();
        panic!("{what}\nserver stderr (tail):\n{}", tail(&log, 4000));
    }

    /// `initialize`, its response, then `notifications/initialized`.
    async fn initialize(&mut self) {
        self.send_line(initialize_body().as_bytes()).await;
        let response = self.response(1).await;
        if response["result"]["protocolVersion"].as_str().is_none() {
            self.fail(&format!(
                "initialize answered without a protocolVersion: {response}"
            ));
        }
        self.send_json(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
            .await;
    }

    /// Write `bytes` as they are (the caller adds the line ending).
    async fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is still open");
        let write = async {
            stdin.write_all(bytes).await?;
            stdin.flush().await
        };
        match tokio::time::timeout(IO_TIMEOUT, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail(&format!("writing to the server's stdin failed: {e}")),
            Err(_) => self.fail(&format!(
                "writing {} bytes to the server's stdin did not finish within {IO_TIMEOUT:?}",
                bytes.len()
            )),
        }
    }

    /// Write `line` followed by "\n".
    async fn send_line(&mut self, line: &[u8]) {
        let mut bytes = line.to_vec();
        bytes.push(b'\n');
        self.send_raw(&bytes).await;
    }

    async fn send_json(&mut self, message: &Value) {
        self.send_line(message.to_string().as_bytes()).await;
    }

    /// The next stdout line, which must be a JSON-RPC 2.0 message; None at EOF.
    async fn next_message(&mut self) -> Option<Value> {
        let mut line = Vec::new();
        let read = tokio::time::timeout(IO_TIMEOUT, self.stdout.read_until(b'\n', &mut line)).await;
        match read {
            Err(_) => self.fail(&format!(
                "no line on the server's stdout within {IO_TIMEOUT:?}; lines so far: {}",
                self.lines.len()
            )),
            Ok(Err(e)) => self.fail(&format!("reading the server's stdout failed: {e}")),
            Ok(Ok(0)) => return None,
            Ok(Ok(_)) => {}
        }
        if line.pop() != Some(b'\n') {
            self.fail(&format!(
                "the server's stdout ended inside a line: {:?}",
                String::from_utf8_lossy(&line)
            ));
        }
        let parsed = serde_json::from_slice::<Value>(&line);
        self.lines.push(line);
        let shown =
            || String::from_utf8_lossy(self.lines.last().expect("just pushed")).into_owned();
        match parsed {
            Ok(message) if message["jsonrpc"] == "2.0" => Some(message),
            Ok(_) => self.fail(&format!(
                "a stdout line is JSON but not JSON-RPC 2.0: {}",
                shown()
            )),
            Err(e) => self.fail(&format!("a stdout line is not JSON ({e}): {:?}", shown())),
        }
    }

    /// Read up to the next response (skipping server-initiated messages,
    /// which carry a "method") and check that it answers `id`. A response to
    /// anything else means an answer was owed or sent where it should not
    /// be, so it fails the test.
    async fn response(&mut self, id: impl Into<Value>) -> Value {
        let id = id.into();
        loop {
            let Some(message) = self.next_message().await else {
                self.fail(&format!(
                    "the server closed stdout while a response to id {id} was awaited"
                ));
            };
            if message.get("method").is_some() {
                continue;
            }
            if message.get("id") != Some(&id) {
                self.fail(&format!(
                    "expected the response to id {id} next, got another response: {message}"
                ));
            }
            return message;
        }
    }

    /// Read the next response, check it is an error for `id` with `code` and
    /// a message containing `needle`; returns the message.
    async fn error_response(&mut self, id: impl Into<Value>, code: i64, needle: &str) -> String {
        let id = id.into();
        let response = self.response(id.clone()).await;
        assert!(
            response.get("result").is_none(),
            "expected an error for id {id}, got a result: {response}"
        );
        assert_eq!(
            response["error"]["code"],
            json!(code),
            "error code of the response to id {id}: {response}"
        );
        let message = response["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("error without a string message: {response}"))
            .to_string();
        assert!(
            message.contains(needle),
            "the error message for id {id} does not mention {needle:?}: {message:?}"
        );
        message
    }

    /// A ping with `id` is answered with an empty result, as the next response.
    async fn ping(&mut self, id: i64) {
        self.send_json(&json!({ "jsonrpc": "2.0", "id": id, "method": "ping" }))
            .await;
        let response = self.response(id).await;
        assert!(
            response["result"].is_object(),
            "ping {id} was not answered with a result: {response}"
        );
    }

    /// Close stdin, read stdout to its end (every line must be JSON-RPC) and
    /// wait for the server to exit.
    async fn close_and_drain(mut self) -> Vec<Vec<u8>> {
        drop(self.stdin.take());
        while let Some(message) = self.next_message().await {
            if message.get("method").is_none() {
                self.fail(&format!(
                    "a response arrived after stdin was closed with every request answered: {message}"
                ));
            }
        }
        match tokio::time::timeout(GONE_TIMEOUT, self.child.wait()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.fail(&format!("waiting for the server failed: {e}")),
            Err(_) => self.fail(&format!(
                "the server did not exit within {GONE_TIMEOUT:?} after stdin was closed"
            )),
        }
        std::mem::take(&mut self.lines)
    }
}

async fn protocol_server() -> RawServer {
    RawServer::start(&["--max-request-bytes", &MAX_REQUEST_BYTES.to_string()]).await
}

/// A python_exec tools/call line; `arguments` is spliced in as given.
fn tools_call_line(id: i64, arguments: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"python_exec","arguments":{arguments}}}}}"#
    )
    .into_bytes()
}

// ------------------------------------------------------------- scenarios
// Each leaves the server ready for the next: every one ends with a ping.

/// Point 1: A line that is not JSON: parse error with a null id.
async fn not_json_gets_a_parse_error(srv: &mut RawServer) {
    srv.send_line(b"this is not json").await;
    srv.error_response(Value::Null, PARSE_ERROR, "not valid JSON")
        .await;
    // Truncated JSON is not JSON either.
    srv.send_line(br#"{"jsonrpc":"2.0","id":3,"method":"pi"#)
        .await;
    srv.error_response(Value::Null, PARSE_ERROR, "not valid JSON")
        .await;
    srv.ping(101).await;
}

/// Point 2: Invalid UTF-8 inside a request: parse error carrying its id.
async fn invalid_utf8_gets_an_error_with_the_id(srv: &mut RawServer) {
    let mut line = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"python_exec","arguments":{"code":"s = '"#.to_vec();
    line.extend_from_slice(b"\xff\xfe");
    line.extend_from_slice(br#"'"}}}"#);
    srv.send_line(&line).await;
    srv.error_response(7, PARSE_ERROR, "UTF-8").await;

    // The same with a string id that follows the params.
    let mut line =
        br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"python_exec","arguments":{"code":"s = '"#
            .to_vec();
    line.extend_from_slice(b"\xc3\x28");
    line.extend_from_slice(br#"'"}},"id":"utf8-after"}"#);
    srv.send_line(&line).await;
    srv.error_response("utf8-after", PARSE_ERROR, "UTF-8").await;
    srv.ping(102).await;
}

/// Point 3: Lines over --max-request-bytes: invalid request with the line's own
/// id, wherever the id is and however much bigger than the limit the line is.
async fn oversized_lines_get_an_error_with_the_id(srv: &mut RawServer) {
    // A request well under the limit still runs.
    let filler = "a".repeat(MAX_REQUEST_BYTES / 2);
    srv.send_line(&tools_call_line(
        9,
        &json!({ "code": format!("len('{filler}')") }).to_string(),
    ))
    .await;
    let small = srv.response(9).await;
    assert_eq!(
        small["result"]["structuredContent"]["value"],
        json!(filler.len().to_string()),
        "a request under the limit runs: {small}"
    );

    // The id before a big params.
    let big = "b".repeat(3 * MAX_REQUEST_BYTES);
    let before = tools_call_line(10, &json!({ "code": format!("'{big}'") }).to_string());
    assert!(before.len() > MAX_REQUEST_BYTES);
    srv.send_line(&before).await;
    srv.error_response(10, INVALID_REQUEST, "--max-request-bytes")
        .await;

    // The id after a big params that holds a nested "id" of its own, in a
    // line far larger than any read buffer.
    let huge = "c".repeat(200_000);
    let after = format!(
        r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"name":"python_exec","arguments":{{"id": 999,"code":"'{huge}'"}}}},"id":11}}"#
    );
    srv.send_line(after.as_bytes()).await;
    srv.error_response(11, INVALID_REQUEST, "--max-request-bytes")
        .await;

    // A string id after params, and a nested "id" inside a nested array.
    let after = format!(
        r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"name":"python_exec","arguments":{{"code":"'{big}'","meta":[{{"id":998}}]}}}}, "id" : "big-12"}}"#
    );
    srv.send_line(after.as_bytes()).await;
    srv.error_response("big-12", INVALID_REQUEST, "--max-request-bytes")
        .await;

    // The rest of an oversized line is not taken for further messages.
    srv.ping(103).await;
}

/// Point 4: A batch: invalid request with a null id.
async fn batch_gets_invalid_request(srv: &mut RawServer) {
    srv.send_line(
        br#"[{"jsonrpc":"2.0","id":30,"method":"ping"},{"jsonrpc":"2.0","id":31,"method":"ping"}]"#,
    )
    .await;
    srv.error_response(Value::Null, INVALID_REQUEST, "batch")
        .await;
    srv.ping(104).await;
}

/// Point 5: Valid JSON with an id that is not a JSON-RPC message.
async fn malformed_message_with_an_id_gets_invalid_request(srv: &mut RawServer) {
    srv.send_line(br#"{"jsonrpc":"2.0","id":5,"method":42}"#)
        .await;
    srv.error_response(5, INVALID_REQUEST, "").await;
    srv.ping(105).await;
}

/// Point 6: Bad lines without an id get no answer at all.
async fn bad_notifications_get_no_answer(srv: &mut RawServer) {
    srv.send_line(br#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#)
        .await;
    srv.send_line(br#"{"jsonrpc":"2.0","method":42}"#).await;
    srv.send_line(br#"{"jsonrpc":"2.0","method":"notifications/whatever","params":7}"#)
        .await;
    // `response` fails on any response other than the ping's.
    srv.ping(20).await;
}

/// Point 7: An unknown method with an id: method not found, with that id.
async fn unknown_method_gets_method_not_found(srv: &mut RawServer) {
    srv.send_line(br#"{"jsonrpc":"2.0","id":21,"method":"no/such/method","params":{}}"#)
        .await;
    srv.error_response(21, METHOD_NOT_FOUND, "").await;
    srv.ping(107).await;
}

/// Point 9: Empty lines (also a bare "\r\n") are skipped and CRLF line endings
/// accepted.
async fn blank_lines_and_crlf_are_accepted(srv: &mut RawServer) {
    srv.send_raw(b"\n\n\r\n\n").await;
    srv.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":40,\"method\":\"ping\"}\r\n")
        .await;
    let crlf = srv.response(40).await;
    assert!(crlf["result"].is_object(), "CRLF ping: {crlf}");
    // A CRLF tools/call too, then a plain ping: nothing left over in between.
    let mut call = tools_call_line(41, r#"{"code":"1+1"}"#);
    call.extend_from_slice(b"\r\n");
    srv.send_raw(&call).await;
    let result = srv.response(41).await;
    assert_eq!(
        result["result"]["structuredContent"]["value"],
        json!("2"),
        "CRLF tools/call: {result}"
    );
    srv.ping(109).await;
}

// ------------------------------------------------------------- tests

#[tokio::test]
async fn a_line_that_is_not_json_gets_a_parse_error_with_null_id() {
    let mut srv = protocol_server().await;
    not_json_gets_a_parse_error(&mut srv).await;
}

#[tokio::test]
async fn invalid_utf8_gets_a_parse_error_with_the_request_id() {
    let mut srv = protocol_server().await;
    invalid_utf8_gets_an_error_with_the_id(&mut srv).await;
}

#[tokio::test]
async fn oversized_lines_get_invalid_request_with_the_request_id() {
    let mut srv = protocol_server().await;
    oversized_lines_get_an_error_with_the_id(&mut srv).await;
}

#[tokio::test]
async fn a_batch_gets_invalid_request_with_null_id() {
    let mut srv = protocol_server().await;
    batch_gets_invalid_request(&mut srv).await;
}

#[tokio::test]
async fn a_malformed_message_with_an_id_gets_invalid_request() {
    let mut srv = protocol_server().await;
    malformed_message_with_an_id_gets_invalid_request(&mut srv).await;
}

#[tokio::test]
async fn bad_notifications_get_no_response() {
    let mut srv = protocol_server().await;
    bad_notifications_get_no_answer(&mut srv).await;
}

#[tokio::test]
async fn an_unknown_method_gets_method_not_found() {
    let mut srv = protocol_server().await;
    unknown_method_gets_method_not_found(&mut srv).await;
}

#[tokio::test]
async fn blank_lines_and_crlf_line_endings_are_accepted() {
    let mut srv = protocol_server().await;
    blank_lines_and_crlf_are_accepted(&mut srv).await;
}

/// Point 8: All of the above in one server, then a cell runs, and every byte the
/// server wrote on stdout was a JSON-RPC line.
#[tokio::test]
async fn after_every_kind_of_bad_line_a_cell_still_runs_and_stdout_is_all_json() {
    let mut srv = protocol_server().await;
    bad_notifications_get_no_answer(&mut srv).await;
    unknown_method_gets_method_not_found(&mut srv).await;
    not_json_gets_a_parse_error(&mut srv).await;
    invalid_utf8_gets_an_error_with_the_id(&mut srv).await;
    oversized_lines_get_an_error_with_the_id(&mut srv).await;
    batch_gets_invalid_request(&mut srv).await;
    malformed_message_with_an_id_gets_invalid_request(&mut srv).await;
    blank_lines_and_crlf_are_accepted(&mut srv).await;

    srv.send_line(&tools_call_line(50, r#"{"code":"6*7"}"#))
        .await;
    let response = srv.response(50).await;
    assert_eq!(
        response["result"]["structuredContent"]["value"],
        json!("42"),
        "6*7 after the bad lines: {response}"
    );
    assert_ne!(
        response["result"]["isError"],
        json!(true),
        "6*7 is not an error: {response}"
    );

    let lines = srv.close_and_drain().await;
    // next_message already failed on any line that was not JSON-RPC; check
    // the whole transcript once more so that this test states it.
    for line in &lines {
        let parsed: Value = serde_json::from_slice(line).unwrap_or_else(|e| {
            panic!(
                "stdout line is not JSON ({e}): {:?}",
                String::from_utf8_lossy(line)
            )
        });
        assert_eq!(parsed["jsonrpc"], "2.0", "not JSON-RPC 2.0: {parsed}");
    }
    assert!(
        lines.len() >= 20,
        "expected a response for each request, got {} lines",
        lines.len()
    );
}

/// The log at the default level is ferrepl's own words: the MCP library's
/// lines, which dump whole messages (each error answer, the client's
/// initialize), do not appear.
#[tokio::test]
async fn the_default_log_has_no_lines_of_the_mcp_library() {
    let mut srv = protocol_server().await;
    unknown_method_gets_method_not_found(&mut srv).await;
    malformed_message_with_an_id_gets_invalid_request(&mut srv).await;
    srv.send_line(
        br#"{"jsonrpc":"2.0","id":60,"method":"tools/call","params":{"name":"no_such_tool","arguments":{}}}"#,
    )
    .await;
    srv.error_response(60, INVALID_PARAMS, "no_such_tool").await;
    let stderr = srv.stderr.clone();
    srv.close_and_drain().await;
    stderr.wait_closed(GONE_TIMEOUT).await;
    let log = stderr.text();
    assert!(log.contains("ferrepl stopped"), "the log is whole:\n{log}");
    let foreign: Vec<&str> = log.lines().filter(|l| l.contains("rmcp")).collect();
    assert!(
        foreign.is_empty(),
        "the MCP library's lines at the default level: {foreign:#?}"
    );
}

// ------------------------------------------------------------- signals

/// Kills a `sleep` the test started if it outlives the test.
struct SleepGuard(Option<u32>);

impl Drop for SleepGuard {
    fn drop(&mut self) {
        let Some(pid) = self.0 else { return };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.starts_with(b"sleep\x00300\x00") && process_alive(pid) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// Start a worker with a `sleep 300` child, send `signal` to the server, and
/// check that the server exits and takes the worker and the sleep with it.
async fn signal_ends_server_worker_and_children(signal: Signal) {
    let mut server = StdioServer::start(&[]).await;
    let mut guard = SleepGuard(None);

    let (worker_pid, sleep_pid) = worker_with_a_sleeping_child(&server).await;
    guard.0 = Some(sleep_pid);

    let server_pid = server.child.id().expect("the server is running");
    kill(Pid::from_raw(server_pid as i32), signal)
        .unwrap_or_else(|e| panic!("send {signal} to the server {server_pid}: {e}"));

    let status = match tokio::time::timeout(GONE_TIMEOUT, server.child.wait()).await {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => panic!("waiting for the server failed: {e}"),
        Err(_) => panic!(
            "the server did not exit within {GONE_TIMEOUT:?} after {signal}; stderr:\n{}",
            server.stderr_log()
        ),
    };
    // The server handles the signal and shuts down; were it killed by the
    // signal instead, its workers would still end (on the EOF of their control
    // pipe), so this is what shows that the signal was handled.
    assert!(
        status.signal().is_none(),
        "the server was killed by a signal ({status}) instead of shutting down on {signal}; stderr:\n{}",
        server.stderr_log()
    );
    assert!(
        wait_process_gone(worker_pid, GONE_TIMEOUT).await,
        "the worker {worker_pid} outlived the server ({status}) after {signal}; stderr:\n{}",
        server.stderr_log()
    );
    assert!(
        wait_process_gone(sleep_pid, GONE_TIMEOUT).await,
        "the worker's child sleep {sleep_pid} outlived the server ({status}) after {signal}; stderr:\n{}",
        server.stderr_log()
    );
}

#[tokio::test]
async fn sigterm_ends_the_server_its_worker_and_the_workers_children() {
    signal_ends_server_worker_and_children(Signal::SIGTERM).await;
}

#[tokio::test]
async fn sigint_ends_the_server_its_worker_and_the_workers_children() {
    signal_ends_server_worker_and_children(Signal::SIGINT).await;
}

/// A client may pipe its requests and close stdin right after: every request
/// read before the end is still answered before the server exits.
#[tokio::test]
async fn requests_piped_just_before_stdin_closes_are_answered() {
    let mut srv = RawServer::start(&[]).await;
    srv.initialize().await;
    srv.send_line(br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    srv.send_line(&tools_call_line(3, r#"{"code":"6*7"}"#))
        .await;
    srv.send_line(br#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#)
        .await;
    drop(srv.stdin.take());
    let mut answered = Vec::new();
    while let Some(message) = srv.next_message().await {
        if let Some(id) = message.get("id").and_then(Value::as_i64) {
            answered.push(id);
        }
    }
    answered.sort_unstable();
    assert_eq!(answered, vec![2, 3, 4], "{}", srv.stderr_log());
}
