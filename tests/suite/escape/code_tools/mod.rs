//! Code calls tools (issue 33), attacked: upstream secrets, the servers
//! file, foreign servers and orphans.
//!
//! A session's code reaches the operator's upstream MCP servers only
//! through `import ferrepl` (the control channel to the server, which
//! calls upstream with its own client). The attacks: read what the
//! operator gave the upstreams (their `env`, their HTTP headers, the
//! servers file) from a cell or a shell job; call another tenant's server;
//! feed the server's reader of the control channel hand-made `upstream`
//! events; outlive the server with an upstream's detached grandchild.
//! Start-up refuses a servers file sessions could read, and warns where
//! the operator's flags let sessions around the upstreams.
//!
//! Every upstream here is the stdlib-only one of `support::upstreams` (or
//! a stdlib HTTP one written below), run by `python3` on PATH from a
//! directory of the test's own outside the workspace: the suite also runs
//! as an unprivileged user (scripts/escape-unprivileged.sh), who may not
//! reach the checkout.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::upstreams::{
    minimal_upstream, minimal_upstream_with_children, write_servers_file,
};
use crate::support::{
    Client, EXIT_TIMEOUT, HttpServer, Launch, Reaper, StdioServer, ToolOutput, call, cmdline,
    descendants, everything, host_pid_in_namespace, parse_namespaced_pids, path_str, process_alive,
    py, run_job, strip_ansi, unique,
};

/// Upper bound for a refusing server to exit.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound for an upstream's processes to end after ferrepl did.
const GONE_TIMEOUT: Duration = Duration::from_secs(15);

// ------------------------------------------------------------------ helpers

/// A directory of the test's own outside every workspace (the upstream's
/// script, the servers file, markers), readable by the user running the
/// test (who is also the one running the upstreams).
fn outside() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ferrepl-code-tools-")
        .tempdir()
        .expect("create a directory outside the workspace")
}

/// `ferrepl --mcp-servers FILE --warm-pool 0 extra...` (full tool surface,
/// a fresh workspace).
fn with_servers(file: &Path, extra: &[&str]) -> Launch {
    let mut args = vec!["--mcp-servers", path_str(file), "--warm-pool", "0"];
    args.extend_from_slice(extra);
    Launch::new(&args)
}

/// The last line of a cell's stdout as JSON (the probes print one).
fn printed_json(out: &ToolOutput) -> Value {
    let stdout = out.str_field("stdout");
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_else(|| panic!("the cell printed nothing; result: {out:#?}"));
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the cell's last line is not JSON ({e}): {last:?}; {out:#?}"))
}

/// Runs `code` in `session` (it must finish, and succeed) and returns the
/// JSON it printed last.
async fn cell_json(server: &StdioServer, session: &str, code: &str) -> Value {
    let out = server
        .call(
            "python_exec",
            json!({ "code": code, "session": session, "wait_s": 60 }),
        )
        .await;
    out.assert_ok();
    printed_json(&out)
}

/// `cell_json` through an HTTP client.
async fn client_cell_json(client: &Client, code: &str) -> Value {
    let out = call(
        client.peer(),
        "python_exec",
        json!({ "code": code, "wait_s": 60 }),
    )
    .await;
    out.assert_ok();
    printed_json(&out)
}

/// A Python expression for the bytes of `s`, without `s` itself in the
/// cell's source (which sessions may keep in files of their own): base64.
fn py_bytes_hidden(s: &str) -> String {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    format!("__import__('base64').b64decode({})", py(encoded))
}

