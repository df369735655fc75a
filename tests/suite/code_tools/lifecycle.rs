//! Code calls tools across SIGHUP reloads and rebuilds after a restart.

use super::*;

// ---------------------------------------------------------------- start, reload

/// `ferrepl.servers()` in the default session.
async fn servers_listed(server: &StdioServer) -> Value {
    printed(&run(server, "print(json.dumps(ferrepl.servers()))").await)
}

#[tokio::test]
async fn sighup_reloads_the_servers_file_and_keeps_the_old_one_when_broken() {
    let up = Upstreams::new();
    let b_log = up.dir.path().join("b.log");
    let file = up.write(json!({ "a": up.own() }));
    let server = start(&file, &[]).await;
    assert_eq!(servers_listed(&server).await, json!(["a"]));
    let first = run(
        &server,
        r#"print(json.dumps(caught(ferrepl.call, "a", "echo", text="from a")))"#,
    )
    .await;
    assert_eq!(printed(&first), json!(["ok", "from a"]));
    assert!(
        !upstreams_logging_to(server.pid(), &up.log()).is_empty(),
        "server a runs under ferrepl"
    );

    up.write(json!({ "b": own_logging_to(&b_log) }));
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(server.pid() as libc::pid_t, libc::SIGHUP);
    }
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let listed = servers_listed(&server).await;
        if listed == json!(["b"]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload the file: servers() is still {listed}\n{}",
            server.stderr_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The server gone from the file was ended; the new one answers.
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let left = upstreams_logging_to(server.pid(), &up.log());
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server a, gone from the file, still runs after the reload: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = run(
        &server,
        r#"print(json.dumps({"a": caught(ferrepl.call, "a", "echo", text="x"),
                  "b": caught(ferrepl.call, "b", "echo", text="from b")}))"#,
    )
    .await;
    let got = printed(&after);
    assert_caught(&got["a"], "CallRefused", &["'a'", "b"]);
    assert_eq!(got["b"], json!(["ok", "from b"]), "{got:#}");

    std::fs::write(&file, "{ not json").expect("break the file");
    // SAFETY: as above.
    unsafe {
        libc::kill(server.pid() as libc::pid_t, libc::SIGHUP);
    }
    assert!(
        server
            .wait_stderr_contains("were not reloaded", EVENT_TIMEOUT)
            .await,
        "a broken file is reported: {}",
        server.stderr_log()
    );
    assert_eq!(servers_listed(&server).await, json!(["b"]));
    let still = run(
        &server,
        r#"print(json.dumps(caught(ferrepl.call, "b", "echo", text="still b")))"#,
    )
    .await;
    assert_eq!(printed(&still), json!(["ok", "still b"]));
    assert_eq!(
        log_text(&b_log)
            .lines()
            .filter(|l| l.starts_with("started"))
            .count(),
        1,
        "the failed reload left server b running: {}",
        log_text(&b_log)
    );
}

// ---------------------------------------------------------------- rebuild

#[tokio::test]
async fn a_rebuild_skips_cells_that_called_tools() {
    let up = Upstreams::new();
    let file = up.write(json!({ "own": up.own() }));
    let workspace = tempfile::tempdir().expect("workspace");
    let state = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir");
    let args = [
        "--workdir".to_string(),
        path_str(workspace.path()).to_string(),
        "--state-dir".to_string(),
        path_str(state.path()).to_string(),
        "--resume".to_string(),
        "on".to_string(),
        "--mcp-servers".to_string(),
        file.clone(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let launch = || StdioServer::launch(Launch::new(&args).without_workdir_flag());

    let first = launch().await;
    for code in [
        "x = 1",
        "import ferrepl\ny = ferrepl.call('own', 'echo', text='once')",
        "z = 3",
    ] {
        first
            .call(
                "python_exec",
                json!({"session": "tools", "code": code, "wait_s": 50}),
            )
            .await
            .assert_ok();
    }
    let status = first.close_and_wait().await;
    assert!(status.success(), "the first server exited with {status:?}");
    assert_eq!(up.count("called echo"), 1, "{}", log_text(&up.log()));

    let second = launch().await;
    // The preview says so before anything runs, and the rebuild after.
    let preview = second
        .call(
            "python_sessions",
            json!({"action": "rebuild", "session": "tools"}),
        )
        .await;
    assert!(
        !preview.is_error
            && preview.text.contains("re-runs cells 1, 3 ")
            && preview.text.contains(
                "Cell 2 would be skipped: it called MCP tools, which a rebuild does not repeat"
            ),
        "{preview:#?}"
    );
    let rebuilt = second
        .call(
            "python_sessions",
            json!({"action": "rebuild", "session": "tools", "confirm": true}),
        )
        .await;
    assert!(
        !rebuilt.is_error
            && rebuilt
                .text
                .contains("was rebuilt by re-running cells 1, 3 ")
            && rebuilt.text.contains(
                "Cell 2 was skipped: it called MCP tools, which a rebuild does not repeat"
            ),
        "{rebuilt:#?}"
    );
    let out = second
        .call(
            "python_exec",
            json!({"session": "tools", "code": "(x, z, 'y' in globals())", "wait_s": 50}),
        )
        .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("(1, 3, False)"), "{out:#?}");
    assert_eq!(
        up.count("called"),
        1,
        "the rebuild did not call the tool again: {}",
        log_text(&up.log())
    );
}
