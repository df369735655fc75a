use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;
use crate::sandbox::protected::Protected;

/// `_meta` as Codex 0.171.0 sent it (`codex exec -s workspace-write`,
/// captured from the real CLI; the workspace replaced by `ws`).
fn workspace_write(ws: &Path) -> Value {
    let w = ws.display().to_string();
    json!({
        "permissionProfile": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "path", "path": w}, "access": "write"},
            {"path": {"type": "special", "value": {"kind": "slash_tmp"}}, "access": "write"},
            {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "write"},
            {"path": {"type": "path", "path": format!("{w}/.git")}, "access": "read", "missing_path_behavior": "skip"},
            {"path": {"type": "path", "path": format!("{w}/.agents")}, "access": "read", "missing_path_behavior": "skip"},
            {"path": {"type": "path", "path": format!("{w}/.codex")}, "access": "read", "missing_path_behavior": "skip"},
            {"path": {"type": "path", "path": format!("{w}/.aws")}, "access": "read", "missing_path_behavior": "skip"}
        ]}, "network": "restricted"},
        "codexLinuxSandboxExe": "/x/codex",
        "sandboxCwd": format!("file://{w}"),
        "useLegacyLandlock": false,
        "useMxc": false
    })
}

/// `codex exec -s read-only` and `-s danger-full-access` (Codex 0.171.0).
fn read_only(ws: &Path) -> Value {
    json!({
        "permissionProfile": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}
        ]}, "network": "restricted"},
        "sandboxCwd": format!("file://{}", ws.display()),
        "useLegacyLandlock": false
    })
}

fn full_access(ws: &Path) -> Value {
    json!({"permissionProfile": {"type": "disabled"}, "sandboxCwd": format!("file://{}", ws.display())})
}

fn meta(state: Value) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    // Codex sends the same object under both names; only `-meta` is read.
    m.insert(
        "codex/sandbox-state".into(),
        json!({"permissionProfile": {"type": "disabled"}}),
    );
    m.insert(META_KEY.into(), state);
    m
}

fn parse(state: Value) -> Result<ClientPolicy, String> {
    ClientPolicy::from_meta(&meta(state)).expect("a policy")
}

fn ceiling(ws: &Path, write: Vec<PathBuf>) -> SandboxConfig {
    SandboxConfig {
        mode: SandboxMode::WorkspaceWrite,
        network: false,
        require: false,
        memory_limit: None,
        max_processes: 10,
        max_file_bytes: 1,
        max_open_files: 1,
        workspace: ws.to_path_buf(),
        state: PathBuf::from("/state"),
        view: Default::default(),
        read: Vec::new(),
        installer_read: Vec::new(),
        write: write.clone(),
        devices: Vec::new(),
        allowed_python: Vec::new(),
        egress: None,
        cell_egress: None,
        egress_hosts: Vec::new(),
        namespaces: true,
        env: BTreeMap::new(),
        active: String::new(),
        cgroups: None,
        identity: None,
        idmap: false,
        named_read: Vec::new(),
        idmapped: Vec::new(),
        identity_gap: None,
        namespaces_gap: None,
        protected: Some(
            Protected::new(
                std::iter::once(ws.to_path_buf()).chain(write).collect(),
                &[],
                &[],
            )
            .expect("built-in"),
        ),
    }
}

fn dirs() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ws = tmp.path().canonicalize().expect("real").join("ws");
    std::fs::create_dir(&ws).expect("ws");
    (tmp, ws)
}

#[test]
fn codex_workspace_write_keeps_the_workspace_writable_and_protects_its_read_only_entries() {
    let (_t, ws) = dirs();
    let policy = parse(workspace_write(&ws)).expect("parsed");
    assert!(!policy.network);
    assert_eq!(policy.cwd, ws);
    assert!(policy.may_write(&ws.join("src/a.py")));
    assert!(!policy.may_write(&ws.join(".aws/credentials")));
    assert!(!policy.may_write(Path::new("/etc/passwd")));
    let n = narrow(&ceiling(&ws, Vec::new()), &policy, &[]);
    assert_eq!(n.config.mode, SandboxMode::WorkspaceWrite);
    let paths = &n.config.protected.as_ref().expect("protected").paths;
    // .git, .agents and .codex are protected names already; .aws is not.
    assert_eq!(paths, &vec![ws.join(".aws")]);
    assert_eq!(n.summary, "workspace-write");
}

