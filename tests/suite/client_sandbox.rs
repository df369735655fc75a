//! `--sandbox inherit`: the client's sandbox policy, sent by Codex in each
//! tool call's `_meta["codex/sandbox-state-meta"]`, narrows the operator's
//! ceiling (workspace-write, --allow-write, --network) for the call.
//!
//! The server advertises the experimental capability only under inherit;
//! a call that starts or runs code without a readable policy is refused
//! and runs nothing, while calls that only poll or read need none; a
//! read-only policy keeps cells, shell jobs and the file tools off the
//! workspace (and the operator's --allow-write places); a workspace-write
//! policy lets them write it but protects its read-only entries inside
//! (`.aws`); full access is the operator's own setting, never more; a
//! policy change restarts the session with a note, its variables loaded
//! back from its saved state; a client working outside the workspace is
//! refused; installs need a policy with the network. `--sandbox off` and
//! `inherit-codex` stay accepted as aliases, and `ferrepl install` writes
//! `--sandbox inherit` for Codex, `workspace-write` for the others.
//!
//! The metadata shapes are those the real Codex CLI (0.171.0) sends, and
//! the older `sandboxPolicy` shape.

use std::path::{Path, PathBuf};
use std::process::Output;

use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::{Peer, RoleClient, ServiceError};
use serde_json::{Value, json};

use crate::support::{
    ATTEMPT, CALL_TIMEOUT, StdioServer, ToolOutput, outcome, py_path, server_binary,
    visible_outside_dir,
};

/// The `_meta` key of Codex's policy, and the capability asking for it.
const KEY: &str = "codex/sandbox-state-meta";

// ------------------------------------------------------------------ helpers

/// One tools/call of `tool` with `args`, carrying `policy` (if any) in
/// `_meta["codex/sandbox-state-meta"]`; rmcp's raw answer.
async fn call_with_meta(
    peer: &Peer<RoleClient>,
    tool: &str,
    args: Value,
    policy: Option<Value>,
) -> Result<CallToolResult, ServiceError> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    if let Some(policy) = policy {
        let mut meta = serde_json::Map::new();
        meta.insert(KEY.to_string(), policy);
        params.meta = Some(RequestMetaObject::from(meta));
    }
    match tokio::time::timeout(CALL_TIMEOUT, peer.call_tool(params)).await {
        Ok(result) => result,
        Err(_) => panic!("tools/call {tool} did not answer within {CALL_TIMEOUT:?}"),
    }
}

/// A call with `policy` that must produce a tool result.
async fn meta_call(
    server: &StdioServer,
    tool: &str,
    args: Value,
    policy: Option<Value>,
) -> ToolOutput {
    let shown = args.to_string();
    match call_with_meta(server.peer(), tool, args, policy).await {
        Ok(result) => ToolOutput::from_result(result),
        Err(e) => panic!(
            "tools/call {tool} {shown} failed at the protocol level: {e}\nserver stderr:\n{}",
            server.stderr_log()
        ),
    }
}

/// python_exec of `code` (default session) under `policy`.
async fn exec_under(server: &StdioServer, code: &str, policy: Value) -> ToolOutput {
    meta_call(
        server,
        "python_exec",
        json!({ "code": code, "wait_s": 30 }),
        Some(policy),
    )
    .await
}

/// The server's workspace as the kernel names it (what Codex sends).
fn ws(server: &StdioServer) -> PathBuf {
    server
        .workdir
        .path()
        .canonicalize()
        .expect("canonical workspace")
}

fn s(p: &Path) -> String {
    p.to_str().expect("a UTF-8 path").to_string()
}

/// Codex 0.171.0's workspace-write profile for workspace `ws`.
fn workspace_write(ws: &Path) -> Value {
    json!({
        "permissionProfile": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [
                    {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                    {"path": {"type": "path", "path": s(ws)}, "access": "write"},
                    {"path": {"type": "special", "value": {"kind": "slash_tmp"}}, "access": "write"},
                    {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "write"},
                    {"path": {"type": "path", "path": s(&ws.join(".git"))}, "access": "read", "missing_path_behavior": "skip"},
                    {"path": {"type": "path", "path": s(&ws.join(".aws"))}, "access": "read", "missing_path_behavior": "skip"}
                ]
            },
            "network": "restricted"
        },
        "sandboxCwd": format!("file://{}", s(ws)),
        "useLegacyLandlock": false
    })
}

/// Codex 0.171.0's read-only profile for workspace `ws`.
fn read_only(ws: &Path) -> Value {
    json!({
        "permissionProfile": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [
                    {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}
                ]
            },
            "network": "restricted"
        },
        "sandboxCwd": format!("file://{}", s(ws)),
        "useLegacyLandlock": false
    })
}

