//! OS confinement of sessions and shell jobs: network off by default, writes
//! limited to the workspace and a per-session temporary directory, the user's
//! home hidden, process-count and memory limits enforced on the whole process
//! tree, every process of a session (daemonized ones included) ended on reset
//! and delete, and `--sandbox off` lifting all of it.
//!
//! Every test talks to a real server over stdio through an rmcp client. The
//! network probes go to sockets the test itself opened, so the test can tell
//! from its own side that nothing reached them.

use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::time::Duration;

use crate::support::{
    ATTEMPT, Reaper, StdioServer, ToolOutput, assert_succeeded, cmdline, everything,
    host_pid_in_namespace, outcome, path_str, processes_with_arg, py, py_path,
    session_pid_namespace, unique, wait_for_file_line, wait_process_gone,
};
use serde_json::json;

/// Upper bound for processes of a killed session to disappear.
const GONE_TIMEOUT: Duration = Duration::from_secs(15);
/// wait_s of cells that only end when the server kills them: past it the cell
/// comes back "running", which fails the test instead of hanging it.
const KILL_WAIT_S: f64 = 25.0;

// ------------------------------------------------------------------ helpers

/// Whether an `attempt` outcome is a refusal: PermissionError, or an
/// OSError carrying EPERM/EACCES, or EROFS (the sandbox's mount namespace
/// makes everything but the workspace and the session's own directories
/// read-only at the mount level).
fn is_denial(got: &str) -> bool {
    got.starts_with("PermissionError")
        || (got.starts_with("OSError")
            && [libc::EPERM, libc::EACCES, libc::EROFS]
                .iter()
                .any(|e| got.ends_with(&format!("errno={e}"))))
}

/// Panics unless `label` failed with a permission error (PermissionError, or
/// an OSError carrying EPERM/EACCES/EROFS).
fn assert_denied(out: &ToolOutput, label: &str) {
    let got = outcome(out, label);
    assert!(
        is_denial(&got),
        "'{label}' should have been refused with PermissionError/OSError(EPERM|EACCES|EROFS), got '{got}'; result: {out:#?}"
    );
}

/// Like `assert_denied`, for a path in a place the sandbox hides (the host's
/// temporary directory, the user's home): there the path does not exist at
/// all (FileNotFoundError, ENOENT), which is a refusal too.
fn assert_denied_or_hidden(out: &ToolOutput, label: &str) {
    let got = outcome(out, label);
    let hidden =
        got.starts_with("FileNotFoundError") && got.ends_with(&format!("errno={}", libc::ENOENT));
    assert!(
        is_denial(&got) || hidden,
        "'{label}' should have been refused (PermissionError/OSError(EPERM|EACCES|EROFS)) or not found in a hidden place (ENOENT), got '{got}'; result: {out:#?}"
    );
}

/// python_exec with an explicit wait window.
async fn exec_wait(server: &StdioServer, session: &str, code: &str, wait_s: f64) -> ToolOutput {
    server
        .call(
            "python_exec",
            json!({ "code": code, "session": session, "wait_s": wait_s }),
        )
        .await
}

/// Bounded poll until no live process carries `marker`; returns the survivors.
async fn wait_no_process_with_arg(marker: &str, timeout: Duration) -> Vec<u32> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = processes_with_arg(marker);
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fake home directory holding `.ssh/id_rsa` with `secret` in it, made
/// outside the host's temporary directory.
fn fake_home(secret: &str) -> tempfile::TempDir {
    let home = crate::support::visible_outside_dir();
    let ssh = home.path().join(".ssh");
    std::fs::create_dir(&ssh).expect("mkdir .ssh");
    std::fs::write(ssh.join("id_rsa"), format!("{secret}\n")).expect("write the fake key");
    home
}

