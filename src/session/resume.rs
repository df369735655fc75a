//! A rebuild under way. A call that reaches a session whose state must be
//! rebuilt (a branch without a checkpoint, a confirmed python_sessions
//! rebuild) starts a task that re-runs its path (`rebuild.rs`); a cell's
//! code is queued after it as the next cell, and the call returns within
//! its window, `running`, with a note on the rebuild. python_wait follows
//! it to the cell's own result, whose notes give the rebuild's account; an
//! interrupt (or the client cancelling the call) stops the rebuild, and
//! the queued code then does not run. A rebuild is never shown as a cell.

use std::sync::atomic::AtomicU64;

use super::durable::{PathCell, Pending, ranges};
use super::rebuild::{Account, runnable};
use super::report::CellStatus;
use super::*;
use crate::worker::protocol::PyError;

/// The error kind of a queued cell whose code did not run.
const NOT_RUN: &str = "NotRun";

static NEXT_REBUILD: AtomicU64 = AtomicU64::new(1);

/// A rebuild under way, in the session's state.
pub(super) struct Rebuilding {
    /// Which rebuild: a reset or delete ends it by clearing it, and its
    /// task then leaves the session alone.
    pub(super) id: u64,
    why: String,
    /// The cells it re-runs, in order (none past --resume-max-cells).
    plan: Vec<u64>,
    /// The cell it re-runs now.
    pub(super) current: Option<u64>,
    started: Instant,
    /// A call's code, run as the next cell once the rebuild is done.
    queued: Option<Queued>,
    /// Why it must stop (an interrupt): the queued code then does not run.
    pub(super) stop: Option<String>,
    /// The result of the cell just re-run, for the task.
    pub(super) replayed: Option<CellReport>,
    /// Notes meant for the agent's next result, kept aside meanwhile.
    aside: Vec<String>,
    /// A result no call had collected when the rebuild started.
    kept: Option<CellReport>,
}

struct Queued {
    number: u64,
    source: Arc<StoredSource>,
    since: Instant,
}

/// What the task of a rebuild re-runs.
pub(super) struct RebuildJob {
    pub(super) id: u64,
    pub(super) path: Vec<PathCell>,
    pub(super) cut: bool,
    pub(super) skip: usize,
}

/// What a call that needs the interpreter finds.
pub(super) enum Ready {
    /// It holds the session's state.
    Worker(Arc<Worker>),
    /// A rebuild runs (started by this call if the state needed it); the
    /// call's code, if it gave one, is queued after it.
    Rebuilding(Arc<Worker>),
}

impl Rebuilding {
    /// "(why): re-running cells 1-3, now cell 2, 4.1 s so far".
    fn detail(&self) -> String {
        let cells = match self.plan.as_slice() {
            [] => "nothing to re-run".to_string(),
            [one] => format!("re-running cell {one}"),
            many => format!("re-running cells {}", ranges(many)),
        };
        let now = match self.current {
            Some(c) if self.plan.len() > 1 => format!(", now cell {c}"),
            _ => String::new(),
        };
        format!(
            "({}): {cells}{now}, {:.1} s so far",
            self.why,
            self.started.elapsed().as_secs_f64()
        )
    }
}

/// The refusal of a call that cannot run while `rb` runs.
pub(super) fn rebuilding_error(sess: &Session, rb: &Rebuilding) -> SessionError {
    let wait = sess.language.wait_tool();
    let next = match &rb.queued {
        Some(q) => format!(
            "; cell {n} (code of an earlier call) runs after it. Call {wait} to follow it, or {wait} with interrupt: true to stop the rebuild (cell {n} then does not run)",
            n = q.number
        ),
        None => format!(
            ". {} queues code to run after it; {wait} with interrupt: true stops it",
            sess.language.exec_tool()
        ),
    };
    SessionError::Rebuilding(format!(
        "session '{}' is being rebuilt {}{next}",
        sess.name,
        rb.detail()
    ))
}

fn is_dormant(sess: &Session) -> bool {
    let st = sess.lock();
    st.rebuild.is_none() && st.pending == Some(Pending::Dormant)
}

/// A dormant session without a state to load runs nothing until the agent
/// chooses: its cells are re-run only by a confirmed rebuild (nothing runs
/// twice by itself). `why`: why its saved state could not be loaded.
pub(super) fn dormant_message(sess: &Session, why: Option<String>) -> String {
    let st = sess.lock();
    let ids: Vec<u64> = st.path.iter().map(|c| c.id).collect();
    let kept = match why {
        Some(why) => format!("their history is kept, and {why}"),
        None => "their history is kept, their variables are not".to_string(),
    };
    format!(
        "session '{name}' is dormant: an earlier server ran cells {cells} in it; {kept}. Nothing was run. python_sessions {{\"action\": \"rebuild\", \"session\": \"{name}\"}} shows what re-running them would do; {{\"action\": \"reset\"}} starts it afresh; or use another session",
        name = sess.name,
        cells = ranges(&ids),
    )
}

