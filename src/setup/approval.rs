//! The step a client still waits for once ferrepl's entry is in its file,
//! read from the client's own files (never written):
//!
//! * Claude Code keeps a project's `.mcp.json` servers "Pending approval"
//!   until the user approves them: `enabledMcpjsonServers` (names) or
//!   `enableAllProjectMcpServers: true`, in `~/.claude.json` under
//!   `projects["<absolute project path>"]` (where older versions record the
//!   answer), in `~/.claude/settings.json`, or in the project's
//!   `.claude/settings.json` / `.claude/settings.local.json` (where newer
//!   versions record it). A `disabledMcpjsonServers` entry in any of them
//!   rejects the server. None of it counts until the folder is trusted:
//!   `hasTrustDialogAccepted: true` under `projects[...]` in `~/.claude.json`
//!   for the folder or a folder above it (Claude asks for the trust first,
//!   and reads no project file before it).
//! * Gemini CLI starts no MCP server in a folder it does not trust (nor
//!   reads its `.gemini/settings.json`): `~/.gemini/trustedFolders.json` (or
//!   `$GEMINI_CLI_TRUSTED_FOLDERS_PATH`) maps paths to `TRUST_FOLDER`,
//!   `TRUST_PARENT` (the path's parent) or `DO_NOT_TRUST`, the longest
//!   matching rule deciding; `security.folderTrust.enabled: false` in
//!   `~/.gemini/settings.json` turns the check off (everything trusted).
//! * Codex reads a project's `.codex/config.toml` only when the project is
//!   trusted: `[projects."<absolute path>"] trust_level = "trusted"` in
//!   `$CODEX_HOME/config.toml`, for the directory itself or its git root.
//!
//! A file that cannot be read (malformed, unreadable, larger than
//! [`READ_CAP`]) is said to be so; it never stops install or doctor.

use std::path::Path;

use serde_json::Value;

use super::clients::{Client, Platform, Scope};
use super::install::NAME;

/// The most read of one of these files: `~/.claude.json` grows with every
/// project and conversation (megabytes are common).
pub const READ_CAP: u64 = 16 << 20;

/// Whether the client starts ferrepl from its entry, as its files tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Approved or trusted.
    Ready,
    /// The client asks (or waits for) the user first.
    Pending,
    /// The user said no: rejected, or the folder is not trusted.
    Refused,
    /// A file that would tell cannot be read.
    Unknown,
}

/// What the client's files say, and the user's step when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub state: State,
    /// "approved", "not approved yet", "rejected (disabledMcpjsonServers in F)", ...
    pub what: String,
    /// What the user does about it (None when ready).
    pub step: Option<String>,
}

impl Finding {
    fn ready(what: impl Into<String>) -> Self {
        Finding {
            state: State::Ready,
            what: what.into(),
            step: None,
        }
    }

    fn needs(state: State, what: impl Into<String>, step: impl Into<String>) -> Self {
        Finding {
            state,
            what: what.into(),
            step: Some(step.into()),
        }
    }

    /// The user still has a step to take.
    pub fn blocking(&self) -> bool {
        self.state != State::Ready
    }

    /// One phrase for install's `next:` line: the step, then why.
    pub fn next(&self) -> String {
        match &self.step {
            Some(step) => format!("{step} ({})", self.what),
            None => self.what.clone(),
        }
    }
}

/// What `client`'s files say about ferrepl's entry for `scope`, in the
/// project (or, for a user-level entry, the workspace) `dir`; None when the
/// client needs no step there.
pub fn check(client: Client, scope: Scope, p: &Platform, dir: &Path) -> Option<Finding> {
    match (client, scope) {
        (Client::ClaudeCode, Scope::Project) => Some(claude_project(p, dir)),
        (Client::Gemini, _) => Some(gemini_trust(p, dir)),
        (Client::Codex, Scope::Project) => Some(codex_trust(p, dir)),
        _ => None,
    }
}

