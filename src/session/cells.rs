//! Running cells: exec, wait, input, interrupt, and turning worker events
//! into results. Results are pulled: events wait in the worker's queue until
//! a call looks at the session.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::time::Instant as TokioInstant;

use super::durable::Pending;
use super::report::{CellReport, CellStatus, Images};
use super::resume::{Ready, uncollected};
use super::source::{CellSource, HISTORY_PREVIEW_CHARS, StoredSource};
use super::{HistoryEntry, Session, SessionError, SessionManager, SessionState};
use crate::output::log::CellLog;
use crate::output::{Capture, Stream};
use crate::worker::protocol::{PyError, Request};
use crate::worker::{CellEvent, FencedEvent, Language, Worker};

/// How a cell ended, before it becomes a report.
struct CellDone {
    status: CellStatus,
    value: Option<String>,
    error: Option<PyError>,
    elapsed_ms: f64,
    notes: Vec<String>,
}

pub(super) struct RunningCell {
    pub(super) number: u64,
    /// The cell whose state it ran on.
    pub(super) parent: Option<u64>,
    /// What it runs, kept for re-running it.
    pub(super) source: Arc<StoredSource>,
    /// Re-run by a rebuild: not a new cell of the history or the store.
    pub(super) replay: bool,
    pub(super) started: Instant,
    /// The code (or script) the cell runs, for python_history.
    pub(super) code: String,
    pub(super) prompt: Option<(String, bool)>,
    /// Output of this cell that arrived with events but was not returned yet.
    pub(super) output: Capture,
    /// Images of this cell not returned yet.
    pub(super) images: Images,
    /// The cell's full output so far, for python_output.
    pub(super) log: CellLog,
    /// Why and how ferrepl stopped the cell (interrupt, time limit), for its result.
    pub(super) stop_notes: Vec<String>,
    /// Set when ferrepl killed the interpreter to stop the cell.
    pub(super) killed_by_ferrepl: bool,
    /// Calls its code made to upstream MCP servers (a rebuild skips it).
    pub(super) tool_calls: u64,
    /// What its results returned while it ran, for the kept result.
    pub(super) early: super::export::EarlyParts,
}

impl RunningCell {
    pub(super) fn elapsed_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Takes in output that arrived for this cell.
    pub(super) fn absorb(&mut self, mut output: Capture) {
        self.log.add_all(output.take_log());
        self.output.append(output);
    }
}

