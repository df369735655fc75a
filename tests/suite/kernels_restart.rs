//! Kernel sessions (--kernels) across a server restart (issue 47): a
//! stored kernel session comes back dormant with its history; the first
//! call that needs it starts a fresh kernel of the same name, saying its
//! variables are gone, and no cell runs twice (a cell appending to a file
//! of the workspace ran once in all). One whose kernel the new server does
//! not offer is refused, naming the kernel and --kernels, and comes back
//! once a server offers it again.

use std::path::Path;

use serde_json::{Value, json};

use crate::durable::{Place, message, state_of};
use crate::support::{StdioServer, ToolOutput, kernels};

/// A server on `place`, offering `offered` (a --kernels value; none when
/// empty) from the `nb` venv.
async fn server(place: &Place, offered: &str) -> StdioServer {
    let args: Vec<&str> = match offered {
        "" => Vec::new(),
        names => vec!["--kernels", names],
    };
    let launch = place
        .launch(&args)
        .env("JUPYTER_PATH", kernels::jupyter_path("nb", "python3"));
    StdioServer::launch(launch).await
}

async fn exec(server: &StdioServer, code: &str) -> ToolOutput {
    kernels::kernel_cell(server, "python_exec", "k", code).await
}

/// A first server's session `k` on python3, whose first cell appends a line
/// to `runs.txt` in the workspace, then stopped.
async fn stored_kernel_session(place: &Place) {
    let first = server(place, "python3").await;
    let created = first
        .call(
            "python_sessions",
            json!({"action": "create", "session": "k", "kernel": "python3"}),
        )
        .await;
    assert!(!created.is_error, "{created:#?}");
    exec(&first, "x = 41\nopen('runs.txt', 'a').write('ran\\n')")
        .await
        .assert_ok();
    let out = exec(&first, "x + 1").await;
    assert_eq!(out.value(), Some("42"), "{out:#?}");
    first.stop().await;
    assert_eq!(runs(place), ["ran"]);
}

/// The lines the cells appended to `runs.txt`.
fn runs(place: &Place) -> Vec<String> {
    lines(&place.workspace.path().join("runs.txt"))
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The cell numbers python_history lists for session `k`.
async fn history(server: &StdioServer) -> Vec<u64> {
    let out = server.call("python_history", json!({"session": "k"})).await;
    assert!(!out.is_error, "{out:#?}");
    out.structured["cells"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["cell"].as_u64()).collect())
        .unwrap_or_default()
}

/// Session `k`'s row in python_sessions list.
async fn row(server: &StdioServer) -> Value {
    let rows = server.sessions().await;
    rows.iter()
        .find(|r| r["name"] == "k")
        .cloned()
        .unwrap_or_else(|| panic!("no session 'k': {rows:#?}"))
}

const FRESH: &str = "Session 'k' runs on a fresh 'python3' kernel: the server restarted, and the kernel that ran cells 1-2 ended with it, so their variables are gone. No cell was re-run";

#[tokio::test]
async fn a_kernel_session_comes_back_on_a_fresh_kernel_and_no_cell_runs_twice() {
    let place = Place::new();
    stored_kernel_session(&place).await;

    let second = server(&place, "python3").await;
    let k = row(&second).await;
    assert_eq!(
        (&k["state"], &k["kernel"], &k["cells"]),
        (&json!("dormant"), &json!("python3"), &json!(2)),
        "{k:#?}"
    );
    let status = second
        .call("python_sessions", json!({"action": "status"}))
        .await;
    assert!(!status.is_error, "{status:#?}");
    assert_eq!(history(&second).await, [1, 2]);
    // A fresh default's first result names it with its kernel.
    let out = second.exec("1").await;
    out.assert_ok();
    assert!(
        out.notes_text()
            .contains("Dormant: k (2 cells, kernel python3)."),
        "{out:#?}"
    );
    assert_eq!(runs(&place), ["ran"], "listing re-ran a cell");

    let out = exec(&second, "'x' in globals()").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("False"), "{out:#?}");
    assert!(out.notes_text().contains(FRESH), "{out:#?}");
    assert_eq!(out.cell(), 3, "{out:#?}");
    assert_eq!(runs(&place), ["ran"], "the fresh kernel re-ran a cell");
    assert_eq!(state_of(&second, "k").await, "idle");

    let out = exec(&second, "y = 1").await;
    out.assert_ok();
    assert!(!out.notes_text().contains("fresh"), "said twice: {out:#?}");
    assert_eq!(history(&second).await, [1, 2, 3, 4]);
    // The cells after the restart are the session's path now.
    let rebuild = second
        .call(
            "python_sessions",
            json!({"action": "rebuild", "session": "k", "confirm": true}),
        )
        .await;
    assert!(
        rebuild.is_error && rebuild.text.contains("nothing to rebuild"),
        "{rebuild:#?}"
    );
    second.stop().await;
    assert_eq!(runs(&place), ["ran"]);
}

#[tokio::test]
async fn a_kernel_no_longer_offered_is_refused_until_a_server_offers_it() {
    let place = Place::new();
    stored_kernel_session(&place).await;

    let without = server(&place, "").await;
    let k = row(&without).await;
    assert_eq!(
        (&k["state"], &k["kernel"]),
        (&json!("dormant"), &json!("python3")),
        "{k:#?}"
    );
    let out = exec(&without, "x").await;
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text.contains(
            "session 'k' ran on the Jupyter kernel 'python3', which this server does not offer (this server offers no kernels; --kernels names them)"
        ) && out
            .text
            .contains("the operator restarts ferrepl with 'python3' in --kernels"),
        "{out:#?}"
    );
    // Nor does resume start anything in its place.
    let resumed = without
        .call(
            "python_sessions",
            json!({"action": "resume", "session": "k"}),
        )
        .await;
    assert!(
        resumed.is_error && resumed.text.contains("which this server does not offer"),
        "{resumed:#?}"
    );
    assert_eq!(history(&without).await, [1, 2]);
    assert_eq!(row(&without).await["state"], "dormant");
    without.stop().await;

    // Offered again: resume starts its fresh kernel, and says so there.
    let again = server(&place, "python3").await;
    let resumed = again
        .call(
            "python_sessions",
            json!({"action": "resume", "session": "k"}),
        )
        .await;
    assert!(message(&resumed).contains(FRESH), "{resumed:#?}");
    let out = exec(&again, "'x' in globals()").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("False"), "{out:#?}");
    assert!(!out.notes_text().contains("fresh"), "said twice: {out:#?}");
    assert_eq!(runs(&place), ["ran"], "a cell ran twice");
}
