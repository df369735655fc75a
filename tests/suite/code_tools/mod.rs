//! Code calls tools (issue 33): a session's code calls the operator's MCP
//! servers through `import ferrepl`.
//!
//! Against real upstreams (tests/suite/support/upstreams.rs): our own on the
//! official Python SDK (over stdio and streamable HTTP, with an
//! `UPSTREAM_LOG` of its starts, calls and cancellations), the reference
//! server-everything (stdio and HTTP) and mcp-server-time. Each test puts
//! the servers file outside the workspace, as the operator must. The
//! helpers here serve the submodules too.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::upstreams::{
    everything_http_command, everything_stdio, own_upstream, time_stdio, write_servers_file,
};
use crate::support::{
    CALL_TIMEOUT, Launch, StdioServer, ToolOutput, assert_one_png, assert_status, descendants,
    image_blocks, path_str, png_size, wait_for_file_line,
};

/// Upper bound for an upstream event the test waits on (a server started,
/// a cancellation logged); only reached when something is wrong.
const EVENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Run before each cell's code: `caught(f, ...)` is `["ok", result]`, or
/// `[exception class name, message]` for a `ferrepl.Error`.
const PRELUDE: &str = r#"import json, ferrepl
def caught(f, *args, **kwargs):
    try:
        return ["ok", f(*args, **kwargs)]
    except ferrepl.Error as e:
        return [type(e).__name__, str(e)]
"#;

/// The servers file and our upstream's log, in a directory of their own
/// (outside every workspace).
struct Upstreams {
    dir: tempfile::TempDir,
}

impl Upstreams {
    fn new() -> Self {
        Upstreams {
            dir: tempfile::tempdir().expect("a directory for the servers file"),
        }
    }

    /// The file our upstreams log to (`UPSTREAM_LOG`).
    fn log(&self) -> PathBuf {
        self.dir.path().join("upstream.log")
    }

    /// Our own upstream over stdio, logging to `log()`.
    fn own(&self) -> Value {
        own_logging_to(&self.log())
    }

    /// Writes `{"mcpServers": servers}`; its path.
    fn write(&self, servers: Value) -> String {
        path_str(&write_servers_file(self.dir.path(), servers)).to_string()
    }

    /// The lines of the log starting with `prefix`.
    fn count(&self, prefix: &str) -> usize {
        log_text(&self.log())
            .lines()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    /// Waits (bounded) until `times` lines of the log start with `prefix`.
    async fn wait_for(&self, prefix: &str, times: usize) {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        while self.count(prefix) < times {
            assert!(
                Instant::now() < deadline,
                "the upstream did not log {times} {prefix:?} lines within {EVENT_TIMEOUT:?}; its log:\n{}",
                log_text(&self.log())
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Our own upstream over stdio, logging to `log`.
fn own_logging_to(log: &Path) -> Value {
    let mut spec = own_upstream(&[]);
    spec["env"] = json!({ "UPSTREAM_LOG": path_str(log) });
    spec
}

/// The live processes under `ancestor` whose environment sets
/// `UPSTREAM_LOG=log`: the upstream server logging there (and its
/// containment launcher).
fn upstreams_logging_to(ancestor: u32, log: &Path) -> Vec<u32> {
    let setting = format!("UPSTREAM_LOG={}", path_str(log)).into_bytes();
    descendants(ancestor)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == setting))
        })
        .collect()
}

fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// ferrepl with `--mcp-servers file` and `extra` flags.
async fn start(file: &str, extra: &[&str]) -> StdioServer {
    let mut args = vec!["--mcp-servers", file];
    args.extend_from_slice(extra);
    StdioServer::start(&args).await
}

/// python_exec of `PRELUDE` + `code` in the default session, waiting for it.
async fn run(server: &StdioServer, code: &str) -> ToolOutput {
    server
        .call(
            "python_exec",
            json!({ "code": format!("{PRELUDE}{code}"), "wait_s": 50 }),
        )
        .await
}

/// The JSON the (successful) cell printed last.
fn printed(out: &ToolOutput) -> Value {
    out.assert_ok();
    let stdout = out.str_field("stdout");
    let last = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("the cell printed nothing: {out:#?}"));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}\n{out:#?}"))
}

