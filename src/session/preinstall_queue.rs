//! Code queued behind `--preinstall`, by session: the table the manager
//! holds, filled and followed by `preinstall_wait.rs`. Only the types: it
//! knows nothing of the manager.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use tokio::task::JoinHandle;

use super::error::SessionError;
use super::report::CellReport;

/// A call's code queued behind the preinstall: the task that sends it once
/// the install has ended.
pub(super) struct Queued {
    pub(super) number: u64,
    pub(super) since: Instant,
    pub(super) task: JoinHandle<Result<CellReport, SessionError>>,
}

/// The queued code of each session that has some.
pub(super) type PreinstallQueue = Mutex<HashMap<String, Queued>>;
