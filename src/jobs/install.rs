//! The install job: a venv check, then uv (when on PATH) or pip with the
//! operator's index, flags and environment (`installer.rs`), wheels only
//! unless source builds are allowed. One command for python_install and
//! the preinstall of `--preinstall`, so both go through the same proxy and
//! rules. It never decides what is installed: the caller checked the specs.

use std::path::Path;

use super::JobSpec;
use crate::installer::InstallerSettings;

/// `s` quoted for `/bin/sh`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Run first in the install job, inside the sandbox like the install itself
/// (the interpreter may be any file the agent wrote): refuses interpreters
/// that are not a virtual environment, and venvs sessions only read (the
/// user's, an operator's `--allow-python` one: a `.pth` written there would
/// run on the host), each saying what to do instead. Whether the venv can be
/// written is tried, not judged: a file made and removed in site-packages.
const VENV_CHECK: &str = r#"import sys, os, errno, sysconfig, tempfile
own = "run python3 -m venv env in the workspace and python_sessions {action: create, session: ..., venv: env}"
if sys.prefix == sys.base_prefix:
    managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
    sys.exit("ferrepl: " + sys.executable + (" is externally managed (PEP 668)" if managed else " is not a virtual environment")
             + "; ferrepl installs only into venvs: " + own + " (or restart ferrepl without --resume off: it then keeps a venv for the workspace)")
try:
    fd, probe = tempfile.mkstemp(dir=sysconfig.get_path("purelib"))
    os.close(fd)
    os.unlink(probe)
except OSError as e:
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        sys.exit("ferrepl: " + sys.prefix + " is read-only to sessions (" + e.strerror + "): a user's venv is never written from the sandbox, "
                 + "since a .pth there would run on the host; python_install installs into the venv ferrepl keeps over it, which needs sessions kept "
                 + "(ferrepl started without --resume off); or " + own)
"#;

/// Installs `packages` into the venv of `python`: the venv check, then the
/// installer. `shown`: the packages as the caller named them (a local
/// wheel's copy is what the installer gets).
pub fn install_spec(
    settings: &InstallerSettings,
    python: &Path,
    packages: &[String],
    shown: &[String],
    upgrade: bool,
) -> JobSpec {
    let python = shell_quote(&python.display().to_string());
    let upgrade = if upgrade { " --upgrade" } else { "" };
    let quoted = |items: &[String]| {
        items
            .iter()
            .map(|s| shell_quote(s))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (head, flags) = match crate::worker::python::uv() {
        Some(uv) => (
            format!(
                "{} pip install --python {python}{upgrade}",
                shell_quote(&uv.display().to_string())
            ),
            quoted(&settings.uv_flags()),
        ),
        None => (
            format!("{python} -m pip install{upgrade}"),
            quoted(&settings.pip_flags()),
        ),
    };
    let check = format!("{python} -I -c {} && ", shell_quote(VENV_CHECK));
    JobSpec {
        shown: Some(format!("{head} {}", quoted(shown))),
        command: format!("{check}{head} {flags} {}", quoted(packages)),
        env: settings.env().into_iter().collect(),
        egress: true,
        reader: Some("python_output {job}"),
        ..JobSpec::default()
    }
}
