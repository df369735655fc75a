//! The durable store of sessions and their cells, so that after a restart
//! sessions can be listed as dormant and rebuilt by re-running their cells.
//!
//! One SQLite database per (workspace, principal) in the state directory,
//! guarded by a flock so that two servers on one workspace never write the
//! same database. Writes come from async code holding locks, so they never
//! touch the disk on the caller's thread: they queue to one writer thread
//! that commits whatever is queued in one transaction. A full queue drops
//! the write (the store is a convenience; the live session is the truth).

mod schema;
mod state_dir;
mod states;
mod writer;

pub use state_dir::check_state_dir;
use state_dir::{StateDir, lock, remove_unused};
pub use states::StatesDir;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};
use schema::Op;
use writer::Writer;

pub use schema::SUPPORTED_VERSION;

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// --state-dir: created (with parents) mode 0700 if missing; refused if
    /// it is not a directory owned by the current euid, or is group/world
    /// writable.
    pub dir: PathBuf,
    /// The canonical workspace path (the key, with principal).
    pub workspace: PathBuf,
    /// Who owns the sessions: [A-Za-z0-9_-], 1-64 chars.
    pub principal: String,
    /// Cells kept per session: cells off the head's path go first, then the
    /// path's oldest.
    pub max_cells_per_session: usize,
    /// Sessions not updated for longer are deleted at open.
    pub keep: Duration,
    /// At most this many sessions are kept (the most recently updated).
    pub max_sessions: usize,
    /// Retention: the store's live pages fit in this many bytes; the least
    /// recently updated sessions go first (the last one left loses its oldest
    /// cells instead).
    pub max_bytes: u64,
}