/// The cell that looks for `secrets` everywhere a session can read: its
/// environment, every /proc/*/environ and cmdline it can open, the files
/// under /tmp, HOME, TMPDIR and the workspace (a bounded walk); and tries
/// to open `servers_file`. Two controls show the look works: `file_control`
/// (which the test wrote into a file of the workspace) and a second
/// control, in the environment of a process the cell starts, must be found.
/// Prints `{"controls": [found indices], "found": [where secrets were],
/// "files": N, "servers_file": "..."}`.
fn scan_code(file_control: &str, secrets: &[&str], servers_file: &Path) -> String {
    let proc_control = unique("proccontrol");
    let controls = [file_control, proc_control.as_str()].map(py_bytes_hidden);
    let secrets: Vec<String> = secrets.iter().map(|n| py_bytes_hidden(n)).collect();
    r#"
import json, os, subprocess
controls = [@CONTROLS@]
secrets = [@SECRETS@]
found, seen_controls = [], set()
def check(where, data):
    for i, n in enumerate(controls):
        if n in data:
            seen_controls.add(i)
    for n in secrets:
        if n in data:
            found.append(where)
holder = subprocess.Popen(["sleep", "60"], env={"CONTROL": controls[1].decode()})
check("os.environ", "\n".join("%s=%s" % kv for kv in os.environ.items()).encode())
for pid in os.listdir("/proc"):
    if pid.isdigit() or pid in ("self", "thread-self"):
        for part in ("environ", "cmdline"):
            try:
                with open("/proc/%s/%s" % (pid, part), "rb") as f:
                    check("/proc/%s/%s" % (pid, part), f.read())
            except OSError:
                pass
holder.kill()
holder.wait()
files = 0
roots = sorted({"/tmp", os.path.expanduser("~"), os.environ.get("TMPDIR", "/tmp"), os.getcwd()})
for root in roots:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            files += 1
            if files > 20000:
                break
            path = os.path.join(dirpath, name)
            try:
                with open(path, "rb") as f:
                    check(path, f.read(4 << 20))
            except OSError:
                pass
try:
    with open(@SERVERS@, "rb") as f:
        check("the servers file", f.read())
    servers_file = "read"
except OSError as e:
    servers_file = "%s errno=%s" % (type(e).__name__, e.errno)
print(json.dumps({"controls": sorted(seen_controls), "found": found, "files": files,
                  "servers_file": servers_file}))
"#
    .replace("@CONTROLS@", &controls.join(", "))
    .replace("@SECRETS@", &secrets.join(", "))
    .replace("@SERVERS@", &py(path_str(servers_file)))
}

/// Writes a control marker into a file of `workspace`; returns it.
fn plant_control(workspace: &Path) -> String {
    let control = unique("filecontrol");
    std::fs::write(workspace.join("control.txt"), &control).expect("write the control file");
    control
}

/// Panics unless the scan found both controls, no secret, and could not
/// open the servers file.
fn assert_scan_clean(scan: &Value, what: &str) {
    assert_eq!(
        scan["controls"],
        json!([0, 1]),
        "{what}: the scan missed a control (the workspace file, a process's environ): {scan:#}"
    );
    assert_eq!(
        scan["found"],
        json!([]),
        "{what}: a secret of the upstreams was readable by the session: {scan:#}"
    );
    assert!(
        scan["servers_file"].as_str().is_some_and(|s| s != "read"),
        "{what}: the session opened the servers file: {scan:#}"
    );
}

/// A shell job that prints everything a job can see of environments and
/// command lines, and tries the servers file.
fn dump_job(servers_file: &Path) -> Value {
    let command = format!(
        "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline /proc/self/environ; do tr '\\0' '\\n' < \"$f\"; echo; done 2>/dev/null; \
         cat {} 2>/dev/null && echo SERVERS-FILE-\"\"READ; true",
        crate::support::sh_quote(path_str(servers_file))
    );
    json!({ "command": command, "wait_s": 60 })
}

/// The host pid of the process a `pid`/`children` answer names:
/// `"pid:[inode] PID..."`, pids of the upstream's own PID namespace.
fn upstream_host_pids(answer: &str) -> Vec<u32> {
    let (namespace, inner) = parse_namespaced_pids(Some(answer));
    inner
        .into_iter()
        .map(|pid| host_pid_in_namespace(&namespace, pid))
        .collect()
}

/// The containment processes (`ferrepl __ferrepl-upstream -- ...`: the
/// launcher and, in a PID namespace, its PID 1) among the descendants of
/// `server_pid`.
fn upstream_launchers(server_pid: u32) -> Vec<u32> {
    descendants(server_pid)
        .into_iter()
        .filter(|pid| {
            cmdline(*pid).is_some_and(|argv| argv.iter().any(|a| a == "__ferrepl-upstream"))
        })
        .collect()
}

