//! Sessions that outlive the server and their interpreter: stored as cells
//! finish, dormant after a restart and rebuilt by re-running their cells
//! (failed ones skipped) on first use, bounded, refused when the policy no
//! longer allows their settings, offered back after a crash, one store per
//! workspace at a time, and hidden from the sessions themselves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Launch, StdioServer, ToolOutput};

/// A workspace and a state directory that outlive the servers of a test.
struct Place {
    workspace: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Place {
    fn new() -> Self {
        Place {
            workspace: tempfile::tempdir().expect("workspace"),
            // Not under /tmp (hidden from sessions anyway): the store's own
            // hiding is what keeps sessions out.
            state: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir"),
        }
    }

    async fn server(&self, extra: &[&str]) -> StdioServer {
        let mut args = vec![
            "--workdir".to_string(),
            path_string(self.workspace.path()),
            "--state-dir".to_string(),
            path_string(self.state.path()),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        StdioServer::launch(Launch::new(&args).without_workdir_flag()).await
    }
}

fn path_string(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// The interpreter `python3` on PATH really is (shims resolved).
fn real_python() -> String {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, os; print(os.path.realpath(sys.executable))",
        ])
        .output()
        .expect("run python3");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn sessions(server: &StdioServer) -> Vec<Value> {
    let listing = server.call("python_sessions", json!({})).await;
    assert!(!listing.is_error, "{listing:#?}");
    listing.structured["sessions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn row<'a>(rows: &'a [Value], name: &str) -> Option<&'a Value> {
    rows.iter().find(|r| r["name"] == name)
}

async fn stop(server: StdioServer) {
    let status = server.close_and_wait().await;
    assert!(status.success(), "the server exited with {status:?}");
}

#[tokio::test]
async fn a_restarted_server_rebuilds_a_session_on_first_use() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec_in("data", "x = 41").await.assert_ok();
    first
        .exec_in("data", "1/0")
        .await
        .assert_raised("ZeroDivisionError");
    first
        .exec_in("data", "x += 1\nimport math")
        .await
        .assert_ok();
    first.exec_in("data", "y = x * 2").await.assert_ok();
    stop(first).await;

    let second = place.server(&[]).await;
    let rows = sessions(&second).await;
    let data = row(&rows, "data").unwrap_or_else(|| panic!("no session 'data': {rows:#?}"));
    assert_eq!(data["state"], "dormant", "{data:#?}");
    assert_eq!(data["cells"], 4, "{data:#?}");

    let out = second.exec_in("data", "(x, y, round(math.pi, 2))").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("(42, 84, 3.14)"), "{out:#?}");
    let said = out.notes_text();
    assert!(said.contains("re-running cells 1, 3-4"), "{said}");
    assert!(said.contains("Cell 2 was skipped: it had failed"), "{said}");
    assert_eq!(
        out.cell(),
        5,
        "cell ids go on after the stored ones: {out:#?}"
    );

    let history = second
        .call("python_history", json!({"session": "data"}))
        .await;
    assert!(!history.is_error, "{history:#?}");
    let cells: Vec<u64> = history.structured["cells"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["cell"].as_u64()).collect())
        .unwrap_or_default();
    assert_eq!(cells, [1, 2, 3, 4, 5], "{history:#?}");

    // Rebuilt once: the next call runs at once, with nothing to say.
    let again = second.exec_in("data", "x").await;
    again.assert_ok();
    assert!(!again.notes_text().contains("re-running"), "{again:#?}");
    let rows = sessions(&second).await;
    assert_eq!(
        row(&rows, "data").map(|r| r["state"].clone()),
        Some(json!("idle"))
    );
}

#[tokio::test]
async fn a_rebuild_is_bounded_by_resume_max_cells() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec("a = 1").await.assert_ok();
    first.exec("b = 2").await.assert_ok();
    stop(first).await;

    let second = place.server(&["--resume-max-cells", "1"]).await;
    let out = second.exec("a").await;
    out.assert_raised("NameError");
    let said = out.notes_text();
    assert!(
        said.contains("more than --resume-max-cells 1") && said.contains("fresh"),
        "{said}"
    );
}

#[tokio::test]
async fn resume_off_keeps_nothing() {
    let place = Place::new();
    let first = place.server(&["--resume", "off"]).await;
    first.exec_in("data", "x = 1").await.assert_ok();
    stop(first).await;
    let second = place.server(&["--resume", "off"]).await;
    let rows = sessions(&second).await;
    assert!(row(&rows, "data").is_none(), "{rows:#?}");
    let entries: Vec<PathBuf> = std::fs::read_dir(place.state.path())
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    assert!(entries.is_empty(), "--resume off wrote {entries:?}");
}

#[tokio::test]
async fn a_second_server_on_the_workspace_does_not_share_the_store() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec_in("mine", "v = 'first'").await.assert_ok();
    let second = place.server(&[]).await;
    assert!(
        second
            .wait_stderr_contains("keeps this workspace's sessions", Duration::from_secs(10))
            .await,
        "no warning: {}",
        second.stderr_log()
    );
    second.exec_in("theirs", "v = 'second'").await.assert_ok();
    stop(second).await;
    stop(first).await;

    let third = place.server(&[]).await;
    let rows = sessions(&third).await;
    assert!(row(&rows, "mine").is_some(), "{rows:#?}");
    assert!(
        row(&rows, "theirs").is_none(),
        "the second server wrote: {rows:#?}"
    );
    let out = third.exec_in("mine", "v").await;
    assert_eq!(out.value(), Some("'first'"), "{out:#?}");
}

