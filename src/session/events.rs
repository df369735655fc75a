//! A worker's events applied to its session, when a call looks at it:
//! output and images of the running cell (or of the background), input
//! prompts, a finished cell's result (kept for the next call, with its
//! history row, log, checkpoint, and its place in the path and the store),
//! the interpreter's death under a cell, and other clients' cells
//! (`foreign.rs`), each kept before the agent's cells that ended after it.

use super::hints;
use super::inbox::RunningCell;
use super::lifecycle::Pending;
use super::manager::SessionManager;
use super::report::{CellReport, CellStatus};
use super::state::{Session, SessionState};
use crate::output::log::CellLog;
use crate::output::{Capture, Stream};
use crate::worker::protocol::{Image, PyError};
use crate::worker::{CellEvent, FencedEvent, Language, Worker};

/// How a cell ended, before it becomes a report.
struct CellDone {
    status: CellStatus,
    value: Option<String>,
    error: Option<PyError>,
    elapsed_ms: f64,
    notes: Vec<String>,
}

impl SessionManager {
    /// Applies the worker's pending events to the session.
    pub(super) fn refresh(&self, sess: &Session, st: &mut SessionState) {
        st.checkpoints.settle();
        let Some(worker) = st.worker.clone() else {
            return;
        };
        let mut foreign = self.take_foreign(&worker);
        while let Some(FencedEvent { event, output }) = worker.pop_event() {
            match event {
                CellEvent::InputRequest {
                    cell,
                    prompt,
                    password,
                } => {
                    if let Some(run) = st.inbox.running.as_mut().filter(|r| r.number == cell) {
                        run.absorb(output);
                        run.prompt = Some((prompt, password));
                    }
                }
                CellEvent::Display { cell, image } => {
                    self.on_display(st, &worker, cell, image, output)
                }
                CellEvent::Done {
                    cell,
                    status,
                    value,
                    error,
                    elapsed_ms,
                } => {
                    // Other clients' cells that ran before this one go
                    // before it in the history.
                    self.keep_foreign(st, &mut foreign, Some(cell));
                    // A done event of another cell (it cannot be the
                    // running one's) leaves the running cell alone.
                    if st.inbox.running.as_ref().is_none_or(|r| r.number != cell) {
                        continue;
                    }
                    let Some(mut run) = st.inbox.running.take() else {
                        continue;
                    };
                    run.absorb(output);
                    st.inbox.count_run();
                    let calls = worker.take_cell_calls();
                    run.tool_calls = calls.count;
                    if let Some(line) = calls.summary() {
                        run.stop_notes.push(line);
                    }
                    let done = CellDone {
                        status: CellStatus::from_driver(&status),
                        value,
                        error,
                        elapsed_ms,
                        notes: std::mem::take(&mut run.stop_notes),
                    };
                    self.finish(sess, st, run, done);
                }
            }
        }
        self.keep_foreign(st, &mut foreign, None);
        if st.inbox.running.is_some() && worker.fully_exited(self.limits.crash_grace) {
            self.on_worker_death(sess, st, &worker);
        }
    }

    /// An image: part of the running cell's result, or of the background
    /// output when its cell has finished (a thread drew it).
    fn on_display(
        &self,
        st: &mut SessionState,
        worker: &Worker,
        cell: u64,
        image: Image,
        output: Capture,
    ) {
        let limit = self.limits.max_images;
        match st.inbox.running.as_mut().filter(|r| r.number == cell) {
            Some(run) => {
                run.absorb(output);
                let line = run.images.add(image, limit);
                run.output.push(Stream::Meta, line.as_bytes());
            }
            None => {
                st.kept.add_background_image(image, limit);
                // Output before it stays with the background output.
                worker.put_back_output(output);
            }
        }
    }

