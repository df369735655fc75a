//! Rebuilding a session's state by re-running the cells of its path in a
//! fresh interpreter (after a restart, a crash or a switch to a branch
//! without a checkpoint), and the account of what was re-run. It runs as a
//! task of its own, started here by `begin_rebuild` (for the call in
//! `resume.rs` that needs the state), so no call waits for it longer than
//! its window; at its end the queued cell starts, or is reported not run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::error::SessionError;
use super::lifecycle::{NOT_RUN, Pending, Queued, Rebuilding, Rebuilt};
use super::lineage::{PathCell, ranges};
use super::manager::SessionManager;
use super::report::{CellReport, CellStatus, Images};
use super::state::{Session, SessionState};
use crate::worker::Worker;
use crate::worker::protocol::PyError;

static NEXT_REBUILD: AtomicU64 = AtomicU64::new(1);

/// What the task of a rebuild re-runs.
pub(super) struct RebuildJob {
    pub(super) id: u64,
    pub(super) path: Vec<PathCell>,
    pub(super) cut: bool,
    pub(super) skip: usize,
}

/// What one rebuild did, for the agent.
#[derive(Default)]
pub(super) struct Account {
    rerun: Vec<u64>,
    skipped: Vec<(u64, String)>,
    pub(super) failed: Vec<(u64, String)>,
    /// The path's earliest cells are no longer kept.
    lacks_oldest: bool,
    stopped: Option<String>,
    /// Cells that should have been re-run and were not (the rebuild stopped).
    missing: Vec<u64>,
    secs: f64,
}

impl Account {
    pub(super) fn describe(&self, session: &str, why: &str) -> String {
        let mut text = if self.rerun.is_empty() {
            format!("Session '{session}' ({why}): no cell was re-run.")
        } else {
            format!(
                "Session '{session}' ({why}) was rebuilt by re-running cells {} in {:.1} s.",
                ranges(&self.rerun),
                self.secs
            )
        };
        for (id, why) in &self.skipped {
            text.push_str(&format!(" Cell {id} was skipped: {why}."));
        }
        for (id, error) in &self.failed {
            text.push_str(&format!(" Cell {id} failed when re-run: {error}."));
        }
        if self.lacks_oldest {
            text.push_str(" The earliest cells of this state are no longer kept (the store's retention or the 16 MiB bound on code kept per session), so the rebuilt state may lack them.");
        }
        if let Some(stop) = &self.stopped {
            text.push_str(&format!(" Stopped early: {stop}."));
        }
        match self.missing.as_slice() {
            [] => {}
            [one] => text.push_str(&format!(
                " Cell {one} was not re-run: the session lacks its effects."
            )),
            many => text.push_str(&format!(
                " Cells {} were not re-run: the session lacks their effects.",
                ranges(many)
            )),
        }
        text
    }

    /// The rebuild stops at runnable cell `from` (which is not counted as
    /// re-run): it and the later ones are missing.
    fn stop(&mut self, why: String, rest: &[&PathCell]) {
        self.stopped = Some(why);
        self.missing = rest.iter().map(|c| c.id).collect();
    }
}

/// How many cells a rebuild of the session would re-run.
pub(super) fn rebuild_size(st: &SessionState) -> usize {
    runnable(
        st.lineage.path(),
        st.lineage.skip(),
        &mut Account::default(),
    )
    .len()
}

/// `1 cell`, `3 cells`.
pub(super) fn cells(n: usize) -> String {
    if n == 1 {
        "1 cell".to_string()
    } else {
        format!("{n} cells")
    }
}

/// What a rebuild of the session would do, said before it runs anything
/// (python_sessions rebuild without confirm).
pub(super) fn preview(sess: &Session, st: &SessionState, max_cells: usize) -> String {
    let mut account = Account::default();
    let ids: Vec<u64> = runnable(st.lineage.path(), st.lineage.skip(), &mut account)
        .iter()
        .map(|c| c.id)
        .collect();
    let why = st.lifecycle.pending().map_or_else(
        || "its interpreter holds its state".to_string(),
        |p| p.why(),
    );
    if ids.is_empty() {
        return format!(
            "Session '{}' ({why}) has no cell a rebuild could re-run; python_sessions {{\"action\": \"reset\"}} starts it afresh.",
            sess.name
        );
    }
    let mut text = format!(
        "A rebuild of session '{}' ({why}) re-runs cells {} in a fresh interpreter, in order. Whatever they did outside the session happens again: files written, data appended, requests sent.",
        sess.name,
        ranges(&ids)
    );
    for (id, why) in &account.skipped {
        text.push_str(&format!(" Cell {id} would be skipped: {why}."));
    }
    if ids.len() > max_cells {
        text.push_str(&format!(
            " That is more than the {} a rebuild may re-run (--resume-max-cells): it would be refused; raise the flag or reset the session.",
            cells(max_cells)
        ));
    }
    text.push_str(&format!(
        " To run them: python_sessions {{\"action\": \"rebuild\", \"session\": \"{}\", \"confirm\": true}}.",
        sess.name
    ));
    text
}