/// A server whose session 'c' ran `kept = 5`, then crashed (SIGKILL).
async fn crashed_after_one_cell() -> (StdioServer, ToolOutput) {
    let server = StdioServer::start(&[]).await;
    server.exec_in("c", "kept = 5").await.assert_ok();
    let crash = server
        .exec_in(
            "c",
            "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        )
        .await;
    assert_eq!(crash.str_field("status"), "crashed", "{crash:#?}");
    (server, crash)
}

#[tokio::test]
async fn a_crashed_session_offers_a_rebuild() {
    let (server, crash) = crashed_after_one_cell().await;
    let said = crash.notes_text();
    assert!(
        said.contains("python_sessions {action: \"restore\", session: \"c\"}")
            && said.contains("re-runs cells 1"),
        "{said}"
    );
    let restored = server
        .call(
            "python_sessions",
            json!({"action": "restore", "session": "c"}),
        )
        .await;
    assert!(!restored.is_error, "{restored:#?}");
    let message = restored.structured["message"].as_str().unwrap_or_default();
    assert!(message.contains("re-running cells 1 "), "{restored:#?}");
    let out = server.exec_in("c", "kept").await;
    assert_eq!(out.value(), Some("5"), "{out:#?}");

    // Nothing left to restore now.
    let again = server
        .call(
            "python_sessions",
            json!({"action": "restore", "session": "c"}),
        )
        .await;
    assert!(again.is_error, "{again:#?}");
    assert!(again.text.contains("nothing to restore"), "{again:#?}");
}

#[tokio::test]
async fn a_new_cell_after_a_crash_starts_a_new_path() {
    let (server, _crash) = crashed_after_one_cell().await;
    server.exec_in("c", "fresh = 1").await.assert_ok();
    let late = server
        .call(
            "python_sessions",
            json!({"action": "restore", "session": "c"}),
        )
        .await;
    assert!(
        late.is_error && late.text.contains("nothing to restore"),
        "{late:#?}"
    );
}

#[tokio::test]
async fn stored_settings_the_policy_now_refuses_are_not_resumed() {
    let place = Place::new();
    // An interpreter outside the workspace, allowed by the first server's
    // operator only.
    let python = real_python();
    let first = place.server(&["--allow-python", &python]).await;
    let created = first
        .call(
            "python_sessions",
            json!({"action": "create", "session": "own", "python": python}),
        )
        .await;
    assert!(!created.is_error, "{created:#?}");
    first.exec_in("own", "z = 3").await.assert_ok();
    stop(first).await;

    let second = place.server(&[]).await;
    let out = second.exec_in("own", "z").await;
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text
            .contains("stored with settings the current policy refuses")
            && out.text.contains("--allow-python"),
        "{out:#?}"
    );
}

#[tokio::test]
async fn sessions_cannot_read_the_store() {
    let place = Place::new();
    let server = place.server(&[]).await;
    server.exec("secret = 'in the store'").await.assert_ok();
    let state = path_string(place.state.path());
    let out = server
        .exec(&format!(
            "import os\ntry:\n    print(os.listdir({state:?}))\nexcept OSError as e:\n    print('refused', type(e).__name__)"
        ))
        .await;
    out.assert_ok();
    assert!(out.str_field("stdout").contains("refused"), "{out:#?}");
}

#[tokio::test]
async fn an_r_session_is_rebuilt_too() {
    let place = Place::new();
    let first = place.server(&["--languages", "python,r"]).await;
    let set = first
        .call(
            "r_exec",
            json!({"code": "y <- 2\nsquare <- function(v) v^2", "wait_s": 30}),
        )
        .await;
    set.assert_ok();
    stop(first).await;
    let second = place.server(&["--languages", "python,r"]).await;
    let rows = sessions(&second).await;
    let r = row(&rows, "r").unwrap_or_else(|| panic!("{rows:#?}"));
    assert_eq!(
        (r["state"].as_str(), r["language"].as_str()),
        (Some("dormant"), Some("r"))
    );
    let out = second
        .call("r_exec", json!({"code": "square(y)", "wait_s": 30}))
        .await;
    out.assert_ok();
    assert!(out.text.contains("[1] 4"), "{out:#?}");
    assert!(out.notes_text().contains("re-running cells 1"), "{out:#?}");
}

#[tokio::test]
async fn inspecting_a_dormant_session_rebuilds_it_first() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec_in("data", "kept_value = 41").await.assert_ok();
    stop(first).await;
    let second = place.server(&[]).await;
    let out = second
        .call("python_inspect", json!({"session": "data"}))
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert!(out.text.contains("kept_value"), "{out:#?}");
    let rows = sessions(&second).await;
    assert_eq!(
        row(&rows, "data").map(|r| r["state"].clone()),
        Some(json!("idle"))
    );
}
