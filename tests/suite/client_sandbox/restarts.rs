//! A policy change restarts a session under the new policy; sessions made,
//! reset and brought back after a restart take the call's policy.

use super::*;

/// A read-only policy: the cell cannot write the workspace. The next call's
/// workspace-write policy restarts the session with a note, its variables
/// loaded back from the state saved before (default flags: --resume on, a
/// state directory), and the write then works.
#[tokio::test]
async fn a_policy_change_restarts_the_session_and_brings_its_variables_back() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let made = w.join("made.txt");

    let first = exec_under(
        &server,
        &format!("kept = 41\n{}", write_cell(&made, "ro", false)),
        read_only(&w),
    )
    .await;
    assert_write_denied(&first, "a read-only policy");
    assert!(
        !made.exists(),
        "the read-only cell created {}",
        made.display()
    );
    assert!(
        !first.notes_text().contains("sandbox policy changed"),
        "the first call's interpreter ran nothing yet: no note expected: {first:#?}"
    );

    // The same policy again: no restart, the variable is there.
    let same = exec_under(&server, "kept", read_only(&w)).await;
    same.assert_ok();
    assert_eq!(same.value(), Some("41"), "{same:#?}");
    assert!(
        !same.notes_text().contains("sandbox policy changed"),
        "an unchanged policy must not restart the session: {same:#?}"
    );

    let second = exec_under(
        &server,
        &format!(
            "print('kept=' + repr(kept))\n{}",
            write_cell(&made, "rw", false)
        ),
        workspace_write(&w),
    )
    .await;
    let notes = second.notes_text();
    assert!(
        notes.contains(
            "The client's sandbox policy changed to workspace-write: session 'default' restarted under it."
        ),
        "the policy change should be noted: {second:#?}"
    );
    assert!(
        notes.contains("was resumed") && notes.contains("kept"),
        "with the default flags the session's saved state should come back (kept): {second:#?}"
    );
    assert_write_worked(&second, "a workspace-write policy");
    assert!(
        second.str_field("stdout").contains("kept=41"),
        "the variable should be back after the restart: {second:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(&made).expect("the file the cell wrote"),
        "rw"
    );

    // And back to read-only: restarted again, the write refused again.
    let third = exec_under(
        &server,
        &format!(
            "print('kept=' + repr(kept))\n{}",
            write_cell(&w.join("again.txt"), "x", false)
        ),
        read_only(&w),
    )
    .await;
    assert!(
        third
            .notes_text()
            .contains("The client's sandbox policy changed to read-only"),
        "{third:#?}"
    );
    assert_write_denied(&third, "read-only once more");
    assert!(third.str_field("stdout").contains("kept=41"), "{third:#?}");
    assert!(!w.join("again.txt").exists());
    server.assert_alive();
    server.stop().await;
}

/// With --resume off no state is saved: the change is noted with the
/// variables gone, and indeed they are.
#[tokio::test]
async fn without_saved_states_a_policy_change_says_the_variables_are_gone() {
    let mut server = StdioServer::start(&["--sandbox", "inherit", "--resume", "off"]).await;
    let w = ws(&server);
    exec_under(&server, "kept = 41", read_only(&w))
        .await
        .assert_ok();
    let out = exec_under(
        &server,
        &format!("{ATTEMPT}\nattempt('kept', lambda: kept)"),
        workspace_write(&w),
    )
    .await;
    out.assert_ok();
    let notes = out.notes_text();
    assert!(
        notes.contains("The client's sandbox policy changed to workspace-write")
            && notes.contains("Its variables are gone"),
        "{out:#?}"
    );
    assert!(
        outcome(&out, "kept").starts_with("NameError"),
        "the variable should be gone, as the note says: {out:#?}"
    );
    server.assert_alive();
    server.stop().await;
}

