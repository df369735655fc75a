//! Doctor's `clients` item: which agent clients name ferrepl in their
//! configuration (user level, and project level in the workspace), and
//! whether each will start it there (approval.rs).

use std::path::{Path, PathBuf};

use super::doctor::Status::{Good, Warn};
use super::doctor::{Item, item};
use super::{approval, clients, install};

const NO_CLIENT: &str = "none — run `ferrepl install --client claude-code` (or codex, cursor, vscode, gemini, claude-desktop)";

/// Which agent clients name ferrepl in their configuration (user level,
/// and project level in the workspace): the files `ferrepl install` writes,
/// and whether the client will start it there: a project's Claude Code
/// server approved, Gemini CLI's trust of the workspace, Codex's of the
/// project (approval.rs). Any step left makes it a warning.
pub(super) fn configured_clients(workdir: &Path) -> Item {
    let platform = match clients::Platform::current() {
        Ok(p) => p,
        Err(e) => return item("clients", Warn, format!("cannot tell: {e}")),
    };
    let (mut found, mut seen, mut waiting) = (Vec::new(), Vec::<PathBuf>::new(), false);
    for client in clients::Client::ALL {
        for scope in [clients::Scope::User, clients::Scope::Project] {
            let Ok(target) = clients::target(client, scope, &platform, workdir) else {
                continue;
            };
            if seen.contains(&target.path) {
                continue;
            }
            let text = approval::read_capped(&target.path);
            let named = match text.as_ref().map(|t| t.as_deref()) {
                Ok(None) => false,
                Ok(Some(t)) => match install::has_entry(t, target.format) {
                    Ok(named) => named,
                    // Said only when it may hold ferrepl's entry.
                    Err(why) if t.contains(install::NAME) => {
                        let shown = target.path.display();
                        found.push(format!("{} ({shown}): {why}", client.name()));
                        waiting = true;
                        false
                    }
                    Err(_) => false,
                },
                Err(e) => {
                    found.push(format!("{}: {e}", client.name()));
                    waiting = true;
                    false
                }
            };
            if named {
                let mut line = format!("{} ({}", client.name(), target.path.display());
                match approval::check(client, scope, &platform, workdir) {
                    Some(f) if f.blocking() => {
                        waiting = true;
                        line.push_str(&format!("): ferrepl is set up but {}", f.what));
                        if let Some(step) = &f.step {
                            line.push_str(&format!(": {step}"));
                        }
                    }
                    Some(f) => line.push_str(&format!(", {})", f.what)),
                    None => line.push(')'),
                }
                found.push(line);
            }
            seen.push(target.path);
        }
    }
    match (found.is_empty(), waiting) {
        (true, _) => item("clients", Warn, NO_CLIENT),
        (false, false) => item("clients", Good, found.join("; ")),
        (false, true) => item("clients", Warn, found.join("; ")),
    }
}
