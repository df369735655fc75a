//! What a connection is doing, as its watchdog needs to know: the
//! activity clock (a head arriving, requests in flight, the last byte, a
//! write waiting on the peer), the socket that reports every read and
//! stalled write, the response body that says when it is done, and the
//! request body that must arrive by a deadline. Apart from `listener.rs`,
//! which accepts, bounds and serves connections.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::{Bounds, Refusal, refused};

/// What a connection is doing, shared by its reader, its service and its
/// watchdog. Times are milliseconds since the connection opened.
pub(super) struct Activity {
    pub(super) opened: Instant,
    /// Requests whose response has not been sent in full.
    pub(super) in_flight: AtomicUsize,
    /// When the bytes of a request head began to arrive (u64::MAX: none
    /// waiting). A new connection waits from its opening.
    pub(super) head_since: AtomicU64,
    /// The last byte read or the last response finished.
    pub(super) last_active: AtomicU64,
    /// Since when a write has waited for the peer to read (NONE: none).
    pub(super) write_stalled: AtomicU64,
}

pub(super) const NONE: u64 = u64::MAX;

impl Activity {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            head_since: AtomicU64::new(0),
            last_active: AtomicU64::new(0),
            write_stalled: AtomicU64::new(NONE),
        })
    }

    /// A write (or flush) was `ready`, or is waiting on the peer.
    pub(super) fn wrote<T>(&self, polled: Poll<T>) -> Poll<T> {
        if polled.is_ready() {
            self.write_stalled.store(NONE, Ordering::Relaxed);
        } else {
            let now = self.now();
            let _ =
                self.write_stalled
                    .compare_exchange(NONE, now, Ordering::AcqRel, Ordering::Relaxed);
        }
        polled
    }

    pub(super) fn now(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    pub(super) fn read(&self) {
        let now = self.now();
        self.last_active.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let _ =
                self.head_since
                    .compare_exchange(NONE, now, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    pub(super) fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NONE, Ordering::Release);
    }

    pub(super) fn request_done(&self) {
        self.last_active.store(self.now(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Why the connection should close now, if it should; else how long
    /// until it next needs a look.
    pub(super) fn check(&self, bounds: &Bounds) -> Result<Duration, Refusal> {
        let now = self.now();
        let left = |since: u64, limit: Duration| {
            (limit.as_millis() as u64).saturating_sub(now.saturating_sub(since))
        };
        let stalled = self.write_stalled.load(Ordering::Acquire);
        let mut soonest = bounds.header_timeout.min(bounds.idle_timeout);
        if stalled != NONE {
            match left(stalled, bounds.write_timeout) {
                0 => return Err(Refusal::WriteTimeout),
                ms => soonest = soonest.min(Duration::from_millis(ms)),
            }
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Ok(soonest);
        }
        let head = self.head_since.load(Ordering::Acquire);
        if head != NONE {
            return match left(head, bounds.header_timeout) {
                0 => Err(Refusal::HeaderTimeout),
                ms => Ok(Duration::from_millis(ms)),
            };
        }
        match left(
            self.last_active.load(Ordering::Relaxed),
            bounds.idle_timeout,
        ) {
            0 => Err(Refusal::IdleTimeout),
            ms => Ok(Duration::from_millis(ms)),
        }
    }
}

/// The TCP stream, telling its connection's activity about every read and
/// every write that waits on the peer.
pub(super) struct Watched {
    pub(super) tcp: TcpStream,
    pub(super) activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.tcp).poll_write(cx, buf);
        self.activity.wrote(polled)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.tcp).poll_flush(cx);
        self.activity.wrote(polled)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        self.activity.wrote(polled)
    }
    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

/// A response body that tells the connection when it is done (sent in
/// full, or dropped).
pub(super) struct Tracked {
    pub(super) body: Body,
    pub(super) activity: Option<Arc<Activity>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(a) = self.activity.take() {
            a.request_done();
        }
    }
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled
            && let Some(a) = self.activity.take()
        {
            a.request_done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body that must arrive whole by a deadline.
pub(super) struct Deadline {
    pub(super) body: Body,
    pub(super) sleep: Pin<Box<tokio::time::Sleep>>,
    pub(super) peer: IpAddr,
}

impl http_body::Body for Deadline {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            refused(Refusal::BodyTimeout, self.peer);
            return Poll::Ready(Some(Err(axum::Error::new(
                "the request body did not arrive in time",
            ))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
