//! `ferrepl install` / `uninstall` against fixture configuration files in a
//! fake home: entries added next to other servers, comments and formatting
//! kept (JSON with comments, TOML), a second run changes nothing, a backup
//! of what was there, malformed files refused and left untouched, removal
//! restores the rest, dry runs write nothing.

use std::path::Path;
use std::process::Output;

use crate::support::server_binary;

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
        std::process::Command::new(server_binary())
            .args(args)
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
        serde_json::json!(["--languages", "python,r"])
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
    let scope = home.run(&["install", "--client", "codex", "--scope", "project"]);
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
