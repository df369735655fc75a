//! Requests that wait for the driver's reply (inspect, complete, namespace
//! edits, checkpoints), matched to it by id.

use std::time::Duration;

use serde_json::Value;
use tokio::sync::oneshot;

use super::{Worker, WorkerError};

impl Worker {
    /// A request answered by the driver's control thread (it works while a
    /// cell runs): `op` plus the fields of `args`.
    pub async fn control(
        &self,
        op: &str,
        args: serde_json::Map<String, Value>,
        timeout: Duration,
    ) -> Result<Value, WorkerError> {
        let (id, rx) = self.request(op, args)?;
        self.reply(id, rx, timeout).await
    }

    /// Sends a request now (so it is ordered before any later one) and
    /// gives what `reply` waits on.
    pub fn request(
        &self,
        op: &str,
        args: serde_json::Map<String, Value>,
    ) -> Result<(u64, oneshot::Receiver<Value>), WorkerError> {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut st = self.lock();
            if st.control_closed || st.exit.is_some() {
                return Err(WorkerError::Gone);
            }
            let id = st.next_request_id;
            st.next_request_id += 1;
            st.inspect_waiters.insert(id, tx);
            id
        };
        let mut msg = args;
        msg.insert("op".into(), Value::from(op));
        msg.insert("id".into(), Value::from(id));
        let line = self.encode(&msg);
        // Checkpoints and states are handled on the driver's main thread,
        // between cells.
        let during_cell = !matches!(
            op,
            "checkpoint" | "switch" | "drop" | "save_state" | "load_state"
        );
        if self.channel_for(during_cell).try_send(line).is_err() {
            self.lock().inspect_waiters.remove(&id);
            return Err(WorkerError::Gone);
        }
        Ok((id, rx))
    }

    /// The reply to request `id`, waited for at most `timeout`.
    pub async fn reply(
        &self,
        id: u64,
        rx: oneshot::Receiver<Value>,
        timeout: Duration,
    ) -> Result<Value, WorkerError> {
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(WorkerError::Gone),
            Err(_) => {
                self.lock().inspect_waiters.remove(&id);
                Err(WorkerError::Timeout(timeout.as_secs()))
            }
        }
    }

    /// Interrupts the running cell the way its interpreter takes it:
    /// SIGINT to the process group, or, for a kernel interrupted by
    /// message, an `interrupt_request` its bridge sends on the control
    /// socket, waiting at most `within` for the kernel's answer. Some(why)
    /// when the kernel did not take it; the caller escalates as it does
    /// for a signal the cell ignored.
    pub async fn interrupt(&self, within: Duration) -> Option<String> {
        if !self.interrupt_by_message {
            self.signal_group(nix::sys::signal::Signal::SIGINT);
            return None;
        }
        match self
            .control("interrupt", serde_json::Map::new(), within)
            .await
        {
            Ok(reply) if reply["ok"] == true => None,
            Ok(reply) => Some(format!(
                "The kernel refused the interrupt request (interrupt_request): {}",
                reply["message"].as_str().unwrap_or("no reason given")
            )),
            // Gone with its cell: nothing left to interrupt.
            Err(WorkerError::Gone) => None,
            Err(_) => Some(format!(
                "The kernel did not answer the interrupt request (interrupt_request) within {:.0} s.",
                within.as_secs_f64()
            )),
        }
    }

    /// It has forked frozen copies of itself (checkpoints).
    pub fn mark_copies(&self) {
        self.copies
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn has_copies(&self) -> bool {
        self.copies.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// After a switch to a checkpoint: the interpreter is another process.
    pub fn set_live_pid(&self, pid: u32) {
        if let Some(ready) = self.lock().ready.as_mut() {
            ready.pid = pid;
        }
    }
}