/// Codex 0.171.0's danger-full-access profile.
fn full_access(ws: &Path) -> Value {
    json!({
        "permissionProfile": {"type": "disabled"},
        "sandboxCwd": format!("file://{}", s(ws))
    })
}

/// Older Codex builds: `sandboxPolicy`, `sandboxCwd` a plain path.
fn legacy_read_only(ws: &Path) -> Value {
    json!({"sandboxPolicy": {"type": "read-only"}, "sandboxCwd": s(ws)})
}

fn legacy_workspace_write(ws: &Path) -> Value {
    json!({
        "sandboxPolicy": {"type": "workspace-write", "writable_roots": [], "network_access": false},
        "sandboxCwd": s(ws)
    })
}

/// A probing cell: `attempt("write", ...)` writing `text` to `path` (its
/// parent made first when `mkdir`).
fn write_cell(path: &Path, text: &str, mkdir: bool) -> String {
    let make = if mkdir {
        "os.makedirs(os.path.dirname(p), exist_ok=True)\n    "
    } else {
        ""
    };
    format!(
        r#"{ATTEMPT}
def write(p, t):
    {make}with open(p, "w") as f:
        f.write(t)
    return "written"
attempt("write", lambda: write({path}, {text:?}))
"#,
        path = py_path(path),
    )
}

/// Whether an `attempt` outcome is a refusal of a write: PermissionError,
/// or an OSError with EPERM, EACCES or EROFS.
fn is_denial(got: &str) -> bool {
    got.starts_with("PermissionError")
        || (got.starts_with("OSError")
            && [libc::EPERM, libc::EACCES, libc::EROFS]
                .iter()
                .any(|e| got.ends_with(&format!("errno={e}"))))
}

fn assert_write_denied(out: &ToolOutput, what: &str) {
    out.assert_ok();
    let got = outcome(out, "write");
    assert!(
        is_denial(&got),
        "{what}: the write should have been refused (PermissionError / EPERM / EACCES / EROFS), got '{got}'; result: {out:#?}"
    );
}

fn assert_write_worked(out: &ToolOutput, what: &str) {
    out.assert_ok();
    let got = outcome(out, "write");
    assert!(
        got.starts_with("OK"),
        "{what}: the write should have worked, got '{got}'; result: {out:#?}"
    );
}

/// Like `assert_write_denied`, also taking a place out of the session's
/// view (FileNotFoundError, ENOENT) as a refusal.
fn assert_write_refused_or_hidden(out: &ToolOutput, what: &str) {
    out.assert_ok();
    let got = outcome(out, "write");
    let hidden = got == format!("FileNotFoundError errno={}", libc::ENOENT);
    assert!(
        is_denial(&got) || hidden,
        "{what}: the write should have been refused (or the place hidden), got '{got}'; result: {out:#?}"
    );
}

/// Panics unless `out` is a refused call (isError, an "error: ..." text,
/// not a cell result) naming every one of `needles`.
fn assert_refused(out: &ToolOutput, needles: &[&str]) {
    assert!(out.is_error, "expected a refused call, got {out:#?}");
    assert!(
        out.text.starts_with("error: "),
        "a refused call's text starts with 'error: ': {out:#?}"
    );
    assert!(
        out.structured.get("status").is_none(),
        "a refused call is no cell or job result: {out:#?}"
    );
    for needle in needles {
        assert!(
            out.text.contains(needle),
            "the refusal does not mention {needle:?}: {out:#?}"
        );
    }
}

/// The exit code a shell job printed as `rc=<n>`.
fn job_rc(out: &ToolOutput) -> String {
    assert_eq!(out.str_field("status"), "exited", "{out:#?}");
    out.str_field("stdout")
        .lines()
        .find_map(|l| l.trim().strip_prefix("rc="))
        .unwrap_or_else(|| panic!("no rc= line in the job's stdout: {out:#?}"))
        .to_string()
}

/// Whether the server's initialize result advertised the capability.
fn advertises(server: &StdioServer) -> Option<serde_json::Map<String, Value>> {
    let info = server
        .peer()
        .peer_info()
        .expect("the server's initialize result");
    info.capabilities
        .experimental
        .as_ref()
        .and_then(|e| e.get(KEY).cloned())
}

// ------------------------------------------------------------------ tests

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

