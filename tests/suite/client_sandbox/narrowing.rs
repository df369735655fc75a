//! What cells, shell jobs, the file tools and installs may do under each
//! policy: narrowed from the operator's ceiling, never widened.

use super::*;

/// Codex's workspace-write: the workspace is writable, but its read-only
/// entries inside (`.aws`, not one of ferrepl's protected names) cannot be
/// made or written, by cells, shell jobs or file_write.
#[tokio::test]
async fn a_workspace_write_policy_protects_its_read_only_entries() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let policy = workspace_write(&w);

    let creds = w.join(".aws").join("credentials");
    let out = exec_under(&server, &write_cell(&creds, "stolen", true), policy.clone()).await;
    assert_write_denied(&out, "WS/.aws/credentials under workspace-write");
    assert!(
        !w.join(".aws").exists(),
        "the cell created .aws in the workspace"
    );

    let ok = exec_under(
        &server,
        &write_cell(&w.join("ok.txt"), "fine", false),
        policy.clone(),
    )
    .await;
    assert_write_worked(&ok, "WS/ok.txt under workspace-write");
    assert_eq!(
        std::fs::read_to_string(w.join("ok.txt")).expect("ok.txt"),
        "fine"
    );

    let job = meta_call(
        &server,
        "shell_exec",
        json!({ "command": "mkdir -p .aws && echo x > .aws/config; echo rc=$?" }),
        Some(policy.clone()),
    )
    .await;
    assert_ne!(job_rc(&job), "0", "the job wrote .aws: {job:#?}");
    assert!(!w.join(".aws").exists(), "the job created .aws");

    let file = meta_call(
        &server,
        "file_write",
        json!({ "path": ".aws/credentials", "text": "x" }),
        Some(policy.clone()),
    )
    .await;
    assert!(file.is_error, "file_write of .aws/credentials: {file:#?}");
    assert!(!w.join(".aws").exists(), "file_write created .aws");
    server.assert_alive();
    server.stop().await;
}

/// Shell jobs run under the call's policy: read-only cannot create a file
/// in the workspace, workspace-write can.
#[tokio::test]
async fn shell_jobs_run_under_the_calls_policy() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let touch = json!({ "command": "touch made_by_job; echo rc=$?" });

    let ro = meta_call(&server, "shell_exec", touch.clone(), Some(read_only(&w))).await;
    assert_ne!(job_rc(&ro), "0", "touch under read-only worked: {ro:#?}");
    assert!(
        !w.join("made_by_job").exists(),
        "the read-only job wrote the workspace"
    );

    let legacy = meta_call(
        &server,
        "shell_exec",
        touch.clone(),
        Some(legacy_read_only(&w)),
    )
    .await;
    assert_ne!(
        job_rc(&legacy),
        "0",
        "touch under the older read-only worked: {legacy:#?}"
    );
    assert!(!w.join("made_by_job").exists());

    let rw = meta_call(
        &server,
        "shell_exec",
        touch.clone(),
        Some(workspace_write(&w)),
    )
    .await;
    assert_eq!(
        job_rc(&rw),
        "0",
        "touch under workspace-write failed: {rw:#?}"
    );
    assert!(
        w.join("made_by_job").exists(),
        "the job did not create the file"
    );
    server.assert_alive();
    server.stop().await;
}

/// The older `sandboxPolicy` shape narrows cells too.
#[tokio::test]
async fn the_older_policy_shape_narrows_cells_too() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let path = w.join("legacy.txt");
    let ro = exec_under(
        &server,
        &write_cell(&path, "x", false),
        legacy_read_only(&w),
    )
    .await;
    assert_write_denied(&ro, "legacy read-only");
    assert!(!path.exists());
    let rw = exec_under(
        &server,
        &write_cell(&path, "y", false),
        legacy_workspace_write(&w),
    )
    .await;
    assert_write_worked(&rw, "legacy workspace-write");
    assert_eq!(std::fs::read_to_string(&path).expect("legacy.txt"), "y");
    server.assert_alive();
    server.stop().await;
}

