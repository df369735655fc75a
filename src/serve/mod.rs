//! How MCP messages reach the server: newline-delimited JSON-RPC on stdio,
//! or streamable HTTP.

pub mod bind;
mod budgets;
pub mod http;
mod json_reply;
pub mod listener;
pub mod probes;
pub mod stdio;
