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
    /// The answer to cell `cell`'s prompt (a late one for an earlier cell
    /// is dropped: it travels beside the cells, not between them).
    Input { cell: u64, text: &'a str, eof: bool },
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
        /// The interpreter's version (the Python driver calls it `python`).
        #[serde(alias = "python")]
        version: String,
        executable: String,
        /// `--preimport` modules that failed ("module: error"), Python's.
        #[serde(default)]
        preimport_failed: Vec<String>,
    },
    /// The answer to a control request (inspect, complete, namespace).
    Reply {
        id: u64,
        #[serde(flatten)]
        body: Value,
    },
    /// The session's code calls an upstream MCP server (or lists them).
    Upstream(UpstreamEvent),
    /// `bytes` bytes of a saved state follow this line (state.rs).
    StateData { bytes: u64 },
    /// A cell another client ran in a kernel session (kernel/foreign.rs).
    Foreign { cell: super::kernel::ForeignCell },
    /// An event of a cell (its tag is the cell event's), sent after the
    /// `fence` markers that close the output before it.
    #[serde(untagged)]
    Cell {
        fence: u64,
        /// The streams the driver marked.
        #[serde(default)]
        fenced: Vec<String>,
        #[serde(flatten)]
        event: CellEvent,
    },
}

/// An `upstream` event: `op` is servers, tools, call or cancel.
#[derive(Debug, Deserialize)]
pub struct UpstreamEvent {
    pub id: u64,
    pub op: String,
    #[serde(default)]
    pub server: Option<String>,
    #[serde(default)]
    pub tool: Option<String>,
    #[serde(default)]
    pub arguments: Option<Value>,
}

/// A cell-level event. The output that came before its fence travels
/// beside it (`worker::FencedEvent`).
#[derive(Debug, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum CellEvent {
    Done {
        cell: u64,
        status: String,
        value: Option<String>,
        error: Option<PyError>,
        elapsed_ms: f64,
    },
    InputRequest {
        cell: u64,
        prompt: String,
        #[serde(default)]
        password: bool,
    },
    Display {
        cell: u64,
        #[serde(flatten)]
        image: Image,
    },
}

/// An image a cell displayed.
#[derive(Debug, Clone, Deserialize)]
pub struct Image {
    pub mime: String,
    /// Base64 of the image bytes.
    #[serde(rename = "data")]
    pub base64: String,
    pub bytes: u64,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub sha: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Event {
        serde_json::from_str(line).expect(line)
    }

    #[test]
    fn control_events_parse() {
        let Event::Ready {
            pid,
            version: python,
            ..
        } = parse(r#"{"ev":"ready","pid":7,"python":"3.12.1","executable":"/usr/bin/python3"}"#)
        else {
            panic!("not ready")
        };
        assert_eq!((pid, python.as_str()), (7, "3.12.1"));
        let Event::Reply { id, body } = parse(r#"{"ev":"reply","id":4,"ok":true,"fence":9}"#)
        else {
            panic!("not a reply")
        };
        assert_eq!(id, 4);
        assert_eq!(body["ok"], true);
    }

    #[test]
    fn cell_events_parse_with_their_fence() {
        let done = r#"{"ev":"done","cell":3,"status":"error","value":null,
            "error":{"type":"ValueError","message":"m","traceback":"t"},
            "elapsed_ms":1.5,"fence":12,"fenced":["stdout","stderr"]}"#;
        let Event::Cell {
            fence: 12,
            fenced,
            event:
                CellEvent::Done {
                    cell: 3,
                    status,
                    value: None,
                    error: Some(error),
                    elapsed_ms,
                    ..
                },
        } = parse(done)
        else {
            panic!("not done")
        };
        assert_eq!(fenced, ["stdout", "stderr"]);
        assert_eq!((status.as_str(), elapsed_ms), ("error", 1.5));
        assert_eq!(error.kind, "ValueError");

        let input = r#"{"ev":"input_request","cell":4,"prompt":"? ","fence":13}"#;
        let Event::Cell {
            fence: 13,
            fenced,
            event:
                CellEvent::InputRequest {
                    cell: 4,
                    prompt,
                    password: false,
                    ..
                },
        } = parse(input)
        else {
            panic!("not an input request")
        };
        assert!(fenced.is_empty());
        assert_eq!(prompt, "? ");

        let display = r#"{"ev":"display","cell":5,"mime":"image/png","data":"aGk=",
            "bytes":2,"width":null,"sha":"ab","fence":14,"fenced":["stdout"]}"#;
        let Event::Cell {
            event: CellEvent::Display { cell: 5, image, .. },
            ..
        } = parse(display)
        else {
            panic!("not a display")
        };
        assert_eq!(
            (image.mime.as_str(), image.base64.as_str()),
            ("image/png", "aGk=")
        );
        assert_eq!((image.bytes, image.width, image.height), (2, None, None));
        assert_eq!(image.sha, "ab");
    }

    #[test]
    fn malformed_events_are_refused() {
        for line in [
            r#"{"ev":"done","cell":1,"status":"ok","value":null,"error":null,"elapsed_ms":0.0}"#,
            r#"{"ev":"input_request","prompt":"","fence":1}"#,
            r#"{"ev":"nope","fence":1}"#,
            r#"{"ev":"reply"}"#,
            r#"{"cell":1,"fence":1}"#,
        ] {
            assert!(serde_json::from_str::<Event>(line).is_err(), "{line}");
        }
    }
}