#[test]
fn codex_read_only_makes_every_shared_place_read_only_but_ferrepls_own() {
    let (_t, ws) = dirs();
    let allowed = ws.parent().expect("parent").join("data");
    let own = PathBuf::from("/state/venvs/x");
    let policy = parse(read_only(&ws)).expect("parsed");
    let n = narrow(
        &ceiling(&ws, vec![allowed, own.clone()]),
        &policy,
        std::slice::from_ref(&own),
    );
    assert_eq!(n.config.mode, SandboxMode::ReadOnly);
    assert_eq!(n.config.write, vec![own]);
    assert!(n.config.protected.is_none());
    assert_eq!(n.summary, "read-only");
}

#[test]
fn full_access_from_the_client_is_the_operators_ceiling_never_more() {
    let (_t, ws) = dirs();
    let roof = ceiling(&ws, Vec::new());
    for state in [
        full_access(&ws),
        json!({"permissionProfile": {"type": "external", "network": "enabled"}, "sandboxCwd": ws.display().to_string()}),
        json!({"sandboxPolicy": {"type": "danger-full-access"}, "sandboxCwd": ws.display().to_string()}),
        json!({"sandboxPolicy": {"type": "workspace-write", "writable_roots": ["/"], "network_access": true}, "sandboxCwd": ws.display().to_string()}),
    ] {
        let policy = parse(state).expect("parsed");
        let n = narrow(&roof, &policy, &[]);
        assert_eq!(n.key, key_of(&roof), "{policy:?}");
        // The operator's network stays off however the client asks.
        assert!(!n.config.network);
    }
}

#[test]
fn writable_roots_outside_the_operators_places_are_not_granted() {
    let (_t, ws) = dirs();
    let other = ws.parent().expect("parent").join("other");
    std::fs::create_dir(&other).expect("other");
    let state = json!({"sandboxPolicy": {"type": "workspace-write", "writable_roots": [other.display().to_string()], "network_access": false},
        "sandboxCwd": ws.join("sub").display().to_string()});
    let policy = parse(state).expect("parsed");
    let n = narrow(&ceiling(&ws, Vec::new()), &policy, &[]);
    // The client may write only ws/sub: the workspace is not wholly
    // writable, so it is read-only; `other` is no place of the operator's.
    assert_eq!(n.config.mode, SandboxMode::ReadOnly);
    assert!(n.config.write.is_empty());
}

#[test]
fn the_network_is_the_operators_narrowed_by_the_client() {
    let (_t, ws) = dirs();
    let mut roof = ceiling(&ws, Vec::new());
    roof.network = true;
    let off = narrow(&roof, &parse(workspace_write(&ws)).expect("parsed"), &[]);
    assert!(!off.config.network);
    assert!(off.summary.ends_with("network off"));
    let on = narrow(&roof, &parse(full_access(&ws)).expect("parsed"), &[]);
    assert!(on.config.network);
}

