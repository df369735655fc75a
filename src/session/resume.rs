//! A rebuild under way, as the calls see it. A call that reaches a session
//! whose state must be rebuilt (a branch without a checkpoint, a confirmed
//! python_sessions rebuild) starts a task that re-runs its path
//! (`rebuild.rs`); a cell's code is queued after it as the next cell, and
//! the call returns within its window, `running`, with a note on the
//! rebuild. python_wait follows it to the cell's own result, whose notes
//! give the rebuild's account; an interrupt (or the client cancelling the
//! call) stops the rebuild, and the queued code then does not run. A
//! rebuild is never shown as a cell. A dormant session with a saved state
//! is loaded instead (`saved.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::durable::refused;
use super::error::SessionError;
use super::lifecycle::{Pending, Queued, Rebuilt, uncollected};
use super::manager::SessionManager;
use super::rebuild::{cells, preview, rebuild_size};
use super::report::CellReport;
use super::source::{CellSource, StoredSource};
use super::state::{Session, SessionState};
use crate::worker::Worker;

/// What a call that needs the interpreter finds.
pub(super) enum Ready {
    /// It holds the session's state.
    Worker(Arc<Worker>),
    /// A rebuild runs (started by this call if the state needed it); the
    /// call's code, if it gave one, is queued after it.
    Rebuilding(Arc<Worker>),
}

impl SessionManager {
    /// The session's worker for a call that needs its state: a session
    /// that must be rebuilt starts its rebuild, and `code` (if given) is
    /// queued after a rebuild under way.
    pub(super) async fn ready(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        code: Option<&CellSource<'_>>,
    ) -> Result<Ready, SessionError> {
        refused(sess)?;
        if sess.lock().lifecycle.is_dormant() {
            // Its saved state, loaded: no cell runs (else the choice).
            self.resume_saved(sess).await?;
        }
        let worker = self.ensure_worker(sess).await?;
        let _guard = sess.start_lock.lock().await;
        let mut st = sess.lock();
        self.refresh(sess, &mut st);
        let worker = st.worker.clone().unwrap_or(worker);
        if !st.lifecycle.is_rebuilding() {
            if !st.lifecycle.pending().is_some_and(Pending::rebuilds_on_use) {
                return Ok(Ready::Worker(worker));
            }
            self.begin_rebuild(sess, &mut st, &worker);
        }
        if let Some(code) = code {
            self.queue(sess, &mut st, code)?;
        }
        Ok(Ready::Rebuilding(worker))
    }

    /// Queues a call's code after the rebuild under way, as the next cell;
    /// refused when another call's code is queued already.
    fn queue(
        &self,
        sess: &Session,
        st: &mut SessionState,
        code: &CellSource<'_>,
    ) -> Result<u64, SessionError> {
        let number = st.inbox.next_number();
        let Some(rb) = st.lifecycle.rebuild_mut() else {
            return Err(SessionError::Idle(sess.language, sess.name.clone()));
        };
        if rb.queued.is_some() {
            return Err(sess.rebuilding_error(rb));
        }
        if let Some(prev) = rb.kept.take() {
            rb.aside.extend(uncollected(prev));
        }
        rb.queued = Some(Queued {
            number,
            source: Arc::new(StoredSource::of(code)),
            since: Instant::now(),
        });
        st.inbox.advance();
        st.last_used = Instant::now();
        Ok(number)
    }

    /// Waits (at most `wait`) for the rebuild under way to end; the worker
    /// then, or the refusal saying it still runs.
    pub(super) async fn await_rebuild(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        wait: Duration,
    ) -> Result<Arc<Worker>, SessionError> {
        let Some(id) = sess.lock().lifecycle.rebuild().map(|r| r.id) else {
            return Ok(worker.clone());
        };
        self.watch(sess, worker, wait, |st, timed_out| {
            match st.lifecycle.rebuild().filter(|r| r.id == id) {
                None => Some(Ok(st.worker.clone().unwrap_or_else(|| worker.clone()))),
                Some(rb) if timed_out => Some(Err(sess.rebuilding_error(rb))),
                Some(_) => None,
            }
        })
        .await
    }

    /// Stops the rebuild under way (for `reason`): the cell it re-runs is
    /// interrupted, the rest are not re-run and the queued code does not
    /// run. Returns the worker once the rebuild has ended, or None when
    /// no rebuild runs.
    pub(super) async fn stop_rebuild(
        &self,
        sess: &Arc<Session>,
        reason: &str,
    ) -> Option<Arc<Worker>> {
        let (id, worker, cell) = {
            let mut st = sess.lock();
            self.refresh(sess, &mut st);
            let cell = st
                .inbox
                .running
                .as_ref()
                .filter(|r| r.replay)
                .map(|r| r.number);
            let worker = st.worker.clone();
            let rb = st.lifecycle.rebuild_mut()?;
            rb.stop = Some(reason.to_string());
            (rb.id, worker?, cell)
        };
        if let Some(cell) = cell {
            self.stop_cell(sess, &worker, cell, None).await;
        }
        let bound = self.limits.max_wait;
        self.watch(sess, &worker, bound, |st, timed_out| {
            let gone = st.lifecycle.rebuild().is_none_or(|r| r.id != id);
            (gone || timed_out).then_some(())
        })
        .await;
        Some(worker)
    }

