//! Sessions that outlive the server and their interpreter: stored as cells
//! finish, dormant after a restart (their history kept, their variables
//! not) and never re-run by themselves: a call that needs their state is
//! refused and runs nothing, python_sessions rebuild first says which cells
//! it would re-run and re-runs them (failed ones skipped, bounded) only
//! with confirm. A new server is a new conversation: the stored default
//! sessions come back as earlier-default[-N], and a fresh default names
//! them. Also: refused when the policy no longer allows their settings,
//! offered back after a crash, one store per workspace at a time, and
//! hidden from the sessions themselves. A session whose state a server
//! saved is loaded from it instead; the tests that follow the history alone
//! remove the saved states first (`forget_saved_states`), as a kill before
//! any save would leave them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Launch, StdioServer, ToolOutput, path_str};

/// A workspace and a state directory that outlive the servers of a test.
pub(crate) struct Place {
    pub(crate) workspace: tempfile::TempDir,
    pub(crate) state: tempfile::TempDir,
}

impl Place {
    pub(crate) fn new() -> Self {
        Place {
            workspace: tempfile::tempdir().expect("workspace"),
            // Not under /tmp (hidden from sessions anyway): the store's own
            // hiding is what keeps sessions out.
            state: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir"),
        }
    }

    pub(crate) async fn server(&self, extra: &[&str]) -> StdioServer {
        StdioServer::launch(self.launch(extra)).await
    }

    /// The launch of a server on this place, for a test to add to.
    pub(crate) fn launch(&self, extra: &[&str]) -> Launch {
        let mut args = vec![
            "--workdir".to_string(),
            path_str(self.workspace.path()).to_string(),
            "--state-dir".to_string(),
            path_str(self.state.path()).to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Launch::new(&args).without_workdir_flag()
    }
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

fn row<'a>(rows: &'a [Value], name: &str) -> Option<&'a Value> {
    rows.iter().find(|r| r["name"] == name)
}

/// The listed state of session `name`.
pub(crate) async fn state_of(server: &StdioServer, name: &str) -> String {
    let rows = server.sessions().await;
    let row = row(&rows, name).unwrap_or_else(|| panic!("no session '{name}': {rows:#?}"));
    row["state"].as_str().unwrap_or_default().to_string()
}

/// python_sessions rebuild of `session`, confirmed or not.
async fn rebuild(server: &StdioServer, session: &str, confirm: bool) -> ToolOutput {
    let mut args = json!({"action": "rebuild", "session": session});
    if confirm {
        args["confirm"] = json!(true);
    }
    server.call("python_sessions", args).await
}

/// The message of a python_sessions result that succeeded.
pub(crate) fn message(out: &ToolOutput) -> &str {
    assert!(!out.is_error, "{out:#?}");
    out.structured["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {out:#?}"))
}

/// Panics unless `out` is the refusal of a call on dormant session
/// `session` whose stored cells are `cells`.
pub(crate) fn assert_dormant(out: &ToolOutput, session: &str, cells: &str) {
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text.contains(&format!(
            "session '{session}' is dormant: an earlier server ran cells {cells} in it; their history is kept, their variables are not. Nothing was run."
        )) && out.text.contains(&format!(
            r#"python_sessions {{"action": "rebuild", "session": "{session}"}} shows what re-running them would do"#
        )),
        "{out:#?}"
    );
}

/// Removes the states the servers saved beside the store in `state`
/// (`<store>.states/`), as when a server was killed before it could save
/// them: what comes back then is the sessions' history only.
pub(crate) fn forget_saved_states(state: &Path) {
    for entry in std::fs::read_dir(state).expect("read the state directory") {
        let path = entry.expect("a state directory entry").path();
        if path.extension().is_some_and(|e| e == "states") {
            std::fs::remove_dir_all(&path).expect("remove the saved states");
        }
    }
}

/// Panics if a server saved a state of session `name` in `state`.
fn assert_no_saved_state(state: &Path, name: &str) {
    for entry in std::fs::read_dir(state).expect("read the state directory") {
        let path = entry.expect("a state directory entry").path();
        let saved = path.join(format!("{name}.state"));
        assert!(
            !(path.extension().is_some_and(|e| e == "states") && saved.exists()),
            "a state of '{name}' was saved before the kill: {}",
            saved.display()
        );
    }
}

