//! Session management: the listing's fields, create with a workdir, env or
//! virtual environment, bad options refused, delete, max-sessions, idle expiry.

use std::time::Duration;

use super::{POLL_TIMEOUT, find_session, list_sessions, unquote};
use crate::support::{
    StdioServer, assert_refused, assert_success, process_alive, py_repr, session_host_pid,
    wait_process_gone,
};
use serde_json::json;

#[tokio::test]
async fn sessions_list_has_the_documented_fields() {
    let server = StdioServer::start(&[]).await;
    server.exec("x = 1").await.assert_ok();
    let pid = session_host_pid(&server, "default").await;

    let listing = list_sessions(&server).await;
    let row = find_session(&listing.structured, "default")
        .unwrap_or_else(|| panic!("no default session in {listing:#?}"));
    // running_cell is left out when no cell runs (structuredContent omits nulls).
    for key in [
        "name",
        "state",
        "pid",
        "cells",
        "memory_bytes",
        "uptime_s",
        "language",
        "interpreter",
    ] {
        assert!(row.get(key).is_some(), "session row lacks {key}: {row}");
    }
    assert_eq!(row["language"], "python", "{row}");
    assert!(row.get("running_cell").is_none(), "{row}");
    assert_eq!(row["state"], "idle", "{row}");
    assert_eq!(row["pid"].as_u64(), Some(u64::from(pid)), "{row}");
    assert_eq!(row["cells"].as_u64(), Some(2), "{row}");
    assert!(row["running_cell"].is_null(), "{row}");
    assert!(row["uptime_s"].as_f64().is_some(), "{row}");
    assert!(
        listing.text.contains("default"),
        "the text lists the session: {:?}",
        listing.text
    );
}

#[tokio::test]
async fn create_session_with_workdir_and_env_then_delete_it() {
    let server = StdioServer::start(&[]).await;
    // A session's workdir must be inside the workspace.
    let dir = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");

    let created = server
        .call(
            "python_sessions",
            json!({
                "action": "create",
                "session": "w",
                "workdir": dir.path(),
                "env": {"MYVAR": "hello"},
            }),
        )
        .await;
    assert_success(&created, "created");
    let message = created.structured["message"]
        .as_str()
        .unwrap_or_else(|| panic!("create has a message: {created:#?}"));
    assert!(message.contains("created"), "{message:?}");
    assert!(message.contains('w'), "{message:?}");
    let row = find_session(&created.structured, "w")
        .unwrap_or_else(|| panic!("the created session is listed: {created:#?}"));
    let listed_pid = row["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("a created session has a running interpreter: {row}"));

    let out = server
        .exec_in(
            "w",
            "import os; (os.path.realpath(os.getcwd()), os.environ['MYVAR'])",
        )
        .await;
    out.assert_ok();
    let canonical = std::fs::canonicalize(dir.path()).expect("canonical tempdir");
    let expected = format!("({}, 'hello')", py_repr(&canonical));
    assert_eq!(out.value(), Some(expected.as_str()), "{out:#?}");
    assert_eq!(
        out.cell(),
        1,
        "the created session runs its first cell: {out:#?}"
    );

    // The default session keeps the server's workdir and has no MYVAR.
    let default = server
        .exec("import os; (os.path.realpath(os.getcwd()), os.environ.get('MYVAR'))")
        .await;
    default.assert_ok();
    let server_dir = std::fs::canonicalize(server.workdir.path()).expect("canonical workdir");
    let expected = format!("({}, None)", py_repr(&server_dir));
    assert_eq!(default.value(), Some(expected.as_str()), "{default:#?}");

    let pid = session_host_pid(&server, "w").await;
    assert_eq!(
        u64::from(pid),
        listed_pid,
        "listed pid is the interpreter's"
    );
    assert!(process_alive(pid));

    let deleted = server
        .call(
            "python_sessions",
            json!({"action": "delete", "session": "w"}),
        )
        .await;
    assert_success(&deleted, "deleted");
    let message = deleted.structured["message"]
        .as_str()
        .unwrap_or_else(|| panic!("delete has a message: {deleted:#?}"));
    assert!(message.contains("deleted"), "{message:?}");
    assert!(
        find_session(&deleted.structured, "w").is_none(),
        "a deleted session is no longer listed: {deleted:#?}"
    );
    assert!(
        wait_process_gone(pid, POLL_TIMEOUT).await,
        "the deleted session's interpreter (pid {pid}) is still alive"
    );

    let again = server
        .call(
            "python_sessions",
            json!({"action": "delete", "session": "w"}),
        )
        .await;
    assert_refused(&again, &["'w'", "default"]);
}

#[tokio::test]
async fn create_session_in_a_virtual_environment() {
    let server = StdioServer::start(&[]).await;
    // A venv must be inside the workspace (or allowed with --allow-python).
    let venv = server.workdir.path().join("v");
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .expect("run python3 -m venv");
    assert!(
        made.status.success(),
        "python3 -m venv failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );

    let created = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "venvy", "venv": venv}),
        )
        .await;
    assert_success(&created, "created");

    let out = server
        .exec_in(
            "venvy",
            "import sys; (sys.prefix, sys.prefix != sys.base_prefix)",
        )
        .await;
    out.assert_ok();
    let expected = format!("({}, True)", py_repr(&venv));
    assert_eq!(out.value(), Some(expected.as_str()), "{out:#?}");

    // The default session is not in that environment.
    let default = server.exec("import sys; sys.prefix").await;
    default.assert_ok();
    assert_ne!(
        unquote(default.value()),
        venv.to_str().unwrap(),
        "{default:#?}"
    );
}

