//! `--sandbox inherit`: the client's sandbox policy, sent by Codex in each
//! tool call's `_meta["codex/sandbox-state-meta"]`, narrows the operator's
//! ceiling (workspace-write, --allow-write, --network) for the call.
//!
//! The server advertises the experimental capability only under inherit;
//! a call that starts or runs code without a readable policy is refused
//! and runs nothing, while calls that only poll or read need none; a
//! read-only policy keeps cells, shell jobs and the file tools off the
//! workspace (and the operator's --allow-write places); a workspace-write
//! policy lets them write it but protects its read-only entries inside
//! (`.aws`); full access is the operator's own setting, never more; a
//! policy change restarts the session with a note, its variables loaded
//! back from its saved state; a client working outside the workspace is
//! refused; installs need a policy with the network. `--sandbox off` and
//! `inherit-codex` stay accepted as aliases, and `ferrepl install` writes
//! `--sandbox inherit` for Codex, `workspace-write` for the others.
//!
//! The metadata shapes are those the real Codex CLI (0.171.0) sends, and
//! the older `sandboxPolicy` shape.

use std::path::{Path, PathBuf};
use std::process::Output;

use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::{Peer, RoleClient, ServiceError};
use serde_json::{Value, json};

use crate::support::{
    ATTEMPT, CALL_TIMEOUT, StdioServer, ToolOutput, outcome, py_path, server_binary,
    visible_outside_dir,
};

/// The `_meta` key of Codex's policy, and the capability asking for it.
pub(super) const KEY: &str = "codex/sandbox-state-meta";

// ------------------------------------------------------------------ helpers

/// One tools/call of `tool` with `args`, carrying `policy` (if any) in
/// `_meta["codex/sandbox-state-meta"]`; rmcp's raw answer.
pub(super) async fn call_with_meta(
    peer: &Peer<RoleClient>,
    tool: &str,
    args: Value,
    policy: Option<Value>,
) -> Result<CallToolResult, ServiceError> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    if let Some(policy) = policy {
        let mut meta = serde_json::Map::new();
        meta.insert(KEY.to_string(), policy);
        params.meta = Some(RequestMetaObject::from(meta));
    }
    match tokio::time::timeout(CALL_TIMEOUT, peer.call_tool(params)).await {
        Ok(result) => result,
        Err(_) => panic!("tools/call {tool} did not answer within {CALL_TIMEOUT:?}"),
    }
}

/// A call with `policy` that must produce a tool result.
pub(super) async fn meta_call(
    server: &StdioServer,
    tool: &str,
    args: Value,
    policy: Option<Value>,
) -> ToolOutput {
    let shown = args.to_string();
    match call_with_meta(server.peer(), tool, args, policy).await {
        Ok(result) => ToolOutput::from_result(result),
        Err(e) => panic!(
            "tools/call {tool} {shown} failed at the protocol level: {e}\nserver stderr:\n{}",
            server.stderr_log()
        ),
    }
}

/// python_exec of `code` (default session) under `policy`.
pub(super) async fn exec_under(server: &StdioServer, code: &str, policy: Value) -> ToolOutput {
    meta_call(
        server,
        "python_exec",
        json!({ "code": code, "wait_s": 30 }),
        Some(policy),
    )
    .await
}

/// The server's workspace as the kernel names it (what Codex sends).
pub(super) fn ws(server: &StdioServer) -> PathBuf {
    server
        .workdir
        .path()
        .canonicalize()
        .expect("canonical workspace")
}

pub(super) fn s(p: &Path) -> String {
    p.to_str().expect("a UTF-8 path").to_string()
}

/// Codex 0.171.0's workspace-write profile for workspace `ws`.
pub(super) fn workspace_write(ws: &Path) -> Value {
    json!({
        "permissionProfile": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [
                    {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                    {"path": {"type": "path", "path": s(ws)}, "access": "write"},
                    {"path": {"type": "special", "value": {"kind": "slash_tmp"}}, "access": "write"},
                    {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "write"},
                    {"path": {"type": "path", "path": s(&ws.join(".git"))}, "access": "read", "missing_path_behavior": "skip"},
                    {"path": {"type": "path", "path": s(&ws.join(".aws"))}, "access": "read", "missing_path_behavior": "skip"}
                ]
            },
            "network": "restricted"
        },
        "sandboxCwd": format!("file://{}", s(ws)),
        "useLegacyLandlock": false
    })
}

/// Codex 0.171.0's read-only profile for workspace `ws`.
pub(super) fn read_only(ws: &Path) -> Value {
    json!({
        "permissionProfile": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [
                    {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}
                ]
            },
            "network": "restricted"
        },
        "sandboxCwd": format!("file://{}", s(ws)),
        "useLegacyLandlock": false
    })
}

