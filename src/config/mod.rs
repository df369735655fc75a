//! Configuration: the command line (`cli`) and the settings every component
//! is built from (`settings`), made from it once at start.

mod cli;
pub mod commands;
pub mod settings;
pub mod tokens;

pub use cli::*;
