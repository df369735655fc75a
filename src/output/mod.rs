//! Output of cells and jobs: capture with fences and head/tail bounds
//! (`capture`), the full log kept for reading back (`log`), and the text
//! cleaning every result goes through (`text`). Shared by sessions and jobs;
//! which tool reads the rest is said by the caller.

pub mod capture;
pub mod image;
pub mod log;
pub mod text;

pub use capture::*;