/// Codex 0.171.0's danger-full-access profile.
pub(super) fn full_access(ws: &Path) -> Value {
    json!({
        "permissionProfile": {"type": "disabled"},
        "sandboxCwd": format!("file://{}", s(ws))
    })
}

/// Older Codex builds: `sandboxPolicy`, `sandboxCwd` a plain path.
pub(super) fn legacy_read_only(ws: &Path) -> Value {
    json!({"sandboxPolicy": {"type": "read-only"}, "sandboxCwd": s(ws)})
}

pub(super) fn legacy_workspace_write(ws: &Path) -> Value {
    json!({
        "sandboxPolicy": {"type": "workspace-write", "writable_roots": [], "network_access": false},
        "sandboxCwd": s(ws)
    })
}

/// A probing cell: `attempt("write", ...)` writing `text` to `path` (its
/// parent made first when `mkdir`).
pub(super) fn write_cell(path: &Path, text: &str, mkdir: bool) -> String {
    let make = if mkdir {
        "os.makedirs(os.path.dirname(p), exist_ok=True)\n    "
    } else {
        ""
    };
    format!(
        r#"{ATTEMPT}
def write(p, t):
    {make}with open(p, "w") as f:
        f.write(t)
    return "written"
attempt("write", lambda: write({path}, {text:?}))
"#,
        path = py_path(path),
    )
}

/// Whether an `attempt` outcome is a refusal of a write: PermissionError,
/// or an OSError with EPERM, EACCES or EROFS.
pub(super) fn is_denial(got: &str) -> bool {
    got.starts_with("PermissionError")
        || (got.starts_with("OSError")
            && [libc::EPERM, libc::EACCES, libc::EROFS]
                .iter()
                .any(|e| got.ends_with(&format!("errno={e}"))))
}

pub(super) fn assert_write_denied(out: &ToolOutput, what: &str) {
    out.assert_ok();
    let got = outcome(out, "write");
    assert!(
        is_denial(&got),
        "{what}: the write should have been refused (PermissionError / EPERM / EACCES / EROFS), got '{got}'; result: {out:#?}"
    );
}

pub(super) fn assert_write_worked(out: &ToolOutput, what: &str) {
    out.assert_ok();
    let got = outcome(out, "write");
    assert!(
        got.starts_with("OK"),
        "{what}: the write should have worked, got '{got}'; result: {out:#?}"
    );
}

/// Like `assert_write_denied`, also taking a place out of the session's
/// view (FileNotFoundError, ENOENT) as a refusal.
pub(super) fn assert_write_refused_or_hidden(out: &ToolOutput, what: &str) {
    out.assert_ok();
    let got = outcome(out, "write");
    let hidden = got == format!("FileNotFoundError errno={}", libc::ENOENT);
    assert!(
        is_denial(&got) || hidden,
        "{what}: the write should have been refused (or the place hidden), got '{got}'; result: {out:#?}"
    );
}

/// Panics unless `out` is a refused call (isError, an "error: ..." text,
/// not a cell result) naming every one of `needles`.
pub(super) fn assert_refused(out: &ToolOutput, needles: &[&str]) {
    assert!(out.is_error, "expected a refused call, got {out:#?}");
    assert!(
        out.text.starts_with("error: "),
        "a refused call's text starts with 'error: ': {out:#?}"
    );
    assert!(
        out.structured.get("status").is_none(),
        "a refused call is no cell or job result: {out:#?}"
    );
    for needle in needles {
        assert!(
            out.text.contains(needle),
            "the refusal does not mention {needle:?}: {out:#?}"
        );
    }
}

/// The exit code a shell job printed as `rc=<n>`.
pub(super) fn job_rc(out: &ToolOutput) -> String {
    assert_eq!(out.str_field("status"), "exited", "{out:#?}");
    out.str_field("stdout")
        .lines()
        .find_map(|l| l.trim().strip_prefix("rc="))
        .unwrap_or_else(|| panic!("no rc= line in the job's stdout: {out:#?}"))
        .to_string()
}

/// Whether the server's initialize result advertised the capability.
pub(super) fn advertises(server: &StdioServer) -> Option<serde_json::Map<String, Value>> {
    let info = server
        .peer()
        .peer_info()
        .expect("the server's initialize result");
    info.capabilities
        .experimental
        .as_ref()
        .and_then(|e| e.get(KEY).cloned())
}

mod attacks;
mod metadata;
mod names;
mod narrowing;
mod restarts;
