//! Attacks on the arguments the lean surface added: python_wait's input,
//! eof and interrupt, python_sessions' reset and status, shell_wait's input,
//! eof, signal and job-less listing. Each is refused with a message that
//! names what to do, or does exactly what it says and nothing more; the
//! server keeps running.

use crate::support::StdioServer;
use serde_json::json;

async fn server() -> StdioServer {
    StdioServer::start(&["--tools", "all"]).await
}

#[tokio::test]
async fn python_wait_options_cannot_be_combined_or_misused() {
    let server = server().await;
    let both = server
        .call("python_wait", json!({"input": "x", "interrupt": true}))
        .await;
    assert!(both.is_error, "{both:#?}");
    assert!(both.text.contains("not both"), "{both:#?}");

    // Nothing asks for input: the text is not typed anywhere.
    let started = server
        .call(
            "python_exec",
            json!({"code": "import sys\nx = 1", "wait_s": 5}),
        )
        .await;
    assert!(!started.is_error, "{started:#?}");
    let stray = server.call("python_wait", json!({"input": "x = 2"})).await;
    assert!(stray.is_error, "{stray:#?}");
    assert!(stray.text.contains("not waiting for input"), "{stray:#?}");
    let x = server.call("python_exec", json!({"code": "x"})).await;
    assert!(x.text.starts_with("1\n"), "{x:#?}");

    // An answer with NUL and newlines reaches input() as text, one line.
    let asking = server
        .call(
            "python_exec",
            json!({"code": "got = input('? ')\nlen(got), got[:1]", "wait_s": 10}),
        )
        .await;
    assert!(asking.text.contains("waiting_input"), "{asking:#?}");
    let answered = server
        .call("python_wait", json!({"input": "a\u{0}b\nsecond line"}))
        .await;
    assert!(!answered.is_error, "{answered:#?}");
    assert!(answered.text.contains("'a'"), "{answered:#?}");

    // Interrupting an idle session stops nothing and says so.
    let idle = server
        .call(
            "python_wait",
            json!({"session": "never-ran", "interrupt": true}),
        )
        .await;
    assert!(idle.is_error, "{idle:#?}");
    server.call("python_exec", json!({"code": "1"})).await;
}

#[tokio::test]
async fn python_sessions_reset_and_status_touch_only_what_they_name() {
    let server = server().await;
    let bad = server
        .call(
            "python_sessions",
            json!({"action": "reset", "session": "../escape"}),
        )
        .await;
    assert!(bad.is_error, "{bad:#?}");
    let unknown = server
        .call(
            "python_sessions",
            json!({"action": "reset", "session": "nobody"}),
        )
        .await;
    assert!(
        unknown.is_error,
        "reset must not create sessions: {unknown:#?}"
    );
    assert!(unknown.text.contains("nobody"), "{unknown:#?}");

    server
        .call(
            "python_exec",
            json!({"code": "keep = 1", "session": "other"}),
        )
        .await;
    let reset = server
        .call("python_sessions", json!({"action": "reset"}))
        .await;
    assert!(!reset.is_error, "{reset:#?}");
    let kept = server
        .call("python_exec", json!({"code": "keep", "session": "other"}))
        .await;
    assert!(
        kept.text.starts_with("1\n"),
        "resetting default spared 'other': {kept:#?}"
    );

    let status = server
        .call(
            "python_sessions",
            json!({"action": "status", "session": "other", "env": {"LD_PRELOAD": "/x.so"}}),
        )
        .await;
    assert!(!status.is_error, "{status:#?}");
    assert!(status.text.contains("sandbox:"), "{status:#?}");
}

#[tokio::test]
async fn shell_wait_signals_and_input_need_a_job_and_a_real_signal() {
    let server = server().await;
    let no_job = server.call("shell_wait", json!({"signal": "KILL"})).await;
    assert!(no_job.is_error, "{no_job:#?}");
    assert!(no_job.text.contains("name the job"), "{no_job:#?}");

    let job = server
        .call("shell_exec", json!({"command": "cat", "wait_s": 0}))
        .await;
    assert!(job.text.contains("job j1"), "{job:#?}");
    for bad in [json!("0"), json!(-9), json!("NOPE"), json!(1e9)] {
        let out = server
            .call("shell_wait", json!({"job": "j1", "signal": bad}))
            .await;
        assert!(out.is_error, "signal {bad}: {out:#?}");
    }
    let both = server
        .call(
            "shell_wait",
            json!({"job": "j1", "input": "x", "signal": "TERM"}),
        )
        .await;
    assert!(both.is_error && both.text.contains("not both"), "{both:#?}");
    let fed = server
        .call(
            "shell_wait",
            json!({"job": "j1", "input": "echoed", "eof": true, "wait_s": 10}),
        )
        .await;
    assert!(fed.text.contains("echoed"), "{fed:#?}");
    assert!(fed.text.contains("exit 0"), "eof ended cat: {fed:#?}");
    let listing = server.call("shell_wait", json!({})).await;
    assert!(listing.text.contains("j1: exit 0"), "{listing:#?}");
}
