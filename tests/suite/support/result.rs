//! Tool calls through an rmcp client, and the parts of a tool result the
//! tests look at (`ToolOutput`), with the assertions shared by every area.

use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::{Peer, RoleClient, ServiceError};
use serde_json::{Value, json};

/// Upper bound for one tool call. Only hit when the server hangs: it turns a
/// hang into a failure with the server's stderr attached.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The string fields of a structured cell result that the server leaves out
/// when they are empty.
const OMITTED_WHEN_EMPTY: &[&str] = &["stdout", "stderr"];

/// The parts of a tool result the tests look at.
#[derive(Debug, Clone)]
pub struct ToolOutput {
    pub is_error: bool,
    /// `structured_content`, or `Value::Null` when absent.
    pub structured: Value,
    /// The first content block's text (empty when there is none).
    pub text: String,
    pub raw: CallToolResult,
}

impl ToolOutput {
    pub fn from_result(raw: CallToolResult) -> Self {
        let text = raw
            .content
            .first()
            .and_then(|block| block.as_text())
            .map(|t| t.text.clone())
            .unwrap_or_default();
        ToolOutput {
            is_error: raw.is_error.unwrap_or(false),
            structured: raw.structured_content.clone().unwrap_or(Value::Null),
            text,
            raw,
        }
    }

    /// `structured[key]` as a string, or a panic that shows the whole result.
    /// A cell result leaves out an empty `stdout` or `stderr`: for those two
    /// keys, absent from a structured result, this is "".
    pub fn str_field(&self, key: &str) -> &str {
        if OMITTED_WHEN_EMPTY.contains(&key)
            && self
                .structured
                .as_object()
                .is_some_and(|o| !o.contains_key(key))
        {
            return "";
        }
        self.structured[key]
            .as_str()
            .unwrap_or_else(|| panic!("structured_content.{key} is not a string in {self:#?}"))
    }

    /// The `notes` of a structured result (none when the key is left out).
    pub fn notes(&self) -> Vec<String> {
        self.string_list("notes")
    }

    /// All notes of a structured result, joined by newlines, for matching.
    pub fn notes_text(&self) -> String {
        self.notes().join("\n")
    }

    /// The `display` entries of a structured result (none when left out).
    pub fn display(&self) -> Vec<Value> {
        match &self.structured["display"] {
            Value::Null if self.structured.is_object() => Vec::new(),
            Value::Array(items) => items.clone(),
            other => panic!("structured_content.display is not an array ({other}) in {self:#?}"),
        }
    }

    /// `structured[key]`, an array of strings left out when empty.
    fn string_list(&self, key: &str) -> Vec<String> {
        match &self.structured[key] {
            Value::Null if self.structured.is_object() => Vec::new(),
            Value::Array(items) => items
                .iter()
                .map(|n| {
                    n.as_str()
                        .unwrap_or_else(|| panic!("{key} holds a non-string in {self:#?}"))
                        .to_string()
                })
                .collect(),
            other => panic!("structured_content.{key} is not an array ({other}) in {self:#?}"),
        }
    }

    pub fn status(&self) -> &str {
        self.str_field("status")
    }

    /// `value` of a python_exec result: `None` for JSON null.
    pub fn value(&self) -> Option<&str> {
        match &self.structured["value"] {
            Value::Null => None,
            Value::String(s) => Some(s.as_str()),
            other => panic!("structured_content.value is neither null nor a string: {other}"),
        }
    }

    pub fn error_type(&self) -> &str {
        self.structured["error"]["type"]
            .as_str()
            .unwrap_or_else(|| panic!("no error.type in {self:#?}"))
    }

    pub fn cell(&self) -> u64 {
        self.structured["cell"]
            .as_u64()
            .unwrap_or_else(|| panic!("structured_content.cell is not an integer in {self:#?}"))
    }

    /// Panics unless this is a successful python_exec result.
    pub fn assert_ok(&self) -> &Self {
        assert!(
            !self.is_error && self.structured["status"] == "ok",
            "expected a successful cell, got {self:#?}"
        );
        self
    }

    /// Panics unless this is a python_exec result for a cell that raised `kind`.
    pub fn assert_raised(&self, kind: &str) -> &Self {
        assert!(self.is_error, "expected is_error=true, got {self:#?}");
        assert_eq!(self.status(), "error", "status of {self:#?}");
        assert_eq!(self.error_type(), kind, "error.type of {self:#?}");
        self
    }
}

/// Panics unless `out` is a tool-level failure ("error: ..." text).
pub fn assert_tool_error<'a>(out: &'a ToolOutput, what: &str) -> &'a ToolOutput {
    assert!(out.is_error, "{what}: expected is_error=true, got {out:#?}");
    assert!(
        out.text.starts_with("error: "),
        "{what}: the error text should start with 'error: ', got {out:#?}"
    );
    out
}

