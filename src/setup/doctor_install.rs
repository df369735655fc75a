//! doctor's `install` item: whether python_install would work with these
//! settings: where packages would go, and which installer would run.

use std::path::Path;

use super::doctor::{Item, Status, item, run_confined};
use crate::config::settings::Settings;
use crate::startup::Prepared;
use crate::state::RuntimeDir;
use crate::worker::python::PythonSource;

const PIP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Where installs go and with what, or what stops them.
pub(super) async fn install_item(
    settings: &Settings,
    found: &Path,
    source: PythonSource,
    ready: Option<(&RuntimeDir, &Prepared)>,
) -> Item {
    let user_venv = match source {
        PythonSource::Venv | PythonSource::VenvFlag => true,
        _ => crate::worker::session_venv::in_a_venv(found),
    };
    let kept = settings.stores.dir().map(|dir| dir.join("venvs"));
    let venv = match (kept, user_venv) {
        (Some(dir), true) => format!(
            "a venv ferrepl keeps over the venv of {} (which sessions only read) in {} (made at the first session)",
            found.display(),
            dir.display()
        ),
        (Some(dir), false) => format!(
            "a venv ferrepl keeps for the workspace in {} (made at the first session)",
            dir.display()
        ),
        (None, user_venv) => {
            let what = if user_venv {
                "is the user's venv, which sessions only read"
            } else {
                "is not a venv"
            };
            return item(
                "install",
                Status::Missing,
                format!(
                    "{} {what}, and sessions are not kept (--resume off), so no venv is kept for the workspace: python_install is refused; start ferrepl without --resume off",
                    found.display()
                ),
            );
        }
    };
    if let Some(uv) = crate::worker::python::uv() {
        return item(
            "install",
            Status::Good,
            format!("uv ({}) into {venv}", uv.display()),
        );
    }
    let Some((state, prepared)) = ready else {
        return item(
            "install",
            Status::Warn,
            format!("into {venv}; pip not checked: no sandbox"),
        );
    };
    let args = ["-I", "-c", "import pip; print(pip.__version__)"];
    match run_confined(
        &prepared.sandbox,
        state,
        &prepared.python,
        &args,
        PIP_TIMEOUT,
    )
    .await
    {
        Ok(version) => item(
            "install",
            Status::Good,
            format!("pip {} into {venv}", version.trim()),
        ),
        Err(e) => item(
            "install",
            Status::Missing,
            format!(
                "no installer: uv is not on PATH and {} has no pip ({e}); install uv, or pip for that Python (python3-pip)",
                prepared.python.display()
            ),
        ),
    }
}

/// doctor's `preinstall` item (with --preinstall, --requirements or
/// --preimport): what every new environment gets, and whether the venv
/// kept for the workspace has the packages already (its stamp; with
/// tenants, each tenant's venv is checked at its start).
pub(super) fn preinstall_item(settings: &Settings, prepared: Option<&Prepared>) -> Option<Item> {
    let ready = &settings.ready_made;
    if ready.preinstall.is_empty() && ready.preimport.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    if !ready.preimport.is_empty() {
        parts.push(format!(
            "imports {} in every interpreter before its first cell",
            ready.preimport.join(", ")
        ));
    }
    if ready.preinstall.is_empty() {
        return Some(item("preinstall", Status::Good, parts.join("; ")));
    }
    let specs = ready.preinstall.join(" ");
    let kept = prepared.and_then(|p| p.kept_venvs.as_ref());
    let status = match (prepared, kept) {
        (None, _) => {
            parts.insert(
                0,
                format!("would install {specs}; the kept venv not checked: no sandbox"),
            );
            Status::Warn
        }
        (Some(_), None) => {
            parts.insert(
                0,
                format!(
                    "{specs}: no venv is kept for the workspace (--resume off, or an interpreter sessions can write), so the server refuses to start; drop --resume off"
                ),
            );
            Status::Missing
        }
        (Some(_), Some(kept)) => {
            let dir = kept
                .root
                .join("venvs")
                .join(crate::worker::session_venv::dir_name(
                    &settings.workdir,
                    "local",
                    kept.layer.as_deref(),
                ));
            let has = dir.join("bin/python").is_file()
                && crate::worker::preinstall::is_stamped(&dir, &kept.base, &ready.preinstall);
            parts.insert(
                0,
                if has {
                    format!(
                        "{specs}: already in the kept venv {} (installed at an earlier start; not installed again)",
                        dir.display()
                    )
                } else {
                    format!(
                        "would install {specs} into the kept venv {} in the background at start (the first session waits for it)",
                        dir.display()
                    )
                },
            );
            Status::Good
        }
    };
    Some(item("preinstall", status, parts.join("; ")))
}