/// The session id of `pid` (field 6 of /proc/PID/stat).
fn session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(3)?.parse().ok()
}

/// Whether `pid` is gone, or is no longer the process whose argv held `arg`
/// (its pid reused).
fn gone(pid: u32, arg: &str) -> bool {
    !process_alive(pid) || !cmdline(pid).is_some_and(|argv| argv.iter().any(|a| a == arg))
}

/// Waits (bounded) until every `(pid, argv marker)` is gone; the ones left.
async fn wait_all_gone(procs: &[(u32, String)], timeout: Duration) -> Vec<(u32, String)> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left: Vec<(u32, String)> = procs
            .iter()
            .filter(|(pid, arg)| !gone(*pid, arg))
            .cloned()
            .collect();
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Starts `launch`, which must exit unsuccessfully before it serves; its
/// stderr (colours removed).
async fn refused(launch: Launch) -> String {
    let mut spawned = launch.spawn_stdio();
    let status = match tokio::time::timeout(REFUSE_TIMEOUT, spawned.child.wait()).await {
        Ok(status) => status.expect("wait for the server"),
        Err(_) => panic!(
            "the server did not exit within {REFUSE_TIMEOUT:?}: it must refuse to start; stderr:\n{}",
            spawned.stderr.tail(4000)
        ),
    };
    spawned.stderr.wait_closed(Duration::from_secs(10)).await;
    let err = strip_ansi(&spawned.stderr.text());
    assert!(!status.success(), "the server must refuse to start: {err}");
    err
}

// ------------------------------------------------------------------ secrets

/// The upstream's configured `env` reaches the upstream (its `env` tool
/// answers it) and nothing else: not the session's environment, not any
/// /proc/*/environ or cmdline a cell can open, not a file it can read
/// under /tmp, HOME, TMPDIR or the workspace, not a shell job's view; the
/// servers file cannot be opened. And ferrepl's own environment (a
/// FERREPL_* variable or any other) never reaches the upstream.
#[tokio::test]
async fn an_upstreams_env_reaches_it_and_nothing_the_session_can_read() {
    let dir = outside();
    let secret = unique("upstreamsecret");
    let ferrepl_probe = unique("ferreplprobe");
    let operator_probe = unique("operatorprobe");
    let mut m = minimal_upstream(dir.path());
    m["env"] = json!({ "UPSTREAM_SECRET": secret });
    let file = write_servers_file(dir.path(), json!({ "m": m }));
    let server = StdioServer::launch(with_servers(&file, &[]).envs(&[
        ("FERREPL_SECRET_PROBE", &ferrepl_probe),
        ("OPERATOR_SECRET_PROBE", &operator_probe),
    ]))
    .await;
    let needles = [secret.as_str(), &ferrepl_probe, &operator_probe];
    let control = plant_control(server.workdir.path());

    // The upstream runs (started on first use) while the session looks.
    let scan = cell_json(
        &server,
        "probe",
        &format!(
            "import ferrepl\nassert ferrepl.call('m', 'echo', text='up') == 'up'\n{}",
            scan_code(&control, &needles, &file)
        ),
    )
    .await;
    assert_scan_clean(&scan, "a cell");

    let job = run_job(&server, dump_job(&file)).await;
    let seen = everything(&job);
    for needle in needles {
        assert!(
            !seen.contains(needle),
            "a shell job saw {needle:?}: {}",
            crate::support::tail(&seen, 4000)
        );
    }
    assert!(
        !seen.contains("SERVERS-FILE-READ"),
        "a job read the servers file"
    );

    // The upstream got its own variable (whole: the result is exactly the
    // marker it is redacted to, issue 42) and none of ferrepl's.
    let got = cell_json(
        &server,
        "probe",
        "import ferrepl, json\nprint(json.dumps([ferrepl.call('m', 'env', name=n) for n in \
         ('UPSTREAM_SECRET', 'FERREPL_SECRET_PROBE', 'OPERATOR_SECRET_PROBE')]))",
    )
    .await;
    assert_eq!(
        got,
        json!(["[redacted]", "", ""]),
        "the upstream has exactly its configured env over PATH/HOME/LANG"
    );
}

