//! Requests to the worker's control channel. A request is written straight
//! from the caller when the channel takes it at once (the usual case: a
//! short line into an empty socket buffer), which saves every call a hop
//! through another task; whatever the channel cannot take yet (the driver's
//! source at start, a burst) waits in a bounded backlog that a task writes
//! out in order, and later requests queue behind it.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

/// The write end: the socket Python's driver reads, or the pipe R reads.
pub(super) enum ControlEnd {
    Socket(tokio::net::unix::OwnedWriteHalf),
    Pipe(tokio::net::unix::pipe::Sender),
}

impl ControlEnd {
    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ControlEnd::Socket(s) => s.try_write(buf),
            ControlEnd::Pipe(p) => p.try_write(buf),
        }
    }

    async fn writable(&self) -> io::Result<()> {
        match self {
            ControlEnd::Socket(s) => s.writable().await,
            ControlEnd::Pipe(p) => p.writable().await,
        }
    }
}

/// Most requests waiting for the channel; past it the worker is taken as
/// gone (it stopped reading its control channel).
const MAX_BACKLOG: usize = 64;

#[derive(Default)]
struct Backlog {
    /// Requests not yet written, oldest first; the first may be partly
    /// written (`offset` bytes of it).
    queue: VecDeque<Vec<u8>>,
    offset: usize,
    closed: bool,
}

pub(super) struct ControlWriter {
    end: ControlEnd,
    backlog: Mutex<Backlog>,
    wake: Arc<Notify>,
}

/// The channel is closed (a write failed, or the backlog overflowed).
#[derive(Debug)]
pub(super) struct Closed;

impl ControlWriter {
    /// The writer, and its task writing out the backlog (ends when the
    /// writer is dropped or the channel fails).
    pub(super) fn start(end: ControlEnd) -> Arc<Self> {
        let wake = Arc::new(Notify::new());
        let writer = Arc::new(Self {
            end,
            backlog: Mutex::new(Backlog::default()),
            wake: wake.clone(),
        });
        tokio::spawn(write_backlog(Arc::downgrade(&writer), wake));
        writer
    }

    fn backlog(&self) -> std::sync::MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `msg` now if the channel takes it, else queues it (in order
    /// behind anything already waiting).
    pub(super) fn send(&self, msg: Vec<u8>) -> Result<(), Closed> {
        let mut backlog = self.backlog();
        if backlog.closed {
            return Err(Closed);
        }
        if backlog.queue.is_empty() {
            let mut written = 0;
            while written < msg.len() {
                match self.end.try_write(&msg[written..]) {
                    Ok(0) => break,
                    Ok(n) => written += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        backlog.closed = true;
                        return Err(Closed);
                    }
                }
            }
            if written == msg.len() {
                return Ok(());
            }
            backlog.offset = written;
        } else if backlog.queue.len() >= MAX_BACKLOG {
            backlog.closed = true;
            return Err(Closed);
        }
        backlog.queue.push_back(msg);
        drop(backlog);
        self.wake.notify_one();
        Ok(())
    }
}

impl ControlWriter {
    /// Writes as much of the backlog as the channel takes now.
    fn write_some(&self) -> Result<(), Closed> {
        let mut backlog = self.backlog();
        loop {
            let offset = backlog.offset;
            let Some(front) = backlog.queue.front() else {
                return Ok(());
            };
            let (written, len) = (self.end.try_write(&front[offset..]), front.len());
            match written {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    backlog.offset += n;
                    if backlog.offset == len {
                        backlog.queue.pop_front();
                        backlog.offset = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    backlog.closed = true;
                    return Err(Closed);
                }
            }
        }
    }
}

impl Drop for ControlWriter {
    fn drop(&mut self) {
        // The task holds only a weak reference: let it see that we are gone.
        self.wake.notify_one();
    }
}

/// Writes the backlog out whenever there is one, in order.
async fn write_backlog(writer: Weak<ControlWriter>, wake: Arc<Notify>) {
    loop {
        wake.notified().await;
        loop {
            let Some(w) = writer.upgrade() else { return };
            if w.backlog().queue.is_empty() {
                break;
            }
            if w.end.writable().await.is_err() {
                w.backlog().closed = true;
                return;
            }
            if w.write_some().is_err() {
                return;
            }
        }
    }
}
