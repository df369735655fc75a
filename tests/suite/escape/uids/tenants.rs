//! Each tenant its own uid, kept across restarts; another tenant's 0600 file
//! stays closed where a view shows it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use serde_json::json;

use crate::support::{
    ATTEMPT, HttpServer, assert_failed, assert_succeeded, call, everything, is_root, outcome,
    own_uid, path_str, py, py_path, unique,
};

use super::*;

/// Claim: each tenant of a root server runs as its own uid (not root, not
/// another's), owns its workspace, and keeps that uid across a restart on
/// the same state directory with the tokens file reordered and the other
/// tenant coming first: a uid once given never moves to another name. With
/// --resume off too (the attack: with the uids kept in memory only, they
/// followed the first requests' order, and alice and bob swapped uids after
/// a restart). Unprivileged: tenants share the server's uid and the status
/// says DEGRADED.
#[tokio::test]
async fn each_tenant_has_its_own_uid_kept_across_restarts_and_reorders() {
    let range = "3100010-3100019";
    let place = Place::new();
    let tokens_dir = tempfile::tempdir().expect("tokens dir");
    let tokens = tokens_dir.path().join("tokens");
    write_tokens(&tokens, false);
    let launch = || {
        place.launch(
            range,
            &["--auth-token-file", path_str(&tokens), "--resume", "off"],
        )
    };

    let first = HttpServer::launch(launch()).await;
    let alice = first.connect_at("/mcp", ALICE).await;
    let (a, _) = seen_in(alice.peer(), "default", "").await;
    let bob = first.connect_at("/mcp", BOB).await;
    let (b, _) = seen_in(bob.peer(), "default", "").await;
    assert_runs_as(a.host_pid, a.uid, "alice's interpreter");
    assert_runs_as(b.host_pid, b.uid, "bob's interpreter");
    let alice_sandbox = sandbox_line(alice.peer()).await;
    if is_root() {
        assert!(a.uid != 0 && b.uid != 0, "tenants never run as root");
        assert_ne!(a.uid, b.uid, "two tenants never share a uid");
        assert_in_range(a.uid, range);
        assert_in_range(b.uid, range);
        assert_eq!(owner(&place.ws().join("alice")), a.uid);
        assert_eq!(owner(&place.ws().join("bob")), b.uid);
        let table = place.uid_table();
        assert_eq!(table.get("alice"), Some(&json!(a.uid)), "{table:?}");
        assert_eq!(table.get("bob"), Some(&json!(b.uid)), "{table:?}");
        let part = format!("sessions run as this tenant's own uid {}", a.uid);
        assert!(alice_sandbox.contains(&part), "{alice_sandbox}");
        assert!(!alice_sandbox.contains("DEGRADED"), "{alice_sandbox}");
    } else {
        assert_eq!((a.uid, b.uid), (own_uid(), own_uid()));
        assert!(
            alice_sandbox.contains("uid boundary DEGRADED"),
            "{alice_sandbox}"
        );
    }
    drop((alice, bob));
    drain(first).await;

    // Bob first in the file and first to come back.
    write_tokens(&tokens, true);
    let second = HttpServer::launch(launch()).await;
    let bob = second.connect_at("/mcp", BOB).await;
    let (b2, _) = seen_in(bob.peer(), "default", "").await;
    let alice = second.connect_at("/mcp", ALICE).await;
    let (a2, _) = seen_in(alice.peer(), "default", "").await;
    assert_runs_as(b2.host_pid, b.uid, "bob's interpreter after the restart");
    assert_runs_as(a2.host_pid, a.uid, "alice's interpreter after the restart");
    assert_eq!((a2.uid, b2.uid), (a.uid, b.uid));
    if is_root() {
        let table = place.uid_table();
        assert_eq!(table.len(), 2, "{table:?}");
        assert_eq!(table.get("alice"), Some(&json!(a.uid)), "{table:?}");
        assert_eq!(table.get("bob"), Some(&json!(b.uid)), "{table:?}");
    }
    drop((alice, bob));
    drain(second).await;
}

/// Attack: bob reads alice's files where a view shows them. The debug-build
/// hook FERREPL_TEST_TENANT_EXTRA_READ binds the whole --workdir (every
/// tenant's workspace) into bob's view, so only uids stand between them: as
/// root, alice's 0644 file is readable (the bind is there) and her 0600
/// file is not. Unprivileged, tenants share a uid: the status says
/// DEGRADED and bob does read it (what DEGRADED means).
#[tokio::test]
async fn another_tenants_0600_file_stays_closed_where_the_view_shows_it() {
    let place = Place::new();
    // The workdir's root is traversable (as it would be by mistake): the
    // file's mode and owner are what is tested.
    std::fs::set_permissions(place.ws(), PermissionsExt::from_mode(0o755)).expect("chmod");
    let tokens_dir = tempfile::tempdir().expect("tokens dir");
    let tokens = tokens_dir.path().join("tokens");
    write_tokens(&tokens, false);
    let launch = place
        .launch("3100020-3100029", &["--auth-token-file", path_str(&tokens)])
        .env("FERREPL_TEST_TENANT_EXTRA_READ", place.ws());
    let server = HttpServer::launch(launch).await;

    let secret = unique("alice-0600-");
    let public = unique("alice-0644-");
    let alice = server.connect_at("/mcp", ALICE).await;
    let wrote = call(
        alice.peer(),
        "python_exec",
        json!({ "code": format!(
            "import os\nos.chmod('.', 0o755)\n\
             open('secret', 'w').write({s})\nos.chmod('secret', 0o600)\n\
             open('public', 'w').write({p})\nos.chmod('public', 0o644)",
            s = py(&secret), p = py(&public)), "wait_s": 30 }),
    )
    .await;
    wrote.assert_ok();
    let alice_dir = place.ws().join("alice");
    let mode = std::fs::metadata(alice_dir.join("secret"))
        .expect("secret")
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let bob = server.connect_at("/mcp", BOB).await;
    let code = format!(
        "{ATTEMPT}\nattempt('public', lambda: open({p}).read())\nattempt('secret', lambda: open({s}).read())",
        p = py_path(&alice_dir.join("public")),
        s = py_path(&alice_dir.join("secret")),
    );
    let out = call(
        bob.peer(),
        "python_exec",
        json!({ "code": code, "wait_s": 30 }),
    )
    .await;
    out.assert_ok();
    assert_succeeded(&out, "public");
    assert!(outcome(&out, "public").contains(&public), "{out:#?}");
    let bob_sandbox = sandbox_line(bob.peer()).await;
    if is_root() {
        assert_failed(&out, "secret", "alice's 0600 file is not bob's uid's");
        assert!(
            outcome(&out, "secret").starts_with("PermissionError"),
            "{out:#?}"
        );
        assert!(!everything(&out).contains(&secret));
        assert!(!bob_sandbox.contains("DEGRADED"), "{bob_sandbox}");
    } else {
        assert!(
            bob_sandbox.contains("uid boundary DEGRADED"),
            "{bob_sandbox}"
        );
        assert!(outcome(&out, "secret").contains(&secret), "{out:#?}");
    }
}
