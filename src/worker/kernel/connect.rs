//! A kernel bridge reaching its kernel: the sockets (shell, stdin,
//! iopub, control), once the kernel has made them; the handshake that makes sure its output channel is
//! subscribed before the first cell; the kernel's pid for `ready`.

use std::path::PathBuf;
use std::time::Duration;

use jupyter_protocol::{JupyterMessage, JupyterMessageContent, KernelInfoRequest};
use jupyter_zmq_client as zmq;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::bridge::{Bridge, Incoming, Sockets};

/// How often the kernel is asked for its info until its output channel
/// (iopub) is seen to be subscribed: messages published before that are lost.
const HANDSHAKE_EVERY: Duration = Duration::from_millis(200);
/// Between attempts to reach sockets the kernel has not made yet.
const CONNECT_EVERY: Duration = Duration::from_millis(20);
/// How long one socket of a kernel that made it may take to answer.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// What the kernel's messages waiting for the bridge may weigh in all, in
/// KiB: the readers wait past it, so a kernel sending large messages
/// faster than the bridge takes them holds at most this (plus the one the
/// bridge works on), not its channel's length times the message cap.
pub(super) const IN_FLIGHT_KIB: u32 = 256 * 1024;

/// The readers' shared budget and its whole, in KiB.
#[derive(Clone)]
struct Budget(Arc<Semaphore>, u32);

impl Budget {
    fn new(kib: u32) -> Self {
        Budget(Arc::new(Semaphore::new(kib as usize)), kib)
    }
}

/// A message from the kernel with its share of [`IN_FLIGHT_KIB`], given
/// back when the bridge takes it.
pub(super) struct Held {
    incoming: Incoming,
    _share: OwnedSemaphorePermit,
}

impl Held {
    pub(super) fn into_incoming(self) -> Incoming {
        self.incoming
    }
}

/// Sends `incoming` to the bridge once its weight fits the budget; false
/// when the bridge is gone.
async fn hand_on(tx: &mpsc::Sender<Held>, budget: &Budget, incoming: Incoming) -> bool {
    let kib = u32::try_from(weight(&incoming) / 1024 + 1).unwrap_or(u32::MAX);
    let Ok(share) = budget.0.clone().acquire_many_owned(kib.min(budget.1)).await else {
        return false;
    };
    tx.send(Held {
        incoming,
        _share: share,
    })
    .await
    .is_ok()
}

/// About the bytes a message holds: its content and metadata as JSON
/// (counted, not written) and its binary buffers.
fn weight(incoming: &Incoming) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let msg = match incoming {
        Incoming::Shell(m) | Incoming::IoPub(m) | Incoming::Stdin(m) | Incoming::Control(m) => m,
        Incoming::ShellUnread(kind) => return kind.len(),
    };
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, &msg.content);
    let _ = serde_json::to_writer(&mut count, &msg.metadata);
    count.0 + msg.buffers.iter().map(|b| b.len()).sum::<usize>()
}