/// The `[ferrepl] Tool calls: ...` note of a cell (in the notes and the text).
fn calls_note(out: &ToolOutput) -> Option<String> {
    let note = out
        .notes()
        .into_iter()
        .find(|n| n.starts_with("Tool calls: "));
    if let Some(n) = &note {
        assert!(
            out.text.contains(&format!("[ferrepl] {n}")),
            "the note {n:?} is not in the text: {out:#?}"
        );
    }
    note
}

/// `[class name, message]` of a `caught(...)` that must have raised `kind`.
fn assert_caught<'a>(got: &'a Value, kind: &str, needles: &[&str]) -> &'a str {
    assert_eq!(got[0], kind, "expected {kind}, got {got}");
    let message = got[1]
        .as_str()
        .unwrap_or_else(|| panic!("no message in {got}"));
    for needle in needles {
        assert!(
            message.contains(needle),
            "the {kind} message does not mention {needle:?}: {message}"
        );
    }
    message
}

/// The description of `tool` in the server's tools/list.
async fn description_of(server: &StdioServer, tool: &str) -> String {
    let tools = tokio::time::timeout(CALL_TIMEOUT, server.peer().list_all_tools())
        .await
        .expect("tools/list timed out")
        .expect("tools/list failed");
    tools
        .iter()
        .find(|t| t.name == tool)
        .unwrap_or_else(|| panic!("{tool} is not listed"))
        .description
        .as_deref()
        .unwrap_or("")
        .to_string()
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

// ---------------------------------------------------------------- stdio

#[tokio::test]
async fn our_upstream_over_stdio_text_structured_images_and_tool_errors() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(&file, &[]).await;

    // Listing servers and tools is not a tool call.
    let listed = run(
        &server,
        r#"by = {t["name"]: t for t in ferrepl.tools("own")}
print(json.dumps({"servers": ferrepl.servers(), "names": sorted(by), "echo": by["echo"], "add": by["add"]}))"#,
    )
    .await;
    let got = printed(&listed);
    assert_eq!(got["servers"], json!(["own"]), "{got:#}");
    assert_eq!(
        got["names"],
        json!([
            "add", "children", "crash", "echo", "env", "fail", "huge", "image", "peak", "progress",
            "slow"
        ]),
        "{got:#}"
    );
    let echo = &got["echo"];
    assert_eq!(echo["description"], "Returns the text.", "{echo:#}");
    assert_eq!(
        echo["inputSchema"]["properties"]["text"]["type"], "string",
        "{echo:#}"
    );
    assert_eq!(echo["inputSchema"]["required"], json!(["text"]), "{echo:#}");
    assert_eq!(
        got["add"]["outputSchema"]["properties"]["sum"]["type"], "integer",
        "{got:#}"
    );
    assert_eq!(calls_note(&listed), None, "{listed:#?}");
    assert_eq!(up.count("called"), 0, "{}", log_text(&up.log()));

    // Text, structured content, an image (displayed), an error result.
    let out = run(
        &server,
        r#"said = ferrepl.call("own", "echo", text="hello, upstream")
total = ferrepl.call("own", "add", a=2, b=40)
blocks = ferrepl.call("own", "image")
img = [b for b in blocks if isinstance(b, ferrepl.Image)][0]
failed = caught(ferrepl.call, "own", "fail", message="it went wrong")
display(img)
print(json.dumps({"said": said, "total": total, "kinds": [type(b).__name__ for b in blocks],
                  "text": blocks[-1], "mime": img.mime_type, "size": len(img.data),
                  "signature": list(img.data[:8]), "failed": failed,
                  "subclass": issubclass(ferrepl.ToolError, ferrepl.Error)}))"#,
    )
    .await;
    let got = printed(&out);
    assert_eq!(got["said"], "hello, upstream", "{got:#}");
    assert_eq!(got["total"], json!({"sum": 42}), "{got:#}");
    assert_eq!(got["kinds"], json!(["Image", "str"]), "{got:#}");
    assert_eq!(got["text"], "a 2x2 png", "{got:#}");
    assert_eq!(got["mime"], "image/png", "{got:#}");
    assert_eq!(
        got["signature"],
        json!(crate::support::PNG_SIGNATURE),
        "{got:#}"
    );
    assert_caught(&got["failed"], "ToolError", &["it went wrong"]);
    assert_eq!(got["subclass"], true, "{got:#}");
    assert_eq!(assert_one_png(&out), (2, 2));
    assert_eq!(
        image_blocks(&out)[0].data.len() as u64,
        got["size"].as_u64().expect("size"),
        "the image shown is the one the tool returned"
    );
    let note = calls_note(&out).unwrap_or_else(|| panic!("no tool calls note: {out:#?}"));
    assert!(
        note.starts_with("Tool calls: 4, 1 failed, ") && note.ends_with(" s waiting on servers."),
        "{note}"
    );
    assert_eq!(up.count("started"), 1, "one server process for every call");

    // An image as the cell's value is shown; an uncaught error result
    // fails the cell with its message.
    let shown = run(&server, r#"ferrepl.call("own", "image")[0]"#).await;
    shown.assert_ok();
    let images = image_blocks(&shown);
    assert_eq!(images.len(), 1, "{shown:#?}");
    assert_eq!(png_size(&images[0].data), (2, 2));
    assert_eq!(
        calls_note(&shown)
            .as_deref()
            .map(|n| n.starts_with("Tool calls: 1, ")),
        Some(true),
        "{shown:#?}"
    );

    let raised = run(
        &server,
        r#"ferrepl.call("own", "fail", message="uncaught")"#,
    )
    .await;
    raised.assert_raised("ToolError");
    assert_eq!(
        raised.structured["error"]["message"], "uncaught",
        "{raised:#?}"
    );
    assert!(
        calls_note(&raised).is_some_and(|n| n.starts_with("Tool calls: 1, 1 failed, ")),
        "{raised:#?}"
    );
}

/// A tool that runs only as an MCP task (server-everything's
/// simulate-research-query, `taskSupport: "required"`) is listed as
/// unavailable, with the reason, and a call of it refused with it (not the
/// server's protocol error).
#[tokio::test]
async fn a_tool_that_runs_only_as_a_task_is_refused_and_listed_unavailable() {
    let up = Upstreams::new();
    let file = up.write(json!({ "everything": everything_stdio() }));
    let server = start(&file, &[]).await;
    let out = run(
        &server,
        r#"tool = "simulate-research-query"
listed = [t for t in ferrepl.tools("everything") if t["name"] == tool]
first = caught(ferrepl.call, "everything", tool, topic="x")
again = caught(ferrepl.call, "everything", tool, topic="x")
print(json.dumps({"first": first, "again": again, "listed": listed}))"#,
    )
    .await;
    let got = printed(&out);
    for call in ["first", "again"] {
        assert_caught(
            &got[call],
            "CallRefused",
            &["runs only as an MCP task", "unavailable to sessions"],
        );
    }
    let listed = &got["listed"][0];
    assert!(
        listed["unavailable"]
            .as_str()
            .is_some_and(|why| why.contains("runs only as an MCP task")),
        "{got:#}"
    );
}

#[tokio::test]
async fn server_everything_over_stdio_through_tool_objects() {
    let up = Upstreams::new();
    let file = up.write(json!({ "everything": everything_stdio() }));
    let server = start(&file, &[]).await;

    let out = run(
        &server,
        r#"import contextlib, inspect, io
echo = ferrepl.tool("everything", "echo")
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    help(echo)
said = echo(message="hi there")
total = ferrepl.call("everything", "get-sum", a=2, b=3)
blocks = ferrepl.call("everything", "get-tiny-image")
images = [b for b in blocks if isinstance(b, ferrepl.Image)]
display(images[0])
print(json.dumps({"help": buf.getvalue(), "params": list(inspect.signature(echo).parameters),
                  "said": said, "sum": total, "kinds": [type(b).__name__ for b in blocks],
                  "mime": images[0].mime_type}))"#,
    )
    .await;
    let got = printed(&out);
    let help = got["help"].as_str().expect("help text");
    assert!(
        help.contains("message") && help.contains("Message to echo"),
        "help(tool) names the parameter and describes it: {help}"
    );
    assert_eq!(got["params"], json!(["message"]), "{got:#}");
    assert_eq!(got["said"], "Echo: hi there", "{got:#}");
    let sum = got["sum"].as_str().expect("get-sum answers text");
    assert!(sum.contains('5'), "{sum}");
    assert_eq!(got["kinds"], json!(["str", "Image", "str"]), "{got:#}");
    assert_eq!(got["mime"], "image/png", "{got:#}");
    assert_eq!(assert_one_png(&out), (20, 20), "the MCP logo is 20x20");

    // The tool object's coroutine form, with top-level await.
    let awaited = run(
        &server,
        r#"print(json.dumps(await ferrepl.tool("everything", "echo").acall(message="async")))"#,
    )
    .await;
    assert_eq!(printed(&awaited), "Echo: async");
}

#[tokio::test]
async fn mcp_server_time_answers_structured_content() {
    let up = Upstreams::new();
    let file = up.write(json!({ "time": time_stdio() }));
    let server = start(&file, &[]).await;

    let out = run(
        &server,
        r#"now = ferrepl.call("time", "get_current_time", timezone="UTC")
there = ferrepl.call("time", "convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")
print(json.dumps({"now": now, "there": there}))"#,
    )
    .await;
    let got = printed(&out);
    assert_eq!(got["now"]["timezone"], "UTC", "{got:#}");
    assert!(got["now"]["datetime"].is_string(), "{got:#}");
    assert_eq!(got["there"]["target"]["timezone"], "Asia/Tokyo", "{got:#}");
    let target = got["there"]["target"]["datetime"]
        .as_str()
        .expect("a target datetime");
    assert!(
        target.contains("T21:00"),
        "12:00 UTC is 21:00 in Tokyo: {target}"
    );
}

// ---------------------------------------------------------------- limits

#[tokio::test]
async fn concurrent_acalls_overlap_up_to_the_in_flight_limit() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));

    // 50 calls of 0.5 s at once: far less than 25 s (the server is started
    // by a first call, outside the measured time).
    let wide = start(&file, &["--mcp-max-in-flight", "64"]).await;
    let out = run(
        &wide,
        r#"import asyncio, time
ferrepl.call("own", "echo", text="warm up")
t0 = time.monotonic()
done = await asyncio.gather(*(ferrepl.acall("own", "slow", seconds=0.5) for _ in range(50)))
print(json.dumps({"done": done, "seconds": time.monotonic() - t0}))"#,
    )
    .await;
    let got = printed(&out);
    assert_eq!(got["done"], json!(vec!["slept"; 50]), "{got:#}");
    let seconds = got["seconds"].as_f64().expect("seconds");
    assert!(
        seconds < 10.0,
        "50 concurrent calls of 0.5 s took {seconds:.1} s: they did not run at once"
    );
    assert!(
        calls_note(&out).is_some_and(|n| n.starts_with("Tool calls: 51, ")),
        "{out:#?}"
    );
    drop(wide);
}

