//! Server status (python_sessions {action: "status"}) and tool groups
//! (--tools), over stdio and HTTP.

use std::path::Path;
use std::time::Duration;

use super::find_session;
use crate::support::{
    HttpServer, START_TIMEOUT, StdioServer, ToolOutput, assert_success, call, exec_args,
    server_command_plain, strip_ansi, tool_names,
};
use serde_json::{Value, json};

fn assert_status_shape(out: &ToolOutput, workdir: &Path) {
    assert_success(out, "status");
    assert!(out.structured["sessions"].is_array(), "{out:#?}");
    let s = &out.structured["server"];
    for key in [
        "version",
        "uptime_s",
        "python",
        "workdir",
        "jobs",
        "tool_groups",
        "limits",
        "sandbox",
    ] {
        assert!(s.get(key).is_some(), "the status lacks {key}: {s}");
    }
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"), "{s}");
    assert!(s["uptime_s"].as_f64().is_some(), "{s}");
    let canonical = std::fs::canonicalize(workdir).expect("canonical workdir");
    assert_eq!(s["workdir"], canonical.to_str().expect("utf-8"), "{s}");
    assert!(!s["python"].as_str().unwrap_or_default().is_empty(), "{s}");
    assert!(!s["sandbox"].as_str().unwrap_or_default().is_empty(), "{s}");
    assert!(s["limits"].get("max-sessions").is_some(), "{s}");
}

fn tool_groups(out: &ToolOutput) -> Vec<&str> {
    out.structured["server"]["tool_groups"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_groups array: {out:#?}"))
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

#[tokio::test]
async fn sessions_status_reports_version_limits_groups_and_sessions() {
    let server = StdioServer::start(&["--max-sessions", "7"]).await;
    server.exec_in("stat", "1").await.assert_ok();
    let out = server
        .call("python_sessions", json!({"action": "status"}))
        .await;
    assert_status_shape(&out, server.workdir.path());
    assert_eq!(
        out.structured["server"]["limits"]["max-sessions"], 7,
        "{out:#?}"
    );
    let mut groups = tool_groups(&out);
    groups.sort_unstable();
    assert_eq!(
        groups,
        ["files", "more", "packages", "python", "shell"],
        "{out:#?}"
    );
    assert!(
        find_session(&out.structured, "stat").is_some(),
        "the status lists the sessions: {out:#?}"
    );
    assert!(out.text.contains("max-sessions"), "{:?}", out.text);
    assert!(
        !out.text.contains("viewer"),
        "no viewer runs: {:?}",
        out.text
    );
}

/// With --viewer, the status names its address for the agent to pass on,
/// and nothing that logs in (the token, the one-time links).
#[tokio::test]
async fn sessions_status_names_the_viewer_and_nothing_that_logs_in() {
    let secrets = tempfile::tempdir().expect("a directory for the token");
    let token = "status-viewer-token-0123456789abcdef";
    let file = secrets.path().join("viewer-tokens");
    std::fs::write(&file, format!("{token}\n")).expect("the viewer token");
    let server = StdioServer::start(&[
        "--viewer",
        "127.0.0.1:0",
        "--viewer-tokens",
        file.to_str().expect("utf-8"),
    ])
    .await;
    assert!(
        server
            .wait_stderr_contains("login?ticket=", Duration::from_secs(20))
            .await,
        "{}",
        server.stderr_log()
    );
    let log = server.stderr_log();
    let url = log
        .split("ferrepl viewer: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the viewer's address on stderr");
    let ticket = log
        .split("login?ticket=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("a one-time link on stderr");
    let out = server
        .call("python_sessions", json!({"action": "status"}))
        .await;
    assert!(
        out.text.contains(&format!("viewer: {url} ")),
        "{url}: {:?}",
        out.text
    );
    let everything = format!("{}{}", out.text, out.structured);
    assert!(
        !everything.contains(token)
            && !everything.contains(ticket)
            && !everything.contains("ticket"),
        "{everything}"
    );
}

#[tokio::test]
async fn tools_flag_exposes_only_the_chosen_groups() {
    let server = StdioServer::start(&["--tools", "python"]).await;
    let names = tool_names(server.peer()).await;
    assert_eq!(
        names,
        [
            "python_exec",
            "python_inspect",
            "python_output",
            "python_sessions",
            "python_wait",
        ],
        "exactly the python group"
    );
    for (tool, group) in [
        ("python_install", "packages"),
        ("python_history", "more"),
        ("python_run_file", "more"),
        ("python_complete", "more"),
        ("python_namespace", "more"),
    ] {
        assert!(
            !names.iter().any(|n| n == tool),
            "{tool} belongs to the {group} group: {names:?}"
        );
    }

    let status = server
        .call("python_sessions", json!({"action": "status"}))
        .await;
    assert_success(&status, "status");
    assert_eq!(tool_groups(&status), ["python"], "{status:#?}");
}

#[tokio::test]
async fn tools_flag_with_an_unknown_group_refuses_to_start() {
    let workdir = tempfile::tempdir().expect("tempdir");
    let mut cmd = server_command_plain();
    cmd.arg("--workdir")
        .arg(workdir.path())
        .args(["--tools", "bogus"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().expect("spawn ferrepl");
    let output = tokio::time::timeout(START_TIMEOUT, child.wait_with_output())
        .await
        .expect("ferrepl --tools bogus did not exit")
        .expect("wait for ferrepl");
    let stderr = strip_ansi(&String::from_utf8_lossy(&output.stderr));
    assert!(
        !output.status.success(),
        "ferrepl --tools bogus exited successfully; stderr:\n{stderr}"
    );
    assert!(stderr.contains("bogus"), "{stderr}");
    for group in ["python", "packages", "more", "shell", "files"] {
        assert!(
            stderr.contains(group),
            "stderr should name {group}: {stderr}"
        );
    }
}

#[tokio::test]
async fn http_sessions_and_status() {
    let mut server = HttpServer::start(&["--max-sessions", "3"], &[]).await;
    let client = server.connect(None).await;
    let peer = client.peer();

    let status = call(peer, "python_sessions", json!({"action": "status"})).await;
    assert_status_shape(&status, server.workdir.path());
    assert_eq!(status.structured["server"]["limits"]["max-sessions"], 3);

    let dir = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");
    let created = call(
        peer,
        "python_sessions",
        json!({"action": "create", "session": "remote", "workdir": dir.path(), "env": {"MYVAR": "over-http"}}),
    )
    .await;
    assert_success(&created, "created");
    let out = call(
        peer,
        "python_exec",
        exec_args("remote", "import os; os.environ['MYVAR']"),
    )
    .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("'over-http'"));

    let history = call(peer, "python_history", json!({"session": "remote"})).await;
    assert_success(&history, "history");
    assert_eq!(
        history.structured["cells"][0]["code"],
        "import os; os.environ['MYVAR']"
    );

    let deleted = call(
        peer,
        "python_sessions",
        json!({"action": "delete", "session": "remote"}),
    )
    .await;
    assert_success(&deleted, "deleted");
    assert!(find_session(&deleted.structured, "remote").is_none());

    server.assert_alive();
    let _ = client.cancel().await;
}
