//! Each session and each shell job sees its own world: `/proc` shows only
//! its own processes (not the server, not another session, and no other
//! environment), `/dev` is minimal, pty jobs cannot be reached from another
//! session or job, `/dev/shm` is private (and counted against the memory
//! limit), host Unix sockets and the host's temporary directory are out of
//! sight, and with the network off the only interface is a private `lo`.
//!
//! Every attack runs in a real server (default flags plus `--workdir`)
//! through an MCP client, in `python_exec` cells and `shell_exec` jobs, with
//! decoys the test makes itself. Each assertion holds both when the tests
//! run as root and as an ordinary user. Cells print each probe's outcome as
//! `label: OK <repr>` or `label: <ExceptionType> errno=<n>`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{
    ATTEMPT, Reaper, StdioServer, ToolOutput, assert_failed, assert_succeeded, cmdline, errno_of,
    everything, job_python, json_line, outcome, processes_with_arg, py, py_path, run_cell, run_job,
    unique,
};

/// Upper bound for something the test polls for (a process, job output).
const POLL_TIMEOUT: Duration = Duration::from_secs(20);

// ------------------------------------------------------------------ helpers

fn string_set(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a JSON array, got {v}"))
        .iter()
        .map(|x| x.as_str().expect("a string").to_string())
        .collect()
}

/// The full output of a job so far.
async fn job_output(server: &StdioServer, job: &str) -> String {
    let out = server.call("shell_output", json!({ "job": job })).await;
    assert!(!out.is_error, "shell_output failed: {out:#?}");
    out.str_field("text").to_string()
}

