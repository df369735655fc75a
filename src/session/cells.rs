//! Running cells: exec, wait, input, interrupt, and turning worker events
//! into results. Results are pulled: events wait in the worker's queue until
//! a call looks at the session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::time::Instant as TokioInstant;

use super::report::{BackgroundOutput, CellReport, CellStatus, Images};
use super::{HistoryEntry, Session, SessionError, SessionManager, SessionState};
use crate::output::log::CellLog;
use crate::output::{Capture, Stream};
use crate::worker::protocol::{PyError, Request};
use crate::worker::{CellEvent, Worker};

/// What a cell runs: code, or a script file (python_run_file).
#[derive(Debug, Clone, Copy)]
pub enum CellSource<'a> {
    Code(&'a str),
    File { path: &'a str, args: &'a [String] },
}

impl CellSource<'_> {
    /// The cell's code as history shows it (bounded).
    fn describe(&self) -> String {
        let text = match self {
            CellSource::Code(code) => code.to_string(),
            CellSource::File { path, args } => {
                format!("# python_run_file {path} {}", args.join(" "))
                    .trim_end()
                    .to_string()
            }
        };
        if text.chars().count() > MAX_HISTORY_CODE_CHARS {
            let cut: String = text.chars().take(MAX_HISTORY_CODE_CHARS).collect();
            format!("{cut}\n# [... code truncated]")
        } else {
            text
        }
    }
}

const MAX_HISTORY_CODE_CHARS: usize = 4000;
const HISTORY_PREVIEW_CHARS: usize = 300;

pub(super) struct RunningCell {
    pub(super) number: u64,
    started: Instant,
    /// The code (or script) the cell runs, for python_history.
    pub(super) code: String,
    pub(super) prompt: Option<(String, bool)>,
    /// Output of this cell that arrived with events but was not returned yet.
    output: Capture,
    /// Images of this cell not returned yet.
    images: Images,
    /// The cell's full output so far, for python_output.
    log: CellLog,
    /// Why and how ferrepl stopped the cell (interrupt, time limit), for its result.
    stop_notes: Vec<String>,
    /// Set when ferrepl killed the interpreter to stop the cell.
    killed_by_ferrepl: bool,
}

impl RunningCell {
    pub(super) fn elapsed_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Takes in output that arrived for this cell.
    fn absorb(&mut self, mut output: Capture) {
        self.log.add_all(output.take_log());
        self.output.append(output);
    }
}

