//! Setting ferrepl up rather than serving: `install` / `uninstall` (its
//! entry in agent clients' MCP configuration) and `doctor` (what this
//! machine gives a session).

pub mod clients;
pub mod doctor;
mod doctor_install;
pub mod install;
pub mod launch;
mod probe;

use std::process::ExitCode;

use clients::{Client, Platform, Scope};
use install::{Entry, Outcome};

pub use crate::config::commands::InstallArgs;

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

/// `ferrepl install` (remove = false) or `ferrepl uninstall`.
pub fn run_install(args: &InstallArgs, remove: bool) -> ExitCode {
    match install_all(args, remove) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ferrepl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn install_all(args: &InstallArgs, remove: bool) -> Result<bool, String> {
    let clients = Client::parse_list(&args.clients)?;
    let scope = if args.scope == "project" {
        Scope::Project
    } else {
        Scope::User
    };
    let platform = Platform::current()?;
    let workdir = match &args.workdir {
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
    let (program, mut server_args) = if remove {
        (String::new(), Vec::new())
    } else {
        let launch = launch::decide(&launch::Context::current()?)?;
        if let Some(note) = &launch.note {
            eprintln!("note: {note}");
        }
        (launch.command, launch.args)
    };
    if let Some(dir) = &workdir {
        server_args.extend(["--workdir".to_string(), dir.display().to_string()]);
    }
    server_args.extend(args.server_args.iter().cloned());
    let entry = Entry {
        command: program,
        tool_timeout_sec: max_wait(&args.server_args).ceil() as u64 + 30,
        args: server_args,
    };
    let all = args
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
        match install::apply(&target, (!remove).then_some(&entry), args.dry_run) {
            Ok(change) => print_change(client.name(), &target.path, &change, &entry, args.dry_run),
            Err(e) => {
                eprintln!("{}: {e}", client.name());
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// What an install or uninstall did to one client's file, with the
/// command the entry ran before (an update or removal) and runs now.
fn print_change(
    client: &str,
    path: &std::path::Path,
    change: &install::Change,
    entry: &Entry,
    dry_run: bool,
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
    let mut line = format!("{client}: {verb} {}", path.display());
    if let Some(b) = &change.backup {
        line.push_str(&format!(" (backup: {})", b.display()));
    }
    println!("{line}");
    if matches!(change.outcome, Outcome::Updated | Outcome::Removed)
        && let Some(previous) = &change.previous
    {
        println!("  was: {previous}");
    }
    if matches!(change.outcome, Outcome::Added | Outcome::Updated) {
        println!(
            "  now: {}",
            install::command_line(&entry.command, &entry.args)
        );
    }
}
