//! Code calls tools (issue 33): a session's code calls the operator's MCP
//! servers through `import ferrepl`.
//!
//! Against real upstreams (tests/suite/support/upstreams.rs): our own on the
//! official Python SDK (over stdio and streamable HTTP, with an
//! `UPSTREAM_LOG` of its starts, calls and cancellations), the reference
//! server-everything (stdio and HTTP) and mcp-server-time. Each test puts
//! the servers file outside the workspace, as the operator must.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::upstreams::{
    everything_http_command, everything_stdio, own_upstream, time_stdio, write_servers_file,
};
use crate::support::{
    CALL_TIMEOUT, Launch, StdioServer, ToolOutput, assert_one_png, assert_status, descendants,
    image_blocks, png_size, server_command_plain, wait_for_file_line,
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
        path_str(&write_servers_file(self.dir.path(), servers))
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

fn path_str(p: &Path) -> String {
    p.to_str().expect("UTF-8 path").to_string()
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
            "add", "children", "crash", "echo", "env", "fail", "huge", "image", "progress", "slow"
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

    // The default: 16 in flight; the 17th is refused at once.
    let narrow = start(&file, &[]).await;
    let out = run(
        &narrow,
        r#"import asyncio
async def one():
    try:
        return ["ok", await ferrepl.acall("own", "slow", seconds=2)]
    except ferrepl.Error as e:
        return [type(e).__name__, str(e)]
print(json.dumps(await asyncio.gather(*(one() for _ in range(17)))))"#,
    )
    .await;
    let got = printed(&out);
    let outcomes = got.as_array().expect("a list");
    let refused: Vec<&Value> = outcomes.iter().filter(|o| o[0] != "ok").collect();
    assert_eq!(refused.len(), 1, "exactly one of 17 is refused: {got:#}");
    assert_caught(refused[0], "CallRefused", &["--mcp-max-in-flight", "16"]);
    assert_eq!(
        outcomes.iter().filter(|o| o[1] == "slept").count(),
        16,
        "{got:#}"
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

// ---------------------------------------------------------------- HTTP

#[tokio::test]
async fn http_upstreams_with_and_without_required_headers() {
    let up = Upstreams::new();

    // Our upstream over streamable HTTP, refusing requests without the token.
    let port_file = up.dir.path().join("port");
    let spec = own_upstream(&[
        "--http",
        "0",
        "--port-file",
        &path_str(&port_file),
        "--require-header",
        "Authorization: Bearer t0k",
    ]);
    let args: Vec<&str> = spec["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg"))
        .collect();
    let _own = tokio::process::Command::new(spec["command"].as_str().expect("command"))
        .args(&args)
        .env("UPSTREAM_LOG", up.log())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start our upstream over HTTP");
    let own_port: u16 = wait_for_file_line(&port_file, EVENT_TIMEOUT)
        .await
        .trim()
        .parse()
        .expect("a port number");

    // server-everything over streamable HTTP.
    let every_port = free_port();
    let (node, node_args) = everything_http_command();
    let mut everything = tokio::process::Command::new(node)
        .args(&node_args)
        .env("PORT", every_port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start server-everything over HTTP");
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while tokio::net::TcpStream::connect(("127.0.0.1", every_port))
        .await
        .is_err()
    {
        if let Some(status) = everything.try_wait().expect("try_wait") {
            panic!("server-everything exited ({status}) before listening on {every_port}");
        }
        assert!(
            Instant::now() < deadline,
            "server-everything did not listen on {every_port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let own_url = format!("http://127.0.0.1:{own_port}/mcp");
    let file = up.write(json!({
        "own": {"url": own_url, "headers": {"Authorization": "Bearer t0k"}},
        "tokenless": {"url": own_url},
        "everything": {"url": format!("http://127.0.0.1:{every_port}/mcp")},
    }));
    let server = start(&file, &[]).await;

    let out = run(
        &server,
        r#"print(json.dumps({
    "own": caught(ferrepl.call, "own", "echo", text="over http"),
    "add": caught(ferrepl.call, "own", "add", a=20, b=22),
    "everything": caught(ferrepl.call, "everything", "echo", message="over http"),
    "tokenless": caught(ferrepl.call, "tokenless", "echo", text="no token"),
}))"#,
    )
    .await;
    let got = printed(&out);
    assert_eq!(got["own"], json!(["ok", "over http"]), "{got:#}");
    assert_eq!(got["add"], json!(["ok", {"sum": 42}]), "{got:#}");
    assert_eq!(
        got["everything"],
        json!(["ok", "Echo: over http"]),
        "{got:#}"
    );
    // Without the header the upstream refuses: the header above was sent.
    assert_caught(&got["tokenless"], "UpstreamError", &["tokenless"]);
    let log = log_text(&up.log());
    assert!(
        log.contains("refused POST without authorization"),
        "the tokenless server's requests were refused for lack of the header: {log}"
    );
    assert_eq!(
        log.lines().filter(|l| *l == "called echo").count(),
        1,
        "only the call with the header reached the tool: {log}"
    );
}

// ---------------------------------------------------------------- start, reload

/// Runs ferrepl with `--workdir workdir` and `args`: it must exit non-zero
/// within a bound, writing nothing on stdout; its stderr.
async fn refused_start(workdir: &Path, args: &[&str]) -> String {
    let state = tempfile::tempdir().expect("state");
    let runtime = tempfile::tempdir().expect("runtime");
    let mut cmd = server_command_plain();
    cmd.arg("--workdir")
        .arg(workdir)
        .arg("--state-dir")
        .arg(state.path().join("stores"))
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdin(Stdio::piped());
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} was not refused within 30 s"))
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} must be refused:\n{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{args:?}: stdout carries MCP only: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

#[tokio::test]
async fn a_servers_file_in_the_workspace_or_with_an_unknown_key_is_refused_at_start() {
    let workspace = tempfile::tempdir().expect("workspace");
    let inside = write_servers_file(workspace.path(), json!({ "own": own_upstream(&[]) }));
    let stderr = refused_start(workspace.path(), &["--mcp-servers", &path_str(&inside)]).await;
    assert!(
        stderr.contains("--mcp-servers") && stderr.contains("lies inside"),
        "{stderr}"
    );

    let outside = tempfile::tempdir().expect("outside");
    let path = outside.path().join("bad.json");
    std::fs::write(
        &path,
        r#"{"mcpServers": {"a": {"command": "x", "allowTool": ["y"]}}}"#,
    )
    .expect("write");
    let stderr = refused_start(workspace.path(), &["--mcp-servers", &path_str(&path)]).await;
    assert!(
        stderr.contains("allowTool"),
        "the unknown key is named: {stderr}"
    );

    let missing = outside.path().join("missing.json");
    let stderr = refused_start(workspace.path(), &["--mcp-servers", &path_str(&missing)]).await;
    assert!(
        stderr.contains("missing.json"),
        "the file is named: {stderr}"
    );
}

/// `ferrepl.servers()` in the default session.
async fn servers_listed(server: &StdioServer) -> Value {
    printed(&run(server, "print(json.dumps(ferrepl.servers()))").await)
}

#[tokio::test]
async fn sighup_reloads_the_servers_file_and_keeps_the_old_one_when_broken() {
    let up = Upstreams::new();
    let b_log = up.dir.path().join("b.log");
    let file = up.write(json!({ "a": up.own() }));
    let server = start(&file, &[]).await;
    assert_eq!(servers_listed(&server).await, json!(["a"]));
    let first = run(
        &server,
        r#"print(json.dumps(caught(ferrepl.call, "a", "echo", text="from a")))"#,
    )
    .await;
    assert_eq!(printed(&first), json!(["ok", "from a"]));
    assert!(
        !upstreams_logging_to(server.pid(), &up.log()).is_empty(),
        "server a runs under ferrepl"
    );

    up.write(json!({ "b": own_logging_to(&b_log) }));
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(server.pid() as libc::pid_t, libc::SIGHUP);
    }
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let listed = servers_listed(&server).await;
        if listed == json!(["b"]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload the file: servers() is still {listed}\n{}",
            server.stderr_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The server gone from the file was ended; the new one answers.
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let left = upstreams_logging_to(server.pid(), &up.log());
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server a, gone from the file, still runs after the reload: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = run(
        &server,
        r#"print(json.dumps({"a": caught(ferrepl.call, "a", "echo", text="x"),
                  "b": caught(ferrepl.call, "b", "echo", text="from b")}))"#,
    )
    .await;
    let got = printed(&after);
    assert_caught(&got["a"], "CallRefused", &["'a'", "b"]);
    assert_eq!(got["b"], json!(["ok", "from b"]), "{got:#}");

    std::fs::write(&file, "{ not json").expect("break the file");
    // SAFETY: as above.
    unsafe {
        libc::kill(server.pid() as libc::pid_t, libc::SIGHUP);
    }
    assert!(
        server
            .wait_stderr_contains("were not reloaded", EVENT_TIMEOUT)
            .await,
        "a broken file is reported: {}",
        server.stderr_log()
    );
    assert_eq!(servers_listed(&server).await, json!(["b"]));
    let still = run(
        &server,
        r#"print(json.dumps(caught(ferrepl.call, "b", "echo", text="still b")))"#,
    )
    .await;
    assert_eq!(printed(&still), json!(["ok", "still b"]));
    assert_eq!(
        log_text(&b_log)
            .lines()
            .filter(|l| l.starts_with("started"))
            .count(),
        1,
        "the failed reload left server b running: {}",
        log_text(&b_log)
    );
}