/// The cells of `path` after the first `skip` that can be re-run; the
/// others go into the account with why.
pub(super) fn runnable<'a>(
    path: &'a [PathCell],
    skip: usize,
    account: &mut Account,
) -> Vec<&'a PathCell> {
    path.iter()
        .skip(skip)
        .filter(|c| {
            let why = if !c.replayable {
                Some("its code was too long to keep")
            } else if c.tool_calls {
                Some("it called MCP tools, which a rebuild does not repeat")
            } else {
                match c.status {
                    CellStatus::Ok => None,
                    CellStatus::Interrupted => Some("it was interrupted"),
                    CellStatus::Crashed => Some("its interpreter crashed"),
                    _ => Some("it had failed"),
                }
            };
            if let Some(why) = why {
                account.skipped.push((c.id, why.to_string()));
            }
            why.is_none()
        })
        .collect()
}

/// How re-running one cell went.
enum Replayed {
    Done(Box<CellReport>),
    /// Still running when the rebuild's time ran out, or asking for input.
    Stalled,
    /// An interrupt asked the rebuild to stop before the cell was sent.
    Stopped(String),
    /// The rebuild was ended (reset, delete): the task leaves the session.
    Gone,
}

impl SessionManager {
    /// The body of a rebuild's task: re-runs the path in `worker` (a fresh
    /// interpreter), then hands the session over (`end_rebuild`).
    pub(super) async fn run_rebuild(
        self: Arc<Self>,
        sess: Arc<Session>,
        worker: Arc<Worker>,
        job: RebuildJob,
    ) {
        let mut account = Account {
            lacks_oldest: job.cut,
            ..Account::default()
        };
        let runnable = runnable(&job.path, job.skip, &mut account);
        let started = Instant::now();
        let reached = if runnable.len() > self.durable.max_cells {
            account.stopped = Some(format!(
                "it needs {} cells re-run, more than --resume-max-cells {}; the interpreter is fresh",
                runnable.len(),
                self.durable.max_cells
            ));
            Some(0)
        } else {
            self.replay_all(&sess, &worker, &job, runnable, started, &mut account)
                .await
        };
        let Some(reached) = reached else {
            return;
        };
        account.secs = started.elapsed().as_secs_f64();
        self.end_rebuild(&sess, &worker, &job, account, reached);
    }

    /// Runs one cell of a rebuild; its output is dropped.
    async fn replay_one(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        id: u64,
        cell: &PathCell,
        wait: Duration,
    ) -> Result<Replayed, SessionError> {
        {
            let mut st = sess.lock();
            self.refresh(sess, &mut st);
            if let Some(run) = &st.inbox.running {
                return Err(sess.busy(run));
            }
            let Some(rb) = st.lifecycle.rebuild_mut().filter(|r| r.id == id) else {
                return Ok(Replayed::Gone);
            };
            if let Some(stop) = &rb.stop {
                return Ok(Replayed::Stopped(stop.clone()));
            }
            rb.current = Some(cell.id);
            drop(worker.take_output());
            worker.start_cell_log(self.limits.cell_log_bytes);
            worker
                .send(&cell.source.as_source().request(cell.id))
                .map_err(|source| SessionError::Worker {
                    session: sess.name.clone(),
                    source,
                })?;
            let mut run = self.new_running_cell(cell.id, sess.language, cell.source.clone());
            run.replay = true;
            st.inbox.running = Some(run);
        }
        Ok(self
            .watch(sess, worker, wait, |st, timed_out| {
                let prompt = st
                    .inbox
                    .running
                    .as_ref()
                    .is_some_and(|r| r.prompt.is_some());
                let Some(rb) = st.lifecycle.rebuild_mut().filter(|r| r.id == id) else {
                    return Some(Replayed::Gone);
                };
                if let Some(report) = rb.replayed.take() {
                    return Some(Replayed::Done(Box::new(report)));
                }
                (timed_out || prompt).then_some(Replayed::Stalled)
            })
            .await)
    }

