//! Start-up decisions about the sandbox's view beyond the system
//! allow-list: which PATH entries and R directories it shows, and the
//! refusals of the map of places (`sandbox::places`) about it: ferrepl's
//! own files (tokens, runtime state, stores) inside anything sessions can
//! write or read, under any alias; allowed paths holding private places;
//! binds sessions could steer.

use std::path::{Path, PathBuf};

use crate::config::settings::Settings;
use crate::sandbox::paths::Writable;
use crate::sandbox::places::Places;
use crate::sandbox::view::View;
use crate::{sandbox, worker};

/// Refuses a file of ferrepl's inside a place sessions can write (the
/// workspace, --allow-write, venvs: they could also swap it for a symlink),
/// as given or resolved, or inside an --allow-read path.
pub fn check_own_files(places: &Places) -> anyhow::Result<()> {
    if let Some((file, place)) = places.own_file_reached() {
        anyhow::bail!(
            "{} {} lies inside {}, which sessions can read; keep ferrepl's own files outside the workspace and the --allow-read/--allow-write/--venv paths",
            file.what,
            file.at.given.display(),
            place.at.given.display()
        );
    }
    Ok(())
}

/// Refuses an --allow-read/--allow-write path that holds a private place
/// (a home, `/tmp`, `/run`: other programs' files and sockets, another
/// ferrepl's runtime directory): name narrower paths.
pub fn check_allow_paths(places: &Places) -> anyhow::Result<()> {
    for place in places.allowed() {
        if let Some(h) = places.hidden_held_by(&place.at.given) {
            anyhow::bail!(
                "--allow-read/--allow-write {} holds {}, a private place (a home, a temporary or runtime directory, ferrepl's state) sessions must not see; name narrower paths",
                place.at.given.display(),
                h.real.display()
            );
        }
    }
    Ok(())
}

/// Refuses a path the view binds that sessions could steer: one inside
/// another place they can write, or reached through a directory that
/// resolves into one (they could swap it, or a symlink on its way, before
/// the next process is launched: binds are resolved at every launch).
pub fn check_nesting(places: &Places, binds: &[PathBuf]) -> anyhow::Result<()> {
    if let Some((bind, w)) = places.steered_bind(binds) {
        anyhow::bail!(
            "{} lies in or is reached through {}, which sessions can write (and could swap for a symlink); give paths outside the workspace, --allow-write and venv paths",
            bind.display(),
            w.at.given.display()
        );
    }
    Ok(())
}

/// Refuses a file of ferrepl's inside any bound path (a cover could not
/// keep it: Landlock cannot carve a hole, and a mount over one name is
/// undone when the host renames a new file over it).
pub fn refuse_bound(places: &Places, binds: &[PathBuf]) -> anyhow::Result<()> {
    if let Some((file, place)) = places.own_file_bound(binds) {
        anyhow::bail!(
            "{} {} lies inside {}, which sessions can read; move it outside the paths sessions see (docs/security.md lists them)",
            file.what,
            file.at.given.display(),
            place.display()
        );
    }
    Ok(())
}

/// The operator's PATH entries sessions may run from: absolute directories
/// outside the view's system part, the private places and what sessions
/// can write, as resolved (a symlinked entry would show its tree twice);
/// an entry's prefix when it is a `bin` directory (its libraries lie
/// beside it). Never a directory right under `/` (`/opt/bin` shows itself,
/// not `/opt`; an `/etc` entry shows nothing), nor one that holds a private
/// place: that would show a whole system tree.
pub fn path_entries(
    path: &std::ffi::OsStr,
    view: &View,
    hidden: &[PathBuf],
    writable: &Writable,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let deep = |p: &Path| p.components().count() > 2;
    let private = |p: &Path| hidden.iter().any(|h| p.starts_with(h) || h.starts_with(p));
    for entry in std::env::split_paths(path) {
        let Ok(real) = entry.canonicalize() else {
            continue;
        };
        if !entry.is_absolute() || !real.is_dir() || writable.contains(&entry) || private(&entry) {
            continue;
        }
        let dir = match (real.file_name().and_then(|n| n.to_str()), real.parent()) {
            (Some("bin" | "sbin"), Some(prefix)) if deep(prefix) && !private(prefix) => {
                prefix.to_path_buf()
            }
            _ => real,
        };
        if deep(&dir) && !private(&dir) && !view.shows(&dir) && !out.contains(&dir) {
            out.push(dir);
        }
    }
    out
}

