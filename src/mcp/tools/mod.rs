//! The tools, one file per group of `--tools` (see `groups.rs`): each file
//! is an rmcp tool router over `FerreplServer`, combined in `server.rs`.
//! A tool returns `Result<CallToolResult, ToolError>`: the error branch is
//! what the agent reads, with what to do next.

pub mod files;
mod install_spec;
pub mod kernel;
pub mod more;
pub mod packages;
pub mod python;
pub mod r;
pub mod r_packages;
pub mod sessions;
pub mod shell;