    /// Re-runs `runnable` (cells of the job's path) one by one until the
    /// time runs out, an interrupt stops it or the interpreter cannot go
    /// on; how many cells of the path the interpreter then holds (None: the
    /// rebuild was ended under it).
    async fn replay_all(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        job: &RebuildJob,
        runnable: Vec<&PathCell>,
        started: Instant,
        account: &mut Account,
    ) -> Option<usize> {
        let deadline = started + self.durable.max_time;
        for (i, cell) in runnable.iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            let replayed = self.replay_one(sess, worker, job.id, cell, left).await;
            let stop = match replayed {
                Ok(Replayed::Gone) => return None,
                Ok(Replayed::Stopped(stop)) => {
                    Some(format!("{stop} before cell {} was re-run", cell.id))
                }
                Ok(Replayed::Done(r)) if r.status == CellStatus::Ok => {
                    account.rerun.push(cell.id);
                    None
                }
                Ok(Replayed::Done(r))
                    if r.status == CellStatus::Interrupted
                        && self.stop_asked(sess, job.id).is_some() =>
                {
                    let stop = self.stop_asked(sess, job.id).unwrap_or_default();
                    Some(format!("{stop} while it re-ran cell {}", cell.id))
                }
                Ok(Replayed::Done(r)) if r.status == CellStatus::Crashed => Some(format!(
                    "the interpreter crashed re-running cell {}",
                    cell.id
                )),
                Ok(Replayed::Done(r)) => {
                    let error = r.error.map_or_else(
                        || r.status.as_str().to_string(),
                        |e| format!("{}: {}", e.kind, e.message),
                    );
                    account.failed.push((cell.id, error));
                    None
                }
                Ok(Replayed::Stalled) => {
                    self.stop_cell(sess, worker, cell.id, None).await;
                    if let Some(rb) = sess.lock().lifecycle.rebuild_mut() {
                        rb.replayed = None;
                    }
                    Some(format!(
                        "cell {} was still running when --resume-max-seconds ({:.0} s) ran out, or asked for input; it was interrupted",
                        cell.id,
                        self.durable.max_time.as_secs_f64()
                    ))
                }
                Err(e) => Some(e.to_string()),
            };
            if let Some(stop) = stop {
                account.stop(stop, &runnable[i..]);
                return Some(job.path.iter().position(|c| c.id == cell.id).unwrap_or(0));
            }
        }
        Some(job.path.len())
    }

    /// Why an interrupt asked rebuild `id` to stop, if it did.
    fn stop_asked(&self, sess: &Session, id: u64) -> Option<String> {
        let st = sess.lock();
        st.lifecycle
            .rebuild()
            .filter(|r| r.id == id)
            .and_then(|r| r.stop.clone())
    }
    /// Starts rebuilding the session's path in `worker` (a fresh
    /// interpreter) in a task of its own.
    pub(super) fn begin_rebuild(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        st: &mut SessionState,
        worker: &Arc<Worker>,
    ) {
        let why = st
            .lifecycle
            .take_pending()
            .map_or_else(String::new, Pending::why);
        let skip = st.lineage.take_skip();
        let mut plan = Account::default();
        let plan: Vec<u64> = runnable(st.lineage.path(), skip, &mut plan)
            .iter()
            .map(|c| c.id)
            .collect();
        let id = NEXT_REBUILD.fetch_add(1, Ordering::Relaxed);
        let rebuilding = Rebuilding {
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
            kept: st.inbox.completed.take(),
        };
        st.lifecycle.start_rebuild(rebuilding);
        let job = RebuildJob {
            id,
            path: st.lineage.path().to_vec(),
            cut: st.lineage.is_cut(),
            skip,
        };
        tokio::spawn(self.clone().run_rebuild(sess.clone(), worker.clone(), job));
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
        let Some(rb) = st.lifecycle.end_rebuild(job.id) else {
            return;
        };
        let rb = *rb;
        let failed: Vec<u64> = account.failed.iter().map(|(id, _)| *id).collect();
        st.lineage.rebuilt_to(reached, &failed);
        let head = st.head();
        st.inbox.delivered = None;
        let text = account.describe(&sess.name, &rb.why);
        let mut notes = rb.aside;
        notes.append(&mut st.notes);
        notes.push(text.clone());
        st.notes = notes;
        if st.inbox.completed.is_none() {
            st.inbox.completed = rb.kept;
        }
        st.lifecycle.set_rebuilt(Rebuilt {
            id: job.id,
            text,
            queued: rb.queued.is_some(),
        });
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
        st.inbox.completed = Some(report);
        let head = st.head();
        self.record_history(st, q.source.as_source().describe(), head);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_names_the_cells_a_stopped_rebuild_did_not_re_run() {
        let account = Account {
            rerun: vec![1, 2],
            skipped: vec![(3, "it had failed".into())],
            stopped: Some(
                "interrupted by python_wait with interrupt: true while it re-ran cell 4".into(),
            ),
            missing: vec![4, 5, 6],
            secs: 1.25,
            ..Account::default()
        };
        assert_eq!(
            account.describe("data", "dormant since the server restarted"),
            "Session 'data' (dormant since the server restarted) was rebuilt by re-running cells 1-2 in 1.2 s. \
             Cell 3 was skipped: it had failed. \
             Stopped early: interrupted by python_wait with interrupt: true while it re-ran cell 4. \
             Cells 4-6 were not re-run: the session lacks their effects."
        );
        let one = Account {
            missing: vec![2],
            ..Account::default()
        };
        assert!(
            one.describe("s", "why")
                .ends_with("Cell 2 was not re-run: the session lacks its effects."),
            "{}",
            one.describe("s", "why")
        );
    }
}
