//! `ferrepl install` / `uninstall`: ferrepl's entry in a client's MCP
//! configuration file, added, updated or removed in place. Everything else
//! in the file stays as it was (other servers, key order, comments,
//! formatting); a malformed file is refused and left untouched; the file is
//! backed up before it changes, written atomically, and a second run
//! changes nothing. An uninstall that leaves a file holding nothing else
//! (an empty document, or only the empty servers object install writes: no
//! other key, no comment) deletes it instead, without a backup: all it held
//! was ferrepl's entry, which the output shows.

use std::io::Write;
use std::path::{Path, PathBuf};

use jsonc_parser::ParseOptions;
use jsonc_parser::cst::{CstInputValue, CstRootNode};

use super::clients::{Format, Target};

/// ferrepl's name in the clients' configuration.
pub const NAME: &str = "ferrepl";

/// How a client starts ferrepl.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub command: String,
    pub args: Vec<String>,
    /// Codex's per-call timeout, above ferrepl's own longest wait.
    pub tool_timeout_sec: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Added,
    Updated,
    Unchanged,
    Removed,
    Absent,
}

impl Outcome {
    pub fn changed(self) -> bool {
        matches!(self, Outcome::Added | Outcome::Updated | Outcome::Removed)
    }
}

/// What an install or uninstall did (or, with dry-run, would do).
#[derive(Debug)]
pub struct Change {
    pub outcome: Outcome,
    pub backup: Option<PathBuf>,
    /// The command ferrepl's entry ran before an update or removal.
    pub previous: Option<String>,
    /// A removal deleted the file (or, with dry-run, would), as nothing
    /// else was in it.
    pub file_removed: bool,
}

