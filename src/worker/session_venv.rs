//! The venv ferrepl keeps for a workspace, where `python_install` puts
//! packages. It lives outside the workspace, in the state directory (one
//! per workspace, tenant and user's venv), and is bound alone into the
//! sessions' view. It is made inside the sandbox, as the sessions' uid, the
//! first time an interpreter starts: the server never writes in a tree
//! sessions can write.
//!
//! Two kinds. For an interpreter that is not a venv: made with
//! `--system-site-packages`, so the packages of the interpreter it comes
//! from stay importable, and without pip: the installer is uv (`--python`)
//! or that interpreter's own pip. Over the user's venv (a `.venv` found
//! upward, `--venv`, a `--python` in a venv), which sessions only read (a
//! `.pth` planted there would run on the host, unsandboxed, whenever the
//! user starts that interpreter): made from the same base interpreter, its
//! system site-packages as the user's `pyvenv.cfg` says, with a `.pth` that
//! adds the user's site-packages after its own (`site.addsitedir`, so the
//! user's own `.pth` files, editable installs, are processed too).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::LaunchSpec;
use crate::process::{self, Launch, Stdio};

#[derive(Debug)]
pub struct SessionVenv {
    pub dir: PathBuf,
    /// The interpreter it is made from (over a user's venv: that venv's
    /// interpreter, whose base interpreter the kept one links to).
    pub base: PathBuf,
    /// The user's venv it is layered over, read-only to sessions.
    pub layer: Option<PathBuf>,
    /// Held while it is made: the pool and a session starting at once make
    /// it once.
    making: tokio::sync::Mutex<()>,
    /// The packages of --preinstall: interpreters start once they are in.
    pub preinstall: Option<std::sync::Arc<super::preinstall::Preinstall>>,
}

impl SessionVenv {
    pub fn new(dir: PathBuf, base: PathBuf) -> Self {
        Self {
            dir,
            base,
            layer: None,
            making: tokio::sync::Mutex::new(()),
            preinstall: None,
        }
    }

    /// Kept over the user's venv `user` (then `base` is its interpreter).
    pub fn over(mut self, user: PathBuf) -> Self {
        self.layer = Some(user);
        self
    }

    /// The interpreter sessions run.
    pub fn python(&self) -> PathBuf {
        self.dir.join("bin").join("python")
    }

    /// Whether it is made: its interpreter is there, and over a user's
    /// venv, the mark the making script leaves last (after the `.pth`).
    fn is_made(&self) -> bool {
        self.python().is_file() && (self.layer.is_none() || self.dir.join(LAYER_MARK).is_file())
    }

    /// `PATH` for shell jobs: the kept venv's `bin`, then the user's venv's
    /// (its console scripts), then `rest` without either.
    pub fn shell_path(&self, rest: Option<&str>) -> String {
        let mut parts = vec![self.dir.join("bin").display().to_string()];
        if let Some(user) = &self.layer {
            parts.push(user.join("bin").display().to_string());
        }
        let ours = parts.clone();
        parts.extend(
            rest.unwrap_or_default()
                .split(':')
                .filter(|p| !p.is_empty() && !ours.iter().any(|o| o == p))
                .map(str::to_string),
        );
        parts.join(":")
    }