/// With the default flags, `gather` of 100 calls succeeds: the calls past
/// --mcp-max-in-flight (16) wait for a slot instead of being refused, and
/// the upstream never has more than 16 at once (it records its peak).
#[tokio::test]
async fn calls_past_the_in_flight_limit_wait_for_a_slot() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(&file, &[]).await;
    let out = run(
        &server,
        r#"import asyncio
async def one():
    try:
        return ["ok", await ferrepl.acall("own", "slow", seconds=0.5)]
    except ferrepl.Error as e:
        return [type(e).__name__, str(e)]
done = await asyncio.gather(*(one() for _ in range(100)))
print(json.dumps({"done": done, "peak": ferrepl.call("own", "peak")}))"#,
    )
    .await;
    let got = printed(&out);
    let refused: Vec<&Value> = got["done"]
        .as_array()
        .expect("a list")
        .iter()
        .filter(|o| o[0] != "ok")
        .collect();
    assert!(
        refused.is_empty(),
        "calls were refused instead of waiting: {refused:#?}"
    );
    assert_eq!(
        got["done"],
        json!(vec![json!(["ok", "slept"]); 100]),
        "{got:#}"
    );
    // All 100 went out through 16 slots: at most 16 at once, and the slots
    // were used (calls of 0.5 s sent together overlap).
    assert_eq!(
        got["peak"], "16",
        "the upstream's most calls at once: {got:#}"
    );
    assert_eq!(up.count("called slow"), 100, "{}", log_text(&up.log()));
    assert!(
        calls_note(&out).is_some_and(|n| n.starts_with("Tool calls: 101, ")),
        "{out:#?}"
    );
}

