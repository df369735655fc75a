//! Configuration: the command line (`cli`, parsed into `Flags`) and the
//! settings every component is built from (`settings`), made from it once
//! at start. Only this module and `app.rs` read `Flags` (and `main.rs`,
//! which parses them and picks the command); everything else takes ready
//! settings.

pub mod choices;
mod cli;
pub mod commands;
pub mod ready;
pub mod settings;
pub mod stores;
pub mod tokens;

pub use cli::*;
