//! Everything that knows the store's tables: the `meta` table (schema
//! version, workspace), the ordered migrations, the writes, the read-back and
//! retention. It runs on a connection its caller owns; the locking, the
//! files and the writer thread are in `mod.rs`.

use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;

use super::{
    CellRecord, MAX_CODE_BYTES, MAX_SUMMARY_CHARS, SessionRecord, StoreConfig, StoreError,
    StoredSession,
};

/// Entry N takes the schema from version N to N + 1. Append only: a store
/// written by a released ferrepl must migrate with the same statements.
const MIGRATIONS: &[&str] = &[
    // 1: sessions and their cells; a session's cells go with it.
    "CREATE TABLE sessions (
        name TEXT PRIMARY KEY,
        language TEXT NOT NULL,
        options TEXT NOT NULL,
        head INTEGER,
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE cells (
        session TEXT NOT NULL REFERENCES sessions(name) ON DELETE CASCADE,
        id INTEGER NOT NULL,
        parent INTEGER,
        source TEXT NOT NULL,
        replayable INTEGER NOT NULL,
        status TEXT NOT NULL,
        elapsed_ms REAL NOT NULL,
        finished REAL NOT NULL,
        summary TEXT NOT NULL,
        images TEXT NOT NULL,
        PRIMARY KEY (session, id)
    );",
];

/// The newest schema this build can read and write.
pub const SUPPORTED_VERSION: i64 = MIGRATIONS.len() as i64;

/// How much of an oversized cell's code its stub keeps, for the record.
const STUB_CHARS: usize = 4000;

/// A session's cell cap is enforced every this many cell writes to it, not
/// on each: pruning reads all of the session's cells.
pub(super) const PRUNE_EVERY: usize = 50;

/// A queued write, as the writer thread receives it; the f64 is the time
/// of the call, which stamps `updated`.
pub(super) enum Op {
    Session(SessionRecord, f64),
    Cell(String, CellRecord, bool, f64),
    Head(String, Option<u64>, f64),
    Delete(String),
    /// A session under another name, its cells with it.
    Rename(String, String),
    Flush(std::sync::mpsc::Sender<bool>),
}

/// Applies one write; `inserts` counts cell writes per session since its cap
/// was last enforced.
pub(super) fn apply(
    conn: &Connection,
    op: &Op,
    inserts: &mut HashMap<String, usize>,
    cap: usize,
) -> Result<(), StoreError> {
    match op {
        Op::Session(record, now) => upsert_session(conn, record, *now),
        Op::Cell(session, cell, advance_head, now) => {
            upsert_cell(conn, session, cell, *advance_head, *now)?;
            let count = inserts.entry(session.clone()).or_default();
            *count += 1;
            if *count >= PRUNE_EVERY {
                *count = 0;
                prune_cells(conn, session, cap)?;
            }
            Ok(())
        }
        Op::Head(session, head, now) => update_head(conn, session, *head, *now),
        Op::Delete(session) => {
            inserts.remove(session);
            delete_session(conn, session)
        }
        Op::Rename(from, to) => {
            if let Some(count) = inserts.remove(from) {
                inserts.insert(to.clone(), count);
            }
            rename_session(conn, from, to)
        }
        Op::Flush(_) => Ok(()),
    }
}

/// The connection's settings: WAL so that `load`'s reader never waits on the
/// writer, NORMAL sync (a crash may lose the last commits, never corrupt),
/// and foreign keys, which SQLite leaves off and the cascade needs.
pub(super) fn configure(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(Duration::from_millis(2000))?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!("the session store could not use WAL (journal mode {mode})");
    }
    // A small page cache (512 KiB, SQLite's default is 2 MiB): the store is
    // written far more than read, and the server's memory is budgeted.
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA cache_size = -512;",
    )?;
    Ok(())
}