/// The lines of a file the cells append to (none when it is missing).
fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// A stored session without a saved state (its history only) is refused
/// at first use and runs nothing; rebuild previews, then with confirm
/// re-runs the cells that had succeeded, once.
#[tokio::test]
async fn a_restarted_server_keeps_a_session_dormant_until_a_confirmed_rebuild() {
    let place = Place::new();
    let runs = place.workspace.path().join("runs.txt");
    let first = place.server(&[]).await;
    first
        .exec_in("data", "x = 41\nopen('runs.txt', 'a').write('x\\n')")
        .await
        .assert_ok();
    first
        .exec_in("data", "1/0")
        .await
        .assert_raised("ZeroDivisionError");
    first
        .exec_in("data", "x += 1\nimport math")
        .await
        .assert_ok();
    first.exec_in("data", "y = x * 2").await.assert_ok();
    first.stop().await;
    forget_saved_states(place.state.path());
    assert_eq!(lines(&runs), ["x"]);

    let second = place.server(&[]).await;
    let rows = second.sessions().await;
    let data = row(&rows, "data").unwrap_or_else(|| panic!("no session 'data': {rows:#?}"));
    assert_eq!(data["state"], "dormant", "{data:#?}");
    assert_eq!(data["cells"], 4, "{data:#?}");

    // First use: refused, nothing run, the choice named.
    let refused = second.exec_in("data", "(x, y, round(math.pi, 2))").await;
    assert_dormant(&refused, "data", "1-4");
    assert_eq!(lines(&runs), ["x"], "the first use re-ran a cell");
    assert_eq!(state_of(&second, "data").await, "dormant");

    // Without confirm, rebuild says what it would do and does nothing.
    let preview = rebuild(&second, "data", false).await;
    let said = message(&preview);
    assert!(
        said.contains(
            "A rebuild of session 'data' (dormant since the server restarted) re-runs cells 1, 3-4"
        ) && said.contains("Whatever they did outside the session happens again")
            && said.contains("Cell 2 would be skipped: it had failed")
            && said.contains(
                r#"python_sessions {"action": "rebuild", "session": "data", "confirm": true}"#
            ),
        "{preview:#?}"
    );
    assert_eq!(lines(&runs), ["x"], "the preview re-ran a cell");
    assert_eq!(state_of(&second, "data").await, "dormant");

    let rebuilt = rebuild(&second, "data", true).await;
    let said = message(&rebuilt);
    assert!(
        said.contains("Session 'data' (dormant since the server restarted) was rebuilt by re-running cells 1, 3-4 in ")
            && said.contains("Cell 2 was skipped: it had failed"),
        "{rebuilt:#?}"
    );
    assert_eq!(lines(&runs), ["x", "x"], "cell 1 is re-run once");
    assert_eq!(state_of(&second, "data").await, "idle");

    let out = second.exec_in("data", "(x, y, round(math.pi, 2))").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("(42, 84, 3.14)"), "{out:#?}");
    assert!(
        !out.notes_text().contains("re-running"),
        "the account went with the rebuild's own result: {out:#?}"
    );
    assert_eq!(
        out.cell(),
        5,
        "cell ids go on after the stored ones (the refused call took none): {out:#?}"
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

    // Nothing left to rebuild now.
    let again = rebuild(&second, "data", true).await;
    assert!(
        again.is_error && again.text.contains("nothing to rebuild"),
        "{again:#?}"
    );
    assert_eq!(lines(&runs), ["x", "x"]);
}

#[tokio::test]
async fn a_rebuild_is_bounded_by_resume_max_cells() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec("a = 1").await.assert_ok();
    first.exec("b = 2").await.assert_ok();
    first.stop().await;
    // Its state lost (as by a kill before any save): only a rebuild is left.
    forget_saved_states(place.state.path());

    // The earlier conversation's default session is 'earlier-default'.
    let second = place.server(&["--resume-max-cells", "1"]).await;
    let preview = rebuild(&second, "earlier-default", false).await;
    assert!(
        message(&preview)
            .contains("more than the 1 cell a rebuild may re-run (--resume-max-cells)"),
        "{preview:#?}"
    );
    // The confirm is refused as the preview said, and leaves it dormant.
    let bounded = rebuild(&second, "earlier-default", true).await;
    assert!(
        bounded.is_error
            && bounded
                .text
                .contains("would re-run 2 cells, more than the 1 cell one may")
            && bounded.text.contains("nothing was run"),
        "{bounded:#?}"
    );
    let out = second.exec_in("earlier-default", "a").await;
    assert_dormant(&out, "earlier-default", "1-2");
}