/// Cell probing the network against the test's own TCP and UDP sockets.
fn network_cell(tcp_port: u16, udp_port: u16) -> String {
    format!(
        r#"{ATTEMPT}
import socket
def tcp():
    s = socket.create_connection(("127.0.0.1", {tcp_port}), timeout=10)
    s.close()
    return "connected"
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        return s.sendto(b"ping", ("127.0.0.1", {udp_port}))
    finally:
        s.close()
def ipv6():
    socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    return "created"
def unix_pair():
    a, b = socket.socketpair()
    a.sendall(b"hi")
    got = b.recv(2)
    a.close(); b.close()
    return got
attempt("tcp", tcp)
attempt("udp", udp)
attempt("ipv6", ipv6)
attempt("unix", unix_pair)
"#
    )
}

async fn sandbox_string(server: &StdioServer) -> String {
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(
        !status.is_error,
        "python_sessions status failed: {status:#?}"
    );
    status.structured["server"]["sandbox"]
        .as_str()
        .unwrap_or_else(|| panic!("the status has no server.sandbox: {status:#?}"))
        .to_string()
}

// ------------------------------------------------------------------ network

#[tokio::test]
async fn network_is_off_by_default_but_unix_sockets_work() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a TCP listener");
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    let tcp_port = listener.local_addr().expect("tcp addr").port();
    let udp = UdpSocket::bind("127.0.0.1:0").expect("bind a UDP socket");
    udp.set_nonblocking(true).expect("non-blocking UDP socket");
    let udp_port = udp.local_addr().expect("udp addr").port();

    let mut server = StdioServer::start(&[]).await;
    let out = server.exec(&network_cell(tcp_port, udp_port)).await;
    out.assert_ok();

    assert_denied(&out, "tcp");
    assert_denied(&out, "udp");
    assert_denied(&out, "ipv6");
    assert_eq!(
        outcome(&out, "unix"),
        "OK b'hi'",
        "socketpair() must work: {out:#?}"
    );

    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("the sandboxed cell reached the test's TCP listener from {peer}"),
        Err(e) => panic!("accept on the test's listener failed: {e}"),
    }
    let mut buf = [0u8; 64];
    match udp.recv_from(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((n, peer)) => panic!("the sandboxed cell sent {n} UDP bytes from {peer}"),
        Err(e) => panic!("recv on the test's UDP socket failed: {e}"),
    }

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ filesystem

