//! MCP Tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663)
//! through rmcp's client (the Python SDK 2.3 has no client side for it; the
//! TypeScript requester, @modelcontextprotocol/ext-tasks, is driven in
//! tests/interop/ts/tasks.test.mjs). A call becomes a task only when the
//! request's own `_meta` declares the extension, as the extension requires:
//! clients of protocol 2026-07-28 (rmcp's `server/discover` lifecycle,
//! `connect_modern_with` / `launch_modern_with`, and raw requests) get a
//! task instead of `running` for python_exec, r_exec, python_install,
//! r_install and shell_exec; tasks/cancel interrupts; a task outlives its
//! client and another client of the tenant collects it; a stateless HTTP
//! request declares it per request. A legacy client that declared the
//! extension only at `initialize` (the Inspector CLI, SDKs in legacy mode)
//! cannot follow a task and gets today's `running` result, as does every
//! client that never declared it.

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, DetailedTask, GetTaskParams, Implementation, TaskPayload, TaskStatus,
};
use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::support::{
    CALL_TIMEOUT, HttpServer, Launch, StderrLog, StdioServer, ToolOutput, call, http_exchange,
    path_str, real_python3, tail, tool_names,
};

/// A client that declares the tasks extension: at initialize in the legacy
/// lifecycle, in every request's `_meta` in the 2026-07-28 one
/// (`connect_modern_with`, `launch_modern_with`).
pub(crate) fn tasks_client() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("tasks-test", "0"),
    )
}

/// How a task-capable call was answered.
enum Answer {
    Result(ToolOutput),
    Task(String),
}

async fn call_once(peer: &Peer<RoleClient>, tool: &str, args: Value) -> Answer {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    let answer = tokio::time::timeout(CALL_TIMEOUT, peer.call_tool_once(params))
        .await
        .unwrap_or_else(|_| panic!("tools/call {tool} did not answer"))
        .unwrap_or_else(|e| panic!("tools/call {tool} failed: {e}"));
    match answer {
        CallToolResponse::Complete(result) => Answer::Result(ToolOutput::from_result(result)),
        CallToolResponse::Task(created) => {
            assert_eq!(created.task.status, TaskStatus::Working, "{created:?}");
            assert_eq!(
                created.task.ttl_ms, None,
                "a working task lives as long as its work"
            );
            assert!(created.task.poll_interval_ms.is_some(), "{created:?}");
            Answer::Task(created.task.task_id)
        }
        other => panic!("tools/call {tool}: unexpected answer {other:?}"),
    }
}

/// The id of the task a call became (it must have become one).
pub(crate) async fn start_task(peer: &Peer<RoleClient>, tool: &str, args: Value) -> String {
    match call_once(peer, tool, args).await {
        Answer::Task(id) => id,
        Answer::Result(out) => panic!("{tool} answered at once instead of as a task: {out:#?}"),
    }
}

async fn get(peer: &Peer<RoleClient>, id: &str) -> DetailedTask {
    peer.get_task(GetTaskParams::new(id.to_string()))
        .await
        .unwrap_or_else(|e| panic!("tasks/get {id}: {e}"))
        .task
}