    /// The interpreter died under a running cell: the cell ends crashed, or
    /// interrupted when ferrepl killed it to stop the cell.
    fn on_worker_death(&self, sess: &Session, st: &mut SessionState, worker: &Worker) {
        let Some(mut run) = st.inbox.running.take() else {
            return;
        };
        let exit = worker
            .exit_info()
            .map(|e| e.describe())
            .unwrap_or_else(|| "an unknown status".into());
        run.absorb(worker.take_output());
        run.tool_calls = worker.take_cell_calls().count;
        if let Some(reason) = worker.take_kill_reason() {
            run.stop_notes.push(reason);
        }
        let mut notes = std::mem::take(&mut run.stop_notes);
        let (status, error) = if run.killed_by_ferrepl {
            let message =
                format!("the cell ignored interrupts, so ferrepl killed its interpreter ({exit})");
            (CellStatus::Interrupted, ("InterpreterKilled", message))
        } else {
            notes.push(format!(
                "The {} process of session '{}' died with {exit} while running cell {}; all its variables are lost. The next call starts a fresh interpreter.",
                sess.language, sess.name, run.number
            ));
            if !run.replay
                && let Some(offer) = self.restore_offer(sess, st)
            {
                notes.push(offer);
                st.lifecycle.set_pending(Pending::Crashed);
            }
            let message = format!("the {} process died with {exit}", sess.language);
            (CellStatus::Crashed, ("WorkerCrashed", message))
        };
        let done = CellDone {
            status,
            value: None,
            error: Some(PyError {
                kind: error.0.into(),
                message: error.1,
                traceback: String::new(),
            }),
            elapsed_ms: run.started.elapsed().as_secs_f64() * 1000.0,
            notes,
        };
        self.finish(sess, st, run, done);
    }

    /// Leaves a finished cell's result for the next call to collect, and
    /// keeps its log and history.
    fn finish(&self, sess: &Session, st: &mut SessionState, mut run: RunningCell, done: CellDone) {
        let mut report = CellReport {
            status: done.status,
            session: sess.name.clone(),
            language: sess.language,
            cell: run.number,
            output: run.output.render(),
            background: None,
            value: done.value,
            error: done.error,
            prompt: None,
            elapsed_ms: done.elapsed_ms,
            images: run.images.take(),
            notes: done.notes,
        };
        report.notes.extend(report.images.unlisted_note());
        if !run.replay
            && let Some(hint) = hints::for_cell(&run.code, &report, self.limits.cells_offline)
        {
            report.notes.push(hint);
        }
        self.checkpoint_after(sess, st, run.number, &report);
        if run.replay {
            // For the rebuild's task, never a result of the agent's.
            if let Some(rb) = st.lifecycle.rebuild_mut() {
                rb.replayed = Some(report);
            }
            return;
        }
        // Here, not where a result is collected: a cell ends once however
        // many waits look at it, and also when no call ever collects it.
        if let Some(outcome) = report.status.outcome() {
            crate::metrics::cell_finished(sess.language.metric(), outcome);
        }
        st.inbox.set_last(run.number);
        let log = std::mem::take(&mut run.log);
        self.keep_log(st, log);
        let code = std::mem::take(&mut run.code);
        st.inbox.completed = Some(report);
        self.record_history(st, code, run.parent);
        if let Some(report) = st.inbox.completed.take() {
            self.record_cell(sess, st, &run, &report);
            st.kept.keep_result(&report, std::mem::take(&mut run.early));
            st.inbox.completed = Some(report);
        }
    }

    /// Adds the just-completed cell to the session's history (bounded).
    pub(super) fn record_history(&self, st: &mut SessionState, code: String, parent: Option<u64>) {
        let Some(done) = st.inbox.completed.as_ref() else {
            return;
        };
        let most = self.limits.keep_cells.max(1) * 4;
        st.kept.record_history(done, code, parent, most);
    }

    pub(super) fn keep_log(&self, st: &mut SessionState, log: CellLog) {
        st.kept.keep_log(log, self.limits.keep_cells);
    }

    /// After cell `cell` finished: a frozen copy of the state, if the cell
    /// was worth one (ok, long enough, a Python interpreter with copies on).
    pub(super) fn checkpoint_after(
        &self,
        sess: &Session,
        st: &mut SessionState,
        cell: u64,
        report: &CellReport,
    ) {
        let limit = self.durable.checkpoints;
        if limit == 0
            || sess.language != Language::Python
            || sess.kernel().is_some()
            || report.status != CellStatus::Ok
            || report.elapsed_ms < self.durable.checkpoint_min.as_secs_f64() * 1000.0
        {
            return;
        }
        let Some(worker) = st.worker.clone() else {
            return;
        };
        let head = st.head();
        st.checkpoints.ask(&worker, cell, head, limit);
    }
}
