//! The capability, and calls with no policy, a malformed one, or one from
//! a client working outside the workspace.

use super::*;

/// The experimental capability is what makes Codex send its policy: under
/// inherit (and its alias) it is there, empty; with an explicit mode not.
#[tokio::test]
async fn the_capability_is_advertised_only_under_inherit() {
    for flag in ["inherit", "inherit-codex"] {
        let server = StdioServer::start(&["--sandbox", flag]).await;
        let got = advertises(&server);
        assert_eq!(
            got,
            Some(serde_json::Map::new()),
            "--sandbox {flag}: capabilities.experimental[{KEY:?}] should be {{}}"
        );
        server.stop().await;
    }
    for args in [&["--sandbox", "workspace-write"][..], &[][..]] {
        let server = StdioServer::start(args).await;
        assert_eq!(
            advertises(&server),
            None,
            "{args:?}: the capability must not be advertised"
        );
        server.stop().await;
    }
}

/// Without a policy, or with one that cannot be read, a call that runs code
/// is refused and runs nothing; the server keeps serving, a good call
/// works, and polling calls need no policy.
#[tokio::test]
async fn calls_without_a_readable_policy_are_refused_and_run_nothing() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let marker = w.join("ran.txt");
    let code = format!("open({}, 'w').write('x')\n'ran'", py_path(&marker));

    let none = meta_call(&server, "python_exec", json!({ "code": code }), None).await;
    assert_refused(&none, &["--sandbox inherit", "explicit --sandbox", KEY]);

    let mut host = json!(workspace_write(&w));
    host["sandboxCwd"] = json!("file://host/x");
    let sideways = json!({
        "permissionProfile": {"type": "sideways"},
        "sandboxCwd": format!("file://{}", s(&w))
    });
    let relative = json!({"sandboxPolicy": {"type": "read-only"}, "sandboxCwd": "proj"});
    let no_cwd = json!({"permissionProfile": {"type": "disabled"}});
    let not_object = json!("workspace-write");
    let write_glob = {
        let mut v = workspace_write(&w);
        v["permissionProfile"]["file_system"]["entries"]
            .as_array_mut()
            .expect("entries")
            .push(
                json!({"path": {"type": "glob_pattern", "pattern": "**/*.py"}, "access": "write"}),
            );
        v
    };
    let cases = [
        (host, "names a host"),
        (sideways, "permissionProfile type"),
        (relative, "not an absolute path"),
        (no_cwd, "no sandboxCwd"),
        (not_object, "not an object"),
        (write_glob, "glob"),
    ];
    for (policy, why) in cases {
        let shown = policy.to_string();
        let out = meta_call(
            &server,
            "python_exec",
            json!({ "code": code }),
            Some(policy),
        )
        .await;
        assert!(
            out.is_error && out.text.starts_with("error: "),
            "policy {shown}: expected a refusal, got {out:#?}"
        );
        for needle in [why, "cannot be read", "nothing ran", "explicit --sandbox"] {
            assert!(
                out.text.contains(needle),
                "policy {shown}: the refusal should say {needle:?}: {out:#?}"
            );
        }
    }
    // Neither did shell_exec nor python_run_file run without a policy.
    let job = meta_call(
        &server,
        "shell_exec",
        json!({ "command": format!("touch {}", s(&marker)) }),
        None,
    )
    .await;
    assert_refused(&job, &["--sandbox inherit"]);
    std::fs::write(w.join("script.py"), &code).expect("write a script");
    let file = meta_call(
        &server,
        "python_run_file",
        json!({ "path": "script.py" }),
        None,
    )
    .await;
    assert_refused(&file, &["--sandbox inherit"]);
    assert!(
        !marker.exists(),
        "a refused call ran code: {} exists",
        marker.display()
    );
    server.assert_alive();

    // A good call works on the same server.
    let ok = exec_under(&server, "print('hello')\n6 * 7", workspace_write(&w)).await;
    ok.assert_ok();
    assert_eq!(ok.value(), Some("42"), "{ok:#?}");

    // Calls that only poll or read need no policy.
    let wait = meta_call(&server, "python_wait", json!({ "wait_s": 1 }), None).await;
    assert!(
        !wait.text.contains("--sandbox inherit"),
        "python_wait was refused for want of a policy: {wait:#?}"
    );
    let output = meta_call(&server, "python_output", json!({}), None).await;
    assert!(
        !output.is_error,
        "python_output without a policy: {output:#?}"
    );
    assert!(
        output.text.contains("hello"),
        "python_output should show the last cell's output: {output:#?}"
    );
    for (tool, args) in [
        ("python_history", json!({})),
        ("python_inspect", json!({})),
        ("file_list", json!({})),
        ("file_read", json!({ "path": "script.py" })),
    ] {
        let out = meta_call(&server, tool, args.clone(), None).await;
        assert!(
            !out.is_error,
            "{tool} {args} needs no policy, but failed: {out:#?}"
        );
    }
    server.assert_alive();
    server.stop().await;
}

/// python_sessions list and status only read: they need no policy, like
/// python_wait and python_output (the harness's own `sessions()` and
/// every client listing sessions call them so).
#[tokio::test]
async fn listing_sessions_and_status_need_no_policy() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    exec_under(&server, "1", read_only(&w)).await.assert_ok();
    for args in [
        json!({}),
        json!({ "action": "list" }),
        json!({ "action": "status" }),
    ] {
        let out = meta_call(&server, "python_sessions", args.clone(), None).await;
        assert!(
            !out.is_error,
            "python_sessions {args} needs no policy, but failed: {out:#?}"
        );
    }
    // With a policy they work too.
    let out = meta_call(&server, "python_sessions", json!({}), Some(read_only(&w))).await;
    assert!(!out.is_error, "{out:#?}");
    server.assert_alive();
    server.stop().await;
}

/// A client whose working directory is not the workspace is refused, for
/// cells, shell jobs and the file tools alike.
#[tokio::test]
async fn a_client_working_outside_the_workspace_is_refused() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let other = tempfile::tempdir().expect("another project");
    let other_path = other.path().canonicalize().expect("canonical");
    for cwd in [PathBuf::from("/"), other_path.clone()] {
        let mut policy = workspace_write(&cwd);
        policy["sandboxCwd"] = json!(format!("file://{}", s(&cwd)));
        let marker = w.join("outside_cwd.txt");
        let out = exec_under(&server, &write_cell(&marker, "x", false), policy.clone()).await;
        assert_refused(&out, &["outside this server's workspace"]);
        assert!(!marker.exists());
        let job = meta_call(
            &server,
            "shell_exec",
            json!({ "command": "touch outside_cwd.txt" }),
            Some(policy.clone()),
        )
        .await;
        assert_refused(&job, &["outside this server's workspace"]);
        let file = meta_call(
            &server,
            "file_write",
            json!({ "path": "outside_cwd.txt", "text": "x" }),
            Some(policy.clone()),
        )
        .await;
        assert_refused(&file, &["outside this server's workspace"]);
        assert!(!marker.exists());
    }
    // A subdirectory of the workspace is fine.
    std::fs::create_dir(w.join("sub")).expect("mkdir sub");
    let mut policy = workspace_write(&w);
    policy["sandboxCwd"] = json!(format!("file://{}", s(&w.join("sub"))));
    exec_under(&server, "1", policy).await.assert_ok();
    server.assert_alive();
    server.stop().await;
}