/// R's installation: the prefix of the real `R` (its R_HOME lies there) and
/// R_HOME itself, unless sessions can write them.
pub fn r_dirs(settings: &Settings, writable: &Writable) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(real) =
        worker::r::resolve(settings.interpreters.r.as_deref()).and_then(|r| r.canonicalize().ok())
        && let Some(prefix) = real.parent().and_then(Path::parent)
    {
        out.push(prefix.to_path_buf());
    }
    if let Some(home) = std::env::var_os("R_HOME").map(PathBuf::from)
        && let Ok(home) = home.canonicalize()
    {
        out.push(home);
    }
    out.retain(|d| d != Path::new("/") && !writable.contains(d));
    out
}

/// The paths a process's view binds besides its own temporary directory:
/// the system part, the operator's read and write paths, installers' CA
/// bundle, the workspace.
pub fn bound_paths(sandbox_cfg: &sandbox::SandboxConfig) -> Vec<PathBuf> {
    sandbox_cfg
        .view
        .binds
        .iter()
        .chain(&sandbox_cfg.read)
        .chain(&sandbox_cfg.write)
        .chain(&sandbox_cfg.installer_read)
        .chain(std::iter::once(&sandbox_cfg.workspace))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_entries_show_tool_prefixes_never_a_whole_system_tree() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = root.path().canonicalize().expect("canonical");
        let tool_bin = base.join("opt/tool/bin");
        let home_bin = base.join("home/u/.local/bin");
        let ws_bin = base.join("ws/.venv/bin");
        let lib_bin = base.join("var/lib/bin");
        for d in [
            &tool_bin,
            &home_bin,
            &ws_bin,
            &lib_bin,
            &base.join("var/lib/docker"),
        ] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let link = base.join("link");
        std::os::unix::fs::symlink(base.join("opt/tool"), &link).expect("symlink");
        let path = std::env::join_paths([
            tool_bin.as_path(),
            link.join("bin").as_path(),
            home_bin.as_path(),
            ws_bin.as_path(),
            lib_bin.as_path(),
            Path::new("/etc"),
            Path::new("/"),
            Path::new("relative/bin"),
        ])
        .expect("join");
        let hidden = vec![base.join("home"), base.join("var/lib/docker")];
        let writable = Writable(vec![base.join("ws")]);
        let shown = path_entries(&path, &View::default(), &hidden, &writable);
        assert_eq!(shown, vec![base.join("opt/tool"), lib_bin]);
    }

    #[test]
    fn own_files_are_refused_where_sessions_write_or_read_under_every_alias() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = root.path().canonicalize().expect("canonical");
        let (ws, tools) = (base.join("ws"), base.join("tools"));
        std::fs::create_dir_all(tools.join("etc")).expect("mkdir");
        std::fs::create_dir_all(&ws).expect("mkdir");
        std::fs::write(tools.join("etc/tokens"), "t x\n").expect("write");
        // A tokens file reached through a symlink in the workspace.
        std::os::unix::fs::symlink(tools.join("etc/tokens"), ws.join("tokens")).expect("ln");
        let mut through_ws = Places::new(&ws);
        through_ws.add_own("--auth-token-file", &ws.join("tokens"));
        let err = check_own_files(&through_ws).expect_err("a tokens file through the workspace");
        assert!(err.to_string().contains("--auth-token-file"), "{err}");
        let mut outside = Places::new(&ws);
        outside.add_own("--auth-token-file", &tools.join("etc/tokens"));
        check_own_files(&outside).expect("outside");
        let mut read = outside.clone();
        read.add_readable("--allow-read", &tools);
        assert!(check_own_files(&read).is_err());

        let alias = base.join("alias");
        std::os::unix::fs::symlink(&tools, &alias).expect("ln");
        for bind in [&alias, &tools] {
            let err = refuse_bound(&outside, std::slice::from_ref(bind))
                .expect_err("inside a bound path, under any alias");
            assert!(err.to_string().contains("which sessions can read"), "{err}");
        }
        refuse_bound(&outside, &[base.join("ws")]).expect("elsewhere");
    }

    #[test]
    fn a_bind_inside_a_writable_place_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let w = root.path().join("w");
        let places = Places::new(&w);
        assert!(check_nesting(&places, &[w.join("venv")]).is_err());
        check_nesting(&places, &[w.clone(), root.path().join("other")])
            .expect("itself and outside");
        // Reached through a symlink that resolves into the writable place.
        std::fs::create_dir_all(w.join("d")).expect("mkdir");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(w.join("d"), &link).expect("ln");
        assert!(check_nesting(&places, &[link.join("sub")]).is_err());
        assert!(check_nesting(&places, std::slice::from_ref(&link)).is_err());
    }
}
