//! `ferrepl attach SESSION`: picks the live server (of this user), and its
//! tenant, that serves the session (`--workdir`, `--tenant`, else the
//! workspace holding the current directory), then prints its connection
//! file or replaces itself with `jupyter console --existing FILE`. Never
//! starts or changes a session: it only points a client at a kernel that
//! runs already.

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
        .flat_map(|(pid, dir)| entries_of(*pid, dir))
        .filter(Entry::kernel_running)
        .collect();
    if let Some(dir) = &wanted {
        all.retain(|e| canonical(&e.workdir) == *dir);
    }
    if let Some(tenant) = &args.tenant {
        all.retain(|e| e.tenant.as_ref() == Some(tenant));
    }
    let (mut named, others): (Vec<Entry>, Vec<Entry>) =
        all.into_iter().partition(|e| e.session == args.session);
    if named.len() > 1
        && wanted.is_none()
        && let Some(here) = &here
    {
        // The deepest workspace holding the current directory: a tenant's
        // (<workdir>/NAME) rather than its server's.
        let depth = |e: &Entry| {
            let dir = canonical(&e.workdir);
            here.starts_with(&dir).then(|| dir.components().count())
        };
        if let Some(deepest) = named.iter().filter_map(depth).max() {
            named.retain(|e| depth(e) == Some(deepest));
        }
    }
    match named.len() {
        1 => Ok(named.remove(0)),
        0 => Err(none_named(args, wanted.as_deref(), &others)),
        _ => Err(several_named(&args.session, &named)),
    }
}

/// Why no kernel session is named `args.session` where the arguments
/// look; `others` are the running ones there.
fn none_named(args: &AttachArgs, wanted: Option<&Path>, others: &[Entry]) -> String {
    let mut kernels: Vec<&str> = others.iter().map(|e| e.session.as_str()).collect();
    kernels.sort();
    kernels.dedup();
    let listed = if kernels.is_empty() {
        "none".to_string()
    } else {
        kernels.join(", ")
    };
    let mut place = match wanted {
        Some(dir) => format!("the server serving {}", dir.display()),
        None => "this user's servers".to_string(),
    };
    if let Some(tenant) = &args.tenant {
        place = format!("tenant '{tenant}' of {place}");
    }
    format!(
        "no running kernel session named '{}' in {place} (kernel sessions there: {listed}); attach works on kernel sessions only (python_sessions create ... kernel), not on built-in Python or R sessions",
        args.session
    )
}

/// The refusal when `named` (more than one) all fit the arguments.
fn several_named(session: &str, named: &[Entry]) -> String {
    let one_server = named.iter().all(|e| e.server == named[0].server);
    let tenants = named.iter().any(|e| e.tenant.is_some());
    let who = if one_server {
        "several tenants of one server have"
    } else {
        "several servers have"
    };
    let how = if tenants {
        "pass --tenant NAME, or --workdir DIR for one of their workspaces"
    } else {
        "pass --workdir DIR for one of their workspaces"
    };
    let rows: Vec<String> = named
        .iter()
        .map(|e| match &e.tenant {
            Some(t) => format!(
                "  {} (tenant {t}, server pid {})",
                e.workdir.display(),
                e.server
            ),
            None => format!("  {} (server pid {})", e.workdir.display(), e.server),
        })
        .collect();
    format!(
        "{who} a kernel session named '{session}'; {how}:\n{}",
        rows.join("\n")
    )
}

/// Replaces this process with `PROGRAM console --existing FILE`.
fn console(args: &AttachArgs, entry: &Entry) -> ExitCode {
    let program = match find_program(&args.jupyter, &entry.session_writes) {
        Ok(program) => program,
        Err(message) => {
            eprintln!("ferrepl attach: {message}");
            return ExitCode::FAILURE;
        }
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

/// `program` itself when it names a path, else the first on PATH; never
/// one in a place the server's sessions may write (`writes`: the agent
/// could have put a `jupyter` there, and this runs as the operator), nor
/// from a relative or empty PATH entry (the current directory, often the
/// workspace).
fn find_program(program: &Path, writes: &[PathBuf]) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let written = |p: &Path| session_written(p, writes);
    if program.components().count() > 1 {
        let path = std::path::absolute(program).unwrap_or_else(|_| program.to_path_buf());
        if let Some(place) = written(&path) {
            return Err(format!(
                "will not run {}: it lies in {}, which the server's sessions may write; pass --jupyter with a program outside it, or run `jupyter console --existing FILE` yourself with the file --print gives",
                path.display(),
                place.display()
            ));
        }
        return if runnable(&path) {
            Ok(path)
        } else {
            Err(missing(program))
        };
    }
    let mut skipped = Vec::new();
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        if !dir.is_absolute() {
            continue;
        }
        let candidate = dir.join(program);
        if !runnable(&candidate) {
            continue;
        }
        match written(&candidate) {
            Some(_) => skipped.push(candidate),
            None => return Ok(candidate),
        }
    }
    if skipped.is_empty() {
        return Err(missing(program));
    }
    let skipped: Vec<String> = skipped.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "the only '{}' on PATH ({}) lies where the server's sessions may write, so the agent could have written it; pass --jupyter with a program outside those places, or run `jupyter console --existing FILE` yourself with the file --print gives",
        program.display(),
        skipped.join(", ")
    ))
}

fn missing(program: &Path) -> String {
    format!(
        "cannot find '{}'; install Jupyter's console (pip install jupyter-console) or pass --jupyter PROGRAM, or use --print to get the connection file for another client",
        program.display()
    )
}

/// The place of `writes` that holds `path`, as named or with its links
/// followed (a link on PATH may lead into the workspace).
fn session_written<'a>(path: &Path, writes: &'a [PathBuf]) -> Option<&'a PathBuf> {
    let real = std::fs::canonicalize(path).ok();
    writes.iter().find(|place| {
        let place_real = std::fs::canonicalize(place).unwrap_or_else(|_| place.to_path_buf());
        [Some(path), real.as_deref()]
            .into_iter()
            .flatten()
            .any(|p| p.starts_with(place) || p.starts_with(&place_real))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_where_sessions_write_is_never_chosen() {
        let root = tempfile::tempdir().expect("tempdir");
        let ws = root.path().join("ws");
        let tools = root.path().join("tools");
        for dir in [ws.join("bin"), tools.clone()] {
            std::fs::create_dir_all(&dir).expect("mkdir");
            let program = dir.join("jupyter-test-tool");
            std::fs::write(&program, "#!/bin/sh\n").expect("write");
            let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
            std::fs::set_permissions(&program, mode).expect("chmod");
        }
        // A link outside the workspace to a program inside it.
        let linked = root.path().join("linked");
        std::fs::create_dir_all(&linked).expect("mkdir");
        std::os::unix::fs::symlink(
            ws.join("bin/jupyter-test-tool"),
            linked.join("jupyter-test-tool"),
        )
        .expect("ln");
        let writes = [ws.clone()];
        let explicit = find_program(&ws.join("bin/jupyter-test-tool"), &writes);
        assert!(explicit.is_err_and(|e| e.contains("may write")));
        assert!(find_program(&linked.join("jupyter-test-tool"), &writes).is_err());
        assert_eq!(
            find_program(&tools.join("jupyter-test-tool"), &writes).ok(),
            Some(tools.join("jupyter-test-tool"))
        );
        assert!(session_written(&linked.join("jupyter-test-tool"), &writes).is_some());
        assert!(session_written(&tools.join("jupyter-test-tool"), &writes).is_none());
    }
}