impl Bridge {
    /// Reaches the kernel's shell, stdin, iopub and control sockets once
    /// it made them; their messages go to `tx`.
    pub(super) async fn connect(
        &mut self,
        session: &str,
        tx: &mpsc::Sender<Held>,
        readers: &mut tokio::task::JoinSet<()>,
    ) -> Option<Sockets> {
        let identity = zmq::peer_identity_for_session(session).ok()?;
        // Until the kernel has made its sockets (or died): a connection to
        // an ipc path nobody listens on yet is not given up by the client.
        let sockets = [1, 2, 3, 4].map(|port| PathBuf::from(format!("{}-{port}", self.info.ip)));
        while !sockets.iter().all(|s| s.exists()) {
            if self.gone() {
                return None;
            }
            tokio::time::sleep(CONNECT_EVERY).await;
        }
        // Through the relays, which keep each message the kernel sends
        // under a cap zeromq does not have.
        let info = &match super::relay::listen(&self.info, &self.relays, &self.worker, readers) {
            Ok(relayed) => relayed,
            Err(e) => {
                tracing::warn!(at = %self.relays.display(), "cannot listen for a kernel's relays: {e}");
                return None;
            }
        };
        let shell = reach(zmq::create_client_shell_connection_with_identity(
            info,
            session,
            identity.clone(),
        ))
        .await?;
        let stdin = reach(zmq::create_client_stdin_connection_with_identity(
            info, session, identity,
        ))
        .await?;
        let mut iopub = reach(zmq::create_client_iopub_connection(info, "", session)).await?;
        let control = reach(zmq::create_client_control_connection(info, session)).await?;
        let (control_send, mut control_recv) = control.split();
        let (shell_send, mut shell_recv) = shell.split();
        let (stdin_send, mut stdin_recv) = stdin.split();
        let pid = self.worker.upgrade().map_or(0, |w| w.root_pid());
        let budget = Budget::new(IN_FLIGHT_KIB);
        let (t, b) = (tx.clone(), budget.clone());
        readers.spawn(async move {
            let mut skipped = 0;
            while let Some(read) = readable(iopub.read().await, &mut skipped) {
                if let Some(msg) = read
                    && !hand_on(&t, &b, Incoming::IoPub(msg)).await
                {
                    break;
                }
            }
            tracing::debug!(pid, "kernel iopub closed");
        });
        let (t, b) = (tx.clone(), budget.clone());
        readers.spawn(async move {
            let mut skipped = 0;
            loop {
                let incoming = match shell_recv.read().await {
                    Ok(msg) => Incoming::Shell(msg),
                    // A reply jupyter-protocol cannot read (IRkernel's and
                    // bash_kernel's execute_reply say "abort", the spelling
                    // before "aborted") must not end the socket's reader.
                    Err(zmq::RuntimeError::ParseError { msg_type, .. })
                        if msg_type == "execute_reply" =>
                    {
                        Incoming::ShellUnread(msg_type)
                    }
                    other => match readable(other, &mut skipped) {
                        Some(Some(msg)) => Incoming::Shell(msg),
                        Some(None) => continue,
                        None => break,
                    },
                };
                if !hand_on(&t, &b, incoming).await {
                    break;
                }
            }
        });
        let (t, b) = (tx.clone(), budget.clone());
        readers.spawn(async move {
            let mut skipped = 0;
            while let Some(read) = readable(stdin_recv.read().await, &mut skipped) {
                if let Some(msg) = read
                    && !hand_on(&t, &b, Incoming::Stdin(msg)).await
                {
                    break;
                }
            }
        });
        let (t, b) = (tx.clone(), budget);
        readers.spawn(async move {
            let mut skipped = 0;
            while let Some(read) = readable(control_recv.read().await, &mut skipped) {
                if let Some(msg) = read
                    && !hand_on(&t, &b, Incoming::Control(msg)).await
                {
                    break;
                }
            }
        });
        Some(Sockets {
            shell: shell_send,
            stdin: stdin_send,
            control: control_send,
        })
    }

    /// Asks the kernel for its info until it answered and its output
    /// channel carried a status for one of the requests: the language's
    /// version, or None when it died first.
    pub(super) async fn handshake(
        &mut self,
        shell: &mut zmq::DealerSendConnection,
        rx: &mut mpsc::Receiver<Held>,
    ) -> Option<String> {
        let mut version = None;
        let mut subscribed = false;
        let mut tick = tokio::time::interval(HANDSHAKE_EVERY);
        while version.is_none() || !subscribed {
            tokio::select! {
                _ = tick.tick() => {
                    if self.gone() {
                        return None;
                    }
                    let ask: JupyterMessage = KernelInfoRequest {}.into();
                    shell.send(ask).await.ok()?;
                }
                msg = rx.recv() => match msg?.into_incoming() {
                    Incoming::Shell(m) => {
                        match m.content {
                            JupyterMessageContent::KernelInfoReply(reply) => {
                                version = Some(reply.language_info.version);
                            }
                            // Answered, but without what the protocol
                            // crate requires (`readable`).
                            JupyterMessageContent::UnknownMessage(u)
                                if u.msg_type == "kernel_info_reply" =>
                            {
                                version = Some(String::new());
                            }
                            _ => {}
                        }
                    }
                    Incoming::IoPub(m) => {
                        subscribed |= m
                            .parent_header
                            .is_some_and(|p| p.msg_type == "kernel_info_request");
                    }
                    Incoming::Stdin(_) | Incoming::ShellUnread(_) | Incoming::Control(_) => {}
                },
                changed = self.changed.changed() => {
                    if changed.is_err() || self.gone() {
                        return None;
                    }
                }
            }
        }
        version
    }
}

/// Unreadable messages logged one by one on a channel; after that, one
/// line in this many says how many were skipped.
const SKIPPED_LOGGED: u64 = 10;
const SKIPPED_LOG_EVERY: u64 = 1000;