/// A policy change while a cell still runs (here waiting for input) is
/// refused, the cell left alone; once it ends the change goes through.
#[tokio::test]
async fn a_policy_change_waits_for_the_running_cell() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let waiting = meta_call(
        &server,
        "python_exec",
        json!({ "code": "answer = input('go? ')\nanswer", "wait_s": 30 }),
        Some(read_only(&w)),
    )
    .await;
    assert_eq!(waiting.status(), "waiting_input", "{waiting:#?}");

    let refused = exec_under(&server, "1", workspace_write(&w)).await;
    assert_refused(&refused, &["sandbox policy changed", "still runs a cell"]);

    // Answering the input needs no policy; the cell ends.
    let done = meta_call(
        &server,
        "python_wait",
        json!({ "input": "yes", "wait_s": 30 }),
        None,
    )
    .await;
    done.assert_ok();
    assert_eq!(done.value(), Some("'yes'"), "{done:#?}");

    let after = exec_under(&server, "1", workspace_write(&w)).await;
    after.assert_ok();
    assert!(
        after.notes_text().contains("sandbox policy changed"),
        "{after:#?}"
    );
    server.assert_alive();
    server.stop().await;
}

/// python_sessions create and reset start the interpreter under the call's
/// policy: a session created under read-only cannot write the workspace,
/// and the next call under the same policy does not restart it.
#[tokio::test]
async fn sessions_created_and_reset_take_the_calls_policy() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let created = meta_call(
        &server,
        "python_sessions",
        json!({ "action": "create", "session": "ro" }),
        Some(read_only(&w)),
    )
    .await;
    assert!(!created.is_error, "create under read-only: {created:#?}");
    let refused = meta_call(
        &server,
        "python_sessions",
        json!({ "action": "create", "session": "nopolicy" }),
        None,
    )
    .await;
    assert_refused(&refused, &["--sandbox inherit"]);

    let path = w.join("from_ro.txt");
    let out = meta_call(
        &server,
        "python_exec",
        json!({ "session": "ro", "code": format!("x = 1\n{}", write_cell(&path, "x", false)), "wait_s": 30 }),
        Some(read_only(&w)),
    )
    .await;
    assert_write_denied(&out, "a session created under read-only");
    assert!(
        !out.notes_text().contains("sandbox policy changed"),
        "the session was created under this policy: no restart expected: {out:#?}"
    );
    assert!(!path.exists());

    // Reset under workspace-write: the fresh interpreter can write.
    let reset = meta_call(
        &server,
        "python_sessions",
        json!({ "action": "reset", "session": "ro" }),
        Some(workspace_write(&w)),
    )
    .await;
    assert!(!reset.is_error, "reset under workspace-write: {reset:#?}");
    let out = meta_call(
        &server,
        "python_exec",
        json!({ "session": "ro", "code": write_cell(&path, "y", false), "wait_s": 30 }),
        Some(workspace_write(&w)),
    )
    .await;
    assert_write_worked(&out, "after a reset under workspace-write");
    assert!(
        !out.notes_text().contains("sandbox policy changed"),
        "the reset started the interpreter under this policy: {out:#?}"
    );
    assert_eq!(std::fs::read_to_string(&path).expect("from_ro.txt"), "y");
    server.assert_alive();
    server.stop().await;
}

/// A session saved at shutdown comes back in the next server under
/// inherit as it does under an explicit mode: its first call (with the
/// same policy) loads its saved state, running no cell.
#[tokio::test]
async fn a_saved_session_comes_back_after_a_restart_under_inherit() {
    for mode in ["workspace-write", "inherit"] {
        let place = crate::durable::Place::new();
        let w = place.workspace.path().canonicalize().expect("workspace");
        let policy = workspace_write(&w);
        let first = place.server(&["--sandbox", mode]).await;
        let out = meta_call(
            &first,
            "python_exec",
            json!({ "session": "data", "code": "kept = 41", "wait_s": 30 }),
            Some(policy.clone()),
        )
        .await;
        out.assert_ok();
        let status = first
            .close_and_wait_at_most(std::time::Duration::from_secs(60))
            .await;
        assert!(
            status.success(),
            "--sandbox {mode}: the first server exited with {status:?}"
        );

        let mut second = place.server(&["--sandbox", mode]).await;
        let out = meta_call(
            &second,
            "python_exec",
            json!({ "session": "data", "code": format!("{ATTEMPT}\nattempt('kept', lambda: kept)"), "wait_s": 30 }),
            Some(policy.clone()),
        )
        .await;
        out.assert_ok();
        assert!(
            out.notes_text().contains("Session 'data' was resumed"),
            "--sandbox {mode}: the saved state should be loaded: {out:#?}"
        );
        assert_eq!(
            outcome(&out, "kept"),
            "OK 41",
            "--sandbox {mode}: the variable should be back: {out:#?}"
        );
        second.assert_alive();
        second.stop().await;
    }
}
