//! Unit tests of approval.rs: each client's files in a temporary home.
use super::*;
use crate::setup::clients::Os;

/// A home and a project (inside it, canonical), with the platform for them.
struct Machine {
    _root: tempfile::TempDir,
    home: std::path::PathBuf,
    project: std::path::PathBuf,
}

impl Machine {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let base = root.path().canonicalize().expect("canonical");
        let (home, project) = (base.join("home"), base.join("work/proj"));
        for d in [&home, &project] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        Machine {
            _root: root,
            home,
            project,
        }
    }

    fn platform(&self) -> Platform {
        Platform {
            os: Os::Linux,
            home: self.home.clone(),
            appdata: None,
            xdg_config: None,
            codex_home: None,
            gemini_trusted_folders: None,
        }
    }

    fn write(&self, path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    fn home_file(&self, rel: &str, text: &str) {
        self.write(&self.home.join(rel), text);
    }

    fn project_file(&self, rel: &str, text: &str) {
        self.write(&self.project.join(rel), text);
    }

    fn check(&self, client: Client, scope: Scope) -> Finding {
        check(client, scope, &self.platform(), &self.project).expect("a finding")
    }

    fn p(&self) -> String {
        self.project.display().to_string()
    }
}

impl Machine {
    /// Claude was told to trust the project's folder.
    fn trust_project(&self) {
        self.home_file(
            ".claude.json",
            &claude_json(&self.p(), r#"{"hasTrustDialogAccepted": true}"#),
        );
    }
}

fn claude_json(project: &str, settings: &str) -> String {
    format!(r#"{{"numStartups": 9, "projects": {{"{project}": {settings}}}}}"#)
}

#[test]
fn only_clients_with_a_step_are_checked() {
    let m = Machine::new();
    let p = m.platform();
    for (client, scope) in [
        (Client::ClaudeCode, Scope::User),
        (Client::Codex, Scope::User),
        (Client::Cursor, Scope::Project),
        (Client::Vscode, Scope::Project),
        (Client::ClaudeDesktop, Scope::User),
    ] {
        assert_eq!(check(client, scope, &p, &m.project), None, "{client:?}");
    }
}

#[test]
fn claude_code_pending_until_approved() {
    let m = Machine::new();
    let f = m.check(Client::ClaudeCode, Scope::Project);
    assert_eq!(f.state, State::Pending, "{f:?}");
    assert!(
        f.next().contains(&format!("start claude in {}", m.p())),
        "{f:?}"
    );
    // Another project's approval does not count.
    m.home_file(
        ".claude.json",
        &claude_json("/elsewhere", r#"{"enabledMcpjsonServers": ["ferrepl"]}"#),
    );
    assert_eq!(
        m.check(Client::ClaudeCode, Scope::Project).state,
        State::Pending
    );
    // Approved, but in a folder Claude was never told to trust: Claude
    // asks for the trust first and reads no project file before it.
    m.home_file(
        ".claude.json",
        &claude_json(&m.p(), r#"{"enabledMcpjsonServers": ["other", "ferrepl"]}"#),
    );
    let f = m.check(Client::ClaudeCode, Scope::Project);
    assert_eq!(f.state, State::Pending, "{f:?}");
    assert!(
        f.what.contains("not trusted") && f.next().contains("trust the folder"),
        "{f:?}"
    );
    m.home_file(
        ".claude.json",
        &claude_json(
            &m.p(),
            r#"{"hasTrustDialogAccepted": true, "enabledMcpjsonServers": ["other", "ferrepl"]}"#,
        ),
    );
    let f = m.check(Client::ClaudeCode, Scope::Project);
    assert_eq!(f.state, State::Ready, "{f:?}");
    assert!(!f.blocking());
}

/// The pending state the issue found: approval only in
/// .claude/settings.local.json, and a folder never trusted.
#[test]
fn claude_code_approval_without_folder_trust_is_pending() {
    let m = Machine::new();
    m.project_file(
        ".claude/settings.local.json",
        r#"{"enabledMcpjsonServers": ["ferrepl"]}"#,
    );
    m.home_file(
        ".claude.json",
        &claude_json(&m.p(), r#"{"allowedTools": []}"#),
    );
    let f = m.check(Client::ClaudeCode, Scope::Project);
    assert_eq!(f.state, State::Pending, "{f:?}");
    assert!(
        f.what.contains("approved, but the folder is not trusted"),
        "{f:?}"
    );
    // Trusting a folder above it trusts it too.
    let parent = m.project.parent().expect("parent").display().to_string();
    m.home_file(
        ".claude.json",
        &claude_json(&parent, r#"{"hasTrustDialogAccepted": true}"#),
    );
    assert_eq!(
        m.check(Client::ClaudeCode, Scope::Project).state,
        State::Ready
    );
}

#[test]
fn claude_code_approval_in_settings_files() {
    for (file, text) in [
        (
            ".claude/settings.local.json",
            r#"{"enabledMcpjsonServers": ["ferrepl"]}"#,
        ),
        (
            ".claude/settings.json",
            r#"{"enableAllProjectMcpServers": true}"#,
        ),
    ] {
        let m = Machine::new();
        m.trust_project();
        m.project_file(file, text);
        assert_eq!(
            m.check(Client::ClaudeCode, Scope::Project).state,
            State::Ready,
            "{file}"
        );
    }
    let m = Machine::new();
    m.trust_project();
    m.home_file(
        ".claude/settings.json",
        r#"{"enableAllProjectMcpServers": true}"#,
    );
    assert_eq!(
        m.check(Client::ClaudeCode, Scope::Project).state,
        State::Ready
    );
    // false approves nothing.
    let m = Machine::new();
    m.project_file(
        ".claude/settings.json",
        r#"{"enableAllProjectMcpServers": false}"#,
    );
    assert_eq!(
        m.check(Client::ClaudeCode, Scope::Project).state,
        State::Pending
    );
}

#[test]
fn claude_code_rejection_wins() {
    let m = Machine::new();
    m.home_file(
        ".claude.json",
        &claude_json(&m.p(), r#"{"enableAllProjectMcpServers": true}"#),
    );
    m.project_file(
        ".claude/settings.local.json",
        r#"{"disabledMcpjsonServers": ["ferrepl"]}"#,
    );
    let f = m.check(Client::ClaudeCode, Scope::Project);
    assert_eq!(f.state, State::Refused, "{f:?}");
    assert!(
        f.what.contains("rejected") && f.what.contains("settings.local.json"),
        "{f:?}"
    );
    assert!(f.next().contains("reset-project-choices"), "{f:?}");
}

#[test]
fn unreadable_files_are_said_and_do_not_stop_the_rest() {
    let m = Machine::new();
    m.home_file(".claude.json", "{\"projects\": ");
    let f = m.check(Client::ClaudeCode, Scope::Project);
    assert_eq!(f.state, State::Unknown, "{f:?}");
    assert!(
        f.what.contains(".claude.json") && f.what.contains("not valid JSON"),
        "{f:?}"
    );
    // An approval in another file is read, but the folder's trust lives
    // in the unreadable file: still unknown, and said so.
    m.project_file(
        ".claude/settings.local.json",
        r#"{"enabledMcpjsonServers": ["ferrepl"]}"#,
    );
    let f = m.check(Client::ClaudeCode, Scope::Project);
    assert_eq!(f.state, State::Unknown, "{f:?}");
    assert!(f.what.contains("not valid JSON"), "{f:?}");

    // Larger than the cap: refused without reading it all.
    let m = Machine::new();
    let big = m.home.join(".claude.json");
    let file = std::fs::File::create(&big).expect("create");
    file.set_len(READ_CAP + 1).expect("set_len");
    let f = m.check(Client::ClaudeCode, Scope::Project);
    assert_eq!(f.state, State::Unknown, "{f:?}");
    assert!(f.what.contains("16 MiB"), "{f:?}");

    // A directory where a file should be is said, not read.
    let m = Machine::new();
    std::fs::create_dir_all(m.home.join(".claude.json")).expect("mkdir");
    let f = m.check(Client::ClaudeCode, Scope::Project);
    assert_eq!(f.state, State::Unknown, "{f:?}");
    assert!(f.what.contains("not a file"), "{f:?}");

    let m = Machine::new();
    m.home_file(".codex/config.toml", "[projects\nx = ");
    let f = m.check(Client::Codex, Scope::Project);
    assert_eq!(f.state, State::Unknown, "{f:?}");
    assert!(f.what.contains("not valid TOML"), "{f:?}");

    let m = Machine::new();
    m.home_file(".gemini/trustedFolders.json", "[1, 2]");
    assert_eq!(
        m.check(Client::Gemini, Scope::Project).state,
        State::Unknown
    );
    m.home_file(
        ".gemini/trustedFolders.json",
        &format!(r#"{{"{}": "YES"}}"#, m.p()),
    );
    let f = m.check(Client::Gemini, Scope::Project);
    assert_eq!(f.state, State::Unknown, "{f:?}");
    assert!(f.what.contains("YES"), "{f:?}");
}

#[test]
fn gemini_trust_follows_the_longest_rule() {
    let m = Machine::new();
    let f = m.check(Client::Gemini, Scope::Project);
    assert_eq!(f.state, State::Pending, "{f:?}");
    assert!(f.next().contains("start gemini in"), "{f:?}");
    let work = m.project.parent().expect("parent").display().to_string();
    // Comments are allowed, as Gemini CLI allows them.
    m.home_file(
        ".gemini/trustedFolders.json",
        &format!("// mine\n{{\"{work}\": \"TRUST_FOLDER\"}}"),
    );
    assert_eq!(m.check(Client::Gemini, Scope::Project).state, State::Ready);
    // TRUST_PARENT of a sibling trusts the parent, so this project too.
    m.home_file(
        ".gemini/trustedFolders.json",
        &format!(r#"{{"{work}/other": "TRUST_PARENT"}}"#),
    );
    assert_eq!(m.check(Client::Gemini, Scope::User).state, State::Ready);
    // The longer rule decides.
    m.home_file(
        ".gemini/trustedFolders.json",
        &format!(
            r#"{{"{work}": "TRUST_FOLDER", "{}": "DO_NOT_TRUST"}}"#,
            m.p()
        ),
    );
    let f = m.check(Client::Gemini, Scope::Project);
    assert_eq!(f.state, State::Refused, "{f:?}");
    assert!(
        f.what.contains("DO_NOT_TRUST") && f.next().contains("/permissions"),
        "{f:?}"
    );
    // Folder trust turned off: everything is trusted.
    m.home_file(
        ".gemini/settings.json",
        r#"{"security": {"folderTrust": {"enabled": false}}}"#,
    );
    assert_eq!(m.check(Client::Gemini, Scope::Project).state, State::Ready);
}

#[test]
fn gemini_trust_file_can_be_elsewhere() {
    let m = Machine::new();
    let file = m.home.join("elsewhere/trust.json");
    m.write(&file, &format!(r#"{{"{}": "TRUST_FOLDER"}}"#, m.p()));
    let mut p = m.platform();
    p.gemini_trusted_folders = Some(file);
    let f = check(Client::Gemini, Scope::Project, &p, &m.project).expect("finding");
    assert_eq!(f.state, State::Ready, "{f:?}");
}

#[test]
fn codex_trust_of_the_project_or_its_git_root() {
    let m = Machine::new();
    let f = m.check(Client::Codex, Scope::Project);
    assert_eq!(f.state, State::Pending, "{f:?}");
    assert!(f.next().contains("trust_level = \"trusted\""), "{f:?}");
    m.home_file(
        ".codex/config.toml",
        &format!(
            "model = \"o4\"\n\n[projects.\"{}\"]\ntrust_level = \"trusted\"\n",
            m.p()
        ),
    );
    assert_eq!(m.check(Client::Codex, Scope::Project).state, State::Ready);
    m.home_file(
        ".codex/config.toml",
        &format!(
            "[projects]\n\"{}\" = {{ trust_level = \"untrusted\" }}\n",
            m.p()
        ),
    );
    let f = m.check(Client::Codex, Scope::Project);
    assert_eq!(f.state, State::Refused, "{f:?}");
    assert!(f.what.contains("untrusted"), "{f:?}");

    // A trusted git root covers a directory inside it.
    let m = Machine::new();
    let root = m.project.parent().expect("parent").to_path_buf();
    std::fs::create_dir_all(root.join(".git")).expect("mkdir .git");
    m.home_file(
        ".codex/config.toml",
        &format!(
            "[projects.\"{}\"]\ntrust_level = \"trusted\"\n",
            root.display()
        ),
    );
    assert_eq!(m.check(Client::Codex, Scope::Project).state, State::Ready);
    // $CODEX_HOME is where Codex reads it.
    let mut p = m.platform();
    p.codex_home = Some(m.home.join("codex-home"));
    let f = check(Client::Codex, Scope::Project, &p, &m.project).expect("finding");
    assert_eq!(f.state, State::Pending, "{f:?}");
}
