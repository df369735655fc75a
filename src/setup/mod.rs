//! Setting ferrepl up rather than serving: `install` / `uninstall` (its
//! entry in agent clients' MCP configuration), `doctor` (what this
//! machine gives a session) and `attach` (a console on a kernel session).

mod approval;
pub mod attach;
pub mod clients;
pub mod doctor;
mod doctor_clients;
mod doctor_host;
mod doctor_install;
mod doctor_sandbox;
mod doctor_upstreams;
pub mod install;
pub mod launch;
mod probe;
pub mod terminal;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clients::{Client, Platform, Scope, Target};
use install::{Entry, Outcome};

pub use crate::config::commands::{InstallArgs, UninstallArgs};

/// `--max-wait` among the server arguments (ferrepl's default otherwise).
fn max_wait(args: &[String]) -> f64 {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--max-wait=") {
            return v.parse().unwrap_or(50.0);
        }
        if a == "--max-wait" {
            return it.next().and_then(|v| v.parse().ok()).unwrap_or(50.0);
        }
    }
    50.0
}

/// What `install` and `uninstall` are asked, once parsed.
struct Request<'a> {
    clients: &'a [String],
    scope: &'a str,
    workdir: Option<&'a Path>,
    dry_run: bool,
    /// None: an uninstall.
    server_args: Option<&'a [String]>,
}

/// `ferrepl install`.
pub fn run_install(args: &InstallArgs) -> ExitCode {
    finish(install_all(&Request {
        clients: &args.clients,
        scope: &args.scope,
        workdir: args.workdir.as_deref(),
        dry_run: args.dry_run,
        server_args: Some(&args.server_args),
    }))
}

/// `ferrepl uninstall`.
pub fn run_uninstall(args: &UninstallArgs) -> ExitCode {
    finish(install_all(&Request {
        clients: &args.clients,
        scope: &args.scope,
        workdir: args.workdir.as_deref(),
        dry_run: args.dry_run,
        server_args: None,
    }))
}