/// Brings the schema up to date and checks that the database belongs to
/// `workspace`, in one immediate transaction so that a half-migrated store
/// is never left behind.
pub(super) fn prepare(
    conn: &mut Connection,
    db: &Path,
    workspace: &Path,
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // `value` is untyped: the version is an integer, the workspace a blob
    // (paths need not be UTF-8).
    tx.execute_batch("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value)")?;
    let found: i64 = tx
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(0);
    if found > SUPPORTED_VERSION {
        return Err(StoreError::Schema {
            found,
            supported: SUPPORTED_VERSION,
        });
    }
    let stored: Option<Vec<u8>> = tx
        .query_row("SELECT value FROM meta WHERE key = 'workspace'", [], |r| {
            r.get(0)
        })
        .optional()?;
    let expected = workspace.as_os_str().as_bytes();
    match stored {
        Some(stored) if stored != expected => {
            return Err(StoreError::WrongWorkspace {
                path: db.to_path_buf(),
                stored: PathBuf::from(std::ffi::OsString::from_vec(stored)),
                expected: workspace.to_path_buf(),
            });
        }
        Some(_) => {}
        None => {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('workspace', ?1)",
                [expected],
            )?;
        }
    }
    for (version, sql) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [version as i64 + 1],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Deletes what the configuration no longer keeps: sessions idle longer
/// than `keep`, all but the `max_sessions` most recently updated, and each
/// remaining session's cells beyond `max_cells_per_session`.
pub(super) fn apply_retention(
    conn: &mut Connection,
    cfg: &StoreConfig,
    now: f64,
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute(
        "DELETE FROM sessions WHERE updated < ?1",
        [now - cfg.keep.as_secs_f64()],
    )?;
    tx.execute(
        "DELETE FROM sessions WHERE name NOT IN
         (SELECT name FROM sessions ORDER BY updated DESC, name LIMIT ?1)",
        [i64::try_from(cfg.max_sessions).unwrap_or(i64::MAX)],
    )?;
    let names: Vec<String> = tx
        .prepare("SELECT name FROM sessions")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for name in &names {
        prune_cells(&tx, name, cfg.max_cells_per_session)?;
    }
    fit_bytes(&tx, cfg.max_bytes)?;
    tx.commit()?;
    Ok(())
}

/// Removes the least recently updated sessions until the store's live
/// pages fit in `max_bytes`; the last session left loses half its cells
/// (the oldest, off its head's path first) at each step instead. Returns
/// how many steps it took.
pub(super) fn fit_bytes(conn: &Connection, max_bytes: u64) -> Result<usize, StoreError> {
    let mut steps = 0;
    while steps < 10_000 {
        let used: i64 = conn.query_row(
            "SELECT ((SELECT page_count FROM pragma_page_count()) - \
             (SELECT freelist_count FROM pragma_freelist_count())) * \
             (SELECT page_size FROM pragma_page_size())",
            [],
            |r| r.get(0),
        )?;
        if u64::try_from(used).unwrap_or(0) <= max_bytes {
            break;
        }
        let oldest: Vec<(String, i64)> = conn
            .prepare(
                "SELECT name, (SELECT count(*) FROM cells WHERE session = name)
                 FROM sessions ORDER BY updated, name LIMIT 2",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        match oldest.as_slice() {
            [(name, _), _, ..] => {
                conn.execute("DELETE FROM sessions WHERE name = ?1", [name])?;
            }
            [(name, cells)] if *cells > 1 => {
                prune_cells(conn, name, usize::try_from(cells / 2).unwrap_or(0))?;
            }
            _ => break,
        }
        steps += 1;
    }
    Ok(steps)
}