/// `off` and `inherit-codex` stay accepted; `off` says so in the status.
#[tokio::test]
async fn the_old_mode_names_are_still_accepted() {
    let mut off = StdioServer::start(&["--sandbox", "off"]).await;
    let status = off
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "{status:#?}");
    let sandbox = status.structured["server"]["sandbox"]
        .as_str()
        .unwrap_or_else(|| panic!("no server.sandbox: {status:#?}"));
    assert!(sandbox.contains("OFF"), "--sandbox off: {sandbox:?}");
    off.exec("1 + 1").await.assert_ok();
    off.assert_alive();
    off.stop().await;

    let mut codex = StdioServer::start(&["--sandbox", "inherit-codex"]).await;
    assert!(advertises(&codex).is_some());
    let w = ws(&codex);
    let refused = meta_call(&codex, "python_exec", json!({ "code": "1" }), None).await;
    assert_refused(&refused, &["--sandbox inherit"]);
    exec_under(&codex, "1", read_only(&w)).await.assert_ok();
    // The status line says who decides (a policy sent: listing and status
    // without one are another test's subject).
    let status = meta_call(
        &codex,
        "python_sessions",
        json!({ "action": "status" }),
        Some(read_only(&w)),
    )
    .await;
    assert!(!status.is_error, "{status:#?}");
    let sandbox = status.structured["server"]["sandbox"]
        .as_str()
        .unwrap_or_else(|| panic!("no server.sandbox: {status:#?}"));
    assert!(
        sandbox.contains("inherit") && sandbox.contains("client's sandbox policy"),
        "--sandbox inherit-codex: {sandbox:?}"
    );
    codex.assert_alive();
    codex.stop().await;
}

// ------------------------------------------------------------------ install

/// `ferrepl args...` in a fresh fake home.
fn run_install(home: &Path, args: &[&str]) -> Output {
    std::process::Command::new(server_binary())
        .args(args)
        .env_remove("UV")
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CODEX_HOME")
        .current_dir(home)
        .output()
        .expect("run ferrepl install")
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Codex's entry takes Codex's policy (`--sandbox inherit`), the others'
/// `workspace-write`; a --sandbox given after `--` is kept as it is.
#[test]
fn install_names_the_sandbox_mode_per_client() {
    let home = tempfile::tempdir().expect("home");
    let dry = run_install(home.path(), &["install", "--client", "codex", "--dry-run"]);
    assert!(dry.status.success(), "{}", said(&dry));
    assert!(
        said(&dry).contains("--sandbox inherit"),
        "the Codex entry should run with --sandbox inherit: {}",
        said(&dry)
    );
    assert!(
        !home.path().join(".codex/config.toml").exists(),
        "a dry run wrote the configuration"
    );

    let out = run_install(home.path(), &["install", "--client", "codex"]);
    assert!(out.status.success(), "{}", said(&out));
    let toml = std::fs::read_to_string(home.path().join(".codex/config.toml"))
        .expect("the Codex configuration");
    let doc: toml_edit::DocumentMut = toml.parse().expect("TOML");
    let args: Vec<&str> = doc["mcp_servers"]["ferrepl"]["args"]
        .as_array()
        .unwrap_or_else(|| panic!("no args in {toml}"))
        .iter()
        .map(|a| a.as_str().expect("a string"))
        .collect();
    assert!(
        args.windows(2).any(|p| p == ["--sandbox", "inherit"]),
        "{args:?}"
    );

    let cursor = run_install(home.path(), &["install", "--client", "cursor"]);
    assert!(cursor.status.success(), "{}", said(&cursor));
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(home.path().join(".cursor/mcp.json")).expect("cursor's file"),
    )
    .expect("JSON");
    assert_eq!(
        json["mcpServers"]["ferrepl"]["args"],
        json!(["--sandbox", "workspace-write"]),
        "{json:#}"
    );

    let other = tempfile::tempdir().expect("home");
    let kept = run_install(
        other.path(),
        &[
            "install",
            "--client",
            "codex",
            "--dry-run",
            "--",
            "--sandbox",
            "read-only",
        ],
    );
    assert!(kept.status.success(), "{}", said(&kept));
    let text = said(&kept);
    assert!(text.contains("--sandbox read-only"), "{text}");
    assert!(
        !text.contains("inherit"),
        "--sandbox given was overridden: {text}"
    );
    let kept = run_install(
        other.path(),
        &["install", "--client", "codex", "--", "--sandbox=read-only"],
    );
    assert!(kept.status.success(), "{}", said(&kept));
    let toml = std::fs::read_to_string(other.path().join(".codex/config.toml")).expect("config");
    assert!(
        toml.contains("--sandbox=read-only") && !toml.contains("inherit"),
        "{toml}"
    );
}

// ------------------------------------------------------------------ more

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