impl SessionManager {
    /// Applies the worker's pending events to the session.
    pub(super) fn refresh(&self, sess: &Session, st: &mut SessionState) {
        let Some(worker) = st.worker.clone() else {
            return;
        };
        while let Some(event) = worker.pop_event() {
            match event {
                CellEvent::InputRequest {
                    cell,
                    prompt,
                    password,
                    output,
                } => {
                    if let Some(run) = st.running.as_mut().filter(|r| r.number == cell) {
                        run.absorb(output);
                        run.prompt = Some((prompt, password));
                    }
                }
                CellEvent::Display {
                    cell,
                    image,
                    output,
                } => match st.running.as_mut().filter(|r| r.number == cell) {
                    Some(run) => {
                        run.absorb(output);
                        let line = run.images.add(image, self.limits.max_images);
                        run.output.push(Stream::Meta, line.as_bytes());
                    }
                    None => {
                        let limit = self.limits.max_images;
                        st.background_images.add(image, limit);
                        // Output before it stays with the background output.
                        worker.put_back_output(output);
                    }
                },
                CellEvent::Done {
                    cell,
                    status,
                    value,
                    error,
                    elapsed_ms,
                    output,
                } => {
                    let Some(mut run) = st.running.take().filter(|r| r.number == cell) else {
                        continue;
                    };
                    run.absorb(output);
                    st.cells_run += 1;
                    st.last_cell = cell;
                    let log = std::mem::take(&mut run.log);
                    self.keep_log(st, log);
                    let code = std::mem::take(&mut run.code);
                    st.completed = Some(CellReport {
                        status: CellStatus::from_driver(&status),
                        session: sess.name.clone(),
                        cell,
                        output: run.output.render(),
                        background: None,
                        value,
                        error,
                        prompt: None,
                        elapsed_ms,
                        images: run.images.take(),
                        notes: std::mem::take(&mut run.stop_notes),
                    });
                    self.record_history(st, code);
                }
            }
        }
        if st.running.is_some() && worker.fully_exited(self.limits.crash_grace) {
            let Some(mut run) = st.running.take() else {
                return;
            };
            let exit = worker
                .exit_info()
                .map(|e| e.describe())
                .unwrap_or_else(|| "an unknown status".into());
            run.absorb(worker.take_output());
            st.last_cell = run.number;
            let log = std::mem::take(&mut run.log);
            self.keep_log(st, log);
            let code = std::mem::take(&mut run.code);
            if let Some(reason) = worker.take_kill_reason() {
                run.stop_notes.push(reason);
            }
            let (status, notes) = if run.killed_by_ferrepl {
                (CellStatus::Interrupted, std::mem::take(&mut run.stop_notes))
            } else {
                let mut notes = std::mem::take(&mut run.stop_notes);
                notes.push(format!(
                    "The Python process of session '{}' died with {exit} while running cell {}; all its variables are lost. The next call starts a fresh interpreter.",
                    sess.name, run.number
                ));
                (CellStatus::Crashed, notes)
            };
            st.completed = Some(CellReport {
                status,
                session: sess.name.clone(),
                cell: run.number,
                output: run.output.render(),
                background: None,
                value: None,
                error: Some(if status == CellStatus::Interrupted {
                    PyError {
                        kind: "InterpreterKilled".into(),
                        message: format!(
                            "the cell ignored interrupts, so ferrepl killed its interpreter ({exit})"
                        ),
                        traceback: String::new(),
                    }
                } else {
                    PyError {
                        kind: "WorkerCrashed".into(),
                        message: format!("the Python process died with {exit}"),
                        traceback: String::new(),
                    }
                }),
                prompt: None,
                elapsed_ms: run.started.elapsed().as_secs_f64() * 1000.0,
                images: run.images.take(),
                notes,
            });
            self.record_history(st, code);
        }
    }