/// file_write and file_delete follow the policy: refused under read-only,
/// done under workspace-write; python_install is refused when the policy
/// gives no network.
#[tokio::test]
async fn file_tools_and_installs_follow_the_policy() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let args = json!({ "path": "notes.txt", "text": "hi" });

    let ro = meta_call(&server, "file_write", args.clone(), Some(read_only(&w))).await;
    assert!(ro.is_error && ro.text.starts_with("error: "), "{ro:#?}");
    assert!(
        !w.join("notes.txt").exists(),
        "file_write wrote under read-only"
    );

    let none = meta_call(&server, "file_write", args.clone(), None).await;
    assert_refused(&none, &["--sandbox inherit"]);
    assert!(!w.join("notes.txt").exists());

    let rw = meta_call(
        &server,
        "file_write",
        args.clone(),
        Some(workspace_write(&w)),
    )
    .await;
    assert!(!rw.is_error, "file_write under workspace-write: {rw:#?}");
    assert_eq!(
        std::fs::read_to_string(w.join("notes.txt")).expect("notes.txt"),
        "hi"
    );

    let del = meta_call(
        &server,
        "file_delete",
        json!({ "path": "notes.txt" }),
        Some(read_only(&w)),
    )
    .await;
    assert!(del.is_error, "file_delete under read-only: {del:#?}");
    assert!(
        w.join("notes.txt").exists(),
        "file_delete removed under read-only"
    );

    let install = meta_call(
        &server,
        "python_install",
        json!({ "packages": ["six"] }),
        Some(workspace_write(&w)),
    )
    .await;
    assert_refused(&install, &["no network", "nothing was installed"]);
    let install = meta_call(
        &server,
        "python_install",
        json!({ "packages": ["six"] }),
        None,
    )
    .await;
    assert_refused(&install, &["--sandbox inherit"]);
    server.assert_alive();
    server.stop().await;
}

/// Full access from the client is the operator's setting, never more: a
/// place outside the workspace stays unwritable; the workspace is writable.
#[tokio::test]
async fn full_access_from_the_client_keeps_the_operators_ceiling() {
    let outside = visible_outside_dir();
    let target = outside.path().join("escaped.txt");
    let outside_arg = s(outside.path());
    let mut server =
        StdioServer::start(&["--sandbox", "inherit", "--allow-read", &outside_arg]).await;
    let w = ws(&server);
    for policy in [
        full_access(&w),
        json!({"sandboxPolicy": {"type": "danger-full-access"}, "sandboxCwd": s(&w)}),
        {
            let mut v = workspace_write(&w);
            v["permissionProfile"]["file_system"] = json!({"type": "unrestricted"});
            v["permissionProfile"]["network"] = json!("enabled");
            v
        },
    ] {
        let shown = policy.to_string();
        let out = exec_under(&server, &write_cell(&target, "out", false), policy.clone()).await;
        assert_write_denied(&out, &format!("outside the workspace under {shown}"));
        assert!(
            !target.exists(),
            "{shown}: a cell wrote outside the workspace"
        );
        let inside = exec_under(&server, &write_cell(&w.join("in.txt"), "in", false), policy).await;
        assert_write_worked(&inside, &format!("the workspace under {shown}"));
    }
    server.assert_alive();
    server.stop().await;
}

