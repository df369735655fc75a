//! Rebuilding a session's state by re-running the cells of its path in a
//! fresh interpreter (after a restart, a crash or a switch to a branch
//! without a checkpoint), and the account of what was re-run.

use super::durable::{PathCell, ranges};
use super::report::CellStatus;
use super::*;

/// What one rebuild did, for the agent.
#[derive(Default)]
pub(super) struct Account {
    rerun: Vec<u64>,
    skipped: Vec<(u64, String)>,
    failed: Vec<(u64, String)>,
    stopped: Option<String>,
    secs: f64,
}

impl Account {
    fn describe(&self, session: &str, why: &str) -> String {
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
        if let Some(stop) = &self.stopped {
            text.push_str(&format!(
                " Stopped early: {stop}; later cells were not re-run."
            ));
        }
        text
    }
}

/// The cells of `path` after the first `skip` that can be re-run; the
/// others go into the account with why.
fn runnable<'a>(path: &'a [PathCell], skip: usize, account: &mut Account) -> Vec<&'a PathCell> {
    path.iter()
        .skip(skip)
        .filter(|c| {
            let why = if !c.replayable {
                Some("its code was too long to keep")
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

impl SessionManager {
    /// Re-runs the session's path in `worker` (a fresh interpreter) and
    /// says what it did. The path is cut where it stopped.
    pub(super) async fn rebuild(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        why: &str,
    ) -> String {
        // The re-run cells' results are collected and dropped: notes meant
        // for the agent's own cell wait aside meanwhile.
        let (path, cut, kept, skip, notes) = {
            let mut st = sess.lock();
            st.pending = None;
            let skip = std::mem::take(&mut st.skip);
            let notes = std::mem::take(&mut st.notes);
            (
                st.path.clone(),
                st.path_cut,
                st.completed.take(),
                skip,
                notes,
            )
        };
        let mut account = Account::default();
        if cut {
            account.stopped = Some(
                "the earliest cells of this state are no longer kept (the store's retention or the 16 MiB bound on code kept per session), so the rebuilt state may lack them".into(),
            );
        }
        let runnable = runnable(&path, skip, &mut account);
        let started = Instant::now();
        let reached = if runnable.len() > self.durable.max_cells {
            account.stopped = Some(format!(
                "it needs {} cells re-run, more than --resume-max-cells {}; the interpreter is fresh",
                runnable.len(),
                self.durable.max_cells
            ));
            0
        } else {
            self.replay_all(sess, worker, &path, runnable, started, &mut account)
                .await
        };
        account.secs = started.elapsed().as_secs_f64();
        let head = {
            let mut st = sess.lock();
            let failed: Vec<u64> = account.failed.iter().map(|(id, _)| *id).collect();
            st.path.truncate(reached);
            for c in st.path.iter_mut().filter(|c| failed.contains(&c.id)) {
                c.status = CellStatus::Error;
            }
            st.path_bytes = st.path.iter().map(|c| c.source.size()).sum();
            st.delivered = None;
            st.completed = kept;
            st.notes = notes;
            st.head()
        };
        if reached < path.len() {
            self.persist_head(sess, head);
        }
        account.describe(&sess.name, why)
    }

    /// Runs one cell of a rebuild; its output is dropped.
    async fn replay_one(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        cell: &PathCell,
        wait: Duration,
    ) -> Result<CellReport, SessionError> {
        {
            let mut st = sess.lock();
            self.refresh(sess, &mut st);
            if let Some(run) = &st.running {
                return Err(super::cells::busy(sess, run));
            }
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
            st.running = Some(run);
        }
        self.collect(sess, worker, wait).await
    }

    /// Re-runs `runnable` (cells of `path`) one by one until the time runs
    /// out or the interpreter cannot go on; how many cells of `path` the
    /// interpreter then holds.
    async fn replay_all(
        &self,
        sess: &Arc<Session>,
        worker: &Arc<Worker>,
        path: &[PathCell],
        runnable: Vec<&PathCell>,
        started: Instant,
        account: &mut Account,
    ) -> usize {
        let deadline = started + self.durable.max_time;
        for cell in runnable.into_iter() {
            let left = deadline.saturating_duration_since(Instant::now());
            let stop = match self.replay_one(sess, worker, cell, left).await {
                Ok(r) if r.status == CellStatus::Ok => {
                    account.rerun.push(cell.id);
                    None
                }
                Ok(r) if matches!(r.status, CellStatus::Error | CellStatus::Interrupted) => {
                    let error = r.error.map_or_else(
                        || r.status.as_str().to_string(),
                        |e| format!("{}: {}", e.kind, e.message),
                    );
                    account.failed.push((cell.id, error));
                    None
                }
                Ok(r) if r.status == CellStatus::Crashed => Some(format!(
                    "the interpreter crashed re-running cell {}",
                    cell.id
                )),
                Ok(_) => {
                    self.stop_cell(sess, worker, cell.id, None).await;
                    sess.lock().completed = None;
                    Some(format!(
                        "cell {} was still running when --resume-max-seconds ({:.0} s) ran out, or asked for input; it was interrupted",
                        cell.id,
                        self.durable.max_time.as_secs_f64()
                    ))
                }
                Err(e) => Some(e.to_string()),
            };
            if let Some(stop) = stop {
                account.stopped = Some(stop);
                return path.iter().position(|c| c.id == cell.id).unwrap_or(0);
            }
        }
        path.len()
    }
}
