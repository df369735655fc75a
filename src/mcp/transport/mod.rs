//! How MCP messages reach the server: newline-delimited JSON-RPC on stdio,
//! or streamable HTTP.

pub mod http;
mod json_reply;
mod listener;
mod probes;
pub mod stdio;
