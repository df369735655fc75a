//! Which paths a sandboxed process may read and write, decided once at
//! start from the operator's flags and environment: never from a file the
//! agent can write (a `pyvenv.cfg`, a symlink in the workspace), and never
//! widened by a tool argument.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// `path` made absolute (relative to `base`) with `.` and `..` folded,
/// without touching the file system.
pub fn normalize(path: &Path, base: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Private places: every home directory (the user's, whatever `$HOME`
/// says, and `/home`, `/root`), the host's temporary directories (other
/// programs' files and sockets), /run (the session D-Bus, docker.sock,
/// ssh-agent sockets), container engines' sockets and state, and the
/// server's state directories. None is in a sandbox's view (nothing is that
/// is not allow-listed); these are the places no workspace may contain and
/// no PATH entry is shown from. Canonical paths of those that exist.
pub fn hidden_places(home: Option<&Path>, state_root: &Path) -> Vec<PathBuf> {
    let mut places: Vec<PathBuf> = Vec::new();
    places.extend(home.map(Path::to_path_buf));
    // SAFETY: getpwuid returns a pointer into static storage or null; read
    // at once, before any other call could overwrite it.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if !pw.is_null() && !(*pw).pw_dir.is_null() {
            let dir = std::ffi::CStr::from_ptr((*pw).pw_dir);
            places.push(PathBuf::from(
                std::ffi::OsStr::from_encoded_bytes_unchecked(dir.to_bytes()),
            ));
        }
    }
    places.push(std::env::temp_dir());
    for fixed in [
        "/home",
        "/root",
        "/tmp",
        "/var/tmp",
        "/run",
        "/var/run",
        "/var/snap",
        "/var/lib/docker",
        "/var/lib/containerd",
        "/var/lib/lxd",
        "/var/lib/incus",
    ] {
        places.push(PathBuf::from(fixed));
    }
    places.push(state_root.to_path_buf());
    let mut out: Vec<PathBuf> = places
        .into_iter()
        .filter_map(|p| p.canonicalize().ok())
        .filter(|p| p != Path::new("/"))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The places sessions can write (the workspace, writable venvs,
/// --allow-write): nothing found there is trusted or run by the server.
#[derive(Debug, Clone, Default)]
pub struct Writable(pub Vec<PathBuf>);

impl Writable {
    /// Whether the agent could have written `path`, or a symlink on its way:
    /// it (as given, or resolved) lies in a writable place, or is relative.
    /// Judged by the map of places' one rule (`places::resolve`).
    pub fn contains(&self, path: &Path) -> bool {
        if !path.is_absolute() {
            return true;
        }
        let root = Path::new("/");
        let at = super::places::resolve(path, root);
        self.0
            .iter()
            .any(|w| at.within(&super::places::resolve(w, root)))
    }

    /// `name` on PATH, skipping relative entries and entries sessions can
    /// write (an activated workspace venv on the operator's PATH).
    pub fn find_on_path(&self, name: &str) -> Option<PathBuf> {
        // `contains` also refuses relative entries.
        crate::executables::find_on_path_where(name, |p| !self.contains(p))
    }
}

/// The directories an operator-chosen interpreter needs readable: its real
/// location's prefix, and the base installation Python itself reports.
/// Interpreters sessions could have written give nothing and are never run
/// here.
pub fn interpreter_dirs(python: &Path, writable: &Writable) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if writable.contains(python) {
        return dirs;
    }
    let prefix = |p: &Path| p.parent().and_then(Path::parent).map(Path::to_path_buf);
    // Its own prefix when that is a venv the operator named (not a home
    // above ~/bin/python), and its real one.
    dirs.extend(prefix(python).filter(|p| p.join("pyvenv.cfg").is_file()));
    if let Ok(real) = python.canonicalize() {
        dirs.extend(prefix(&real));
    }
    if needs_asking(python)
        && let Some(info) = inspect(python)
    {
        dirs.extend(info.dirs);
    }
    dirs.retain(|d| d != Path::new("/") && !writable.contains(d));
    dirs.sort();
    dirs.dedup();
    dirs
}

/// What an interpreter says of itself.
#[derive(Debug, Clone)]
struct PythonInfo {
    executable: PathBuf,
    /// `sys.base_prefix`, `sys.prefix` and the real executable's prefix.
    dirs: Vec<PathBuf>,
}

/// Asks an interpreter outside the workspace where it lives (isolated mode
/// without site, from `/`, so no project file steers a pyenv/asdf shim or
/// site hooks; ~10 ms). Asked once per path.
fn inspect(python: &Path) -> Option<PythonInfo> {
    static CACHE: std::sync::Mutex<Vec<(PathBuf, Option<PythonInfo>)>> =
        std::sync::Mutex::new(Vec::new());
    if let Some((_, info)) = CACHE
        .lock()
        .ok()?
        .iter()
        .find(|(p, _)| p.as_path() == python)
    {
        return info.clone();
    }
    let info = ask_python(python);
    if let Ok(mut cache) = CACHE.lock() {
        cache.push((python.to_path_buf(), info.clone()));
    }
    info
}

fn ask_python(python: &Path) -> Option<PythonInfo> {
    let mut child = std::process::Command::new(python)
        .args([
            "-I",
            "-S",
            "-c",
            "import sys,os;print(sys.executable);print(sys.base_prefix);print(sys.prefix);print(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))",
        ])
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    // Bounded: an interpreter that hangs is killed after 20 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut text).ok()?;
    let mut lines = text.lines().map(str::trim).filter(|l| l.starts_with('/'));
    let executable = PathBuf::from(lines.next()?);
    Some(PythonInfo {
        executable,
        dirs: lines.map(PathBuf::from).collect(),
    })
}

/// Whether only the interpreter can tell where its installation is: a
/// script (a pyenv/asdf shim) or a virtual environment (whose base lies
/// elsewhere). A plain binary's installation is its real location's prefix,
/// so start-up does not pay for running it (~10 ms).
fn needs_asking(python: &Path) -> bool {
    let real = python
        .canonicalize()
        .unwrap_or_else(|_| python.to_path_buf());
    let script = std::fs::File::open(&real)
        .and_then(|mut f| {
            let mut magic = [0u8; 2];
            std::io::Read::read_exact(&mut f, &mut magic).map(|()| magic == *b"#!")
        })
        .unwrap_or(true);
    let venv = [python, real.as_path()].iter().any(|p| {
        p.ancestors()
            .skip(1)
            .take(2)
            .any(|d| d.join("pyvenv.cfg").is_file())
    });
    script || venv
}

/// The real binary behind `python3` (a pyenv or asdf shim resolves to the
/// version it selects from `/`, not from the workspace's `.python-version`),
/// so later sessions never run a shim.
pub fn real_executable(python: &Path) -> Option<PathBuf> {
    if !needs_asking(python) {
        return python.canonicalize().ok();
    }
    if let Some(exe) = pyenv_shim_target(python) {
        return Some(exe);
    }
    let exe = inspect(python)?.executable;
    (exe.is_absolute() && exe.is_file()).then_some(exe)
}

/// The binary a pyenv shim runs from `/`, read from pyenv's own files
/// instead of running the shim (pyenv takes ~90 ms to start, on every
/// server start): `PYENV_VERSION`, else the root's `version` file. None,
/// and the shim is asked, when anything is unusual (a `/.python-version`,
/// `system`, a version without that command, a shim of another kind).
fn pyenv_shim_target(shim: &Path) -> Option<PathBuf> {
    let shims = shim.parent()?;
    if shims.file_name()? != "shims" {
        return None;
    }
    let root = shims.parent()?;
    let name = shim.file_name()?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(std::fs::File::open(shim).ok()?, 4096),
        &mut text,
    )
    .ok()?;
    let marker = format!("export PYENV_ROOT=\"{}\"", root.display());
    if !text.starts_with("#!") || !text.contains(&marker) || !text.contains("libexec/pyenv") {
        return None;
    }
    // PYENV_DIR moves where pyenv looks for a .python-version.
    if Path::new("/.python-version").exists() || std::env::var_os("PYENV_DIR").is_some() {
        return None;
    }
    let versions = match std::env::var("PYENV_VERSION") {
        Ok(v) if !v.trim().is_empty() => v.replace(':', " "),
        _ => std::fs::read_to_string(root.join("version")).ok()?,
    };
    let versions = versions
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .flat_map(str::split_whitespace);
    for version in versions {
        if version == "system" || version.contains('/') || version.starts_with('.') {
            return None;
        }
        // A prefix ("3.12") or a decorated name pyenv would resolve itself.
        if !root.join("versions").join(version).is_dir() {
            return None;
        }
        let candidate = root.join("versions").join(version).join("bin").join(name);
        if candidate.is_file() {
            // The path the shim execs (what the interpreter then reports as
            // sys.executable), once it is known to be a real binary.
            let real = candidate.canonicalize().ok()?;
            return (!needs_asking(&real) && crate::executables::is_executable(&real))
                .then_some(candidate);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pyenv_shim_resolves_to_the_version_its_root_names() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        let bin = r.join("versions/3.99.1/bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::create_dir_all(r.join("shims")).expect("mkdir");
        // An ELF-looking file: not a script.
        std::fs::write(bin.join("python3"), b"\x7fELF").expect("write");
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(bin.join("python3"), mode).expect("chmod");
        let shim = r.join("shims/python3");
        std::fs::write(
            &shim,
            format!(
                "#!/usr/bin/env bash\nexport PYENV_ROOT=\"{}\"\nexec \"{}/libexec/pyenv\" exec \"$program\" \"$@\"\n",
                r.display(),
                r.display()
            ),
        )
        .expect("write");
        std::fs::write(r.join("version"), "3.99.1\n").expect("write");
        if std::env::var_os("PYENV_VERSION").is_none() {
            assert_eq!(pyenv_shim_target(&shim), Some(bin.join("python3")));
        }
        std::fs::write(r.join("version"), "system\n").expect("write");
        assert_eq!(pyenv_shim_target(&shim), None, "system is left to the shim");
        std::fs::write(r.join("version"), "3.99\n3.99.1\n").expect("write");
        assert_eq!(
            pyenv_shim_target(&shim),
            None,
            "a prefix is left to the shim"
        );
        std::fs::write(r.join("version"), "../../etc\n").expect("write");
        assert_eq!(pyenv_shim_target(&shim), None, "a path is not a version");
    }

    #[test]
    fn normalize_folds_dots() {
        let base = Path::new("/w/s");
        assert_eq!(normalize(Path::new("../x"), base), PathBuf::from("/w/x"));
        assert_eq!(normalize(Path::new("/a/./b/.."), base), PathBuf::from("/a"));
        assert_eq!(
            normalize(Path::new("../../../.."), base),
            PathBuf::from("/")
        );
    }
}
