//! Doctor's items about what lies around the sandbox rather than in it:
//! a project's client entries that start ferrepl with the sandbox weakened
//! (a file that comes with a cloned repository as easily as with
//! `ferrepl install --scope project`), and git's `safe.bareRepository`,
//! without which a bare repository made of ordinary files in the workspace
//! is run by git as the user's shell enters it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::clients::{self, Format};
use super::doctor::{Item, Status, item};
use super::install::NAME;

/// How long git may take to answer.
const GIT_TIMEOUT: Duration = Duration::from_secs(5);
/// The first git that knows `safe.bareRepository`.
const BARE_REPOSITORY_SINCE: (u32, u32) = (2, 38);
const BARE_FIX: &str = "git config --global safe.bareRepository explicit";

/// A flag (or its variable) that weakens the sandbox, with what it does.
struct Weakening {
    flag: &'static str,
    var: &'static str,
    /// The value that weakens (None: any value does).
    value: Option<&'static str>,
    does: &'static str,
}

const WEAKENING: &[Weakening] = &[
    Weakening {
        flag: "--sandbox",
        var: "FERREPL_SANDBOX",
        value: Some("off"),
        does: "runs sessions with no sandbox: they read and write everything the user can, protected places included, and reach the network",
    },
    Weakening {
        flag: "--sandbox",
        var: "FERREPL_SANDBOX",
        value: Some("danger-full-access"),
        does: "runs sessions with no sandbox: they read and write everything the user can, protected places included, and reach the network",
    },
    Weakening {
        flag: "--network",
        var: "FERREPL_NETWORK",
        value: Some("on"),
        does: "gives sessions the whole network (code the agent runs can send the workspace anywhere)",
    },
    Weakening {
        flag: "--allow-write",
        var: "FERREPL_ALLOW_WRITE",
        value: None,
        does: "lets sessions write that place too",
    },
    Weakening {
        flag: "--allow-write-protected",
        var: "FERREPL_ALLOW_WRITE_PROTECTED",
        value: None,
        does: "lets sessions change that protected place, whose contents host programs run (git hooks, agent clients' settings)",
    },
];

/// The weakening flags in an entry's arguments and environment, as said
/// to the user: `--sandbox off (runs sessions with no sandbox...)`.
pub(super) fn weakening_flags(args: &[String], env: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    let weakens = |w: &Weakening, value: &str| match w.value {
        Some(v) => value.trim().eq_ignore_ascii_case(v),
        None => !value.trim().is_empty(),
    };
    let mut it = args.iter().peekable();
    while let Some(arg) = it.next() {
        for w in WEAKENING {
            let value = match arg.strip_prefix(w.flag) {
                Some("") => it.peek().map(|v| v.as_str()),
                Some(rest) => rest.strip_prefix('='),
                None => None,
            };
            if let Some(value) = value.filter(|v| weakens(w, v)) {
                found.push(format!("{} {value} ({})", w.flag, w.does));
            }
        }
    }
    for (key, value) in env {
        for w in WEAKENING.iter().filter(|w| w.var == key) {
            if weakens(w, value) {
                found.push(format!("{key}={value} ({})", w.does));
            }
        }
    }
    found
}

/// Whether a server entry starts ferrepl: named `ferrepl`, or its command
/// (or an argument, as `uvx ferrepl`) is a program named ferrepl.
fn runs_ferrepl(name: &str, command: Option<&str>, args: &[String]) -> bool {
    let is_ferrepl = |s: &str| Path::new(s).file_name().is_some_and(|f| f == NAME);
    name == NAME || command.is_some_and(is_ferrepl) || args.iter().any(|a| is_ferrepl(a))
}

/// A server entry's arguments and environment.
type Launch = (Vec<String>, Vec<(String, String)>);

