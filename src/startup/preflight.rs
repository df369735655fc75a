//! Refusals decided from the flags alone, before anything is started (no
//! state directory, store, venv, session, listener or egress proxy): an
//! operator with a typo learns it at once, with the fix in the message,
//! not after a full start-up or on the first call.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::config::settings::Settings;
use crate::config::tokens::TokenTable;

/// Every check of the flags that needs nothing but the flags, the tokens
/// and the (canonical) workspace.
pub fn check(settings: &Settings, tokens: &TokenTable) -> anyhow::Result<()> {
    check_serving(settings, tokens)?;
    if let Some(python) = &settings.interpreters.python {
        named_python(python)?;
    }
    Ok(())
}

/// The checks but the interpreter's (which `doctor` reports on its own):
/// tenants need HTTP, HTTP off loopback needs a token, `--venv` must be a
/// venv or a place to make one, the workspace is no home directory.
pub fn check_serving(settings: &Settings, tokens: &TokenTable) -> anyhow::Result<()> {
    let workdir = settings.workdir.as_path();
    home_workspace(settings, workdir)?;
    if tokens.has_tenants() && settings.serving.http.is_none() {
        anyhow::bail!(
            "--auth-token-file names tenants, which only HTTP serves; add --http ADDR, or give one bare token"
        );
    }
    if let Some(addr) = settings.serving.http {
        exposure(addr, !tokens.is_empty())?;
    }
    if let Some(venv) = &settings.interpreters.venv {
        crate::worker::python::check_venv_dir(&crate::sandbox::paths::normalize(venv, workdir))?;
    }
    mcp_servers_place(settings)?;
    viewer_tokens_place(settings)?;
    if let Some(file) = &settings.own_files.mcp_servers {
        crate::upstream::UpstreamConfig::read(file)
            .map_err(|e| anyhow::anyhow!("--mcp-servers {e}"))?;
    }
    Ok(())
}

/// Most bytes of /etc/passwd read (a file larger than this is read in part).
const PASSWD_CAP: u64 = 16 << 20;

/// A workspace that is a home directory (the server user's, from the
/// password database whatever `$HOME` says, or any account's in
/// /etc/passwd) would give sessions the start-up files of its shells and
/// ssh, which no list of protected names can cover; refused unless the
/// sandbox is off (then sessions reach everything anyway). Only an exact
/// match counts (after resolving links): a home of `/` (system accounts)
/// or one that does not exist refuses nothing.
pub fn home_workspace(settings: &Settings, workdir: &Path) -> anyhow::Result<()> {
    if settings.sandbox.mode == crate::sandbox::SandboxMode::Off {
        return Ok(());
    }
    // Not `$HOME`, which a caller sets as it likes (to a scratch
    // directory, a state place): the accounts' own homes.
    let mut homes = own_homes();
    let mut passwd = String::new();
    if let Ok(file) = std::fs::File::open("/etc/passwd") {
        let mut bytes = Vec::new();
        let _ = file.take(PASSWD_CAP).read_to_end(&mut bytes);
        passwd = String::from_utf8_lossy(&bytes).into_owned();
    }
    homes.extend(passwd_homes(&passwd));
    let workdir = workdir
        .canonicalize()
        .unwrap_or_else(|_| workdir.to_path_buf());
    let is_home = homes
        .iter()
        .filter(|h| h.is_absolute())
        .filter_map(|h| h.canonicalize().ok())
        .any(|h| h != Path::new("/") && h == workdir);
    if !is_home {
        return Ok(());
    }
    let what = if settings.sandbox.mode == crate::sandbox::SandboxMode::ReadOnly {
        "its private files (.ssh keys, shell history, tokens in dotfiles) would be readable by sessions and cannot all be listed"
    } else {
        "its shell and ssh start-up files (.bashrc, .profile, .ssh/...) would be writable by sessions and cannot all be listed"
    };
    anyhow::bail!(
        "--workdir {} is a home directory: {what}; give a project directory inside it instead (e.g. --workdir {})",
        workdir.display(),
        workdir.join("project").display()
    )
}

