//! Branching: `parent` runs a cell on the state right after an earlier cell
//! (0: a fresh interpreter), rebuilt by re-running the cells up to it; the
//! history shows each cell's parent and the current branch; bad parents are
//! refused without touching the session.

use serde_json::{Value, json};

use crate::support::StdioServer;

async fn history(server: &StdioServer) -> Vec<Value> {
    let out = server.call("python_history", json!({"session": "b"})).await;
    assert!(!out.is_error, "{out:#?}");
    out.structured["cells"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_cell_can_branch_from_an_earlier_one_and_back() {
    let server = StdioServer::start(&[]).await;
    server.exec_in("b", "a = 1").await.assert_ok();
    server.exec_in("b", "a = 2").await.assert_ok();
    server.exec_in("b", "b = a * 10").await.assert_ok();

    let branch = server.exec_after("b", json!(1), "a").await;
    branch.assert_ok();
    assert_eq!(branch.value(), Some("1"), "{branch:#?}");
    assert_eq!(branch.cell(), 4);
    let said = branch.notes_text();
    assert!(
        said.contains("switched to the state after cell 1") && said.contains("re-running cells 1 "),
        "{said}"
    );
    // Cell 3 is on the other branch.
    server.exec_in("b", "b").await.assert_raised("NameError");

    let back = server.exec_after("b", json!(3), "(a, b)").await;
    back.assert_ok();
    assert_eq!(back.value(), Some("(2, 20)"), "{back:#?}");
    assert!(
        back.notes_text().contains("re-running cells 1-3"),
        "{back:#?}"
    );

    // Asking for the state the interpreter holds re-runs nothing.
    let here = server.exec_after("b", json!(6), "a + b").await;
    here.assert_ok();
    assert_eq!(here.value(), Some("22"));
    assert!(!here.notes_text().contains("re-running"), "{here:#?}");

    let cells = history(&server).await;
    let parents: Vec<Value> = cells.iter().map(|c| c["parent"].clone()).collect();
    assert_eq!(
        parents,
        [
            json!(null),
            json!(1),
            json!(2),
            json!(1),
            json!(4),
            json!(3),
            json!(6)
        ],
        "{cells:#?}"
    );
    let current: Vec<u64> = cells
        .iter()
        .filter(|c| c["current"] == true)
        .filter_map(|c| c["cell"].as_u64())
        .collect();
    assert_eq!(current, [1, 2, 3, 6, 7], "{cells:#?}");
    let text = server
        .call("python_history", json!({"session": "b"}))
        .await
        .text;
    assert!(text.contains("current branch: 1-3, 6-7"), "{text}");
    assert!(text.contains("[cell 4 | after 1 |"), "{text}");
}

#[tokio::test]
async fn parent_zero_is_a_fresh_interpreter_and_failed_cells_are_skipped() {
    let server = StdioServer::start(&[]).await;
    server.exec_in("b", "a = 1").await.assert_ok();
    server
        .exec_in("b", "a = 2; 1/0")
        .await
        .assert_raised("ZeroDivisionError");
    server.exec_in("b", "c = 3").await.assert_ok();

    let fresh = server.exec_after("b", json!(0), "'a' in globals()").await;
    fresh.assert_ok();
    assert_eq!(fresh.value(), Some("False"), "{fresh:#?}");

    let rebuilt = server.exec_after("b", json!(3), "(a, c)").await;
    rebuilt.assert_ok();
    assert_eq!(
        rebuilt.value(),
        Some("(1, 3)"),
        "the failed cell is not re-run: {rebuilt:#?}"
    );
    assert!(
        rebuilt
            .notes_text()
            .contains("Cell 2 was skipped: it had failed"),
        "{rebuilt:#?}"
    );
}

#[tokio::test]
async fn bad_parents_are_refused_and_leave_the_session_alone() {
    let server = StdioServer::start(&[]).await;
    server.exec_in("b", "kept = 'yes'").await.assert_ok();
    for bad in [json!(99), json!(u64::MAX)] {
        let out = server.exec_after("b", bad.clone(), "1").await;
        assert!(out.is_error, "parent {bad}: {out:#?}");
        assert!(
            out.text.contains("is not a finished cell of session 'b'")
                && out.text.contains("its cells: 1"),
            "parent {bad}: {out:#?}"
        );
    }
    for bad in [json!(-1), json!("1"), json!(1.5), json!([1]), json!(true)] {
        let raw = server
            .try_call(
                "python_exec",
                json!({"session": "b", "code": "1", "parent": bad}),
            )
            .await;
        let refused = match &raw {
            Err(_) => true,
            Ok(r) => r.is_error == Some(true),
        };
        assert!(refused, "parent {bad} was accepted: {raw:#?}");
    }
    // A running cell is not a parent, and a branch waits for no one: the
    // session is busy.
    let running = server
        .call(
            "python_exec",
            json!({"session": "b", "code": "import time; time.sleep(3); done = 1", "wait_s": 0.2}),
        )
        .await;
    assert_eq!(running.str_field("status"), "running", "{running:#?}");
    let busy = server.exec_after("b", json!(1), "1").await;
    assert!(busy.is_error && busy.text.contains("busy"), "{busy:#?}");
    let finished = server
        .call("python_wait", json!({"session": "b", "wait_s": 30}))
        .await;
    finished.assert_ok();
    let after = server.exec_in("b", "(kept, done)").await;
    assert_eq!(after.value(), Some("('yes', 1)"), "{after:#?}");
}

#[tokio::test]
async fn r_cells_branch_too() {
    let server = StdioServer::start(&["--languages", "python,r"]).await;
    let r = |code: &str, parent: Option<u64>| {
        let mut args = json!({"code": code, "wait_s": 30});
        if let Some(p) = parent {
            args["parent"] = json!(p);
        }
        server.call("r_exec", args)
    };
    r("v <- 'first'", None).await.assert_ok();
    r("v <- 'second'", None).await.assert_ok();
    let out = r("cat(v, '\\n')", Some(1)).await;
    out.assert_ok();
    assert!(out.text.contains("first"), "{out:#?}");
    assert!(out.notes_text().contains("re-running cells 1 "), "{out:#?}");
}
