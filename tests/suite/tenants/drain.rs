//! Draining on SIGTERM: running cells finish, an uncollected result does not
//! hold the drain, a second SIGTERM ends it at once.

use std::time::Duration;

use super::{ALPHA, BETA, get, serve, signal_logged, start, tokens_file};
use crate::support::{Recorder, call, finish, py_path, session_row, start_call};
use serde_json::json;

/// SIGTERM: not ready at once, new sessions refused (retryable), the
/// running cell finishes and the call waiting for it gets its result, then
/// the exit.
#[tokio::test]
async fn sigterm_drains_then_exits() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path(), &format!("{ALPHA} alpha\n{BETA} beta\n"));
    let mut server = start(
        &tokens,
        &["--metrics-addr", "127.0.0.1:0", "--drain-seconds", "60"],
    )
    .await;
    let metrics_port = server
        .metrics_port
        .expect("the metrics listener's port in the log");
    let recorder = Recorder::default();
    let alpha = server
        .try_connect_at("/mcp", recorder.clone(), Some(ALPHA))
        .await
        .expect("connect as alpha");
    let gate = server.workdir.path().join("alpha/gate");
    let code = format!(
        "import os, time\nwhile not os.path.exists({}):\n    time.sleep(0.02)\n'finished'",
        py_path(&gate)
    );
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": code, "wait_s": 0 }),
    )
    .await;
    assert!(out.text.contains("running"), "{out:#?}");

    signal_logged(
        &server,
        nix::sys::signal::Signal::SIGTERM,
        "SIGTERM: draining",
    )
    .await;
    let (code, body) = get(metrics_port, "/readyz", &[]).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("draining"), "{body}");
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": "1", "session": "another" }),
    )
    .await;
    assert!(
        out.is_error && out.text.contains("draining") && out.text.contains("retry"),
        "{out:#?}"
    );
    let (_, metrics) = get(metrics_port, "/metrics", &[]).await;
    assert!(
        metrics.contains("ferrepl_draining 1")
            && metrics.contains(r#"ferrepl_admission_refusals_total{reason="draining"} 1"#),
        "{metrics}"
    );

    // A token revoked during the drain stops working at once.
    let host = format!("127.0.0.1:{}", server.port);
    let beta_auth = format!("Bearer {BETA}");
    let as_beta = [
        ("Host", host.as_str()),
        ("Authorization", beta_auth.as_str()),
    ];
    assert_eq!(get(server.port, "/healthz", &as_beta).await.0, 200);
    tokens_file(dir.path(), &format!("{ALPHA} alpha\n"));
    signal_logged(
        &server,
        nix::sys::signal::Signal::SIGHUP,
        "SIGHUP: tokens reloaded",
    )
    .await;
    assert_eq!(get(server.port, "/healthz", &as_beta).await.0, 401);

    // The cell is let finish and the call waiting for it (in flight: its
    // first progress report arrived) gets its result.
    let waiting = start_call(alpha.peer(), "python_wait", json!({ "wait_s": 60 })).await;
    let token = waiting.progress_token.clone();
    recorder.wait_progress(&token, |_| true).await;
    std::fs::write(&gate, "").unwrap();
    let out = finish(waiting).await;
    assert!(out.text.contains("finished"), "{out:#?}");
    exits_drained(&mut server, "the drained server exits by itself").await;
}

/// A result no call is collecting does not hold the drain: with no cell
/// running, SIGTERM exits at once (the result stays in the store).
#[tokio::test]
async fn an_uncollected_result_does_not_hold_the_drain() {
    let (_dir, mut server) = serve(&format!("{ALPHA} alpha\n"), &["--drain-seconds", "60"]).await;
    let alpha = server.connect_at("/mcp", ALPHA).await;
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": "import time; time.sleep(0.5); 'done'", "wait_s": 0 }),
    )
    .await;
    assert!(out.text.contains("running"), "{out:#?}");
    // It finishes with no call collecting it (the state changes with no
    // notification, so this polls the listing, which collects nothing).
    let finished = async {
        loop {
            if session_row(alpha.peer(), "default").await["state"] == "idle" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), finished)
        .await
        .expect("the cell finishes");
    signal_logged(
        &server,
        nix::sys::signal::Signal::SIGTERM,
        "SIGTERM: draining",
    )
    .await;
    // Far inside the 60 s drain.
    exits_drained(
        &mut server,
        "a drain holding only an uncollected result ends at once",
    )
    .await;
}

#[tokio::test]
async fn a_second_sigterm_ends_the_drain_at_once() {
    let (_dir, mut server) = serve(&format!("{ALPHA} alpha\n"), &["--drain-seconds", "600"]).await;
    let alpha = server.connect_at("/mcp", ALPHA).await;
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": "import time; time.sleep(3600)", "wait_s": 0 }),
    )
    .await;
    assert!(out.text.contains("running"), "{out:#?}");
    signal_logged(
        &server,
        nix::sys::signal::Signal::SIGTERM,
        "SIGTERM: draining",
    )
    .await;
    let pid = nix::unistd::Pid::from_raw(server.child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    // Well inside the 600 s drain.
    let status = tokio::time::timeout(Duration::from_secs(60), server.child.wait())
        .await
        .expect("a second SIGTERM must end the server")
        .expect("wait");
    assert!(status.success(), "{status}");
    assert!(server.stderr_log().contains("second SIGTERM"));
}

/// The server exits by itself within 30 s (far inside the drains these
/// tests give), successfully, saying it drained.
async fn exits_drained(server: &mut crate::support::HttpServer, why: &str) {
    let status = tokio::time::timeout(Duration::from_secs(30), server.child.wait())
        .await
        .unwrap_or_else(|_| panic!("{why}"))
        .expect("wait");
    assert!(status.success(), "{status}");
    assert!(
        server.stderr_log().contains("drained"),
        "{}",
        server.stderr_log()
    );
}
