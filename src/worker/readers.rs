//! The tasks that follow a running worker: its stdout and stderr pipes (up
//! to each cell's fence), its control socket (requests out, events in), and
//! its exit.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::protocol::Event;
use super::{ExitInfo, FENCE_GRACE, Worker, stream_index};
use crate::output::{MarkerScanner, Segment, Stream};
use crate::process;

/// Largest control-channel line accepted from a driver (values are capped far below).
const MAX_EVENT_BYTES: u64 = 16 * 1024 * 1024;

/// A pipe's read buffer while its output is small (an idle session's
/// readers cost this much each), and once a read fills it (large output
/// moves in big reads).
const PIPE_BUF_SMALL: usize = 4 * 1024;
const PIPE_BUF_LARGE: usize = 64 * 1024;

pub(super) async fn read_pipe(
    mut pipe: impl AsyncRead + Unpin,
    stream: Stream,
    worker: Arc<Worker>,
    nonce: String,
) {
    let idx = stream_index(stream);
    let mut scanner = MarkerScanner::new(&nonce);
    let mut buf = vec![0u8; PIPE_BUF_SMALL];
    let mut segments = Vec::new();
    // The last fence passed whose barrier has not been checked yet. Bytes
    // after a fence may not enter the capture until the other pipe has passed
    // the same fence and (for an event fence) the event has taken the output
    // before it. The check is made lazily, when such bytes exist, so a quiet
    // pipe costs no extra wake-up per cell.
    let mut barrier: Option<(u64, bool)> = None;
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        segments.clear();
        scanner.feed(&buf[..n], &mut segments);
        if n == buf.len() && n < PIPE_BUF_LARGE {
            buf = vec![0u8; PIPE_BUF_LARGE];
        } else if n < PIPE_BUF_SMALL && buf.len() > PIPE_BUF_SMALL {
            // The burst is over: give the large buffer back.
            buf = vec![0u8; PIPE_BUF_SMALL];
        }
        for seg in segments.drain(..) {
            match seg {
                Segment::Data(bytes) => {
                    if let Some((number, event)) = barrier.take() {
                        pass_barrier(&worker, idx, number, event).await;
                    }
                    worker.lock().capture.push(stream, &bytes);
                    worker.bump();
                }
                Segment::Fence { number, event } => {
                    if let Some((earlier, event)) = barrier.take() {
                        pass_barrier(&worker, idx, earlier, event).await;
                    }
                    {
                        let mut st = worker.lock();
                        st.fence_seen[idx] = st.fence_seen[idx].max(number);
                    }
                    worker.bump();
                    barrier = Some((number, event));
                }
            }
        }
    }
    scanner.finish(&mut segments);
    if let Some((number, event)) = barrier.take()
        && !segments.is_empty()
    {
        pass_barrier(&worker, idx, number, event).await;
    }
    let mut st = worker.lock();
    for seg in segments.drain(..) {
        if let Segment::Data(bytes) = seg {
            st.capture.push(stream, &bytes);
        }
    }
    st.eof[idx] = true;
    drop(st);
    worker.bump();
}

/// Waits until output after fence `number` on pipe `idx` may be captured.
async fn pass_barrier(worker: &Worker, idx: usize, number: u64, event: bool) {
    let other = 1 - idx;
    let passed = tokio::time::timeout(
        FENCE_GRACE,
        worker.wait_until(|s| {
            let other_done = s.fence_seen[other] >= number || s.eof[other];
            let released = !event || s.released >= number || s.control_closed;
            (other_done && released) || (s.exit.is_some() && s.control_closed)
        }),
    )
    .await;
    if passed.is_err() {
        tracing::warn!(
            pid = worker.process.pid(),
            number,
            "output fence not matched in time; continuing"
        );
    }
}

pub(super) async fn read_control(channel: impl AsyncRead + Unpin, worker: Arc<Worker>) {
    let mut reader = BufReader::new(channel);
    let mut line = Vec::new();
    loop {
        // Each line is bounded; an oversized one is skipped, not buffered.
        if matches!(read_line(&mut reader, &mut line).await, Ok(0) | Err(_)) {
            break;
        }
        if !line.ends_with(b"\n") && line.len() as u64 == MAX_EVENT_BYTES {
            tracing::warn!(
                pid = worker.process.pid(),
                "oversized event from worker skipped"
            );
            // The rest of it, up to its newline.
            let mut sink = Vec::new();
            while let Ok(n) = read_line(&mut reader, &mut sink).await
                && n > 0
                && !sink.ends_with(b"\n")
            {}
            continue;
        }
        let event: Event = match serde_json::from_slice(&line) {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(pid = worker.process.pid(), error = %e, "unreadable event from worker");
                continue;
            }
        };
        if let Event::StateData { bytes } = event {
            super::state::take_payload(&worker, &mut reader, bytes).await;
            continue;
        }
        worker.handle_event(event).await;
    }
    let mut st = worker.lock();
    st.control_closed = true;
    st.inspect_waiters.clear();
    drop(st);
    worker.bump();
}

/// The next line of `reader` into `line` (cleared first), at most
/// [`MAX_EVENT_BYTES`] of it; 0 at the end.
async fn read_line(
    reader: &mut BufReader<impl AsyncRead + Unpin>,
    line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    line.clear();
    (&mut *reader)
        .take(MAX_EVENT_BYTES)
        .read_until(b'\n', line)
        .await
}

/// Sends `first` (the driver), then each request, until the worker is gone.
pub(super) async fn write_control(
    mut socket: impl tokio::io::AsyncWrite + Unpin,
    first: Vec<u8>,
    mut requests: mpsc::Receiver<Vec<u8>>,
) {
    if socket.write_all(&first).await.is_err() {
        return;
    }
    while let Some(msg) = requests.recv().await {
        if socket.write_all(&msg).await.is_err() {
            break;
        }
    }
}

pub(super) async fn watch_exit(mut child: tokio::process::Child, worker: Arc<Worker>) {
    // Whatever the worker left running in its group goes with it.
    let status = worker.process.wait(&mut child, true).await;
    let cgroup = worker.process.take_cgroup();
    if let Some(hit) = cgroup.as_ref().and_then(|g| g.limit_hit()) {
        worker.set_kill_reason(format!(
            "The session {hit}, so all of its processes were ended."
        ));
    }
    worker.process.remove_home().await;
    let exit = ExitInfo::now(status);
    let (code, signal) = (exit.code, exit.signal);
    tracing::debug!(pid = worker.process.pid(), ?code, ?signal, "worker exited");
    worker.lock().exit = Some(exit);
    worker.cancel_calls();
    worker.bump();
    process::release(cgroup).await;
}
