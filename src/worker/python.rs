//! Which Python interpreter a session runs.

use std::path::{Path, PathBuf};

/// Where the interpreter choice came from, for logs and `server_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonSource {
    Flag,
    Venv,
    Path,
}

/// `--python` / `FERREPL_PYTHON` first; then the nearest `.venv/bin/python`
/// from `start` upward; then `python3` on PATH.
pub fn resolve(explicit: Option<&Path>, start: &Path) -> (PathBuf, PythonSource) {
    if let Some(p) = explicit {
        return (p.to_path_buf(), PythonSource::Flag);
    }
    for dir in start.ancestors() {
        let candidate = dir.join(".venv").join("bin").join("python");
        if candidate.is_file() {
            return (candidate, PythonSource::Venv);
        }
    }
    if let Some(found) = find_on_path("python3") {
        return (found, PythonSource::Path);
    }
    (PathBuf::from("python3"), PythonSource::Path)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_choice_wins() {
        let (p, src) = resolve(Some(Path::new("/opt/py/bin/python")), Path::new("/"));
        assert_eq!(p, PathBuf::from("/opt/py/bin/python"));
        assert_eq!(src, PythonSource::Flag);
    }

    #[test]
    fn nearest_venv_upward_is_found() {
        let root = tempfile::tempdir().expect("tempdir");
        let bin = root.path().join(".venv/bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::write(bin.join("python"), "").expect("write");
        let deep = root.path().join("a/b/c");
        std::fs::create_dir_all(&deep).expect("mkdir");
        let (p, src) = resolve(None, &deep);
        assert_eq!(p, bin.join("python"));
        assert_eq!(src, PythonSource::Venv);
    }
}
