//! The agent clients `ferrepl install` configures: where each keeps its MCP
//! servers (user level, and project level where it has one) and in which
//! shape.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    ClaudeCode,
    ClaudeDesktop,
    Codex,
    Cursor,
    Vscode,
    Gemini,
}

impl Client {
    pub const ALL: [Client; 6] = [
        Client::ClaudeCode,
        Client::ClaudeDesktop,
        Client::Codex,
        Client::Cursor,
        Client::Vscode,
        Client::Gemini,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Client::ClaudeCode => "claude-code",
            Client::ClaudeDesktop => "claude-desktop",
            Client::Codex => "codex",
            Client::Cursor => "cursor",
            Client::Vscode => "vscode",
            Client::Gemini => "gemini",
        }
    }

    /// `all`, or names separated by commas, each once.
    pub fn parse_list(names: &[String]) -> Result<Vec<Client>, String> {
        let mut out = Vec::new();
        for name in names.iter().flat_map(|n| n.split(',')).map(str::trim) {
            let picked: Vec<Client> = if name == "all" {
                Client::ALL.to_vec()
            } else {
                match Client::ALL.into_iter().find(|c| c.name() == name) {
                    Some(c) => vec![c],
                    None => {
                        return Err(format!(
                            "unknown client '{name}'; choose from claude-code, claude-desktop, codex, cursor, vscode, gemini, all"
                        ));
                    }
                }
            };
            for c in picked {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        if out.is_empty() {
            return Err("name a client with --client (or --client all)".into());
        }
        Ok(out)
    }
}

/// Where configuration lives on this machine.
#[derive(Debug, Clone)]
pub struct Platform {
    pub os: Os,
    pub home: PathBuf,
    /// %APPDATA% on Windows.
    pub appdata: Option<PathBuf>,
    /// $XDG_CONFIG_HOME on Linux.
    pub xdg_config: Option<PathBuf>,
    /// $CODEX_HOME.
    pub codex_home: Option<PathBuf>,
    /// $GEMINI_CLI_TRUSTED_FOLDERS_PATH (Gemini CLI's folder trust file).
    pub gemini_trusted_folders: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    Linux,
    Macos,
    Windows,
}

impl Platform {
    /// This machine's, from the environment.
    pub fn current() -> Result<Self, String> {
        let var = |k: &str| {
            std::env::var_os(k)
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        let home = var("HOME")
            .or_else(|| var("USERPROFILE"))
            .ok_or("neither HOME nor USERPROFILE is set to an absolute path")?;
        Ok(Platform {
            os: if cfg!(target_os = "macos") {
                Os::Macos
            } else if cfg!(windows) {
                Os::Windows
            } else {
                Os::Linux
            },
            home,
            appdata: var("APPDATA"),
            xdg_config: var("XDG_CONFIG_HOME"),
            codex_home: var("CODEX_HOME"),
            gemini_trusted_folders: var("GEMINI_CLI_TRUSTED_FOLDERS_PATH"),
        })
    }
}

/// How a file holds MCP servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON (comments allowed): servers are members of the object `key`;
    /// `typed` entries say `"type": "stdio"`.
    Json { key: &'static str, typed: bool },
    /// TOML: `[mcp_servers.NAME]` tables (Codex).
    Toml,
}

#[derive(Debug, Clone)]
pub struct Target {
    pub client: Client,
    pub path: PathBuf,
    pub format: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    User,
    Project,
}

const SERVERS: Format = Format::Json {
    key: "mcpServers",
    typed: false,
};

/// The files `client` keeps its servers in, for `scope` (`project` is the
/// workspace directory); an error says why there is none.
pub fn target(
    client: Client,
    scope: Scope,
    p: &Platform,
    project: &Path,
) -> Result<Target, String> {
    let home = &p.home;
    let (path, format) = match (client, scope) {
        (Client::ClaudeCode, Scope::User) => (home.join(".claude.json"), SERVERS),
        (Client::ClaudeCode, Scope::Project) => (project.join(".mcp.json"), SERVERS),
        (Client::ClaudeDesktop, Scope::User) => {
            let dir = match p.os {
                Os::Macos => home.join("Library/Application Support/Claude"),
                Os::Windows => p
                    .appdata
                    .clone()
                    .unwrap_or_else(|| home.join("AppData/Roaming"))
                    .join("Claude"),
                Os::Linux => {
                    return Err(
                        "Claude Desktop has no Linux build; configure it on macOS or Windows"
                            .into(),
                    );
                }
            };
            (dir.join("claude_desktop_config.json"), SERVERS)
        }
        (Client::Codex, Scope::User) => (
            p.codex_home
                .clone()
                .unwrap_or_else(|| home.join(".codex"))
                .join("config.toml"),
            Format::Toml,
        ),
        // Read by Codex only in a trusted project (approval.rs).
        (Client::Codex, Scope::Project) => (project.join(".codex/config.toml"), Format::Toml),
        (Client::Cursor, Scope::User) => (home.join(".cursor/mcp.json"), SERVERS),
        (Client::Cursor, Scope::Project) => (project.join(".cursor/mcp.json"), SERVERS),
        (Client::Vscode, scope) => {
            let path = match (scope, p.os) {
                (Scope::Project, _) => project.join(".vscode/mcp.json"),
                (Scope::User, Os::Macos) => {
                    home.join("Library/Application Support/Code/User/mcp.json")
                }
                (Scope::User, Os::Windows) => p
                    .appdata
                    .clone()
                    .unwrap_or_else(|| home.join("AppData/Roaming"))
                    .join("Code/User/mcp.json"),
                (Scope::User, Os::Linux) => p
                    .xdg_config
                    .clone()
                    .unwrap_or_else(|| home.join(".config"))
                    .join("Code/User/mcp.json"),
            };
            (
                path,
                Format::Json {
                    key: "servers",
                    typed: true,
                },
            )
        }
        (Client::Gemini, Scope::User) => (home.join(".gemini/settings.json"), SERVERS),
        (Client::Gemini, Scope::Project) => (project.join(".gemini/settings.json"), SERVERS),
        (c, Scope::Project) => {
            return Err(format!(
                "{} has no project-level configuration; use --scope user",
                c.name()
            ));
        }
    };
    Ok(Target {
        client,
        path,
        format,
    })
}