/// What a reader does with one read: forward a message (Some(Some)),
/// skip one (Some(None)) or stop, the socket gone (None). A message the
/// protocol crate cannot read costs only itself, never the channel: the
/// agent's code holds the kernel's key and can send any frames (a wrong
/// signature, JSON nested past the parser's depth, a header without its
/// fields, too few frames), and kernels other than ipykernel leave out
/// fields it requires (bash_kernel's kernel_info_reply has no language
/// version). Such a kernel_info_reply is still the kernel's answer,
/// passed on without its content. Only the transport failing (the socket
/// closed) ends the reader. `skipped` counts this channel's skips, so
/// that a flood of them does not flood the log.
fn readable(
    read: zmq::Result<JupyterMessage>,
    skipped: &mut u64,
) -> Option<Option<JupyterMessage>> {
    let why = match read {
        Ok(msg) => return Some(Some(msg)),
        Err(zmq::RuntimeError::ZmqError(e)) => {
            tracing::debug!("a kernel channel closed: {e}");
            return None;
        }
        Err(zmq::RuntimeError::IoError(e)) => {
            tracing::debug!("a kernel channel failed: {e}");
            return None;
        }
        Err(zmq::RuntimeError::ParseError { msg_type, source }) => {
            if msg_type == "kernel_info_reply" {
                return Some(Some(JupyterMessage::new(
                    jupyter_protocol::UnknownMessage {
                        msg_type,
                        content: serde_json::Value::Null,
                    },
                    None,
                )));
            }
            format!("a {msg_type} whose content could not be read: {source}")
        }
        Err(other) => other.to_string(),
    };
    *skipped += 1;
    if *skipped <= SKIPPED_LOGGED || skipped.is_multiple_of(SKIPPED_LOG_EVERY) {
        tracing::debug!(
            skipped = *skipped,
            "a kernel message not understood, skipped: {why}"
        );
    }
    Some(None)
}

/// A connection to a socket the kernel made, if it answers in time.
async fn reach<T>(connecting: impl std::future::Future<Output = zmq::Result<T>>) -> Option<T> {
    match tokio::time::timeout(CONNECT_WITHIN, connecting).await {
        Ok(Ok(connection)) => Some(connection),
        _ => None,
    }
}

impl Bridge {
    /// The kernel's pid in its own PID namespace (the worker maps it to
    /// the host's): the process whose command line names its connection file.
    pub(super) async fn kernel_pid(&self) -> u32 {
        let root = self.worker.upgrade().map_or(0, |w| w.root_pid());
        let file = self.connection_file.display().to_string();
        tokio::task::spawn_blocking(move || {
            let named = std::iter::once(root)
                .chain(crate::sandbox::watch::descendants(root))
                .rfind(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&file))
                })
                .unwrap_or(root);
            std::fs::read_to_string(format!("/proc/{named}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("NSpid:"))
                        .and_then(|v| v.split_whitespace().last()?.parse().ok())
                })
                .unwrap_or(named)
        })
        .await
        .unwrap_or(root)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use jupyter_protocol::{JupyterMessage, JupyterMessageContent, Stdio, StreamContent};

    use super::*;

    fn stream(bytes: usize) -> Incoming {
        let content = JupyterMessageContent::StreamContent(StreamContent {
            name: Stdio::Stdout,
            text: "x".repeat(bytes),
        });
        Incoming::IoPub(JupyterMessage::new(content, None))
    }

    /// Messages waiting for the bridge weigh at most the budget: the
    /// next waits until the bridge takes one.
    #[tokio::test]
    async fn readers_wait_while_the_bridge_holds_the_budget() {
        let (tx, mut rx) = mpsc::channel::<Held>(256);
        let budget = Budget::new(64);
        let big = 33 * 1024;
        assert!(weight(&stream(big)) > big);
        assert!(hand_on(&tx, &budget, stream(big)).await);
        let second = hand_on(&tx, &budget, stream(big));
        tokio::pin!(second);
        let waited = tokio::time::timeout(Duration::from_millis(200), &mut second).await;
        assert!(waited.is_err(), "a second half-budget message did not wait");
        let first = rx.recv().await.map(Held::into_incoming);
        assert!(matches!(first, Some(Incoming::IoPub(_))));
        assert!(
            second.await,
            "the budget came back when the bridge took the first"
        );
        // Small messages pass by the dozen (a KiB each, rounded up).
        let _ = rx.recv().await;
        for _ in 0..60 {
            assert!(hand_on(&tx, &budget, stream(10)).await);
        }
    }
}
