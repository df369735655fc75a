//! Attacks on `--sandbox inherit` by an agent that controls its code, the
//! tool arguments, the workspace and each call's `_meta`.

use super::*;

/// A `.pth` line that, at any interpreter's start, tries to create `path`
/// (silently failing where the sandbox refuses it).
fn pth_writing(path: &Path) -> String {
    format!(
        "import os; exec({:?})\n",
        format!(
            "try:\n open({:?}, 'w').write(str(os.getpid()))\nexcept Exception:\n pass",
            s(path)
        )
    )
}

/// DEFENDED (was a finding): a read-only cell cannot write the venv
/// ferrepl keeps (a `.pth` there runs at each interpreter's start); under
/// inherit no interpreter starts without a call's policy (no warm pool, no
/// start by a call that only reads, such as python_complete).
#[tokio::test]
async fn a_read_only_cell_gets_code_run_under_the_ceiling_through_the_kept_venv() {
    // No warm pool: the completion's own interpreter is the one.
    planted_pth_runs_under_the_ceiling(&["--sandbox", "inherit", "--warm-pool", "0"], false).await;
}

/// DEFENDED (was a finding): python_sessions reset takes the call's policy; on a
/// default session that is gone (deleted), has no session to put it on
/// (`set_client_sandbox` is a no-op): the reset starts the fresh session's
/// interpreter under the ceiling.
#[tokio::test]
async fn a_reset_of_a_deleted_default_session_starts_it_under_the_ceiling() {
    planted_pth_runs_under_the_ceiling(&["--sandbox", "inherit", "--warm-pool", "0"], true).await;
}

/// The same with the warm pool (the default): a pooled interpreter.
#[tokio::test]
async fn a_read_only_cell_gets_code_run_under_the_ceiling_through_the_pool() {
    planted_pth_runs_under_the_ceiling(&["--sandbox", "inherit"], false).await;
}

/// Plants a `.pth` from a read-only cell, then starts an interpreter with a
/// policy-less completion in a fresh numbered default session, or
/// (`reset`) deletes the default session and resets it with a call
/// carrying the read-only policy.
async fn planted_pth_runs_under_the_ceiling(flags: &[&str], reset: bool) {
    let server = StdioServer::start(flags).await;
    let w = ws(&server);
    let pwned = w.join("pwned.txt");
    let plant = format!(
        "import site\nopen(site.getsitepackages()[0] + '/zz_ferrepl_attack.pth', 'w').write({:?})\nprint('planted')",
        pth_writing(&pwned)
    );
    // The kept venv is read-only to a cell under a narrowed policy.
    let out = exec_under(&server, &plant, read_only(&w)).await;
    assert!(
        out.is_error && out.text.contains("Read-only file system"),
        "a read-only cell wrote the kept venv: {out:#?}"
    );

    let done = if reset {
        // python_sessions delete needs no policy; reset carries read-only.
        let del = json!({"action": "delete", "session": "default"});
        let gone = meta_call(&server, "python_sessions", del, None).await;
        assert!(!gone.is_error, "{gone:#?}");
        let reset = json!({"action": "reset", "session": "default"});
        meta_call(&server, "python_sessions", reset, Some(read_only(&w))).await
    } else {
        // A numbered default session comes into being on any call; this
        // one carries no policy and needs none.
        let args = json!({"session": "default-7", "code": "imp"});
        meta_call(&server, "python_complete", args, None).await
    };
    eprintln!("trigger: {}", done.text);
    // The pool refills in the background.
    for _ in 0..50 {
        if pwned.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        !pwned.exists(),
        "BREACH: under a read-only client policy, code planted by a cell ran with the workspace writable and created {}",
        pwned.display()
    );
}

