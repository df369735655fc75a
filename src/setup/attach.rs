//! `ferrepl attach SESSION`: picks the live server (of this user) that
//! serves the session, then prints its connection file or replaces itself
//! with `jupyter console --existing FILE`. Never starts or changes a
//! session: it only points a client at a kernel that runs already.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::attach::{Entry, entries_of};
use crate::config::commands::AttachArgs;

pub fn run(args: &AttachArgs) -> ExitCode {
    match choose(args) {
        Ok(entry) if args.print => {
            println!("{}", entry.file.display());
            ExitCode::SUCCESS
        }
        Ok(entry) => console(args, &entry),
        Err(message) => {
            eprintln!("ferrepl attach: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The published kernel session the arguments name, or why none is.
fn choose(args: &AttachArgs) -> Result<Entry, String> {
    let servers = crate::state::live_servers();
    if servers.is_empty() {
        return Err(format!(
            "no ferrepl server of this user is running (none under {}); attach runs on the server's machine, as the user the server runs as",
            crate::state::runtime_root().display()
        ));
    }
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let wanted = args.workdir.as_deref().map(canonical);
    let here = std::env::current_dir().ok().map(|d| canonical(&d));
    let mut all: Vec<Entry> = servers
        .iter()
        .flat_map(|(_, dir)| entries_of(dir))
        .collect();
    let serving = |e: &Entry, dir: &Path| canonical(&e.workdir) == dir;
    if let Some(dir) = &wanted {
        all.retain(|e| serving(e, dir));
    }
    let (named, others): (Vec<Entry>, Vec<Entry>) =
        all.into_iter().partition(|e| e.session == args.session);
    let mut named: Vec<Entry> = named.into_iter().filter(Entry::kernel_running).collect();
    if named.len() > 1
        && wanted.is_none()
        && let Some(here) = &here
        && named.iter().any(|e| serving(e, here))
    {
        named.retain(|e| serving(e, here));
    }
    match named.len() {
        1 => Ok(named.remove(0)),
        0 => {
            let mut kernels: Vec<String> = others
                .iter()
                .filter(|e| e.kernel_running())
                .map(|e| e.session.clone())
                .collect();
            kernels.sort();
            kernels.dedup();
            let listed = if kernels.is_empty() {
                "none".to_string()
            } else {
                kernels.join(", ")
            };
            let place = match &wanted {
                Some(dir) => format!("the server serving {}", dir.display()),
                None => "this user's servers".to_string(),
            };
            Err(format!(
                "no running kernel session named '{}' in {place} (kernel sessions there: {listed}); attach works on kernel sessions only (python_sessions create ... kernel), not on built-in Python or R sessions",
                args.session
            ))
        }
        _ => {
            let dirs: Vec<String> = named
                .iter()
                .map(|e| format!("  {}", e.workdir.display()))
                .collect();
            Err(format!(
                "several servers have a kernel session named '{}'; pass --workdir DIR for one of their workspaces:\n{}",
                args.session,
                dirs.join("\n")
            ))
        }
    }
}

/// Replaces this process with `PROGRAM console --existing FILE`.
fn console(args: &AttachArgs, entry: &Entry) -> ExitCode {
    let Some(program) = find_program(&args.jupyter) else {
        eprintln!(
            "ferrepl attach: cannot find '{}'; install Jupyter's console (pip install jupyter-console) or pass --jupyter PROGRAM, or use --print to get the connection file for another client",
            args.jupyter.display()
        );
        return ExitCode::FAILURE;
    };
    eprintln!(
        "ferrepl attach: kernel session '{}' of the server serving {}; the agent's next result says you ran cells, and python_history lists them",
        entry.session,
        entry.workdir.display()
    );
    let error = std::process::Command::new(&program)
        .args(["console", "--existing"])
        .arg(&entry.file)
        .exec();
    eprintln!(
        "ferrepl attach: cannot start {}: {error}",
        program.display()
    );
    ExitCode::FAILURE
}

/// `program` itself when it names a path, else the first on PATH.
fn find_program(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 {
        return runnable(program).then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| runnable(p))
}