// ---------------------------------------------------------------- rebuild

#[tokio::test]
async fn a_rebuild_skips_cells_that_called_tools() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let workspace = tempfile::tempdir().expect("workspace");
    let state = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir");
    let args = [
        "--workdir".to_string(),
        path_str(workspace.path()),
        "--state-dir".to_string(),
        path_str(state.path()),
        "--resume".to_string(),
        "on".to_string(),
        "--mcp-servers".to_string(),
        file.clone(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let launch = || StdioServer::launch(Launch::new(&args).without_workdir_flag());

    let first = launch().await;
    for code in [
        "x = 1",
        "import ferrepl\ny = ferrepl.call('own', 'echo', text='once')",
        "z = 3",
    ] {
        first
            .call(
                "python_exec",
                json!({"session": "tools", "code": code, "wait_s": 50}),
            )
            .await
            .assert_ok();
    }
    let status = first.close_and_wait().await;
    assert!(status.success(), "the first server exited with {status:?}");
    assert_eq!(up.count("called echo"), 1, "{}", log_text(&up.log()));

    let second = launch().await;
    let out = second
        .call(
            "python_exec",
            json!({"session": "tools", "code": "(x, z, 'y' in globals())", "wait_s": 50}),
        )
        .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("(1, 3, False)"), "{out:#?}");
    let notes = out.notes_text();
    assert!(
        notes.contains("Cell 2 was skipped: it called MCP tools, which a rebuild does not repeat"),
        "{notes}"
    );
    assert_eq!(
        up.count("called"),
        1,
        "the rebuild did not call the tool again: {}",
        log_text(&up.log())
    );
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

/// Runs `openssl` with `args` in `dir`; it must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn an_https_upstream_is_reached_with_the_systems_roots() {
    // A test CA and a certificate for 127.0.0.1 from it; our upstream over
    // HTTP behind a TLS front. ferrepl trusts the CA only through
    // SSL_CERT_FILE (the system's roots, as rustls reads them).
    let up = Upstreams::new();
    let dir = up.dir.path();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=ferrepl-test-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "srv.key",
            "-out",
            "srv.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write ext.cnf");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "srv.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );

    let port_file = dir.join("port");
    let spec = own_upstream(&["--http", "0", "--port-file", &path_str(&port_file)]);
    let args: Vec<&str> = spec["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg"))
        .collect();
    let _own = tokio::process::Command::new(spec["command"].as_str().expect("command"))
        .args(&args)
        .env("UPSTREAM_LOG", up.log())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start our upstream over HTTP");
    let own_port = wait_for_file_line(&port_file, EVENT_TIMEOUT).await;
    let front_file = dir.join("front-port");
    let proxy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/tls_proxy.py");
    let _front = tokio::process::Command::new("python3")
        .arg(&proxy)
        .arg(dir.join("srv.pem"))
        .arg(dir.join("srv.key"))
        .arg(own_port.trim())
        .arg(&front_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the TLS front");
    let front_port = wait_for_file_line(&front_file, EVENT_TIMEOUT).await;
    let file = up.write(json!({
        "sec": {"url": format!("https://127.0.0.1:{}/mcp", front_port.trim())},
    }));
    let ca = dir.join("ca.pem");
    let trusted = StdioServer::start_with_env(
        &["--mcp-servers", &file],
        &[("SSL_CERT_FILE", ca.to_str().expect("utf-8"))],
    )
    .await;
    let out = run(
        &trusted,
        r#"print(json.dumps(caught(ferrepl.call, "sec", "echo", text="over tls")))"#,
    )
    .await;
    assert_eq!(printed(&out), json!(["ok", "over tls"]), "{out:#?}");
    // Without the CA the certificate is not trusted: no call gets through.
    let untrusted = start(&file, &[]).await;
    let out = run(
        &untrusted,
        r#"print(json.dumps(caught(ferrepl.call, "sec", "echo", text="x")))"#,
    )
    .await;
    assert_caught(&printed(&out), "UpstreamError", &["sec"]);
    let log = log_text(&up.log());
    assert_eq!(
        log.lines().filter(|l| *l == "called echo").count(),
        1,
        "only the call over a trusted connection reached the tool: {log}"
    );
}