/// Panics unless `out` is a refused call: a tool-level failure ("error: ...",
/// no structured content, so not a cell result) whose text contains every
/// one of `needles`.
pub fn assert_refused(out: &ToolOutput, needles: &[&str]) {
    assert!(out.is_error, "expected a refused call, got {out:#?}");
    assert!(
        out.text.starts_with("error: "),
        "a refused call's text starts with 'error: ': {out:#?}"
    );
    assert!(
        out.structured.is_null(),
        "a refused call has no structured_content: {out:#?}"
    );
    for needle in needles {
        assert!(
            out.text.contains(needle),
            "the refusal does not mention {needle:?}: {out:#?}"
        );
    }
}

/// Panics unless `out` is a successful, structured (non-cell) result with a
/// text block.
pub fn assert_success<'a>(out: &'a ToolOutput, what: &str) -> &'a ToolOutput {
    assert!(!out.is_error, "{what}: expected success, got {out:#?}");
    assert!(
        out.structured.is_object(),
        "{what}: expected structured_content, got {out:#?}"
    );
    assert!(
        !out.text.is_empty(),
        "{what}: expected a text block, got {out:#?}"
    );
    out
}

/// Panics unless `out` is a result with `status` (and a matching is_error).
pub fn assert_status(out: &ToolOutput, status: &str) {
    assert!(
        out.structured.is_object(),
        "expected a cell result with status {status}, got {out:#?}"
    );
    assert_eq!(out.status(), status, "status of {out:#?}");
    let error_status = matches!(status, "error" | "interrupted" | "crashed");
    assert_eq!(out.is_error, error_status, "is_error of {out:#?}");
}

/// Build `python_exec` arguments.
pub fn exec_args(session: &str, code: &str) -> Value {
    json!({ "code": code, "session": session })
}

/// `python_exec` arguments with an explicit `wait_s` (default session).
pub fn exec_wait_args(code: &str, wait_s: f64) -> Value {
    json!({ "code": code, "wait_s": wait_s })
}

/// Send one tools/call and return rmcp's raw answer (a JSON-RPC error is `Err`).
pub async fn try_call(
    peer: &Peer<RoleClient>,
    tool: &str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    match tokio::time::timeout(CALL_TIMEOUT, peer.call_tool(params)).await {
        Ok(result) => result,
        Err(_) => panic!("tools/call {tool} did not answer within {CALL_TIMEOUT:?}"),
    }
}

/// Send one tools/call that must produce a tool result (not a JSON-RPC error).
pub async fn call(peer: &Peer<RoleClient>, tool: &str, args: Value) -> ToolOutput {
    let shown = args.to_string();
    match try_call(peer, tool, args).await {
        Ok(result) => ToolOutput::from_result(result),
        Err(e) => panic!("tools/call {tool} {shown} failed at the protocol level: {e}"),
    }
}

/// The `python_sessions` row of session `name`.
pub async fn session_row(peer: &Peer<RoleClient>, name: &str) -> Value {
    let listing = call(peer, "python_sessions", serde_json::json!({})).await;
    assert!(!listing.is_error, "python_sessions failed: {listing:#?}");
    listing.structured["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("python_sessions has no sessions array: {listing:#?}"))
        .iter()
        .find(|s| s["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("session {name} is not listed: {listing:#?}"))
}

/// The names `python_sessions` lists.
pub async fn session_names(peer: &Peer<RoleClient>) -> Vec<String> {
    let listing = call(peer, "python_sessions", serde_json::json!({})).await;
    assert!(!listing.is_error, "python_sessions failed: {listing:#?}");
    listing.structured["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("python_sessions has no sessions array: {listing:#?}"))
        .iter()
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect()
}

/// The JSON a cell or job printed on a line `KEY=<json>` of its stdout.
pub fn json_line(out: &ToolOutput, key: &str) -> Value {
    let stdout = out.str_field("stdout");
    let prefix = format!("{key}=");
    let text = stdout
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= line in the stdout; result: {out:#?}"));
    serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{key}= is not JSON ({e}): {text}; result: {out:#?}"))
}

/// The host pid `python_sessions` lists for session `name`, which must have one.
pub async fn session_pid(peer: &Peer<RoleClient>, name: &str) -> u32 {
    let row = session_row(peer, name).await;
    row["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or_else(|| panic!("session {name} has no pid: {row:#}"))
}

/// The names of the tools the server lists (all pages), sorted.
pub async fn tool_names(peer: &Peer<RoleClient>) -> Vec<String> {
    let tools = tokio::time::timeout(CALL_TIMEOUT, peer.list_all_tools())
        .await
        .expect("tools/list timed out")
        .expect("tools/list failed");
    let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort_unstable();
    names
}
