//! Running cells, the calls of python_exec and python_wait (and R's):
//! exec (after a switch to `parent`, or queued after a rebuild), wait,
//! input, interrupt, and a client's cancel. Results are pulled: events
//! wait in the worker's queue until a call looks at the session
//! (`events.rs`); sending and following a cell: `running.rs`.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use super::error::SessionError;
use super::lifecycle::uncollected;
use super::manager::SessionManager;
use super::preinstall_wait::Behind;
use super::report::{CellReport, CellStatus};
use super::resume::Ready;
use super::source::{CellSource, StoredSource};
use super::state::{Session, SessionState};
use crate::worker::protocol::Request;
use crate::worker::{Language, Worker};

impl SessionManager {
    pub async fn exec(
        self: &Arc<Self>,
        name: &str,
        lang: Language,
        source: CellSource<'_>,
        parent: Option<u64>,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        self.gate.admit_work()?;
        let sess = self.get_or_create(name, lang)?;
        let wait = match self.behind_preinstall(&sess, &source, parent, wait).await? {
            Behind::Go(left) => left,
            Behind::Answer(report) => return Ok(*report),
        };
        self.exec_now(&sess, source, parent, wait).await
    }

    /// exec once nothing holds the interpreter back.
    pub(super) async fn exec_now(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        source: CellSource<'_>,
        parent: Option<u64>,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        let sess = sess.clone();
        if let Some(target) = parent {
            self.branch_to(&sess, target).await?;
        }
        let worker = match self.ready(&sess, Some(&source)).await? {
            Ready::Worker(worker) => worker,
            // Queued after the rebuild: followed like a running cell.
            Ready::Rebuilding(worker) => return self.collect(&sess, &worker, wait).await,
        };
        let (background, after, number) = {
            let mut st = sess.lock();
            self.refresh(&sess, &mut st);
            if let Some(busy) = sess.busy_now(&st) {
                return Err(busy);
            }
            let carried = st
                .inbox
                .completed
                .take()
                .map(uncollected)
                .unwrap_or_default();
            let number = st.inbox.next_number();
            let source = Arc::new(StoredSource::of(&source));
            let background = self.send_cell(&sess, &mut st, &worker, number, source)?;
            st.inbox.advance();
            st.notes.extend(carried);
            (background, st.inbox.last(), number)
        };
        self.arm_time_limit(&sess, &worker, number);
        let report = self.collect(&sess, &worker, wait).await?;
        if background.is_empty() {
            return Ok(report);
        }
        Ok(report.with_background(after, background.render()))
    }

    /// Waits for the running cell of a session to change state.
    pub async fn wait(
        self: &Arc<Self>,
        name: &str,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        let wait = match self.follow_preinstall(name, wait).await? {
            Behind::Go(left) => left,
            Behind::Answer(report) => return Ok(*report),
        };
        self.follow(name, wait, |sess, st| {
            if st.lifecycle.is_rebuilding() {
                // The rebuild's task hands over to the queued cell.
                if let Some(w) = &st.worker {
                    return Ok(ControlFlow::Continue(w.clone()));
                }
            }
            if st.inbox.running.is_none() && st.inbox.completed.is_none() {
                // The response that carried the last result may have been
                // lost (a dropped connection, a client timeout): give it again.
                let again = st
                    .inbox
                    .redelivery()
                    .ok_or_else(|| SessionError::Idle(sess.language, sess.name.clone()))?;
                return Ok(ControlFlow::Break(again));
            }
            match &st.worker {
                Some(w) => Ok(ControlFlow::Continue(w.clone())),
                None => Err(SessionError::Idle(sess.language, sess.name.clone())),
            }
        })
        .await
    }

