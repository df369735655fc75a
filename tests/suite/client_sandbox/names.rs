//! The mode names (`off`, `inherit-codex` aliases) and what `ferrepl install`
//! writes for each client.

use super::*;

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
