//! `ferrepl install` / `uninstall` against fixture configuration files in a
//! fake home: entries added next to other servers, comments and formatting
//! kept (JSON with comments, TOML), a second run changes nothing, a backup
//! of what was there, malformed files refused and left untouched, removal
//! restores the rest (and deletes what held nothing else: files, a
//! project's client directories), dry runs write nothing; the step a
//! client still waits for (approval, trust, restart) is said; the entry
//! written starts a working server, and under uvx names uvx and what it
//! installed from.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::{Launch, StdioServer, server_binary};

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        Home {
            dir: tempfile::tempdir().expect("home"),
        }
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write fixture");
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_as(server_binary(), args, &[])
    }

    /// `binary args...` in this home, with `envs` set.
    fn run_as(&self, binary: &Path, args: &[&str], envs: &[(&str, &Path)]) -> Output {
        std::process::Command::new(binary)
            .args(args)
            .env_remove("UV")
            .envs(envs.iter().copied())
            .env("HOME", self.dir.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CODEX_HOME")
            .current_dir(self.dir.path())
            .output()
            .expect("run ferrepl")
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn said(out: &Output) -> String {
    format!("{}{}", stdout(out), String::from_utf8_lossy(&out.stderr))
}

const CLAUDE: &str = r#"{
  "numStartups": 3,
  "mcpServers": {
    "other": {"command": "other-server", "args": []}
  },
  "zeta": true
}
"#;

const VSCODE: &str = r#"// servers of this project
{
  /* keep me */
  "servers": {
    "github": { "type": "http", "url": "https://example.com" } // trailing
  }
}
"#;

const CODEX: &str =
    "# my codex config\nmodel = \"o4\"  # comment\n\n[mcp_servers.other]\ncommand = \"x\"\n";

fn exe() -> String {
    server_binary()
        .canonicalize()
        .expect("binary path")
        .display()
        .to_string()
}

#[test]
fn install_keeps_everything_else_and_is_idempotent() {
    let home = Home::new();
    home.write(".claude.json", CLAUDE);
    home.write(".codex/config.toml", CODEX);
    home.write("proj/.vscode/mcp.json", VSCODE);
    // The same command twice: the second run must change nothing.
    let install = || {
        home.run(&[
            "install",
            "--client",
            "claude-code,codex",
            "--",
            "--languages",
            "python,r",
        ])
    };
    let out = install();
    assert!(out.status.success(), "{}", said(&out));
    let project = home.run(&[
        "install",
        "--client",
        "vscode",
        "--scope",
        "project",
        "--workdir",
        "proj",
    ]);
    assert!(project.status.success(), "{}", said(&project));

    let claude: serde_json::Value = serde_json::from_str(&home.read(".claude.json")).expect("JSON");
    assert_eq!(claude["numStartups"], 3);
    assert_eq!(claude["mcpServers"]["other"]["command"], "other-server");
    assert_eq!(claude["mcpServers"]["ferrepl"]["command"], exe());
    assert_eq!(
        claude["mcpServers"]["ferrepl"]["args"],
        serde_json::json!(["--sandbox", "workspace-write", "--languages", "python,r"])
    );
    assert!(
        home.read(".claude.json")
            .starts_with("{\n  \"numStartups\": 3,\n  \"mcpServers\": {\n    \"other\"")
    );
    assert_eq!(home.read(".claude.json.ferrepl-backup"), CLAUDE);

    let vscode = home.read("proj/.vscode/mcp.json");
    for kept in [
        "// servers of this project",
        "/* keep me */",
        "// trailing",
        "\"github\"",
    ] {
        assert!(vscode.contains(kept), "{kept} was lost:\n{vscode}");
    }
    let workdir = home
        .path("proj")
        .canonicalize()
        .expect("proj")
        .display()
        .to_string();
    assert!(
        vscode.contains("\"type\": \"stdio\"") && vscode.contains(&workdir),
        "{vscode}"
    );

    let codex = home.read(".codex/config.toml");
    assert!(codex.starts_with(CODEX), "{codex}");
    assert!(
        codex.contains("[mcp_servers.ferrepl]") && codex.contains("tool_timeout_sec = 80"),
        "{codex}"
    );

    let before = (home.read(".claude.json"), home.read(".codex/config.toml"));
    let again = install();
    assert!(again.status.success(), "{}", said(&again));
    assert_eq!(
        stdout(&again).matches("unchanged").count(),
        2,
        "{}",
        said(&again)
    );
    assert_eq!(
        before,
        (home.read(".claude.json"), home.read(".codex/config.toml"))
    );
}

#[test]
fn uninstall_restores_the_rest_and_dry_run_writes_nothing() {
    let home = Home::new();
    home.write(".claude.json", CLAUDE);
    home.write(".codex/config.toml", CODEX);
    let dry = home.run(&["install", "--client", "claude-code,codex", "--dry-run"]);
    assert!(
        dry.status.success() && stdout(&dry).contains("would add"),
        "{}",
        said(&dry)
    );
    assert_eq!(home.read(".claude.json"), CLAUDE);
    assert_eq!(home.read(".codex/config.toml"), CODEX);
    assert!(
        home.run(&["install", "--client", "claude-code,codex"])
            .status
            .success()
    );
    let out = home.run(&["uninstall", "--client", "claude-code,codex"]);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(home.read(".claude.json"), CLAUDE);
    assert_eq!(home.read(".codex/config.toml"), CODEX);
    let none = home.run(&["uninstall", "--client", "cursor"]);
    assert!(
        none.status.success() && stdout(&none).contains("nothing to remove"),
        "{}",
        said(&none)
    );
}

#[test]
fn empty_and_missing_files_get_a_fresh_entry() {
    let home = Home::new();
    home.write(".cursor/mcp.json", "");
    let out = home.run(&["install", "--client", "cursor,gemini"]);
    assert!(out.status.success(), "{}", said(&out));
    for file in [".cursor/mcp.json", ".gemini/settings.json"] {
        let v: serde_json::Value = serde_json::from_str(&home.read(file)).expect(file);
        assert_eq!(v["mcpServers"]["ferrepl"]["command"], exe(), "{file}");
    }
}

#[test]
fn malformed_files_and_bad_arguments_are_refused_untouched() {
    let home = Home::new();
    let cases = [
        (".cursor/mcp.json", "{\"mcpServers\": [1,"),
        (".gemini/settings.json", "{\"mcpServers\": 3}"),
        (".codex/config.toml", "[mcp_servers\nbroken = "),
    ];
    for (file, text) in cases {
        home.write(file, text);
    }
    let out = home.run(&["install", "--client", "cursor,gemini,codex"]);
    assert!(!out.status.success(), "{}", said(&out));
    for (file, text) in cases {
        assert_eq!(home.read(file), text, "{file} was changed");
        assert!(!Path::new(&home.path(&format!("{file}.ferrepl-backup"))).exists());
        assert!(said(&out).contains("left untouched"), "{}", said(&out));
    }
    let unknown = home.run(&["install", "--client", "emacs"]);
    assert!(!unknown.status.success() && said(&unknown).contains("unknown client 'emacs'"));
    let desktop = home.run(&["install", "--client", "claude-desktop"]);
    if cfg!(target_os = "linux") {
        assert!(
            !desktop.status.success() && said(&desktop).contains("no Linux build"),
            "{}",
            said(&desktop)
        );
    }
    let scope = home.run(&[
        "install",
        "--client",
        "claude-desktop",
        "--scope",
        "project",
    ]);
    assert!(
        !scope.status.success() && said(&scope).contains("no project-level configuration"),
        "{}",
        said(&scope)
    );
}

/// An update says what the entry ran before and what it runs now, for JSON
/// and TOML files alike; an uninstall what it removed.
#[test]
fn an_update_shows_the_command_before_and_after() {
    let home = Home::new();
    let first = home.run(&["install", "--client", "cursor,codex"]);
    assert!(first.status.success(), "{}", said(&first));
    let out = home.run(&[
        "install",
        "--client",
        "cursor,codex",
        "--",
        "--max-sessions",
        "4",
    ]);
    assert!(out.status.success(), "{}", said(&out));
    let text = stdout(&out);
    let was: Vec<&str> = text.lines().filter(|l| l.starts_with("  was: ")).collect();
    let now: Vec<&str> = text.lines().filter(|l| l.starts_with("  now: ")).collect();
    assert_eq!((was.len(), now.len()), (2, 2), "{text}");
    assert!(
        was.iter().all(|l| !l.contains("--max-sessions"))
            && now.iter().all(|l| l.ends_with("--max-sessions 4")),
        "{text}"
    );
    let removed = home.run(&["uninstall", "--client", "cursor"]);
    assert!(
        stdout(&removed).contains("  was: ") && stdout(&removed).contains("--max-sessions 4"),
        "{}",
        said(&removed)
    );
}

/// Every path under `dir`, relative, sorted: what a workspace holds.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            out.push(p.strip_prefix(dir).expect("inside").display().to_string());
            if p.is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

const PROJECT_CLIENTS: &str = "cursor,vscode,gemini,claude-code,codex";

/// Install then uninstall with --scope project leaves the workspace as it
/// was: no file, no client directory, no backup; a dry run before says so
/// and changes nothing.
#[test]
fn uninstall_leaves_a_project_as_it_was() {
    let home = Home::new();
    std::fs::create_dir_all(home.path("proj")).expect("mkdir");
    let run = |verb: &str, extra: &[&str]| {
        let mut args = vec![
            verb,
            "--client",
            PROJECT_CLIENTS,
            "--scope",
            "project",
            "--workdir",
            "proj",
        ];
        args.extend_from_slice(extra);
        home.run(&args)
    };
    let out = run("install", &[]);
    assert!(out.status.success(), "{}", said(&out));
    for file in [
        ".cursor/mcp.json",
        ".vscode/mcp.json",
        ".gemini/settings.json",
        ".mcp.json",
        ".codex/config.toml",
    ] {
        assert!(
            home.read(&format!("proj/{file}")).contains("ferrepl"),
            "{file}: {}",
            said(&out)
        );
    }
    let installed = listing(&home.path("proj"));

    let dry = run("uninstall", &["--dry-run"]);
    assert!(dry.status.success(), "{}", said(&dry));
    let text = stdout(&dry);
    assert_eq!(
        text.matches("would remove ferrepl from").count(),
        5,
        "{text}"
    );
    assert_eq!(
        text.matches("which would then be empty").count(),
        5,
        "{text}"
    );
    assert_eq!(text.matches(", and its directory ").count(), 4, "{text}");
    assert_eq!(listing(&home.path("proj")), installed, "a dry run wrote");

    let out = run("uninstall", &[]);
    assert!(out.status.success(), "{}", said(&out));
    let text = stdout(&out);
    assert_eq!(
        text.matches("and deleted the file, which held nothing else")
            .count(),
        5,
        "{text}"
    );
    assert_eq!(text.matches("  was: ").count(), 5, "{text}");
    assert_eq!(listing(&home.path("proj")), Vec::<String>::new(), "{text}");
    // Nothing at user level was touched either.
    assert_eq!(listing(home.dir.path()), vec!["proj".to_string()]);
}

/// A file holding anything besides ferrepl's entry (another server, another
/// key, a comment) is edited, not deleted, and a directory holding anything
/// else stays.
#[test]
fn uninstall_keeps_files_and_directories_with_anything_else() {
    let home = Home::new();
    let other = r#"{"mcpServers": {"other": {"command": "x", "args": []}}}"#;
    home.write("proj/.cursor/mcp.json", other);
    let commented = "// my servers\n{\n  \"servers\": {}\n}\n";
    home.write("proj/.vscode/mcp.json", commented);
    home.write("proj/.gemini/notes.txt", "mine");
    home.write("proj/.mcp.json", r#"{"mcpServers": {}, "note": 1}"#);
    let args = |verb| {
        [
            verb,
            "--client",
            "cursor,vscode,gemini,claude-code",
            "--scope",
            "project",
            "--workdir",
            "proj",
        ]
    };
    let out = home.run(&args("install"));
    assert!(out.status.success(), "{}", said(&out));
    let out = home.run(&args("uninstall"));
    assert!(out.status.success(), "{}", said(&out));
    let text = stdout(&out);
    assert_eq!(text.matches("deleted the file").count(), 1, "{text}");
    let cursor: serde_json::Value =
        serde_json::from_str(&home.read("proj/.cursor/mcp.json")).expect("JSON");
    assert_eq!(cursor["mcpServers"]["other"]["command"], "x");
    assert!(cursor["mcpServers"].get("ferrepl").is_none(), "{cursor}");
    let vscode = home.read("proj/.vscode/mcp.json");
    assert!(
        vscode.contains("// my servers") && !vscode.contains("ferrepl"),
        "{vscode}"
    );
    let mcp = home.read("proj/.mcp.json");
    assert!(
        mcp.contains("\"note\"") && !mcp.contains("ferrepl"),
        "{mcp}"
    );
    // Gemini's file held only ferrepl: gone; its directory holds notes.txt.
    assert!(!home.path("proj/.gemini/settings.json").exists(), "{text}");
    assert_eq!(home.read("proj/.gemini/notes.txt"), "mine");
}

/// `uninstall --help` offers nothing about the server the entry starts,
/// and server arguments are refused.
#[test]
fn uninstall_takes_no_server_arguments() {
    let home = Home::new();
    let help = home.run(&["uninstall", "--help"]);
    assert!(help.status.success(), "{}", said(&help));
    let text = stdout(&help);
    assert!(
        !text.contains("SERVER ARGS") && !text.contains("written as"),
        "{text}"
    );
    assert!(
        text.contains("--workdir") && text.contains("--dry-run"),
        "{text}"
    );
    let install_help = stdout(&home.run(&["install", "--help"]));
    assert!(install_help.contains("SERVER ARGS"), "{install_help}");
    let refused = home.run(&["uninstall", "--client", "cursor", "--", "--languages", "r"]);
    assert!(!refused.status.success(), "{}", said(&refused));
}

/// After an install, each client that still waits for the user (Claude
/// Code's approval of a project server, Gemini CLI's folder trust, Codex's
/// project trust and restart) gets one `next:` line; none once the user's
/// files show the step taken, and those files are only read.
#[test]
fn install_says_the_step_left_and_only_when_needed() {
    let home = Home::new();
    std::fs::create_dir_all(home.path("proj")).expect("mkdir");
    let proj = home
        .path("proj")
        .canonicalize()
        .expect("proj")
        .display()
        .to_string();
    let install = |extra: &[&str]| {
        let mut args = vec![
            "install",
            "--client",
            "claude-code,gemini,codex,cursor",
            "--scope",
            "project",
            "--workdir",
            "proj",
        ];
        args.extend_from_slice(extra);
        home.run(&args)
    };
    let dry = install(&["--dry-run"]);
    assert!(dry.status.success(), "{}", said(&dry));
    assert_eq!(
        stdout(&dry).matches("  next: ").count(),
        3,
        "{}",
        said(&dry)
    );

    let out = install(&[]);
    assert!(out.status.success(), "{}", said(&out));
    let text = stdout(&out);
    let next: Vec<&str> = text.lines().filter(|l| l.starts_with("  next: ")).collect();
    assert_eq!(next.len(), 3, "{text}");
    assert!(
        next[0].contains(&format!(
            "start claude in {proj}, trust the folder and approve 'ferrepl'"
        )),
        "{text}"
    );
    assert!(
        next[1].contains(&format!("start gemini in {proj}")),
        "{text}"
    );
    assert!(
        next[2].contains(&format!("{proj} is not a trusted project yet"))
            && next[2].ends_with("restart Codex to load it"),
        "{text}"
    );
    let codex = home.read("proj/.codex/config.toml");
    assert!(
        codex.contains("[mcp_servers.ferrepl]") && codex.contains("tool_timeout_sec = 80"),
        "{codex}"
    );

    let approvals = [
        (
            ".claude.json",
            format!(
                r#"{{"numStartups": 2, "projects": {{"{proj}": {{"hasTrustDialogAccepted": true, "enabledMcpjsonServers": ["ferrepl"]}}}}}}"#
            ),
        ),
        (
            ".gemini/trustedFolders.json",
            format!(r#"{{"{proj}": "TRUST_FOLDER"}}"#),
        ),
        (
            ".codex/config.toml",
            format!("[projects.\"{proj}\"]\ntrust_level = \"trusted\"\n"),
        ),
    ];
    for (file, text) in &approvals {
        home.write(file, text);
    }
    let again = install(&[]);
    assert!(again.status.success(), "{}", said(&again));
    assert!(!stdout(&again).contains("next:"), "{}", said(&again));
    for (file, text) in &approvals {
        assert_eq!(&home.read(file), text, "{file} was written");
    }
    // A malformed user file is said, not fatal.
    home.write(".claude.json", "{\"projects\": ");
    let out = install(&[]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        stdout(&out).contains("not valid JSON") && stdout(&out).contains(".claude.json"),
        "{}",
        said(&out)
    );
}

/// The entry as a client reads it: command and arguments.
fn claude_entry(home: &Home) -> (String, Vec<String>) {
    let claude: serde_json::Value =
        serde_json::from_str(&home.read(".claude.json")).expect(".claude.json is JSON");
    let entry = &claude["mcpServers"]["ferrepl"];
    let command = entry["command"].as_str().expect("command").to_string();
    let args = entry["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("an argument").to_string())
        .collect();
    (command, args)
}

/// What `install` writes is a command that works: started exactly as the
/// client would start it, it answers the handshake and runs a cell.
#[tokio::test]
async fn the_written_entry_starts_a_working_server() {
    let home = Home::new();
    home.write("proj/data.txt", "x");
    let out = home.run(&["install", "--client", "claude-code", "--workdir", "proj"]);
    assert!(out.status.success(), "{}", said(&out));
    // The binary under test is cargo's build output: its path is written,
    // with a note on what would remove it.
    assert!(said(&out).contains("cargo clean"), "{}", said(&out));
    let (command, args) = claude_entry(&home);
    assert_eq!(command, exe());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = StdioServer::launch(
        Launch::new(&args)
            .binary(Path::new(&command))
            .without_workdir_flag(),
    )
    .await;
    let cell = server.exec("6 * 7").await;
    assert_eq!(cell.assert_ok().value(), Some("42"));
    let listed = server.exec("import os; sorted(os.listdir('.'))").await;
    assert!(
        listed
            .assert_ok()
            .value()
            .is_some_and(|v| v.contains("data.txt")),
        "the entry's --workdir was not the project: {listed:#?}"
    );
}

/// A fake uv cache environment holding this ferrepl (hard-linked, so that
/// it really runs from there), with uv and uvx beside each other.
struct UvEnv {
    root: tempfile::TempDir,
    exe: PathBuf,
    dist_info: PathBuf,
}

impl UvEnv {
    fn new() -> Self {
        // In the build's scratch directory rather than /tmp, so that a wheel
        // beside it counts as staying (unless the checkout itself is there).
        let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
        let at = |rel: &str| root.path().join(rel);
        for dir in ["cache/archive-v0/Xy9/bin", "uvbin", "dist"] {
            std::fs::create_dir_all(at(dir)).expect("mkdir");
        }
        std::fs::write(
            at("cache/CACHEDIR.TAG"),
            "Signature: 8a477f597d28d172789f06886806bc55\n",
        )
        .expect("tag");
        let exe = at("cache/archive-v0/Xy9/bin/ferrepl");
        if std::fs::hard_link(server_binary(), &exe).is_err() {
            std::fs::copy(server_binary(), &exe).expect("copy ferrepl");
        }
        let dist_info =
            at("cache/archive-v0/Xy9/lib/python3.11/site-packages/ferrepl-0.1.0.dist-info");
        std::fs::create_dir_all(&dist_info).expect("mkdir");
        std::fs::write(dist_info.join("RECORD"), "").expect("RECORD");
        for tool in ["uv", "uvx", "dist/ferrepl-0.1.0-py3-none-any.whl"] {
            let p = if tool.contains('/') {
                at(tool)
            } else {
                at(&format!("uvbin/{tool}"))
            };
            std::fs::write(p, "").expect("fixture");
        }
        UvEnv {
            root,
            exe,
            dist_info,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel).canonicalize().expect(rel)
    }

    /// Records the environment as installed by uvx from `wheel` (None: the index).
    fn installed_from(&self, wheel: Option<&Path>) {
        let record = self.dist_info.join("direct_url.json");
        match wheel {
            Some(w) => {
                let url = url::Url::from_file_path(w).expect("file URL");
                std::fs::write(
                    record,
                    format!("{{\"url\":\"{url}\",\"archive_info\":{{}}}}"),
                )
                .expect("direct_url.json");
            }
            None => {
                let _ = std::fs::remove_file(record);
            }
        }
    }

    fn install(&self, home: &Home) -> Output {
        let uv = self.path("uvbin/uv");
        home.run_as(
            &self.exe,
            &["install", "--client", "claude-code,codex"],
            &[("UV", &uv)],
        )
    }
}

fn under_temp(path: &Path) -> bool {
    [std::env::temp_dir(), PathBuf::from("/tmp")]
        .iter()
        .filter_map(|d| d.canonicalize().ok())
        .any(|d| path.starts_with(d))
}

/// Run by uvx (from uv's cache), install never writes the cache's path: it
/// writes uvx, by absolute path, with the wheel uvx installed from when that
/// stays, `uvx ferrepl` when it came from the index, and refuses a wheel in
/// a temporary directory, leaving the files untouched.
#[test]
fn under_uvx_the_entry_names_uvx_and_where_it_came_from() {
    let uv = UvEnv::new();
    let uvx = uv.path("uvbin/uvx").display().to_string();
    let home = Home::new();

    let wheel = uv.path("dist/ferrepl-0.1.0-py3-none-any.whl");
    uv.installed_from(Some(&wheel));
    let out = uv.install(&home);
    if under_temp(&wheel) {
        // The checkout itself sits in a temporary directory.
        assert!(
            !out.status.success() && said(&out).contains("temporary"),
            "{}",
            said(&out)
        );
    } else {
        assert!(out.status.success(), "{}", said(&out));
        let wheel = wheel.display().to_string();
        assert_eq!(
            claude_entry(&home),
            (
                uvx.clone(),
                vec![
                    "--from".into(),
                    wheel.clone(),
                    "ferrepl".into(),
                    "--sandbox".into(),
                    "workspace-write".into()
                ]
            )
        );
        let codex = home.read(".codex/config.toml");
        assert!(
            codex.contains(&format!("command = \"{uvx}\""))
                && codex.contains(&format!(
                    "args = [\"--from\", \"{wheel}\", \"ferrepl\", \"--sandbox\", \"inherit\"]"
                )),
            "{codex}"
        );
    }

    uv.installed_from(None);
    let out = uv.install(&home);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(
        claude_entry(&home),
        (
            uvx.clone(),
            ["ferrepl", "--sandbox", "workspace-write"]
                .map(String::from)
                .to_vec()
        )
    );

    let temp = tempfile::tempdir().expect("tempdir");
    let temp_wheel = temp.path().join("ferrepl-0.1.0-py3-none-any.whl");
    std::fs::write(&temp_wheel, "").expect("wheel");
    uv.installed_from(Some(&temp_wheel.canonicalize().expect("wheel")));
    let before = (home.read(".claude.json"), home.read(".codex/config.toml"));
    let out = uv.install(&home);
    assert!(
        !out.status.success()
            && said(&out).contains("temporary directory")
            && said(&out).contains("uv tool install"),
        "{}",
        said(&out)
    );
    assert_eq!(
        before,
        (home.read(".claude.json"), home.read(".codex/config.toml"))
    );
    assert!(
        !said(&out).contains("/archive-v0/"),
        "the cache's path was offered: {}",
        said(&out)
    );
}
