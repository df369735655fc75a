//! `ferrepl doctor` and `ferrepl --version`: the JSON report's shape, a
//! working Python found (exit 0), a missing one failing (exit 1), plain
//! text when piped, clients found in their configuration files (and whether
//! they approve or trust the workspace's entries), and a kernel without
//! Landlock explained (through doctor's fake-probe hook).

use std::process::Output;
use std::time::Duration;

use serde_json::Value;

use crate::support::server_command_plain;

/// Doctor waits at most a few seconds for each interpreter and index.
const DOCTOR_TIMEOUT: Duration = Duration::from_secs(60);

/// A fresh home (no client configured) and workspace for one doctor run.
struct Machine {
    home: tempfile::TempDir,
    workdir: tempfile::TempDir,
}

impl Machine {
    fn new() -> Self {
        Machine {
            home: tempfile::tempdir().expect("home"),
            workdir: tempfile::tempdir().expect("workdir"),
        }
    }

    /// `ferrepl doctor --workdir <workdir> args...` with stdout piped.
    async fn doctor(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        self.doctor_of(&[], args, envs).await
    }

    /// `ferrepl server_flags... doctor --workdir <workdir> args...`: the
    /// server's flags before the subcommand.
    async fn doctor_of(
        &self,
        server_flags: &[&str],
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Output {
        let mut cmd = server_command_plain();
        cmd.args(server_flags)
            .arg("doctor")
            .arg("--workdir")
            .arg(self.workdir.path())
            .args(args)
            .env("HOME", self.home.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CODEX_HOME")
            .envs(envs.iter().copied());
        tokio::time::timeout(DOCTOR_TIMEOUT, cmd.output())
            .await
            .expect("doctor finishes in time")
            .expect("run ferrepl doctor")
    }

    async fn json(&self, args: &[&str], envs: &[(&str, &str)]) -> (Output, Value) {
        self.json_of(&[], args, envs).await
    }

    async fn json_of(
        &self,
        server_flags: &[&str],
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> (Output, Value) {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.doctor_of(server_flags, &all, envs).await;
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "doctor --json printed no JSON ({e}):\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out, report)
    }
}

/// The item `name` of a report: (status, detail).
fn item(report: &Value, name: &str) -> (String, String) {
    let items = report["items"].as_array().expect("items");
    let found = items
        .iter()
        .find(|i| i["name"] == name)
        .unwrap_or_else(|| panic!("no item {name} in {report:#}"));
    (
        found["status"].as_str().expect("status").to_string(),
        found["detail"].as_str().expect("detail").to_string(),
    )
}

#[tokio::test]
async fn json_report_has_every_item_and_a_working_python() {
    let machine = Machine::new();
    let (out, report) = machine.json(&[], &[]).await;
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["ready"], true, "{report:#}");
    let version = report["version"].as_str().expect("version");
    assert!(version.starts_with(env!("CARGO_PKG_VERSION")), "{version}");
    let workdir = machine.workdir.path().canonicalize().expect("canonical");
    assert_eq!(report["workdir"].as_str(), workdir.to_str(), "{report:#}");
    for i in report["items"].as_array().expect("items") {
        let keys: Vec<&String> = i.as_object().expect("an object").keys().collect();
        assert_eq!(keys, ["detail", "name", "status"], "{i}");
        let status = i["status"].as_str().expect("status");
        assert!(["ok", "warn", "missing"].contains(&status), "{i}");
    }
    let names = [
        "python",
        "r",
        "landlock",
        "seccomp",
        "namespaces",
        "cgroups",
        "privileges",
        "network-isolation",
        "pypi",
        "clients",
    ];
    for name in names {
        item(&report, name);
    }
    let (status, detail) = item(&report, "python");
    assert_eq!(status, "ok", "{detail}");
    assert!(detail.starts_with("Python 3."), "{detail}");
    assert!(detail.contains("python3 on PATH"), "{detail}");
    let (status, detail) = item(&report, "clients");
    assert_eq!(status, "warn", "{detail}");
    assert!(
        detail.contains("ferrepl install --client claude-code"),
        "{detail}"
    );
    assert!(report["sandbox"].as_str().is_some(), "{report:#}");
}

#[tokio::test]
async fn text_report_is_plain_when_piped() {
    let machine = Machine::new();
    // Piped stdout alone turns colour off: the harness's NO_COLOR=1 is
    // removed, and the terminal type says colours would work.
    let mut cmd = server_command_plain();
    cmd.arg("doctor")
        .arg("--workdir")
        .arg(machine.workdir.path())
        .env("HOME", machine.home.path())
        .env_remove("NO_COLOR")
        .env("TERM", "xterm-256color");
    let out = tokio::time::timeout(DOCTOR_TIMEOUT, cmd.output())
        .await
        .expect("doctor finishes in time")
        .expect("run ferrepl doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains('\x1b'), "ANSI escapes when piped:\n{text}");
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("ferrepl {} (", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("ok") && l.contains("python") && l.contains("Python 3.")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("ready")),
        "no verdict:\n{text}"
    );
}

#[tokio::test]
async fn a_missing_python_fails_with_exit_code_1() {
    let machine = Machine::new();
    let (out, report) = machine
        .json(&["--python", "/nonexistent/python"], &[])
        .await;
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    assert_eq!(report["ready"], false, "{report:#}");
    let (status, detail) = item(&report, "python");
    assert_eq!(status, "missing", "{detail}");
    assert!(detail.contains("/nonexistent/python"), "{detail}");
    assert!(detail.contains("--python"), "{detail}");
    let text = machine
        .doctor(&["--python", "/nonexistent/python"], &[])
        .await;
    assert_eq!(text.status.code(), Some(1));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("missing") && l.contains("python")),
        "{text}"
    );
    assert!(text.contains("not ready"), "{text}");
}