// ------------------------------------------------------------------ HTTP upstream

/// A stdlib streamable-HTTP MCP server (JSON responses, no sessions):
/// tool `auth` answers the SHA-256 of the Authorization header it got.
/// argv: PORT-FILE.
const HTTP_UPSTREAM: &str = r#"
import hashlib, json, sys
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def empty(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def do_GET(self):
        self.empty(405)
    def do_DELETE(self):
        self.empty(200)
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            m = json.loads(body)
        except ValueError:
            return self.empty(400)
        if not isinstance(m, dict) or "method" not in m or "id" not in m:
            return self.empty(202)
        method, p = m["method"], m.get("params") or {}
        if method == "initialize":
            result = {"protocolVersion": p.get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}},
                      "serverInfo": {"name": "http-minimal", "version": "0"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "auth", "description": "SHA-256 of the Authorization header",
                                 "inputSchema": {"type": "object", "properties": {}}}]}
        elif method == "tools/call":
            digest = hashlib.sha256(self.headers.get("Authorization", "").encode()).hexdigest()
            result = {"content": [{"type": "text", "text": digest}]}
        else:
            result = {}
        data = json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
server.serve_forever()
"#;

/// The HTTP upstream, started by the test (killed on drop), and its port.
async fn http_upstream(dir: &Path) -> (tokio::process::Child, u16) {
    let script = dir.join("http_upstream.py");
    std::fs::write(&script, HTTP_UPSTREAM).expect("write the HTTP upstream");
    let port_file = dir.join("http_upstream.port");
    let child = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(&port_file)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the HTTP upstream");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&port_file)
            && let Ok(port) = text.trim().parse()
        {
            return (child, port);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the HTTP upstream did not write its port"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn sha256_hex(text: &str) -> String {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())",
            text,
        ])
        .output()
        .expect("run python3 for a digest");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An HTTP upstream's headers live in the server process only: the
/// upstream gets its Authorization header (its tool answers the header's
/// digest), while the session finds the token nowhere it can read, cannot
/// open the servers file, and cannot reach the upstream's port itself
/// (no network: it could not bypass allowTools nor replay the header).
#[tokio::test]
async fn an_http_upstreams_headers_never_reach_the_session() {
    let dir = outside();
    let (_upstream, port) = http_upstream(dir.path()).await;
    let token = unique("headertoken");
    let header = format!("Bearer {token}");
    let file = write_servers_file(
        dir.path(),
        json!({ "h": {
            "url": format!("http://127.0.0.1:{port}/mcp"),
            "headers": { "Authorization": header },
        }}),
    );
    let server = StdioServer::launch(with_servers(&file, &[])).await;

    let digest = cell_json(
        &server,
        "probe",
        "import ferrepl, json\nprint(json.dumps(ferrepl.call('h', 'auth')))",
    )
    .await;
    assert_eq!(
        digest,
        json!(sha256_hex(&header)),
        "the upstream got the configured header"
    );

    let control = plant_control(server.workdir.path());
    let scan = cell_json(&server, "probe", &scan_code(&control, &[&token], &file)).await;
    assert_scan_clean(&scan, "a cell");
    let direct = cell_json(
        &server,
        "probe",
        &format!(
            "import json, socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n    r = 'connected'\n\
             except OSError as e:\n    r = '%s errno=%s' % (type(e).__name__, e.errno)\nprint(json.dumps(r))"
        ),
    )
    .await;
    assert_ne!(
        direct,
        json!("connected"),
        "a session reached the HTTP upstream's port directly"
    );

    let job = run_job(&server, dump_job(&file)).await;
    let seen = everything(&job);
    assert!(!seen.contains(&token), "a shell job saw the header's token");
    assert!(
        !seen.contains("SERVERS-FILE-READ"),
        "a job read the servers file"
    );
}

// ------------------------------------------------------------------ orphans