/// Polls a task until it has ended (bounded).
pub(crate) async fn settled(peer: &Peer<RoleClient>, id: &str, within: Duration) -> DetailedTask {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let task = get(peer, id).await;
        if task.status().is_terminal() {
            return task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id} still {:?} after {within:?}: {task:?}",
            task.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The tool result a completed task holds.
pub(crate) fn completed(task: &DetailedTask) -> ToolOutput {
    match &task.payload {
        TaskPayload::Completed { result } => {
            let result: CallToolResult = serde_json::from_value(Value::Object(result.clone()))
                .unwrap_or_else(|e| {
                    panic!("a task result that is no CallToolResult ({e}): {task:?}")
                });
            ToolOutput::from_result(result)
        }
        other => panic!("expected a completed task, got {other:?} in {task:?}"),
    }
}

/// A result's text without its status line's cell number and time.
fn comparable(out: &ToolOutput) -> (String, Value) {
    let mut lines: Vec<&str> = out.text.lines().collect();
    let status = lines.pop().unwrap_or_default();
    let kept: Vec<&str> = status
        .split(" | ")
        .filter(|p| !p.starts_with("cell "))
        .collect();
    let head = kept.get(..kept.len().saturating_sub(1)).unwrap_or_default();
    let mut structured = out.structured.clone();
    if let Some(map) = structured.as_object_mut() {
        map.remove("elapsed_ms");
        map.remove("cell");
    }
    (
        format!("{}\n{}", lines.join("\n"), head.join(" | ")),
        structured,
    )
}

const LONG_CELL: &str = "import time\nprint('start')\ntime.sleep(2.5)\nprint('end')\n6*7";

#[tokio::test]
async fn a_long_cell_runs_as_a_task_past_max_wait_and_completes_with_python_execs_result() {
    // --max-wait 1: a call returns within a second; a task has no such bound.
    let server = HttpServer::start(&["--max-wait", "1"], &[]).await;
    let client = server.connect_modern_with(tasks_client(), None).await;
    let peer = client.peer();

    // Work done within the window is answered at once, as today.
    match call_once(peer, "python_exec", json!({ "code": "1+1" })).await {
        Answer::Result(out) => assert_eq!(out.assert_ok().value(), Some("2")),
        Answer::Task(id) => panic!("a quick cell became task {id}"),
    }

    let id = start_task(
        peer,
        "python_exec",
        json!({ "code": LONG_CELL, "wait_s": 0.3 }),
    )
    .await;
    let working = get(peer, &id).await;
    assert_eq!(working.status(), TaskStatus::Working, "{working:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let working = get(peer, &id).await;
    let message = working.task.status_message.clone().unwrap_or_default();
    assert!(
        working.status() == TaskStatus::Working && message.contains("running for"),
        "a working task says how long it has run: {working:?}"
    );
    let done = settled(peer, &id, Duration::from_secs(30)).await;
    assert_eq!(done.status(), TaskStatus::Completed, "{done:?}");
    assert!(done.task.ttl_ms.is_some_and(|ms| ms >= 60_000), "{done:?}");
    let from_task = completed(&done);
    from_task.assert_ok();
    assert_eq!(from_task.value(), Some("42"));
    assert_eq!(from_task.str_field("stdout"), "start\nend\n");
    assert!(
        done.task
            .status_message
            .as_deref()
            .is_some_and(|m| m.starts_with("-- ok | cell ")),
        "{done:?}"
    );
    // The result is fetched again as often as asked, while kept.
    assert_eq!(completed(&get(peer, &id).await).text, from_task.text);

    // The same cell through a client without tasks, given time enough
    // (another server: this one's --max-wait is 1 s).
    let plain_server = HttpServer::start(&[], &[]).await;
    let plain = plain_server.connect(None).await;
    let direct = call(
        plain.peer(),
        "python_exec",
        json!({ "code": LONG_CELL, "wait_s": 30 }),
    )
    .await;
    assert_eq!(comparable(&from_task), comparable(&direct));
}

#[tokio::test]
async fn tasks_cancel_interrupts_the_cell_and_the_session_keeps_its_variables() {
    let server = HttpServer::start(&[], &[]).await;
    let client = server.connect_modern_with(tasks_client(), None).await;
    let peer = client.peer();
    match call_once(peer, "python_exec", json!({ "code": "kept = 41" })).await {
        Answer::Result(out) => {
            out.assert_ok();
        }
        Answer::Task(id) => panic!("a quick cell became task {id}"),
    }
    let code = "import time\nprint('looping')\nwhile True: time.sleep(0.05)";
    let id = start_task(peer, "python_exec", json!({ "code": code, "wait_s": 0.5 })).await;
    peer.cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .expect("tasks/cancel is acknowledged");
    let done = settled(peer, &id, Duration::from_secs(30)).await;
    assert_eq!(done.status(), TaskStatus::Cancelled, "{done:?}");
    assert!(
        done.task
            .status_message
            .as_deref()
            .is_some_and(|m| m.contains("cancelled") && m.contains("interrupted")),
        "{done:?}"
    );
    // The interrupted cell's result is python_wait's to give.
    let out = call(peer, "python_wait", json!({ "wait_s": 10 })).await;
    assert_eq!(out.status(), "interrupted", "{out:#?}");
    assert!(out.text.contains("looping"), "{out:#?}");
    let out = call(peer, "python_exec", json!({ "code": "kept + 1" })).await;
    assert_eq!(out.assert_ok().value(), Some("42"));
    // A cancelled task cannot be cancelled into anything else; an unknown
    // one is invalid params.
    peer.cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .expect("cancelling an ended task is acknowledged");
    assert_eq!(get(peer, &id).await.status(), TaskStatus::Cancelled);
    let err = peer
        .get_task(GetTaskParams::new("no-such-task".to_string()))
        .await
        .expect_err("an unknown task");
    assert!(err.to_string().contains("no task 'no-such-task'"), "{err}");
}

#[tokio::test]
async fn input_in_a_task_completes_it_with_waiting_input_and_python_wait_answers() {
    let server = HttpServer::start(&[], &[]).await;
    let client = server.connect_modern_with(tasks_client(), None).await;
    let peer = client.peer();
    let code = "import time\ntime.sleep(1)\nname = input('name? ')\nprint('hello', name)";
    let id = start_task(peer, "python_exec", json!({ "code": code, "wait_s": 0.2 })).await;
    let done = settled(peer, &id, Duration::from_secs(30)).await;
    let out = completed(&done);
    assert_eq!(out.status(), "waiting_input", "{out:#?}");
    assert!(out.text.contains("name? "), "{out:#?}");
    let out = call(peer, "python_wait", json!({ "input": "ada", "wait_s": 10 })).await;
    out.assert_ok();
    assert!(out.text.contains("hello ada"), "{out:#?}");
}

#[tokio::test]
async fn a_task_outlives_its_client_and_another_client_of_the_tenant_collects_it() {
    let server = HttpServer::start(&[], &[]).await;
    let first = server.connect_modern_with(tasks_client(), None).await;
    let code = "import time\ntime.sleep(2)\nprint('finished without its client')";
    let id = start_task(
        first.peer(),
        "python_exec",
        json!({ "code": code, "wait_s": 0.2 }),
    )
    .await;
    first.cancel().await.expect("the first client disconnects");

    let second = server.connect_modern_with(tasks_client(), None).await;
    let done = settled(second.peer(), &id, Duration::from_secs(30)).await;
    let out = completed(&done);
    out.assert_ok();
    assert!(out.text.contains("finished without its client"), "{out:#?}");

    // A client that never declared the extension may not use tasks/*.
    let plain = server.connect(None).await;
    let err = plain
        .peer()
        .get_task(GetTaskParams::new(id.clone()))
        .await
        .expect_err("tasks/get without the extension");
    assert!(
        err.to_string().contains("-32021") || err.to_string().to_lowercase().contains("capab"),
        "{err}"
    );
}

#[tokio::test]
async fn a_shell_job_and_an_install_run_as_tasks_over_stdio() {
    let workspace = tempfile::tempdir().expect("workspace");
    let state = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir");
    let python = real_python3();
    let args = [
        "--workdir",
        path_str(workspace.path()),
        "--state-dir",
        path_str(state.path()),
        "--python",
        path_str(&python),
    ];
    let launch = Launch::new(&args).without_workdir_flag();
    let server = StdioServer::launch_modern_with(launch, tasks_client()).await;
    let peer = server.client.peer();

    let command = "echo begun; sleep 2; echo over";
    let id = start_task(
        peer,
        "shell_exec",
        json!({ "command": command, "wait_s": 0.2 }),
    )
    .await;
    let out = completed(&settled(peer, &id, Duration::from_secs(30)).await);
    assert!(!out.is_error, "{out:#?}");
    assert_eq!(out.structured["status"], "exited", "{out:#?}");
    assert!(out.text.contains("begun\nover"), "{out:#?}");

    // tasks/cancel sends the job SIGINT.
    let id = start_task(
        peer,
        "shell_exec",
        json!({ "command": "sleep 60", "wait_s": 0.2 }),
    )
    .await;
    peer.cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .expect("tasks/cancel");
    let done = settled(peer, &id, Duration::from_secs(30)).await;
    assert_eq!(done.status(), TaskStatus::Cancelled, "{done:?}");
    assert!(
        done.task
            .status_message
            .as_deref()
            .is_some_and(|m| m.contains("SIGINT")),
        "{done:?}"
    );

    let wheel = wheel(workspace.path(), "task_pkg");
    let id = start_task(
        peer,
        "python_install",
        json!({ "packages": [wheel], "wait_s": 0 }),
    )
    .await;
    let out = completed(&settled(peer, &id, Duration::from_secs(180)).await);
    assert!(!out.is_error, "{out:#?}");
    assert_eq!(out.structured["exit_code"], 0, "{out:#?}");
    assert!(out.text.contains("Installed task-pkg 1.0 in "), "{out:#?}");
    match call_once(
        peer,
        "python_exec",
        json!({ "code": "import task_pkg\ntask_pkg.VALUE" }),
    )
    .await
    {
        Answer::Result(out) => assert_eq!(out.assert_ok().value(), Some("7")),
        Answer::Task(id) => panic!("a quick cell became task {id}"),
    }
}

#[tokio::test]
async fn a_client_without_tasks_sees_todays_running_and_the_same_tools() {
    let server = HttpServer::start(&[], &[]).await;
    let plain = server.connect(None).await;
    let out = call(
        plain.peer(),
        "python_exec",
        json!({ "code": "import time\ntime.sleep(2)\n'late'", "wait_s": 0.3 }),
    )
    .await;
    assert_eq!(out.status(), "running", "{out:#?}");
    let out = call(plain.peer(), "python_wait", json!({ "wait_s": 10 })).await;
    assert_eq!(out.assert_ok().value(), Some("'late'"));

    // Neither declaring the extension at initialize nor in every request
    // changes the tools.
    let plain_list = listed(plain.peer()).await;
    let names = tool_names(plain.peer()).await;
    let with_tasks = server.connect_with(tasks_client(), None).await;
    assert_eq!(names, tool_names(with_tasks.peer()).await);
    assert_eq!(plain_list, listed(with_tasks.peer()).await);
    let modern = server.connect_modern_with(tasks_client(), None).await;
    assert_eq!(names, tool_names(modern.peer()).await);
    assert_eq!(plain_list, listed(modern.peer()).await);
}

/// A legacy client (the `initialize` handshake) that declared the extension
/// at initialize, as the Inspector CLI and the SDKs in legacy mode do: its
/// requests carry no capabilities of their own, so a long cell is answered
/// with a whole `running` result (content and all), never a task, and
/// python_wait follows the cell to its end.
#[tokio::test]
async fn a_legacy_client_that_declared_tasks_at_initialize_gets_running_never_a_task() {
    let server = HttpServer::start(&[], &[]).await;
    let client = server.connect_with(tasks_client(), None).await;
    let peer = client.peer();
    let negotiated = peer
        .peer_info()
        .expect("the server's initialize result")
        .protocol_version
        .clone();
    assert!(
        negotiated.has_initialize(),
        "a legacy client negotiated {negotiated:?}"
    );
    let code = "import time\nprint('begun')\ntime.sleep(3)\nprint('over')\n'legacy done'";
    let out = match call_once(peer, "python_exec", json!({ "code": code, "wait_s": 1 })).await {
        Answer::Result(out) => out,
        Answer::Task(id) => panic!("a legacy connection was given task {id}"),
    };
    assert_eq!(out.status(), "running", "{out:#?}");
    assert!(!out.is_error, "{out:#?}");
    assert!(
        out.text.contains("python_wait") && out.text.contains("-- running | cell "),
        "a running result says how to go on: {out:#?}"
    );
    let mut done = call(peer, "python_wait", json!({ "wait_s": 10 })).await;
    for _ in 0..5 {
        if done.status() != "running" {
            break;
        }
        done = call(peer, "python_wait", json!({ "wait_s": 10 })).await;
    }
    assert_eq!(done.assert_ok().value(), Some("'legacy done'"), "{done:#?}");
    assert!(done.text.contains("over"), "{done:#?}");
}

/// Upper bound for one read or write on a raw server's pipes.
const RAW_IO_TIMEOUT: Duration = Duration::from_secs(60);

/// A ferrepl server on stdio spoken to in JSON-RPC lines by hand, as a
/// client without an SDK would.
struct RawStdio {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: StderrLog,
    _workdir: tempfile::TempDir,
}

impl RawStdio {
    /// `ferrepl` (full surface: structured results) on stdio; no handshake.
    fn spawn() -> Self {
        let spawned = Launch::new(&[]).spawn_stdio();
        RawStdio {
            _child: spawned.child,
            stdin: spawned.stdin.expect("piped stdin"),
            stdout: BufReader::new(spawned.stdout.expect("piped stdout")),
            stderr: spawned.stderr,
            _workdir: spawned.workdir,
        }
    }

    fn fail(&self, what: &str) -> ! {
        panic!(
            "{what}\nserver stderr (tail):\n{}",
            tail(&self.stderr.text(), 4000)
        );
    }

    async fn send(&mut self, message: Value) {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        let write = async {
            self.stdin.write_all(&line).await?;
            self.stdin.flush().await
        };
        match tokio::time::timeout(RAW_IO_TIMEOUT, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail(&format!("writing to the server failed: {e}")),
            Err(_) => self.fail("writing to the server did not finish"),
        }
    }

    /// The response to `id`, skipping the server's notifications.
    async fn response(&mut self, id: u64) -> Value {
        loop {
            let mut line = String::new();
            match tokio::time::timeout(RAW_IO_TIMEOUT, self.stdout.read_line(&mut line)).await {
                Ok(Ok(0)) => self.fail(&format!("stdout closed before the response to {id}")),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => self.fail(&format!("reading the server's stdout failed: {e}")),
                Err(_) => self.fail(&format!("no response to {id} within {RAW_IO_TIMEOUT:?}")),
            }
            let message: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| self.fail(&format!("a stdout line is not JSON ({e}): {line}")));
            if message.get("method").is_none() && message["id"] == json!(id) {
                return message;
            }
        }
    }

    /// A request and its response.
    async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        self.response(id).await
    }

    /// The `result` of a request; fails on an error response.
    async fn result(&mut self, id: u64, method: &str, params: Value) -> Value {
        let answer = self.request(id, method, params).await;
        match answer.get("result") {
            Some(result) => result.clone(),
            None => self.fail(&format!("{method} failed: {answer}")),
        }
    }
}