/// `ferrepl --python X doctor` checks X, as the server started with the
/// same flags would use it; doctor's own `--python` wins over the server's.
#[tokio::test]
async fn doctor_honours_the_server_flags_before_it() {
    let machine = Machine::new();
    let (out, report) = machine
        .json_of(&["--python", "/nonexistent/python"], &[], &[])
        .await;
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let (status, detail) = item(&report, "python");
    assert_eq!(status, "missing", "{detail}");
    assert!(detail.contains("/nonexistent/python"), "{detail}");
    assert!(detail.contains("(--python)"), "{detail}");
    // Doctor's own flag wins.
    let python = crate::support::real_python3();
    let (out, report) = machine
        .json_of(
            &["--python", "/nonexistent/python"],
            &["--python", python.to_str().expect("utf-8")],
            &[],
        )
        .await;
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    let (status, detail) = item(&report, "python");
    assert_eq!(status, "ok", "{detail}");
    // A server that would refuse to start fails doctor, with its reason.
    let (out, report) = machine.json_of(&["--http", "0.0.0.0:8000"], &[], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let (status, detail) = item(&report, "config");
    assert_eq!(status, "missing", "{detail}");
    assert!(detail.contains("--http 0.0.0.0:8000"), "{detail}");
    assert!(detail.contains("--auth-token-file"), "{detail}");
    // So does a --venv that is not one.
    let not_venv = machine.home.path().join("data");
    std::fs::create_dir(&not_venv).expect("mkdir");
    let venv = not_venv.to_str().expect("utf-8");
    let (out, report) = machine.json_of(&["--venv", venv], &[], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let (status, detail) = item(&report, "config");
    assert_eq!(status, "missing", "{detail}");
    assert!(detail.contains("not a virtual environment"), "{detail}");
}

#[tokio::test]
async fn a_kernel_without_landlock_is_explained() {
    let machine = Machine::new();
    let (out, report) = machine
        .json(&[], &[("FERREPL_DOCTOR_FAKE_PROBE", "no-landlock")])
        .await;
    // Landlock is a protection layer, not a requirement: still ready.
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    let (status, detail) = item(&report, "landlock");
    assert_eq!(status, "missing", "{detail}");
    assert!(detail.contains("this kernel has no Landlock"), "{detail}");
    assert!(detail.contains("Linux < 5.13"), "{detail}");
    assert!(
        detail.contains("protected only by namespaces and permissions"),
        "{detail}"
    );
}

#[tokio::test]
async fn configured_clients_are_named_with_their_files() {
    let machine = Machine::new();
    let entry = r#"{"mcpServers": {"ferrepl": {"command": "/x/ferrepl", "args": []}}}"#;
    let user = machine.home.path().join(".claude.json");
    std::fs::write(&user, entry).expect("write .claude.json");
    let cursor = machine.workdir.path().join(".cursor/mcp.json");
    std::fs::create_dir_all(cursor.parent().expect("parent")).expect("mkdir");
    std::fs::write(&cursor, entry).expect("write .cursor/mcp.json");
    // Another server only: not counted.
    let other = machine.home.path().join(".gemini/settings.json");
    std::fs::create_dir_all(other.parent().expect("parent")).expect("mkdir");
    std::fs::write(&other, r#"{"mcpServers": {"other": {}}}"#).expect("write");
    let (_, report) = machine.json(&[], &[]).await;
    let (status, detail) = item(&report, "clients");
    assert_eq!(status, "ok", "{detail}");
    assert!(detail.contains("claude-code"), "{detail}");
    assert!(detail.contains(&user.display().to_string()), "{detail}");
    assert!(detail.contains("cursor"), "{detail}");
    assert!(detail.contains(".cursor/mcp.json"), "{detail}");
    assert!(!detail.contains("gemini"), "{detail}");
}

/// A workspace's entries that the clients start only once the user acts:
/// Claude Code's approval of `.mcp.json`, Gemini CLI's trust of the
/// folder, Codex's trust of a project with `.codex/config.toml`; doctor
/// reads them in a fake home (approved/trusted, not yet, rejected/not
/// trusted, unreadable) and warns until each step is taken.
#[tokio::test]
async fn client_approval_and_trust_are_read_from_their_files() {
    let machine = Machine::new();
    let dir = machine.workdir.path().canonicalize().expect("canonical");
    let w = dir.display().to_string();
    let entry = r#"{"mcpServers": {"ferrepl": {"command": "/x/ferrepl", "args": []}}}"#;
    let files = [
        (".mcp.json", entry),
        (".gemini/settings.json", entry),
        (
            ".codex/config.toml",
            "[mcp_servers.ferrepl]\ncommand = \"/x/ferrepl\"\n",
        ),
    ];
    for (rel, text) in files {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }
    let home = |rel: &str, text: &str| {
        let p = machine.home.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    };
    let clients = || async {
        let (out, report) = machine.json(&[], &[]).await;
        assert_eq!(out.status.code(), Some(0), "{report:#}");
        item(&report, "clients")
    };

    // Nothing approved or trusted yet.
    let (status, detail) = clients().await;
    assert_eq!(status, "warn", "{detail}");
    for said in [
        format!(
            "claude-code ({w}/.mcp.json): ferrepl is set up but the folder is not trusted and the server not approved yet: start claude in {w}, trust the folder"
        ),
        format!(
            "gemini ({w}/.gemini/settings.json): ferrepl is set up but the folder is not trusted yet"
        ),
        format!(
            "codex ({w}/.codex/config.toml): ferrepl is set up but {w} is not a trusted project yet: start codex in {w}"
        ),
    ] {
        assert!(detail.contains(&said), "{said}\nnot in: {detail}");
    }

    // Approved and trusted.
    home(
        ".claude.json",
        &format!(
            r#"{{"projects": {{"{w}": {{"hasTrustDialogAccepted": true, "enabledMcpjsonServers": ["ferrepl"]}}}}}}"#
        ),
    );
    home(
        ".gemini/trustedFolders.json",
        &format!(r#"{{"{w}": "TRUST_FOLDER"}}"#),
    );
    home(
        ".codex/config.toml",
        &format!("[projects.\"{w}\"]\ntrust_level = \"trusted\"\n"),
    );
    let (status, detail) = clients().await;
    assert_eq!(status, "ok", "{detail}");
    for said in [
        "/.mcp.json, approved)",
        "settings.json, trusted folder)",
        "config.toml, trusted project)",
    ] {
        assert!(detail.contains(said), "{said}\nnot in: {detail}");
    }

    // Rejected, not trusted.
    home(
        ".claude.json",
        &format!(r#"{{"projects": {{"{w}": {{"disabledMcpjsonServers": ["ferrepl"]}}}}}}"#),
    );
    home(
        ".gemini/trustedFolders.json",
        &format!(r#"{{"{w}": "DO_NOT_TRUST"}}"#),
    );
    home(
        ".codex/config.toml",
        &format!("[projects.\"{w}\"]\ntrust_level = \"untrusted\"\n"),
    );
    let (status, detail) = clients().await;
    assert_eq!(status, "warn", "{detail}");
    for said in [
        "ferrepl is set up but rejected (disabledMcpjsonServers in",
        "ferrepl is set up but the folder is not trusted (DO_NOT_TRUST",
        "is trust_level \"untrusted\" in",
    ] {
        assert!(detail.contains(said), "{said}\nnot in: {detail}");
    }

    // Unreadable: said, and doctor still answers.
    home(".claude.json", "{\"projects\": ");
    home(".gemini/trustedFolders.json", "not json");
    let (status, detail) = clients().await;
    assert_eq!(status, "warn", "{detail}");
    assert!(
        detail.contains("approval unknown: cannot read")
            && detail.contains("trust unknown: cannot read"),
        "{detail}"
    );
}

#[tokio::test]
async fn version_names_the_build_and_its_sandbox() {
    let out = server_command_plain()
        .arg("--version")
        .output()
        .await
        .expect("run ferrepl --version");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let text = text.trim();
    assert!(
        text.starts_with(&format!("ferrepl {} (", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    if let Some(rev) = option_env!("FERREPL_GIT_REV") {
        assert!(text.contains(&format!("git {rev}")), "{text}");
    }
    if cfg!(target_os = "linux") {
        assert!(
            text.ends_with("linux: landlock seccomp namespaces cgroups)"),
            "{text}"
        );
    }
}

/// Whether python_install would work: where packages go, with what.
#[tokio::test]
async fn the_install_item_says_where_packages_go_or_why_they_cannot() {
    let machine = Machine::new();
    let state = machine.home.path().join("state");
    let state = state.to_str().expect("utf-8");
    let python = crate::support::real_python3();
    let python = crate::support::path_str(&python);
    // A plain interpreter: the kept venv in the state directory.
    let (_, report) = machine
        .json_of(&["--python", python, "--state-dir", state], &[], &[])
        .await;
    let (status, detail) = item(&report, "install");
    assert_eq!(status, "ok", "{detail}");
    assert!(detail.contains(&format!("{state}/venvs")), "{detail}");
    assert!(
        detail.starts_with("pip ") || detail.starts_with("uv "),
        "{detail}"
    );
    // Sessions not kept: no venv, and doctor says what to do.
    let (_, report) = machine
        .json_of(&["--python", python, "--resume", "off"], &[], &[])
        .await;
    let (status, detail) = item(&report, "install");
    assert_eq!(status, "missing", "{detail}");
    assert!(detail.contains("without --resume off"), "{detail}");
}

#[tokio::test]
async fn each_mcp_server_is_started_and_its_tools_counted() {
    // The operator's upstream servers (code calls tools): one that works,
    // with allowTools, one whose command does not exist.
    let machine = Machine::new();
    let files = tempfile::tempdir().expect("servers dir");
    let servers = crate::support::upstreams::write_servers_file(
        files.path(),
        serde_json::json!({
            "mini": {
                "command": crate::support::upstreams::minimal_upstream(files.path())["command"],
                "args": crate::support::upstreams::minimal_upstream(files.path())["args"],
                "allowTools": ["echo"]
            },
            "gone": {"command": "/nonexistent/mcp-server"}
        }),
    );
    let path = servers.to_str().expect("utf-8");
    let (_, report) = machine.json_of(&["--mcp-servers", path], &[], &[]).await;
    let (status, detail) = item(&report, "mcp-servers");
    assert_eq!(status, "warn", "{detail}");
    assert!(
        detail.contains("mini: 1 tool for code, 2 not allowed by allowTools"),
        "{detail}"
    );
    assert!(
        detail.contains("gone: MCP server 'gone' could not be started")
            && detail.contains("/nonexistent/mcp-server"),
        "the failure says why: {detail}"
    );
    // A servers file inside the workspace: the server would refuse to start.
    let inside = crate::support::upstreams::write_servers_file(
        machine.workdir.path(),
        serde_json::json!({"gone": {"command": "/nonexistent/mcp-server"}}),
    );
    let (out, report) = machine
        .json_of(
            &["--mcp-servers", inside.to_str().expect("utf-8")],
            &[],
            &[],
        )
        .await;
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let (status, detail) = item(&report, "config");
    assert_eq!(status, "missing", "{detail}");
    assert!(detail.contains("lies inside the workspace"), "{detail}");
}

/// A project's client entry that starts ferrepl with the sandbox weakened
/// (issue 40): a file that comes with a cloned repository. Doctor names
/// the file, the flag and what it does, in either form and from env.
#[tokio::test]
async fn a_project_entry_weakening_the_sandbox_is_warned_of() {
    let machine = Machine::new();
    let dir = machine.workdir.path().canonicalize().expect("canonical");
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    };
    // An entry with the defaults: no warning.
    write(
        ".mcp.json",
        r#"{"mcpServers": {"ferrepl": {"command": "/x/ferrepl", "args": ["--workdir", "."]}}}"#,
    );
    let (_, report) = machine.json(&[], &[]).await;
    let named = |report: &Value| {
        report["items"]
            .as_array()
            .expect("items")
            .iter()
            .any(|i| i["name"] == "project-flags")
    };
    assert!(!named(&report), "{report:#}");

    write(
        ".mcp.json",
        r#"{"mcpServers": {"ferrepl": {"command": "/x/ferrepl", "args": ["--sandbox", "off"]}}}"#,
    );
    write(
        ".codex/config.toml",
        "[mcp_servers.ferrepl]\ncommand = \"/x/ferrepl\"\nargs = [\"--allow-write-protected=.git\"]\n[mcp_servers.ferrepl.env]\nFERREPL_NETWORK = \"on\"\n",
    );
    let (out, report) = machine.json(&[], &[]).await;
    assert_eq!(out.status.code(), Some(0), "a warning only: {report:#}");
    let (status, detail) = item(&report, "project-flags");
    assert_eq!(status, "warn", "{detail}");
    for said in [
        format!(
            "{}: --sandbox off (runs sessions with no sandbox",
            dir.join(".mcp.json").display()
        ),
        format!(
            "{}: --allow-write-protected .git (lets sessions change that protected place",
            dir.join(".codex/config.toml").display()
        ),
        "FERREPL_NETWORK=on (gives sessions the whole network".to_string(),
        "remove the flag from the entry".to_string(),
    ] {
        assert!(detail.contains(&said), "{said}\nnot in: {detail}");
    }
}

/// git's safe.bareRepository (issue 40): without `explicit`, a bare
/// repository made of ordinary files a session writes is run by git when
/// the user's shell enters it. Doctor asks the host's git with the HOME it
/// is given: warned of until the setting is made.
#[tokio::test]
async fn git_running_bare_repositories_is_warned_of_until_set_explicit() {
    let machine = Machine::new();
    let git_item = || async {
        let (out, report) = machine.json(&[], &[]).await;
        assert_eq!(out.status.code(), Some(0), "a warning only: {report:#}");
        item(&report, "git")
    };
    let (status, detail) = git_item().await;
    if detail.starts_with("no git on PATH") {
        assert_eq!(status, "ok", "{detail}");
        eprintln!("skipped: no git on PATH");
        return;
    }
    assert_eq!(status, "warn", "{detail}");
    for said in [
        "safe.bareRepository is not set",
        "cannot be recognised by name",
        "git config --global safe.bareRepository explicit",
    ] {
        assert!(detail.contains(said), "{said}\nnot in: {detail}");
    }
    let gitconfig = machine.home.path().join(".gitconfig");
    std::fs::write(&gitconfig, "[user]\n\tname = someone\n").expect("write .gitconfig");
    let (status, detail) = git_item().await;
    assert_eq!(status, "warn", "{detail}");
    std::fs::write(&gitconfig, "[safe]\n\tbareRepository = all\n").expect("write .gitconfig");
    let (status, detail) = git_item().await;
    assert_eq!(status, "warn", "{detail}");
    assert!(detail.contains("safe.bareRepository is 'all'"), "{detail}");
    std::fs::write(&gitconfig, "[safe]\n\tbareRepository = explicit\n").expect("write .gitconfig");
    let (status, detail) = git_item().await;
    assert_eq!(status, "ok", "{detail}");
    assert!(
        detail.contains("safe.bareRepository is explicit"),
        "{detail}"
    );
}

/// Doctor runs start-up's own checks, the tenants' among them: a server
/// with named tenants and --allow-write (writable by every tenant) would
/// refuse to start, and doctor says so with the same words; so would a
/// --state-dir inside the workspaces' directory.
#[tokio::test]
async fn the_tenants_refusals_are_reported_as_start_up_makes_them() {
    let machine = Machine::new();
    let tokens = machine.home.path().join("tokens");
    std::fs::write(&tokens, "t0k3n-for-alice-0123456789 alice\n").expect("tokens");
    let mut perms = std::fs::metadata(&tokens).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(&tokens, perms).expect("chmod");
    let shared = machine.home.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    let tenants = [
        "--http",
        "127.0.0.1:0",
        "--auth-token-file",
        tokens.to_str().expect("utf-8"),
    ];
    let mut flags = tenants.to_vec();
    flags.extend(["--allow-write", shared.to_str().expect("utf-8")]);
    let (out, report) = machine.json_of(&flags, &[], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let (status, detail) = item(&report, "sandbox");
    assert_eq!(status, "missing", "{detail}");
    assert!(
        detail.contains("would refuse to start")
            && detail.contains("--allow-write would be writable by every tenant"),
        "{detail}"
    );
    // The stores inside --workdir, where a tenant's workspace could be them.
    let stores = machine.workdir.path().join("stores");
    std::fs::create_dir(&stores).expect("mkdir");
    let mut flags = tenants.to_vec();
    flags.extend(["--state-dir", stores.to_str().expect("utf-8")]);
    let (out, report) = machine.json_of(&flags, &[], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let text = report.to_string();
    assert!(
        text.contains("would refuse to start") && text.contains("is inside --workdir"),
        "{report:#}"
    );
}

/// A bad value of a stores flag is refused by doctor as by the server.
#[tokio::test]
async fn a_bad_stores_value_fails_doctor() {
    let machine = Machine::new();
    let (out, report) = machine
        .json_of(&["--resume-max-seconds=-3"], &[], &[])
        .await;
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let (status, detail) = item(&report, "config");
    assert_eq!(status, "missing", "{detail}");
    assert!(detail.contains("--resume-max-seconds"), "{detail}");
}

/// Review: doctor leaves out a `--venv` not made yet ("made at start") and
/// so also the tenants' refusal of it: with tenants, a --venv (made or
/// not) is refused by start-up ("--venv ... not shared between tenants"),
/// but doctor reports nothing missing and exits 0. FAILS today.
#[tokio::test]
async fn with_tenants_a_venv_not_made_yet_is_refused_as_start_up_refuses_it() {
    let machine = Machine::new();
    let tokens = machine.home.path().join("tokens");
    std::fs::write(&tokens, "t0k3n-for-alice-0123456789 alice\n").expect("tokens");
    let mut perms = std::fs::metadata(&tokens).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(&tokens, perms).expect("chmod");
    let venv = machine.home.path().join("not-made-yet");
    let flags = [
        "--http",
        "127.0.0.1:0",
        "--auth-token-file",
        tokens.to_str().expect("utf-8"),
        "--venv",
        venv.to_str().expect("utf-8"),
    ];
    let (out, report) = machine.json_of(&flags, &[], &[]).await;
    assert!(!venv.exists(), "doctor made the venv");
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    assert!(
        report.to_string().contains("not shared between tenants"),
        "{report:#}"
    );
}

/// Review: ferrepl reads `--auth-token-file` from the current directory,
/// and before the map of places its place was judged there too
/// (`std::path::absolute`); now a relative one is resolved against the
/// workspace, so any relative tokens file is refused as "inside" it, with
/// a path that is not the file read. FAILS today.
#[tokio::test]
async fn a_relative_tokens_file_is_judged_where_it_is_read() {
    let machine = Machine::new();
    let etc = tempfile::tempdir().expect("etc");
    let tokens = etc.path().join("tokens");
    std::fs::write(&tokens, "t0k3n-for-alice-0123456789\n").expect("tokens");
    let mut perms = std::fs::metadata(&tokens).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(&tokens, perms).expect("chmod");
    let mut cmd = server_command_plain();
    cmd.current_dir(etc.path())
        .args(["--http", "127.0.0.1:0", "--auth-token-file", "tokens"])
        .arg("doctor")
        .arg("--json")
        .arg("--workdir")
        .arg(machine.workdir.path())
        .env("HOME", machine.home.path());
    let out = tokio::time::timeout(DOCTOR_TIMEOUT, cmd.output())
        .await
        .expect("doctor finishes in time")
        .expect("run ferrepl doctor");
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    let refused = report["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|i| i["status"] == "missing")
        .find(|i| {
            i["detail"]
                .as_str()
                .is_some_and(|d| d.contains("--auth-token-file"))
        });
    assert!(refused.is_none(), "{report:#}");
}