/// A server whose upstream `c` started a detached `sleep` (setsid): the
/// server, and the `(host pid, argv marker)` of the upstream's launcher,
/// its interpreter and the sleep, all checked alive; a reaper of them.
async fn upstream_with_a_detached_grandchild(
    dir: &Path,
) -> (StdioServer, Vec<(u32, String)>, Reaper) {
    let c = minimal_upstream_with_children(dir);
    let script = c["args"][0].as_str().expect("script").to_string();
    let file = write_servers_file(dir, json!({ "c": c }));
    let server = StdioServer::launch(with_servers(&file, &[])).await;
    // A duration no other process is likely to use: it marks our sleep.
    let seconds = 1000
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_micros() % 100_000)
            .unwrap_or(0);
    let answer = cell_json(
        &server,
        "default",
        &format!("import ferrepl, json\nprint(json.dumps(ferrepl.call('c', 'children', seconds={seconds})))"),
    )
    .await;
    let answer = answer.as_str().expect("a text answer").to_string();
    let [upstream, sleep] = upstream_host_pids(&answer)[..] else {
        panic!("expected two pids in {answer:?}");
    };
    let launchers = upstream_launchers(server.pid());
    assert!(
        !launchers.is_empty(),
        "no containment launcher under the server"
    );
    let mut procs: Vec<(u32, String)> = launchers
        .into_iter()
        .map(|pid| (pid, "__ferrepl-upstream".to_string()))
        .collect();
    assert_ne!(
        session_of(sleep),
        session_of(upstream),
        "the sleep is in a session of its own (setsid)"
    );
    procs.push((upstream, script));
    procs.push((sleep, seconds.to_string()));
    for (pid, arg) in &procs {
        assert!(
            !gone(*pid, arg),
            "process {pid} ({arg}) should be alive before the server ends"
        );
    }
    let reaper = Reaper {
        markers: Vec::new(),
        pids: procs.clone(),
    };
    (server, procs, reaper)
}

/// SIGKILL leaves ferrepl no chance to clean up: the upstream's whole
/// tree, a grandchild in a session of its own included, still ends with
/// it (parent-death signal, PID namespace).
#[tokio::test]
async fn an_upstreams_detached_grandchild_dies_with_a_sigkilled_server() {
    let dir = outside();
    let (server, procs, _reaper) = upstream_with_a_detached_grandchild(dir.path()).await;
    let log_tail = server.stderr_log();
    server.sigkill_and_reap(EXIT_TIMEOUT).await;
    let left = wait_all_gone(&procs, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "after SIGKILL of the server these upstream processes survived {GONE_TIMEOUT:?}: {left:?} \
         (of launcher, upstream, detached sleep: {procs:?}); server log:\n{}",
        crate::support::tail(&log_tail, 3000)
    );
}

/// A normal shutdown (stdin closed) ends the upstream's whole tree too.
#[tokio::test]
async fn an_upstreams_detached_grandchild_ends_with_a_normal_shutdown() {
    let dir = outside();
    let (server, procs, _reaper) = upstream_with_a_detached_grandchild(dir.path()).await;
    let status = server.close_and_wait().await;
    assert!(status.success(), "the server exited with {status:?}");
    let left = wait_all_gone(&procs, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "after the server's shutdown these upstream processes survived {GONE_TIMEOUT:?}: {left:?} (of {procs:?})"
    );
}

// ------------------------------------------------------------------ tenants

const ALICE: &str = "alice-token-0123456789abcdef0123";
const BOB: &str = "bob-token-0123456789abcdef012345";