/// A profile writing only `entries` (plus `/` read), network restricted.
fn profile(ws: &Path, entries: Vec<Value>) -> Value {
    let mut all =
        vec![json!({"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"})];
    all.extend(entries);
    json!({
        "permissionProfile": {
            "type": "managed",
            "file_system": {"type": "restricted", "entries": all},
            "network": "restricted"
        },
        "sandboxCwd": format!("file://{}", s(ws))
    })
}

fn write_entry(p: &Path) -> Value {
    json!({"path": {"type": "path", "path": s(p)}, "access": "write"})
}

/// DEFENDED: writable entries outside the operator's places (the host's
/// temporary directory, a directory of the test), a writable entry inside
/// the read-only workspace that is a link out of it, and a writable
/// `project_roots` subpath: none widens the view.
#[tokio::test]
async fn writable_entries_beyond_the_operators_places_give_nothing() {
    let server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let outside = visible_outside_dir();
    let elsewhere = outside.path().canonicalize().expect("outside dir");
    std::fs::create_dir(w.join("sub")).expect("sub");
    std::os::unix::fs::symlink(&elsewhere, w.join("link")).expect("link");
    let policy = profile(
        &w,
        vec![
            write_entry(&elsewhere),
            write_entry(&w.join("link")),
            write_entry(&w.join("sub")),
            json!({"path": {"type": "special", "value": {"kind": "project_roots", "subpath": "sub"}}, "access": "write"}),
        ],
    );
    for (target, what) in [
        (
            elsewhere.join("a.txt"),
            "a writable entry outside the operator's places",
        ),
        (
            w.join("link").join("b.txt"),
            "a writable entry that is a link out of the workspace",
        ),
        (
            w.join("sub").join("c.txt"),
            "a writable entry inside a read-only workspace",
        ),
        (w.join("d.txt"), "the workspace itself"),
    ] {
        let out = exec_under(&server, &write_cell(&target, "x", false), policy.clone()).await;
        assert_write_refused_or_hidden(&out, what);
        assert!(!target.exists(), "{what}: {} was created", target.display());
    }
}

/// DEFENDED: a `sandboxCwd` walking out through percent-escapes, a
/// `project_roots` subpath walking out, NUL in a path: refused, nothing ran.
#[tokio::test]
async fn escaped_walks_out_of_the_workspace_are_refused() {
    let server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let marker = w.join("ran.txt");
    let code = write_cell(&marker, "x", false);
    let mut walked = workspace_write(&w);
    walked["sandboxCwd"] = json!(format!("file://{}/%2e%2e/%2E%2E/etc", s(&w)));
    let mut nul = workspace_write(&w);
    nul["sandboxCwd"] = json!(format!("file://{}%00/x", s(&w)));
    let up = profile(
        &w,
        vec![
            json!({"path": {"type": "special", "value": {"kind": "project_roots", "subpath": "../.."}}, "access": "write"}),
        ],
    );
    let slashed = profile(
        &w,
        vec![
            json!({"path": {"type": "special", "value": {"kind": "project_roots", "subpath": "/etc"}}, "access": "write"}),
        ],
    );
    for policy in [walked, nul, up, slashed] {
        let out = meta_call(
            &server,
            "python_exec",
            json!({"code": code}),
            Some(policy.clone()),
        )
        .await;
        assert_refused(&out, &[]);
        assert!(!marker.exists(), "a refused policy ran the cell: {policy}");
    }
}

