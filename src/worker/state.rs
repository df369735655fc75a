//! A Python session's variables saved to a file and loaded into a fresh
//! interpreter (issue 44; the driver's side is `python/ferrepl_driver/
//! state.py`, the format docs/protocol.md "Saved state"). The bytes go
//! through the control socket (fd 3), between cells: a `state_data` event
//! says how many follow it, and a `load_state` request is followed by the
//! file's bytes. The server never unpickles anything: it copies bytes, at
//! most its cap, and reads the driver's JSON replies.

use std::time::Duration;

use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};

use super::{Worker, WorkerError};

/// Bytes moved per read or write.
const CHUNK: usize = 256 * 1024;

/// Where the bytes of a save go while the driver sends them.
pub(super) struct StateSink {
    file: tokio::fs::File,
    cap: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{0}")]
    Worker(#[from] WorkerError),
    #[error("the state is {0} bytes, over the {1} a saved state may take (--state-max-mb)")]
    TooLarge(u64, u64),
    #[error("{0}")]
    Driver(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Worker {
    /// Asks the driver for its state and writes it to `file`, at most
    /// `cap` bytes: the driver's reply (variables, what was left out, the
    /// packages) and the bytes written.
    pub async fn save_state(
        &self,
        file: tokio::fs::File,
        cap: u64,
        timeout: Duration,
    ) -> Result<(Value, u64), StateError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.lock().state_sink = Some((StateSink { file, cap }, tx));
        let asked = self.request("save_state", Map::new());
        let reply = match asked {
            Ok((id, reply)) => self.reply(id, reply, timeout).await,
            Err(e) => Err(e),
        };
        let reply = match reply {
            Ok(r) if r.get("ok").and_then(Value::as_bool) == Some(true) => r,
            Ok(r) => {
                self.lock().state_sink = None;
                return Err(StateError::Driver(message(&r)));
            }
            Err(e) => {
                self.lock().state_sink = None;
                return Err(e.into());
            }
        };
        // The bytes came before the reply, on the same channel.
        let written = tokio::time::timeout(timeout, rx)
            .await
            .map_err(|_| WorkerError::Timeout(timeout.as_secs()))?
            .map_err(|_| WorkerError::Gone)??;
        Ok((reply, written))
    }

    /// Sends the state in `file` to a fresh interpreter, which loads it:
    /// the driver's reply (the variables back, modules of the workspace it
    /// imported again).
    pub async fn load_state(
        &self,
        mut file: tokio::fs::File,
        packages: &std::collections::BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<Value, StateError> {
        let size = file.metadata().await?.len();
        let mut args = Map::new();
        args.insert("bytes".into(), Value::from(size));
        // The driver checks them before it unpickles anything.
        args.insert("packages".into(), serde_json::json!(packages));
        let (id, reply) = self.request("load_state", args)?;
        // The bytes follow the request on the same channel, in order.
        let mut left = size;
        while left > 0 {
            let mut chunk = vec![0u8; CHUNK.min(usize::try_from(left).unwrap_or(CHUNK))];
            file.read_exact(&mut chunk).await?;
            left -= chunk.len() as u64;
            self.ctl.send(chunk).await.map_err(|_| WorkerError::Gone)?;
        }
        let reply = self.reply(id, reply, timeout).await?;
        if reply.get("ok").and_then(Value::as_bool) != Some(true) {
            return Err(StateError::Driver(message(&reply)));
        }
        Ok(reply)
    }
}

fn message(reply: &Value) -> String {
    reply
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the driver gave no reason")
        .to_string()
}

/// The control reader met a `state_data` event: the next `bytes` bytes go
/// to the save waiting for them (at most its cap), or nowhere when none
/// waits (code of the session sent it).
pub(super) async fn take_payload(
    worker: &Worker,
    reader: &mut BufReader<impl AsyncRead + Unpin>,
    bytes: u64,
) {
    let sink = worker.lock().state_sink.take();
    let mut buf = vec![0u8; CHUNK];
    let mut left = bytes;
    let mut written = 0u64;
    let mut failed: Option<StateError> = None;
    let (mut file, cap, done) = match sink {
        Some((s, done)) => (Some(s.file), s.cap, Some(done)),
        None => (None, 0, None),
    };
    if bytes > cap {
        failed = Some(StateError::TooLarge(bytes, cap));
        file = None;
    }
    while left > 0 {
        let want = CHUNK.min(usize::try_from(left).unwrap_or(CHUNK));
        match reader.read(&mut buf[..want]).await {
            Ok(0) | Err(_) => {
                failed.get_or_insert(StateError::Worker(WorkerError::Gone));
                break;
            }
            Ok(n) => {
                left -= n as u64;
                if let Some(f) = file.as_mut() {
                    match f.write_all(&buf[..n]).await {
                        Ok(()) => written += n as u64,
                        Err(e) => {
                            failed = Some(e.into());
                            file = None;
                        }
                    }
                }
            }
        }
    }
    if let Some(mut f) = file
        && failed.is_none()
        && let Err(e) = f.flush().await.and(f.sync_all().await)
    {
        failed = Some(e.into());
    }
    if let Some(done) = done {
        let _ = done.send(match failed {
            Some(e) => Err(e),
            None => Ok(written),
        });
    }
}