/// A command line as the entry holds it, for showing.
pub fn command_line(command: &str, args: &[String]) -> String {
    std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Adds or updates (`Some`) or removes (`None`) ferrepl's entry in `target`.
pub fn apply(target: &Target, entry: Option<&Entry>, dry_run: bool) -> Result<Change, String> {
    let path = &target.path;
    let text = match std::fs::read_to_string(path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if text.is_none() && entry.is_none() {
        return Ok(Change {
            outcome: Outcome::Absent,
            backup: None,
            previous: None,
            file_removed: false,
        });
    }
    let (outcome, new_text, previous) = match target.format {
        Format::Json { key, typed } => edit_json(path, text.as_deref(), key, typed, entry)?,
        Format::Toml => edit_toml(path, text.as_deref(), entry)?,
    };
    let file_removed = outcome == Outcome::Removed && holds_nothing(&new_text, target.format);
    if !outcome.changed() || dry_run {
        return Ok(Change {
            outcome,
            backup: None,
            previous,
            file_removed,
        });
    }
    if file_removed {
        std::fs::remove_file(path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
        return Ok(Change {
            outcome,
            backup: None,
            previous,
            file_removed,
        });
    }
    let backup = match &text {
        Some(old) => {
            let backup = with_suffix(path, ".ferrepl-backup");
            write_new(&backup, old, 0o600, std::fs::metadata(path).ok())
                .map_err(|e| format!("cannot write the backup {}: {e}", backup.display()))?;
            Some(backup)
        }
        None => None,
    };
    write_atomically(path, &new_text, private_when_new(target))?;
    Ok(Change {
        outcome,
        backup,
        previous,
        file_removed,
    })
}

/// `text` holds nothing but what install itself writes around an entry:
/// an empty document, `{}`, or only the empty servers object (JSON), or an
/// empty `[mcp_servers]` (TOML). Any other key, value or comment keeps it.
pub fn holds_nothing(text: &str, format: Format) -> bool {
    let squeezed: String = text
        .trim_start_matches('\u{feff}')
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    squeezed.is_empty()
        || match format {
            Format::Json { key, .. } => {
                squeezed == "{}" || squeezed == format!("{{\"{key}\":{{}}}}")
            }
            Format::Toml => squeezed == "[mcp_servers]",
        }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A file the client keeps private (Claude Code's `~/.claude.json`, which
/// holds its conversations' state, mode 0600) is created private.
fn private_when_new(target: &Target) -> bool {
    target.client == super::clients::Client::ClaudeCode
        && target.path.file_name().is_some_and(|n| n == ".claude.json")
}

/// Writes `text` to `path` (ours: a backup or a temporary file, made
/// afresh) created with `mode` (less the umask), then given `like`'s mode
/// (the file it copies or replaces): never more readable than that.
fn write_new(
    path: &Path,
    text: &str,
    mode: u32,
    like: Option<std::fs::Metadata>,
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    if let Some(meta) = like {
        file.set_permissions(meta.permissions())?;
    }
    Ok(())
}

fn write_atomically(path: &Path, text: &str, private: bool) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let tmp = with_suffix(path, ".ferrepl-tmp");
    let mode = if private { 0o600 } else { 0o666 };
    write_new(&tmp, text, mode, std::fs::metadata(path).ok()).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

fn malformed(path: &Path, why: impl std::fmt::Display) -> String {
    format!(
        "{} is not valid JSON ({why}); it was left untouched: fix it (or move it away) and run this again",
        path.display()
    )
}

fn json_entry(entry: &Entry, typed: bool) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    if typed {
        map.insert("type".into(), "stdio".into());
    }
    map.insert("command".into(), entry.command.clone().into());
    map.insert("args".into(), entry.args.clone().into());
    serde_json::Value::Object(map)
}

fn to_cst(value: &serde_json::Value) -> CstInputValue {
    match value {
        serde_json::Value::Null => CstInputValue::Null,
        serde_json::Value::Bool(b) => CstInputValue::Bool(*b),
        serde_json::Value::Number(n) => CstInputValue::Number(n.to_string()),
        serde_json::Value::String(s) => CstInputValue::String(s.clone()),
        serde_json::Value::Array(items) => CstInputValue::Array(items.iter().map(to_cst).collect()),
        serde_json::Value::Object(map) => {
            CstInputValue::Object(map.iter().map(|(k, v)| (k.clone(), to_cst(v))).collect())
        }
    }
}

fn edit_json(
    path: &Path,
    text: Option<&str>,
    key: &str,
    typed: bool,
    entry: Option<&Entry>,
) -> Result<(Outcome, String, Option<String>), String> {
    let text = text.filter(|t| !t.trim().is_empty()).unwrap_or("{}\n");
    // Parsed once to refuse what is not an object, whatever the CST allows.
    let plain = jsonc_parser::parse_to_serde_value(text, &ParseOptions::default())
        .map_err(|e| malformed(path, e))?;
    let servers_now = match &plain {
        Some(serde_json::Value::Object(map)) => match map.get(key) {
            None => None,
            Some(serde_json::Value::Object(servers)) => Some(servers.clone()),
            Some(_) => return Err(malformed(path, format!("\"{key}\" is not an object"))),
        },
        None => None,
        Some(_) => return Err(malformed(path, "the top level is not an object")),
    };
    let root =
        CstRootNode::parse(text, &ParseOptions::default()).map_err(|e| malformed(path, e))?;
    let top = root.object_value_or_set();
    let current = servers_now.as_ref().and_then(|s| s.get(NAME)).cloned();
    let previous = current.as_ref().map(json_command_line);
    let outcome = match (entry, current) {
        (Some(e), Some(now)) if now == json_entry(e, typed) => Outcome::Unchanged,
        (Some(e), now) => {
            let servers = top.object_value_or_set(key);
            // In the order people write it: type, command, args.
            let mut fields = Vec::new();
            if typed {
                fields.push(("type".to_string(), CstInputValue::from("stdio")));
            }
            fields.push((
                "command".to_string(),
                CstInputValue::from(e.command.as_str()),
            ));
            fields.push(("args".to_string(), to_cst(&e.args.clone().into())));
            let value = CstInputValue::Object(fields);
            match servers.get(NAME) {
                Some(prop) => prop.set_value(value),
                None => {
                    servers.append(NAME, value);
                }
            }
            if now.is_some() {
                Outcome::Updated
            } else {
                Outcome::Added
            }
        }
        (None, Some(_)) => {
            if let Some(prop) = top.object_value(key).and_then(|s| s.get(NAME)) {
                prop.remove();
            }
            Outcome::Removed
        }
        (None, None) => Outcome::Absent,
    };
    let mut out = root.to_string();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok((outcome, out, previous))
}

/// A client's JSON settings (comments and trailing commas allowed, as the
/// clients allow them); an error to show when it is not valid JSON.
pub fn client_json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str::<serde_json::Value>(text).or_else(|e| {
        match jsonc_parser::parse_to_serde_value(text, &ParseOptions::default()) {
            Ok(Some(v)) => Ok(v),
            _ => Err(format!("not valid JSON ({e})")),
        }
    })
}

/// Whether a client's file `text` holds ferrepl's entry; an error (to show)
/// when it is not valid JSON or TOML.
pub fn has_entry(text: &str, format: Format) -> Result<bool, String> {
    match format {
        Format::Json { key, .. } => {
            if text.trim().is_empty() {
                return Ok(false);
            }
            let value = client_json(text)?;
            Ok(value.get(key).and_then(|s| s.get(NAME)).is_some())
        }
        Format::Toml => {
            let doc: toml_edit::DocumentMut = text
                .parse()
                .map_err(|e: toml_edit::TomlError| format!("not valid TOML ({})", e.message()))?;
            Ok(toml_entry(&doc).is_some())
        }
    }
}

/// The command a JSON entry runs (the entry itself when it has none).
fn json_command_line(entry: &serde_json::Value) -> String {
    let args: Vec<String> = entry
        .get("args")
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    match entry.get("command").and_then(|c| c.as_str()) {
        Some(c) => command_line(c, &args),
        None => entry.to_string(),
    }
}

/// ferrepl's entry in a Codex config as (command, args, tool_timeout_sec),
/// each None when missing or of another type.
type TomlEntry = (Option<String>, Option<Vec<String>>, Option<i64>);

fn toml_entry(doc: &toml_edit::DocumentMut) -> Option<TomlEntry> {
    let t = doc
        .get("mcp_servers")
        .and_then(|s| s.get(NAME))
        .and_then(|t| t.as_table_like())?;
    let command = t
        .get("command")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let args = t.get("args").and_then(|v| v.as_array()).map(|a| {
        a.iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    });
    let timeout = t.get("tool_timeout_sec").and_then(|v| v.as_integer());
    Some((command, args, timeout))
}

fn edit_toml(
    path: &Path,
    text: Option<&str>,
    entry: Option<&Entry>,
) -> Result<(Outcome, String, Option<String>), String> {
    let mut doc: toml_edit::DocumentMut = text.unwrap_or("").parse().map_err(|e| {
        format!(
            "{} is not valid TOML ({e}); it was left untouched: fix it (or move it away) and run this again",
            path.display()
        )
    })?;
    let servers_ok = doc.get("mcp_servers").is_none_or(|s| s.is_table_like());
    if !servers_ok {
        return Err(format!(
            "{}: mcp_servers is not a table; it was left untouched",
            path.display()
        ));
    }
    let current = toml_entry(&doc);
    let previous = current.as_ref().map(|(command, args, _)| {
        command_line(
            command.as_deref().unwrap_or("(no command)"),
            args.as_deref().unwrap_or_default(),
        )
    });
    let outcome = match (entry, current) {
        (Some(e), Some((Some(c), Some(a), Some(t))))
            if c == e.command
                && a == e.args
                && u64::try_from(t).ok() == Some(e.tool_timeout_sec) =>
        {
            Outcome::Unchanged
        }
        (Some(e), now) => {
            if doc.get("mcp_servers").is_none() {
                let mut servers = toml_edit::Table::new();
                servers.set_implicit(true);
                doc.insert("mcp_servers", toml_edit::Item::Table(servers));
            }
            let mut table = toml_edit::Table::new();
            table.insert("command", toml_edit::value(e.command.clone()));
            let mut args = toml_edit::Array::new();
            for a in &e.args {
                args.push(a.as_str());
            }
            table.insert("args", toml_edit::value(args));
            table.insert(
                "tool_timeout_sec",
                toml_edit::value(i64::try_from(e.tool_timeout_sec).unwrap_or(i64::MAX)),
            );
            doc["mcp_servers"][NAME] = toml_edit::Item::Table(table);
            if now.is_some() {
                Outcome::Updated
            } else {
                Outcome::Added
            }
        }
        (None, Some(_)) => {
            if let Some(servers) = doc
                .get_mut("mcp_servers")
                .and_then(|s| s.as_table_like_mut())
            {
                servers.remove(NAME);
            }
            Outcome::Removed
        }
        (None, None) => Outcome::Absent,
    };
    Ok((outcome, doc.to_string(), previous))
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: Format = Format::Json {
        key: "mcpServers",
        typed: false,
    };

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    fn entry() -> Entry {
        Entry {
            command: "/bin/ferrepl".into(),
            args: Vec::new(),
            tool_timeout_sec: 60,
        }
    }

    /// Claude keeps ~/.claude.json 0600: a new one is made 0600, and a
    /// backup is never more readable than its original.
    #[test]
    fn private_files_stay_private_and_so_do_their_backups() {
        use std::os::unix::fs::PermissionsExt;
        let home = tempfile::tempdir().expect("tempdir");
        let claude = Target {
            client: super::super::clients::Client::ClaudeCode,
            path: home.path().join(".claude.json"),
            format: JSON,
        };
        apply(&claude, Some(&entry()), false).expect("created");
        assert_eq!(mode(&claude.path), 0o600, "a new ~/.claude.json");
        apply(&claude, None, false).expect("removed");
        std::fs::write(&claude.path, "{\"theme\": 1}").expect("write");
        std::fs::set_permissions(&claude.path, std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        let backup = with_suffix(&claude.path, ".ferrepl-backup");
        // An old backup left readable must not stay so.
        std::fs::write(&backup, "old").expect("old backup");
        std::fs::set_permissions(&backup, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let change = apply(&claude, Some(&entry()), false).expect("updated");
        assert_eq!(change.backup.as_deref(), Some(backup.as_path()));
        assert_eq!(mode(&backup), 0o600, "the backup of a 0600 file");
        assert_eq!(mode(&claude.path), 0o600, "the file keeps its mode");
        // A project's file keeps the usual mode (umask's).
        let project = Target {
            client: super::super::clients::Client::ClaudeCode,
            path: home.path().join("proj/.mcp.json"),
            format: JSON,
        };
        apply(&project, Some(&entry()), false).expect("created");
        assert_ne!(
            mode(&project.path),
            0o600,
            "not private: it is the project's"
        );
    }

    #[test]
    fn only_what_install_writes_counts_as_nothing() {
        for empty in [
            "",
            " \n",
            "{}",
            "{\n  \"mcpServers\": {}\n}\n",
            "\u{feff}{}",
        ] {
            assert!(holds_nothing(empty, JSON), "{empty:?}");
        }
        for kept in [
            "{\"mcpServers\": {\"other\": {}}}",
            "{\"mcpServers\": {}, \"theme\": 1}",
            "// mine\n{\"mcpServers\": {}}",
            "{\"mcpServers\": {/* x */}}",
            "{\"servers\": {}}",
        ] {
            assert!(!holds_nothing(kept, JSON), "{kept:?}");
        }
        let vscode = Format::Json {
            key: "servers",
            typed: true,
        };
        assert!(holds_nothing("{\n  \"servers\": {}\n}", vscode));
        for empty in ["", "\n", "[mcp_servers]\n"] {
            assert!(holds_nothing(empty, Format::Toml), "{empty:?}");
        }
        for kept in ["# mine\n", "model = \"o4\"\n", "[mcp_servers.other]\n"] {
            assert!(!holds_nothing(kept, Format::Toml), "{kept:?}");
        }
    }

    #[test]
    fn entries_are_found_by_their_name_not_a_substring() {
        let claude = r#"{"projects": {"/work/ferrepl": {}}, "mcpServers": {}}"#;
        assert_eq!(has_entry(claude, JSON), Ok(false));
        let named = r#"{"mcpServers": {"ferrepl": {"command": "x"}}}"#;
        assert_eq!(has_entry(named, JSON), Ok(true));
        assert_eq!(
            has_entry("// c\n{\"mcpServers\": {\"ferrepl\": {}}}", JSON),
            Ok(true)
        );
        assert!(has_entry("{\"mcpServers\": ", JSON).is_err());
        let toml = "[mcp_servers.ferrepl]\ncommand = \"x\"\n";
        assert_eq!(has_entry(toml, Format::Toml), Ok(true));
        assert_eq!(
            has_entry("[projects.\"/ferrepl\"]\n", Format::Toml),
            Ok(false)
        );
        assert!(has_entry("[x\n", Format::Toml).is_err());
    }
}
