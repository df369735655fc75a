//! MCP surface: tools, result rendering and transports.

pub mod http;
pub mod render;
pub mod server;
