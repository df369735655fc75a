//! A missing uid boundary is named DEGRADED and refused when required or
//! when tenants would share a uid.

use crate::support::{HttpServer, Launch, StdioServer, is_root, own_uid, path_str};

use super::*;

/// Claim: where the boundary is missing the status says so and
/// --sandbox-require refuses to start. As root: --no-namespaces leaves the
/// sessions root without capabilities (DEGRADED), refused with
/// --sandbox-require; tenants with namespaces start under it. Unprivileged:
/// alone it is not degraded (even without namespaces), tenants (sharing
/// the server's uid) are refused under --sandbox-require.
#[tokio::test]
async fn a_missing_uid_boundary_is_named_and_refused_when_required() {
    let tokens_dir = tempfile::tempdir().expect("tokens dir");
    let tokens = tokens_dir.path().join("tokens");
    write_tokens(&tokens, false);
    let tenants = [
        "--auth-token-file",
        path_str(&tokens),
        "--tenant-uids",
        "3100030-3100039",
        "--sandbox-require",
        "--warm-pool",
        "0",
    ];

    let server = StdioServer::start(&["--no-namespaces", "--warm-pool", "0"]).await;
    let sandbox = sandbox_line(server.peer()).await;
    let (seen, _) = seen_in(server.peer(), "default", "").await;
    if is_root() {
        assert!(sandbox.contains("uid boundary DEGRADED"), "{sandbox}");
        assert_eq!(seen.uid, 0, "degraded: root without capabilities");
        // Refused; the missing namespaces are named first (the uid part
        // of the status is settled after that check).
        let stderr = refused_start(&["--no-namespaces", "--sandbox-require"]).await;
        assert!(
            stderr.contains("--sandbox-require")
                && (stderr.contains("uid boundary") || stderr.contains("NO private namespaces")),
            "{stderr}"
        );
        // With namespaces, tenants are held apart by uids: not refused.
        let mut up = HttpServer::start(&tenants, &[]).await;
        up.assert_alive();
    } else {
        let part = format!("sessions run as the server's uid {}", own_uid());
        assert!(
            sandbox.contains(&part) && !sandbox.contains("DEGRADED"),
            "{sandbox}"
        );
        assert_eq!(seen.uid, own_uid());
        let mut args = vec!["--http", "127.0.0.1:0"];
        args.extend_from_slice(&tenants);
        let stderr = refused_start(&args).await;
        assert!(stderr.contains("uid boundary"), "{stderr}");
    }
}

/// Attack: with --no-namespaces (Landlock still full) a server with tenants
/// started, warning only: their sessions shared the host's /dev/shm and
/// /proc (alice read and appended to bob's shared memory file, and read his
/// job's command line), as root without capabilities. Claim: tenants with
/// degraded isolation refuse to start, saying what is degraded, why it
/// matters across tenants and the two ways out; with
/// --allow-degraded-isolation they start (with a warning); one tenant alone
/// still starts, the status naming the gap. Unprivileged, tenants sharing
/// the server's uid are refused even with namespaces.
#[tokio::test]
async fn tenants_refuse_degraded_isolation_unless_the_operator_accepts_it() {
    let tokens_dir = tempfile::tempdir().expect("tokens dir");
    let tokens = tokens_dir.path().join("tokens");
    write_tokens(&tokens, false);
    let accept = "FERREPL_ALLOW_DEGRADED_ISOLATION";
    let tenants = [
        "--auth-token-file",
        path_str(&tokens),
        "--tenant-uids",
        "3100120-3100129",
        "--warm-pool",
        "0",
    ];
    let mut args = vec!["--http", "127.0.0.1:0", "--no-namespaces"];
    args.extend_from_slice(&tenants);
    let stderr = refused_start_with(&args, &[], &[accept]).await;
    for part in [
        "refusing to serve tenants on degraded isolation",
        "NO private namespaces (turned off with --no-namespaces)",
        "/dev/shm",
        "/proc",
        "without --no-namespaces",
        "--allow-degraded-isolation",
    ] {
        assert!(stderr.contains(part), "{part:?} in {stderr}");
    }
    let uid_part = if is_root() {
        "uid boundary DEGRADED: sessions run as root without capabilities"
    } else {
        "uid boundary DEGRADED: every tenant's sessions run as the server's uid"
    };
    assert!(stderr.contains(uid_part), "{stderr}");

    // The operator names the risk: it starts, says so, and serves.
    let mut accepted = vec!["--no-namespaces", "--allow-degraded-isolation"];
    accepted.extend_from_slice(&tenants);
    let server = HttpServer::launch(Launch::new(&accepted).env_remove(accept)).await;
    let alice = server.connect_at("/mcp", ALICE).await;
    let (seen, _) = seen_in(alice.peer(), "default", "").await;
    assert_eq!(seen.uid, if is_root() { 0 } else { own_uid() });
    let log = server.stderr_log();
    assert!(
        log.contains("tenants run on degraded isolation, as --allow-degraded-isolation accepts"),
        "{log}"
    );
    drop(alice);
    drop(server);

    // One tenant alone: today's warning, no refusal.
    let sole = StdioServer::launch(
        Launch::new(&["--no-namespaces", "--warm-pool", "0"]).env_remove(accept),
    )
    .await;
    let sandbox = sandbox_line(sole.peer()).await;
    assert!(sandbox.contains("NO private namespaces"), "{sandbox}");
    assert!(
        sole.stderr_log().contains("NOT in force: namespaces"),
        "{}",
        sole.stderr_log()
    );
    assert!(!sole.stderr_log().contains("refusing"));

    if !is_root() {
        // With namespaces, tenants still share the server's uid.
        let mut args = vec!["--http", "127.0.0.1:0"];
        args.extend_from_slice(&tenants);
        let stderr = refused_start_with(&args, &[], &[accept]).await;
        assert!(
            stderr.contains("refusing to serve tenants on degraded isolation")
                && stderr.contains(uid_part)
                && !stderr.contains("NO private namespaces"),
            "{stderr}"
        );
    }
}