    /// An exclusive flock on `<venv>.lock`, held while the venv is made.
    async fn lock_across_servers(
        &self,
        timeout: Duration,
    ) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
        let mut name = self.dir.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        let path = self.dir.with_file_name(name);
        let shown = path.display().to_string();
        let locking = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)?;
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| std::io::Error::from(e))
        });
        match tokio::time::timeout(timeout, locking).await {
            Ok(Ok(Ok(lock))) => Ok(lock),
            Ok(Ok(Err(e))) => Err(format!("cannot lock {shown}: {e}")),
            Ok(Err(e)) => Err(format!("cannot lock {shown}: {e}")),
            Err(_) => Err(format!(
                "another ferrepl has been making this venv for over {} s ({shown} is locked)",
                timeout.as_secs()
            )),
        }
    }

    /// Makes the venv if it is not made yet, under `spec`'s sandbox.
    pub async fn ensure(&self, spec: &LaunchSpec, timeout: Duration) -> Result<(), String> {
        let _making = self.making.lock().await;
        if self.is_made() {
            return Ok(());
        }
        // Other servers on the same workspace share the venv: one makes it
        // while the others wait for it (a flock beside it), then use it.
        let _across = self.lock_across_servers(timeout).await?;
        if self.is_made() {
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
            files: &[],
            inet_in_netns: false,
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
        if !status.success() || !self.is_made() {
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

    /// uv when installed (tens of milliseconds), else the standard library;
    /// over a user's venv, [`LAYER_SCRIPT`] run by that venv's interpreter.
    fn command(&self) -> (PathBuf, Vec<OsString>) {
        let dir = self.dir.clone().into_os_string();
        if self.layer.is_some() {
            // No site: nothing of the user's site-packages runs to make it.
            return (
                self.base.clone(),
                vec![
                    "-I".into(),
                    "-S".into(),
                    "-c".into(),
                    LAYER_SCRIPT.into(),
                    dir,
                    LAYER_PTH.into(),
                    LAYER_MARK.into(),
                ],
            );
        }
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

/// The file a kept venv over a user's venv holds once it is made (written
/// last by [`LAYER_SCRIPT`]; it names the user's venv).
const LAYER_MARK: &str = "ferrepl-layer";

/// The `.pth` in the kept venv's site-packages that adds the user's venv's
/// site-packages after it. Named to come last among the kept venv's own
/// `.pth` files (they are read in sorted order), so even paths those add
/// come before the user's.
const LAYER_PTH: &str = "zzz_ferrepl_user_venv.pth";

/// Makes the kept venv `sys.argv[1]` (the `.pth` and mark named by
/// `sys.argv[2:4]`) over the venv whose interpreter runs
/// it (`-I -S`, inside the sandbox): the standard library's venv (from the
/// running venv's base interpreter, ~30 ms), system site-packages only when
/// the user's `pyvenv.cfg` includes them (read as a boolean), the `.pth`,
/// `pip`/`pip3` that run the kept interpreter's pip (so `pip install` in a
/// shell job lands here, not in the read-only venv after it on PATH), and
/// the mark, last.
const LAYER_SCRIPT: &str = r##"import os, shlex, sys, sysconfig, venv
kept, pth, mark = sys.argv[1:4]
# Without site, sys.prefix is the base's: the venv is where the interpreter
# was named, as site would find it.
prefix = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
if not os.path.isfile(os.path.join(prefix, "pyvenv.cfg")):
    sys.exit(sys.executable + " is not in a virtual environment")
system = False
with open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8") as f:
    for line in f:
        key, eq, value = line.partition("=")
        if eq and key.strip().lower() == "include-system-site-packages":
            system = value.strip().lower() == "true"
venv.EnvBuilder(system_site_packages=system, symlinks=True, with_pip=False).create(kept)
def put(path, text, mode=0o644):
    with open(path + ".new", "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path + ".new", mode)
    os.replace(path + ".new", path)
scheme = "venv" if "venv" in sysconfig.get_scheme_names() else "posix_prefix"
def site(base, key):
    return sysconfig.get_path(key, scheme, vars={"base": base, "platbase": base})
user = []
for key in ("purelib", "platlib"):
    d = site(prefix, key)
    if d not in user:
        user.append(d)
site_dir = site(kept, "purelib")
os.makedirs(site_dir, exist_ok=True)
put(os.path.join(site_dir, pth),
    "# ferrepl: the user's venv %s (read-only to sessions) after this one\n" % prefix
    + "".join("import site; site.addsitedir(%r)\n" % d for d in user))
python = os.path.join(kept, "bin", "python")
for name in ("pip", "pip3"):
    put(os.path.join(kept, "bin", name), '#!/bin/sh\nexec %s -m pip "$@"\n' % shlex.quote(python), 0o755)
put(os.path.join(kept, mark), prefix + "\n")
"##;

/// Whether `python` runs in a virtual environment already (its `bin`'s
/// parent holds a `pyvenv.cfg`), judged from the path as named.
pub fn in_a_venv(python: &Path) -> bool {
    python
        .parent()
        .and_then(Path::parent)
        .is_some_and(|d| d.join("pyvenv.cfg").is_file())
}

/// The name of the venv kept for `workspace` and tenant `principal`:
/// `<FNV-1a of the workspace>-<principal>`, and over a user's venv
/// `.<FNV-1a of that venv>` after it (a tenant's name has no `.`): one per
/// (workspace, tenant, user's venv), so a venv kept over one user's venv is
/// never run over another, nor as the plain one.
pub fn dir_name(workspace: &Path, principal: &str, layer: Option<&Path>) -> String {
    use std::os::unix::ffi::OsStrExt;
    let hash = |p: &Path| crate::store::fnv1a(p.as_os_str().as_bytes());
    match layer {
        None => format!("{:016x}-{principal}", hash(workspace)),
        Some(user) => format!("{:016x}-{principal}.{:016x}", hash(workspace), hash(user)),
    }
}

/// The directory of the venv kept for `workspace`, tenant `principal` and
/// the user's venv `layer` under the state directory `root`
/// (`<root>/venvs/<dir_name>`), created empty if missing and given to
/// `owner` (the sessions' uid) when the server runs as root. Nothing in it
/// is written by the server: the sandbox makes the venv.
pub fn prepare_dir(
    root: &Path,
    workspace: &Path,
    principal: &str,
    layer: Option<&Path>,
    owner: Option<crate::sandbox::Identity>,
) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let venvs = root.join("venvs");
    let dir = venvs.join(dir_name(workspace, principal, layer));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kept_venv_per_workspace_tenant_and_user_venv() {
        let ws = Path::new("/srv/ws");
        let plain = dir_name(ws, "local", None);
        assert_eq!(
            plain,
            format!("{:016x}-local", crate::store::fnv1a(b"/srv/ws"))
        );
        let over = dir_name(ws, "local", Some(Path::new("/srv/ws/.venv")));
        let other = dir_name(ws, "local", Some(Path::new("/srv/env")));
        assert!(over.starts_with(&format!("{plain}.")), "{over}");
        assert_ne!(over, other);
        assert_ne!(
            over,
            dir_name(ws, "alpha", Some(Path::new("/srv/ws/.venv")))
        );
        assert_ne!(
            over,
            dir_name(
                Path::new("/srv/ws2"),
                "local",
                Some(Path::new("/srv/ws/.venv"))
            )
        );
        // No tenant's plain name is another's layered one (names have no '.').
        assert_eq!(over.matches('.').count(), 1);
    }

    #[test]
    fn shell_path_puts_the_kept_bin_then_the_users_then_the_rest() {
        let kept = SessionVenv::new("/state/venvs/k".into(), "/ws/.venv/bin/python".into())
            .over("/ws/.venv".into());
        assert_eq!(
            kept.shell_path(Some("/ws/.venv/bin:/usr/bin::/bin")),
            "/state/venvs/k/bin:/ws/.venv/bin:/usr/bin:/bin"
        );
        assert_eq!(kept.shell_path(None), "/state/venvs/k/bin:/ws/.venv/bin");
        let plain = SessionVenv::new("/state/venvs/p".into(), "/usr/bin/python3".into());
        assert_eq!(
            plain.shell_path(Some("/usr/bin")),
            "/state/venvs/p/bin:/usr/bin"
        );
    }

    /// The making script, run here without a sandbox by a real venv's
    /// interpreter: the kept venv's interpreter finds its own packages
    /// first, then the user's (and what the user's `.pth` files add), and
    /// the system's only as the user's `pyvenv.cfg` says.
    #[test]
    fn the_layer_script_puts_the_users_site_packages_after_the_kept_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let user = root.join("user");
        let made = std::process::Command::new("python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(&user)
            .status()
            .expect("python3 -m venv");
        assert!(made.success());
        let purelib = |prefix: &Path| {
            let out = std::process::Command::new(prefix.join("bin/python"))
                .args([
                    "-c",
                    "import sysconfig; print(sysconfig.get_path('purelib'))",
                ])
                .output()
                .expect("purelib");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        };
        let user_site = purelib(&user);
        std::fs::write(user_site.join("both.py"), "WHERE = 'user'\n").expect("user module");
        std::fs::create_dir_all(root.join("src")).expect("src");
        std::fs::write(root.join("src/edited.py"), "X = 1\n").expect("editable");
        std::fs::write(
            user_site.join("__editable__.edited.pth"),
            format!("{}\n", root.join("src").display()),
        )
        .expect("editable .pth");

        let kept = SessionVenv::new(root.join("kept"), user.join("bin/python")).over(user.clone());
        run_layer_script(&kept);
        assert!(kept.is_made());
        let kept_site = purelib(&kept.dir);
        std::fs::write(kept_site.join("both.py"), "WHERE = 'kept'\n").expect("kept module");
        let code =
            "import sys, both, edited, json; print(json.dumps([both.WHERE, sys.path, sys.prefix]))";
        let out = std::process::Command::new(kept.python())
            .args(["-c", code])
            .output()
            .expect("kept python");
        let shown: (String, Vec<String>, String) = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(shown.0, "kept");
        assert_eq!(Path::new(&shown.2), kept.dir);
        let at = |p: &Path| shown.1.iter().position(|s| Path::new(s) == p);
        let (k, u, e) = (at(&kept_site), at(&user_site), at(&root.join("src")));
        assert!(
            k.is_some() && k < u && u < e,
            "kept, user, editable: {:?}",
            shown.1
        );
        // The user's venv does not include the system's site-packages:
        // neither does the kept one.
        let cfg = std::fs::read_to_string(kept.dir.join("pyvenv.cfg")).expect("pyvenv.cfg");
        assert!(
            cfg.contains("include-system-site-packages = false"),
            "{cfg}"
        );
        // pip in a shell job is the kept interpreter's.
        let pip = std::fs::read_to_string(kept.dir.join("bin/pip")).expect("pip");
        assert!(
            pip.contains(&format!("{} -m pip", kept.python().display())),
            "{pip}"
        );

        // A user's venv that includes them: so does the kept one.
        let wide = root.join("wide");
        let made = std::process::Command::new("python3")
            .args(["-m", "venv", "--without-pip", "--system-site-packages"])
            .arg(&wide)
            .status()
            .expect("python3 -m venv");
        assert!(made.success());
        let kept = SessionVenv::new(root.join("kept-wide"), wide.join("bin/python")).over(wide);
        run_layer_script(&kept);
        let cfg = std::fs::read_to_string(kept.dir.join("pyvenv.cfg")).expect("pyvenv.cfg");
        assert!(cfg.contains("include-system-site-packages = true"), "{cfg}");
    }

    /// Makes `kept` as its launch would, outside any sandbox.
    fn run_layer_script(kept: &SessionVenv) {
        let (program, args) = kept.command();
        let out = std::process::Command::new(&program)
            .args(&args)
            .output()
            .expect("the layer script");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