    /// Looks a session up, lets `prepare` check (and act on) its refreshed
    /// state, then collects from the worker it names, or returns its answer.
    async fn follow(
        self: &Arc<Self>,
        name: &str,
        wait: Duration,
        prepare: impl FnOnce(
            &Session,
            &mut SessionState,
        ) -> Result<ControlFlow<CellReport, Arc<Worker>>, SessionError>,
    ) -> Result<CellReport, SessionError> {
        let sess = self.existing(name)?;
        let next = {
            let mut st = sess.lock();
            self.refresh(&sess, &mut st);
            prepare(&sess, &mut st)?
        };
        match next {
            ControlFlow::Break(report) => Ok(report),
            ControlFlow::Continue(worker) => self.collect(&sess, &worker, wait).await,
        }
    }

    /// Answers a pending input() and waits like `wait`.
    pub async fn input(
        self: &Arc<Self>,
        name: &str,
        text: &str,
        eof: bool,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        self.follow(name, wait, |sess, st| {
            if let Some(rb) = st.lifecycle.rebuild() {
                return Err(sess.rebuilding_error(rb));
            }
            let worker = st.worker.clone();
            let Some(run) = st.inbox.running.as_mut() else {
                return Err(SessionError::NotWaitingInput {
                    lang: sess.language,
                    session: sess.name.clone(),
                    detail: " (no cell is running)".into(),
                });
            };
            if run.prompt.is_none() {
                return Err(SessionError::NotWaitingInput {
                    lang: sess.language,
                    session: sess.name.clone(),
                    detail: format!(
                        " (cell {} is running and has not asked for input)",
                        run.number
                    ),
                });
            }
            let Some(worker) = worker else {
                return Err(SessionError::Idle(sess.language, sess.name.clone()));
            };
            worker
                .send(&Request::Input {
                    cell: run.number,
                    text,
                    eof,
                })
                .map_err(|source| SessionError::Worker {
                    session: sess.name.clone(),
                    source,
                })?;
            run.prompt = None;
            Ok(ControlFlow::Continue(worker))
        })
        .await
    }

    /// SIGINT to the running cell; escalates to a second SIGINT, then a kill.
    /// Returns the cell's final result.
    /// During a rebuild: stops it, and the queued cell does not run.
    pub async fn interrupt(self: &Arc<Self>, name: &str) -> Result<CellReport, SessionError> {
        let sess = self.existing(name)?;
        if self.drop_queued(name) {
            return Err(SessionError::Invalid(format!(
                "the code queued in session '{name}' behind the preinstall was dropped and will not run; run it again once you want it"
            )));
        }
        if let Some(stopped) = self.interrupt_rebuild(&sess).await {
            return stopped;
        }
        let (worker, cell) = {
            let mut st = sess.lock();
            self.refresh(&sess, &mut st);
            let Some(run) = &st.inbox.running else {
                if let Some(done) = st.inbox.completed.take() {
                    let notes = std::mem::take(&mut st.notes);
                    let done = done.with_notes_first(notes);
                    st.inbox.delivered = Some(done.clone());
                    return Ok(
                        done.with_note("The cell had already finished; nothing was interrupted.")
                    );
                }
                return Err(SessionError::Idle(sess.language, sess.name.clone()));
            };
            let cell = run.number;
            match &st.worker {
                Some(w) => (w.clone(), cell),
                None => return Err(SessionError::Idle(sess.language, sess.name.clone())),
            }
        };
        self.stop_cell(&sess, &worker, cell, None).await;
        let report = self.collect(&sess, &worker, Duration::ZERO).await?;
        // A kernel may end an interrupted cell without an error (bash_kernel
        // does): its 'ok' then says nothing of the interrupt unless told.
        Ok(match report.status {
            CellStatus::Ok if report.cell == cell => report.with_note(
                "The cell ended after the interrupt without reporting it; its output may be cut short.",
            ),
            _ => report,
        })
    }

    /// The client cancelled a python_exec: a rebuild under way is stopped
    /// and its account left for the next result (the queued cell's, not
    /// run); otherwise the running cell is interrupted.
    pub async fn cancel(self: &Arc<Self>, name: &str) -> Result<(), SessionError> {
        let sess = self.existing(name)?;
        let reason = "interrupted when the client cancelled its call";
        if self.stop_rebuild(&sess, reason).await.is_some() {
            return Ok(());
        }
        self.interrupt(name).await.map(drop)
    }
}