/// An interrupt while calls wait for a slot cancels them all: the 16 in
/// flight are cancelled upstream, the waiting ones never go out (a call
/// made afterwards would queue behind any left), and the session keeps
/// its state.
#[tokio::test]
async fn an_interrupt_cancels_the_calls_waiting_for_a_slot() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(&file, &[]).await;
    run(&server, "kept = 42").await.assert_ok();
    let running = server
        .call(
            "python_exec",
            json!({
                "code": "import asyncio, ferrepl\nawait asyncio.gather(*(ferrepl.acall('own', 'slow', seconds=60) for _ in range(40)))",
                "wait_s": 0.5,
            }),
        )
        .await;
    assert_status(&running, "running");
    up.wait_for("called slow", 16).await;

    let stopped = server
        .call("python_wait", json!({"interrupt": true, "wait_s": 30}))
        .await;
    assert_status(&stopped, "interrupted");
    assert_eq!(stopped.error_type(), "KeyboardInterrupt", "{stopped:#?}");
    up.wait_for("cancelled", 16).await;

    // Slots are handed out in order: had any of the 24 waiting calls been
    // left, it would reach the upstream before this one.
    let after = run(
        &server,
        r#"print(json.dumps([kept, ferrepl.call("own", "echo", text="after"), ferrepl.call("own", "peak")]))"#,
    )
    .await;
    assert_eq!(
        printed(&after),
        json!([42, "after", "16"]),
        "the state survives"
    );
    assert_eq!(
        up.count("called slow"),
        16,
        "only the calls in flight reached the upstream: {}",
        log_text(&up.log())
    );
    assert_eq!(up.count("started"), 1, "{}", log_text(&up.log()));
}