/// A file's text: None when it does not exist; an error (to show) when it
/// cannot be read, is larger than [`READ_CAP`], or is not UTF-8.
pub fn read_capped(path: &Path) -> Result<Option<String>, String> {
    use std::io::Read;
    // Not opened unless a regular file: a FIFO would block the open.
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return Err(format!("cannot read {}: not a file", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        _ => {}
    }
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let too_big = || {
        format!(
            "cannot read {}: larger than the {} MiB read",
            path.display(),
            READ_CAP >> 20
        )
    };
    if file.metadata().is_ok_and(|m| m.len() > READ_CAP) {
        return Err(too_big());
    }
    // Bounded even if it grows while read.
    let mut bytes = Vec::new();
    file.take(READ_CAP + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > READ_CAP {
        return Err(too_big());
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| format!("cannot read {}: not UTF-8", path.display()))
}

/// A JSON (comments allowed) file's value; None when it does not exist.
fn read_json(path: &Path) -> Result<Option<Value>, String> {
    let Some(text) = read_capped(path)? else {
        return Ok(None);
    };
    if text.trim().is_empty() {
        return Ok(Some(Value::Object(Default::default())));
    }
    let value = serde_json::from_str(&text).or_else(|e| {
        let options = jsonc_parser::ParseOptions::default();
        match jsonc_parser::parse_to_serde_value(&text, &options) {
            Ok(Some(v)) => Ok(v),
            _ => Err(format!(
                "cannot read {}: not valid JSON ({e})",
                path.display()
            )),
        }
    })?;
    Ok(Some(value))
}

/// `value[key]` is a list naming ferrepl.
fn names_ferrepl(value: &Value, key: &str) -> bool {
    value
        .get(key)
        .and_then(Value::as_array)
        .is_some_and(|names| names.iter().any(|n| n.as_str() == Some(NAME)))
}

/// Claude Code's answer for a project's `.mcp.json` server.
fn claude_project(p: &Platform, dir: &Path) -> Finding {
    let key = dir.display().to_string();
    let user = p.home.join(".claude.json");
    // (file, whether its settings are under projects[dir]).
    let sources = [
        (user, true),
        (p.home.join(".claude/settings.json"), false),
        (dir.join(".claude/settings.json"), false),
        (dir.join(".claude/settings.local.json"), false),
    ];
    let (mut approved, mut unreadable) = (false, Vec::new());
    let mut trusted = false;
    for (path, per_project) in sources {
        let value = match read_json(&path) {
            Ok(Some(v)) => v,
            Ok(None) => continue,
            Err(e) => {
                unreadable.push(e);
                continue;
            }
        };
        if per_project {
            trusted = folder_trusted(&value, dir);
        }
        let settings = match per_project {
            true => value.get("projects").and_then(|all| all.get(&key)),
            false => Some(&value),
        };
        let Some(settings) = settings else { continue };
        // A rejection anywhere wins over an approval elsewhere.
        if names_ferrepl(settings, "disabledMcpjsonServers") {
            let what = format!("rejected (disabledMcpjsonServers in {})", path.display());
            let step = format!(
                "remove '{NAME}' from that list, or run `claude mcp reset-project-choices` in {}",
                dir.display()
            );
            return Finding::needs(State::Refused, what, step);
        }
        let all = settings.get("enableAllProjectMcpServers") == Some(&Value::Bool(true));
        approved |= all || names_ferrepl(settings, "enabledMcpjsonServers");
    }
    let ask = format!(
        "start claude in {} and approve '{NAME}' when it asks",
        dir.display()
    );
    if approved && trusted {
        Finding::ready("approved")
    } else if !unreadable.is_empty() {
        let why = format!("approval unknown: {}", unreadable.join("; "));
        Finding::needs(State::Unknown, why, ask)
    } else if !trusted {
        let what = if approved {
            "approved, but the folder is not trusted yet (Claude asks to trust it first)"
        } else {
            "the folder is not trusted and the server not approved yet"
        };
        let ask = format!(
            "start claude in {}, trust the folder and approve '{NAME}' when it asks",
            dir.display()
        );
        Finding::needs(State::Pending, what, ask)
    } else {
        Finding::needs(State::Pending, "not approved yet", ask)
    }
}

/// Claude Code's trust of folder `dir`: `hasTrustDialogAccepted` for it or
/// a folder above it in `~/.claude.json`'s projects.
fn folder_trusted(claude_json: &Value, dir: &Path) -> bool {
    let Some(projects) = claude_json.get("projects") else {
        return false;
    };
    dir.ancestors().any(|d| {
        projects
            .get(d.display().to_string().as_str())
            .and_then(|p| p.get("hasTrustDialogAccepted"))
            == Some(&Value::Bool(true))
    })
}

/// The trust levels Gemini CLI accepts.
const GEMINI_LEVELS: [&str; 3] = ["TRUST_FOLDER", "TRUST_PARENT", "DO_NOT_TRUST"];

/// Gemini CLI's trust of the folder `dir`.
fn gemini_trust(p: &Platform, dir: &Path) -> Finding {
    let settings = p.home.join(".gemini/settings.json");
    // Unreadable settings: Gemini CLI refuses them too; the trust file still tells.
    if let Ok(Some(v)) = read_json(&settings)
        && v.pointer("/security/folderTrust/enabled") == Some(&Value::Bool(false))
    {
        return Finding::ready("folder trust is off");
    }
    let file = p
        .gemini_trusted_folders
        .clone()
        .unwrap_or_else(|| p.home.join(".gemini/trustedFolders.json"));
    let ask = format!(
        "start gemini in {} and trust the folder when it asks",
        dir.display()
    );
    let rules = match read_json(&file) {
        Ok(Some(Value::Object(rules))) => rules,
        Ok(None) => Default::default(),
        Ok(Some(_)) => {
            let why = format!("trust unknown: {} is not a JSON object", file.display());
            return Finding::needs(State::Unknown, why, ask);
        }
        Err(e) => return Finding::needs(State::Unknown, format!("trust unknown: {e}"), ask),
    };
    // As Gemini CLI decides: the longest rule whose folder holds `dir`.
    let mut best: Option<(&str, &str)> = None;
    for (rule, level) in &rules {
        let Some(level) = level.as_str().filter(|l| GEMINI_LEVELS.contains(l)) else {
            let why = format!(
                "trust unknown: {} gives {rule} the level {level}, which Gemini CLI refuses",
                file.display()
            );
            return Finding::needs(State::Unknown, why, ask);
        };
        let folder = match level {
            "TRUST_PARENT" => Path::new(rule).parent().unwrap_or(Path::new(rule)),
            _ => Path::new(rule),
        };
        let folder = folder
            .canonicalize()
            .unwrap_or_else(|_| folder.to_path_buf());
        if dir.starts_with(&folder) && best.is_none_or(|(b, _)| rule.len() > b.len()) {
            best = Some((rule, level));
        }
    }
    match best {
        Some((rule, "DO_NOT_TRUST")) => Finding::needs(
            State::Refused,
            format!(
                "the folder is not trusted (DO_NOT_TRUST for {rule} in {})",
                file.display()
            ),
            format!(
                "run /permissions in gemini in {} to trust it",
                dir.display()
            ),
        ),
        Some(_) => Finding::ready("trusted folder"),
        None => Finding::needs(State::Pending, "the folder is not trusted yet", ask),
    }
}

/// The git work tree holding `dir` (a `.git` in it or above), if any.
fn git_root(dir: &Path) -> Option<&Path> {
    dir.ancestors().find(|d| d.join(".git").exists())
}

/// Codex's trust of the project `dir` (or its git root).
fn codex_trust(p: &Platform, dir: &Path) -> Finding {
    let file = p
        .codex_home
        .clone()
        .unwrap_or_else(|| p.home.join(".codex"))
        .join("config.toml");
    let shown = dir.display();
    let ask = format!(
        "start codex in {shown} and trust it, or add [projects.\"{shown}\"] trust_level = \"trusted\" to {}",
        file.display()
    );
    let doc: toml_edit::DocumentMut = match read_capped(&file) {
        Ok(text) => match text.unwrap_or_default().parse() {
            Ok(doc) => doc,
            Err(e) => {
                let why = format!("trust unknown: {} is not valid TOML ({e})", file.display());
                return Finding::needs(State::Unknown, why.trim_end().to_string(), ask);
            }
        },
        Err(e) => return Finding::needs(State::Unknown, format!("trust unknown: {e}"), ask),
    };
    let level = |d: &Path| -> Option<String> {
        let projects = doc.get("projects")?;
        let project = projects.get(d.display().to_string().as_str())?;
        project.get("trust_level")?.as_str().map(str::to_string)
    };
    let found = level(dir)
        .map(|l| (dir.to_path_buf(), l))
        .or_else(|| git_root(dir).and_then(|r| level(r).map(|l| (r.to_path_buf(), l))));
    match found {
        Some((_, l)) if l == "trusted" => Finding::ready("trusted project"),
        Some((at, l)) => Finding::needs(
            State::Refused,
            format!(
                "{} is trust_level \"{l}\" in {}",
                at.display(),
                file.display()
            ),
            format!(
                "set it to \"trusted\" there: Codex reads {shown}/.codex/config.toml only in a trusted project"
            ),
        ),
        None => Finding::needs(
            State::Pending,
            format!("{shown} is not a trusted project yet"),
            ask,
        ),
    }
}

#[cfg(test)]
mod tests;
