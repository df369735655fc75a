//! The map of places (`sandbox::places`) as the operator's settings name
//! it, before anything is discovered: the workspace, what sessions may
//! write (--allow-write, --venv, venvs in --allow-python) and read
//! (--allow-read); then ferrepl's own files and the private places, once
//! the runtime directory and the stores are known. Start-up adds what it
//! discovers (venvs, the kept venvs); every refusal about a path asks it.

use std::path::Path;

use crate::config::settings::Settings;
use crate::sandbox::places::{ALLOW_READ, ALLOW_WRITE, Places};
use crate::state;

/// What the flags name, from the settings alone (preflight's refusals,
/// doctor, a SIGHUP's check of the servers file).
pub fn named(settings: &Settings) -> Places {
    let workdir = &settings.workdir;
    let mut places = Places::new(workdir);
    for path in &settings.sandbox.allow_write {
        places.add_writable(ALLOW_WRITE, path);
    }
    if let Some(venv) = &settings.interpreters.venv {
        // Read, never written, by sessions; but made by them before (or
        // by the agent's tools): nothing there is trusted.
        places.add_untrusted("--venv", venv);
    }
    for path in &settings.interpreters.allow_python {
        let abs = crate::sandbox::paths::normalize(path, workdir);
        if abs.join("pyvenv.cfg").is_file() {
            places.add_untrusted("a venv in --allow-python", &abs);
        }
    }
    for path in &settings.sandbox.allow_read {
        places.add_readable(ALLOW_READ, path);
    }
    places
}

/// Adds ferrepl's own files (the tokens files, the MCP servers file, the
/// runtime directory, the stores) and the private places no session may
/// see (homes, the host's temporary and runtime directories, container
/// engines' state, the runtime directories, the stores).
pub fn add_own_and_hidden(
    places: &mut Places,
    settings: &Settings,
    runtime: &state::RuntimeDir,
    stores: Option<&Path>,
) {
    // Read from the server's current directory, as named.
    let read_at = |p: &std::path::PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
    if let Some(tokens) = &settings.own_files.auth_token_file {
        places.add_own("--auth-token-file", &read_at(tokens));
    }
    if let Some(servers) = &settings.own_files.mcp_servers {
        places.add_own("--mcp-servers", &read_at(servers));
    }
    if let Some(views) = &settings.own_files.viewer_tokens {
        places.add_own("--viewer-tokens", &read_at(views));
    }
    places.add_own(
        "ferrepl's runtime directory (in XDG_RUNTIME_DIR or TMPDIR)",
        runtime.root(),
    );
    if let Some(stores) = stores {
        places.add_own(
            "the stores (--state-dir, default ~/.local/state/ferrepl; --resume off keeps none)",
            stores,
        );
    }
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .filter(|h| h.is_absolute() && h != Path::new("/"));
    for hidden in crate::sandbox::paths::hidden_places(home.as_deref(), runtime.root()) {
        places.add_hidden(&hidden);
    }
}
