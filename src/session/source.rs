//! What a cell runs (code, or a script file), as a request for the driver,
//! as history shows it, and as the store keeps it for re-running.

use serde::{Deserialize, Serialize};

use crate::worker::protocol::Request;

/// What a cell runs: code, or a script file (python_run_file).
#[derive(Debug, Clone, Copy)]
pub enum CellSource<'a> {
    Code(&'a str),
    File { path: &'a str, args: &'a [String] },
}

impl<'a> CellSource<'a> {
    /// The driver's request that runs this as cell `cell`.
    pub(super) fn request(&self, cell: u64) -> Request<'a> {
        match *self {
            CellSource::Code(code) => Request::Exec {
                cell,
                code,
                path: None,
                argv: None,
            },
            CellSource::File { path, args } => Request::Exec {
                cell,
                code: "",
                path: Some(path),
                argv: Some(args),
            },
        }
    }

    /// The cell's code as history shows it (bounded).
    pub(super) fn describe(&self) -> String {
        let text = match self {
            CellSource::Code(code) => code.to_string(),
            CellSource::File { path, args } => {
                format!("# python_run_file {path} {}", args.join(" "))
                    .trim_end()
                    .to_string()
            }
        };
        if text.chars().count() > MAX_HISTORY_CODE_CHARS {
            let cut: String = text.chars().take(MAX_HISTORY_CODE_CHARS).collect();
            format!("{cut}\n# [... code truncated]")
        } else {
            text
        }
    }
}

const MAX_HISTORY_CODE_CHARS: usize = 4000;
pub(super) const HISTORY_PREVIEW_CHARS: usize = 300;

/// A cell's source as kept for re-running it (owned, and serialized into the
/// store as `{"code": ...}` or `{"file": ..., "args": [...]}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StoredSource {
    Code { code: String },
    File { file: String, args: Vec<String> },
}

impl StoredSource {
    pub fn of(source: &CellSource<'_>) -> Self {
        match *source {
            CellSource::Code(code) => StoredSource::Code {
                code: code.to_string(),
            },
            CellSource::File { path, args } => StoredSource::File {
                file: path.to_string(),
                args: args.to_vec(),
            },
        }
    }

    pub fn as_source(&self) -> CellSource<'_> {
        match self {
            StoredSource::Code { code } => CellSource::Code(code),
            StoredSource::File { file, args } => CellSource::File { path: file, args },
        }
    }

    /// Bytes it holds (for the bound on what a session keeps for re-running).
    pub fn size(&self) -> usize {
        match self {
            StoredSource::Code { code } => code.len(),
            StoredSource::File { file, args } => {
                file.len() + args.iter().map(String::len).sum::<usize>()
            }
        }
    }
}
