//! Named sessions, each backed by one worker process at a time.
//!
//! Results are pulled, not pushed: worker events wait in the worker's queue
//! until a call (exec, wait, input, interrupt, sessions) looks at the session,
//! so a cell that finishes while nobody waits keeps its result for the next
//! call. Every wait here is bounded and async.
//!
//! The files depend in one direction (`scripts/module-graph.py session`):
//! plain data at the bottom (this file's names, `settings`, `error`,
//! `report`, `source`, `gate`, `pool`, `lineage`, `checkpoints`, `kept`,
//! `inbox`, `lifecycle`, `state`, `manager`), then the operations, each
//! using only those below it: `durable` (the store), `events` (worker events
//! into results), `running` (sending a cell, following it), `launch`
//! (interpreters), `stop`, `kernel_restart`, `saved`, `shutdown`,
//! `rebuild`, `branch`, `resume`, `limits`, `stored`, `clients`,
//! `registry`, and at the top the calls of the tools: `cells`, `control`,
//! `export`, `view`.

mod branch;
mod cells;
mod checkpoints;
mod client_sandbox;
pub mod clients;
mod control;
mod durable;
mod error;
mod events;
mod export;
mod foreign;
mod foreign_shown;
pub mod gate;
mod hints;
mod inbox;
mod kept;
mod kernel_restart;
mod kernel_tool;
mod launch;
mod lifecycle;
mod limits;
mod lineage;
mod manager;
mod pool;
mod preinstall_queue;
mod preinstall_wait;
mod rebuild;
mod registry;
pub mod report;
mod resume;
mod running;
mod saved;
mod settings;
mod shutdown;
mod source;
mod state;
mod stop;
mod stored;
pub mod view;

pub use error::SessionError;
pub use export::{Export, ExportFormat};
pub use kept::HistoryEntry;
pub use lineage::ranges as id_ranges;
pub use manager::SessionManager;
pub use settings::{Durability, Limits};
pub use source::{CellSource, StoredSource};
pub use state::{Session, SessionInfo, SessionOptions};

use crate::worker::Language;

pub const DEFAULT_SESSION: &str = "default";
/// R's shared default session; a client's own is `r-N` beside `default-N`.
pub const DEFAULT_R_SESSION: &str = "r";

/// The language of a default session name (the shared one, or a client's
/// own under `--default-session per-client`): those exist as soon as they
/// are named, so inspecting or resetting one never fails as unknown.
pub fn default_language(name: &str) -> Option<Language> {
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if name == DEFAULT_SESSION || numbered("default-") {
        Some(Language::Python)
    } else if name == DEFAULT_R_SESSION || numbered("r-") {
        Some(Language::R)
    } else {
        None
    }
}

pub fn is_default_name(name: &str) -> bool {
    default_language(name).is_some()
}

/// The default session of `lang` that goes with Python's default `python_default`.
pub fn default_for(lang: Language, python_default: &str) -> String {
    match lang {
        Language::Python => python_default.to_string(),
        Language::R => match python_default.strip_prefix("default-") {
            Some(n) => format!("r-{n}"),
            None => DEFAULT_R_SESSION.to_string(),
        },
    }
}

/// A session name: 1-64 letters, digits, '_', '-' or '.'.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}
