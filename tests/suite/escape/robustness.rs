//! Secrets out of reach and nothing left behind (issue 10, classes 4 and 7):
//!
//! * the HTTP bearer token need not be on the command line: given there, the
//!   server warns; `--auth-token-file` works and the token stays out of the
//!   server's argv;
//! * the server's state directory is `<TMPDIR>/ferrepl-<uid>/<pid>/` with a
//!   private (0700) parent, and no session can list it or read another
//!   session's temporary files;
//! * when the server is SIGKILLed, no session process (double-forked daemons
//!   included) survives, and the next start removes the dead server's state.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::support::{
    ATTEMPT, HttpServer, Launch, Reaper, StdioServer, assert_failed, call, everything,
    mcp_post_headers, outcome, own_uid, path_str, process_alive, processes_with_arg, py, py_path,
    raw_post_mcp, unique, wait_process_gone,
};

/// Upper bound for processes of a killed server to disappear, and for a
/// directory to appear or be removed.
const GONE_TIMEOUT: Duration = Duration::from_secs(15);

// ------------------------------------------------------------------ helpers

/// A stdio server started with `TMPDIR=<tmpdir>` and no XDG_RUNTIME_DIR, so
/// its state directory is `<tmpdir>/ferrepl-<uid>/<pid>`.
async fn start_server(tmpdir: &Path) -> StdioServer {
    StdioServer::launch(
        Launch::new(&[])
            .env("TMPDIR", tmpdir)
            .env_remove("XDG_RUNTIME_DIR"),
    )
    .await
}

/// Where a server started with TMPDIR=`tmpdir` keeps its state.
fn state_dir(tmpdir: &Path, server_pid: u32) -> PathBuf {
    tmpdir
        .join(format!("ferrepl-{}", own_uid()))
        .join(server_pid.to_string())
}

/// Bounded poll until `cond` holds; false on timeout.
async fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything below `dir`, for failure messages.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if out.len() > 200 {
            break;
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.filter_map(Result::ok) {
                let p = e.path();
                out.push(p.display().to_string());
                if p.is_dir() && !p.is_symlink() {
                    stack.push(p);
                }
            }
        }
    }
    out
}

// ------------------------------------------------------------------ G: the token

#[tokio::test]
async fn the_auth_token_need_not_be_on_the_command_line() {
    // Given on the command line, it works but the server warns.
    let token = unique("tok-");
    let server = HttpServer::start(&["--auth-token", &token], &[]).await;
    let warned = poll_until(Duration::from_secs(10), || {
        server.stderr_log().contains("auth-token-file")
    })
    .await;
    assert!(
        warned,
        "--auth-token on the command line must warn (naming --auth-token-file); stderr:\n{}",
        server.stderr_log()
    );
    drop(server);

    // From a file it works, and the token is nowhere in the server's argv.
    let token = unique("tok-");
    let dir = tempfile::tempdir().expect("create a directory for the token file");
    let file = dir.path().join("token");
    std::fs::write(&file, &token).expect("write the token file");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
        .expect("chmod the token file");
    let mut server = HttpServer::start(&["--auth-token-file", path_str(&file)], &[]).await;
    let pid = server.child.id().expect("the server's pid");
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).expect("read the server's cmdline");
    assert!(
        !String::from_utf8_lossy(&argv).contains(&token),
        "the token is on the server's command line"
    );

    let client = server.connect(Some(&token)).await;
    let status = call(
        client.peer(),
        "python_sessions",
        json!({ "action": "status" }),
    )
    .await;
    assert!(
        !status.is_error,
        "a client with the token must be served: {status:#?}"
    );
    let _ = client.cancel().await;

    let port = server.port;
    let (code, head) = raw_post_mcp(port, &mcp_post_headers(port)).await;
    assert_eq!(code, 401, "a client without the token: {head}");
    let mut wrong = mcp_post_headers(port);
    wrong.push(("Authorization", format!("Bearer {token}x")));
    let (code, head) = raw_post_mcp(port, &wrong).await;
    assert_eq!(code, 401, "a client with a wrong token: {head}");
    assert!(
        !server.stderr_log().contains(&token),
        "the token was logged: {}",
        server.stderr_log()
    );
    server.assert_alive();
}

// ------------------------------------------------------------------ G: the state directory