    /// python_wait's interrupt on a rebuilding session: the queued cell's
    /// result (not run), or the account when no code was queued.
    pub(super) async fn interrupt_rebuild(
        &self,
        sess: &Arc<Session>,
    ) -> Option<Result<CellReport, SessionError>> {
        let reason = format!(
            "interrupted by {} with interrupt: true",
            sess.language.wait_tool()
        );
        let worker = self.stop_rebuild(sess, &reason).await?;
        {
            let mut st = sess.lock();
            if !st.lifecycle.is_rebuilding() && st.inbox.completed.is_none() {
                let notes = std::mem::take(&mut st.notes);
                return Some(Err(SessionError::Invalid(format!(
                    "{} No code was queued after it; run code with {}.",
                    notes.join(" "),
                    sess.language.exec_tool()
                ))));
            }
        }
        Some(self.collect(sess, &worker, Duration::ZERO).await)
    }

    /// The session's worker for a call that needs its state (python_inspect,
    /// ...): a session that must be rebuilt is, within the call's default
    /// window; the account waits in the notes for the next result.
    pub(super) async fn ready_worker(
        self: &Arc<Self>,
        sess: &Arc<Session>,
    ) -> Result<Arc<Worker>, SessionError> {
        match self.ready(sess, None).await? {
            Ready::Worker(worker) => Ok(worker),
            Ready::Rebuilding(worker) => {
                self.await_rebuild(sess, &worker, self.wait_window(None))
                    .await
            }
        }
    }

    /// python_sessions rebuild: says which cells a rebuild of a crashed or
    /// dormant session re-runs, and with `confirm` re-runs them, within the
    /// default window; past it the rebuild goes on and the message says how
    /// to follow it.
    pub async fn rebuild(
        self: &Arc<Self>,
        name: &str,
        confirm: bool,
    ) -> Result<String, SessionError> {
        let sess = self.existing(name)?;
        let under_way = sess.lock().lifecycle.is_rebuilding();
        if !under_way {
            let Some(pending) = sess.lock().lifecycle.pending() else {
                return Err(SessionError::Invalid(format!(
                    "session '{name}' has nothing to rebuild: its interpreter holds the state of its cells (python_history lists them); python_sessions action=reset starts it afresh"
                )));
            };
            if !confirm {
                let st = sess.lock();
                return Ok(preview(&sess, &st, self.durable.max_cells));
            }
            let size = rebuild_size(&sess.lock());
            if size > self.durable.max_cells {
                // Refused whole, the session left as it is (still dormant).
                return Err(SessionError::Invalid(format!(
                    "a rebuild of session '{name}' would re-run {}, more than the {} one may (--resume-max-cells); nothing was run: raise the flag or reset the session",
                    cells(size),
                    cells(self.durable.max_cells)
                )));
            }
            refused(&sess)?;
            let worker = self.ensure_worker(&sess).await?;
            let _guard = sess.start_lock.lock().await;
            let mut st = sess.lock();
            if !st.lifecycle.is_rebuilding() && st.lifecycle.pending() == Some(pending) {
                // The account replaces the note that a fresh interpreter started.
                st.notes.clear();
                self.begin_rebuild(&sess, &mut st, &worker);
            }
        }
        let Some((id, worker)) = ({
            let st = sess.lock();
            st.lifecycle.rebuild().map(|r| r.id).zip(st.worker.clone())
        }) else {
            return self.rebuilt_account(&sess, None);
        };
        match self
            .await_rebuild(&sess, &worker, self.wait_window(None))
            .await
        {
            Ok(_) => self.rebuilt_account(&sess, Some(id)),
            Err(SessionError::Rebuilding(now)) => Ok(format!(
                "{}. The next result says what was re-run.",
                now.replacen("session", "Session", 1)
            )),
            Err(e) => Err(e),
        }
    }

    /// The account of rebuild `id` (or the last one), taken out of the
    /// notes unless a queued cell's result carries it.
    fn rebuilt_account(&self, sess: &Session, id: Option<u64>) -> Result<String, SessionError> {
        let mut st = sess.lock();
        match st.lifecycle.rebuilt().cloned() {
            Some(Rebuilt {
                id: done,
                text,
                queued,
            }) if id.is_none_or(|id| id == done) => {
                if !queued {
                    st.notes.retain(|n| *n != text);
                }
                Ok(text)
            }
            _ => Err(SessionError::Invalid(format!(
                "session '{}' has nothing to rebuild: its interpreter holds the state of its cells",
                sess.name
            ))),
        }
    }
}