/// Polls a job's full output until `done(output)` (bounded); returns it.
async fn wait_job_output(server: &StdioServer, job: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + POLL_TIMEOUT;
    loop {
        let text = job_output(server, job).await;
        if done(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {job}'s output did not reach the expected state within {POLL_TIMEOUT:?}: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Paths removed when the test ends (passing or not).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for path in &self.0 {
            if path.is_dir() {
                let _ = std::fs::remove_dir_all(path);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

// ------------------------------------------------------------------ 8, 9. /proc

/// A scanner for sessions (`scan(needles_path)`) and jobs (`python3 FILE
/// NEEDLES`): lists the pids of `/proc`, reads every `cmdline` and `environ`
/// it can, and reports on one short `SCAN=<json>` line: which files hold a
/// needle, where the server's argv shows up, what the server's own pid is
/// there, what reading the server's environ gave, and which of its own
/// environment variables hold a needle. Nothing read is printed (it may
/// carry secrets of the host). The needles come from a file so that they
/// appear in no command line.
const SCANNER: &str = r#"
import json, os, sys

def scan(needles_path):
    with open(needles_path) as f:
        spec = json.load(f)
    needles = [n.encode() for n in spec["needles"]]
    server_pid = str(spec["server_pid"])
    server_argv = [a.encode() for a in spec["server_argv"]]
    pids = sorted(p for p in os.listdir("/proc") if p.isdigit())
    hits, server_argv_at, server_pid_status = [], [], "absent"
    for p in pids:
        if p == server_pid:
            server_pid_status = "unreadable"
        for what in ("cmdline", "environ"):
            try:
                with open(f"/proc/{p}/{what}", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if what == "cmdline":
                argv = [a for a in data.split(b"\0") if a]
                if argv == server_argv:
                    server_argv_at.append(p)
                if p == server_pid:
                    server_pid_status = "the server" if argv == server_argv else "another process"
            if any(n in data for n in needles):
                hits.append(f"{p}/{what}")
    try:
        with open(f"/proc/{server_pid}/environ", "rb") as f:
            data = f.read()
        server_environ = "readable, needle " + ("FOUND" if any(n in data for n in needles) else "absent")
    except OSError as e:
        server_environ = f"{type(e).__name__} errno={e.errno}"
    own = [k for k, v in os.environ.items() if any(n in (k + "=" + v).encode() for n in needles)]
    print("SCAN=" + json.dumps({
        "npids": len(pids), "hits": hits[:20], "nhits": len(hits),
        "server_argv_at": server_argv_at[:20], "server_pid": server_pid_status,
        "server_environ": server_environ, "own_env": own,
    }), flush=True)

if __name__ == "__main__":
    scan(sys.argv[1])
"#;

/// Writes the scanner and its needles into the workspace; returns the
/// (scanner, needles) paths.
fn write_scanner(ws: &Path, needles: &[&str], server_pid: u32) -> (PathBuf, PathBuf) {
    let scanner = ws.join("proc_scan.py");
    let spec = ws.join("proc_scan_needles.json");
    let server_argv = cmdline(server_pid).expect("the server's argv");
    std::fs::write(&scanner, SCANNER).expect("write the scanner");
    std::fs::write(
        &spec,
        json!({ "needles": needles, "server_pid": server_pid, "server_argv": server_argv })
            .to_string(),
    )
    .expect("write the needles");
    (scanner, spec)
}

/// Runs the scanner in `session` and in a shell job; returns both reports.
async fn scan_from_session_and_job(
    server: &StdioServer,
    session: &str,
    scanner: &Path,
    spec: &Path,
) -> Vec<(String, Value, ToolOutput)> {
    let cell = format!(
        "_ns = {{}}\nexec(compile(open({s}).read(), {s}, 'exec'), _ns)\n_ns['scan']({n})\n",
        s = py_path(scanner),
        n = py_path(spec),
    );
    let from_session = run_cell(server, session, &cell).await;
    let from_job = run_job(
        server,
        json!({ "command": format!("{} {} {}", job_python(), scanner.display(), spec.display()) }),
    )
    .await;
    vec![
        (
            format!("session {session}"),
            json_line(&from_session, "SCAN"),
            from_session,
        ),
        (
            "a shell job".to_string(),
            json_line(&from_job, "SCAN"),
            from_job,
        ),
    ]
}

/// Asserts that a scan report saw none of the needles and not the server.
fn assert_nothing_found(who: &str, report: &Value, out: &ToolOutput, needles: &[&str]) {
    assert_eq!(
        report["nhits"],
        json!(0),
        "{who} found a needle in /proc files (among {} pids): {report}",
        report["npids"]
    );
    assert_eq!(
        report["own_env"],
        json!([]),
        "{who} holds a needle in its own environment (names shown): {report}"
    );
    let server_environ = report["server_environ"].as_str().unwrap_or_default();
    assert!(
        !server_environ.contains("FOUND"),
        "{who} read the server's environment: {report}"
    );
    assert_eq!(
        report["server_argv_at"],
        json!([]),
        "{who} sees the server's process: {report}"
    );
    // The same number inside a PID namespace may be another process.
    assert!(
        matches!(
            report["server_pid"].as_str(),
            Some("absent" | "another process")
        ),
        "{who} lists the server's pid: {report}"
    );
    let all = everything(out);
    for needle in needles {
        assert!(
            !all.contains(needle),
            "{who}'s result carries the needle {needle}"
        );
    }
}

#[tokio::test]
async fn proc_shows_neither_the_server_nor_other_sessions() {
    let secret = unique("DECOY-SECRET-");
    let marker = unique("ferrepl-escape-marker-");
    let _reaper = Reaper::of_marker(&marker);
    let mut server = StdioServer::start_with_env(&[], &[("DECOY_SECRET", &secret)]).await;
    let server_pid = server.child.id().expect("the server's pid");

    // Session A runs a long sleeper carrying the marker.
    let started = run_cell(
        &server,
        "a",
        &format!(
            "import subprocess, sys\n_sleeper = subprocess.Popen([sys.executable, '-c', \
             'import time; time.sleep(1000)', {}])\n'started'",
            py(&marker)
        ),
    )
    .await;
    assert_eq!(started.value(), Some("'started'"), "{started:#?}");
    let deadline = tokio::time::Instant::now() + POLL_TIMEOUT;
    while processes_with_arg(&marker).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "session a's marked sleeper never appeared on the host"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let (scanner, spec) = write_scanner(server.workdir.path(), &[&secret, &marker], server_pid);
    for (who, report, out) in scan_from_session_and_job(&server, "b", &scanner, &spec).await {
        assert_nothing_found(&who, &report, &out, &[&secret, &marker]);
    }

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn another_sessions_environment_is_out_of_reach() {
    let secret = unique("A-SECRET-");
    let mut server = StdioServer::start(&[]).await;
    let server_pid = server.child.id().expect("the server's pid");

    let created = server
        .call(
            "python_sessions",
            json!({ "action": "create", "session": "a", "env": { "A_SECRET": secret } }),
        )
        .await;
    assert!(!created.is_error, "creating session a failed: {created:#?}");
    // The decoy really is in session a's environment.
    let check = run_cell(
        &server,
        "a",
        "import os\nlen(os.environ.get('A_SECRET', ''))",
    )
    .await;
    assert_eq!(
        check.value(),
        Some(secret.len().to_string().as_str()),
        "session a should hold A_SECRET: {check:#?}"
    );

    let (scanner, spec) = write_scanner(server.workdir.path(), &[&secret], server_pid);
    for (who, report, out) in scan_from_session_and_job(&server, "b", &scanner, &spec).await {
        assert_nothing_found(&who, &report, &out, &[&secret]);
    }

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 10. /dev

/// What a sandbox's /dev may hold.
const DEV_ALLOWED: &[&str] = &[
    "null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd", "stdin",
    "stdout", "stderr", "console",
];

/// Host devices that must be absent or unopenable.
const DEV_FORBIDDEN: &[&str] = &[
    "/dev/kmsg",
    "/dev/mem",
    "/dev/kmem",
    "/dev/port",
    "/dev/loop0",
    "/dev/loop-control",
    "/dev/net/tun",
    "/dev/sda",
    "/dev/vda",
    "/dev/nvme0n1",
    "/dev/kvm",
    "/dev/fuse",
];

#[tokio::test]
async fn dev_is_minimal() {
    let mut server = StdioServer::start(&[]).await;
    let mut probes = String::new();
    for dev in DEV_FORBIDDEN {
        probes.push_str(&format!(
            "attempt({d}, lambda: os.close(os.open({d}, os.O_RDONLY | os.O_NONBLOCK)))\n",
            d = py(dev)
        ));
    }
    let code = format!(
        r#"{ATTEMPT}
import json
print("DEV=" + json.dumps(sorted(os.listdir("/dev"))))
{probes}
def write_null():
    with open("/dev/null", "wb") as f:
        return f.write(b"x")
def read(path):
    with open(path, "rb") as f:
        return len(f.read(8))
attempt("null", write_null)
attempt("zero", lambda: read("/dev/zero"))
attempt("urandom", lambda: read("/dev/urandom"))
"#
    );
    let out = run_cell(&server, "default", &code).await;
    let allowed: BTreeSet<String> = DEV_ALLOWED.iter().map(|s| s.to_string()).collect();
    let listed = string_set(&json_line(&out, "DEV"));
    let extra: Vec<&String> = listed.difference(&allowed).collect();
    assert!(
        extra.is_empty(),
        "the session's /dev holds more than the minimal set: {extra:?} (all: {listed:?})"
    );
    for dev in DEV_FORBIDDEN {
        assert_failed(&out, dev, "the device is not in a minimal /dev");
    }
    for ok in ["null", "zero", "urandom"] {
        assert_succeeded(&out, ok);
    }

    // A shell job's /dev likewise.
    let job = run_job(&server, json!({ "command": "ls -A /dev" })).await;
    let job_listed: BTreeSet<String> = job
        .str_field("stdout")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let extra: Vec<&String> = job_listed.difference(&allowed).collect();
    assert!(
        extra.is_empty(),
        "a job's /dev holds more than the minimal set: {extra:?} (all: {job_listed:?})"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 11. ptys

/// Python that opens `tty` (O_RDWR, no controlling tty) and, if it could,
/// TIOCSTIs `inject` into it, printing `open: OK '<st_dev>:<major>:<minor>'`
/// (hex numbers, as `stat -c %d:%t:%T`) and `tiocsti: ...`.
fn pty_attack(tty: &str, inject: &str) -> String {
    format!(
        r#"{ATTEMPT}
import fcntl, termios
fd = None
def open_tty():
    global fd
    fd = os.open({tty}, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    st = os.fstat(fd)
    return f"{{st.st_dev}}:{{os.major(st.st_rdev):x}}:{{os.minor(st.st_rdev):x}}"
print("", flush=True)
attempt("open", open_tty)
if fd is None:
    print("tiocsti: SKIP", flush=True)
else:
    def sti():
        for ch in ({inject} + "\n").encode():
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
        return "injected"
    attempt("tiocsti", sti)
    os.close(fd)
"#,
        tty = py(tty),
        inject = py(inject),
    )
}

/// The attack on job A's terminal failed: it could not be opened, or what
/// was opened is another terminal and TIOCSTI was refused with EPERM.
fn assert_pty_attack_failed(who: &str, out: &ToolOutput, a_device: &str) {
    let opened = outcome(out, "open");
    if let Some(device) = opened.strip_prefix("OK ") {
        assert_ne!(
            device.trim_matches('\''),
            a_device,
            "{who} opened job A's terminal itself (it could read what is typed there): {out:#?}"
        );
        let sti = outcome(out, "tiocsti");
        assert!(
            errno_of(&sti) == Some(libc::EPERM),
            "{who}: TIOCSTI should fail with EPERM, got '{sti}': {out:#?}"
        );
    }
}

#[tokio::test]
async fn pty_jobs_are_out_of_reach_of_other_sessions_and_jobs() {
    let mut server = StdioServer::start(&[]).await;
    let inject = unique("INJECTED-");
    let sentinel = unique("END-");

    // Job A: a terminal waiting for input.
    let a = server
        .call(
            "shell_exec",
            json!({
                "command": "tty; stat -L -c 'ttydev=%d:%t:%T' /proc/self/fd/0; cat",
                "pty": true,
                "wait_s": 1,
            }),
        )
        .await;
    assert_eq!(a.structured["status"], "running", "{a:#?}");
    let a_job = a.str_field("job").to_string();
    let a_out = wait_job_output(&server, &a_job, |t| t.contains("ttydev=")).await;
    let line_of = |prefix: &str| {
        a_out
            .lines()
            .map(|l| l.trim())
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| {
                panic!("no line starting with {prefix} in job A's output: {a_out:?}")
            })
            .to_string()
    };
    let tty = line_of("/dev/");
    let a_device = line_of("ttydev=").trim_start_matches("ttydev=").to_string();

    // Session B tries to open it and inject keystrokes.
    let b = run_cell(&server, "b", &pty_attack(&tty, &inject)).await;
    assert_pty_attack_failed("session b", &b, &a_device);

    // Job C, on a terminal of its own, tries the same.
    let script = server.workdir.path().join("pty_attack.py");
    std::fs::write(&script, pty_attack(&tty, &inject)).expect("write the attack script");
    let c = run_job(
        &server,
        json!({
            "command": format!("{} {}", job_python(), script.display()),
            "pty": true,
        }),
    )
    .await;
    assert_pty_attack_failed("job c", &c, &a_device);

    // Anything injected sits in A's input before this line: once cat has
    // echoed the sentinel (the terminal echo, then cat's copy), the output
    // shows everything that reached A.
    let typed = server
        .call("shell_wait", json!({ "job": a_job, "input": sentinel }))
        .await;
    assert!(!typed.is_error, "input to job A failed: {typed:#?}");
    let a_out = wait_job_output(&server, &a_job, |t| {
        t.matches(sentinel.as_str()).count() >= 2
    })
    .await;
    assert!(
        !a_out.contains(&inject),
        "keystrokes injected from another session or job reached job A: {a_out:?}"
    );

    let _ = server
        .call("shell_wait", json!({ "job": a_job, "signal": "KILL" }))
        .await;
    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 12. /dev/shm

#[tokio::test]
async fn dev_shm_is_private_to_each_session_and_reset() {
    let marker = unique("ferrepl-escape-shm-");
    let host_path = Path::new("/dev/shm").join(&marker);
    let _cleanup = Cleanup(vec![host_path.clone()]);
    let mut server = StdioServer::start(&[]).await;
    let shm = py_path(&host_path);

    let write = run_cell(
        &server,
        "a",
        &format!(
            "{ATTEMPT}\ndef put():\n    with open({shm}, 'w') as f:\n        return f.write('x')\n\
             attempt('write', put)\nattempt('exists', lambda: os.path.exists({shm}))\n"
        ),
    )
    .await;
    assert_succeeded(&write, "write");
    assert_eq!(outcome(&write, "exists"), "OK True", "{write:#?}");

    assert!(
        !host_path.exists(),
        "session a's /dev/shm file appeared in the host's /dev/shm"
    );

    let look = format!(
        "{ATTEMPT}\nattempt('exists', lambda: os.path.exists({shm}))\n\
         attempt('listed', lambda: {m} in os.listdir('/dev/shm'))\n",
        m = py(&marker)
    );
    let b = run_cell(&server, "b", &look).await;
    assert_eq!(
        outcome(&b, "exists"),
        "OK False",
        "session b sees a's /dev/shm file: {b:#?}"
    );
    assert!(
        outcome(&b, "listed") != "OK True",
        "session b lists a's /dev/shm file: {b:#?}"
    );

    let job = run_job(
        &server,
        json!({ "command": format!("test -e {} && echo present || echo absent", host_path.display()) }),
    )
    .await;
    assert!(
        job.str_field("stdout").contains("absent"),
        "a shell job sees session a's /dev/shm file: {job:#?}"
    );

    let reset = server
        .call(
            "python_sessions",
            json!({ "action": "reset", "session": "a" }),
        )
        .await;
    assert!(!reset.is_error, "resetting session a failed: {reset:#?}");
    let after = run_cell(&server, "a", &look).await;
    assert_eq!(
        outcome(&after, "exists"),
        "OK False",
        "session a's /dev/shm file survived a reset: {after:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn dev_shm_is_counted_against_the_memory_limit() {
    // Room for the sandbox's own processes (launcher, init, the supervisor
    // of protected places: ~35 MiB of resident memory in a debug build).
    const LIMIT_MIB: u64 = 96;
    const WRITE_MIB: u64 = 160;
    let marker = unique("ferrepl-escape-shm-big-");
    let host_path = Path::new("/dev/shm").join(&marker);
    let _cleanup = Cleanup(vec![host_path.clone()]);
    let mut server = StdioServer::start(&["--memory-limit", &format!("{LIMIT_MIB}M")]).await;

    let code = format!(
        r#"
import os
chunk = b"\1" * (1 << 20)
fd = os.open({shm}, os.O_WRONLY | os.O_CREAT, 0o600)
written = 0
try:
    for _ in range({WRITE_MIB}):
        os.write(fd, chunk)
        written += 1
        if written % 8 == 0:
            print(f"progress={{written}}", flush=True)
finally:
    print(f"wrote={{written}}", flush=True)
"#,
        shm = py_path(&host_path),
    );
    let out = server
        .call(
            "python_exec",
            json!({ "code": code, "session": "big", "wait_s": 60 }),
        )
        .await;
    assert_ne!(
        out.structured["status"], "running",
        "the cell should have ended: {out:#?}"
    );
    let stdout = out.structured["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout.contains("progress=8\n"),
        "writing into /dev/shm should work up to the limit: {out:#?}"
    );
    assert!(
        !stdout.contains(&format!("wrote={WRITE_MIB}")),
        "{WRITE_MIB} MiB went into /dev/shm under --memory-limit {LIMIT_MIB}M: {out:#?}"
    );
    assert!(
        !host_path.exists(),
        "the session's /dev/shm file is in the host's /dev/shm (and outlives the session)"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 13. host Unix sockets

/// Names in a directory of the host, as the test sees them.
fn host_names(dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn host_unix_sockets_are_out_of_sight() {
    use std::os::unix::net::UnixListener;

    let mut listeners = Vec::new();
    let mut paths = Vec::new();
    for dir in ["/tmp", "/run"] {
        let path = PathBuf::from(dir).join(format!("{}.sock", unique("ferrepl-escape-")));
        match UnixListener::bind(&path) {
            Ok(l) => {
                l.set_nonblocking(true).expect("non-blocking listener");
                listeners.push(l);
                paths.push(path);
            }
            Err(e) if dir == "/tmp" => panic!("bind {}: {e}", path.display()),
            Err(_) => {} // /run not writable by this user: /tmp only.
        }
    }
    let _cleanup = Cleanup(paths.clone());
    let mut server = StdioServer::start(&[]).await;
    let ws = server.workdir.path().to_path_buf();
    let from_test = ws.join("from-test.txt");
    let from_cell = ws.join("from-cell.txt");
    std::fs::write(&from_test, "hello from the test").expect("write into the workspace");

    let mut probes = String::new();
    for (i, path) in paths.iter().enumerate() {
        probes.push_str(&format!(
            "attempt('connect{i}', lambda: connect({}))\n",
            py_path(path)
        ));
    }
    let code = format!(
        r#"{ATTEMPT}
import json, socket
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return "connected"
    finally:
        s.close()
{probes}
def names(d):
    try:
        return sorted(os.listdir(d))
    except OSError:
        return []
print("RUN=" + json.dumps(names("/run")))
print("VARRUN=" + json.dumps(names("/var/run")))
def read_ws():
    with open({from_test}) as f:
        return f.read()
def write_ws():
    with open({from_cell}, "w") as f:
        return f.write("hello from the cell")
attempt("read_ws", read_ws)
attempt("write_ws", write_ws)
"#,
        from_test = py_path(&from_test),
        from_cell = py_path(&from_cell),
    );
    let out = run_cell(&server, "default", &code).await;

    for (i, path) in paths.iter().enumerate() {
        let got = outcome(&out, &format!("connect{i}"));
        assert!(
            [libc::ENOENT, libc::EACCES, libc::EPERM]
                .iter()
                .any(|e| errno_of(&got) == Some(*e)),
            "connecting to the host socket {} should fail with ENOENT/EACCES/EPERM, got '{got}': {out:#?}",
            path.display()
        );
    }
    for l in &listeners {
        match l.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Ok(_) => panic!("the session reached the test's Unix socket"),
            Err(e) => panic!("accept on the test's Unix socket failed: {e}"),
        }
    }
    for (key, dir) in [("RUN", "/run"), ("VARRUN", "/var/run")] {
        let host = host_names(dir);
        let seen = string_set(&json_line(&out, key));
        let shared: Vec<&String> = seen.intersection(&host).collect();
        assert!(
            shared.is_empty(),
            "the session's {dir} shows the host's entries {shared:?} (session: {seen:?})"
        );
    }
    assert_eq!(
        outcome(&out, "read_ws"),
        "OK 'hello from the test'",
        "{out:#?}"
    );
    assert_succeeded(&out, "write_ws");
    assert_eq!(
        std::fs::read_to_string(&from_cell).expect("the file the cell wrote"),
        "hello from the cell"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 14. temporary directories

#[tokio::test]
async fn the_host_temp_dir_and_other_sessions_tmpdirs_are_hidden() {
    let secret = unique("TMP-SECRET-");
    let decoy = std::env::temp_dir().join(format!("{}.txt", unique("ferrepl-escape-decoy-")));
    std::fs::write(&decoy, format!("{secret}\n")).expect("write the decoy");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o644))
            .expect("chmod the decoy");
    }
    let _cleanup = Cleanup(vec![decoy.clone()]);
    let mut server = StdioServer::start(&[]).await;

    // Session A keeps a secret in its own TMPDIR.
    let a_secret = unique("A-TMP-SECRET-");
    let a = run_cell(
        &server,
        "a",
        &format!(
            "import os\n_p = os.path.join(os.environ['TMPDIR'], 'a-secret.txt')\n\
             open(_p, 'w').write({})\n_p",
            py(&a_secret)
        ),
    )
    .await;
    let a_file = a
        .value()
        .unwrap_or_else(|| panic!("no path from session a: {a:#?}"))
        .trim_matches('\'')
        .to_string();

    let code = format!(
        r#"{ATTEMPT}
def read(path):
    with open(path) as f:
        return len(f.read())
def write_tmp():
    p = os.path.join(os.environ["TMPDIR"], "own.txt")
    with open(p, "w") as f:
        f.write("mine")
    with open(p) as f:
        return f.read()
attempt("decoy", lambda: read({decoy}))
attempt("decoy_listed", lambda: {name} in os.listdir({dir}))
attempt("a_tmpdir", lambda: read({a_file}))
attempt("own_tmpdir", write_tmp)
"#,
        decoy = py_path(&decoy),
        name = py(decoy.file_name().and_then(|n| n.to_str()).expect("a name")),
        dir = py_path(decoy.parent().expect("the temp dir")),
        a_file = py(&a_file),
    );
    for session in ["b", "a"] {
        let out = run_cell(&server, session, &code).await;
        assert_failed(&out, "decoy", "the host's temporary directory is hidden");
        assert!(
            outcome(&out, "decoy_listed") != "OK True",
            "session {session} lists the decoy in the host's temp dir: {out:#?}"
        );
        if session == "b" {
            assert_failed(&out, "a_tmpdir", "another session's temporary directory");
        }
        assert_eq!(outcome(&out, "own_tmpdir"), "OK 'mine'", "{out:#?}");
        let all = everything(&out);
        assert!(!all.contains(&secret), "the decoy leaked: {out:#?}");
        assert!(
            !all.contains(&a_secret),
            "session a's secret leaked: {out:#?}"
        );
    }

    // A shell job cannot read them either.
    let job = server
        .call(
            "shell_exec",
            json!({ "command": format!("cat {} {}", decoy.display(), a_file) }),
        )
        .await;
    assert_eq!(job.structured["status"], "exited", "{job:#?}");
    let all = everything(&job);
    assert!(
        !all.contains(&secret) && !all.contains(&a_secret),
        "a shell job read a hidden temporary file: {job:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 15. network namespace

/// Interface names of a `/proc/net/dev` text.
fn interfaces(text: &str) -> BTreeSet<String> {
    text.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim().to_string())
        .collect()
}

#[tokio::test]
async fn with_the_network_off_the_only_interface_is_loopback() {
    let mut server = StdioServer::start(&[]).await;
    let only_lo: BTreeSet<String> = ["lo".to_string()].into();

    let out = run_cell(
        &server,
        "default",
        "import json\nprint('NETDEV=' + json.dumps(open('/proc/net/dev').read()))",
    )
    .await;
    let text = json_line(&out, "NETDEV");
    let seen = interfaces(text.as_str().expect("a string"));
    assert_eq!(
        seen, only_lo,
        "the session sees network interfaces other than its own lo: {text}"
    );

    let job = run_job(&server, json!({ "command": "cat /proc/net/dev" })).await;
    let seen = interfaces(job.str_field("stdout"));
    assert_eq!(
        seen, only_lo,
        "a shell job sees network interfaces other than its own lo: {job:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}