/// DEFENDED: `_meta` nested far deeper than any policy, and one with
/// thousands of entries, neither crash nor hang the server; the next call
/// with a proper policy works.
#[tokio::test]
async fn huge_or_deep_metadata_neither_crashes_nor_hangs_the_server() {
    let server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    let mut deep = json!("x");
    for _ in 0..500 {
        deep = json!([deep]);
    }
    let mut policy = workspace_write(&w);
    policy["permissionProfile"]["file_system"]["entries"][0]["path"]["value"]["deep"] = deep;
    let mut meta = serde_json::Map::new();
    meta.insert(KEY.to_string(), policy);
    let mut params = CallToolRequestParams::new("python_exec".to_string());
    params = params.with_arguments(json!({"code": "1"}).as_object().unwrap().clone());
    params.meta = Some(RequestMetaObject::from(meta));
    // rmcp drops a request it cannot decode (serde's depth limit) without
    // an answer: that caller waits, the server goes on.
    let got = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        server.peer().call_tool(params),
    )
    .await;
    eprintln!("deep: {got:?}");
    if let Ok(answer) = got {
        assert!(
            answer.as_ref().map_or(true, |r| r.is_error == Some(true)),
            "a 500-deep _meta should be refused: {answer:?}"
        );
    }
    let many: Vec<Value> = (0..5000)
        .map(|i| write_entry(&w.join(format!("e{i}"))))
        .collect();
    let out = meta_call(
        &server,
        "python_exec",
        json!({"code": "1"}),
        Some(profile(&w, many)),
    )
    .await;
    assert_refused(&out, &["256"]);
    let fine = exec_under(&server, "6 * 7", workspace_write(&w)).await;
    fine.assert_ok();
    assert_eq!(fine.value(), Some("42"), "{fine:#?}");
}

/// DEFENDED (was a finding): an install is refused under a policy that
/// writes nothing; under workspace-write it runs under that policy (with
/// the kept venv writable), not the jobs' ceiling. A wheel shipping a
/// `.pth` is code the agent puts in the kept venv; it runs in the next
/// interpreter, under that call's policy: read-only stays read-only.
#[tokio::test]
async fn python_install_runs_planted_code_under_the_calls_policy() {
    let server = StdioServer::start(&["--sandbox", "inherit", "--warm-pool", "0"]).await;
    let w = ws(&server);
    let pwned = w.join("pwned-by-install.txt");
    let mut policy = read_only(&w);
    policy["permissionProfile"]["network"] = json!("enabled");
    // Read-only with the network: installs are refused (they write).
    let refused = meta_call(
        &server,
        "python_install",
        json!({"packages": ["x"], "wait_s": 60}),
        Some(policy.clone()),
    )
    .await;
    assert!(
        refused.is_error && refused.text.contains("does not let this call write"),
        "{refused:#?}"
    );
    // Workspace-write with the network: the install may write the venv.
    let mut policy = workspace_write(&w);
    policy["permissionProfile"]["network"] = json!("enabled");
    let wheel = crate::support::wheel_with_files(
        &w,
        "zz_attack",
        "1.0",
        1,
        &[("zz_attack.pth", &pth_writing(&pwned))],
    );
    let name = wheel
        .file_name()
        .expect("name")
        .to_string_lossy()
        .to_string();
    let inst = meta_call(
        &server,
        "python_install",
        json!({"packages": [format!("./{name}")], "wait_s": 60}),
        Some(policy),
    )
    .await;
    assert!(!inst.is_error, "{inst:#?}");
    assert!(
        !pwned.exists(),
        "the install's own job ran the planted .pth"
    );
    // The planted code runs in the next interpreter: under the call's
    // read-only policy it cannot write the workspace.
    let cell = exec_under(&server, "import zz_attack\nzz_attack.VALUE", read_only(&w)).await;
    eprintln!("cell: {}", cell.text);
    assert!(
        !pwned.exists(),
        "BREACH: code an install planted ran with the workspace writable under a read-only policy ({})",
        pwned.display()
    );
}