#[tokio::test]
async fn the_state_directory_is_private() {
    let tmp = tempfile::tempdir().expect("create the server's TMPDIR");
    let secret = unique("TMP-SECRET-");
    let server = start_server(tmp.path()).await;
    let state = state_dir(tmp.path(), server.pid());
    let parent = state.parent().expect("a parent").to_path_buf();

    // Session A leaves a secret in its temporary directory.
    let code = format!(
        "import os\n_p = os.path.join(os.environ['TMPDIR'], 'a-secret.txt')\n\
with open(_p, 'w') as _f:\n    _f.write({secret})\n_p",
        secret = py(&secret)
    );
    let a = server.exec_in("a", &code).await;
    a.assert_ok();
    let a_file = a
        .value()
        .and_then(|v| v.strip_prefix('\'')?.strip_suffix('\''))
        .unwrap_or_else(|| panic!("session a did not return its file's path: {a:#?}"))
        .to_string();

    let exists = poll_until(GONE_TIMEOUT, || state.is_dir()).await;
    assert!(
        exists,
        "the server's state directory {} does not exist; {} holds {:?}",
        state.display(),
        tmp.path().display(),
        tree(tmp.path())
    );
    let meta = std::fs::metadata(&parent).expect("stat the state directory's parent");
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o700,
        "{} must be private (0700)",
        parent.display()
    );
    assert_eq!(meta.uid(), own_uid(), "{} must be ours", parent.display());

    // Neither session can list the state, nor can B read A's file.
    let probe = format!(
        r#"{ATTEMPT}
import os
attempt("list_state", lambda: os.listdir({state}))
attempt("list_parent", lambda: os.listdir({parent}))
attempt("read_a", lambda: open({a_file}).read())
"#,
        state = py_path(&state),
        parent = py_path(&parent),
        a_file = py(&a_file),
    );
    for session in ["a", "b"] {
        let out = server.exec_in(session, &probe).await;
        out.assert_ok();
        assert_failed(&out, "list_state", "the state directory is private");
        assert_failed(&out, "list_parent", "the state directory is private");
        if session == "b" {
            assert_failed(&out, "read_a", "another session's temporary directory");
            assert!(
                !everything(&out).contains(&secret),
                "session b read session a's secret: {out:#?}"
            );
        } else {
            // Session a may read its own file: the probe proves it exists.
            let own = outcome(&out, "read_a");
            assert!(
                own.starts_with("OK"),
                "session a must read its own temporary file: {out:#?}"
            );
        }
    }
    server.close_and_wait_at_most(GONE_TIMEOUT).await;
}

// ------------------------------------------------------------------ H: SIGKILL

/// Cell that double-forks a daemon (`setsid` between the forks) running
/// `sleep` with `marker` as its argv[0]; with `hold` it keeps running, so
/// the server is killed in the middle of a cell.
fn daemon_cell(marker: &str, hold: bool) -> String {
    format!(
        r#"
import os, shutil, time
_sleep = shutil.which("sleep")
_pid = os.fork()
if _pid == 0:
    try:
        os.setsid()
        if os.fork() == 0:
            os.execv(_sleep, [{marker}, "1000"])
    finally:
        os._exit(0)
os.waitpid(_pid, 0)
if {hold}:
    time.sleep(1000)
"#,
        marker = py(marker),
        hold = if hold { "True" } else { "False" },
    )
}

/// Runs `daemon_cell` in the default session, waits (bounded) for the
/// daemon to run, and returns the session's pid as the server reports it
/// (a host pid: inside its PID namespace the session sees other numbers).
async fn start_daemon(server: &StdioServer, marker: &str, hold: bool) -> u32 {
    let out = call(
        server.peer(),
        "python_exec",
        json!({ "code": daemon_cell(marker, hold), "wait_s": if hold { 1.0 } else { 30.0 } }),
    )
    .await;
    let expected = if hold { "running" } else { "ok" };
    assert_eq!(out.status(), expected, "the daemon cell: {out:#?}");
    let started = poll_until(GONE_TIMEOUT, || !processes_with_arg(marker).is_empty()).await;
    assert!(started, "the daemon did not start: {out:#?}");
    let list = call(server.peer(), "python_sessions", json!({})).await;
    list.structured["sessions"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == "default"))
        .and_then(|s| s["pid"].as_u64())
        .and_then(|pid| u32::try_from(pid).ok())
        .unwrap_or_else(|| panic!("no pid for the default session in {list:#?}"))
}

#[tokio::test]
async fn nothing_outlives_a_sigkilled_server() {
    let tmp = tempfile::tempdir().expect("create the servers' TMPDIR");
    let mut reaper = Reaper::default();
    let mut stale: Option<PathBuf> = None;
    for round in 1..=5 {
        let server = start_server(tmp.path()).await;
        if let Some(old) = stale.take() {
            let removed = poll_until(GONE_TIMEOUT, || !old.exists()).await;
            assert!(
                removed,
                "round {round}: a new server did not remove the dead server's {}",
                old.display()
            );
        }
        let marker = unique("ferrepl-orphan-");
        reaper.markers.push(marker.clone());
        // Odd rounds: the cell has finished; even rounds: it is running.
        let worker = start_daemon(&server, &marker, round % 2 == 0).await;
        assert!(
            process_alive(worker),
            "round {round}: the session's process {worker} is not running"
        );
        let state = state_dir(tmp.path(), server.pid());
        let exists = poll_until(GONE_TIMEOUT, || state.is_dir()).await;
        assert!(
            exists,
            "round {round}: the server's state directory {} does not exist; {} holds {:?}",
            state.display(),
            tmp.path().display(),
            tree(tmp.path())
        );

        server.sigkill_and_reap(GONE_TIMEOUT).await;
        let mut left = Vec::new();
        let gone = poll_until(GONE_TIMEOUT, || {
            left = processes_with_arg(&marker);
            left.is_empty()
        })
        .await;
        assert!(
            gone,
            "round {round}: the double-forked daemon survived the server's SIGKILL for {GONE_TIMEOUT:?}: pids {left:?}"
        );
        assert!(
            wait_process_gone(worker, GONE_TIMEOUT).await,
            "round {round}: the session's process {worker} survived the server's SIGKILL"
        );
        stale = Some(state);
    }

    let server = start_server(tmp.path()).await;
    let old = stale.expect("the last round's state directory");
    let removed = poll_until(GONE_TIMEOUT, || !old.exists()).await;
    assert!(
        removed,
        "a new server did not remove the dead server's {}",
        old.display()
    );
    let out = server.exec_in("default", "1 + 1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("2"));
    server.close_and_wait_at_most(GONE_TIMEOUT).await;
}
