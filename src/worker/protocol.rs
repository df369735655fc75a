//! Messages on the control channel (fd 3 in the worker). See docs/protocol.md.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Requests from the server to the driver, one JSON object per line.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request<'a> {
    Exec {
        cell: u64,
        code: &'a str,
        /// Run this script file instead of `code` (python_run_file).
        #[serde(skip_serializing_if = "Option::is_none")]
        path: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        argv: Option<&'a [String]>,
    },
    Input {
        text: &'a str,
        eof: bool,
    },
}

/// A Python exception as the driver reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct PyError {
    /// Exception class name, e.g. `ZeroDivisionError`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `str()` of the exception.
    pub message: String,
    /// Formatted traceback of the user's code only (cells are named `<cell N>`).
    pub traceback: String,
}

/// Events from the driver.
#[derive(Debug, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    Ready {
        pid: u32,
        python: String,
        executable: String,
    },
    Done {
        cell: u64,
        status: String,
        value: Option<String>,
        error: Option<PyError>,
        elapsed_ms: f64,
        fence: u64,
        #[serde(default)]
        fenced: Vec<String>,
    },
    InputRequest {
        cell: u64,
        prompt: String,
        #[serde(default)]
        password: bool,
        fence: u64,
        #[serde(default)]
        fenced: Vec<String>,
    },
    /// The answer to a control request (inspect, complete, namespace).
    Reply {
        id: u64,
        #[serde(flatten)]
        body: Value,
    },
    Display {
        cell: u64,
        mime: String,
        /// Base64 of the image bytes.
        data: String,
        bytes: u64,
        width: Option<u32>,
        height: Option<u32>,
        sha: String,
        fence: u64,
        #[serde(default)]
        fenced: Vec<String>,
    },
}

/// An image a cell displayed.
#[derive(Debug, Clone)]
pub struct Image {
    pub mime: String,
    pub base64: String,
    pub bytes: u64,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub sha: String,
}

impl Event {
    /// The fence this event closes, and which streams the driver marked.
    pub fn fence(&self) -> Option<(u64, &[String])> {
        match self {
            Event::Done { fence, fenced, .. }
            | Event::InputRequest { fence, fenced, .. }
            | Event::Display { fence, fenced, .. } => Some((*fence, fenced)),
            _ => None,
        }
    }
}
