//! One job: its process, its output as it comes, its stdin, its exit.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::report::JobReport;
use crate::output::log::CellLog;
use crate::output::{Capture, Stream};
use crate::process::{self, ExitInfo, Input, Output, Process, Spawned};
use crate::session::gate::Slot;

pub(super) struct JobState {
    pub(super) capture: Capture,
    pub(super) log: CellLog,
    pub(super) exit: Option<ExitInfo>,
    open_streams: usize,
    pub(super) finished_at: Option<Instant>,
    notes: Vec<String>,
    /// Killed by the resource watch (once).
    limit_killed: bool,
}

pub struct Job {
    pub(super) id: String,
    pub(super) command: String,
    /// `/bin/sh` (or the sandbox launcher above it), with the job's private
    /// temporary directory (HOME, TMPDIR) and its cgroups.
    pub(super) process: Process,
    pub(super) pty: bool,
    pub(super) started: Instant,
    pub(super) stdin: tokio::sync::Mutex<Option<Input>>,
    state: Mutex<JobState>,
    pub(super) changed: watch::Sender<u64>,
}

impl Job {
    /// Job `n` of `spawned`, running: its output read into `capture`, its
    /// exit watched, `stdin` (if given) written to it and its stdin then
    /// closed (ended with Ctrl-D on a terminal).
    pub(super) fn follow(
        n: u64,
        command: String,
        pty: bool,
        capture: Capture,
        spawned: Spawned,
        stdin: Option<String>,
        slot: Option<Slot>,
    ) -> Arc<Job> {
        let (changed, _) = watch::channel(0u64);
        let job = Arc::new(Job {
            id: format!("j{n}"),
            command,
            process: spawned.process,
            pty,
            started: Instant::now(),
            stdin: tokio::sync::Mutex::new(None),
            state: Mutex::new(JobState {
                capture,
                log: CellLog::new(n),
                exit: None,
                open_streams: spawned.outputs.len(),
                finished_at: None,
                notes: Vec::new(),
                limit_killed: false,
            }),
            changed,
        });
        for (stream, reader) in spawned.outputs {
            tokio::spawn(read_output(job.clone(), stream, reader));
        }
        tokio::spawn(watch_exit(job.clone(), spawned.child, slot));
        tokio::spawn(feed_stdin(job.clone(), spawned.stdin, stdin));
        job
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, JobState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(super) fn signal(&self, sig: Signal) {
        if self.lock().exit.is_none() {
            self.process.signal_group(sig);
        }
    }

    /// SIGKILL to the process group and to every descendant, so children
    /// that left the group (`setsid`, daemons) go too.
    pub(super) fn kill_all(&self) {
        self.process.kill_all();
    }

    /// Kills a running job for going over a limit, with `reason` in its
    /// report the first time; true that first time (false when it had
    /// ended, or on a repeated kill of what was left).
    pub(super) fn kill_for(&self, reason: String) -> bool {
        let first = {
            let mut st = self.lock();
            if st.exit.is_some() {
                return false;
            }
            let first = !st.limit_killed;
            if first {
                st.limit_killed = true;
                st.notes.push(reason);
            }
            first
        };
        self.kill_all();
        first
    }

    pub(super) fn root_pid(&self) -> u32 {
        self.process.pid()
    }

    /// [`Job::kill_all`] off the async threads (a large tree takes a while).
    pub(super) async fn kill_all_off_thread(self: &Arc<Self>) {
        let target = self.clone();
        let _ = tokio::task::spawn_blocking(move || target.kill_all()).await;
    }

    /// Its row as the job list shows it (nothing taken).
    pub fn view_info(&self) -> super::report::JobInfo {
        super::report::JobInfo::new(self, self.lock().exit.as_ref())
    }

    /// Bytes of output recorded so far: those reported and those not yet.
    pub fn output_len(&self) -> u64 {
        let st = self.lock();
        st.log.len() + st.capture.log_len().0
    }

    /// Bytes `from..from + n` of its output (only those are read), and
    /// the output's length, looked at together.
    pub fn output_range(&self, from: u64, n: u64) -> (u64, Vec<u8>) {
        let mut st = self.lock();
        let logged = st.log.len();
        let total = logged + st.capture.log_len().0;
        let mut out = Vec::new();
        st.log.read_range(from, n, &mut out);
        let rest = n.saturating_sub(out.len() as u64);
        if rest > 0 {
            st.capture
                .read_log_range(from.max(logged) - logged, rest, &mut out);
        }
        (total, out)
    }

    /// Where its whole output so far is, to read it without the job's lock.
    pub fn output_pieces(&self) -> Vec<crate::output::log::Piece> {
        let mut st = self.lock();
        let mut pieces = Vec::new();
        st.log.pieces(&mut pieces);
        st.capture.log_pieces(&mut pieces);
        pieces
    }

    /// A receiver that wakes when the job's output or state changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(super) fn done(&self, grace: Duration) -> bool {
        let st = self.lock();
        let closed = st.open_streams == 0;
        st.exit.as_ref().is_some_and(|e| e.drained(closed, grace))
    }

    /// A report with the output not returned before.
    pub(super) fn report(&self, grace: Duration) -> JobReport {
        let finished = self.done(grace);
        let mut st = self.lock();
        let mut output = st.capture.take();
        let segments = output.take_log();
        st.log.add_all(segments);
        let exit = st.exit.clone().filter(|_| finished);
        let notes = std::mem::take(&mut st.notes);
        let elapsed = match (&exit, st.finished_at) {
            (Some(_), Some(at)) => at.duration_since(self.started),
            _ => self.started.elapsed(),
        };
        let elapsed_ms = elapsed.as_secs_f64() * 1000.0;
        JobReport::new(self, exit.as_ref(), output.render(), elapsed_ms, notes)
    }
}

async fn read_output(job: Arc<Job>, stream: Stream, mut reader: Output) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // A pty reports EIO once the last process on the terminal has gone.
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        job.lock().capture.push(stream, &buf[..n]);
        job.bump();
    }
    job.lock().open_streams -= 1;
    job.bump();
}

/// Writes `initial` (given at start) to the job's stdin, then closes it;
/// keeps it open for later input otherwise.
async fn feed_stdin(job: Arc<Job>, mut stdin: Option<Input>, initial: Option<String>) {
    if let (Some(text), Some(w)) = (initial, stdin.as_mut()) {
        let _ = w.write_all(text.as_bytes()).await;
        let _ = w.flush().await;
        if job.pty {
            // Ctrl-D: end of input for the program on the terminal.
            let _ = w.write_all(b"\x04").await;
        } else {
            stdin = None;
        }
    }
    *job.stdin.lock().await = stdin;
}

/// Records the job's exit; its slot in the instance's job budget is given
/// back then.
async fn watch_exit(job: Arc<Job>, mut child: tokio::process::Child, slot: Option<Slot>) {
    // The group is left alone: what the job started in the background may
    // still be writing its output (see `drain_grace`).
    let status = job.process.wait(&mut child, false).await;
    drop(slot);
    let cgroup = job.process.take_cgroup();
    if let Some(group) = &cgroup {
        let notes = [group.limit_hit(), group.task_limit_note()];
        job.lock()
            .notes
            .extend(notes.into_iter().flatten().map(|n| format!("The job {n}.")));
    }
    {
        let mut st = job.lock();
        st.exit = Some(ExitInfo::now(status));
        st.finished_at = Some(Instant::now());
    }
    job.bump();
    // The cgroup is emptied first, so nothing left in it writes into the
    // home while it is removed.
    process::release(cgroup).await;
    job.process.remove_home().await;
}
