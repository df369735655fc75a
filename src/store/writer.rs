//! The store's writer thread: it owns the write connection and commits
//! what callers queue, a short window of writes per transaction.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::StoreError;
use super::schema::{self, Op};

/// The store's size is checked against its bound after this many batches.
const SIZE_CHECK_EVERY: usize = 32;
/// How long the writer gathers writes into one transaction.
const GROUP_WINDOW: Duration = Duration::from_millis(20);
/// Bounds one transaction when producers keep the queue full.
const MAX_BATCH: usize = 4096;
/// Owns the write connection on its own thread.
pub(super) struct Writer {
    conn: Connection,
    path: PathBuf,
    cap: usize,
    max_bytes: u64,
    /// Batches committed since the size was last checked.
    since_size_check: usize,
    /// Cell writes per session since its cap was last enforced.
    inserts: HashMap<String, usize>,
}

impl Writer {
    pub(super) fn new(conn: Connection, path: PathBuf, cap: usize, max_bytes: u64) -> Self {
        Self {
            conn,
            path,
            cap,
            max_bytes,
            since_size_check: 0,
            inserts: HashMap::new(),
        }
    }

    pub(super) fn run(mut self, rx: Receiver<Op>) {
        while let Ok(first) = rx.recv() {
            // Group commit: writes that come within a short window share one
            // transaction (a call's cell and head writes arrive a few
            // hundred microseconds apart). They wait in the queue without
            // waking this thread (a wake per write costs every call a
            // context switch); a flush unparks it and ends the window.
            let deadline = Instant::now() + GROUP_WINDOW;
            let mut flush = matches!(first, Op::Flush(_));
            let mut batch = vec![first];
            loop {
                while batch.len() < MAX_BATCH && !flush {
                    let Ok(op) = rx.try_recv() else { break };
                    flush = matches!(op, Op::Flush(_));
                    batch.push(op);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if flush || batch.len() >= MAX_BATCH || left.is_zero() {
                    break;
                }
                std::thread::park_timeout(left);
            }
            self.commit(batch);
        }
    }

    /// One transaction for the batch. If a write fails (an id SQLite cannot
    /// hold), the batch is done again with each write in its own savepoint,
    /// so that the bad one loses only itself.
    fn commit(&mut self, batch: Vec<Op>) {
        let waiters: Vec<_> = batch
            .iter()
            .filter_map(|op| match op {
                Op::Flush(reply) => Some(reply.clone()),
                _ => None,
            })
            .collect();
        let mut failed = 0usize;
        let mut first_error = None;
        // The counts a failed attempt changed are put back before the retry.
        let counts = self.inserts.clone();
        let whole = (|| -> Result<(), StoreError> {
            let tx = self.conn.transaction()?;
            for op in &batch {
                schema::apply(&tx, op, &mut self.inserts, self.cap)?;
            }
            tx.commit()?;
            Ok(())
        })();
        let result = match whole {
            Ok(()) => Ok(()),
            Err(_) => (|| -> Result<(), StoreError> {
                self.inserts = counts;
                let mut tx = self.conn.transaction()?;
                for op in &batch {
                    let sp = tx.savepoint()?;
                    match schema::apply(&sp, op, &mut self.inserts, self.cap) {
                        Ok(()) => sp.commit()?,
                        Err(e) => {
                            failed += 1;
                            first_error.get_or_insert(e);
                        }
                    }
                }
                tx.commit()?;
                Ok(())
            })(),
        };
        if let Some(e) = first_error {
            tracing::warn!(
                "the session store {}: {failed} write(s) not saved: {e}",
                self.path.display()
            );
        }
        if let Err(e) = &result {
            tracing::warn!(
                "the session store {}: a batch of writes was lost: {e}",
                self.path.display()
            );
        }
        self.since_size_check += 1;
        if self.since_size_check >= SIZE_CHECK_EVERY {
            self.since_size_check = 0;
            match schema::fit_bytes(&self.conn, self.max_bytes) {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    "the session store {} is over its size bound: {n} oldest session(s) or cell batch(es) removed",
                    self.path.display()
                ),
                Err(e) => tracing::warn!("the session store {}: {e}", self.path.display()),
            }
        }
        for waiter in waiters {
            let _ = waiter.send(result.is_ok());
        }
    }
}