/// Each tenant sees the servers granted to it, nothing of the others
/// (bob is told there is no server 'a' and shown only his), and has its
/// own upstream processes.
#[tokio::test]
async fn a_tenant_sees_only_its_servers_and_has_its_own_upstreams() {
    let dir = outside();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{ALICE} alice\n{BOB} bob\n")).expect("write the tokens");
    let mut a = minimal_upstream_with_children(dir.path());
    a["tenants"] = json!(["alice"]);
    let all = minimal_upstream_with_children(dir.path());
    let file = write_servers_file(dir.path(), json!({ "a": a, "all": all }));
    let server = HttpServer::launch(Launch::new(&[
        "--auth-token-file",
        path_str(&tokens),
        "--mcp-servers",
        path_str(&file),
        "--warm-pool",
        "0",
    ]))
    .await;
    let alice = server.connect(Some(ALICE)).await;
    let bob = server.connect(Some(BOB)).await;

    let probe = r#"
import ferrepl, json
out = {"servers": ferrepl.servers()}
for what, f in [("call", lambda: ferrepl.call("a", "pid")), ("tools", lambda: ferrepl.tools("a")),
                ("tool", lambda: ferrepl.tool("a", "pid"))]:
    try:
        r = f()
        out[what] = "OK " + (r if isinstance(r, str) else json.dumps(r, default=str))
    except ferrepl.Error as e:
        out[what] = "%s: %s" % (type(e).__name__, e)
out["all"] = [ferrepl.call("all", "pid"), ferrepl.call("all", "pid")]
print(json.dumps(out))
"#;
    let seen_by_bob = client_cell_json(&bob, probe).await;
    let seen_by_alice = client_cell_json(&alice, probe).await;

    assert_eq!(seen_by_bob["servers"], json!(["all"]), "{seen_by_bob:#}");
    for what in ["call", "tools", "tool"] {
        let got = seen_by_bob[what].as_str().unwrap_or_default();
        assert!(
            got.starts_with(
                "CallRefused: there is no MCP server 'a' for this session; there are: all"
            ),
            "bob's {what} of alice's server 'a': {got:?}"
        );
        assert!(!got.contains("alice"), "bob is told of alice: {got:?}");
    }
    assert_eq!(
        seen_by_alice["servers"],
        json!(["a", "all"]),
        "{seen_by_alice:#}"
    );
    assert!(
        seen_by_alice["call"]
            .as_str()
            .is_some_and(|s| s.starts_with("OK pid:[")),
        "alice calls her server: {seen_by_alice:#}"
    );

    // One upstream "all" per tenant, kept between calls.
    let pids = |seen: &Value| -> Vec<u32> {
        seen["all"]
            .as_array()
            .expect("two answers")
            .iter()
            .map(|a| upstream_host_pids(a.as_str().expect("text"))[0])
            .collect()
    };
    let (of_alice, of_bob) = (pids(&seen_by_alice), pids(&seen_by_bob));
    assert_eq!(of_alice[0], of_alice[1], "alice's calls share her upstream");
    assert_eq!(of_bob[0], of_bob[1], "bob's calls share his upstream");
    assert_ne!(
        of_alice[0], of_bob[0],
        "alice and bob share one upstream process of 'all'"
    );
    let a_pid = upstream_host_pids(
        seen_by_alice["call"]
            .as_str()
            .and_then(|s| s.strip_prefix("OK "))
            .expect("alice's answer"),
    )[0];
    assert!(
        ![of_alice[0], of_bob[0]].contains(&a_pid),
        "server 'a' has a process of its own"
    );
}

// ------------------------------------------------------------------ the channel

/// Python prelude for the fuzzing cells: `raw(bytes)` writes to the
/// control channel (fd 3) as the driver would (under its send lock), and
/// `ev(**fields)` writes one `upstream` event.
const RAW_CHANNEL: &str = r#"
import json, os, sys, time, ferrepl
_ch = sys.modules["ferrepl_driver.channel"]
_sock = _ch.control_sock()
assert _sock.fileno() == 3, _sock.fileno()
def raw(data):
    with _ch._send_lock:
        _sock.sendall(data)
def ev(**fields):
    raw((json.dumps(dict(ev="upstream", **fields)) + "\n").encode())
"#;

