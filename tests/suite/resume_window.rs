//! A rebuild within the wait window: after a restart a dormant session
//! with no saved state runs nothing until python_sessions rebuild with
//! confirm starts its rebuild; that call returns within its window (never past --max-wait),
//! saying the rebuild goes on. A python_exec meanwhile queues its code after
//! the rebuild as the next cell and returns `running` within its window
//! with a note on the rebuild, and python_wait follows it to the call's own
//! result, whose notes name the re-run cells. A client that gives up
//! meanwhile (calls again, interrupts, cancels) is told the truth: the
//! rebuild is under way (never "busy running cell N"), or it was cut and
//! which cells are missing.
//!
//! The stored session's second cell waits at a gate file the test opens,
//! so the test decides how long its re-run takes; the servers that rebuild
//! run with --default-wait 1, so that the rebuild's own call returns while
//! the gate is shut. Nothing here sleeps.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::durable::{assert_dormant, forget_saved_states, message};
use crate::support::{
    EVENT_TIMEOUT, Launch, StdioServer, ToolOutput, assert_status, path_str, py_path, session_row,
    start_call, wait_for_file_line,
};

/// A workspace and state directory that outlive the servers of a test,
/// with a session 'data' stored by a first server: cell 1 `x = 41`, cell 2
/// marks "replaying", waits at the gate "go", then `y = x + 1`.
struct Stored {
    workspace: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Stored {
    async fn python() -> Self {
        let place = Self::empty();
        let first = place.server(&[]).await;
        first.exec_in("data", "x = 41").await.assert_ok();
        place.open_gate();
        let gated = format!(
            "open({}, 'w').write('reached\\n')\nwhile not __import__('os').path.exists({}): __import__('time').sleep(0.02)\ny = x + 1",
            py_path(&place.file("replaying")),
            py_path(&place.file("go")),
        );
        first.exec_in("data", &gated).await.assert_ok();
        place.stop_first(first).await;
        place
    }

    fn empty() -> Self {
        let place = Stored {
            workspace: tempfile::tempdir().expect("workspace"),
            state: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir"),
        };
        std::fs::create_dir(place.files()).expect("the exchange directory");
        place
    }

    /// Where cells and the test exchange marker and gate files (inside the
    /// workspace: sessions may write only there).
    fn files(&self) -> PathBuf {
        self.workspace.path().join("exchange")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.files().join(name)
    }

    fn open_gate(&self) {
        std::fs::write(self.file("go"), "go\n").expect("open the gate");
    }

    /// Stops the first server, closes the gate again (so that the second
    /// server's re-run of cell 2 waits for the test) and removes the state
    /// it saved.
    async fn stop_first(&self, first: StdioServer) {
        let status = first.close_and_wait().await;
        assert!(status.success(), "the first server exited with {status:?}");
        for name in ["go", "replaying"] {
            std::fs::remove_file(self.file(name)).expect("reset the exchange files");
        }
        // What comes back is the history alone: the rebuild is what these
        // tests follow.
        forget_saved_states(self.state.path());
    }

    async fn server(&self, extra: &[&str]) -> StdioServer {
        let mut args = vec![
            "--workdir",
            path_str(self.workspace.path()),
            "--state-dir",
            path_str(self.state.path()),
        ];
        args.extend_from_slice(extra);
        StdioServer::launch(Launch::new(&args).without_workdir_flag()).await
    }

    /// A server whose calls without wait_s wait 1 s (the confirmed
    /// rebuild's own call among them), with `extra`.
    async fn rebuilding_server(&self, extra: &[&str]) -> StdioServer {
        let mut args = vec!["--default-wait", "1"];
        args.extend_from_slice(extra);
        self.server(&args).await
    }

    /// Waits (bounded) until the rebuild re-runs cell 2.
    async fn replaying(&self) {
        wait_for_file_line(&self.file("replaying"), EVENT_TIMEOUT).await;
    }
}

async fn exec(server: &StdioServer, code: &str, wait_s: f64) -> ToolOutput {
    server
        .call(
            "python_exec",
            json!({"session": "data", "code": code, "wait_s": wait_s}),
        )
        .await
}

async fn wait(server: &StdioServer, wait_s: f64) -> ToolOutput {
    server
        .call("python_wait", json!({"session": "data", "wait_s": wait_s}))
        .await
}

/// Polls the listing (bounded) until session `name` is no longer rebuilding.
async fn rebuild_over(server: &StdioServer, name: &str) -> Value {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let row = session_row(server.peer(), name).await;
        if row["state"] != "rebuilding" {
            return row;
        }
        assert!(Instant::now() < deadline, "still rebuilding: {row:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// python_sessions rebuild of `session` with confirm, returning while the
/// gate holds cell 2: it says the rebuild of cells 1-2 goes on.
async fn start_rebuild(server: &StdioServer, session: &str) {
    let out = server
        .call(
            "python_sessions",
            json!({"action": "rebuild", "session": session, "confirm": true}),
        )
        .await;
    let said = message(&out);
    assert!(
        said.contains(&format!(
            "Session '{session}' is being rebuilt (dormant since the server restarted): re-running cells 1-2"
        )) && said.contains("The next result says what was re-run"),
        "{out:#?}"
    );
}

/// A `running` result of the queued cell 3, saying the rebuild re-runs 1-2.
fn assert_rebuilding(out: &ToolOutput, session: &str, wait_tool: &str) {
    assert_status(out, "running");
    assert_eq!(out.cell(), 3, "the queued code is the next cell: {out:#?}");
    let said = out.notes_text();
    assert!(
        said.contains(&format!("Rebuilding session '{session}'"))
            && said.contains("re-running cells 1-2")
            && said.contains("cell 3 (this code) runs after it")
            && said.contains(&format!("{wait_tool} follows it")),
        "{out:#?}"
    );
    assert!(!out.text.contains("busy"), "{out:#?}");
}

#[tokio::test]
async fn a_confirmed_rebuild_returns_within_its_window_and_wait_follows_it() {
    let place = Stored::python().await;
    let second = place.rebuilding_server(&[]).await;

    // Used first, the dormant session runs nothing.
    assert_dormant(&exec(&second, "y * 2", 1.0).await, "data", "1-2");
    assert!(!place.file("replaying").exists(), "a cell was re-run");

    start_rebuild(&second, "data").await;
    place.replaying().await;
    let row = session_row(second.peer(), "data").await;
    assert_eq!(
        (row["state"].as_str(), row["running_cell"].as_u64()),
        (Some("rebuilding"), None),
        "nothing is queued yet: {row:#}"
    );

    let first = exec(&second, "y * 2", 1.0).await;
    assert_rebuilding(&first, "data", "python_wait");
    let row = session_row(second.peer(), "data").await;
    assert_eq!(
        (row["state"].as_str(), row["running_cell"].as_u64()),
        (Some("rebuilding"), Some(3)),
        "{row:#}"
    );

    // Still re-running cell 2: python_wait returns within its own window.
    let still = wait(&second, 0.2).await;
    assert_rebuilding(&still, "data", "python_wait");
    assert!(still.notes_text().contains("now cell 2"), "{still:#?}");

    place.open_gate();
    let done = wait(&second, 30.0).await;
    done.assert_ok();
    assert_eq!((done.cell(), done.value()), (3, Some("84")), "{done:#?}");
    let said = done.notes_text();
    assert!(
        said.contains("Session 'data' (dormant since the server restarted) was rebuilt by re-running cells 1-2"),
        "{done:#?}"
    );

    let history = second
        .call("python_history", json!({"session": "data"}))
        .await;
    let cells: Vec<u64> = history.structured["cells"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["cell"].as_u64()).collect())
        .unwrap_or_default();
    assert_eq!(cells, [1, 2, 3], "{history:#?}");
    let again = exec(&second, "x", 5.0).await;
    again.assert_ok();
    assert!(!again.notes_text().contains("re-running"), "{again:#?}");
}

#[tokio::test]
async fn max_wait_bounds_a_confirmed_rebuild_and_the_calls_queued_after_it() {
    let place = Stored::python().await;
    let second = place.server(&["--max-wait", "2"]).await;
    let started = Instant::now();
    // The rebuild's call waits the default window (30 s), bounded by
    // --max-wait like a wait_s far above it.
    start_rebuild(&second, "data").await;
    let first = exec(&second, "y * 2", 100.0).await;
    assert_rebuilding(&first, "data", "python_wait");
    let followed = second.call("python_wait", json!({"session": "data"})).await;
    assert_rebuilding(&followed, "data", "python_wait");
    // The gate is still shut: only the window could have ended the calls.
    assert!(
        !place.file("go").exists() && started.elapsed() < EVENT_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    place.open_gate();
    let done = wait(&second, 30.0).await;
    done.assert_ok();
    assert_eq!(done.value(), Some("84"), "{done:#?}");
}

#[tokio::test]
async fn calling_again_during_a_rebuild_names_it_and_an_interrupt_cuts_it() {
    let place = Stored::python().await;
    let second = place.rebuilding_server(&[]).await;
    start_rebuild(&second, "data").await;
    assert_rebuilding(&exec(&second, "y * 2", 1.0).await, "data", "python_wait");
    place.replaying().await;

    let again = exec(&second, "z = 1", 1.0).await;
    assert!(again.is_error, "{again:#?}");
    assert!(
        again.text.contains("session 'data' is being rebuilt")
            && again.text.contains("re-running cells 1-2, now cell 2")
            && again
                .text
                .contains("cell 3 (code of an earlier call) runs after it")
            && again.text.contains("python_wait"),
        "{again:#?}"
    );
    assert!(!again.text.contains("busy running cell"), "{again:#?}");

    let stopped = second
        .call("python_wait", json!({"session": "data", "interrupt": true}))
        .await;
    assert_status(&stopped, "interrupted");
    assert_eq!(stopped.cell(), 3, "{stopped:#?}");
    assert_eq!(stopped.error_type(), "NotRun", "{stopped:#?}");
    let said = stopped.notes_text();
    assert!(
        said.contains("re-running cells 1 ")
            && said.contains("Stopped early: interrupted by python_wait with interrupt: true while it re-ran cell 2")
            && said.contains("Cell 2 was not re-run: the session lacks its effects"),
        "{stopped:#?}"
    );

    // The session holds cell 1 only, as the result said; the queued code
    // and the refused one never ran.
    let held = exec(&second, "(x, 'y' in globals(), 'z' in globals())", 5.0).await;
    held.assert_ok();
    assert_eq!(held.value(), Some("(41, False, False)"), "{held:#?}");
}

#[tokio::test]
async fn a_cancelled_call_queued_after_a_rebuild_leaves_the_next_result_saying_what_is_missing() {
    let place = Stored::python().await;
    let second = place.rebuilding_server(&[]).await;
    start_rebuild(&second, "data").await;
    let handle = start_call(
        second.peer(),
        "python_exec",
        json!({"session": "data", "code": "y * 2", "wait_s": 30}),
    )
    .await;
    place.replaying().await;
    // The call's code is queued (as cell 3) before it is cancelled.
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while session_row(second.peer(), "data").await["running_cell"] != 3 {
        assert!(
            Instant::now() < deadline,
            "the call's code was never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle
        .cancel(Some("the client timed out".into()))
        .await
        .expect("send notifications/cancelled");
    let row = rebuild_over(&second, "data").await;
    assert_eq!(row["state"], "idle", "{row:#}");

    let next = exec(&second, "(x, 'y' in globals())", 5.0).await;
    next.assert_ok();
    assert_eq!(next.value(), Some("(41, False)"), "{next:#?}");
    let said = next.notes_text();
    assert!(
        said.contains("cell 3 was queued after the rebuild of session 'data', which was stopped")
            && said.contains("and did not run")
            && said.contains("Stopped early: interrupted when the client cancelled its call while it re-ran cell 2")
            && said.contains("Cell 2 was not re-run: the session lacks its effects"),
        "{next:#?}"
    );
    assert_eq!(next.cell(), 4, "{next:#?}");
}

/// The R twin of the first test: the earlier conversation's 'r' comes back
/// as 'earlier-r'; r_exec queues after its confirmed rebuild, r_wait
/// follows it.
#[tokio::test]
async fn an_r_call_during_a_rebuild_is_queued_after_it() {
    let place = Stored::empty();
    let r = ["--languages", "python,r"];
    let first = place.server(&r).await;
    let r_exec = |code: String, wait_s: f64| {
        let first = &first;
        async move {
            first
                .call("r_exec", json!({"code": code, "wait_s": wait_s}))
                .await
        }
    };
    r_exec("x <- 41".into(), 30.0).await.assert_ok();
    place.open_gate();
    let gated = format!(
        "writeLines('reached', {})\nwhile (!file.exists({})) Sys.sleep(0.02)\ny <- x + 1",
        r_str(&place.file("replaying")),
        r_str(&place.file("go")),
    );
    r_exec(gated, 30.0).await.assert_ok();
    place.stop_first(first).await;

    let second = place.rebuilding_server(&r).await;
    let refused = second
        .call(
            "r_exec",
            json!({"session": "earlier-r", "code": "y * 2", "wait_s": 1}),
        )
        .await;
    assert_dormant(&refused, "earlier-r", "1-2");
    assert!(!place.file("replaying").exists(), "a cell was re-run");
    start_rebuild(&second, "earlier-r").await;
    let queued = second
        .call(
            "r_exec",
            json!({"session": "earlier-r", "code": "y * 2", "wait_s": 1}),
        )
        .await;
    assert_rebuilding(&queued, "earlier-r", "r_wait");
    place.replaying().await;
    place.open_gate();
    let done = second
        .call("r_wait", json!({"session": "earlier-r", "wait_s": 30}))
        .await;
    done.assert_ok();
    assert_eq!(done.cell(), 3, "{done:#?}");
    assert!(done.text.contains("[1] 84"), "{done:#?}");
    assert!(
        done.notes_text()
            .contains("was rebuilt by re-running cells 1-2"),
        "{done:#?}"
    );
}

/// `p` as an R string literal.
fn r_str(p: &Path) -> String {
    format!("{:?}", path_str(p))
}
