//! Workspace files for remote use: every path is confined to the workspace
//! root. Absolute paths and `..` are refused, and a path whose real location
//! (symlinks resolved) is outside the root is refused too.

use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("'{0}' is an absolute path; give a path relative to the workspace root")]
    Absolute(String),
    #[error("'{0}' contains '..'; paths must stay inside the workspace root")]
    ParentDir(String),
    #[error("'{0}' leads outside the workspace root (through a symlink); refused")]
    Escapes(String),
    #[error("'{0}' does not exist in the workspace; file_list shows what is there")]
    NotFound(String),
    #[error("'{path}': {error}")]
    Io { path: String, error: String },
}

/// The workspace root and the checks on paths under it.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    pub fn new(root: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: root.canonicalize()?,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn lexical(&self, rel: &str) -> Result<PathBuf, FileError> {
        let path = Path::new(rel);
        if path.is_absolute() {
            return Err(FileError::Absolute(rel.to_string()));
        }
        let mut out = self.root.clone();
        for c in path.components() {
            match c {
                Component::Normal(part) => out.push(part),
                Component::CurDir => {}
                Component::ParentDir => return Err(FileError::ParentDir(rel.to_string())),
                Component::RootDir | Component::Prefix(_) => {
                    return Err(FileError::Absolute(rel.to_string()));
                }
            }
        }
        Ok(out)
    }

    /// An existing path inside the root, symlinks resolved.
    pub fn existing(&self, rel: &str) -> Result<PathBuf, FileError> {
        let path = self.lexical(rel)?;
        let real = path.canonicalize().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FileError::NotFound(rel.to_string()),
            _ => FileError::Io {
                path: rel.to_string(),
                error: e.to_string(),
            },
        })?;
        if !real.starts_with(&self.root) {
            return Err(FileError::Escapes(rel.to_string()));
        }
        Ok(real)
    }

    /// A path to create or overwrite: its parent directories are created
    /// (inside the root) and the final component, if it exists, must not
    /// lead outside.
    pub fn writable(&self, rel: &str) -> Result<PathBuf, FileError> {
        let path = self.lexical(rel)?;
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(FileError::Io {
                path: rel.to_string(),
                error: "not a file path".into(),
            });
        };
        // Walk up to the nearest existing ancestor and check it first, so no
        // directory is created through a symlink that leaves the root.
        let mut existing = parent.to_path_buf();
        while !existing.exists() {
            if !existing.pop() {
                break;
            }
        }
        let real_ancestor = existing.canonicalize().map_err(|e| FileError::Io {
            path: rel.to_string(),
            error: e.to_string(),
        })?;
        if !real_ancestor.starts_with(&self.root) {
            return Err(FileError::Escapes(rel.to_string()));
        }
        std::fs::create_dir_all(parent).map_err(|e| FileError::Io {
            path: rel.to_string(),
            error: e.to_string(),
        })?;
        let real_parent = parent.canonicalize().map_err(|e| FileError::Io {
            path: rel.to_string(),
            error: e.to_string(),
        })?;
        if !real_parent.starts_with(&self.root) {
            return Err(FileError::Escapes(rel.to_string()));
        }
        let target = real_parent.join(name);
        if let Ok(meta) = std::fs::symlink_metadata(&target)
            && meta.file_type().is_symlink()
        {
            let real = target
                .canonicalize()
                .map_err(|_| FileError::Escapes(rel.to_string()))?;
            if !real.starts_with(&self.root) {
                return Err(FileError::Escapes(rel.to_string()));
            }
            return Ok(real);
        }
        Ok(target)
    }

    /// A directory entry itself (a symlink is not followed), for deletion:
    /// its parent must really be inside the root.
    pub fn entry(&self, rel: &str) -> Result<PathBuf, FileError> {
        let path = self.lexical(rel)?;
        if path == self.root {
            return Err(FileError::Io {
                path: rel.to_string(),
                error: "this is the workspace root itself; it cannot be deleted".into(),
            });
        }
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(FileError::NotFound(rel.to_string()));
        };
        let real_parent = parent
            .canonicalize()
            .map_err(|_| FileError::NotFound(rel.to_string()))?;
        if !real_parent.starts_with(&self.root) {
            return Err(FileError::Escapes(rel.to_string()));
        }
        let entry = real_parent.join(name);
        if std::fs::symlink_metadata(&entry).is_err() {
            return Err(FileError::NotFound(rel.to_string()));
        }
        Ok(entry)
    }

    /// The path as shown to the agent: relative to the root.
    pub fn display(&self, path: &Path) -> String {
        match path.strip_prefix(&self.root) {
            Ok(p) if p.as_os_str().is_empty() => ".".to_string(),
            Ok(p) => p.display().to_string(),
            Err(_) => path.display().to_string(),
        }
    }
}

/// A MIME type from a file name, for binary reads.
pub fn mime_for(path: &Path) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "whl" => "application/zip",
        "json" => "application/json",
        "csv" => "text/csv",
        "parquet" => "application/vnd.apache.parquet",
        "npy" | "npz" | "pkl" | "pickle" | "bin" => "application/octet-stream",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_refused() {
        let outside = tempfile::tempdir().expect("tempdir");
        let root = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::new(root.path()).expect("workspace");
        std::fs::write(outside.path().join("secret"), "s").expect("write");
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).expect("symlink");
        assert!(matches!(
            ws.existing("/etc/passwd"),
            Err(FileError::Absolute(_))
        ));
        assert!(matches!(
            ws.existing("a/../../x"),
            Err(FileError::ParentDir(_))
        ));
        assert!(matches!(
            ws.existing("link/secret"),
            Err(FileError::Escapes(_))
        ));
        assert!(matches!(
            ws.writable("link/new"),
            Err(FileError::Escapes(_))
        ));
        assert!(matches!(
            ws.writable("link/deeper/new"),
            Err(FileError::Escapes(_))
        ));
        assert!(!outside.path().join("deeper").exists());
        let p = ws.writable("sub/dir/file.txt").expect("inside");
        assert!(p.starts_with(ws.root()));
    }
}