/// The home directories of the server's user (effective and real uid), from
/// the password database (NSS: also accounts not in /etc/passwd).
fn own_homes() -> Vec<PathBuf> {
    use nix::unistd::{User, geteuid, getuid};
    [geteuid(), getuid()]
        .into_iter()
        .filter_map(|uid| User::from_uid(uid).ok().flatten())
        .map(|user| user.dir)
        .collect()
}

/// The home directory of each account in the text of /etc/passwd (the
/// sixth of its colon-separated fields); comments, NIS `+`/`-` lines and
/// lines too short are skipped.
pub fn passwd_homes(text: &str) -> Vec<PathBuf> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', '+', '-']))
        .filter_map(|l| l.split(':').nth(5))
        .filter(|home| home.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// The state directory (the stores, the tenants' uids, the kept venvs) lies
/// outside everything sessions write or read: the workspace (so also a
/// workspace holding it, `--workdir ~`), `--allow-write`, `--allow-read`,
/// `--venv`. Judged with links resolved, before anything is created there.
pub fn state_dir_place(settings: &Settings) -> anyhow::Result<()> {
    let Some(dir) = settings.stores.dir() else {
        return Ok(());
    };
    if let Some((what, place)) = reachable_by_sessions(settings, dir, false) {
        anyhow::bail!(
            "the state directory {} (the stores, --state-dir, default ~/.local/state/ferrepl) lies inside {what} {}, which sessions can reach; keep ferrepl's own files outside the workspace: pass --state-dir elsewhere (or --resume off), or choose another --workdir",
            dir.display(),
            place.display()
        );
    }
    Ok(())
}

/// The `--mcp-servers` file holds the upstreams' tokens: it must lie where
/// no session can read it.
pub fn mcp_servers_place(settings: &Settings) -> anyhow::Result<()> {
    let Some(file) = &settings.own_files.mcp_servers else {
        return Ok(());
    };
    if let Some((what, place)) = reachable_by_sessions(settings, file, true) {
        anyhow::bail!(
            "--mcp-servers {} lies inside {what} {}, which sessions can read, and it may hold the servers' tokens: move it elsewhere (e.g. /etc/ferrepl or ~/.config/ferrepl)",
            file.display(),
            place.display()
        );
    }
    Ok(())
}

/// The `--viewer-tokens` file logs a browser in to a tenant's sessions: no
/// session may read it (another tenant's agent would read its way in).
pub fn viewer_tokens_place(settings: &Settings) -> anyhow::Result<()> {
    let Some(file) = settings
        .viewer
        .tokens
        .as_ref()
        .filter(|_| settings.viewer.addr.is_some())
    else {
        return Ok(());
    };
    if let Some((what, place)) = reachable_by_sessions(settings, file, true) {
        anyhow::bail!(
            "--viewer-tokens {} lies inside {what} {}, which sessions can read: move it elsewhere (e.g. /etc/ferrepl or ~/.config/ferrepl)",
            file.display(),
            place.display()
        );
    }
    Ok(())
}

/// The place sessions can see that holds `path` (links resolved): one the
/// map of places names (the workspace, --allow-write, --venv, venvs in
/// --allow-python, --allow-read), and with `system` the system directories
/// every session's view has.
fn reachable_by_sessions(
    settings: &Settings,
    path: &Path,
    system: bool,
) -> Option<(&'static str, std::path::PathBuf)> {
    let places = super::places::named(settings);
    if let Some(place) = places.reachable_holding(path) {
        return Some((place.what, place.at.real.clone()));
    }
    let at = crate::sandbox::places::resolve(path, &settings.workdir);
    crate::sandbox::view::SYSTEM_DIRS
        .iter()
        .filter(|_| system)
        .map(|d| crate::sandbox::places::resolve(Path::new(d), Path::new("/")))
        .find(|dir| at.within(dir))
        .map(|dir| ("a system directory", dir.real))
}

/// A non-loopback `--http` without a token would let anyone on the network
/// run code.
pub fn exposure(addr: SocketAddr, has_token: bool) -> anyhow::Result<()> {
    if !addr.ip().is_loopback() && !has_token {
        anyhow::bail!(
            "--http {addr} is not a loopback address: anyone on the network could run code. Pass --auth-token-file FILE (or FERREPL_AUTH_TOKEN), or bind 127.0.0.1"
        );
    }
    Ok(())
}

/// The interpreter named with `--python` (or FERREPL_PYTHON) exists and can
/// be run: a bare name is looked up on PATH, a path from the current
/// directory (as the server runs it).
pub fn named_python(python: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let shown = python.display();
    let fix = "give the path of a Python 3 interpreter (e.g. --python /usr/bin/python3), or leave out --python and FERREPL_PYTHON to use the nearest .venv or python3 on PATH";
    if python.components().count() == 1 {
        let found = python
            .to_str()
            .and_then(crate::worker::python::find_on_path);
        return match found {
            Some(_) => Ok(()),
            None => anyhow::bail!("--python {shown}: no such program on PATH; {fix}"),
        };
    }
    match std::fs::metadata(python) {
        Err(_) => anyhow::bail!("--python {shown} does not exist; {fix}"),
        Ok(m) if m.is_dir() => anyhow::bail!(
            "--python {shown} is a directory, not an interpreter; name the program in it (e.g. --python {}), or {fix}",
            python.join("bin").join("python3").display()
        ),
        Ok(m) if !m.is_file() || m.permissions().mode() & 0o111 == 0 => {
            anyhow::bail!("--python {shown} is not an executable file; {fix}")
        }
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interpreter_is_refused_with_the_fix() {
        let err = named_python(Path::new("/nonexistent/python")).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("--python /nonexistent/python"), "{text}");
        assert!(text.contains("does not exist"), "{text}");
        assert!(text.contains("python3 on PATH"), "{text}");
        let err = named_python(Path::new("no-such-python-ferrepl")).unwrap_err();
        assert!(format!("{err:#}").contains("no such program on PATH"));
    }

    #[test]
    fn a_directory_or_a_plain_file_is_not_an_interpreter() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = named_python(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("is a directory"), "{err:#}");
        let file = dir.path().join("python");
        std::fs::write(&file, "").expect("write");
        let err = named_python(&file).unwrap_err();
        assert!(format!("{err:#}").contains("not an executable"), "{err:#}");
    }

    #[test]
    fn homes_are_read_from_passwd_text() {
        let text = "root:x:0:0:root:/root:/bin/bash\n\
# a comment:x:1:1::/commented:/bin/sh\n\
\n\
sys:x:3:3:sys:/dev:/usr/sbin/nologin\n\
systemd-network:x:998:998:systemd Network Management:/:/usr/sbin/nologin\n\
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
u:x:1000:1000:A User,,,:/home/u:/bin/bash\r\n\
short:x:5\n\
+nisuser::::::\n\
odd:x:7:7::relative/home:/bin/sh\n";
        let homes = passwd_homes(text);
        let want: Vec<PathBuf> = ["/root", "/dev", "/", "/nonexistent", "/home/u"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(homes, want);
    }

    #[test]
    fn only_an_exact_home_is_refused_and_never_slash() {
        use clap::Parser;
        let home = own_homes()
            .into_iter()
            .find(|h| h.canonicalize().is_ok_and(|c| c != Path::new("/")));
        let settings_of = |args: &[&str]| {
            let flags = crate::config::Flags::parse_from(args);
            Settings::from_flags(&flags).expect("settings")
        };
        let cfg = settings_of(&["ferrepl"]);
        if let Some(home) = home {
            let err = format!("{:#}", home_workspace(&cfg, &home).unwrap_err());
            assert!(err.contains("is a home directory"), "{err}");
            assert!(err.contains("give a project directory inside it"), "{err}");
            let off = settings_of(&["ferrepl", "--sandbox", "off"]);
            assert!(home_workspace(&off, &home).is_ok());
        }
        // `/` is the home of some system accounts: it refuses no workspace
        // (nor itself: other checks refuse `/`); nor does a directory
        // inside a home.
        assert!(home_workspace(&cfg, Path::new("/")).is_ok());
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(home_workspace(&cfg, dir.path()).is_ok());
    }

    #[test]
    fn only_a_loopback_address_may_go_without_a_token() {
        let open: SocketAddr = "0.0.0.0:8000".parse().expect("addr");
        let local: SocketAddr = "127.0.0.1:8000".parse().expect("addr");
        assert!(exposure(local, false).is_ok());
        assert!(exposure(open, true).is_ok());
        let err = format!("{:#}", exposure(open, false).unwrap_err());
        assert!(err.contains("--auth-token-file"), "{err}");
    }
}