/// The server reads the session's control channel: hand-made `upstream`
/// events of every wrong shape (huge, non-string or missing names,
/// arguments that are no object or nested 10 000 deep, unknown ops, ids
/// negative, huge or not numbers, duplicate ids, a flood, lines that are
/// no JSON, a line over the 16 MiB limit and one just under it) neither
/// crash nor hang it: a normal call works afterwards, in that session and
/// another, and the server is alive.
#[tokio::test]
async fn hand_made_upstream_events_neither_crash_nor_hang_the_server() {
    let dir = outside();
    let file = write_servers_file(dir.path(), json!({ "m": minimal_upstream(dir.path()) }));
    let mut server = StdioServer::launch(with_servers(&file, &[])).await;
    let fuzz = format!(
        "{RAW_CHANNEL}{}",
        r#"
deep = b"[" * 10000 + b"]" * 10000
raw(b'{"ev":"upstream","id":7,"op":"call","server":"m","tool":"echo","arguments":' + deep + b'}\n')
raw(b'{"ev":"upstream","id":7,"op":"call","server":"m","tool":"echo","arguments":{"a":' + b'{"a":' * 10000 + b'1' + b'}' * 10000 + b'}}\n')
ev(id=1, op="call", server="m" * 5_000_000, tool="echo", arguments={})
ev(id=2, op="call", server=123, tool="echo")
ev(id=3, op="call", tool="echo", arguments={"text": "x"})
ev(id=4, op="call", server="m", tool="echo", arguments=[1, 2])
ev(id=5, op="call", server="m", tool="echo", arguments="x")
ev(id=6, op="call", server="m", tool=None)
ev(id=8, op="frobnicate", server="m")
ev(id=9, op="tools", server=["m"])
ev(id=10, op="call", server="m", tool="x" * 1_000_000, arguments={})
ev(id=11, op="tools", server="\udcff")
ev(id=12, op="call", server="m", tool="echo", arguments={"text": "\u0000\udcff"})
ev(id=-1, op="servers")
ev(id=2**64, op="servers")
ev(id=2**64 - 1, op="servers")
ev(id=1.5, op="servers")
ev(id="x", op="servers")
ev(op="servers")
ev(id=13, op="cancel")
ev(id=14, op=None)
for i in range(3):
    ev(id=15, op="call", server="m", tool="slow", arguments={"seconds": 1})
ev(id=15, op="cancel")
for i in range(2000):
    ev(id=1000 + i, op="servers" if i % 2 else "tools", server="m")
for junk in (b"\n", b"\xff\xfe\x00garbage\n", b"null\n", b"[]\n", b"{\n", b'{"ev":"upstream"}\n',
             b'{"ev":"nonsense","id":1}\n', b'{"ev":"reply","id":1}\n', b'{"ev":"upstream","id":1,"op":"call","server":"m"'):
    raw(junk)
raw(b"\n")
raw(b"x" * (17 << 20) + b"\n")
raw(b'{"ev":"upstream","id":16,"op":"call","server":"m","tool":"echo","arguments":{"text":"' + b"y" * ((16 << 20) - 300) + b'"}}\n')
time.sleep(1)
print(json.dumps(ferrepl.call("m", "echo", text="after the fuzz")))
"#
    );
    let after = cell_json(&server, "fuzz", &fuzz).await;
    assert_eq!(after, json!("after the fuzz"));
    server.assert_alive();
    // The lines reached the server's reader, which skipped what it could
    // not read.
    for logged in [
        "oversized event from worker skipped",
        "unreadable event from worker",
    ] {
        assert!(
            server.stderr_log().contains(logged),
            "the server did not log {logged:?}:\n{}",
            crate::support::tail(&server.stderr_log(), 4000)
        );
    }

    // The same session and another go on; a call too large to send is
    // refused with the reason, and the session keeps working.
    let big = cell_json(
        &server,
        "fuzz",
        r#"
import ferrepl, json
try:
    ferrepl.call("m", "echo", text="x" * 20_000_000)
    r = "no error"
except ferrepl.CallRefused as e:
    r = "CallRefused: %s" % e
print(json.dumps([r, ferrepl.call("m", "echo", text="still")]))
"#,
    )
    .await;
    let refusal = big[0].as_str().unwrap_or_default();
    assert!(
        refusal.starts_with("CallRefused: the arguments are") && refusal.contains("over the"),
        "a 20 MB call: {big:#}"
    );
    assert_eq!(big[1], json!("still"), "{big:#}");
    let other = cell_json(
        &server,
        "other",
        "import ferrepl, json\nprint(json.dumps(ferrepl.call('m', 'echo', text='other')))",
    )
    .await;
    assert_eq!(other, json!("other"));
    server.assert_alive();
    let status = server.close_and_wait().await;
    assert!(status.success(), "the server exited with {status:?}");
}

// Where the servers file may lie and what runs; the warnings; the gaps a
// review found.
mod places;
// What ferrepl hands out never comes back through what upstreams say.
mod secrets;
