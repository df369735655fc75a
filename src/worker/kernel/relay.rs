//! A length guard between the bridge and a kernel's sockets. zeromq's
//! reader holds a whole message before handing it on and has no size
//! limit, and the kernel (holding its key) can send anything: so the
//! bridge's sockets connect to the server's own sockets here (in its
//! runtime directory, which no session sees), and each channel is relayed
//! to the kernel's socket in bounded chunks. From the kernel, only the
//! ZMTP 3 frame headers are read, to keep every message (the sum of its
//! frames) under [`MAX_KERNEL_MESSAGE_BYTES`]; a kernel sending more is
//! stopped before the server reads that frame. Never a ZeroMQ peer: no
//! handshake, routing or socket semantics, bytes pass through unchanged.

use std::path::PathBuf;
use std::sync::Weak;

use jupyter_protocol::ConnectionInfo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

use crate::worker::Worker;

/// The most one message from a kernel may be (its frames, each counted
/// with [`FRAME_COST`]); the server holds a message about three times
/// over while it reads it. Room for what plain code makes: `raise` of a
/// 50 MB string is one message of about 96 MiB from ipykernel (its value
/// and its traceback both carry the string), which must not cost the
/// session its kernel.
pub(super) const MAX_KERNEL_MESSAGE_BYTES: u64 = 128 << 20;
/// What the server holds for a frame besides its bytes, so that a message
/// of a million empty frames counts as well.
const FRAME_COST: u64 = 64;
/// The ZMTP 3 greeting that comes before any frame.
const GREETING_BYTES: u64 = 64;
const MORE: u8 = 1;
const LONG: u8 = 2;
const COMMAND: u8 = 4;
/// How much is read from either side at a time.
const CHUNK_BYTES: usize = 64 * 1024;

/// Where a stream from the kernel is.
#[derive(Debug)]
enum Reading {
    /// Bytes of the greeting still to come.
    Greeting(u64),
    Flags,
    /// A frame's length: `got` of its 1 or 8 big-endian bytes so far.
    Length {
        flags: u8,
        got: u8,
        len: u64,
    },
    /// Bytes of a frame's body still to come.
    Body(u64),
}

/// Follows the frames of a ZMTP 3 stream to keep each message, and each
/// command, under the cap.
#[derive(Debug)]
pub(super) struct FrameGuard {
    reading: Reading,
    /// The frames of the message under way so far.
    message: u64,
}

impl FrameGuard {
    pub(super) fn new() -> Self {
        Self {
            reading: Reading::Greeting(GREETING_BYTES),
            message: 0,
        }
    }

    /// Follows `bytes`, the next the kernel sent (split anywhere): Err
    /// with the size the message or command reached once it is over the cap.
    pub(super) fn follow(&mut self, mut bytes: &[u8]) -> Result<(), u64> {
        while let Some((&byte, rest)) = bytes.split_first() {
            match &mut self.reading {
                Reading::Greeting(left) | Reading::Body(left) => {
                    let skipped = (*left).min(bytes.len() as u64);
                    *left -= skipped;
                    bytes = &bytes[skipped as usize..];
                    if *left == 0 {
                        self.reading = Reading::Flags;
                    }
                }
                Reading::Flags => {
                    self.reading = Reading::Length {
                        flags: byte,
                        got: 0,
                        len: 0,
                    };
                    bytes = rest;
                }
                Reading::Length { flags, got, len } => {
                    *len = (*len << 8) | u64::from(byte);
                    *got += 1;
                    bytes = rest;
                    let (flags, len) = (*flags, *len);
                    if *got == if flags & LONG != 0 { 8 } else { 1 } {
                        self.frame(flags, len)?;
                        self.reading = match len {
                            0 => Reading::Flags,
                            _ => Reading::Body(len),
                        };
                    }
                }
            }
        }
        Ok(())
    }

    /// A frame's header, read whole.
    fn frame(&mut self, flags: u8, len: u64) -> Result<(), u64> {
        let frame = len.saturating_add(FRAME_COST);
        // A command is a frame of its own, never part of a message.
        let size = match flags & COMMAND {
            0 => self.message.saturating_add(frame),
            _ => frame,
        };
        if size > MAX_KERNEL_MESSAGE_BYTES {
            return Err(size);
        }
        if flags & COMMAND == 0 {
            self.message = if flags & MORE != 0 { size } else { 0 };
        }
        Ok(())
    }
}

/// The socket file of a relay's listener, removed with it.
struct Listening(PathBuf);

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Listens at `ours`-N for each of the kernel's channels (shell, iopub,
/// stdin, control) and relays each to the kernel's own socket, in `tasks`:
/// the connection the bridge's sockets use instead of the kernel's.
pub(super) fn listen(
    kernel: &ConnectionInfo,
    ours: &std::path::Path,
    worker: &Weak<Worker>,
    tasks: &mut JoinSet<()>,
) -> std::io::Result<ConnectionInfo> {
    let mut relayed = kernel.clone();
    relayed.ip = ours.display().to_string();
    for port in [
        kernel.shell_port,
        kernel.iopub_port,
        kernel.stdin_port,
        kernel.control_port,
    ] {
        let at = Listening(PathBuf::from(format!("{}-{port}", relayed.ip)));
        let listener = UnixListener::bind(&at.0)?;
        let theirs = PathBuf::from(format!("{}-{port}", kernel.ip));
        tasks.spawn(relay(listener, at, theirs, worker.clone()));
    }
    Ok(relayed)
}

/// Relays the first connection to `listener` to the kernel's socket
/// `theirs` until either side ends, or stops the kernel when it sends a
/// message over the cap.
async fn relay(listener: UnixListener, at: Listening, theirs: PathBuf, worker: Weak<Worker>) {
    let accepted = listener.accept().await;
    // One connection per channel, the bridge's: nothing else is accepted,
    // so zeromq's reconnecting after a stop finds no socket.
    drop((listener, at));
    let (Ok((bridge, _)), Ok(kernel)) = (accepted, UnixStream::connect(&theirs).await) else {
        return;
    };
    let (mut from_kernel, mut to_kernel) = kernel.into_split();
    let (mut from_bridge, mut to_bridge) = bridge.into_split();
    let over = tokio::select! {
        _ = tokio::io::copy(&mut from_bridge, &mut to_kernel) => None,
        over = guarded(&mut from_kernel, &mut to_bridge) => over,
    };
    if let Some(size) = over
        && let Some(worker) = worker.upgrade()
    {
        let reason = format!(
            "The kernel sent a message of {} MiB or more, over the {} MiB a kernel message may be, so ferrepl stopped the kernel. Write output that large to a file in the workspace rather than displaying or printing it.",
            size.div_ceil(1 << 20),
            MAX_KERNEL_MESSAGE_BYTES >> 20
        );
        tracing::warn!(pid = worker.root_pid(), "{reason}");
        worker.set_kill_reason(reason);
        worker.kill_in_background();
    }
}

/// Copies what the kernel sends to the bridge while each message keeps
/// under the cap: the size of the first that does not, None at the end.
async fn guarded(from: &mut OwnedReadHalf, to: &mut OwnedWriteHalf) -> Option<u64> {
    let mut guard = FrameGuard::new();
    let mut chunk = vec![0; CHUNK_BYTES];
    loop {
        let read = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => &chunk[..n],
        };
        if let Err(size) = guard.follow(read) {
            return Some(size);
        }
        if to.write_all(read).await.is_err() {
            return None;
        }
    }
}

#[cfg(test)]
mod tests;