/// Cuts `session` down to `cap` cells. The head's path is what a rebuild
/// replays, so cells off it go first (oldest first); a path longer than
/// `cap` loses its oldest cells, those nearest the root.
fn prune_cells(conn: &Connection, session: &str, cap: usize) -> Result<usize, StoreError> {
    let count: i64 = conn.query_row(
        "SELECT count(*) FROM cells WHERE session = ?1",
        [session],
        |r| r.get(0),
    )?;
    if usize::try_from(count).unwrap_or(0) <= cap {
        return Ok(0);
    }
    let head: Option<i64> = conn
        .query_row(
            "SELECT head FROM sessions WHERE name = ?1",
            [session],
            |r| r.get(0),
        )
        .optional()?
        .flatten();
    // Newest first, so that filling the budget keeps the newest.
    let rows: Vec<(i64, Option<i64>)> = conn
        .prepare("SELECT id, parent FROM cells WHERE session = ?1 ORDER BY id DESC")?
        .query_map([session], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let parents: HashMap<i64, Option<i64>> = rows.iter().copied().collect();
    let mut path = Vec::new();
    let mut seen = HashSet::new();
    let mut at = head.filter(|h| parents.contains_key(h));
    // `seen` guards against a parent cycle, which only a damaged store has.
    while let Some(id) = at.filter(|id| seen.insert(*id)) {
        path.push(id);
        at = parents
            .get(&id)
            .copied()
            .flatten()
            .filter(|p| parents.contains_key(p));
    }
    let mut keep: HashSet<i64> = path.iter().take(cap).copied().collect();
    for (id, _) in &rows {
        if keep.len() >= cap {
            break;
        }
        keep.insert(*id);
    }
    let mut delete = conn.prepare_cached("DELETE FROM cells WHERE session = ?1 AND id = ?2")?;
    let mut deleted = 0;
    for (id, _) in rows.iter().filter(|(id, _)| !keep.contains(id)) {
        deleted += delete.execute(params![session, id])?;
    }
    Ok(deleted)
}

fn upsert_session(conn: &Connection, record: &SessionRecord, now: f64) -> Result<(), StoreError> {
    let head = record.head.map(|h| to_i64(h, "head")).transpose()?;
    // An upsert, not INSERT OR REPLACE: replacing the row would delete it
    // first, and the cascade would take its cells along.
    conn.prepare_cached(
        "INSERT INTO sessions (name, language, options, head, created, updated)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5)
         ON CONFLICT (name) DO UPDATE SET language = excluded.language,
             options = excluded.options, head = excluded.head, updated = excluded.updated",
    )?
    .execute(params![
        record.name,
        record.language,
        record.options.to_string(),
        head,
        now
    ])?;
    Ok(())
}

fn upsert_cell(
    conn: &Connection,
    session: &str,
    cell: &CellRecord,
    advance_head: bool,
    now: f64,
) -> Result<(), StoreError> {
    let id = to_i64(cell.id, "cell id")?;
    let parent = cell.parent.map(|p| to_i64(p, "parent")).transpose()?;
    let (source, replayable) = fit_source(&cell.source, cell.replayable);
    conn.prepare_cached(
        "INSERT INTO sessions (name, language, options, head, created, updated)
         VALUES (?1, 'python', '{}', NULL, ?2, ?2) ON CONFLICT (name) DO NOTHING",
    )?
    .execute(params![session, now])?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO cells (session, id, parent, source, replayable, status,
             elapsed_ms, finished, summary, images)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        session,
        id,
        parent,
        source,
        replayable,
        cell.status,
        cell.elapsed_ms,
        cell.finished_unix,
        cut_chars(&cell.summary, MAX_SUMMARY_CHARS),
        cell.images.to_string(),
    ])?;
    conn.prepare_cached(
        "UPDATE sessions SET updated = ?2, head = CASE WHEN ?3 THEN ?4 ELSE head END
         WHERE name = ?1",
    )?
    .execute(params![session, now, advance_head, id])?;
    Ok(())
}

fn update_head(
    conn: &Connection,
    session: &str,
    head: Option<u64>,
    now: f64,
) -> Result<(), StoreError> {
    let head = head.map(|h| to_i64(h, "head")).transpose()?;
    conn.prepare_cached("UPDATE sessions SET head = ?2, updated = ?3 WHERE name = ?1")?
        .execute(params![session, head, now])?;
    Ok(())
}