/// Waiting calls count toward --mcp-max-cell-calls: a runaway `gather`
/// is refused past the cap rather than queued.
#[tokio::test]
async fn waiting_calls_still_count_toward_the_cell_cap() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(
        &file,
        &["--mcp-max-in-flight", "2", "--mcp-max-cell-calls", "10"],
    )
    .await;
    let out = run(
        &server,
        r#"import asyncio
async def one(i):
    try:
        return ["ok", await ferrepl.acall("own", "slow", seconds=0.2)]
    except ferrepl.Error as e:
        return [type(e).__name__, str(e)]
print(json.dumps(await asyncio.gather(*(one(i) for i in range(30)))))"#,
    )
    .await;
    let got = printed(&out);
    let outcomes = got.as_array().expect("a list");
    assert_eq!(
        outcomes.iter().filter(|o| o[1] == "slept").count(),
        10,
        "{got:#}"
    );
    let refused: Vec<&Value> = outcomes.iter().filter(|o| o[0] != "ok").collect();
    assert_eq!(refused.len(), 20, "{got:#}");
    for r in refused {
        assert_caught(r, "CallRefused", &["--mcp-max-cell-calls", "10"]);
    }
    assert_eq!(up.count("called slow"), 10, "{}", log_text(&up.log()));
}

