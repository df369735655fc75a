//! Output of cells and jobs: capture with fences and head/tail bounds
//! (`capture`), the full log kept for reading back (`log`), and the text
//! cleaning every result goes through (`text`), the secrets ferrepl holds
//! kept out of text it passes on from their holders (`redact`). Shared by sessions and jobs;
//! which tool reads the rest is said by the caller.

pub mod capture;
pub mod image;
pub mod log;
pub mod redact;
pub mod text;

pub use capture::*;