/// The queued cell's `running` result while `rb` runs.
pub(super) fn running_report(sess: &Session, rb: &Rebuilding) -> Result<CellReport, SessionError> {
    let Some(q) = &rb.queued else {
        return Err(rebuilding_error(sess, rb));
    };
    let wait = sess.language.wait_tool();
    let mut note = format!("Rebuilding session '{}' {}", sess.name, rb.detail());
    note.push_str(&format!(
        "; cell {n} (this code) runs after it. {wait} follows it; {wait} with interrupt: true stops the rebuild and cell {n} does not run.",
        n = q.number
    ));
    Ok(CellReport {
        status: CellStatus::Running,
        session: sess.name.clone(),
        language: sess.language,
        cell: q.number,
        output: Default::default(),
        background: None,
        value: None,
        error: None,
        prompt: None,
        elapsed_ms: q.since.elapsed().as_secs_f64() * 1000.0,
        images: Images::default(),
        notes: vec![note],
    })
}

/// The notes of a result no call collected, for the next one.
pub(super) fn uncollected(prev: CellReport) -> Vec<String> {
    let mut notes = vec![match &prev.error {
        Some(e) if e.kind == NOT_RUN => format!("Not collected before this call: {}.", e.message),
        _ => format!(
            "Cell {} finished before this call ({}); its result had not been collected:\n{}",
            prev.cell,
            prev.status.as_str(),
            prev.brief()
        ),
    }];
    notes.extend(prev.notes);
    notes
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
        super::durable::refused(sess)?;
        if is_dormant(sess) {
            // Its saved state, loaded: no cell runs (else the choice).
            self.resume_saved(sess).await?;
        }
        let worker = self.ensure_worker(sess).await?;
        let _guard = sess.start_lock.lock().await;
        let mut st = sess.lock();
        self.refresh(sess, &mut st);
        let worker = st.worker.clone().unwrap_or(worker);
        if st.rebuild.is_none() {
            if !st.pending.is_some_and(Pending::rebuilds_on_use) {
                return Ok(Ready::Worker(worker));
            }
            self.begin_rebuild(sess, &mut st, &worker);
        }
        if let Some(code) = code {
            self.queue(sess, &mut st, code)?;
        }
        Ok(Ready::Rebuilding(worker))
    }

    /// Starts rebuilding the session's path in `worker` (a fresh
    /// interpreter) in a task of its own.
    pub(super) fn begin_rebuild(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        st: &mut SessionState,
        worker: &Arc<Worker>,
    ) {
        let why = st.pending.take().map_or_else(String::new, Pending::why);
        let skip = std::mem::take(&mut st.skip);
        let mut plan = Account::default();
        let plan: Vec<u64> = runnable(&st.path, skip, &mut plan)
            .iter()
            .map(|c| c.id)
            .collect();
        let id = NEXT_REBUILD.fetch_add(1, Ordering::Relaxed);
        st.rebuild = Some(Rebuilding {
            id,
            why,
            plan: if plan.len() > self.durable.max_cells {
                Vec::new()
            } else {
                plan
            },
            current: None,
            started: Instant::now(),
            queued: None,
            stop: None,
            replayed: None,
            aside: std::mem::take(&mut st.notes),
            kept: st.completed.take(),
        });
        let job = RebuildJob {
            id,
            path: st.path.clone(),
            cut: st.path_cut,
            skip,
        };
        tokio::spawn(self.clone().run_rebuild(sess.clone(), worker.clone(), job));
    }

    /// Queues a call's code after the rebuild under way, as the next cell;
    /// refused when another call's code is queued already.
    fn queue(
        &self,
        sess: &Session,
        st: &mut SessionState,
        code: &CellSource<'_>,
    ) -> Result<u64, SessionError> {
        let number = st.next_cell;
        let Some(rb) = st.rebuild.as_mut() else {
            return Err(SessionError::Idle(sess.language, sess.name.clone()));
        };
        if rb.queued.is_some() {
            return Err(rebuilding_error(sess, rb));
        }
        if let Some(prev) = rb.kept.take() {
            rb.aside.extend(uncollected(prev));
        }
        rb.queued = Some(Queued {
            number,
            source: Arc::new(StoredSource::of(code)),
            since: Instant::now(),
        });
        st.next_cell += 1;
        st.last_used = Instant::now();
        Ok(number)
    }

    /// The end of rebuild `job`: the path is what the interpreter holds,
    /// the account goes into the notes, and the queued cell starts (or is
    /// reported not run, when the rebuild was stopped or lost its
    /// interpreter).
    pub(super) fn end_rebuild(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        job: &RebuildJob,
        account: Account,
        reached: usize,
    ) {
        let mut st = sess.lock();
        let Some(rb) = st.rebuild.take_if(|r| r.id == job.id) else {
            return;
        };
        let failed: Vec<u64> = account.failed.iter().map(|(id, _)| *id).collect();
        st.path.truncate(reached);
        for c in st.path.iter_mut().filter(|c| failed.contains(&c.id)) {
            c.status = CellStatus::Error;
        }
        st.path_bytes = st.path.iter().map(|c| c.source.size()).sum();
        let head = st.head();
        st.delivered = None;
        let text = account.describe(&sess.name, &rb.why);
        let mut notes = rb.aside;
        notes.append(&mut st.notes);
        notes.push(text.clone());
        st.notes = notes;
        if st.completed.is_none() {
            st.completed = rb.kept;
        }
        st.rebuilt = Some((job.id, text, rb.queued.is_some()));
        let mut started = None;
        if let Some(q) = rb.queued {
            let why_not = match (&rb.stop, worker.exit_info()) {
                (Some(stop), _) => Some(format!("was stopped ({stop})")),
                (None, Some(_)) => Some("lost its interpreter".to_string()),
                _ => None,
            };
            let sent = match why_not {
                Some(why) => Err(why),
                None => self
                    .send_cell(sess, &mut st, worker, q.number, q.source.clone())
                    .map(drop)
                    .map_err(|e| format!("could not start it ({e})")),
            };
            match sent {
                Ok(()) => started = Some(q.number),
                Err(why) => self.not_run(sess, &mut st, q, &why),
            }
        }
        drop(st);
        if reached < job.path.len() {
            self.persist_head(sess, head);
        }
        if let Some(cell) = started {
            self.arm_time_limit(sess, worker, cell);
        }
        sess.touch();
    }

    /// The queued cell's result when its code did not run.
    fn not_run(&self, sess: &Session, st: &mut SessionState, q: Queued, why: &str) {
        let report = CellReport {
            status: CellStatus::Interrupted,
            session: sess.name.clone(),
            language: sess.language,
            cell: q.number,
            output: Default::default(),
            background: None,
            value: None,
            error: Some(PyError {
                kind: NOT_RUN.into(),
                message: format!(
                    "cell {} was queued after the rebuild of session '{}', which {why}, and did not run",
                    q.number, sess.name
                ),
                traceback: String::new(),
            }),
            prompt: None,
            elapsed_ms: q.since.elapsed().as_secs_f64() * 1000.0,
            images: Images::default(),
            notes: std::mem::take(&mut st.notes),
        };
        st.completed = Some(report);
        self.record_history(st, q.source.as_source().describe(), st.head());
    }

    /// Waits (at most `wait`) for the rebuild under way to end; the worker
    /// then, or the refusal saying it still runs.
    pub(super) async fn await_rebuild(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        wait: Duration,
    ) -> Result<Arc<Worker>, SessionError> {
        let Some(id) = sess.lock().rebuild.as_ref().map(|r| r.id) else {
            return Ok(worker.clone());
        };
        self.watch(sess, worker, wait, |st, timed_out| {
            match st.rebuild.as_ref().filter(|r| r.id == id) {
                None => Some(Ok(st.worker.clone().unwrap_or_else(|| worker.clone()))),
                Some(rb) if timed_out => Some(Err(rebuilding_error(sess, rb))),
                Some(_) => None,
            }
        })
        .await
    }

    /// Stops the rebuild under way (for `reason`): the cell it re-runs is
    /// interrupted, the rest are not re-run and the queued code does not
    /// run. Returns the worker once the rebuild has ended, or None when
    /// no rebuild runs.
    async fn stop_rebuild(&self, sess: &Arc<Session>, reason: &str) -> Option<Arc<Worker>> {
        let (id, worker, cell) = {
            let mut st = sess.lock();
            self.refresh(sess, &mut st);
            let cell = st.running.as_ref().filter(|r| r.replay).map(|r| r.number);
            let worker = st.worker.clone();
            let rb = st.rebuild.as_mut()?;
            rb.stop = Some(reason.to_string());
            (rb.id, worker?, cell)
        };
        if let Some(cell) = cell {
            self.stop_cell(sess, &worker, cell, None).await;
        }
        let bound = self.limits.max_wait;
        self.watch(sess, &worker, bound, |st, timed_out| {
            let gone = st.rebuild.as_ref().is_none_or(|r| r.id != id);
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
            if st.rebuild.is_none() && st.completed.is_none() {
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

/// A rebuild's progress: (seconds, "rebuilding session 'x' (why): ...").
pub(super) fn rebuild_progress(sess: &Session, st: &SessionState) -> Option<(f64, String)> {
    let rb = st.rebuild.as_ref()?;
    let line = format!("rebuilding session '{}' {}", sess.name, rb.detail());
    Some((rb.started.elapsed().as_secs_f64(), line))
}

/// The queued cell of a rebuild under way: (number, code, seconds).
pub(super) fn queued_cell(st: &SessionState) -> Option<(u64, String, f64)> {
    let q = st.rebuild.as_ref()?.queued.as_ref()?;
    Some((
        q.number,
        q.source.as_source().describe(),
        q.since.elapsed().as_secs_f64(),
    ))
}

/// What a reset or delete says of the rebuild it ended.
pub(super) fn ended_note(rb: &Rebuilding) -> String {
    match &rb.queued {
        Some(q) => format!(
            " Its rebuild was stopped; cell {}, queued after it, did not run.",
            q.number
        ),
        None => " Its rebuild was stopped.".to_string(),
    }
}
