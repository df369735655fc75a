//! MCP surface: tools, result rendering and transports.

pub mod args;
pub mod file_tools;
pub mod groups;
pub mod http;
pub mod output_tool;
pub mod packages_tool;
pub mod render;
pub mod schema;
pub mod server;
pub mod shell_tools;
pub mod stdio;
pub mod workspace_tools;
