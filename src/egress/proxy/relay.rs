//! The relay between a client and its upstream: bytes copied both ways
//! until both ends finish, either fails, or the tunnel sits idle.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, sleep_until};

use super::deadline_after;

/// Relay buffer per direction.
const RELAY_BUF: usize = 32 * 1024;

/// When either direction last moved bytes (ms since `start`).
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Completes once nothing moved for `idle`.
    async fn idle(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = last
                .checked_add(idle)
                .unwrap_or_else(|| deadline_after(idle));
            if Instant::now() >= deadline {
                return;
            }
            sleep_until(deadline).await;
        }
    }
}

/// Copies bytes both ways until both directions ended, either failed, or
/// neither moved a byte for `idle`. With `client_limit`, only that many
/// more bytes go from the client upstream (the rest of a request body);
/// anything after is read and discarded.
pub(super) async fn relay<C, U>(client: C, upstream: U, client_limit: Option<u64>, idle: Duration)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (client_r, client_w) = tokio::io::split(client);
    let (up_r, up_w) = tokio::io::split(upstream);
    let activity = Activity::new();
    let both = async {
        tokio::try_join!(
            pump(client_r, up_w, client_limit, &activity),
            pump(up_r, client_w, None, &activity),
        )
    };
    tokio::select! {
        r = both => {
            if let Err(e) = r {
                tracing::debug!("egress: tunnel ended: {e}");
            }
        }
        _ = activity.idle(idle) => {
            tracing::debug!("egress: tunnel idle for {} ms, closed", idle.as_millis());
        }
    }
}

/// One direction of a relay.
async fn pump<R, W>(mut r: R, mut w: W, limit: Option<u64>, activity: &Activity) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; RELAY_BUF];
    let mut remaining = limit;
    loop {
        if remaining == Some(0) {
            // The request is complete: one request per connection, so what
            // follows is not forwarded. Keep reading to notice the close.
            loop {
                if r.read(&mut buf).await? == 0 {
                    return Ok(());
                }
            }
        }
        let n = r.read(&mut buf).await?;
        if n == 0 {
            let _ = w.shutdown().await;
            return Ok(());
        }
        activity.touch();
        let n = match remaining {
            Some(rem) => usize::try_from(rem).map_or(n, |rem| n.min(rem)),
            None => n,
        };
        let mut off = 0;
        while off < n {
            let k = w.write(&buf[off..n]).await?;
            if k == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            off += k;
            activity.touch();
        }
        w.flush().await?;
        if let Some(rem) = remaining.as_mut() {
            *rem -= n as u64;
        }
    }
}