/// --mcp-max-servers 1 and calls to two servers at once: the second waits
/// until the first server's call ends (its server is then ended to make
/// room) instead of being refused.
#[tokio::test]
async fn a_call_waits_for_room_under_the_server_cap() {
    let up = Upstreams::new();
    let b_log = up.dir.path().join("b.log");
    let file = up.write(json!({ "a": up.own(), "b": own_logging_to(&b_log) }));
    let server = start(&file, &["--mcp-max-servers", "1"]).await;
    let out = run(
        &server,
        r#"import asyncio
async def one(server, tool, **kw):
    try:
        return ["ok", await ferrepl.acall(server, tool, **kw)]
    except ferrepl.Error as e:
        return [type(e).__name__, str(e)]
print(json.dumps(await asyncio.gather(one("a", "slow", seconds=1), one("b", "echo", text="room"))))"#,
    )
    .await;
    assert_eq!(
        printed(&out),
        json!([["ok", "slept"], ["ok", "room"]]),
        "the second server's call waited for room"
    );
    assert!(
        log_text(&b_log).contains("called echo"),
        "{}",
        log_text(&b_log)
    );
}

#[tokio::test]
async fn an_interrupt_during_a_call_cancels_it_upstream_and_keeps_the_state() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(&file, &[]).await;
    run(&server, "kept = 42").await.assert_ok();

    let running = server
        .call(
            "python_exec",
            json!({"code": "import ferrepl\nferrepl.call('own', 'slow', seconds=60)", "wait_s": 0.5}),
        )
        .await;
    assert_status(&running, "running");
    up.wait_for("called slow", 1).await;

    let stopped = server
        .call("python_wait", json!({"interrupt": true, "wait_s": 30}))
        .await;
    assert_status(&stopped, "interrupted");
    assert_eq!(stopped.error_type(), "KeyboardInterrupt", "{stopped:#?}");
    assert_eq!(stopped.cell(), running.cell(), "{stopped:#?}");
    up.wait_for("cancelled", 1).await;
    assert!(
        log_text(&up.log()).contains("seconds=60"),
        "the slow call of 60 s was the one cancelled: {}",
        log_text(&up.log())
    );

    let after = run(&server, "print(json.dumps(kept))").await;
    assert_eq!(printed(&after), 42, "the state survives the interrupt");
    // The server is still up: no second start.
    let again = run(
        &server,
        r#"print(json.dumps(ferrepl.call("own", "echo", text="on")))"#,
    )
    .await;
    assert_eq!(printed(&again), "on");
    assert_eq!(up.count("started"), 1, "{}", log_text(&up.log()));
}

#[tokio::test]
async fn a_crashing_upstream_fails_the_call_with_an_upstream_error() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(&file, &[]).await;

    let crashed = run(
        &server,
        r#"print(json.dumps(caught(ferrepl.call, "own", "crash")))"#,
    )
    .await;
    let got = printed(&crashed);
    let message = assert_caught(&got, "UpstreamError", &["own"]);
    assert!(
        message.contains("stopped") || message.contains("crashed"),
        "the error says the server stopped: {message}"
    );
    assert!(
        calls_note(&crashed).is_some_and(|n| n.starts_with("Tool calls: 1, 1 failed, ")),
        "{crashed:#?}"
    );
    // The session is unharmed: its interpreter goes on.
    let after = run(
        &server,
        r#"print(json.dumps(issubclass(ferrepl.UpstreamError, ferrepl.Error)))"#,
    )
    .await;
    assert_eq!(printed(&after), true);
}