/// The operator's --allow-write place: written under full access, not
/// under read-only, and not under a workspace-write policy that does not
/// name it (there it may be read-only or out of the view altogether); a
/// workspace-write policy naming it writable lets it be written.
#[tokio::test]
async fn allow_write_places_follow_the_policy() {
    let extra = visible_outside_dir();
    let extra_arg = s(extra.path());
    let mut server =
        StdioServer::start(&["--sandbox", "inherit", "--allow-write", &extra_arg]).await;
    let w = ws(&server);
    let target = extra.path().join("extra.txt");

    let full = exec_under(
        &server,
        &write_cell(&target, "full", false),
        full_access(&w),
    )
    .await;
    assert_write_worked(&full, "--allow-write under full access");
    std::fs::remove_file(&target).expect("remove extra.txt");

    let ro = exec_under(&server, &write_cell(&target, "ro", false), read_only(&w)).await;
    assert_write_refused_or_hidden(&ro, "--allow-write under read-only");
    assert!(!target.exists());

    let rw = exec_under(
        &server,
        &write_cell(&target, "rw", false),
        workspace_write(&w),
    )
    .await;
    assert_write_refused_or_hidden(
        &rw,
        "--allow-write under a workspace-write that does not name it",
    );
    assert!(!target.exists());

    let mut named = workspace_write(&w);
    named["permissionProfile"]["file_system"]["entries"]
        .as_array_mut()
        .expect("entries")
        .push(json!({"path": {"type": "path", "path": extra_arg}, "access": "write"}));
    let both = exec_under(&server, &write_cell(&target, "named", false), named).await;
    assert_write_worked(&both, "--allow-write named writable by the policy");
    assert_eq!(
        std::fs::read_to_string(&target).expect("extra.txt"),
        "named"
    );
    server.assert_alive();
    server.stop().await;
}

/// "Reads are not narrowed" (src/sandbox/client.rs): a file in the
/// operator's --allow-write place stays readable under a read-only policy.
#[tokio::test]
async fn allow_write_places_stay_readable_under_read_only() {
    let extra = visible_outside_dir();
    let extra_arg = s(extra.path());
    let existing = extra.path().join("existing.txt");
    std::fs::write(&existing, "there").expect("write existing.txt");
    let code = format!(
        "{ATTEMPT}\nattempt('read', lambda: open({}).read())",
        py_path(&existing)
    );
    // The operator's own read-only mode shows the place (read-only).
    let explicit =
        StdioServer::start(&["--sandbox", "read-only", "--allow-write", &extra_arg]).await;
    let out = explicit.exec(&code).await;
    out.assert_ok();
    assert_eq!(
        outcome(&out, "read"),
        "OK 'there'",
        "--sandbox read-only shows the --allow-write place: {out:#?}"
    );
    explicit.stop().await;

    let mut server =
        StdioServer::start(&["--sandbox", "inherit", "--allow-write", &extra_arg]).await;
    let w = ws(&server);
    let full = exec_under(&server, &code, full_access(&w)).await;
    full.assert_ok();
    assert_eq!(outcome(&full, "read"), "OK 'there'", "{full:#?}");
    let ro = exec_under(&server, &code, read_only(&w)).await;
    ro.assert_ok();
    assert_eq!(
        outcome(&ro, "read"),
        "OK 'there'",
        "the --allow-write place should stay readable under a read-only policy: {ro:#?}"
    );
    server.assert_alive();
    server.stop().await;
}

/// python_export writes the workspace: refused under read-only (the
/// file absent), done under workspace-write.
#[tokio::test]
async fn python_export_follows_the_policy() {
    let mut server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    exec_under(&server, "a = 1", workspace_write(&w))
        .await
        .assert_ok();
    let args = json!({ "path": "out.py", "format": "py" });
    let ro = meta_call(&server, "python_export", args.clone(), Some(read_only(&w))).await;
    assert!(ro.is_error && ro.text.starts_with("error: "), "{ro:#?}");
    assert!(
        !w.join("out.py").exists(),
        "python_export wrote under read-only"
    );
    let none = meta_call(&server, "python_export", args.clone(), None).await;
    assert_refused(&none, &["--sandbox inherit"]);
    let rw = meta_call(&server, "python_export", args, Some(workspace_write(&w))).await;
    assert!(!rw.is_error, "python_export under workspace-write: {rw:#?}");
    assert!(
        std::fs::read_to_string(w.join("out.py"))
            .expect("out.py")
            .contains("a = 1")
    );
    server.assert_alive();
    server.stop().await;
}

