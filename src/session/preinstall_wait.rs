//! A call that reaches a session whose interpreter waits for `--preinstall`
//! (the kept venv's packages, installed in the background from the start):
//! its code waits within the call's window; past it, the code is queued
//! behind the install and the call answers `running` with the install's
//! progress, like a long cell. python_wait follows it (its progress again,
//! then the cell's own result). A failed preinstall never holds a session
//! back: the first result after it carries one note saying so and how to
//! see why.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::error::SessionError;
use super::manager::SessionManager;
use super::preinstall_queue::Queued;
use super::report::{CellReport, CellStatus, Images};
use super::source::{CellSource, StoredSource};
use super::state::Session;
use crate::worker::Language;
use crate::worker::preinstall::{MAX_PREINSTALL_TIME, Preinstall, PreinstallState};

/// What a call does about the preinstall.
pub(super) enum Behind {
    /// Go on, with what is left of the window.
    Go(Duration),
    /// Answer this.
    Answer(Box<CellReport>),
}

impl SessionManager {
    /// The preinstall the interpreter of `sess` waits for, while it runs.
    fn preinstall_of(&self, sess: &Session) -> Option<Arc<Preinstall>> {
        if sess.language != Language::Python {
            return None;
        }
        let venv = self.spec.venv.as_ref()?;
        let program = sess
            .spec
            .as_deref()
            .map_or(&self.spec.program, |s| &s.program);
        if venv.python() != *program {
            return None;
        }
        venv.preinstall.clone()
    }

    /// Before a cell of `sess`: waits (within `wait`) for the preinstall,
    /// else queues `source` behind it and answers `running`.
    pub(super) async fn behind_preinstall(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        source: &CellSource<'_>,
        parent: Option<u64>,
        wait: Duration,
    ) -> Result<Behind, SessionError> {
        let Some(preinstall) = self.preinstall_of(sess) else {
            return Ok(Behind::Go(wait));
        };
        {
            let mut all = self.queued();
            match all.get(&sess.name) {
                // Sent already: its result is the session's, carried into
                // this call's like any result not collected.
                Some(queued) if queued.task.is_finished() => drop(all.remove(&sess.name)),
                Some(queued) => return Err(queued_already(&sess.name, queued.number)),
                None => {}
            }
        }
        let started = Instant::now();
        if preinstall.settled(wait).await {
            self.note_preinstall_failure(sess, &preinstall);
            return Ok(Behind::Go(wait.saturating_sub(started.elapsed())));
        }
        let number = sess.lock().inbox.next_number();
        let stored = StoredSource::of(source);
        let (this, sess2, p) = (self.clone(), sess.clone(), preinstall.clone());
        let task = tokio::spawn(async move {
            p.settled(MAX_PREINSTALL_TIME).await;
            this.note_preinstall_failure(&sess2, &p);
            this.exec_now(&sess2, stored.as_source(), parent, Duration::ZERO)
                .await
        });
        let queued = Queued {
            number,
            since: started,
            task,
        };
        let report = self.queued_report(sess, &preinstall, &queued);
        let mut all = self.queued();
        if let Some(first) = all.get(&sess.name) {
            // Another call queued its code while this one waited.
            queued.task.abort();
            return Err(queued_already(&sess.name, first.number));
        }
        all.insert(sess.name.clone(), queued);
        Ok(Behind::Answer(Box::new(report)))
    }

    /// python_wait on a session whose code is queued behind the preinstall:
    /// its progress until the install ends and the code is sent, then the
    /// usual wait with what is left of `wait`.
    pub(super) async fn follow_preinstall(
        self: &Arc<Self>,
        name: &str,
        wait: Duration,
    ) -> Result<Behind, SessionError> {
        let started = Instant::now();
        let Some(mut queued) = self.queued().remove(name) else {
            return Ok(Behind::Go(wait));
        };
        let sess = self.existing(name)?;
        let sent = tokio::time::timeout(wait, &mut queued.task).await;
        match sent {
            Ok(Ok(Ok(report))) if report.status == CellStatus::Running => {
                Ok(Behind::Go(wait.saturating_sub(started.elapsed())))
            }
            Ok(Ok(answer)) => answer.map(|r| Behind::Answer(Box::new(r))),
            Ok(Err(e)) => Err(SessionError::Invalid(format!(
                "the cell queued behind the preinstall of session '{name}' was not sent ({e}); run it again"
            ))),
            Err(_) => {
                let report = match self.preinstall_of(&sess) {
                    Some(p) => self.queued_report(&sess, &p, &queued),
                    None => return Err(SessionError::Idle(sess.language, sess.name.clone())),
                };
                self.queued().insert(name.to_string(), queued);
                Ok(Behind::Answer(Box::new(report)))
            }
        }
    }

    /// Stops code queued behind the preinstall (an interrupt): true when
    /// there was some.
    pub(super) fn drop_queued(&self, name: &str) -> bool {
        match self.queued().remove(name) {
            Some(queued) => {
                queued.task.abort();
                true
            }
            None => false,
        }
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Queued>> {
        self.behind_preinstall
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The `running` answer of code queued behind the preinstall.
    fn queued_report(
        &self,
        sess: &Session,
        preinstall: &Preinstall,
        queued: &Queued,
    ) -> CellReport {
        let wait = sess.language.wait_tool();
        let note = format!(
            "{}. Cell {} (this code) runs once it is in: {wait} follows it.",
            preinstall.progress(),
            queued.number
        );
        CellReport {
            status: CellStatus::Running,
            session: sess.name.clone(),
            language: sess.language,
            cell: queued.number,
            output: Default::default(),
            background: None,
            value: None,
            error: None,
            prompt: None,
            elapsed_ms: queued.since.elapsed().as_secs_f64() * 1000.0,
            images: Images::default(),
            notes: vec![note],
        }
    }

    /// A failed preinstall, told once (in the next result of `sess`).
    fn note_preinstall_failure(&self, sess: &Session, preinstall: &Preinstall) {
        if matches!(preinstall.state(), PreinstallState::Failed { .. })
            && !self.preinstall_noted.swap(true, Ordering::SeqCst)
        {
            sess.lock()
                .notes
                .push(format!("{}.", preinstall.progress()));
        }
    }
}

/// The refusal of a second cell while one waits behind the preinstall.
fn queued_already(session: &str, number: u64) -> SessionError {
    SessionError::Invalid(format!(
        "session '{session}' has cell {number} queued behind the preinstall already; python_wait follows it"
    ))
}
