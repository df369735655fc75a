//! The worker's side of a kernel bridge: the emulated stdout and stderr
//! pipes and the event channel, written exactly as the driver writes its
//! own (docs/protocol.md): a sync marker when output switches streams, an
//! event marker on both pipes before every cell event. Never reads.

use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, DuplexStream};

/// The worker's side of the bridge: the emulated pipes and event channel,
/// with the driver's fence markers.
pub(super) struct Pipes {
    out: [DuplexStream; 2],
    events: DuplexStream,
    nonce: String,
    fence: u64,
    last: Option<usize>,
}

pub(super) type Sent = std::io::Result<()>;

impl Pipes {
    pub(super) fn new(
        stdout: DuplexStream,
        stderr: DuplexStream,
        events: DuplexStream,
        nonce: &str,
    ) -> Self {
        Pipes {
            out: [stdout, stderr],
            events,
            nonce: nonce.to_string(),
            fence: 0,
            last: None,
        }
    }

    /// A numbered marker on both pipes: `\0FERREPL:<nonce>:<16 hex><kind>`.
    async fn marker(&mut self, kind: u8) -> Sent {
        self.fence += 1;
        let mut marker = format!("\0FERREPL:{}:{:016x}", self.nonce, self.fence).into_bytes();
        marker.push(kind);
        for pipe in &mut self.out {
            pipe.write_all(&marker).await?;
        }
        Ok(())
    }

    /// Output on stdout (0) or stderr (1), with a sync marker when it
    /// switches streams, as the driver keeps them in order.
    pub(super) async fn write(&mut self, stream: usize, bytes: &[u8]) -> Sent {
        if self.last.is_some_and(|l| l != stream) {
            self.marker(1).await?;
        }
        self.last = Some(stream);
        self.out[stream].write_all(bytes).await
    }

    pub(super) async fn event(&mut self, event: Value) -> Sent {
        let mut line = serde_json::to_vec(&event).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.events.write_all(&line).await
    }

    /// A cell event after the event marker that closes its output.
    pub(super) async fn fenced(&mut self, mut event: Value) -> Sent {
        self.marker(0).await?;
        event["fence"] = json!(self.fence);
        event["fenced"] = json!(["stdout", "stderr"]);
        self.event(event).await
    }
}
