//! MCP surface: tools, schemas, result rendering and transports.

pub mod args;
pub(crate) mod call;
pub mod error;
pub mod groups;
pub mod render;
pub mod schema;
pub mod server;
pub mod surface;
pub mod tasks;
pub mod tools;
pub mod window;