/// `_meta` of a 2026-07-28 request from a client that declares the tasks
/// extension (the shape the stateless HTTP test sends).
fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": "raw-stdio", "version": "0" },
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} }
        }
    })
}

const RAW_LONG_CELL: &str = "import time\nprint('begun')\ntime.sleep(3)\n'raw done'";

/// Without an SDK, over stdio: a legacy `initialize` that declares the tasks
/// extension gets a whole `running` result for a long cell (content, the
/// status in structuredContent, no task fields), which python_wait follows
/// to the end; the same call from a 2026-07-28 client, whose request
/// declares the extension in its own `_meta`, becomes a task that completes
/// with the cell's result.
#[tokio::test]
async fn raw_json_rpc_over_stdio_a_task_only_when_the_request_declares_the_extension() {
    let call = json!({
        "name": "python_exec",
        "arguments": { "code": RAW_LONG_CELL, "wait_s": 1 }
    });

    // (a) The legacy era: the extension declared at initialize only.
    let mut legacy = RawStdio::spawn();
    let init = legacy
        .result(
            1,
            "initialize",
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } },
                "clientInfo": { "name": "raw-legacy", "version": "0" }
            }),
        )
        .await;
    assert!(
        init["capabilities"]["extensions"]
            .get("io.modelcontextprotocol/tasks")
            .is_some(),
        "the server declares the extension: {init}"
    );
    legacy
        .send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
        .await;
    let running = legacy.result(2, "tools/call", call.clone()).await;
    assert!(
        running.get("taskId").is_none() && running["resultType"] != "task",
        "a legacy connection was given a task: {running}"
    );
    let content = running["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no content array: {running}"));
    let text = content
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect::<String>();
    assert!(text.contains("-- running | cell 1 |"), "{running}");
    assert_eq!(
        running["structuredContent"]["status"], "running",
        "{running}"
    );
    assert_ne!(running["isError"], true, "{running}");
    let mut done = Value::Null;
    for id in 3..10 {
        done = legacy
            .result(
                id,
                "tools/call",
                json!({ "name": "python_wait", "arguments": { "wait_s": 10 } }),
            )
            .await;
        if done["structuredContent"]["status"] != "running" {
            break;
        }
    }
    assert_eq!(done["structuredContent"]["status"], "ok", "{done}");
    assert_eq!(done["structuredContent"]["value"], "'raw done'", "{done}");

    // (b) The 2026-07-28 era: no initialize; every request says who it is
    // from and what it supports.
    let mut modern = RawStdio::spawn();
    let discovered = modern
        .result(1, "server/discover", json!({ "_meta": modern_meta() }))
        .await;
    assert!(
        discovered["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.contains(&json!("2026-07-28"))),
        "server/discover over stdio: {discovered}"
    );
    let mut params = call.clone();
    params["_meta"] = modern_meta();
    let created = modern.result(2, "tools/call", params).await;
    assert_eq!(created["resultType"], "task", "{created}");
    assert_eq!(created["status"], "working", "{created}");
    assert!(created.get("content").is_none(), "{created}");
    let id = created["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no taskId in {created}"))
        .to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut request_id = 3;
    let task = loop {
        let got = modern
            .result(
                request_id,
                "tasks/get",
                json!({ "taskId": id, "_meta": modern_meta() }),
            )
            .await;
        request_id += 1;
        if got["status"] != "working" {
            break got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still working: {got}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(
        task["result"]["structuredContent"]["value"], "'raw done'",
        "{task}"
    );
}

/// tools/list as JSON.
async fn listed(peer: &Peer<RoleClient>) -> String {
    let tools = peer.list_all_tools().await.expect("tools/list");
    serde_json::to_string(&tools).expect("tools as JSON")
}

/// A stateless request (protocol 2026-07-28) declares the extension in its
/// own `_meta`; its task is fetched by later requests of the same tenant
/// (`Mcp-Name` naming the task), never by another tenant's.
#[tokio::test]
async fn stateless_requests_run_tasks_bound_to_their_tenant() {
    const ALPHA: &str = "alpha-token-0123456789abcdef";
    const BETA: &str = "beta-token-0123456789abcdef0";
    let dir = tempfile::tempdir().expect("a directory for the tokens file");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{ALPHA} alpha\n{BETA} beta\n")).expect("tokens");
    let server = HttpServer::start(&["--auth-token-file", path_str(&tokens)], &[]).await;
    let host = format!("127.0.0.1:{}", server.port);
    let request =
        |token: &'static str, id: u32, method: &'static str, name: String, params: Value| {
            let host = host.clone();
            let mut params = params;
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": { "name": "t", "version": "0" },
                "io.modelcontextprotocol/clientCapabilities": {
                    "extensions": { "io.modelcontextprotocol/tasks": {} }
                }
            });
            let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
                .to_string();
            async move {
                let auth = format!("Bearer {token}");
                let (code, body) = http_exchange(
                    server.port,
                    "POST",
                    "/mcp",
                    &[
                        ("Host", &host),
                        ("Content-Type", "application/json"),
                        ("Accept", "application/json, text/event-stream"),
                        ("MCP-Protocol-Version", "2026-07-28"),
                        ("Mcp-Method", method),
                        ("Mcp-Name", &name),
                        ("Authorization", &auth),
                    ],
                    &body,
                )
                .await;
                assert_eq!(code, 200, "{method}: {body}");
                let json_line = body
                    .lines()
                    .map(|l| l.strip_prefix("data: ").unwrap_or(l))
                    .find(|l| l.starts_with('{'))
                    .unwrap_or_else(|| panic!("no JSON in {body}"));
                serde_json::from_str::<Value>(json_line).expect("a JSON-RPC answer")
            }
        };
    let code = "import time\ntime.sleep(1.5)\n'stateless task'";
    let args = json!({ "name": "python_exec", "arguments": { "code": code, "wait_s": 0.2 } });
    let created = request(ALPHA, 1, "tools/call", "python_exec".into(), args).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no taskId in {created}"))
        .to_string();

    let other = request(BETA, 2, "tasks/get", id.clone(), json!({ "taskId": id })).await;
    assert_eq!(
        other["error"]["code"], -32602,
        "another tenant's task is unknown: {other}"
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let done = loop {
        let got = request(ALPHA, 3, "tasks/get", id.clone(), json!({ "taskId": id })).await;
        if got["result"]["status"] != "working" {
            break got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still working: {got}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(done["result"]["status"], "completed", "{done}");
    let text = done["result"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("'stateless task'"), "{done}");
}

#[tokio::test]
async fn an_r_cell_runs_as_a_task_and_tasks_cancel_interrupts_it() {
    let server = HttpServer::start(&["--languages", "python,r"], &[]).await;
    let client = server.connect_modern_with(tasks_client(), None).await;
    let peer = client.peer();
    let code = "kept <- 41\nSys.sleep(1.5)\ncat('r done\\n')\nkept + 1";
    let id = start_task(peer, "r_exec", json!({ "code": code, "wait_s": 0.2 })).await;
    let out = completed(&settled(peer, &id, Duration::from_secs(60)).await);
    out.assert_ok();
    assert!(
        out.text.contains("r done") && out.text.contains("[1] 42"),
        "{out:#?}"
    );
    assert!(out.text.contains("| session r |"), "{out:#?}");

    let code = "while (TRUE) Sys.sleep(0.05)";
    let id = start_task(peer, "r_exec", json!({ "code": code, "wait_s": 0.5 })).await;
    peer.cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .expect("tasks/cancel");
    let done = settled(peer, &id, Duration::from_secs(30)).await;
    assert_eq!(done.status(), TaskStatus::Cancelled, "{done:?}");
    let out = call(peer, "r_wait", json!({ "wait_s": 10 })).await;
    assert_eq!(out.status(), "interrupted", "{out:#?}");
    let out = call(peer, "r_exec", json!({ "code": "kept", "wait_s": 10 })).await;
    out.assert_ok();
    assert!(out.text.contains("[1] 41"), "{out:#?}");
}

/// A wheel of package `name` (VALUE = 7) in `dir`; its file name.
fn wheel(dir: &std::path::Path, name: &str) -> String {
    let built = crate::support::pure_wheel(dir, name, "1.0", 7);
    built
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .expect("a file name")
}