#[tokio::test]
async fn create_is_refused_for_bad_options_and_existing_names() {
    let server = StdioServer::start(&[]).await;

    // An interpreter outside the workspace needs the operator's --allow-python.
    let outside_python = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "p", "python": "/nonexistent"}),
        )
        .await;
    assert_refused(&outside_python, &["/nonexistent", "--allow-python"]);

    // One inside the workspace must exist and be executable.
    let missing = server.workdir.path().join("no-such-python");
    let bad_python = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "p", "python": missing}),
        )
        .await;
    assert_refused(&bad_python, &[missing.to_str().expect("utf-8 path")]);
    assert!(
        bad_python.text.contains("not executable") || bad_python.text.contains("does not exist"),
        "{:?}",
        bad_python.text
    );

    let not_a_venv = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");
    let bad_venv = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "p", "venv": not_a_venv.path()}),
        )
        .await;
    assert_refused(&bad_venv, &["virtual environment"]);

    let reserved = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "p", "env": {"FERREPL_SECRET": "x"}}),
        )
        .await;
    assert_refused(&reserved, &["FERREPL_SECRET"]);

    let listing = list_sessions(&server).await;
    assert!(
        find_session(&listing.structured, "p").is_none(),
        "refused creations leave no session behind: {listing:#?}"
    );

    let first = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "dup"}),
        )
        .await;
    assert_success(&first, "first");
    let second = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "dup"}),
        )
        .await;
    assert_refused(&second, &["already exists"]);

    let unknown = server
        .call(
            "python_sessions",
            json!({"action": "delete", "session": "ghost"}),
        )
        .await;
    assert_refused(&unknown, &["ghost", "dup"]);
}

#[tokio::test]
async fn max_sessions_limits_new_sessions() {
    let server = StdioServer::start(&["--max-sessions", "2"]).await;
    server.exec("1").await.assert_ok();
    server.exec_in("second", "2").await.assert_ok();

    let third = server.exec_in("third", "3").await;
    assert_refused(&third, &["limit", "--max-sessions"]);

    let created = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "third"}),
        )
        .await;
    assert_refused(&created, &["--max-sessions"]);

    // Deleting one makes room again.
    let deleted = server
        .call(
            "python_sessions",
            json!({"action": "delete", "session": "second"}),
        )
        .await;
    assert_success(&deleted, "deleted");
    server.exec_in("third", "3").await.assert_ok();
}

#[tokio::test]
async fn idle_sessions_end_after_the_ttl() {
    let server = StdioServer::start(&["--session-ttl", "1"]).await;
    let created = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "idle1"}),
        )
        .await;
    assert_success(&created, "created");
    server.exec_in("idle1", "x = 1").await.assert_ok();
    let pid = session_host_pid(&server, "idle1").await;

    let deadline = tokio::time::Instant::now() + POLL_TIMEOUT;
    loop {
        let listing = list_sessions(&server).await;
        if find_session(&listing.structured, "idle1").is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "session idle1 still exists {POLL_TIMEOUT:?} after its last use with --session-ttl 1: {listing:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        wait_process_gone(pid, POLL_TIMEOUT).await,
        "the expired session's interpreter (pid {pid}) is still alive"
    );
}
