//! The warm pool (--warm-pool N): interpreters started ahead of need serve
//! new sessions and resets, each still its own sandboxed process; with 0,
//! every interpreter starts on demand; shutdown leaves none behind.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{EXIT_TIMEOUT, StdioServer, descendants, wait_process_gone};

/// How old the interpreter running the cell is, in seconds (from its start
/// time in /proc, in clock ticks since boot).
const PROCESS_AGE: &str = "import os\n\
with open('/proc/self/stat') as f: start = int(f.read().rsplit(')', 1)[1].split()[19])\n\
with open('/proc/uptime') as f: up = float(f.read().split()[0])\n\
round(up - start / os.sysconf('SC_CLK_TCK'), 3)";

/// A gap the pooled interpreters' age must show: they were started before it.
const GAP: Duration = Duration::from_millis(400);

async fn pool_ready(server: &StdioServer) -> Option<usize> {
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "status failed: {status:#?}");
    let line = status
        .text
        .lines()
        .find_map(|l| l.strip_prefix("warm pool: "))?;
    line.split_whitespace().next()?.parse().ok()
}

/// Waits (bounded) until the pool holds `n` ready interpreters.
pub(crate) async fn wait_pool_full(server: &StdioServer, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if pool_ready(server).await == Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the warm pool did not fill to {n} within 60 s; stderr:\n{}",
            server.stderr_log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn interpreter_age(server: &StdioServer, session: &str) -> f64 {
    let out = server.exec_in(session, PROCESS_AGE).await;
    out.assert_ok();
    out.value()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no age in {out:#?}"))
}

#[tokio::test]
async fn new_sessions_and_resets_take_interpreters_started_before_they_were_asked_for() {
    let server = StdioServer::start(&["--warm-pool", "3"]).await;
    wait_pool_full(&server, 3).await;
    tokio::time::sleep(GAP).await;
    for name in ["a", "b", "c"] {
        let age = interpreter_age(&server, name).await;
        assert!(
            age >= GAP.as_secs_f64() - 0.02,
            "session {name}'s interpreter is {age} s old: it was not taken from the pool"
        );
    }
    // Sessions taken from the pool are separate interpreters.
    server.exec_in("a", "shared = 1").await.assert_ok();
    server
        .exec_in("b", "shared")
        .await
        .assert_raised("NameError");

    wait_pool_full(&server, 3).await;
    tokio::time::sleep(GAP).await;
    let reset = server
        .call(
            "python_sessions",
            json!({ "action": "reset", "session": "a" }),
        )
        .await;
    assert!(!reset.is_error, "reset failed: {reset:#?}");
    let age = interpreter_age(&server, "a").await;
    assert!(
        age >= GAP.as_secs_f64() - 0.02,
        "after reset, session a's interpreter is {age} s old: not from the pool"
    );
    server
        .exec_in("a", "shared")
        .await
        .assert_raised("NameError");
}

#[tokio::test]
async fn pooled_interpreters_each_have_their_own_private_tmp() {
    let server = StdioServer::start(&["--warm-pool", "2"]).await;
    wait_pool_full(&server, 2).await;
    let mark = server
        .exec_in(
            "p",
            "import os, tempfile\n\
             mark = os.path.join(tempfile.gettempdir(), 'ferrepl-pool-mark')\n\
             open(mark, 'w').write('p')\n\
             mark",
        )
        .await;
    mark.assert_ok();
    let mark = mark.value().unwrap_or_else(|| panic!("no path: {mark:#?}"));
    let seen = server
        .exec_in("q", &format!("import os; os.path.exists({mark})"))
        .await;
    seen.assert_ok();
    assert_eq!(
        seen.value(),
        Some("False"),
        "a pooled interpreter sees another session's temp dir ({mark})"
    );
}

#[tokio::test]
async fn without_a_pool_each_interpreter_starts_when_asked_for() {
    let server = StdioServer::start(&["--warm-pool", "0"]).await;
    assert_eq!(
        pool_ready(&server).await,
        None,
        "status shows a warm pool with --warm-pool 0"
    );
    // Whatever was started with the server (the default session) is done
    // starting by now; the gap makes anything started earlier look old.
    server.exec("1").await.assert_ok();
    tokio::time::sleep(GAP).await;
    let asked = Instant::now();
    let age = interpreter_age(&server, "fresh").await;
    assert!(
        age <= asked.elapsed().as_secs_f64() + 0.02,
        "with --warm-pool 0 the interpreter is {age} s old, older than the request"
    );
}

#[tokio::test]
async fn shutdown_ends_the_pooled_interpreters() {
    // What a server without a pool runs (the default session), to tell the
    // pooled workers' processes apart from it.
    let plain = StdioServer::start(&["--warm-pool", "0"]).await;
    plain.exec("1").await.assert_ok();
    let without_pool = descendants(plain.pid()).len();
    plain.close_and_wait().await;

    let server = StdioServer::start(&["--warm-pool", "3"]).await;
    server.exec("1").await.assert_ok();
    wait_pool_full(&server, 3).await;
    let before = descendants(server.pid());
    assert!(
        before.len() >= without_pool + 3,
        "expected three pooled interpreters besides the default session's {without_pool} processes: {before:?}"
    );
    server.close_and_wait().await;
    for pid in before {
        assert!(
            wait_process_gone(pid, EXIT_TIMEOUT).await,
            "process {pid} outlived the server"
        );
    }
}

#[tokio::test]
async fn warm_pool_size_is_bounded() {
    let out = std::process::Command::new(crate::support::server_binary())
        .args(["--warm-pool", "65"])
        .output()
        .expect("run ferrepl");
    assert!(!out.status.success(), "--warm-pool 65 was accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--warm-pool") && err.contains("0..=64"),
        "unclear refusal: {err}"
    );
}
