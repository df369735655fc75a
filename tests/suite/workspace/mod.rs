//! The workspace tools: session management (create with options, delete,
//! limits, idle expiry), cell history, running script files, completion,
//! inspection with source, namespace edits, server status (python_sessions
//! {action: "status"}) and tool groups.
//!
//! One file per subject: `sessions`, `history`, `run_file`, `introspection`
//! (completion, inspect, help), `namespace`, `status` (server status and tool
//! groups, over stdio and HTTP). The shared helpers below list sessions and
//! hold a cell open.

mod history;
mod introspection;
mod namespace;
mod run_file;
mod sessions;
mod status;

use crate::support::{StdioServer, ToolOutput, assert_success, py_path};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// How long a bounded poll of some observable state may take.
pub(super) const POLL_TIMEOUT: Duration = Duration::from_secs(15);

fn sessions_of(structured: &Value) -> &Vec<Value> {
    structured["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions array in {structured}"))
}

pub(super) fn find_session<'a>(structured: &'a Value, name: &str) -> Option<&'a Value> {
    sessions_of(structured).iter().find(|s| s["name"] == name)
}

pub(super) async fn list_sessions(server: &StdioServer) -> ToolOutput {
    let out = server.call("python_sessions", json!({})).await;
    assert_success(&out, "python_sessions list");
    assert!(
        out.structured["message"].is_null(),
        "a listing has message null: {out:#?}"
    );
    out
}

/// A repr'd Python string value without its quotes.
pub(super) fn unquote(value: Option<&str>) -> String {
    let v = value.unwrap_or_else(|| panic!("expected a value"));
    v.trim_matches('\'').to_string()
}

/// Python code that blocks until `gate` exists (bounded), after writing a
/// line to `started`.
pub(super) fn gated_cell(started: &Path, gate: &Path) -> String {
    format!(
        "import os, time\n\
         with open({started}, 'w') as f:\n\
         \x20   f.write('started\\n')\n\
         deadline = time.monotonic() + 30\n\
         while not os.path.exists({gate}):\n\
         \x20   if time.monotonic() > deadline:\n\
         \x20       raise TimeoutError('the gate file never appeared')\n\
         \x20   time.sleep(0.01)\n\
         'gate passed'",
        started = py_path(started),
        gate = py_path(gate),
    )
}
