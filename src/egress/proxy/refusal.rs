//! Refusals: a short HTTP response whose reason phrase and one-line body
//! say why, and a log line.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

use crate::egress::Host;
use crate::metrics::{EgressAudience, EgressRefusal};

/// Time allowed to write a refusal to the client.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// After a refusal, how long (and how much) unread client input is drained
/// so that closing does not reset the connection before the client has read
/// the answer.
const REFUSAL_DRAIN_TIME: Duration = Duration::from_millis(500);
const REFUSAL_DRAIN_BYTES: usize = 256 * 1024;

/// A refusal: status, and a one-line message for the body, the reason
/// phrase and the log.
#[derive(Debug)]
pub(super) struct Refusal {
    status: u16,
    message: String,
    /// For the metrics; from the status unless a policy check says which.
    reason: EgressRefusal,
}

impl Refusal {
    pub(super) fn new(status: u16, message: String) -> Self {
        let reason = match status {
            502 => EgressRefusal::Upstream,
            503 => EgressRefusal::Busy,
            403 => EgressRefusal::Host,
            _ => EgressRefusal::BadRequest,
        };
        Refusal {
            status,
            message,
            reason,
        }
    }

    /// A policy refusal (403) for `reason`.
    pub(super) fn forbidden(reason: EgressRefusal, message: String) -> Self {
        Refusal {
            status: 403,
            message,
            reason,
        }
    }

    /// Its one-line message (the intercepting proxy's reconnects, Linux).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(super) fn message(&self) -> &str {
        &self.message
    }

    pub(super) fn bad_request(what: impl std::fmt::Display) -> Self {
        Refusal::new(400, format!("ferrepl: malformed proxy request: {what}"))
    }

    /// Logs and counts the refusal (every refusal is logged once).
    pub(super) fn log(&self, audience: EgressAudience, host: Option<&Host>, peer: &str) {
        crate::metrics::egress_refusal(audience, self.reason);
        let host = host.map_or_else(|| "-".to_string(), Host::to_string);
        tracing::warn!(
            host = %host,
            peer = %peer,
            status = self.status,
            "egress refused: {}",
            self.message
        );
    }

    fn response(&self) -> Vec<u8> {
        let standard = match self.status {
            400 => "Bad Request",
            403 => "Forbidden",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            501 => "Not Implemented",
            502 => "Bad Gateway",
            503 => "Service Unavailable",
            _ => "Error",
        };
        // The reason phrase carries the message too: pip reports a failed
        // CONNECT as "Tunnel connection failed: <status> <reason>" and never
        // shows the body. Keep it to visible ASCII.
        let reason: String = self
            .message
            .chars()
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        let reason = if reason.is_empty() {
            standard.to_string()
        } else {
            reason
        };
        let body = format!("{}\n", self.message);
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nProxy-Agent: ferrepl\r\n\r\n",
            self.status,
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }

    /// Writes the answer, closes the write side, and drains a little of
    /// what the client still sends so the close is not a reset. Bounded.
    pub(super) async fn send<S: AsyncRead + AsyncWrite + Unpin>(&self, mut client: S) {
        let response = self.response();
        let wrote = timeout(REFUSAL_WRITE_TIMEOUT, async {
            client.write_all(&response).await?;
            client.flush().await?;
            client.shutdown().await
        })
        .await;
        if !matches!(wrote, Ok(Ok(()))) {
            return;
        }
        let _ = timeout(REFUSAL_DRAIN_TIME, async {
            let mut buf = [0u8; 8192];
            let mut total = 0usize;
            while total < REFUSAL_DRAIN_BYTES {
                match client.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
            }
        })
        .await;
    }
}