#[test]
fn malformed_or_hostile_metadata_is_refused_with_the_reason() {
    let (_t, ws) = dirs();
    let w = ws.display().to_string();
    let cases = [
        (json!("read-only"), "not an object"),
        (
            json!({"permissionProfile": {"type": "disabled"}}),
            "no sandboxCwd",
        ),
        (
            json!({"permissionProfile": {"type": "disabled"}, "sandboxCwd": "file://host/share"}),
            "names a host",
        ),
        (
            json!({"permissionProfile": {"type": "disabled"}, "sandboxCwd": "file:///%00/bad/path/"}),
            "not an absolute path",
        ),
        (
            json!({"permissionProfile": {"type": "disabled"}, "sandboxCwd": "file:///a/%zz"}),
            "bad %-escape",
        ),
        (
            json!({"permissionProfile": {"type": "disabled"}, "sandboxCwd": format!("{w}/../x")}),
            "not an absolute path",
        ),
        (
            json!({"permissionProfile": {"type": "managed", "file_system": {"type": "restricted", "entries": []}, "network": "wide"}, "sandboxCwd": w}),
            "network",
        ),
        (
            json!({"permissionProfile": {"type": "sideways"}, "sandboxCwd": w}),
            "managed, disabled or external",
        ),
        (
            json!({"sandboxPolicy": {"type": "root"}, "sandboxCwd": w}),
            "read-only, workspace-write",
        ),
        (
            json!({"sandboxCwd": w}),
            "neither permissionProfile nor sandboxPolicy",
        ),
        (
            json!({"permissionProfile": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "path", "path": "rel"}, "access": "write"}]}, "network": "restricted"}, "sandboxCwd": w}),
            "not absolute",
        ),
        (
            json!({"permissionProfile": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "project_roots", "subpath": "../.."}}, "access": "write"}]}, "network": "restricted"}, "sandboxCwd": w}),
            "leaves the project",
        ),
        (
            json!({"permissionProfile": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "glob_pattern", "pattern": "**"}, "access": "write"}]}, "network": "restricted"}, "sandboxCwd": w}),
            "glob",
        ),
    ];
    for (state, why) in cases {
        let err = parse(state.clone()).expect_err("refused");
        assert!(err.contains(why), "{state}: {err}");
        assert!(err.contains("explicit --sandbox"), "{err}");
    }
    let many: Vec<Value> = (0..300)
        .map(|i| json!({"path": {"type": "path", "path": format!("/p{i}")}, "access": "read"}))
        .collect();
    let state = json!({"permissionProfile": {"type": "managed", "file_system": {"type": "restricted", "entries": many}, "network": "restricted"}, "sandboxCwd": w});
    assert!(parse(state).expect_err("bounded").contains("256"));
    // No policy at all: the caller refuses with what to do.
    assert!(ClientPolicy::from_meta(&serde_json::Map::new()).is_none());
    assert!(missing().contains("--sandbox inherit"));
}

#[test]
fn a_working_directory_outside_the_workspace_is_refused() {
    let (_t, ws) = dirs();
    let outside = ws.parent().expect("parent").to_path_buf();
    let policy = parse(full_access(&outside)).expect("parsed");
    let err = policy.check_cwd(&ws).expect_err("outside");
    assert!(err.contains("outside this server's workspace"), "{err}");
    assert!(
        parse(full_access(&ws.join("sub")))
            .expect("parsed")
            .check_cwd(&ws)
            .is_ok()
    );
    // A link inside the workspace that leads out is judged where it leads.
    std::os::unix::fs::symlink(&outside, ws.join("out")).expect("link");
    assert!(
        parse(full_access(&ws.join("out")))
            .expect("parsed")
            .check_cwd(&ws)
            .is_err()
    );
}

#[test]
fn the_most_specific_entry_wins_and_deny_wins_a_tie() {
    let policy = ClientPolicy {
        files: Files::Entries(vec![
            (PathBuf::from("/w"), Access::Write),
            (PathBuf::from("/w/ro"), Access::Read),
            (PathBuf::from("/w/ro/rw"), Access::Write),
            (PathBuf::from("/w/x"), Access::Write),
            (PathBuf::from("/w/x"), Access::Deny),
        ]),
        network: false,
        cwd: PathBuf::from("/w"),
    };
    assert_eq!(policy.access(Path::new("/w/a")), Access::Write);
    assert_eq!(policy.access(Path::new("/w/ro/a")), Access::Read);
    assert_eq!(policy.access(Path::new("/w/ro/rw/a")), Access::Write);
    assert_eq!(policy.access(Path::new("/w/x/a")), Access::Deny);
    assert_eq!(policy.access(Path::new("/elsewhere")), Access::Read);
    // `/w2` is not inside `/w`.
    assert_eq!(policy.access(Path::new("/w2")), Access::Read);
}