impl SessionManager {
    /// Applies the worker's pending events to the session.
    pub(super) fn refresh(&self, sess: &Session, st: &mut SessionState) {
        self.settle_checkpoints(st);
        let Some(worker) = st.worker.clone() else {
            return;
        };
        while let Some(FencedEvent { event, output }) = worker.pop_event() {
            match event {
                CellEvent::InputRequest {
                    cell,
                    prompt,
                    password,
                } => {
                    if let Some(run) = st.running.as_mut().filter(|r| r.number == cell) {
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
                    // A done event of another cell (it cannot be the
                    // running one's) leaves the running cell alone.
                    if st.running.as_ref().is_none_or(|r| r.number != cell) {
                        continue;
                    }
                    let Some(mut run) = st.running.take() else {
                        continue;
                    };
                    run.absorb(output);
                    st.cells_run += 1;
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
        if st.running.is_some() && worker.fully_exited(self.limits.crash_grace) {
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
        image: crate::worker::protocol::Image,
        output: Capture,
    ) {
        let limit = self.limits.max_images;
        match st.running.as_mut().filter(|r| r.number == cell) {
            Some(run) => {
                run.absorb(output);
                let line = run.images.add(image, limit);
                run.output.push(Stream::Meta, line.as_bytes());
            }
            None => {
                st.background_images.add(image, limit);
                // Output before it stays with the background output.
                worker.put_back_output(output);
            }
        }
    }

    /// The interpreter died under a running cell: the cell ends crashed, or
    /// interrupted when ferrepl killed it to stop the cell.
    fn on_worker_death(&self, sess: &Session, st: &mut SessionState, worker: &Worker) {
        let Some(mut run) = st.running.take() else {
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
                st.pending = Some(Pending::Crashed);
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
        if !run.replay
            && let Some(hint) =
                super::hints::for_cell(&run.code, &report, self.limits.cells_offline)
        {
            report.notes.push(hint);
        }
        self.checkpoint_after(sess, st, run.number, &report);
        if run.replay {
            // For the rebuild's task, never a result of the agent's.
            if let Some(rb) = st.rebuild.as_mut() {
                rb.replayed = Some(report);
            }
            return;
        }
        // Here, not where a result is collected: a cell ends once however
        // many waits look at it, and also when no call ever collects it.
        if let Some(outcome) = report.status.outcome() {
            crate::metrics::cell_finished(sess.language.metric(), outcome);
        }
        st.last_cell = run.number;
        let log = std::mem::take(&mut run.log);
        self.keep_log(st, log);
        let code = std::mem::take(&mut run.code);
        st.completed = Some(report);
        self.record_history(st, code, run.parent);
        if let Some(report) = st.completed.take() {
            self.record_cell(sess, st, &run, &report);
            st.kept.keep(&report, std::mem::take(&mut run.early));
            st.completed = Some(report);
        }
    }

    /// Adds the just-completed cell to the session's history (bounded).
    pub(super) fn record_history(&self, st: &mut SessionState, code: String, parent: Option<u64>) {
        let Some(done) = st.completed.as_ref() else {
            return;
        };
        let text = crate::output::text::clean(&done.output.combined);
        let mut preview: String = text.chars().take(HISTORY_PREVIEW_CHARS).collect();
        if text.chars().count() > HISTORY_PREVIEW_CHARS {
            preview.push_str("...");
        }
        if preview.is_empty()
            && let Some(v) = &done.value
        {
            preview = v.chars().take(HISTORY_PREVIEW_CHARS).collect();
        }
        if let Some(e) = &done.error {
            preview.push_str(&format!("\n{}: {}", e.kind, e.message));
        }
        st.history.push_back(HistoryEntry {
            cell: done.cell,
            parent,
            current: false,
            code,
            status: done.status,
            elapsed_ms: done.elapsed_ms,
            output_preview: preview,
        });
        while st.history.len() > self.limits.keep_cells.max(1) * 4 {
            st.history.pop_front();
        }
    }

    pub(super) fn keep_log(&self, st: &mut SessionState, log: CellLog) {
        st.logs.push_back(log);
        while st.logs.len() > self.limits.keep_cells {
            st.logs.pop_front();
        }
    }

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
            if let Some(busy) = busy_now(&sess, &st) {
                return Err(busy);
            }
            let carried = st.completed.take().map(uncollected).unwrap_or_default();
            let number = st.next_cell;
            let source = Arc::new(StoredSource::of(&source));
            let background = self.send_cell(&sess, &mut st, &worker, number, source)?;
            st.next_cell += 1;
            st.notes.extend(carried);
            (background, st.last_cell, number)
        };
        self.arm_time_limit(&sess, &worker, number);
        let report = self.collect(&sess, &worker, wait).await?;
        if background.is_empty() {
            return Ok(report);
        }
        Ok(report.with_background(after, background.render()))
    }

    /// Sends cell `number` running `source` and makes it the running cell;
    /// returns the output that arrived since the previous cell finished.
    pub(super) fn send_cell(
        &self,
        sess: &Session,
        st: &mut SessionState,
        worker: &Worker,
        number: u64,
        source: Arc<StoredSource>,
    ) -> Result<Capture, SessionError> {
        // Taken before the cell starts: whatever is there was written
        // after the previous cell finished.
        let mut background = worker.take_output();
        let late = background.take_log();
        let last_cell = st.last_cell;
        if let Some(prev) = st.logs.back_mut().filter(|l| l.cell == last_cell) {
            prev.add_all(late);
        }
        worker.start_cell_log(self.limits.cell_log_bytes);
        let background_images = st.background_images.take();
        if st.pending == Some(Pending::Crashed) {
            // Not rebuilt: this cell starts a new path in the fresh interpreter.
            st.clear_path();
        }
        worker
            .send(&source.as_source().request(number))
            .map_err(|source| SessionError::Worker {
                session: sess.name.clone(),
                source,
            })?;
        st.delivered = None;
        st.last_used = Instant::now();
        let mut run = self.new_running_cell(number, sess.language, source);
        run.parent = st.head();
        run.images.extend(background_images, self.limits.max_images);
        st.running = Some(run);
        Ok(background)
    }

    /// The record of a cell just sent to the worker.
    pub(super) fn new_running_cell(
        &self,
        number: u64,
        lang: Language,
        source: Arc<StoredSource>,
    ) -> RunningCell {
        RunningCell {
            number,
            parent: None,
            code: source.as_source().describe(),
            source,
            replay: false,
            started: Instant::now(),
            prompt: None,
            output: Capture::new(
                self.spec.output_head_bytes,
                self.spec.output_tail_bytes,
                lang.output_tool(),
            ),
            images: Images::default(),
            log: CellLog::new(number),
            stop_notes: Vec::new(),
            killed_by_ferrepl: false,
            tool_calls: 0,
            early: Default::default(),
        }
    }

    /// Waits for the running cell of a session to change state.
    pub async fn wait(
        self: &Arc<Self>,
        name: &str,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        self.follow(name, wait, |sess, st| {
            if st.rebuild.is_some() {
                // The rebuild's task hands over to the queued cell.
                if let Some(w) = &st.worker {
                    return Ok(ControlFlow::Continue(w.clone()));
                }
            }
            if st.running.is_none() && st.completed.is_none() {
                // The response that carried the last result may have been
                // lost (a dropped connection, a client timeout): give it again.
                let again = redelivery(st)
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
            if let Some(rb) = &st.rebuild {
                return Err(super::resume::rebuilding_error(sess, rb));
            }
            let worker = st.worker.clone();
            let Some(run) = st.running.as_mut() else {
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

    pub(super) fn next_wake(&self, worker: &Worker, deadline: TokioInstant) -> TokioInstant {
        match worker.exit_info() {
            // Once past, `refresh` has taken the death in already.
            Some(e) if e.at + self.limits.crash_grace > Instant::now() => {
                let at = TokioInstant::from_std(e.at + self.limits.crash_grace);
                at.min(deadline)
            }
            _ => deadline,
        }
    }

    /// Returns when the running cell finishes, asks for input, or `wait` runs out.
    pub(super) async fn collect(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        self.watch(sess, worker, wait, |st, timed_out| {
            if let Some(rb) = &st.rebuild {
                // The queued cell (if any) runs once it is done.
                return timed_out.then(|| super::resume::running_report(sess, rb));
            }
            if let Some(done) = st.completed.take() {
                let notes = std::mem::take(&mut st.notes);
                let done = done.with_notes_first(notes);
                st.delivered = Some(done.clone());
                return Some(Ok(done));
            }
            let Some(run) = st.running.as_mut() else {
                // Another call took the result first (perhaps one whose
                // client is gone): this one gets it too.
                return Some(
                    redelivery(st)
                        .ok_or_else(|| SessionError::Idle(sess.language, sess.name.clone())),
                );
            };
            if run.prompt.is_none() && !timed_out {
                return None;
            }
            if run.prompt.is_none() {
                run.absorb(worker.take_output());
            }
            let (status, prompt) = match &run.prompt {
                Some((p, _)) => (CellStatus::WaitingInput, Some(p.clone())),
                None => (CellStatus::Running, None),
            };
            let report = CellReport {
                status,
                session: sess.name.clone(),
                language: sess.language,
                cell: run.number,
                output: run.output.take().render(),
                background: None,
                value: None,
                error: None,
                prompt,
                elapsed_ms: run.started.elapsed().as_secs_f64() * 1000.0,
                images: run.images.take(),
                notes: Vec::new(),
            };
            run.early.add(&report);
            let notes = std::mem::take(&mut st.notes);
            Some(Ok(report.with_notes_first(notes)))
        })
        .await
    }

    /// Re-checks the session whenever its worker reports something, a
    /// rebuild ends (and when a crash's grace runs out) until `check` gives
    /// an answer; `check` is told whether `wait` has passed.
    pub(super) async fn watch<T>(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        wait: Duration,
        mut check: impl FnMut(&mut SessionState, bool) -> Option<T>,
    ) -> T {
        let deadline = TokioInstant::now() + wait;
        let mut rx = worker.subscribe();
        let mut changed = sess.changed.subscribe();
        loop {
            rx.borrow_and_update();
            changed.borrow_and_update();
            {
                let mut st = sess.lock();
                self.refresh(sess, &mut st);
                if let Some(answer) = check(&mut st, TokioInstant::now() >= deadline) {
                    return answer;
                }
            }
            let wake = self.next_wake(worker, deadline);
            tokio::select! {
                _ = rx.changed() => {}
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// The last finished result, again, saying so.
pub(super) fn redelivery(st: &SessionState) -> Option<CellReport> {
    let last = st.delivered.as_ref()?;
    let note = format!(
        "Sent again: this result of cell {} was sent to a call before (that client may not have received it); no cell is running.",
        last.cell
    );
    Some(last.clone().with_note(&note))
}

/// Why a call that needs the interpreter idle cannot run now: a rebuild
/// under way, or a running cell.
pub(super) fn busy_now(sess: &Session, st: &SessionState) -> Option<SessionError> {
    if let Some(rb) = &st.rebuild {
        return Some(super::resume::rebuilding_error(sess, rb));
    }
    st.running.as_ref().map(|run| busy(sess, run))
}

pub(super) fn busy(sess: &Session, run: &RunningCell) -> SessionError {
    let wait = sess.language.wait_tool();
    SessionError::Busy {
        lang: sess.language,
        session: sess.name.clone(),
        cell: run.number,
        secs: run.started.elapsed().as_secs_f64(),
        waiting: match &run.prompt {
            Some((p, _)) => {
                format!(
                    " and is waiting for input (prompt {p:?}); answer it with {wait} {{input: ...}}"
                )
            }
            None => String::new(),
        },
    }
}