/// A cell's TCP connection to the test's own listener.
fn tcp_cell(port: u16) -> String {
    format!(
        r#"{ATTEMPT}
import socket
def tcp():
    s = socket.create_connection(("127.0.0.1", {port}), timeout=10)
    s.close()
    return "connected"
attempt("tcp", tcp)
"#
    )
}

/// The network is the operator's, off when the policy says restricted:
/// with --network on, a restricted policy has no network and an enabled
/// one has; with the default --network off, an enabled policy has none.
#[tokio::test]
async fn the_network_is_narrowed_never_widened() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();

    let mut on = StdioServer::start(&["--sandbox", "inherit", "--network", "on"]).await;
    let w = ws(&on);
    let restricted = exec_under(&on, &tcp_cell(port), workspace_write(&w)).await;
    restricted.assert_ok();
    assert!(
        !outcome(&restricted, "tcp").starts_with("OK"),
        "a policy with the network restricted reached the test's listener: {restricted:#?}"
    );
    let mut enabled_policy = workspace_write(&w);
    enabled_policy["permissionProfile"]["network"] = json!("enabled");
    let enabled = exec_under(&on, &tcp_cell(port), enabled_policy.clone()).await;
    enabled.assert_ok();
    assert_eq!(
        outcome(&enabled, "tcp"),
        "OK 'connected'",
        "with --network on and the policy's network enabled the cell should connect: {enabled:#?}"
    );
    assert!(
        enabled
            .notes_text()
            .contains("changed to workspace-write, network on"),
        "{enabled:#?}"
    );
    on.assert_alive();
    on.stop().await;

    let mut off = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&off);
    let mut enabled_policy = workspace_write(&w);
    enabled_policy["permissionProfile"]["network"] = json!("enabled");
    let out = exec_under(&off, &tcp_cell(port), enabled_policy).await;
    out.assert_ok();
    assert!(
        !outcome(&out, "tcp").starts_with("OK"),
        "the policy's network widened the operator's --network off: {out:#?}"
    );
    off.assert_alive();
    off.stop().await;
}

/// With `--network domains`, a policy whose network is restricted takes
/// the `--allow-domain` hosts away from the call's cells too (no relay to
/// the cells' proxy, no proxy variables); an enabled one keeps them.
#[tokio::test]
async fn a_restricted_policy_takes_the_allowed_domains_away() {
    let sites = crate::cell_egress::TestSites::start().await;
    let allow = sites.allow_localhost();
    let server = StdioServer::start(&[
        "--sandbox",
        "inherit",
        "--network",
        "domains",
        "--allow-domain",
        &allow,
        "--egress-allow-private",
    ])
    .await;
    let w = ws(&server);
    let code = format!(
        "import os, urllib.request\ntry:\n    # NO_PROXY names localhost (the cell's own): the host's is asked for\n    # through the proxy, which must be there.\n    os.environ.pop('NO_PROXY', None); os.environ.pop('no_proxy', None)\n    os.environ['HTTP_PROXY']\n    r = 'ok ' + str(urllib.request.urlopen('http://localhost:{}/', timeout=20).status)\nexcept Exception as e:\n    r = 'failed ' + repr(e)\nr",
        sites.http
    );
    let restricted = exec_under(&server, &code, workspace_write(&w)).await;
    assert!(
        restricted.text.contains("failed"),
        "a restricted policy reached an allowed domain: {restricted:#?}"
    );
    let mut enabled = workspace_write(&w);
    enabled["permissionProfile"]["network"] = json!("enabled");
    let open = exec_under(&server, &code, enabled).await;
    assert!(open.text.contains("ok 200"), "{open:#?}");
}
