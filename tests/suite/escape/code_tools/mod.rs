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
//!
//! `mod.rs` holds the helpers the attacks share (servers files outside the
//! workspace, cells that print JSON, the secret scan, upstream processes);
//! one file per attack: `upstream_env.rs` (an upstream's `env`),
//! `http_headers.rs` (an HTTP upstream's headers), `orphans.rs` (an
//! upstream's detached grandchild), `tenants.rs` (another tenant's
//! servers), `channel.rs` (hand-made `upstream` events), `places.rs` (where
//! the servers file may lie) and `secrets.rs` (what upstreams say back).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::upstreams::{
    minimal_upstream, minimal_upstream_with_children, write_servers_file,
};
use crate::support::{
    Client, Launch, StdioServer, ToolOutput, call, cmdline, descendants, everything,
    host_pid_in_namespace, parse_namespaced_pids, path_str, process_alive, py, strip_ansi, unique,
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

/// Python prelude for the fuzzing cells (`channel.rs`, `places.rs`): `raw(bytes)` writes to the
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

mod channel;
mod http_headers;
mod orphans;
// Where the servers file may lie and what runs; the warnings; the gaps a
// review found.
mod places;
// What ferrepl hands out never comes back through what upstreams say.
mod secrets;
mod tenants;
mod upstream_env;
