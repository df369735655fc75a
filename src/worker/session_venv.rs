//! The venv ferrepl keeps for a workspace whose interpreter is not one, so
//! that installs work on first use. It lives outside the workspace, in the
//! state directory (one per workspace and tenant), and is bound alone into
//! the sessions' view. It is made inside the sandbox, as the sessions' uid,
//! the first time an interpreter starts: the server never writes in a tree
//! sessions can write. Made with `--system-site-packages`, so the packages
//! of the interpreter it comes from stay importable, and without pip: the
//! installer is uv (`--python`) or that interpreter's own pip.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::LaunchSpec;
use crate::process::{self, Launch, Stdio};

#[derive(Debug)]
pub struct SessionVenv {
    pub dir: PathBuf,
    /// The interpreter it is made from.
    pub base: PathBuf,
    /// Held while it is made: the pool and a session starting at once make
    /// it once.
    making: tokio::sync::Mutex<()>,
}

impl SessionVenv {
    pub fn new(dir: PathBuf, base: PathBuf) -> Self {
        Self {
            dir,
            base,
            making: tokio::sync::Mutex::new(()),
        }
    }

    /// The interpreter sessions run.
    pub fn python(&self) -> PathBuf {
        self.dir.join("bin").join("python")
    }

    /// Makes the venv if it has no interpreter yet, under `spec`'s sandbox.
    pub async fn ensure(&self, spec: &LaunchSpec, timeout: Duration) -> Result<(), String> {
        let _making = self.making.lock().await;
        if self.python().is_file() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let (program, args) = self.command();
        let spawned = process::spawn(Launch {
            program: &program,
            args: &args,
            cwd: &spec.workdir,
            env: &[],
            sandbox: spec.sandbox.as_deref(),
            inherit_env: true,
            home: spec.log_dir.join("home-venv"),
            label: "venv",
            egress: false,
            extra_read: &[],
            stdio: Stdio::Pipes {
                stdin: false,
                control: Vec::new(),
            },
        })
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
        let mut child = spawned.child;
        let mut said = Vec::new();
        let outputs = spawned.outputs;
        let run = async {
            for (_, mut pipe) in outputs {
                // Bounded: an error message, not a log.
                let mut buf = Vec::new();
                let _ = (&mut pipe).take(4096).read_to_end(&mut buf).await;
                said.extend_from_slice(&buf);
            }
            child.wait().await
        };
        let status = match tokio::time::timeout(timeout, run).await {
            Ok(status) => status.map_err(|e| e.to_string()),
            Err(_) => Err(format!("it took longer than {} s", timeout.as_secs())),
        };
        let status = match status {
            Ok(status) => status,
            Err(e) => {
                spawned.process.kill_all();
                let _ = child.wait().await;
                spawned.process.remove_home().await;
                return Err(e);
            }
        };
        spawned.process.remove_home().await;
        if !status.success() || !self.python().is_file() {
            return Err(format!(
                "{} exited with {status}: {}",
                program.display(),
                String::from_utf8_lossy(&said).trim()
            ));
        }
        tracing::info!(
            "made the sessions' venv {} from {} in {:.2} s",
            self.dir.display(),
            self.base.display(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// uv when installed (tens of milliseconds), else the standard library.
    fn command(&self) -> (PathBuf, Vec<OsString>) {
        let dir = self.dir.clone().into_os_string();
        match super::python::uv() {
            Some(uv) => (
                uv,
                vec![
                    "venv".into(),
                    "--no-config".into(),
                    "--quiet".into(),
                    "--allow-existing".into(),
                    "--system-site-packages".into(),
                    "--python".into(),
                    self.base.clone().into_os_string(),
                    dir,
                ],
            ),
            None => (
                self.base.clone(),
                vec![
                    "-I".into(),
                    "-m".into(),
                    "venv".into(),
                    "--without-pip".into(),
                    "--system-site-packages".into(),
                    dir,
                ],
            ),
        }
    }
}

/// Whether `python` runs in a virtual environment already (its `bin`'s
/// parent holds a `pyvenv.cfg`), judged from the path as named.
pub fn in_a_venv(python: &Path) -> bool {
    python
        .parent()
        .and_then(Path::parent)
        .is_some_and(|d| d.join("pyvenv.cfg").is_file())
}

/// The directory of the venv kept for `workspace` and tenant `principal`
/// under the state directory `root` (`<root>/venvs/<FNV-1a of the
/// workspace>-<principal>`), created empty if missing and given to `owner`
/// (the sessions' uid) when the server runs as root. Nothing in it is
/// written by the server: the sandbox makes the venv.
pub fn prepare_dir(
    root: &Path,
    workspace: &Path,
    principal: &str,
    owner: Option<crate::sandbox::Identity>,
) -> std::io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let hash = crate::store::fnv1a(workspace.as_os_str().as_bytes());
    let venvs = root.join("venvs");
    let dir = venvs.join(format!("{hash:016x}-{principal}"));
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    for (path, mode) in [(&venvs, 0o711), (&dir, 0o700)] {
        match std::fs::DirBuilder::new().mode(mode).create(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // Never a link: nothing may steer where sessions' packages go.
        let meta = std::fs::symlink_metadata(path)?;
        let ours = path == &venvs || owner.is_none() || euid != 0;
        if !meta.is_dir() || (ours && meta.uid() != euid) {
            return Err(std::io::Error::other(format!(
                "{} is not a directory of this server's user; remove it",
                path.display()
            )));
        }
    }
    if let (Some(id), 0) = (owner, euid) {
        crate::sandbox::uids::give_workspace(&dir, id)?;
    }
    Ok(dir)
}
