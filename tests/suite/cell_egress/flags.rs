//! `--network domains` and `--allow-domain` refused at start, saying what
//! to do; the bounds docs/security.md states are the code's.

use std::path::Path;
use std::process::Stdio;

use super::START;
use crate::support::server_command;

/// Runs ferrepl with `args` until it exits: it must refuse to start. Its stderr.
async fn refused(args: &[&str]) -> String {
    let workdir = tempfile::tempdir().expect("workdir");
    let mut cmd = server_command();
    cmd.arg("--workdir")
        .arg(workdir.path())
        .args(args)
        .stdin(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(START, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{args:?}: ferrepl neither refused nor exited"))
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "ferrepl must refuse to start with {args:?}; it exited {}:\n{stderr}",
        out.status
    );
    stderr
}

#[tokio::test]
async fn bad_allow_domain_flags_are_refused_at_start_saying_what_to_do() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--network", "domains"],
            &["--network domains needs", "--allow-domain"],
        ),
        (
            &["--allow-domain", "api.example.com"],
            &["add --network domains"],
        ),
        (
            &["--network", "on", "--allow-domain", "api.example.com"],
            &["add --network domains"],
        ),
        (
            &[
                "--sandbox",
                "off",
                "--network",
                "domains",
                "--allow-domain",
                "api.example.com",
            ],
            &["needs the sandbox"],
        ),
        (
            &[
                "--no-namespaces",
                "--allow-degraded-isolation",
                "--network",
                "domains",
                "--allow-domain",
                "api.example.com",
            ],
            &["--network domains needs private network namespaces"],
        ),
        (
            &["--network", "domains", "--allow-domain", "*"],
            &["--allow-domain \"*\"", "alone"],
        ),
        (
            &["--network", "domains", "--allow-domain", "ok.example,**"],
            &["alone"],
        ),
        (
            &["--network", "domains", "--allow-domain", "*.com"],
            &["top-level"],
        ),
        (
            &[
                "--network",
                "domains",
                "--allow-domain",
                "api.*.example.com",
            ],
            &["wildcard may only open"],
        ),
        (
            &["--network", "domains", "--allow-domain", "*.10.0.0.1"],
            &["IP address cannot take a wildcard"],
        ),
        (
            &[
                "--network",
                "domains",
                "--allow-domain",
                "example.com:99999",
            ],
            &["not a port"],
        ),
        (
            &[
                "--network",
                "domains",
                "--allow-domain",
                "https://example.com/",
            ],
            &["--allow-domain \"https://example.com/\""],
        ),
        (
            &[
                "--network",
                "domains",
                "--allow-domain",
                "a.example,,b.example",
            ],
            &["empty"],
        ),
        (
            &["--network", "domains", "--allow-domain", "ex ample.com"],
            &["not a host"],
        ),
    ];
    for (args, says) in cases {
        let stderr = refused(args).await;
        for needle in *says {
            assert!(
                stderr.contains(needle),
                "{args:?}: the refusal says {needle:?}:\n{stderr}"
            );
        }
    }
}

/// docs/security.md states the cells' proxy's bounds: they are the code's.
#[test]
fn the_documented_connection_bounds_are_the_codes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/security.md");
    let text = std::fs::read_to_string(&path).expect("read docs/security.md");
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let stated = format!(
        "The cells' proxy serves {} connections at once, {} of them from one sandboxed process tree",
        ferrepl::egress::CELL_CONNECTIONS,
        ferrepl::egress::CELL_CONNECTIONS_PER_CLIENT
    );
    assert!(text.contains(&stated), "docs/security.md says: {stated:?}");
    let tenant = format!(
        "and {} from one tenant's",
        ferrepl::egress::CELL_CONNECTIONS_PER_TENANT
    );
    assert!(text.contains(&tenant), "docs/security.md says: {tenant:?}");
}