#[tokio::test]
async fn a_call_over_the_servers_timeout_fails_and_is_cancelled_upstream() {
    let up = Upstreams::new();
    let mut own = up.own();
    own["timeoutSeconds"] = json!(1);
    let file = up.write(json!({ "own": own }));
    let server = start(&file, &[]).await;

    let started = Instant::now();
    let out = run(
        &server,
        r#"print(json.dumps(caught(ferrepl.call, "own", "slow", seconds=30)))"#,
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "the call was not cut at its 1 s timeout: {:?}",
        started.elapsed()
    );
    let got = printed(&out);
    assert_caught(&got, "UpstreamError", &["timeoutSeconds", "slow"]);
    up.wait_for("cancelled", 1).await;
}

#[tokio::test]
async fn a_result_over_the_byte_limit_is_cut_with_a_marker() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(&file, &["--mcp-max-result-bytes", "1000"]).await;

    let out = run(
        &server,
        r#"r = ferrepl.call("own", "huge", n=5000)
small = ferrepl.call("own", "huge", n=1000)
print(json.dumps({"head": r[:1000] == "x" * 1000, "rest": r[1000:], "len": len(r), "small": small == "x" * 1000}))"#,
    )
    .await;
    let got = printed(&out);
    assert_eq!(got["head"], true, "{got:#}");
    let rest = got["rest"].as_str().expect("rest");
    assert!(
        rest.starts_with("\n[ferrepl: result cut at 1000 of 5000 bytes"),
        "the cut text ends with the marker: {rest:?}"
    );
    assert!(
        !rest.contains("xx"),
        "nothing of the text after the marker: {rest:?}"
    );
    let len = got["len"].as_u64().expect("len");
    assert!((1000..1200).contains(&len), "about 1000 characters: {len}");
    assert_eq!(got["small"], true, "a result of exactly the limit is whole");
}

// ---------------------------------------------------------------- policy

#[tokio::test]
async fn tools_outside_allow_tools_and_unknown_servers_are_refused() {
    let up = Upstreams::new();
    let mut own = up.own();
    own["allowTools"] = json!(["echo", "a*"]);
    let file = up.write(json!({ "own": own }));
    let server = start(&file, &[]).await;

    let out = run(
        &server,
        r#"print(json.dumps({
    "names": sorted(t["name"] for t in ferrepl.tools("own")),
    "fail": caught(ferrepl.call, "own", "fail", message="no"),
    "tool": caught(ferrepl.tool, "own", "crash"),
    "unknown": caught(ferrepl.call, "nope", "echo", text="x"),
    "unknown_tools": caught(ferrepl.tools, "nope"),
    "echo": caught(ferrepl.call, "own", "echo", text="allowed"),
    "add": caught(ferrepl.call, "own", "add", a=1, b=1),
}))"#,
    )
    .await;
    let got = printed(&out);
    assert_eq!(got["names"], json!(["add", "echo"]), "{got:#}");
    let refused = assert_caught(&got["fail"], "CallRefused", &["fail", "echo", "add"]);
    assert!(refused.contains("not allowed"), "{refused}");
    assert_eq!(got["tool"][0], "CallRefused", "{got:#}");
    assert_caught(&got["unknown"], "CallRefused", &["nope", "own"]);
    assert_caught(&got["unknown_tools"], "CallRefused", &["nope", "own"]);
    assert_eq!(got["echo"], json!(["ok", "allowed"]), "{got:#}");
    assert_eq!(got["add"], json!(["ok", {"sum": 2}]), "{got:#}");
    let log = log_text(&up.log());
    assert!(
        !log.contains("called fail") && !log.contains("called crash"),
        "a refused tool is never called upstream: {log}"
    );
}

#[tokio::test]
async fn the_cell_call_limit_refuses_the_next_call_until_the_next_cell() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(&file, &["--mcp-max-cell-calls", "3"]).await;

    let out = run(
        &server,
        r#"print(json.dumps([caught(ferrepl.call, "own", "echo", text=str(i)) for i in range(4)]))"#,
    )
    .await;
    let got = printed(&out);
    assert_eq!(
        got.as_array().map(|a| &a[0..3]),
        Some(&[json!(["ok", "0"]), json!(["ok", "1"]), json!(["ok", "2"])][..]),
        "{got:#}"
    );
    assert_caught(&got[3], "CallRefused", &["--mcp-max-cell-calls", "3"]);
    assert_eq!(up.count("called echo"), 3, "{}", log_text(&up.log()));

    let next = run(
        &server,
        r#"print(json.dumps(caught(ferrepl.call, "own", "echo", text="next cell")))"#,
    )
    .await;
    assert_eq!(printed(&next), json!(["ok", "next cell"]));
}