#[tokio::test]
async fn resume_off_keeps_nothing() {
    let place = Place::new();
    let first = place.server(&["--resume", "off"]).await;
    first.exec_in("data", "x = 1").await.assert_ok();
    first.stop().await;
    let second = place.server(&["--resume", "off"]).await;
    let rows = second.sessions().await;
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
    second.stop().await;
    first.stop().await;

    let third = place.server(&[]).await;
    let rows = third.sessions().await;
    assert!(row(&rows, "mine").is_some(), "{rows:#?}");
    assert!(
        row(&rows, "theirs").is_none(),
        "the second server wrote: {rows:#?}"
    );
    message(&rebuild(&third, "mine", true).await);
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
        said.contains(r#"python_sessions {action: "rebuild", session: "c", confirm: true}"#)
            && said.contains("re-runs cells 1,")
            && said.contains("happens again"),
        "{said}"
    );
    // Without confirm: what it would re-run, and nothing run.
    let preview = rebuild(&server, "c", false).await;
    let said = message(&preview);
    assert!(
        said.contains("A rebuild of session 'c' (its interpreter had crashed) re-runs cells 1 ")
            && said.contains(r#""confirm": true"#),
        "{preview:#?}"
    );
    let rebuilt = rebuild(&server, "c", true).await;
    assert!(
        message(&rebuilt).contains("was rebuilt by re-running cells 1 "),
        "{rebuilt:#?}"
    );
    let out = server.exec_in("c", "kept").await;
    assert_eq!(out.value(), Some("5"), "{out:#?}");

    // Nothing left to rebuild now.
    let again = rebuild(&server, "c", true).await;
    assert!(again.is_error, "{again:#?}");
    assert!(again.text.contains("nothing to rebuild"), "{again:#?}");
}

#[tokio::test]
async fn a_new_cell_after_a_crash_starts_a_new_path() {
    let (server, _crash) = crashed_after_one_cell().await;
    let fresh = server.exec_in("c", "fresh = 1\n'kept' in globals()").await;
    fresh.assert_ok();
    assert_eq!(fresh.value(), Some("False"), "{fresh:#?}");
    let late = rebuild(&server, "c", true).await;
    assert!(
        late.is_error && late.text.contains("nothing to rebuild"),
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
    first.stop().await;

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
    let state = path_str(place.state.path()).to_string();
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
    first.stop().await;
    // Without its saved state (as after a kill): only a rebuild is left.
    forget_saved_states(place.state.path());
    // The earlier conversation's 'r' comes back as 'earlier-r'.
    let second = place.server(&["--languages", "python,r"]).await;
    let rows = second.sessions().await;
    assert!(
        row(&rows, "r").is_none_or(|r| r["cells"] == 0),
        "'r' starts fresh: {rows:#?}"
    );
    let r = row(&rows, "earlier-r").unwrap_or_else(|| panic!("{rows:#?}"));
    assert_eq!(
        (r["state"].as_str(), r["language"].as_str()),
        (Some("dormant"), Some("r"))
    );
    let refused = second
        .call(
            "r_exec",
            json!({"session": "earlier-r", "code": "square(y)", "wait_s": 30}),
        )
        .await;
    assert_dormant(&refused, "earlier-r", "1");
    let rebuilt = rebuild(&second, "earlier-r", true).await;
    assert!(
        message(&rebuilt).contains("was rebuilt by re-running cells 1 "),
        "{rebuilt:#?}"
    );
    let out = second
        .call(
            "r_exec",
            json!({"session": "earlier-r", "code": "square(y)", "wait_s": 30}),
        )
        .await;
    out.assert_ok();
    assert!(out.text.contains("[1] 4"), "{out:#?}");
}

/// python_inspect on a dormant session without a saved state: refused,
/// nothing run.
#[tokio::test]
async fn inspecting_a_dormant_session_refuses_and_runs_nothing() {
    let place = Place::new();
    let runs = place.workspace.path().join("runs.txt");
    let first = place.server(&[]).await;
    first
        .exec_in(
            "data",
            "kept_value = 41\nopen('runs.txt', 'a').write('ran\\n')",
        )
        .await
        .assert_ok();
    first.stop().await;
    forget_saved_states(place.state.path());
    let second = place.server(&[]).await;
    let out = second
        .call("python_inspect", json!({"session": "data"}))
        .await;
    assert_dormant(&out, "data", "1");
    assert!(!out.text.contains("kept_value ="), "{out:#?}");
    assert_eq!(lines(&runs), ["ran"], "inspecting re-ran a cell");
    assert_eq!(state_of(&second, "data").await, "dormant");

    // Once rebuilt on request, inspecting shows the variables.
    message(&rebuild(&second, "data", true).await);
    let out = second
        .call("python_inspect", json!({"session": "data"}))
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert!(out.text.contains("kept_value"), "{out:#?}");
}

/// Waits (bounded) until the store in `place` holds `cells` cells of
/// session `name` with the last as its head: only then does a SIGKILL
/// leave them stored (the store commits a few milliseconds after a cell).
async fn stored(place: &Place, name: &str, cells: u64) {
    let db = std::fs::read_dir(place.state.path())
        .expect("read the state directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "sqlite3"))
        .expect("a store in the state directory");
    let deadline = std::time::Instant::now() + crate::support::EVENT_TIMEOUT;
    loop {
        let held =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .and_then(|conn| {
                    conn.query_row(
                        "SELECT (SELECT head FROM sessions WHERE name = ?1),
                        (SELECT count(*) FROM cells WHERE session = ?1)",
                        [name],
                        |r| Ok((r.get::<_, Option<u64>>(0)?, r.get::<_, u64>(1)?)),
                    )
                });
        if matches!(held, Ok((Some(head), n)) if head == cells && n == cells) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the store does not hold {cells} cells of '{name}': {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 44's three conversations: three servers in turn on one workspace,
/// each running one cell in its default session. No conversation re-runs
/// an earlier one's cell; each earlier default comes back dormant under a
/// name of its own, named in one line by the first result of the fresh
/// default.
#[tokio::test]
async fn three_conversations_in_turn_run_each_cell_once() {
    let place = Place::new();
    let log = place.workspace.path().join("log.txt");
    let mut firsts = Vec::new();
    for n in 0..3 {
        let server = place.server(&[]).await;
        let out = server
            .exec(&format!("open('log.txt', 'a').write('conv {n}\\n')"))
            .await;
        out.assert_ok();
        assert_eq!(out.value(), Some("7"), "{out:#?}");
        assert_eq!(out.cell(), 1, "default starts fresh: {out:#?}");
        firsts.push(out);
        if n == 2 {
            let rows = server.sessions().await;
            let listed: Vec<(&str, &str, u64)> = rows
                .iter()
                .map(|r| {
                    (
                        r["name"].as_str().unwrap_or_default(),
                        r["state"].as_str().unwrap_or_default(),
                        r["cells"].as_u64().unwrap_or_default(),
                    )
                })
                .collect();
            for want in [
                ("earlier-default", "dormant", 1),
                ("earlier-default-2", "dormant", 1),
            ] {
                assert!(listed.contains(&want), "{want:?} not in {rows:#?}");
            }
            // Each kept its own conversation's cell under its new name.
            for (name, conv) in [("earlier-default", 0), ("earlier-default-2", 1)] {
                let history = server
                    .call("python_history", json!({"session": name}))
                    .await;
                assert!(
                    !history.is_error && history.text.contains(&format!("conv {conv}")),
                    "{history:#?}"
                );
            }
            // The line is on the first result only.
            let next = server.exec("1 + 1").await;
            next.assert_ok();
            assert!(!next.notes_text().contains("Dormant"), "{next:#?}");
        }
        server.stop().await;
    }
    assert_eq!(lines(&log), ["conv 0", "conv 1", "conv 2"]);

    assert!(
        !firsts[0].notes_text().contains("Dormant"),
        "nothing was dormant: {:#?}",
        firsts[0]
    );
    let dormant_line = |out: &ToolOutput| {
        let notes = out.notes();
        let found: Vec<&String> = notes.iter().filter(|n| n.starts_with("Dormant")).collect();
        assert_eq!(found.len(), 1, "one line: {out:#?}");
        let line = found[0].clone();
        assert!(
            line.chars().count() <= 200 && !line.contains('\n'),
            "{line:?}"
        );
        line
    };
    // It names each earlier default with its cells, and the way back.
    let second = dormant_line(&firsts[1]);
    assert!(
        second.contains("earlier-default (")
            && !second.contains("earlier-default-2")
            && second.contains("python_sessions rebuild"),
        "{second:?}"
    );
    let third = dormant_line(&firsts[2]);
    assert!(
        third.contains("earlier-default (")
            && third.contains("earlier-default-2 (")
            && third.contains("python_sessions rebuild"),
        "{third:?}"
    );
}

/// A server killed (SIGKILL) after session 'data' ran a cell with a side
/// effect: the next server offers the session, never re-runs it by itself;
/// a confirmed rebuild re-runs its cells once and brings the variables back.
#[tokio::test]
async fn after_a_sigkill_a_session_is_offered_and_rebuilt_only_when_confirmed() {
    let place = Place::new();
    let side = place.workspace.path().join("side.txt");
    let first = place.server(&[]).await;
    first
        .exec_in("data", "x = 41\nopen('side.txt', 'a').write('ran\\n')")
        .await
        .assert_ok();
    first.exec_in("data", "y = x + 1").await.assert_ok();
    stored(&place, "data", 2).await;
    first.sigkill_and_reap(crate::support::EXIT_TIMEOUT).await;
    // Killed within moments of its cells, long before an idle save.
    assert_no_saved_state(place.state.path(), "data");
    assert_eq!(lines(&side), ["ran"]);

    // Listed at all: the killed server's lock on the store died with it.
    let second = place.server(&[]).await;
    assert_eq!(state_of(&second, "data").await, "dormant");

    let refused = second.exec_in("data", "(x, y)").await;
    assert_dormant(&refused, "data", "1-2");
    assert_eq!(
        lines(&side),
        ["ran"],
        "a call re-ran the killed session's cells"
    );

    let preview = rebuild(&second, "data", false).await;
    let said = message(&preview);
    assert!(
        said.contains("re-runs cells 1-2 in a fresh interpreter")
            && said.contains("Whatever they did outside the session happens again")
            && said.contains(
                r#"python_sessions {"action": "rebuild", "session": "data", "confirm": true}"#
            ),
        "{preview:#?}"
    );
    assert_eq!(lines(&side), ["ran"], "the preview re-ran cells");
    assert_eq!(state_of(&second, "data").await, "dormant");

    let rebuilt = rebuild(&second, "data", true).await;
    assert!(
        message(&rebuilt).contains("was rebuilt by re-running cells 1-2 in "),
        "{rebuilt:#?}"
    );
    assert_eq!(
        lines(&side),
        ["ran", "ran"],
        "a confirmed rebuild re-runs once"
    );
    let out = second.exec_in("data", "(x, y)").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("(41, 42)"), "{out:#?}");
    assert_eq!(lines(&side), ["ran", "ran"]);
}

/// `restore`, the action's old name, is still accepted and now previews
/// like `rebuild`: it runs nothing without confirm.
#[tokio::test]
async fn restore_is_accepted_as_rebuild_and_runs_nothing_without_confirm() {
    let place = Place::new();
    let side = place.workspace.path().join("side.txt");
    let first = place.server(&[]).await;
    first
        .exec_in("data", "x = 1\nopen('side.txt', 'a').write('ran\\n')")
        .await
        .assert_ok();
    first.stop().await;

    let second = place.server(&[]).await;
    let restore = |confirm: Option<bool>| {
        let mut args = json!({"action": "restore", "session": "data"});
        if let Some(c) = confirm {
            args["confirm"] = json!(c);
        }
        second.call("python_sessions", args)
    };
    for confirm in [None, Some(false)] {
        let preview = restore(confirm).await;
        let said = message(&preview);
        assert!(
            said.starts_with(
                "A rebuild of session 'data' (dormant since the server restarted) re-runs cells 1 "
            ) && said.contains(r#""confirm": true"#),
            "{preview:#?}"
        );
        assert_eq!(lines(&side), ["ran"], "restore ran a cell: {preview:#?}");
        assert_eq!(state_of(&second, "data").await, "dormant");
    }
    let rebuilt = restore(Some(true)).await;
    assert!(
        message(&rebuilt).contains("was rebuilt by re-running cells 1 "),
        "{rebuilt:#?}"
    );
    assert_eq!(lines(&side), ["ran", "ran"]);
    let out = second.exec_in("data", "x").await;
    assert_eq!(out.value(), Some("1"), "{out:#?}");
}
