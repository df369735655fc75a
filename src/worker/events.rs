//! Events from the driver: a cell's event is delivered once the output
//! before its fence has come through the pipes (see docs/protocol.md).

use std::sync::Arc;

use super::FencedEvent;
use super::kernel::ForeignCell;
use super::protocol::{CellEvent, Event};
use super::{FENCE_GRACE, ReadyInfo, State, Worker};

/// Other clients' cells a worker keeps until the session takes them.
const MAX_FOREIGN_KEPT: usize = 32;

/// A cell another client ran, with the last of this worker's cells whose
/// end came before it (0: none): the kernel runs one cell at a time, so
/// that is where it ran among the agent's cells.
#[derive(Debug, Clone)]
pub struct ForeignRun {
    pub after: u64,
    pub cell: ForeignCell,
}

impl Worker {
    pub(super) async fn handle_event(self: &Arc<Self>, event: Event) {
        match event {
            Event::Cell {
                fence,
                fenced,
                event,
            } => self.deliver(fence, &fenced, event).await,
            Event::Ready {
                pid,
                version,
                executable,
                preimport_failed,
            } => {
                report_preimport_failures(&preimport_failed);
                // Shown and signalled from outside: the host's pid, not the
                // one inside the sandbox's PID namespace.
                let root = self.process.pid();
                let pid =
                    tokio::task::spawn_blocking(move || crate::sandbox::watch::host_pid(root, pid))
                        .await
                        .ok()
                        .flatten()
                        .unwrap_or(pid);
                self.lock().ready = Some(ReadyInfo {
                    pid,
                    python_version: version,
                    executable,
                });
                self.bump();
            }
            Event::Upstream(ev) => self.on_upstream(ev),
            // Its bytes are taken by the control reader before it gets here.
            Event::StateData { .. } => {}
            Event::Foreign { cell } => {
                let mut state = self.lock();
                if state.foreign.len() >= MAX_FOREIGN_KEPT {
                    state.foreign.pop_front();
                    state.foreign_dropped += 1;
                }
                let after = state.last_done;
                state.foreign.push_back(ForeignRun { after, cell });
                drop(state);
                self.bump();
            }
            Event::Reply { id, body } => {
                if let Some(tx) = self.lock().inspect_waiters.remove(&id) {
                    let _ = tx.send(body);
                }
            }
        }
    }

    /// Queues `event` with the output before `fence`, once that has come
    /// through the `fenced` pipes.
    async fn deliver(&self, fence: u64, fenced: &[String], event: CellEvent) {
        let need = [
            fenced.iter().any(|s| s == "stdout"),
            fenced.iter().any(|s| s == "stderr"),
        ];
        let reached = |s: &State| (0..2).all(|i| !need[i] || s.eof[i] || s.fence_seen[i] >= fence);
        if tokio::time::timeout(FENCE_GRACE, self.wait_until(reached))
            .await
            .is_err()
        {
            tracing::warn!(
                pid = self.process.pid(),
                fence,
                "output fence did not arrive; delivering the event anyway"
            );
        }
        let mut st = self.lock();
        let output = st.capture.take();
        st.released = st.released.max(fence);
        if let CellEvent::Done { cell, .. } = &event {
            st.last_done = st.last_done.max(*cell);
        }
        st.events.push_back(FencedEvent { event, output });
        drop(st);
        self.bump();
    }
}

/// Logs the `--preimport` modules that failed to import, once per server:
/// every interpreter would say the same, and it is not fatal (the cell that
/// imports it raises as it would have).
fn report_preimport_failures(failed: &[String]) {
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if failed.is_empty() || REPORTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    tracing::warn!(
        "--preimport: {} did not import (sessions start without it; fix or drop it from --preimport)",
        failed.join("; ")
    );
}

impl Worker {
    /// Takes the cells other clients ran in its kernel since the last take,
    /// oldest first, with how many more ran but were not kept.
    pub fn take_foreign(&self) -> (Vec<ForeignRun>, usize) {
        let mut state = self.lock();
        let dropped = std::mem::take(&mut state.foreign_dropped);
        (state.foreign.drain(..).collect(), dropped)
    }

    /// What its kernel's connection file holds (a kernel session's
    /// worker only): the server's copy, never read back from the kernel's
    /// home, which its code may write.
    pub fn kernel_connection(&self) -> Option<&serde_json::Value> {
        self.kernel_connection.get()
    }

    pub(super) fn set_kernel_connection(&self, info: serde_json::Value) {
        let _ = self.kernel_connection.set(info);
    }
}