    /// Adds the just-completed cell to the session's history (bounded).
    fn record_history(&self, st: &mut SessionState, code: String) {
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
        source: CellSource<'_>,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        let sess = self.get_or_create(name)?;
        let worker = self.ensure_worker(&sess).await?;
        let mut carried = Vec::new();
        let (background, after, number) = {
            let mut st = sess.lock();
            self.refresh(&sess, &mut st);
            if let Some(run) = &st.running {
                return Err(busy(&sess.name, run));
            }
            if let Some(prev) = st.completed.take() {
                carried.push(format!(
                    "Cell {} finished before this call ({}); its result had not been collected:\n{}",
                    prev.cell,
                    prev.status.as_str(),
                    prev.brief()
                ));
            }
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
            let number = st.next_cell;
            worker
                .send(&match source {
                    CellSource::Code(code) => Request::Exec {
                        cell: number,
                        code,
                        path: None,
                        argv: None,
                    },
                    CellSource::File { path, args } => Request::Exec {
                        cell: number,
                        code: "",
                        path: Some(path),
                        argv: Some(args),
                    },
                })
                .map_err(|source| SessionError::Worker {
                    session: sess.name.clone(),
                    source,
                })?;
            st.next_cell += 1;
            st.delivered = None;
            st.last_used = Instant::now();
            st.notes.append(&mut carried);
            st.running = Some(RunningCell {
                number,
                started: Instant::now(),
                code: source.describe(),
                prompt: None,
                output: Capture::new(
                    self.spec.output_head_bytes,
                    self.spec.output_tail_bytes,
                    "python_output",
                ),
                images: Images::default(),
                log: CellLog::new(number),
                stop_notes: Vec::new(),
                killed_by_ferrepl: false,
            });
            if let Some(run) = st.running.as_mut() {
                run.images.extend(background_images, self.limits.max_images);
            }
            (background, st.last_cell, number)
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
        let sess = self.existing(name)?;
        let worker = {
            let mut st = sess.lock();
            self.refresh(&sess, &mut st);
            if st.running.is_none() && st.completed.is_none() {
                // The response that carried the last result may have been
                // lost (a dropped connection, a client timeout): give it again.
                return redelivery(&st).ok_or_else(|| SessionError::Idle(sess.name.clone()));
            }
            match &st.worker {
                Some(w) => w.clone(),
                None => return Err(SessionError::Idle(sess.name.clone())),
            }
        };
        self.collect(&sess, &worker, wait).await
    }

    /// Answers a pending input() and waits like `wait`.
    pub async fn input(
        self: &Arc<Self>,
        name: &str,
        text: &str,
        eof: bool,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        let sess = self.existing(name)?;
        let worker = {
            let mut st = sess.lock();
            self.refresh(&sess, &mut st);
            let worker = st.worker.clone();
            let Some(run) = st.running.as_mut() else {
                return Err(SessionError::NotWaitingInput {
                    session: sess.name.clone(),
                    detail: " (no cell is running)".into(),
                });
            };
            if run.prompt.is_none() {
                return Err(SessionError::NotWaitingInput {
                    session: sess.name.clone(),
                    detail: format!(
                        " (cell {} is running and has not asked for input)",
                        run.number
                    ),
                });
            }
            let Some(worker) = worker else {
                return Err(SessionError::Idle(sess.name.clone()));
            };
            worker
                .send(&Request::Input { text, eof })
                .map_err(|source| SessionError::Worker {
                    session: sess.name.clone(),
                    source,
                })?;
            run.prompt = None;
            worker
        };
        self.collect(&sess, &worker, wait).await
    }

    /// SIGINT to the running cell; escalates to a second SIGINT, then a kill.
    /// Returns the cell's final result.
    pub async fn interrupt(self: &Arc<Self>, name: &str) -> Result<CellReport, SessionError> {
        let sess = self.existing(name)?;
        let (worker, cell) = {
            let mut st = sess.lock();
            self.refresh(&sess, &mut st);
            let Some(run) = &st.running else {
                if let Some(done) = st.completed.take() {
                    let notes = std::mem::take(&mut st.notes);
                    let done = done.with_notes_first(notes);
                    st.delivered = Some(done.clone());
                    return Ok(
                        done.with_note("The cell had already finished; nothing was interrupted.")
                    );
                }
                return Err(SessionError::Idle(sess.name.clone()));
            };
            let cell = run.number;
            match &st.worker {
                Some(w) => (w.clone(), cell),
                None => return Err(SessionError::Idle(sess.name.clone())),
            }
        };
        self.stop_cell(&sess, &worker, cell, None).await;
        self.collect(&sess, &worker, Duration::ZERO).await
    }

    /// Stops cell `cell`: SIGINT, again after a grace period, then SIGKILL.
    /// The outcome is left as the session's completed result, annotated.
    async fn stop_cell(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        cell: u64,
        reason: Option<String>,
    ) {
        let grace = self.limits.interrupt_grace;
        // Notes go on the running cell before each step, so whichever call
        // collects the result (this one or a concurrent wait) carries them.
        if let Some(reason) = reason {
            self.annotate_running(sess, cell, reason, false);
        }
        for attempt in 0..2 {
            if attempt == 1 {
                self.annotate_running(
                    sess,
                    cell,
                    "The cell ignored the first interrupt; a second one was sent.".to_string(),
                    false,
                );
            }
            worker.signal_group(Signal::SIGINT);
            if self.wait_cell_gone(sess, worker, cell, grace).await {
                return;
            }
        }
        self.annotate_running(
            sess,
            cell,
            format!(
                "The cell did not stop after two interrupts over {:.0} s (it swallows KeyboardInterrupt or is stuck in native code), so its interpreter was killed. All variables of session '{}' are lost; the next call starts a fresh interpreter.",
                grace.as_secs_f64() * 2.0,
                sess.name
            ),
            true,
        );
        worker.signal_group(Signal::SIGKILL);
        let bound = self.limits.crash_grace + Duration::from_secs(5);
        self.wait_cell_gone(sess, worker, cell, bound).await;
    }

    fn annotate_running(&self, sess: &Session, cell: u64, note: String, killing: bool) {
        let mut st = sess.lock();
        if let Some(run) = st.running.as_mut().filter(|r| r.number == cell) {
            run.stop_notes.push(note);
            run.killed_by_ferrepl |= killing;
        }
    }

    /// Waits until cell `cell` is no longer running (finished or crashed).
    async fn wait_cell_gone(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        cell: u64,
        wait: Duration,
    ) -> bool {
        let deadline = TokioInstant::now() + wait;
        let mut rx = worker.subscribe();
        loop {
            rx.borrow_and_update();
            {
                let mut st = sess.lock();
                self.refresh(sess, &mut st);
                if st.running.as_ref().map(|r| r.number) != Some(cell) {
                    return true;
                }
            }
            if TokioInstant::now() >= deadline {
                return false;
            }
            let wake = self.next_wake(worker, deadline);
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Enforces --max-cell-seconds on one cell.
    fn arm_time_limit(self: &Arc<Self>, sess: &Arc<Session>, worker: &Arc<Worker>, cell: u64) {
        let Some(limit) = self.limits.max_cell else {
            return;
        };
        let this = self.clone();
        let sess = sess.clone();
        let worker = worker.clone();
        tokio::spawn(async move {
            if this.wait_cell_gone(&sess, &worker, cell, limit).await {
                return;
            }
            let reason = format!(
                "Cell {cell} ran past the time limit of {:.0} s (--max-cell-seconds) and was interrupted.",
                limit.as_secs_f64()
            );
            this.stop_cell(&sess, &worker, cell, Some(reason)).await;
        });
    }

    /// The full output of a cell (default: the running or latest one):
    /// its number, whether it still runs, the bytes, and bytes not kept.
    pub fn cell_output(
        &self,
        name: &str,
        cell: Option<u64>,
    ) -> Result<(u64, bool, Vec<u8>, u64), SessionError> {
        let sess = self.existing(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        let running = st.running.as_ref().map(|r| r.number);
        let target = cell.or(running).or_else(|| st.logs.back().map(|l| l.cell));
        let Some(target) = target else {
            return Err(SessionError::NoOutput {
                session: sess.name.clone(),
                detail: "no cell has run yet".into(),
            });
        };
        if Some(target) == running {
            let worker = st.worker.clone();
            let Some(run) = st.running.as_mut() else {
                return Err(SessionError::Idle(sess.name.clone()));
            };
            let mut bytes = run.log.bytes();
            if let Some(w) = worker {
                w.peek_log(&mut bytes);
            }
            return Ok((target, true, bytes, run.log.dropped()));
        }
        let kept: Vec<u64> = st.logs.iter().map(|l| l.cell).collect();
        match st.logs.iter_mut().find(|l| l.cell == target) {
            Some(log) => {
                let dropped = log.dropped();
                Ok((target, false, log.bytes(), dropped))
            }
            None => Err(SessionError::NoOutput {
                session: sess.name.clone(),
                detail: match (kept.first(), kept.last()) {
                    (Some(a), Some(b)) => format!(
                        "cell {target} is not kept (output is kept for cells {a}..{b}; --output-keep-cells)"
                    ),
                    _ => format!("cell {target} has no output kept"),
                },
            }),
        }
    }

    /// Elapsed seconds of the running cell and its latest output line.
    pub fn progress(&self, name: &str) -> Option<(f64, String)> {
        let sess = self.existing(name).ok()?;
        let st = sess.lock();
        let run = st.running.as_ref()?;
        let line = st
            .worker
            .as_ref()
            .and_then(|w| w.last_output_line())
            .or_else(|| run.output.last_line())
            .unwrap_or_default();
        Some((run.started.elapsed().as_secs_f64(), line))
    }

    fn next_wake(&self, worker: &Worker, deadline: TokioInstant) -> TokioInstant {
        match worker.exit_info() {
            Some(e) => {
                let at = TokioInstant::from_std(e.at + self.limits.crash_grace);
                at.min(deadline)
            }
            None => deadline,
        }
    }

    /// Returns when the running cell finishes, asks for input, or `wait` runs out.
    async fn collect(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        let deadline = TokioInstant::now() + wait;
        let mut rx = worker.subscribe();
        loop {
            rx.borrow_and_update();
            {
                let mut st = sess.lock();
                self.refresh(sess, &mut st);
                if let Some(done) = st.completed.take() {
                    let notes = std::mem::take(&mut st.notes);
                    let done = done.with_notes_first(notes);
                    st.delivered = Some(done.clone());
                    return Ok(done);
                }
                let timed_out = TokioInstant::now() >= deadline;
                let Some(run) = st.running.as_mut() else {
                    // Another call took the result first (perhaps one whose
                    // client is gone): this one gets it too.
                    return redelivery(&st).ok_or_else(|| SessionError::Idle(sess.name.clone()));
                };
                if run.prompt.is_some() || timed_out {
                    if run.prompt.is_none() {
                        run.absorb(worker.take_output());
                    }
                    let (status, prompt) = match &run.prompt {
                        Some((p, _)) => (CellStatus::WaitingInput, Some(p.clone())),
                        None => (CellStatus::Running, None),
                    };
                    let output = run.output.take().render();
                    let report = CellReport {
                        status,
                        session: sess.name.clone(),
                        cell: run.number,
                        output,
                        background: None,
                        value: None,
                        error: None,
                        prompt,
                        elapsed_ms: run.started.elapsed().as_secs_f64() * 1000.0,
                        images: run.images.take(),
                        notes: Vec::new(),
                    };
                    let notes = std::mem::take(&mut st.notes);
                    return Ok(report.with_notes_first(notes));
                }
            }
            let wake = self.next_wake(worker, deadline);
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// The last finished result, again, saying so.
fn redelivery(st: &super::SessionState) -> Option<CellReport> {
    let last = st.delivered.as_ref()?;
    let note = format!(
        "Delivered again: this result of cell {} was returned before; no cell is running.",
        last.cell
    );
    Some(last.clone().with_note(&note))
}

pub(super) fn busy(session: &str, run: &RunningCell) -> SessionError {
    SessionError::Busy {
        session: session.to_string(),
        cell: run.number,
        secs: run.started.elapsed().as_secs_f64(),
        waiting: match &run.prompt {
            Some((p, _)) => {
                format!(
                    " and is waiting for input (prompt {p:?}); answer it with python_wait {{input: ...}}"
                )
            }
            None => String::new(),
        },
    }
}

impl CellReport {
    fn with_note(mut self, note: &str) -> Self {
        self.notes.push(note.to_string());
        self
    }

    fn with_notes_first(mut self, mut notes: Vec<String>) -> Self {
        notes.append(&mut self.notes);
        self.notes = notes;
        self
    }

    fn with_background(mut self, after_cell: u64, output: crate::output::RenderedOutput) -> Self {
        self.background = Some(BackgroundOutput { after_cell, output });
        self
    }
}