#[derive(Debug)]
pub enum Opened {
    Ready(Store),
    /// Another live process holds this workspace's store lock; `path` is the
    /// database it guards.
    Locked {
        path: PathBuf,
        holder_pid: Option<u32>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {action} {}: {source}; check --state-dir (its permissions and free space)", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the session store's database failed: {0}; if it is damaged, move it aside or use another --state-dir"
    )]
    Sqlite(#[from] rusqlite::Error),
    #[error("{0}")]
    Unsafe(String),
    #[error("{0}")]
    Invalid(String),
    #[error(
        "the session store was written by a newer ferrepl (schema {found}, this one knows {supported}); use another --state-dir or upgrade ferrepl"
    )]
    Schema { found: i64, supported: i64 },
    #[error(
        "the session store {} belongs to workspace {}, not {} (their hashed names collide); use another --state-dir",
        path.display(), stored.display(), expected.display()
    )]
    WrongWorkspace {
        path: PathBuf,
        stored: PathBuf,
        expected: PathBuf,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub name: String,
    /// "python" or "r".
    pub language: String,
    /// The session's own options as JSON, or {}: opaque to the store.
    pub options: serde_json::Value,
    /// The cell whose state the interpreter holds (None: a fresh interpreter).
    pub head: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CellRecord {
    pub id: u64,
    pub parent: Option<u64>,
    /// {"code": "..."} or {"file": "...", "args": [...]}: opaque to the store.
    pub source: serde_json::Value,
    /// False when the code was too long to keep whole (see MAX_CODE_BYTES).
    pub replayable: bool,
    /// "ok", "error", "interrupted", "crashed", ...
    pub status: String,
    pub elapsed_ms: f64,
    /// Seconds since the Unix epoch.
    pub finished_unix: f64,
    /// A bounded preview of the output, cut again at MAX_SUMMARY_CHARS chars.
    pub summary: String,
    /// Image references, e.g. [{"sha": "...", "bytes": 1234}]: opaque.
    pub images: serde_json::Value,
}

/// Cell source JSON longer than this is stored cut to a stub
/// {"code": "<first 4000 chars>"} with replayable = false.
pub const MAX_CODE_BYTES: usize = 256 * 1024;
pub const MAX_SUMMARY_CHARS: usize = 2000;

#[derive(Debug, Clone)]
pub struct StoredSession {
    pub record: SessionRecord,
    pub updated_unix: f64,
    /// Every stored cell of the session, by id ascending.
    pub cells: Vec<CellRecord>,
}

/// Writes queued beyond this are dropped rather than blocking the caller.
const QUEUE: usize = 4096;
/// How long dropping the Store waits for queued writes to commit.
const DROP_WAIT: Duration = Duration::from_secs(5);

pub struct Store {
    path: PathBuf,
    /// `<store>.states/`, held open (None if it could not be made).
    states: Option<std::sync::Arc<StatesDir>>,
    tx: Option<SyncSender<Op>>,
    dropped: AtomicU64,
    /// The writer thread, and a channel that disconnects when it ends (a
    /// JoinHandle cannot be joined with a timeout). In a Mutex only so that
    /// the Store is Sync.
    writer: Mutex<Option<(JoinHandle<()>, Receiver<()>)>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens (creating) `<dir>/<FNV-1a of the workspace, 16 hex>-<principal>.sqlite3`
    /// under an exclusive flock on `<that>.lock`, migrates its schema, checks
    /// its workspace and applies retention.
    pub fn open(cfg: &StoreConfig) -> Result<Opened, StoreError> {
        check_principal(&cfg.principal)?;
        let dir = StateDir::open(&cfg.dir)?;
        remove_unused(&dir, cfg.keep);
        let hash = fnv1a(cfg.workspace.as_os_str().as_bytes());
        let name = format!("{hash:016x}-{}.sqlite3", cfg.principal);
        let path = dir.real.join(&name);
        let lock = match lock(&dir, &format!("{name}.lock"))? {
            Ok(lock) => lock,
            Err(holder_pid) => return Ok(Opened::Locked { path, holder_pid }),
        };
        // Created here, not by SQLite, so that it is never readable by others.
        dir.create_private(&name)?;
        // By the directory's real path, with no link allowed in it: a
        // component swapped for a symbolic link since is refused.
        let mut conn =
            Connection::open_with_flags(&path, open_flags() | OpenFlags::SQLITE_OPEN_CREATE)?;
        schema::configure(&conn)?;
        schema::prepare(&mut conn, &path, &cfg.workspace)?;
        schema::apply_retention(&mut conn, cfg, now_unix())?;
        for suffix in ["", "-wal", "-shm"] {
            dir.restrict(&format!("{name}{suffix}"))?;
        }
        let states_name = format!("{hash:016x}-{}.states", cfg.principal);
        let states = match StatesDir::open_in(&dir.fd, &dir.real, &states_name) {
            Ok(s) => Some(std::sync::Arc::new(s)),
            Err(e) => {
                tracing::warn!(
                    "saved states are off: cannot open {}: {e}",
                    dir.real.join(&states_name).display()
                );
                None
            }
        };
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let writer = Writer::new(conn, path.clone(), cfg.max_cells_per_session, cfg.max_bytes);
        let thread = std::thread::Builder::new()
            .name("ferrepl-store".into())
            .spawn(move || {
                // Dropped when the thread ends, however it ends.
                let _done = done_tx;
                writer.run(rx);
                // The lock outlives the connection: another server may open
                // the database only once this one has closed it.
                drop(lock);
            })
            .map_err(io("start the writer thread for", &path))?;
        Ok(Opened::Ready(Store {
            path,
            states,
            tx: Some(tx),
            dropped: AtomicU64::new(0),
            writer: Mutex::new(Some((thread, done_rx))),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory of this store's saved states, held open.
    pub fn states(&self) -> Option<std::sync::Arc<StatesDir>> {
        self.states.clone()
    }

    /// Every stored session with its cells, by name. It reads what is
    /// committed: writes still queued are not seen (flush first).
    pub fn load(&self) -> Result<Vec<StoredSession>, StoreError> {
        self.load_where(None)
    }

    /// The stored session named `name`, if there is one.
    pub fn load_session(&self, name: &str) -> Result<Option<StoredSession>, StoreError> {
        Ok(self.load_where(Some(name))?.pop())
    }

    fn load_where(&self, only: Option<&str>) -> Result<Vec<StoredSession>, StoreError> {
        let mut conn = Connection::open_with_flags(&self.path, open_flags())?;
        conn.busy_timeout(Duration::from_millis(2000))?;
        schema::load(&mut conn, only)
    }

    /// Upserts by name (language, options, head; updated = now).
    pub fn put_session(&self, record: SessionRecord) {
        self.send(Op::Session(record, now_unix()));
    }

    /// Inserts or replaces a cell of `session` (creating a minimal python
    /// session if there is none) and, when `advance_head`, moves the head
    /// to it.
    pub fn put_cell(&self, session: &str, cell: CellRecord, advance_head: bool) {
        self.send(Op::Cell(session.to_owned(), cell, advance_head, now_unix()));
    }

    pub fn set_head(&self, session: &str, head: Option<u64>) {
        self.send(Op::Head(session.to_owned(), head, now_unix()));
    }

    /// Gives session `from` and its cells the name `to` (which must be free).
    pub fn rename_session(&self, from: &str, to: &str) {
        self.send(Op::Rename(from.to_owned(), to.to_owned()));
    }

    /// Deletes the session and all its cells.
    pub fn delete_session(&self, session: &str) {
        self.send(Op::Delete(session.to_owned()));
    }

    /// Blocks until every write queued before this call is committed, at
    /// most `timeout`; returns whether it got there.
    pub fn flush(&self, timeout: Duration) -> bool {
        // A day stands for "forever" without overflowing Instant.
        let deadline = Instant::now() + timeout.min(Duration::from_secs(86_400));
        let Some(tx) = &self.tx else { return false };
        let (reply, answer) = mpsc::channel();
        let mut op = Op::Flush(reply);
        loop {
            match tx.try_send(op) {
                Ok(()) => {
                    self.wake_writer();
                    break;
                }
                // The queue drains at disk speed: a short wait for room is
                // what the caller asked for.
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    op = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return false,
            }
        }
        answer
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or(false)
    }

    /// Ends the writer's gathering window at once (a flush is waiting).
    fn wake_writer(&self) {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((thread, _)) = writer.as_ref() {
            thread.thread().unpark();
        }
    }

    fn send(&self, op: Op) {
        let Some(tx) = &self.tx else { return };
        let why = match tx.try_send(op) {
            Ok(()) => return,
            Err(TrySendError::Full(_)) => "is behind",
            Err(TrySendError::Disconnected(_)) => "has stopped writing",
        };
        let n = self.dropped.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(100) {
            tracing::warn!(
                "the session store {} {why}: {} write(s) dropped so far; restored sessions may miss recent cells",
                self.path.display(),
                n + 1
            );
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Closing the queue ends the writer once it has committed the rest.
        drop(self.tx.take());
        self.wake_writer();
        let writer = self
            .writer
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let Some((thread, done)) = writer.take() else {
            return;
        };
        match done.recv_timeout(DROP_WAIT) {
            Err(RecvTimeoutError::Timeout) => tracing::warn!(
                "the session store {} is still writing after {DROP_WAIT:?}; left to finish in the background",
                self.path.display()
            ),
            _ => {
                if thread.join().is_err() {
                    tracing::warn!("the session store's writer thread panicked");
                }
            }
        }
    }
}

/// 1-64 of A-Z, a-z, 0-9, '_' and '-': a principal names a file (tenants
/// are principals, and name their workspace directory too).
pub fn is_valid_principal(principal: &str) -> bool {
    (1..=64).contains(&principal.len())
        && principal
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_principal(principal: &str) -> Result<(), StoreError> {
    if is_valid_principal(principal) {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "principal {principal:?} is not 1-64 of A-Z, a-z, 0-9, '_' and '-'; it names a file, so nothing else is allowed"
        )))
    }
}

/// How the store's database is opened: never through a symbolic link.
fn open_flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW
}

/// FNV-1a, 64-bit: stable across builds and platforms, unlike std's hasher,
/// since it names files that must be found again after an upgrade.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io {
        action,
        path,
        source,
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests;