fn finish(done: Result<bool, String>) -> ExitCode {
    match done {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ferrepl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn install_all(req: &Request) -> Result<bool, String> {
    let clients = Client::parse_list(req.clients)?;
    let scope = if req.scope == "project" {
        Scope::Project
    } else {
        Scope::User
    };
    let platform = Platform::current()?;
    let workdir = match req.workdir {
        Some(dir) => Some(
            dir.canonicalize()
                .map_err(|e| format!("--workdir {}: {e}", dir.display()))?,
        ),
        None => None,
    };
    let project = match &workdir {
        Some(dir) => dir.clone(),
        None => std::env::current_dir()
            .map_err(|e| format!("cannot read the current directory: {e}"))?,
    };
    // How clients start this ferrepl (launch.rs says how it is chosen); an
    // uninstall writes no command, so it needs none.
    let entry = match req.server_args {
        Some(extra) => {
            let launch = launch::decide(&launch::Context::current()?)?;
            if let Some(note) = &launch.note {
                eprintln!("note: {note}");
            }
            let mut args = launch.args;
            if let Some(dir) = &workdir {
                args.extend(["--workdir".to_string(), dir.display().to_string()]);
            }
            Some(Entry {
                command: launch.command,
                tool_timeout_sec: max_wait(extra).ceil() as u64 + 30,
                args,
            })
        }
        None => None,
    };
    let all = req
        .clients
        .iter()
        .any(|c| c.split(',').any(|n| n.trim() == "all"));
    let mut ok = true;
    for client in clients {
        let target = match clients::target(client, scope, &platform, &project) {
            Ok(t) => t,
            // With `all`, a client without such a file is skipped, saying so.
            Err(why) => {
                println!("{}: skipped: {why}", client.name());
                ok &= all;
                continue;
            }
        };
        let extra = req.server_args.unwrap_or_default();
        let entry = entry.as_ref().map(|e| with_sandbox(e, client, extra));
        let change = match install::apply(&target, entry.as_ref(), req.dry_run) {
            Ok(change) => change,
            Err(e) => {
                eprintln!("{}: {e}", client.name());
                ok = false;
                continue;
            }
        };
        // A project's client directory (.cursor, ...) the removal emptied.
        let emptied = (change.file_removed && scope == Scope::Project)
            .then(|| emptied_dir(&target.path, &project, req.dry_run))
            .flatten();
        print_change(&target, &change, entry.as_ref(), req.dry_run, emptied);
        if entry.is_some() {
            // The project, or for a user-level entry the workspace it serves.
            let dir = match scope {
                Scope::Project => Some(project.as_path()),
                Scope::User => workdir.as_deref(),
            };
            print_next(client, scope, &platform, dir, change.outcome);
        }
    }
    Ok(ok)
}

/// The entry with its sandbox mode named, then the server arguments given
/// after `--`: Codex's policy for Codex (it sends it with every call),
/// workspace-write for the others; a --sandbox among the arguments is kept
/// as given.
fn with_sandbox(entry: &Entry, client: Client, extra: &[String]) -> Entry {
    let named = extra
        .iter()
        .any(|a| a == "--sandbox" || a.starts_with("--sandbox="));
    let mut entry = entry.clone();
    if !named {
        let mode = match client {
            Client::Codex => "inherit",
            _ => "workspace-write",
        };
        entry
            .args
            .extend(["--sandbox".to_string(), mode.to_string()]);
    }
    entry.args.extend(extra.iter().cloned());
    entry
}

/// The directory holding `file` when it is a client's directory in
/// `project` (`.cursor`, `.vscode`, `.gemini`, `.codex`) and holds nothing
/// else: removed (dry-run: only told). Never the project itself, never a
/// directory with anything in it (`remove_dir` removes only empty ones).
fn emptied_dir(file: &Path, project: &Path, dry_run: bool) -> Option<PathBuf> {
    let dir = file.parent()?;
    if dir == project || dir.parent() != Some(project) {
        return None;
    }
    let empty = if dry_run {
        // Once the file is gone: it is all there is.
        std::fs::read_dir(dir)
            .ok()?
            .all(|e| e.is_ok_and(|e| e.path() == file))
    } else {
        std::fs::remove_dir(dir).is_ok()
    };
    empty.then(|| dir.to_path_buf())
}

/// The one step `client` still waits for, when there is one: its approval
/// or trust (approval.rs), and Codex's restart after a change.
fn print_next(
    client: Client,
    scope: Scope,
    platform: &Platform,
    dir: Option<&Path>,
    outcome: Outcome,
) {
    let mut steps = Vec::new();
    if let Some(found) = dir.and_then(|d| approval::check(client, scope, platform, d))
        && found.blocking()
    {
        steps.push(found.next());
    }
    if client == Client::Codex && outcome.changed() {
        steps.push("restart Codex to load it".to_string());
    }
    if !steps.is_empty() {
        println!("  next: {}", steps.join("; then "));
    }
}

/// What an install or uninstall did to one client's file, with the
/// command the entry ran before (an update or removal) and runs now.
fn print_change(
    target: &Target,
    change: &install::Change,
    entry: Option<&Entry>,
    dry_run: bool,
    emptied: Option<PathBuf>,
) {
    let verb = match (change.outcome, dry_run) {
        (Outcome::Added, false) => "added ferrepl to",
        (Outcome::Added, true) => "would add ferrepl to",
        (Outcome::Updated, false) => "updated ferrepl in",
        (Outcome::Updated, true) => "would update ferrepl in",
        (Outcome::Removed, false) => "removed ferrepl from",
        (Outcome::Removed, true) => "would remove ferrepl from",
        (Outcome::Unchanged, _) => "unchanged (ferrepl is already set up) in",
        (Outcome::Absent, _) => "nothing to remove in",
    };
    let mut line = format!("{}: {verb} {}", target.client.name(), target.path.display());
    if change.file_removed {
        line.push_str(match dry_run {
            false => " and deleted the file, which held nothing else",
            true => " and delete the file, which would then be empty",
        });
        if let Some(dir) = emptied {
            line.push_str(&format!(", and its directory {}", dir.display()));
        }
    }
    if let Some(b) = &change.backup {
        line.push_str(&format!(" (backup: {})", b.display()));
    }
    println!("{line}");
    if matches!(change.outcome, Outcome::Updated | Outcome::Removed)
        && let Some(previous) = &change.previous
    {
        println!("  was: {previous}");
    }
    if matches!(change.outcome, Outcome::Added | Outcome::Updated)
        && let Some(entry) = entry
    {
        println!(
            "  now: {}",
            install::command_line(&entry.command, &entry.args)
        );
    }
}