/// The servers of a client's file that start ferrepl: (args, env) each;
/// an error (to show) when the file is not valid JSON or TOML.
pub(super) fn ferrepl_entries(text: &str, format: Format) -> Result<Vec<Launch>, String> {
    let strings = |v: Option<&serde_json::Value>| -> Vec<String> {
        v.and_then(|a| a.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let pairs = |v: Option<&serde_json::Value>| -> Vec<(String, String)> {
        v.and_then(|e| e.as_object())
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    match format {
        Format::Json { key, .. } => {
            if text.trim().is_empty() {
                return Ok(out);
            }
            let value = super::install::client_json(text)?;
            let Some(servers) = value.get(key).and_then(|s| s.as_object()) else {
                return Ok(out);
            };
            for (name, entry) in servers {
                let args = strings(entry.get("args"));
                let command = entry.get("command").and_then(|c| c.as_str());
                if runs_ferrepl(name, command, &args) {
                    out.push((args, pairs(entry.get("env"))));
                }
            }
        }
        Format::Toml => {
            let doc: toml_edit::DocumentMut = text
                .parse()
                .map_err(|e: toml_edit::TomlError| format!("not valid TOML ({})", e.message()))?;
            let Some(servers) = doc.get("mcp_servers").and_then(|s| s.as_table_like()) else {
                return Ok(out);
            };
            for (name, entry) in servers.iter() {
                let Some(entry) = entry.as_table_like() else {
                    continue;
                };
                let args: Vec<String> = entry
                    .get("args")
                    .and_then(|a| a.as_array())
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let command = entry.get("command").and_then(|c| c.as_str());
                if !runs_ferrepl(name, command, &args) {
                    continue;
                }
                let env = entry
                    .get("env")
                    .and_then(|e| e.as_table_like())
                    .map(|t| {
                        t.iter()
                            .filter_map(|(k, v)| v.as_str().map(|v| (k.to_string(), v.to_string())))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((args, env));
            }
        }
    }
    Ok(out)
}

/// The project's client files (those `ferrepl install --scope project`
/// writes in the workspace) whose ferrepl entries weaken the sandbox: a
/// warning naming each file, flag and what it does; None when none does.
pub(super) fn project_flags_item(workdir: &Path) -> Option<Item> {
    // Project files do not depend on the home; one is needed to ask.
    let platform = clients::Platform::current().unwrap_or(clients::Platform {
        os: clients::Os::Linux,
        home: PathBuf::from("/"),
        appdata: None,
        xdg_config: None,
        codex_home: None,
        gemini_trusted_folders: None,
    });
    let mut said = Vec::new();
    let mut seen = Vec::<PathBuf>::new();
    for client in clients::Client::ALL {
        let Ok(target) = clients::target(client, clients::Scope::Project, &platform, workdir)
        else {
            continue;
        };
        if seen.contains(&target.path) {
            continue;
        }
        seen.push(target.path.clone());
        let Ok(Some(text)) = super::approval::read_capped(&target.path) else {
            continue;
        };
        let Ok(entries) = ferrepl_entries(&text, target.format) else {
            continue;
        };
        let flags: Vec<String> = entries
            .iter()
            .flat_map(|(args, env)| weakening_flags(args, env))
            .collect();
        if !flags.is_empty() {
            said.push(format!("{}: {}", target.path.display(), flags.join(", ")));
        }
    }
    if said.is_empty() {
        return None;
    }
    Some(item(
        "project-flags",
        Status::Warn,
        format!(
            "this project's client configuration starts ferrepl with the sandbox weakened: {}; a project file can come with a cloned repository: remove the flag from the entry unless you put it there yourself",
            said.join("; ")
        ),
    ))
}

/// git's `safe.bareRepository`, asked of the git on PATH (never one
/// sessions could have written) with a clean environment but HOME.
pub(super) fn git_item(workdir: &Path) -> Item {
    let writable =
        |p: &Path| p.starts_with(workdir) || p.canonicalize().is_ok_and(|r| r.starts_with(workdir));
    let Some(git) =
        crate::executables::find_on_path_where("git", |p| p.is_absolute() && !writable(p))
    else {
        return item(
            "git",
            Status::Good,
            format!(
                "no git on PATH: no bare repository is run (if you install git, run {BARE_FIX})"
            ),
        );
    };
    let version = match run_git(&git, &["--version"]) {
        Ok((_, out)) => out.trim().to_string(),
        Err(e) => return item("git", Status::Warn, format!("{}: {e}", git.display())),
    };
    let number = version
        .strip_prefix("git version ")
        .unwrap_or(&version)
        .to_string();
    let mut parts = number.split(['.', ' ']).map(|n| n.parse::<u32>().ok());
    let known = match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= BARE_REPOSITORY_SINCE,
        _ => true,
    };
    let (a, b) = BARE_REPOSITORY_SINCE;
    if !known {
        return item(
            "git",
            Status::Warn,
            format!(
                "git {number} ({}) predates safe.bareRepository ({a}.{b}): a bare repository embedded in ordinary files a session writes cannot be recognised by name, and git runs its hooks and config when your shell enters it; upgrade git, then run {BARE_FIX}",
                git.display()
            ),
        );
    }
    // The global setting, else the system's (git reads the last one set).
    let mut value = None;
    for scope in ["--global", "--system"] {
        match run_git(&git, &["config", scope, "--get", "safe.bareRepository"]) {
            Ok((0, out)) => {
                value = Some(out.trim().to_string());
                break;
            }
            Ok((1, _)) => {}
            Ok((code, out)) => {
                let why = out.trim();
                return item(
                    "git",
                    Status::Warn,
                    format!(
                        "git config {scope} failed (exit {code}{}{why}); set {BARE_FIX}",
                        if why.is_empty() { "" } else { ": " }
                    ),
                );
            }
            Err(e) => return item("git", Status::Warn, format!("{}: {e}", git.display())),
        }
    }
    match value {
        Some(v) if v.eq_ignore_ascii_case("explicit") => item(
            "git",
            Status::Good,
            format!(
                "safe.bareRepository is explicit (git {number}): git runs no bare repository it is not pointed to"
            ),
        ),
        found => {
            let is = found.map_or("not set".to_string(), |v| format!("'{v}'"));
            item(
                "git",
                Status::Warn,
                format!(
                    "safe.bareRepository is {is} (git {number}): a bare repository embedded in ordinary files a session writes (HEAD, config, hooks/ in any directory) cannot be recognised by name, and git runs its hooks and config when your shell enters it (a prompt showing git status does); run {BARE_FIX}"
                ),
            )
        }
    }
}

/// Runs git from `/` with only HOME (and XDG_CONFIG_HOME, where git's
/// global file may be) in its environment; (exit code, stdout, or stderr
/// when it failed). Killed after `GIT_TIMEOUT`.
fn run_git(git: &Path, args: &[&str]) -> Result<(i32, String), String> {
    let mut cmd = std::process::Command::new(git);
    cmd.args(args)
        .current_dir("/")
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let home = std::env::var_os("HOME")
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.dir.into_os_string())
        })
        .filter(|h| Path::new(h).is_absolute());
    if let Some(home) = home {
        cmd.env("HOME", home);
    }
    if let Some(xdg) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| Path::new(x).is_absolute()) {
        cmd.env("XDG_CONFIG_HOME", xdg);
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot run it: {e}"))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < GIT_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", GIT_TIMEOUT.as_secs()));
            }
            Err(e) => return Err(format!("cannot wait for it: {e}")),
        }
    };
    let out = read_pipe(child.stdout.take());
    let code = status.code().unwrap_or(-1);
    if code == 0 || code == 1 {
        return Ok((code, out));
    }
    let err = read_pipe(child.stderr.take());
    Ok((code, err.lines().next().unwrap_or("").to_string()))
}

