#![cfg_attr(not(target_os = "linux"), allow(dead_code))]
//! The harness every area of the suite shares.
//!
//! - `launch`: the one spawn path: which binary, tool surface (full or
//!   plain), flags and environment a server starts with; its stderr log.
//! - `stdio`: `StdioServer`, a server on stdio with a connected rmcp client
//!   (handler `()`, or another such as `Recorder`).
//! - `http`: `HttpServer` on streamable HTTP, rmcp clients for it, and raw
//!   HTTP/1.1 exchanges (`raw_http`, `raw_post_mcp`).
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
//! - `encoding`: base64 (the `base64` crate) as content blocks carry it.
//!
//! Everything is re-exported here: `use crate::support::{...}`.

pub mod encoding;
pub mod http;
pub mod launch;
pub mod long_running;
pub mod probes;
pub mod procs;
pub mod result;
pub mod rich;
pub mod stdio;
pub mod wheels;

pub use encoding::*;
pub use http::*;
pub use launch::*;
pub use long_running::*;
pub use probes::*;
pub use procs::*;
pub use result::*;
pub use rich::*;
pub use stdio::*;
pub use wheels::*;
