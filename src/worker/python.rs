//! Which Python interpreter a session runs.

use std::path::{Path, PathBuf};

/// Where the interpreter choice came from, for logs and `server_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonSource {
    Flag,
    /// --venv DIR (created if missing).
    VenvFlag,
    /// The nearest .venv upward from the working directory.
    Venv,
    Path,
}

/// `--python` / `FERREPL_PYTHON` first; then the nearest `.venv/bin/python`
/// from `start` upward; then `python3` on PATH.
pub fn resolve(explicit: Option<&Path>, start: &Path) -> (PathBuf, PythonSource) {
    if let Some(p) = explicit {
        // A relative path (`target/env/bin/python`) means the server's
        // directory: sessions start elsewhere. A bare name is looked up.
        let p = if p.is_relative() && p.components().count() > 1 {
            std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
        } else {
            p.to_path_buf()
        };
        return (p, PythonSource::Flag);
    }
    for dir in start.ancestors() {
        let candidate = dir.join(".venv").join("bin").join("python");
        if candidate.is_file() {
            return (candidate, PythonSource::Venv);
        }
    }
    // Under uvx or pipx, PATH starts with ferrepl's own throwaway tool
    // environment: its python3 is not the user's.
    let tool_env = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .filter(|bin| is_tool_env(bin));
    if let Some(found) = find_on_path_where("python3", |p| p.parent() != tool_env.as_deref()) {
        return (found, PythonSource::Path);
    }
    (PathBuf::from("python3"), PythonSource::Path)
}

/// The interpreter of virtual environment `dir`, creating the environment
/// first (with uv when available, else `python -m venv`) if it is missing.
pub fn ensure_venv(
    dir: &Path,
    base_python: &Path,
    writable: &crate::sandbox::paths::Writable,
) -> anyhow::Result<PathBuf> {
    let python = dir.join("bin").join("python");
    if python.is_file() {
        return Ok(python);
    }
    check_venv_dir(dir)?;
    let output = match writable.find_on_path("uv") {
        Some(uv) => std::process::Command::new(uv)
            .current_dir("/")
            .arg("venv")
            .arg("--no-config")
            .arg("--seed")
            .arg("--python")
            .arg(base_python)
            .arg(dir)
            .output(),
        None => std::process::Command::new(base_python)
            .current_dir("/")
            .args(["-I", "-m", "venv"])
            .arg(dir)
            .output(),
    }
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot run {} to create the venv: {e}",
            base_python.display()
        )
    })?;
    if !output.status.success() || !python.is_file() {
        anyhow::bail!(
            "creating the virtual environment {} failed ({}): {}",
            dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(python)
}

/// Whether `dir` can be `--venv`: a virtual environment, or a place where
/// ferrepl may make one. Made by the server, outside the sandbox: only
/// where nothing a session left behind (a symlink, a half-made tree) can
/// steer the writes.
pub fn check_venv_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.join("bin").join("python").is_file() {
        return Ok(());
    }
    if std::fs::symlink_metadata(dir).is_ok() {
        anyhow::bail!(
            "--venv {} exists but is not a virtual environment (no bin/python); remove it, or name another directory (ferrepl creates a missing one)",
            dir.display()
        );
    }
    if let Some(parent) = dir.parent()
        && parent.canonicalize().ok().as_deref() != Some(parent)
    {
        anyhow::bail!(
            "--venv {}: its parent directory is missing or reached through a symlink; create it first or give the real path",
            dir.display()
        );
    }
    Ok(())
}

/// The uv binary, when installed.
pub fn uv() -> Option<PathBuf> {
    find_on_path("uv")
}

/// A `bin` directory of an environment uv or pipx made to run a tool.
fn is_tool_env(bin: &Path) -> bool {
    let shown = bin.to_string_lossy();
    (shown.contains("/uv/") && (shown.contains("/archive-v") || shown.contains("/tools/")))
        || shown.contains("/pipx/venvs/")
}

pub fn find_on_path(name: &str) -> Option<PathBuf> {
    find_on_path_where(name, |_| true)
}

use crate::executables::find_on_path_where;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_environments_are_recognised() {
        assert!(is_tool_env(Path::new(
            "/home/u/.cache/uv/archive-v0/Ab12/bin"
        )));
        assert!(is_tool_env(Path::new(
            "/home/u/.local/share/uv/tools/ferrepl/bin"
        )));
        assert!(is_tool_env(Path::new(
            "/home/u/.local/pipx/venvs/ferrepl/bin"
        )));
        assert!(!is_tool_env(Path::new("/home/u/project/.venv/bin")));
        assert!(!is_tool_env(Path::new("/usr/local/bin")));
    }

    #[test]
    fn a_relative_python_is_the_servers_directorys() {
        let (p, _) = resolve(Some(Path::new("env/bin/python")), Path::new("/"));
        assert!(p.is_absolute() && p.ends_with("env/bin/python"), "{p:?}");
        let (bare, _) = resolve(Some(Path::new("python3.12")), Path::new("/"));
        assert_eq!(bare, Path::new("python3.12"));
    }

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
