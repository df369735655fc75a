//! Finding executables: the PATH search and the execute bit, shared by
//! interpreter resolution and the sandbox's view of what is on PATH.

use std::path::{Path, PathBuf};

/// The first executable `name` in a PATH directory that `keep` accepts.
pub fn find_on_path_where(name: &str, keep: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .filter(|p| keep(p))
        .find(|p| is_executable(p))
}

/// A regular file with an execute bit.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
