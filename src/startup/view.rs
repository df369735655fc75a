//! Start-up decisions about the sandbox's view beyond the system
//! allow-list: which PATH entries and R directories it shows, and where
//! ferrepl's own files (tokens, runtime state, stores) stand against it:
//! refused inside anything sessions can write or read, under any alias.

use std::path::{Path, PathBuf};

use crate::config::settings::Settings;
use crate::sandbox::paths::Writable;
use crate::sandbox::view::View;
use crate::{sandbox, state, worker};

/// A file or directory ferrepl reads or writes for itself.
#[derive(Debug, Clone)]
pub struct OwnFile {
    /// What names it, for messages.
    pub flag: &'static str,
    /// As given.
    pub path: PathBuf,
    /// Resolved.
    pub real: PathBuf,
}

fn real(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// The tokens files (the server's, the viewer's), the MCP servers file,
/// the runtime state (logs, policies, homes, the egress socket) and the
/// stores.
pub fn own_files(
    settings: &Settings,
    state_dir: &state::RuntimeDir,
    kept_in: Option<&Path>,
) -> Vec<OwnFile> {
    let mut files = Vec::new();
    let mut add = |flag, path: &Path| {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        files.push(OwnFile {
            flag,
            real: real(&path),
            path,
        })
    };
    if let Some(tokens) = &settings.own_files.auth_token_file {
        add("--auth-token-file", tokens);
    }
    if let Some(servers) = &settings.own_files.mcp_servers {
        add("--mcp-servers", servers);
    }
    if let Some(views) = settings
        .viewer
        .tokens
        .as_ref()
        .filter(|_| settings.viewer.addr.is_some())
    {
        add("--viewer-tokens", views);
    }
    add(
        "ferrepl's runtime directory (in XDG_RUNTIME_DIR or TMPDIR)",
        state_dir.root(),
    );
    if let Some(stores) = kept_in {
        add(
            "the stores (--state-dir, default ~/.local/state/ferrepl; --resume off keeps none)",
            stores,
        );
    }
    files
}

/// Refuses a file of ferrepl's inside a place sessions can write (the
/// workspace, --allow-write, venvs: they could also swap it for a symlink),
/// as given or resolved, or inside an --allow-read path.
pub fn check_own_files(
    files: &[OwnFile],
    writable: &Writable,
    allow_read: &[PathBuf],
) -> anyhow::Result<()> {
    for file in files {
        let place = writable
            .0
            .iter()
            .chain(allow_read)
            .find(|w| Writable(vec![w.to_path_buf()]).contains(&file.path));
        if let Some(place) = place {
            anyhow::bail!(
                "{} {} lies inside {}, which sessions can read; keep ferrepl's own files outside the workspace and the --allow-read/--allow-write/--venv paths",
                file.flag,
                file.path.display(),
                place.display()
            );
        }
    }
    Ok(())
}

/// Refuses an --allow-read/--allow-write path that holds a private place
/// (a home, `/tmp`, `/run`: other programs' files and sockets, another
/// ferrepl's runtime directory): name narrower paths.
pub fn check_allow_paths(
    settings: &Settings,
    workdir: &Path,
    private: &[PathBuf],
) -> anyhow::Result<()> {
    for p in settings
        .sandbox
        .allow_read
        .iter()
        .chain(&settings.sandbox.allow_write)
    {
        let p = sandbox::paths::normalize(p, workdir);
        let p_real = real(&p);
        if let Some(h) = private
            .iter()
            .find(|h| h.starts_with(&p) || h.starts_with(&p_real))
        {
            anyhow::bail!(
                "--allow-read/--allow-write {} holds {}, a private place (a home, a temporary or runtime directory, ferrepl's state) sessions must not see; name narrower paths",
                p.display(),
                h.display()
            );
        }
    }
    Ok(())
}

/// Refuses a path the view binds that sessions could steer: one inside
/// another place they can write, or reached through a directory that
/// resolves into one (they could swap it, or a symlink on its way, before
/// the next process is launched: binds are resolved at every launch).
pub fn check_nesting(binds: &[PathBuf], writable: &Writable) -> anyhow::Result<()> {
    let places: Vec<(&PathBuf, PathBuf)> = writable.0.iter().map(|w| (w, real(w))).collect();
    for bind in binds {
        let steered = bind.ancestors().find_map(|a| {
            let a_real = real(a);
            places.iter().find_map(|(w, w_real)| {
                let within = a.starts_with(w) || a_real.starts_with(w_real);
                // The bind may be a writable place itself (a venv).
                let itself = a == bind && (a == *w || a_real == *w_real);
                (within && !itself).then_some(*w)
            })
        });
        if let Some(w) = steered {
            anyhow::bail!(
                "{} lies in or is reached through {}, which sessions can write (and could swap for a symlink); give paths outside the workspace, --allow-write and venv paths",
                bind.display(),
                w.display()
            );
        }
    }
    Ok(())
}

/// Where ferrepl's own files lie inside a bound path: under the path as
/// bound and under its resolved form.
fn inside_binds(file: &OwnFile, binds: &[PathBuf]) -> Option<PathBuf> {
    binds.iter().find_map(|bind| {
        let bind_real = real(bind);
        [
            (&bind_real, &file.real),
            (bind, &file.real),
            (bind, &file.path),
        ]
        .into_iter()
        .any(|(base, of)| of.starts_with(base))
        .then(|| bind.clone())
    })
}

/// Refuses a file of ferrepl's inside any bound path (a cover could not
/// keep it: Landlock cannot carve a hole, and a mount over one name is
/// undone when the host renames a new file over it).
pub fn refuse_bound(files: &[OwnFile], binds: &[PathBuf]) -> anyhow::Result<()> {
    for file in files {
        if let Some(place) = inside_binds(file, binds) {
            anyhow::bail!(
                "{} {} lies inside {}, which sessions can read; move it outside the paths sessions see (docs/security.md lists them)",
                file.flag,
                file.path.display(),
                place.display()
            );
        }
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
pub fn bound_paths(cfg: &sandbox::SandboxConfig) -> Vec<PathBuf> {
    cfg.view
        .binds
        .iter()
        .chain(&cfg.read)
        .chain(&cfg.write)
        .chain(&cfg.installer_read)
        .chain(std::iter::once(&cfg.workspace))
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

    fn own(flag: &'static str, path: &Path) -> OwnFile {
        OwnFile {
            flag,
            path: path.to_path_buf(),
            real: real(path),
        }
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
        let writable = Writable(vec![ws.clone()]);
        let err = check_own_files(
            &[own("--auth-token-file", &ws.join("tokens"))],
            &writable,
            &[],
        )
        .expect_err("a tokens file through the workspace");
        assert!(err.to_string().contains("--auth-token-file"), "{err}");
        let tokens = own("--auth-token-file", &tools.join("etc/tokens"));
        check_own_files(std::slice::from_ref(&tokens), &writable, &[]).expect("outside");
        assert!(
            check_own_files(
                std::slice::from_ref(&tokens),
                &Writable(vec![]),
                std::slice::from_ref(&tools)
            )
            .is_err()
        );

        let alias = base.join("alias");
        std::os::unix::fs::symlink(&tools, &alias).expect("ln");
        for bind in [&alias, &tools] {
            let err = refuse_bound(std::slice::from_ref(&tokens), std::slice::from_ref(bind))
                .expect_err("inside a bound path, under any alias");
            assert!(err.to_string().contains("which sessions can read"), "{err}");
        }
        refuse_bound(std::slice::from_ref(&tokens), &[base.join("ws")]).expect("elsewhere");
    }

    #[test]
    fn a_bind_inside_a_writable_place_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let w = root.path().join("w");
        let writable = Writable(vec![w.clone()]);
        assert!(check_nesting(&[w.join("venv")], &writable).is_err());
        check_nesting(&[w.clone(), root.path().join("other")], &writable)
            .expect("itself and outside");
        // Reached through a symlink that resolves into the writable place.
        std::fs::create_dir_all(w.join("d")).expect("mkdir");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(w.join("d"), &link).expect("ln");
        assert!(check_nesting(&[link.join("sub")], &writable).is_err());
        assert!(check_nesting(std::slice::from_ref(&link), &writable).is_err());
    }
}