#[tokio::test]
async fn without_a_servers_file_code_is_told_there_are_none() {
    let server = StdioServer::start(&[]).await;
    let out = run(
        &server,
        r#"print(json.dumps({"servers": ferrepl.servers(), "call": caught(ferrepl.call, "any", "echo", text="x")}))"#,
    )
    .await;
    let got = printed(&out);
    assert_eq!(got["servers"], json!([]), "{got:#}");
    assert_caught(
        &got["call"],
        "CallRefused",
        &["no MCP servers are configured"],
    );

    let description = description_of(&server, "python_exec").await;
    assert!(
        !description.contains("ferrepl.call") && !description.contains("MCP tools of"),
        "no servers, no sentence about them: {description}"
    );
}

#[tokio::test]
async fn python_exec_description_names_the_servers_sessions_may_call() {
    let up = Upstreams::new();
    // None is started: neither listing tools nor servers() starts one.
    let file = up.write(json!({
        "own": up.own(),
        "clock": time_stdio(),
        "unplugged": {"command": "/nonexistent/server", "disabled": true},
    }));
    let server = start(&file, &[]).await;

    let description = description_of(&server, "python_exec").await;
    assert!(
        description.contains("import ferrepl") && description.contains("ferrepl.call"),
        "{description}"
    );
    // A call's result reaches the model as the cell's value too, not only
    // printed: the words say so.
    assert!(
        description.contains("only what it prints and its last expression return"),
        "{description}"
    );
    for name in ["own", "clock"] {
        assert!(
            description.contains(name),
            "{name} is not named: {description}"
        );
    }
    assert!(
        !description.contains("unplugged"),
        "a disabled server is not named: {description}"
    );

    let out = run(&server, r#"print(json.dumps(ferrepl.servers()))"#).await;
    assert_eq!(printed(&out), json!(["clock", "own"]));
    assert_eq!(up.count("started"), 0, "{}", log_text(&up.log()));
}

#[tokio::test]
async fn the_next_call_after_a_crash_starts_the_upstream_again() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(&file, &[]).await;
    let crashed = run(
        &server,
        r#"print(json.dumps(caught(ferrepl.call, "own", "crash")))"#,
    )
    .await;
    assert_caught(&printed(&crashed), "UpstreamError", &["own"]);
    let next = run(
        &server,
        r#"print(json.dumps(caught(ferrepl.call, "own", "echo", text="back")))"#,
    )
    .await;
    assert_eq!(printed(&next), json!(["ok", "back"]), "{next:#?}");
    assert_eq!(up.count("started"), 2, "{}", log_text(&up.log()));
}

// HTTP and https upstreams; reloads and rebuilds.
mod lifecycle;
// An upstream tool's progress as the cell's.
mod progress;
// The same calls from R.
mod r;
mod transports;

/// A tool the server does not have is a `CallRefused` naming the tools
/// there are, as docs/tools.md says, not an `UpstreamError` quoting the
/// protocol's -32602.
#[tokio::test]
async fn an_unknown_upstream_tool_is_refused_with_the_tools_there_are() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let server = start(&file, &[]).await;
    let out = run(
        &server,
        "try:\n    ferrepl.call('own', 'no_such_tool')\nexcept ferrepl.CallRefused as e:\n    print('refused:', e)\nexcept ferrepl.Error as e:\n    print('other:', type(e).__name__, e)",
    )
    .await;
    out.assert_ok();
    assert!(
        out.text
            .contains("refused: MCP server 'own' has no tool 'no_such_tool'")
            && out.text.contains("echo"),
        "{out:#?}"
    );
}