#[tokio::test]
async fn writes_are_confined_to_the_workspace_and_a_private_home() {
    // One directory outside the view, one the operator shows read-only
    // (--allow-read).
    let outside = tempfile::tempdir().expect("create a directory outside the workspace");
    let target = outside.path().join("escaped.txt");
    let visible = crate::support::visible_outside_dir();
    let visible_target = visible.path().join("escaped.txt");
    let real_home = std::env::var("HOME").unwrap_or_default();

    let visible_arg = visible.path().to_str().expect("utf-8 path");
    let mut server = StdioServer::start(&["--allow-read", visible_arg]).await;
    let inside = server.workdir.path().join("inside.txt");
    let code = format!(
        r#"{ATTEMPT}
import os
def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return "written"
attempt("outside", lambda: write({target}, "escaped"))
attempt("outside_visible", lambda: write({visible_target}, "escaped"))
attempt("inside", lambda: write({inside}, "kept"))
attempt("home", lambda: write(os.path.join(os.environ["HOME"], "probe.txt"), "h"))
attempt("tmpdir", lambda: write(os.path.join(os.environ["TMPDIR"], "probe.txt"), "t"))
print("HOME=" + os.environ["HOME"])
print("TMPDIR=" + os.environ["TMPDIR"])
"#,
        target = py_path(&target),
        visible_target = py_path(&visible_target),
        inside = py_path(&inside),
    );
    let out = server.exec(&code).await;
    out.assert_ok();

    assert_denied_or_hidden(&out, "outside");
    assert_denied(&out, "outside_visible");
    for path in [&target, &visible_target] {
        assert!(
            !path.exists(),
            "{} was created outside the workspace",
            path.display()
        );
    }

    assert_succeeded(&out, "inside");
    assert_eq!(
        std::fs::read_to_string(&inside).expect("read the file the cell wrote"),
        "kept"
    );

    assert_succeeded(&out, "home");
    assert_succeeded(&out, "tmpdir");
    let stdout = out.str_field("stdout");
    let value_of = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} line in {stdout:?}"))
            .to_string()
    };
    let home = value_of("HOME=");
    let tmpdir = value_of("TMPDIR=");
    for (name, dir) in [("HOME", &home), ("TMPDIR", &tmpdir)] {
        assert!(!dir.is_empty(), "{name} is empty in the session");
        if !real_home.is_empty() {
            assert_ne!(
                Path::new(dir),
                Path::new(&real_home),
                "{name} of the session is the real HOME"
            );
            assert!(
                !Path::new(dir).starts_with(&real_home),
                "{name} of the session ({dir}) is inside the real HOME ({real_home})"
            );
        }
    }

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn read_only_sandbox_refuses_workspace_writes_but_allows_tmpdir() {
    let mut server = StdioServer::start(&["--sandbox", "read-only"]).await;
    let inside = server.workdir.path().join("inside.txt");
    let code = format!(
        r#"{ATTEMPT}
import os
def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return "written"
attempt("workspace", lambda: write({inside}, "nope"))
attempt("tmpdir", lambda: write(os.path.join(os.environ["TMPDIR"], "probe.txt"), "t"))
"#,
        inside = py_path(&inside),
    );
    let out = server.exec(&code).await;
    out.assert_ok();
    assert_denied(&out, "workspace");
    assert!(
        !inside.exists(),
        "{} was written under --sandbox read-only",
        inside.display()
    );
    assert_succeeded(&out, "tmpdir");

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn secrets_in_the_home_directory_cannot_be_read() {
    let secret = unique("SECRET-");
    let home = fake_home(&secret);
    let key = home.path().join(".ssh").join("id_rsa");
    let home_str = home.path().to_str().expect("UTF-8 home").to_string();

    let mut server = StdioServer::start_with_env(&[], &[("HOME", home_str.as_str())]).await;
    assert!(
        !server.workdir.path().starts_with(home.path()),
        "the workspace must be outside the fake HOME"
    );
    let out = server
        .exec(&format!("open({}).read()", py_path(&key)))
        .await;
    // The home is hidden: refused, or (covered by an empty tmpfs) not there.
    assert!(
        out.is_error && out.status() == "error",
        "reading the key must raise: {out:#?}"
    );
    assert!(
        matches!(out.error_type(), "PermissionError" | "FileNotFoundError"),
        "reading the key must raise PermissionError or FileNotFoundError: {out:#?}"
    );
    let all = everything(&out);
    assert!(
        !all.contains("SECRET"),
        "the secret leaked into the result: {all}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ limits

#[tokio::test]
async fn a_fork_bomb_is_stopped_and_leaves_nothing_behind() {
    let marker = unique("ferrepl-bomb-");
    let _reaper = Reaper::of_marker(&marker);
    let mut server = StdioServer::start(&["--max-processes", "64"]).await;

    let bystander = server.exec_in("bystander", "1 + 1").await;
    bystander.assert_ok();

    // Children exec `sleep` with the marker as argv[0]; the parent keeps
    // forking. The kernel refuses forks at --max-processes (RLIMIT_NPROC of
    // the session's uid): the cell says so and ends, and deleting the
    // session ends its children. Where the session runs as root (a root
    // server without namespaces: RLIMIT_NPROC does not bind root) the
    // parent holds on until the process-tree watch kills the tree.
    let code = format!(
        r#"
import os, shutil, time
sleep = shutil.which("sleep")
n = 0
for _ in range(1000):
    try:
        pid = os.fork()
    except OSError as e:
        print("REFUSED", e.errno, n)
        break
    if pid == 0:
        try:
            os.execv(sleep, [{marker}, "6001"])
        finally:
            os._exit(0)
    n += 1
else:
    time.sleep(60)
"#,
        marker = py(&marker)
    );
    let bomb = exec_wait(&server, "default", &code, KILL_WAIT_S).await;
    let refused = bomb
        .str_field("stdout")
        .lines()
        .find_map(|l| l.strip_prefix("REFUSED "))
        .map(str::to_string);
    if let Some(refused) = refused {
        let mut f = refused.split_whitespace();
        assert_eq!(
            f.next(),
            Some(libc::EAGAIN.to_string().as_str()),
            "{bomb:#?}"
        );
        let forked: u32 = f.next().and_then(|n| n.parse().ok()).expect("a count");
        assert!(forked < 64, "{forked} forks under --max-processes 64");
        bomb.assert_ok();
        let deleted = server
            .call(
                "python_sessions",
                json!({ "action": "delete", "session": "default" }),
            )
            .await;
        assert!(!deleted.is_error, "{deleted:#?}");
    } else {
        assert!(bomb.is_error, "the fork bomb must be an error: {bomb:#?}");
        assert_eq!(bomb.status(), "crashed", "{bomb:#?}");
        let notes = bomb.notes_text();
        assert!(
            notes.contains("limit of 64 processes") || notes.contains("memory limit"),
            "the notes must name the process (or memory) limit: {notes:?}; result: {bomb:#?}"
        );
        assert!(
            bomb.text.contains("limit of 64 processes") || bomb.text.contains("memory limit"),
            "the text must name the limit: {:?}",
            bomb.text
        );
    }

    server.assert_alive();
    let other = server.exec_in("bystander", "1 + 1").await;
    other.assert_ok();
    assert_eq!(other.value(), Some("2"));

    let left = wait_no_process_with_arg(&marker, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "{} bomb processes still alive after {GONE_TIMEOUT:?}: {left:?}",
        left.len()
    );

    let after = server.exec("'alive'").await;
    after.assert_ok();
    assert_eq!(after.value(), Some("'alive'"));
    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn a_memory_hog_is_killed_and_the_session_restarts() {
    let mut server = StdioServer::start(&["--memory-limit", "300M"]).await;
    server.exec("before = 1").await.assert_ok();

    // bytearray(n) zero-fills its buffer, so all of it is resident; the cell
    // then holds it until the server kills the session.
    let hog = exec_wait(
        &server,
        "default",
        "import time\nx = bytearray(800 * 1024 * 1024)\nx[::4096] = b'\\x01' * len(x[::4096])\ntime.sleep(60)",
        KILL_WAIT_S,
    )
    .await;
    assert!(hog.is_error, "the memory hog must be an error: {hog:#?}");
    assert_eq!(hog.status(), "crashed", "{hog:#?}");
    let notes = hog.notes_text();
    assert!(
        notes.contains("memory limit"),
        "the notes must name the memory limit: {notes:?}; result: {hog:#?}"
    );
    assert!(
        hog.text.contains("memory limit"),
        "the text must name the memory limit: {:?}",
        hog.text
    );

    server.assert_alive();
    let after = server.exec("1 + 1").await;
    after.assert_ok();
    assert_eq!(after.value(), Some("2"));
    assert!(
        after.text.to_lowercase().contains("lost"),
        "the first cell after the kill must say the state was lost: {:?}",
        after.text
    );
    server.exec("before").await.assert_raised("NameError");
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ process cleanup

/// Starts a daemonized (setsid) `sleep 6002` from `session` and returns its
/// host pid once it is running (the pid file holds its pid in the session's
/// own PID namespace).
async fn start_daemon(
    server: &StdioServer,
    session: &str,
    pid_file: &Path,
    reaper: &mut Reaper,
) -> u32 {
    let script = format!("sleep 6002 & echo $! > {}; wait", pid_file.display());
    let code = format!(
        "import subprocess\n_daemon = subprocess.Popen(['setsid', 'sh', '-c', {}])",
        py(&script)
    );
    server.exec_in(session, &code).await.assert_ok();
    let namespace = session_pid_namespace(server, session).await;
    let line = wait_for_file_line(pid_file, Duration::from_secs(15)).await;
    let inner: u32 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("bad pid file content {line:?}"));
    let pid = host_pid_in_namespace(&namespace, inner);
    reaper.pids.push((pid, "6002".into()));
    // `$!` is known before the forked shell has exec'd sleep: poll (bounded)
    // until the pid runs `sleep 6002`.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !cmdline(pid).is_some_and(|argv| argv.iter().any(|a| a == "6002")) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pid {pid} from {} did not become a live `sleep 6002` (argv {:?})",
            pid_file.display(),
            cmdline(pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pid
}

#[tokio::test]
async fn reset_and_delete_kill_daemonized_grandchildren() {
    let mut server = StdioServer::start(&[]).await;
    let mut reaper = Reaper::default();

    let pid_file = server.workdir.path().join("d.pid");
    let pid = start_daemon(&server, "default", &pid_file, &mut reaper).await;
    let reset = server
        .call(
            "python_sessions",
            json!({ "action": "reset", "session": "default" }),
        )
        .await;
    assert!(!reset.is_error, "reset failed: {reset:#?}");
    assert!(
        wait_process_gone(pid, GONE_TIMEOUT).await,
        "the daemonized sleep (pid {pid}) survived a reset (python_sessions reset)"
    );

    let pid_file = server.workdir.path().join("d2.pid");
    let pid2 = start_daemon(&server, "named", &pid_file, &mut reaper).await;
    let deleted = server
        .call(
            "python_sessions",
            json!({ "action": "delete", "session": "named" }),
        )
        .await;
    assert!(!deleted.is_error, "delete failed: {deleted:#?}");
    assert!(
        wait_process_gone(pid2, GONE_TIMEOUT).await,
        "the daemonized sleep (pid {pid2}) survived python_sessions delete"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ sandbox off

#[tokio::test]
async fn sandbox_off_with_network_on_allows_everything() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a TCP listener");
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    let tcp_port = listener.local_addr().expect("tcp addr").port();
    let udp = UdpSocket::bind("127.0.0.1:0").expect("bind a UDP socket");
    let udp_port = udp.local_addr().expect("udp addr").port();

    let secret = unique("SECRET-");
    let home = fake_home(&secret);
    let key = home.path().join(".ssh").join("id_rsa");
    let home_str = home.path().to_str().expect("UTF-8 home").to_string();
    let outside = tempfile::tempdir().expect("create a directory outside the workspace");
    let target = outside.path().join("written.txt");

    let mut server = StdioServer::start_with_env(
        &["--sandbox", "off", "--network", "on"],
        &[("HOME", home_str.as_str())],
    )
    .await;

    let out = server.exec(&network_cell(tcp_port, udp_port)).await;
    out.assert_ok();
    assert_eq!(outcome(&out, "tcp"), "OK 'connected'", "{out:#?}");
    match listener.accept() {
        Ok(_) => {}
        Err(e) => panic!("the test's listener has no connection from the cell: {e}"),
    }

    let code = format!(
        r#"{ATTEMPT}
def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return "written"
def read(path):
    with open(path) as f:
        return f.read()
attempt("outside", lambda: write({target}, "out"))
attempt("secret", lambda: read({key}))
"#,
        target = py_path(&target),
        key = py_path(&key),
    );
    let out = server.exec(&code).await;
    out.assert_ok();
    assert_succeeded(&out, "outside");
    assert_eq!(
        std::fs::read_to_string(&target).expect("the file written outside the workspace"),
        "out"
    );
    assert!(
        outcome(&out, "secret").contains(&secret),
        "the fake key should be readable with --sandbox off: {out:#?}"
    );

    assert!(
        sandbox_string(&server).await.contains("OFF"),
        "the status must say the sandbox is OFF"
    );
    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ shell jobs

#[tokio::test]
async fn shell_jobs_are_confined_too() {
    let outside = tempfile::tempdir().expect("create a directory outside the workspace");
    let target = outside.path().join("x");
    let mut server = StdioServer::start(&[]).await;

    let touch = server
        .call(
            "shell_exec",
            json!({ "command": format!("touch {}; echo rc=$?", target.display()) }),
        )
        .await;
    assert_eq!(touch.str_field("status"), "exited", "{touch:#?}");
    let stdout = touch.str_field("stdout");
    let rc = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("rc="))
        .unwrap_or_else(|| panic!("no rc= line in the job's stdout: {touch:#?}"));
    assert_ne!(rc, "0", "touch outside the workspace succeeded: {touch:#?}");
    assert!(
        !target.exists(),
        "the job created {} outside the workspace",
        target.display()
    );

    let net = server
        .call(
            "shell_exec",
            json!({ "command": "python3 -c \"import socket; socket.socket(); print('socket created')\"" }),
        )
        .await;
    assert_eq!(net.str_field("status"), "exited", "{net:#?}");
    let code = net.structured["exit_code"].as_i64();
    assert!(
        code.is_some_and(|c| c != 0),
        "creating an internet socket in a job should fail: {net:#?}"
    );
    let combined = format!("{}\n{}", net.str_field("stdout"), net.str_field("stderr"));
    assert!(
        !combined.contains("socket created"),
        "the job created an internet socket: {net:#?}"
    );
    assert!(
        combined.contains("PermissionError") || combined.contains("Operation not permitted"),
        "the job should fail on the socket with a permission error: {net:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ status and startup

#[tokio::test]
async fn sessions_status_describes_the_default_sandbox() {
    let mut server = StdioServer::start(&[]).await;
    let sandbox = sandbox_string(&server).await;
    for needle in ["Landlock", "seccomp", "network off"] {
        assert!(
            sandbox.contains(needle),
            "the status's sandbox should mention {needle:?}: {sandbox:?}"
        );
    }
    assert!(
        !sandbox.contains("OFF"),
        "the default sandbox must not be OFF: {sandbox:?}"
    );
    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn sessions_status_says_off_when_the_sandbox_is_off() {
    let mut server = StdioServer::start(&["--sandbox", "off"]).await;
    let sandbox = sandbox_string(&server).await;
    assert!(
        sandbox.contains("OFF"),
        "the status's sandbox should say OFF: {sandbox:?}"
    );
    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn sandbox_require_starts_when_everything_is_available() {
    let mut server = StdioServer::start(&["--sandbox-require"]).await;
    let out = server.exec("1 + 1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("2"));
    let sandbox = sandbox_string(&server).await;
    assert!(
        sandbox.contains("Landlock") && sandbox.contains("seccomp"),
        "{sandbox:?}"
    );
    server.assert_alive();
    server.close_and_wait().await;
}

/// Where cgroups can be made (as on this machine), every session and job is
/// in its own memory and pids groups, which are removed when it ends; where
/// they cannot, the status (python_sessions {action: "status"}) says the
/// process-tree watch enforces the limits.
#[tokio::test]
async fn limits_are_kernel_enforced_by_cgroups_when_status_says_so() {
    let mut server = StdioServer::start(&["--memory-limit", "300M"]).await;
    let sandbox = sandbox_string(&server).await;
    let out = server
        .exec("print(open('/proc/self/cgroup').read(), end='')")
        .await;
    out.assert_ok();
    let worker_cgroups = out.str_field("stdout").to_string();
    let job = server
        .call("shell_exec", json!({ "command": "cat /proc/self/cgroup" }))
        .await;
    assert!(!job.is_error, "{job:#?}");
    let job_cgroups = job.structured["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    let memory_line = |text: &str| -> String {
        text.lines()
            .find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == "memory"))
            })
            .unwrap_or_default()
            .to_string()
    };
    if sandbox.contains("cgroup v1 memory") {
        let line = memory_line(&worker_cgroups);
        assert!(
            line.contains("/ferrepl-"),
            "status says cgroup, but the worker is not in a ferrepl memory group: {worker_cgroups:?}"
        );
        assert!(
            memory_line(&job_cgroups).contains("/ferrepl-"),
            "status says cgroup, but the job is not in a ferrepl memory group: {job_cgroups:?}"
        );
        let path = line.splitn(3, ':').nth(2).unwrap_or_default();
        let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
        let limit = std::fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap_or_default();
        assert_eq!(
            limit.trim(),
            (300u64 << 20).to_string(),
            "limit of {}",
            dir.display()
        );

        let reset = server
            .call("python_sessions", json!({ "action": "reset" }))
            .await;
        assert!(!reset.is_error, "{reset:#?}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while dir.exists() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the old session's cgroup {} was not removed after reset",
                dir.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        assert!(
            sandbox.contains("process-tree watch"),
            "without cgroups the status must say what enforces the limits: {sandbox:?}"
        );
    }
    server.assert_alive();
    server.close_and_wait().await;
}

/// Threads are not processes to the process-tree watch: a session that
/// starts many (numeric libraries start one per core) is not taken for a
/// fork bomb and killed. The kernel's RLIMIT_NPROC (--max-processes, set
/// on the session's uid) counts threads too: past it a thread is refused
/// (RuntimeError in the cell), and the session lives on.
#[tokio::test]
async fn many_threads_are_not_a_fork_bomb() {
    let mut server = StdioServer::start(&["--max-processes", "64"]).await;
    let code = "import threading\n\
gate = threading.Event()\n\
threads, refused = [], None\n\
for _ in range(600):\n\
\x20   t = threading.Thread(target=gate.wait)\n\
\x20   try:\n\
\x20       t.start()\n\
\x20   except RuntimeError as e:\n\
\x20       refused = str(e)\n\
\x20       break\n\
\x20   threads.append(t)\n\
alive = sum(t.is_alive() for t in threads)\n\
gate.set()\n\
for t in threads:\n    t.join()\n\
(alive, refused)";
    let out = server.exec(code).await;
    out.assert_ok();
    let value = out.value().unwrap_or_default().to_string();
    let started: u32 = value
        .trim_start_matches('(')
        .split(',')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("(alive, refused): {out:#?}"));
    assert!(
        (16..64).contains(&started) && value.contains("can't start new thread"),
        "threads up to the uid's 64 tasks, then refused: {out:#?}"
    );
    let after = server.exec("alive").await;
    after.assert_ok();
    assert_eq!(
        after.value(),
        Some(started.to_string().as_str()),
        "the session survived: {after:#?}"
    );
    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------ ferrepl's own files and the view

/// Runs ferrepl with `args` and `envs` until it exits (it must refuse to
/// start); its stderr.
async fn refused(args: &[&str], envs: &[(&str, &Path)]) -> String {
    let mut cmd = crate::support::server_command();
    cmd.args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("ferrepl exits: it must refuse to start")
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} must be refused: {stderr}");
    stderr
}

#[tokio::test]
async fn ferrepls_own_files_may_not_lie_where_sessions_write() {
    let base = crate::support::visible_outside_dir();
    let (ws, shared) = (base.path().join("ws"), base.path().join("shared"));
    std::fs::create_dir_all(shared.join("t")).expect("mkdir");
    std::fs::create_dir_all(&ws).expect("mkdir");
    let p = |p: &Path| p.to_str().expect("utf-8").to_string();
    // The runtime directory (policies, homes, logs) in an --allow-write path:
    // a session could rewrite the next launcher's policy.
    let stderr = refused(
        &["--workdir", &p(&ws), "--allow-write", &p(&shared)],
        &[("TMPDIR", &shared.join("t"))],
    )
    .await;
    let tmp = shared.join("t");
    assert!(
        stderr.contains(tmp.to_str().expect("utf-8")) && stderr.contains("sessions"),
        "names the runtime directory's place: {stderr}"
    );
    // A tokens file reached through a symlink in the workspace: the agent
    // could point it at its own tokens before a reload.
    let real_tokens = base.path().join("tokens");
    std::fs::write(&real_tokens, "own-files-token-0123456789abcdef\n").expect("write");
    std::os::unix::fs::symlink(&real_tokens, ws.join("tokens")).expect("symlink");
    let stderr = refused(
        &[
            "--workdir",
            &p(&ws),
            "--http",
            "127.0.0.1:0",
            "--auth-token-file",
            &p(&ws.join("tokens")),
        ],
        &[],
    )
    .await;
    assert!(
        stderr.contains("--auth-token-file"),
        "names the flag: {stderr}"
    );
    // A path bound read-only inside one sessions write: swappable.
    let stderr = refused(
        &[
            "--workdir",
            &p(&ws),
            "--allow-write",
            &p(&shared),
            "--allow-read",
            &p(&shared.join("t")),
        ],
        &[],
    )
    .await;
    assert!(
        stderr.contains("which sessions can write"),
        "a nested bind is refused: {stderr}"
    );
}

#[tokio::test]
async fn a_tokens_file_in_a_bound_tool_directory_is_refused_under_every_alias() {
    // A tool directory on PATH, reached directly or through a symlink,
    // holding the tokens file: the view would show it, so the start is
    // refused (a cover would not survive the file's rotation).
    let base = crate::support::visible_outside_dir();
    let tool = base.path().join("tool");
    std::fs::create_dir_all(tool.join("bin")).expect("mkdir");
    std::fs::create_dir_all(tool.join("etc")).expect("mkdir");
    let tokens = tool.join("etc/tokens");
    std::fs::write(&tokens, "alias-token-0123456789abcdef\n").expect("write");
    let alias = base.path().join("alias");
    std::os::unix::fs::symlink(&tool, &alias).expect("symlink");
    let tokens_arg = tokens.to_str().expect("utf-8").to_string();
    let ws = tempfile::tempdir().expect("workspace");
    let ws_arg = ws.path().to_str().expect("utf-8").to_string();
    for entry in [tool.join("bin"), alias.join("bin")] {
        let path = format!(
            "{}:{}",
            entry.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let stderr = refused(
            &["--workdir", &ws_arg, "--auth-token-file", &tokens_arg],
            &[("PATH", Path::new(&path))],
        )
        .await;
        assert!(
            stderr.contains("--auth-token-file") && stderr.contains("which sessions can read"),
            "PATH {}: {stderr}",
            entry.display()
        );
    }
}

#[tokio::test]
async fn only_install_jobs_see_the_operators_ca_bundle() {
    // The operator's pip names a CA bundle outside every allow-listed place.
    let base = crate::support::visible_outside_dir();
    let secret = unique("CA-BUNDLE-");
    let ca = base.path().join("corp-ca.pem");
    std::fs::write(&ca, format!("{secret}\n")).expect("write the bundle");
    let ca_arg = ca.to_str().expect("utf-8").to_string();
    let server = StdioServer::start_with_env(&[], &[("PIP_CERT", ca_arg.as_str())]).await;
    let ws = server.workdir.path().to_path_buf();
    let cell = format!(
        r#"{ATTEMPT}
import subprocess, sys, glob, os
attempt('bundle', lambda: open({ca}).read())
subprocess.run([sys.executable, '-m', 'venv', '--without-pip', 'venv'], check=True)
site = glob.glob('venv/lib/python*/site-packages')[0]
line = "import os; open(%r, 'w').write(repr(open(os.environ['SSL_CERT_FILE']).read()))\n" % {report}
open(os.path.join(site, 'zz_ca_probe.pth'), 'w').write(line)
"#,
        ca = py_path(&ca),
        report = py(path_str(&ws.join("ca-report.txt"))),
    );
    let out = server.exec(&cell).await;
    out.assert_ok();
    assert!(
        !outcome(&out, "bundle").starts_with("OK"),
        "a cell must not see the installers' bundle: {out:#?}"
    );
    let created = server
        .call(
            "python_sessions",
            json!({ "action": "create", "session": "v", "venv": path_str(&ws.join("venv")) }),
        )
        .await;
    assert!(!created.is_error, "{created:#?}");
    let mut install = server
        .call(
            "python_install",
            json!({ "packages": ["ferrepl-ca-probe-not-a-package"], "session": "v", "wait_s": 50 }),
        )
        .await;
    let job = install.str_field("job").to_string();
    for _ in 0..10 {
        if install.structured["status"] != "running" {
            break;
        }
        install = server
            .call("shell_wait", json!({ "job": job, "wait_s": 50 }))
            .await;
    }
    let report = std::fs::read_to_string(ws.join("ca-report.txt"))
        .unwrap_or_else(|e| panic!("the install job left no report ({e}): {install:#?}"));
    assert!(
        report.contains(&secret),
        "the install job reads the operator's CA bundle: {report}"
    );
}
