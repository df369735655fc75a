//! `--default-session per-client`: each MCP connection's default session
//! belongs to it. None is started ahead; when the connection ends the
//! session ends too, once its last result is collected or its grace period
//! runs out; a gone client's session makes room for a new one; a call that
//! names it takes it over; reconnecting clients never fill the server.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Client, HttpServer, ToolOutput, call, py_path};

async fn tool(client: &Client, name: &str, args: Value) -> ToolOutput {
    call(client.peer(), name, args).await
}

/// The names of the sessions the server holds.
async fn names(client: &Client) -> Vec<String> {
    let out = tool(client, "python_sessions", json!({})).await;
    assert!(!out.is_error, "{out:#?}");
    out.structured["sessions"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|s| s["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (bounded) until `name` is no longer held.
async fn wait_gone(client: &Client, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while names(client).await.iter().any(|n| n == name) {
        assert!(Instant::now() < deadline, "session {name} was never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The session a result's status line names.
fn session_of(out: &ToolOutput) -> String {
    let line = out.text.lines().last().unwrap_or_default();
    line.split(" | ")
        .find_map(|part| part.strip_prefix("session "))
        .unwrap_or_else(|| panic!("no session in {out:#?}"))
        .to_string()
}

#[tokio::test]
async fn a_clients_session_ends_with_it_and_makes_room_for_the_next() {
    let server = HttpServer::start(
        &[
            "--default-session",
            "per-client",
            "--max-sessions",
            "2",
            "--warm-pool",
            "0",
        ],
        &[],
    )
    .await;
    let first = server.connect(None).await;
    // Nothing is started ahead: no shared default, no client's yet.
    assert!(names(&first).await.is_empty());
    let out = tool(&first, "python_exec", json!({ "code": "mine = 1" })).await;
    assert!(!out.is_error, "{out:#?}");
    let first_name = session_of(&out);
    let watcher = server.connect(None).await;
    let _ = first.cancel().await;
    // Nothing left to collect: it ends as soon as its client has gone.
    wait_gone(&watcher, &first_name).await;

    // A gone client's running cell keeps its session (grace 600 s), but a
    // new client needing room ends it, and is told.
    let gate = server.workdir.path().join("gate");
    let third = server.connect(None).await;
    let code = format!(
        "import os, time\nwhile not os.path.exists({}): time.sleep(0.02)",
        py_path(&gate)
    );
    let out = tool(&third, "python_exec", json!({ "code": code, "wait_s": 0 })).await;
    let third_name = session_of(&out);
    let _ = third.cancel().await;
    let _ = tool(&watcher, "python_exec", json!({ "code": "1" })).await;
    let fourth = server.connect(None).await;
    let out = tool(&fourth, "python_exec", json!({ "code": "2 + 2" })).await;
    assert!(!out.is_error, "a new client is refused: {out:#?}");
    assert!(
        out.text.contains(&format!(
            "Session '{third_name}', whose client had disconnected"
        )),
        "{out:#?}"
    );
    assert!(!names(&fourth).await.contains(&third_name));
    std::fs::write(&gate, "go").expect("open the gate");
}

#[tokio::test]
async fn a_call_that_names_a_gone_clients_session_takes_it_over() {
    let server = HttpServer::start(
        &["--default-session", "per-client", "--client-grace", "600"],
        &[],
    )
    .await;
    let gate = server.workdir.path().join("gate");
    let first = server.connect(None).await;
    let code = format!(
        "import os, time\nkept = 7\nwhile not os.path.exists({}): time.sleep(0.02)\nkept * 6",
        py_path(&gate)
    );
    let out = tool(&first, "python_exec", json!({ "code": code, "wait_s": 0 })).await;
    let name = session_of(&out);
    let _ = first.cancel().await;

    let second = server.connect(None).await;
    let waiting = tool(
        &second,
        "python_wait",
        json!({ "session": name, "wait_s": 0 }),
    )
    .await;
    assert!(waiting.text.contains("running"), "{waiting:#?}");
    std::fs::write(&gate, "go").expect("open the gate");
    let done = tool(
        &second,
        "python_wait",
        json!({ "session": name, "wait_s": 30 }),
    )
    .await;
    assert_eq!(done.value(), Some("42"), "{done:#?}");
    // Collected, yet kept: the second client took it over by name.
    let out = tool(
        &second,
        "python_exec",
        json!({ "code": "kept", "session": name }),
    )
    .await;
    assert_eq!(out.value(), Some("7"), "{out:#?}");
}

#[tokio::test]
async fn a_hundred_reconnecting_clients_never_fill_the_server() {
    let server = HttpServer::start(
        &[
            "--default-session",
            "per-client",
            "--max-sessions",
            "4",
            "--warm-pool",
            "2",
        ],
        &[],
    )
    .await;
    for i in 0..100 {
        let client = server.connect(None).await;
        let out = tool(
            &client,
            "python_exec",
            json!({ "code": format!("{i} * 2") }),
        )
        .await;
        assert!(!out.is_error, "client {i} was refused: {out:#?}");
        assert_eq!(out.value(), Some((i * 2).to_string().as_str()));
        let _ = client.cancel().await;
    }
    let last = server.connect(None).await;
    let held = names(&last).await;
    assert!(held.len() <= 4, "{held:?}");
}
