#![cfg_attr(not(target_os = "linux"), allow(dead_code))]
//! The harness every area of the suite shares.
//!
//! - `launch`: the one spawn path: which binary, tool surface (full or
//!   plain), flags and environment a server starts with; its stderr log.
//! - `stdio`: `StdioServer`, a server on stdio with a connected rmcp client
//!   (handler `()`, or another such as `Recorder`); the legacy `initialize`
//!   lifecycle, or with `launch_modern_with` that of protocol 2026-07-28
//!   (`server/discover`, client capabilities in every request's `_meta`).
//! - `http`: `HttpServer` on streamable HTTP, rmcp clients for it (legacy,
//!   or 2026-07-28 with `connect_modern_with`), and raw HTTP/1.1 exchanges
//!   (`raw_http`, `raw_post_mcp`).
//! - `result`: tool calls (`call`, `try_call`), `ToolOutput` (the parts of a
//!   tool result the tests read) and the assertions on results.
//! - `long_running`: `LongRunningServer` (either transport, progress
//!   recorded, marker and gate files) and calls left running (`start_call`,
//!   `finish`).
//! - `procs`: processes in /proc (liveness, descendants, argv, memory),
//!   signals, `Reaper`, and pids of a session's PID namespace.
//! - `probes`: what a session or job can do: the `attempt` prelude and its
//!   outcomes, unique markers, Python literals, probe cells and jobs.
//! - `rich`: the rich-display interpreter and image blocks.
//! - `kernels`: kernel sessions (`--kernels`): the test environment's
//!   Jupyter data directories, a server with a session on a kernel, a cell.
//! - `host`: who the tests run as (`is_root`, `own_uid`) and file modes
//!   (`chmod`).
//! - `encoding`: base64 (the `base64` crate) as content blocks carry it.
//!
//! Everything is re-exported here: `use crate::support::{...}`.

pub mod encoding;
#[cfg(target_os = "linux")]
pub mod host;
pub mod http;
pub mod kernels;
pub mod launch;
pub mod long_running;
pub mod probes;
pub mod procs;
pub mod result;
pub mod rich;
pub mod stdio;
pub mod upstreams;
pub mod wheels;

pub use encoding::*;
#[cfg(target_os = "linux")]
pub use host::*;
pub use http::*;
pub use launch::*;
pub use long_running::*;
pub use probes::*;
pub use procs::*;
pub use result::*;
pub use rich::*;
pub use stdio::*;
pub use wheels::*;

/// A fresh directory that sessions' views would show if it were bound:
/// under CARGO_TARGET_TMPDIR, unless that lies in a place ferrepl hides
/// from every session (a home, /tmp, /var/tmp, /run: a checkout made with
/// `mktemp -d` or under ~); then under /var/cache/ferrepl-tests, where it
/// can be made (as root), or FERREPL_TEST_VISIBLE_DIR.
pub fn visible_outside_dir() -> tempfile::TempDir {
    // scripts/escape-unprivileged.sh gives its user one of its own.
    if let Some(dir) = std::env::var_os("FERREPL_TEST_VISIBLE_DIR").filter(|d| !d.is_empty()) {
        return tempfile::tempdir_in(dir).expect("create a visible test directory");
    }
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let hidden = ["/tmp", "/var/tmp", "/home", "/root", "/run"]
        .iter()
        .map(std::path::PathBuf::from)
        .chain(home)
        .any(|h| target.starts_with(&h));
    let fallback = std::path::Path::new("/var/cache/ferrepl-tests");
    let base = if hidden && std::fs::create_dir_all(fallback).is_ok() {
        fallback
    } else {
        std::fs::create_dir_all(target).expect("create CARGO_TARGET_TMPDIR");
        target
    };
    tempfile::tempdir_in(base).expect("create a visible test directory")
}