/// What a finished child left in its pipe (at most 64 KiB).
fn read_pipe(pipe: Option<impl std::io::Read>) -> String {
    use std::io::Read;
    let mut bytes = Vec::new();
    if let Some(pipe) = pipe {
        let _ = pipe.take(64 * 1024).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn weakening_flags_are_found_in_both_forms_and_in_env() {
        let args = strings(&[
            "--workdir",
            ".",
            "--sandbox",
            "off",
            "--network=on",
            "--allow-write",
            "/data",
            "--allow-write-protected=.git",
        ]);
        let env = vec![
            ("FERREPL_SANDBOX".to_string(), "OFF".to_string()),
            ("FERREPL_NETWORK".to_string(), "packages".to_string()),
        ];
        let found = weakening_flags(&args, &env);
        let heads: Vec<&str> = found
            .iter()
            .map(|f| f.split(" (").next().unwrap_or(""))
            .collect();
        assert_eq!(
            heads,
            [
                "--sandbox off",
                "--network on",
                "--allow-write /data",
                "--allow-write-protected .git",
                "FERREPL_SANDBOX=OFF"
            ]
        );
        // Controls: the defaults and the stronger settings.
        let fine = strings(&[
            "--sandbox",
            "read-only",
            "--network",
            "packages",
            "--protect",
            "x",
        ]);
        assert!(weakening_flags(&fine, &[]).is_empty());
        assert!(weakening_flags(&strings(&["--sandbox=workspace-write"]), &[]).is_empty());
    }

    #[test]
    fn entries_that_run_ferrepl_are_read_from_json_and_toml() {
        let json = r#"{
            // comments allowed
            "mcpServers": {
                "ferrepl": {"command": "/x/ferrepl", "args": ["--sandbox", "off"]},
                "py": {"command": "uvx", "args": ["ferrepl", "--network=on"], "env": {"FERREPL_ALLOW_WRITE": "/etc"}},
                "other": {"command": "node", "args": ["--sandbox", "off"]}
            }
        }"#;
        let format = Format::Json {
            key: "mcpServers",
            typed: false,
        };
        let entries = ferrepl_entries(json, format).expect("json");
        assert_eq!(entries.len(), 2, "{entries:?}");
        let toml = "[mcp_servers.ferrepl]\ncommand = \"/x/ferrepl\"\nargs = [\"--allow-write-protected\", \"all\"]\n[mcp_servers.ferrepl.env]\nFERREPL_SANDBOX = \"off\"\n";
        let entries = ferrepl_entries(toml, Format::Toml).expect("toml");
        assert_eq!(entries.len(), 1);
        let found = weakening_flags(&entries[0].0, &entries[0].1);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(ferrepl_entries("{", format).is_err());
    }
}
