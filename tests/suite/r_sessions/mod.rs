//! R sessions (`--languages python,r`): the r_* tools, console-like
//! results (printed values, warnings, errors with backtraces), long cells
//! (wait, interrupt, readline), plots as PNG images, help, inspect and
//! completion, truncated output, crashes, the sandbox, r_install from a
//! local source package, Python and R side by side, and one round trip over
//! HTTP.
//!
//! Every server here is started with `--languages python,r` and the full
//! tool surface. Cells that should be quick get a generous `wait_s`
//! (`QUICK_WAIT_S`): a cell that hangs comes back "running", which fails the
//! test instead of hanging it. Long cells are followed through the server's
//! own statuses (running, waiting_input, interrupted), never through sleeps.
//!
//! One file per subject: `sessions` (the tool surface, R sessions beside
//! Python ones, HTTP), `results` (what a cell returns, truncation, crashes),
//! `long_cells`, `plots`, `help` (help, inspect, complete), `sandbox`,
//! `install` (r_install). The shared helpers below start servers, run cells
//! and read their footers.

mod help;
mod install;
mod long_cells;
mod plots;
mod results;
mod sandbox;
mod sessions;

// r_setup builds the same local package to install through its own server.
pub(crate) use install::build_test_package;

use crate::support::{StdioServer, ToolOutput, assert_status};
use serde_json::{Value, json};

/// The flag every R server here starts with.
pub(super) const R_LANGS: &[&str] = &["--languages", "python,r"];
/// Every R tool of the full surface.
pub(super) const R_TOOLS: &[&str] = &[
    "r_exec",
    "r_wait",
    "r_output",
    "r_inspect",
    "r_complete",
    "r_install",
];
/// wait_s of cells that should finish quickly (under CALL_TIMEOUT).
pub(super) const QUICK_WAIT_S: f64 = 30.0;
/// wait_s of cells that load ggplot2 or build packages (under CALL_TIMEOUT).
pub(super) const SLOW_WAIT_S: f64 = 50.0;

pub(super) async fn r_server() -> StdioServer {
    StdioServer::start(R_LANGS).await
}

/// r_exec in the default R session ("r").
pub(super) async fn r_exec(server: &StdioServer, code: &str) -> ToolOutput {
    server
        .call("r_exec", json!({ "code": code, "wait_s": QUICK_WAIT_S }))
        .await
}

/// r_exec in `session` with an explicit wait window.
pub(super) async fn r_exec_in(
    server: &StdioServer,
    session: &str,
    code: &str,
    wait_s: f64,
) -> ToolOutput {
    server
        .call(
            "r_exec",
            json!({ "code": code, "session": session, "wait_s": wait_s }),
        )
        .await
}

/// r_wait on the default R session with `args` (plus a generous wait_s).
pub(super) async fn r_wait(server: &StdioServer, mut args: Value) -> ToolOutput {
    if args.get("wait_s").is_none() {
        args["wait_s"] = json!(QUICK_WAIT_S);
    }
    server.call("r_wait", args).await
}

/// The last non-empty line of a result's text (the status line).
fn footer(out: &ToolOutput) -> &str {
    out.text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_else(|| panic!("empty text in {out:#?}"))
}

/// Panics unless the result has `status` and its text ends with the status
/// line `-- <status> | cell N | session <session> | ... --`.
pub(super) fn assert_r_status(out: &ToolOutput, status: &str, session: &str) {
    assert_status(out, status);
    assert_eq!(out.str_field("session"), session, "session of {out:#?}");
    let line = footer(out);
    let head = format!("-- {status} | cell {} | session {session} |", out.cell());
    assert!(
        line.starts_with(&head) && line.trim_end().ends_with("--"),
        "the status line should start with {head:?} and end with '--', got {line:?} in:\n{}",
        out.text
    );
}

/// Panics unless this is a successful cell of the default R session.
pub(super) fn assert_r_ok(out: &ToolOutput) {
    assert_r_status(out, "ok", "r");
}

/// Panics unless the result's text contains every one of `needles`.
pub(super) fn assert_text_has(out: &ToolOutput, needles: &[&str]) {
    for needle in needles {
        assert!(
            out.text.contains(needle),
            "the text lacks {needle:?}:\n{}\n{out:#?}",
            out.text
        );
    }
}

/// The python_sessions row of `name`.
pub(super) async fn session_row(server: &StdioServer, name: &str) -> Value {
    crate::support::session_row(server.peer(), name).await
}

/// The interpreter pid python_sessions gives for `name`.
pub(super) async fn session_pid(server: &StdioServer, name: &str) -> u32 {
    crate::support::session_pid(server.peer(), name).await
}

/// An R string literal for `s` (JSON strings are valid R literals for the
/// ASCII paths and markers used here).
pub(super) fn r_str(s: &str) -> String {
    serde_json::to_string(s).expect("encode a string")
}

/// R prelude of the probing cells: `attempt(label, expr)` prints one line
/// `label: OK` or `label: Error <message>` / `label: Warning <message>`,
/// which `support::outcome` reads back.
pub(super) const R_ATTEMPT: &str = r#"
attempt <- function(label, expr) {
  got <- tryCatch({ force(expr); 'OK' },
    warning = function(w) paste('Warning', conditionMessage(w)),
    error = function(e) paste('Error', conditionMessage(e)))
  cat(label, ': ', gsub('\n', ' ', got), '\n', sep = '')
}
"#;
