//! Probing what a session or a job can do: Python literals and the
//! `attempt(label, fn)` prelude, reading its outcomes back, unique markers
//! and decoys, and running probe cells and jobs that must finish.
//!
//! A probing cell (or a job running Python) prints one line per attempt:
//! `label: OK <repr>` or `label: <ExceptionType> errno=<n>`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

use super::result::ToolOutput;
use super::stdio::StdioServer;

/// `items` as a Python (JSON) list literal.
pub fn json_list(items: &[&str]) -> String {
    serde_json::to_string(items).expect("encode a list")
}

/// A string no other test (or test run) uses, for markers and decoys.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}{}x{}x{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A Python string literal for `s` (JSON strings are valid Python literals
/// for the ASCII paths and markers used here).
pub fn py(s: impl AsRef<str>) -> String {
    serde_json::to_string(s.as_ref()).expect("encode a string")
}

/// A Python string literal for the path `p`.
pub fn py_path(p: &Path) -> String {
    py(path_str(p))
}

/// `p` as a str (every path the tests make is UTF-8).
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// A single-quoted /bin/sh word.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Python prelude of the probing cells: `attempt(label, fn)` prints one line
/// `label: OK <repr>` or `label: <ExceptionType> errno=<n>`.
pub const ATTEMPT: &str = r#"
import os
def attempt(label, fn):
    try:
        r = fn()
        print(f"{label}: OK {r!r}", flush=True)
    except BaseException as e:
        print(f"{label}: {type(e).__name__} errno={getattr(e, 'errno', None)}", flush=True)
"#;

/// The outcome printed by `attempt` for `label` in a cell's or job's stdout
/// (a pty job's lines end in "\r\n": the "\r" is dropped).
pub fn outcome(out: &ToolOutput, label: &str) -> String {
    let stdout = out.str_field("stdout");
    let prefix = format!("{label}: ");
    stdout
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no line for '{label}' in the stdout; result: {out:#?}"))
        .to_string()
}

/// The errno of a failed outcome (`None` for success or no errno).
pub fn errno_of(got: &str) -> Option<i32> {
    got.rsplit_once("errno=")
        .and_then(|(_, n)| n.trim().parse().ok())
}

/// Panics unless `label` raised. Any exception will do: a hidden path may
/// be refused (EACCES/EPERM) or simply not exist in the session's view.
pub fn assert_failed(out: &ToolOutput, label: &str, why: &str) {
    let got = outcome(out, label);
    assert!(
        !got.starts_with("OK"),
        "'{label}' must fail ({why}), but it worked: '{got}'; result: {out:#?}"
    );
}

/// Panics unless `label` worked.
pub fn assert_succeeded(out: &ToolOutput, label: &str) {
    let got = outcome(out, label);
    assert!(
        got.starts_with("OK"),
        "'{label}' should have worked, got '{got}'; result: {out:#?}"
    );
}

/// The whole tool result (text, structured content and every content block)
/// as one string, to look for leaked data.
pub fn everything(out: &ToolOutput) -> String {
    format!(
        "{}\n{}\n{}",
        out.text,
        out.structured,
        serde_json::to_string(&out.raw).unwrap_or_default()
    )
}

/// A cell in `session` that must run to completion (the probes are inside
/// it).
pub async fn run_cell(server: &StdioServer, session: &str, code: &str) -> ToolOutput {
    let out = server
        .call(
            "python_exec",
            json!({ "code": code, "session": session, "wait_s": 30 }),
        )
        .await;
    out.assert_ok();
    out
}

/// A shell job that must exit within its wait window.
pub async fn run_job(server: &StdioServer, args: Value) -> ToolOutput {
    let out = server.call("shell_exec", args).await;
    assert_eq!(
        out.structured["status"], "exited",
        "the job should have exited: {out:#?}"
    );
    out
}

/// An interpreter for shell jobs: the system one (what an unprivileged CI
/// user runs), else whatever `python3` is on the job's PATH.
pub fn job_python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// The Python every user can run: `/usr/bin/python3` when present (root's
/// pyenv under /root is hidden from sessions and unreadable to other users),
/// else the real executable behind `python3` on PATH (not a venv, not a
/// pyenv shim).
pub fn system_python() -> PathBuf {
    let usr = Path::new("/usr/bin/python3");
    if usr
        .metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    {
        return usr.to_path_buf();
    }
    real_python3()
}

/// The real python3 interpreter (not a venv, not a shim): the base executable
/// of whatever `python3` on PATH is.
pub fn real_python3() -> PathBuf {
    let code = "import os, sys\nprint(os.path.realpath(getattr(sys, '_base_executable', None) or sys.executable))";
    let out = std::process::Command::new("python3")
        .args(["-c", code])
        .output()
        .expect("run python3 to find its executable");
    assert!(out.status.success(), "python3 -c failed: {out:?}");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        path.is_file(),
        "python3 reported a missing executable: {path:?}"
    );
    path
}

/// What Python's repr() of the path string looks like (for the plain ASCII
/// paths the tests make).
pub fn py_repr(p: &Path) -> String {
    format!("'{}'", path_str(p))
}