/// DEFENDED (was a finding): a session saved at shutdown comes back dormant in the next
/// server with no client policy of its own; a call that takes none
/// (python_complete) wakes it, loading its saved state in an interpreter
/// under the ceiling. The state was made by a read-only cell: an object
/// whose pickle calls `exec` runs with the workspace writable.
#[tokio::test]
async fn a_saved_state_from_a_read_only_cell_is_loaded_under_the_ceiling() {
    let place = crate::durable::Place::new();
    let w = place.workspace.path().canonicalize().expect("workspace");
    let pwned = w.join("pwned-by-state.txt");
    let first = place
        .server(&["--sandbox", "inherit", "--warm-pool", "0"])
        .await;
    let code = format!(
        "class Boom:\n    def __reduce__(self):\n        return (exec, ({:?},))\nboom = Boom()\nprint('armed')",
        format!(
            "try:\n open({:?}, 'w').write('x')\nexcept Exception:\n pass",
            s(&pwned)
        )
    );
    let out = meta_call(
        &first,
        "python_exec",
        json!({"session": "data", "code": code, "wait_s": 30}),
        Some(read_only(&w)),
    )
    .await;
    out.assert_ok();
    assert!(
        !pwned.exists(),
        "the read-only cell itself wrote the workspace"
    );
    let status = first
        .close_and_wait_at_most(std::time::Duration::from_secs(60))
        .await;
    assert!(status.success(), "the first server exited with {status:?}");

    let mut second = place
        .server(&["--sandbox", "inherit", "--warm-pool", "0"])
        .await;
    let done = meta_call(
        &second,
        "python_complete",
        json!({"session": "data", "code": "bo"}),
        None,
    )
    .await;
    eprintln!("complete: {}", done.text);
    second.assert_alive();
    second.stop().await;
    assert!(
        !pwned.exists(),
        "BREACH: a read-only cell's saved state ran with the workspace writable when a policy-less call woke the session ({})",
        pwned.display()
    );
}

/// DEFENDED: two policies that differ only in a read-only entry inside the
/// writable workspace are two confinements (the key holds the protected
/// places): switching back and forth never reuses the wider interpreter.
#[tokio::test]
async fn policies_differing_only_in_a_protected_entry_are_told_apart() {
    let server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    std::fs::create_dir(w.join("keep")).expect("keep");
    let open = profile(&w, vec![write_entry(&w)]);
    let mut guarded = open.clone();
    guarded["permissionProfile"]["file_system"]["entries"]
        .as_array_mut()
        .unwrap()
        .push(json!({"path": {"type": "path", "path": s(&w.join("keep"))}, "access": "read"}));
    for (i, (policy, allowed)) in [(&guarded, false), (&open, true), (&guarded, false)]
        .into_iter()
        .enumerate()
    {
        let target = w.join("keep").join(format!("f{i}.txt"));
        let out = exec_under(&server, &write_cell(&target, "x", false), policy.clone()).await;
        if allowed {
            assert_write_worked(&out, "the workspace-write policy without the entry");
        } else {
            assert_write_denied(&out, "the policy with keep/ read-only");
            assert!(
                !target.exists(),
                "call {i}: {} was written",
                target.display()
            );
        }
    }
}

/// DEFENDED (was a finding, low): `project_roots` entries are `sandboxCwd` joined with
/// the subpath, never resolved, while path entries and the places they are
/// compared with are: a client whose working directory is named through a
/// link (the same directory) gets its read-only `project_roots` entries
/// left unprotected.
#[tokio::test]
async fn project_roots_entries_under_a_linked_cwd_still_protect() {
    let server = StdioServer::start(&["--sandbox", "inherit"]).await;
    let w = ws(&server);
    std::fs::create_dir(w.join("secret")).expect("secret");
    let links = tempfile::tempdir().expect("tempdir");
    let linked = links.path().join("project");
    std::os::unix::fs::symlink(&w, &linked).expect("link");
    let mut policy = profile(
        &w,
        vec![
            write_entry(&w),
            json!({"path": {"type": "special", "value": {"kind": "project_roots", "subpath": "secret"}}, "access": "read"}),
        ],
    );
    policy["sandboxCwd"] = json!(format!("file://{}", s(&linked)));
    let target = w.join("secret").join("x.txt");
    let out = exec_under(&server, &write_cell(&target, "x", false), policy).await;
    assert!(
        !target.exists(),
        "the policy's read-only project_roots entry (cwd named through a link) was not protected: {out:#?}"
    );
}
