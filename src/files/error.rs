//! What a file tool's refusal or failure says to the agent, and which of
//! them are policy refusals (counted in the metrics). Apart from `mod.rs`
//! so the confinement rules there read without the messages.

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(
        "the workspace is read-only (--sandbox read-only): file_write and file_delete are refused"
    )]
    ReadOnly,
    #[error("'{0}' is an absolute path; give a path relative to the workspace root")]
    Absolute(String),
    #[error("'{0}' contains '..'; paths must stay inside the workspace root")]
    ParentDir(String),
    #[error("'{0}' leads outside the workspace root (through a symlink); refused")]
    Escapes(String),
    #[error("'{0}' does not exist in the workspace; file_list shows what is there")]
    NotFound(String),
    #[error("'{path}' is not a regular file (it is {kind}); {tool} {verb} regular files only")]
    NotRegular {
        path: String,
        kind: &'static str,
        tool: &'static str,
        verb: &'static str,
    },
    #[error("'{path}' is a directory; {hint}")]
    IsDir { path: String, hint: &'static str },
    #[error("'{0}' is not a directory; file_read reads files")]
    NotDir(String),
    #[error(
        "'{path}' is {size} bytes, over the {limit}-byte read limit; read part of it with shell_exec (head, sed -n) or python_exec"
    )]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("'{0}' is the workspace root itself; it cannot be deleted")]
    Root(String),
    #[error(
        "'{0}': the directory is not empty; pass recursive=true to delete it with its contents"
    )]
    NotEmpty(String),
    #[error(
        "'{0}' is a symlink to a file that does not exist; file_write does not create files through symlinks"
    )]
    DanglingSymlink(String),
    /// A write or deletion that would touch a protected place; `message`
    /// names the place and the flag that frees it (`Protected::refusal`).
    #[error("'{path}': {message}")]
    Protected { path: String, message: String },
    #[error("'{path}': {error}")]
    Io { path: String, error: String },
}

impl FileError {
    pub(super) fn io(path: &str, error: impl std::fmt::Display) -> Self {
        FileError::Io {
            path: path.to_string(),
            error: error.to_string(),
        }
    }

    pub(super) fn not_regular(path: &str, kind: &'static str, write: bool) -> Self {
        FileError::NotRegular {
            path: path.to_string(),
            kind,
            tool: if write { "file_write" } else { "file_read" },
            verb: if write { "writes" } else { "reads" },
        }
    }

    /// A directory where file_write or file_read wants a regular file.
    pub(super) fn is_dir(path: &str, write: bool) -> Self {
        FileError::IsDir {
            path: path.to_string(),
            hint: if write {
                "give a file path"
            } else {
                "use file_list"
            },
        }
    }
}

impl FileError {
    /// The policy refusal this error is, if it is one (not a mistake such
    /// as a missing file).
    pub fn refusal(&self) -> Option<crate::metrics::SandboxRefusal> {
        use crate::metrics::SandboxRefusal;
        match self {
            FileError::Absolute(_) | FileError::ParentDir(_) | FileError::Escapes(_) => {
                Some(SandboxRefusal::FilePath)
            }
            FileError::ReadOnly => Some(SandboxRefusal::ReadOnly),
            _ => None,
        }
    }
}

/// A file operation's result, its refusal counted.
pub(super) fn counted<T>(result: Result<T, FileError>) -> Result<T, FileError> {
    if let Err(e) = &result
        && let Some(kind) = e.refusal()
    {
        crate::metrics::sandbox_refusal(kind);
    }
    result
}