/// The row is copied under the new name before the cells move to it (the
/// cells' foreign key has no ON UPDATE): a name taken already fails the
/// whole write, which changes nothing.
fn rename_session(conn: &Connection, from: &str, to: &str) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO sessions (name, language, options, head, created, updated)
         SELECT ?2, language, options, head, created, updated FROM sessions WHERE name = ?1",
    )?
    .execute([from, to])?;
    conn.prepare_cached("UPDATE cells SET session = ?2 WHERE session = ?1")?
        .execute([from, to])?;
    delete_session(conn, from)
}

fn delete_session(conn: &Connection, session: &str) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM sessions WHERE name = ?1")?
        .execute([session])?;
    Ok(())
}

/// Every session with its cells, read in one transaction so that a session
/// and its cells are of the same moment.
/// Every stored session with its cells, or only the one named `only`.
pub(super) fn load(
    conn: &mut Connection,
    only: Option<&str>,
) -> Result<Vec<StoredSession>, StoreError> {
    let tx = conn.transaction()?;
    let mut cells: HashMap<String, Vec<CellRecord>> = HashMap::new();
    {
        let mut stmt = tx.prepare(
            "SELECT session, id, parent, source, replayable, status, elapsed_ms, finished,
                    summary, images
             FROM cells WHERE ?1 IS NULL OR session = ?1 ORDER BY session, id",
        )?;
        let mut rows = stmt.query([only])?;
        while let Some(r) = rows.next()? {
            let session: String = r.get(0)?;
            let (Some(id), Ok(parent)) = (
                u64::try_from(r.get::<_, i64>(1)?).ok(),
                r.get::<_, Option<i64>>(2)?.map(u64::try_from).transpose(),
            ) else {
                tracing::warn!("session store: a cell of {session} has a negative id; skipped");
                continue;
            };
            let source = parse_json(&r.get::<_, String>(3)?);
            cells.entry(session).or_default().push(CellRecord {
                id,
                parent,
                replayable: r.get::<_, bool>(4)? && !source.is_null(),
                source,
                status: r.get(5)?,
                elapsed_ms: r.get(6)?,
                finished_unix: r.get(7)?,
                summary: r.get(8)?,
                images: parse_json(&r.get::<_, String>(9)?),
            });
        }
    }
    let mut sessions = Vec::new();
    {
        let mut stmt = tx
            .prepare("SELECT name, language, options, head, updated FROM sessions WHERE ?1 IS NULL OR name = ?1 ORDER BY name")?;
        let mut rows = stmt.query([only])?;
        while let Some(r) = rows.next()? {
            let name: String = r.get(0)?;
            let options = match parse_json(&r.get::<_, String>(2)?) {
                Value::Null => Value::Object(Default::default()),
                options => options,
            };
            sessions.push(StoredSession {
                cells: cells.remove(&name).unwrap_or_default(),
                record: SessionRecord {
                    language: r.get(1)?,
                    options,
                    head: r
                        .get::<_, Option<i64>>(3)?
                        .and_then(|h| u64::try_from(h).ok()),
                    name,
                },
                updated_unix: r.get(4)?,
            });
        }
    }
    Ok(sessions)
}

/// A column that no longer parses (a damaged store) reads as null rather
/// than failing the whole load: the other sessions are still worth having.
fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| {
        tracing::warn!("session store: a stored JSON value does not parse ({e}); read as null");
        Value::Null
    })
}

/// The source as stored, and whether it can still be replayed: source too
/// long to keep whole becomes a stub with the start of its code, kept so the
/// history still shows what ran.
fn fit_source(source: &Value, replayable: bool) -> (String, bool) {
    let text = source.to_string();
    if text.len() <= MAX_CODE_BYTES {
        return (text, replayable);
    }
    let code = match source.get("code").and_then(Value::as_str) {
        Some(code) => cut_chars(code, STUB_CHARS),
        None => cut_chars(&text, STUB_CHARS),
    };
    (serde_json::json!({ "code": code }).to_string(), false)
}

fn cut_chars(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| {
        StoreError::Invalid(format!(
            "{what} {value} is above {}, the largest SQLite can store",
            i64::MAX
        ))
    })
}
