//! The allow-listing forward proxy: accept loop and connection limits, then
//! per connection the request head ([`request`]), the policy checks and
//! upstream connection ([`upstream`]), and the idle-bounded relay
//! ([`relay`]); refusals are answered by [`refusal`]. See the module
//! documentation in `mod.rs` for what is accepted and refused.

mod gate;
mod refusal;
mod relay;
mod request;
mod upstream;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::{EgressConfig, Host};
use gate::{Client, Gate};
use refusal::Refusal;
use request::Plan;

/// Pause after a failed accept (EMFILE and the like) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves until `shutdown` is cancelled. Every refusal is logged (tracing::warn!) with the host.
///
/// Cancelling `shutdown` also closes the connections still open.
#[allow(dead_code)] // wired in by the installer work (issue 11)
pub async fn serve(listener: UnixListener, rules: Arc<EgressConfig>, shutdown: CancellationToken) {
    let gate = Arc::new(Gate::new(&rules));
    accept_loop(listener, rules, gate, None, shutdown).await;
}

/// One proxy, its rules and its limits, serving several Unix listeners:
/// one for the server's own sessions and one per tenant, whose share of the
/// connections (`max_per_principal`) is counted by its listener.
pub struct SharedProxy {
    rules: Arc<EgressConfig>,
    gate: Arc<Gate>,
}

impl SharedProxy {
    pub fn new(rules: EgressConfig) -> Self {
        let gate = Arc::new(Gate::new(&rules));
        SharedProxy {
            rules: Arc::new(rules),
            gate,
        }
    }

    /// Serves `listener` until `shutdown` is cancelled; with a `principal`
    /// (a tenant's name), its connections count against that share.
    pub fn spawn(
        &self,
        listener: UnixListener,
        principal: Option<String>,
        shutdown: CancellationToken,
    ) {
        tokio::spawn(accept_loop(
            listener,
            self.rules.clone(),
            self.gate.clone(),
            principal,
            shutdown,
        ));
    }
}

/// Also a TCP flavour for tests and tools: same handling on a TcpListener.
#[allow(dead_code)] // wired in by the installer work (issue 11)
pub async fn serve_tcp(
    listener: TcpListener,
    rules: Arc<EgressConfig>,
    shutdown: CancellationToken,
) {
    let gate = Arc::new(Gate::new(&rules));
    accept_loop(listener, rules, gate, None, shutdown).await;
}

/// A listener the proxy takes its clients from.
trait Listener {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next client, how the log names it, and whose share of the
    /// connections it takes.
    async fn next_client(&self) -> io::Result<(Self::Stream, String, String)>;
}

impl Listener for UnixListener {
    type Stream = tokio::net::UnixStream;

    async fn next_client(&self) -> io::Result<(Self::Stream, String, String)> {
        let (stream, _) = self.accept().await?;
        // Every sandboxed process tree has a relay of its own (its PID 1),
        // so the relay's pid tells one session or job from another.
        let client = match stream.peer_cred().ok().and_then(|c| c.pid()) {
            Some(pid) => format!("relay {pid}"),
            None => "relay".to_string(),
        };
        Ok((stream, client.clone(), client))
    }
}

impl Listener for TcpListener {
    type Stream = TcpStream;

    async fn next_client(&self) -> io::Result<(Self::Stream, String, String)> {
        let (stream, peer) = self.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok((stream, peer.to_string(), peer.ip().to_string()))
    }
}

async fn accept_loop<L: Listener>(
    listener: L,
    rules: Arc<EgressConfig>,
    gate: Arc<Gate>,
    principal: Option<String>,
    shutdown: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.next_client() => r,
        };
        match accepted {
            Ok((stream, peer, client)) => {
                let client = Client {
                    peer,
                    principal: principal.as_deref(),
                    key: client,
                };
                gate.dispatch(stream, client, &rules, &shutdown);
            }
            Err(e) => accept_failed(e, &shutdown).await,
        }
    }
}

async fn accept_failed(e: io::Error, shutdown: &CancellationToken) {
    tracing::warn!("egress proxy: accept failed: {e}");
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = sleep(ACCEPT_BACKOFF) => {}
    }
}

/// Serves one client connection: one request, then its tunnel or response.
async fn handle<S>(mut client: S, rules: &EgressConfig, peer: &str)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut host = None;
    let result = serve_one(&mut client, rules, peer, &mut host).await;
    if let Err(refusal) = result {
        refusal.log(rules.audience(), host.as_ref(), peer);
        refusal.send(client).await;
    }
}

async fn serve_one<S>(
    client: &mut S,
    rules: &EgressConfig,
    peer: &str,
    host_out: &mut Option<Host>,
) -> Result<(), Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let Some((buf, head)) = request::read_head(client, rules).await? else {
        tracing::debug!(peer = %peer, "egress: client closed before a request");
        return Ok(());
    };
    let plan = request::plan(&head)?;
    let (host, port) = match &plan {
        Plan::Connect { host, port } => (host.clone(), *port),
        Plan::Http { host, port, .. } => (host.clone(), *port),
    };
    *host_out = Some(host.clone());
    upstream::authorize(rules, &host, port)?;
    let upstream = upstream::connect(rules, &host, port).await?;
    // What the client sent after the head: tunnel bytes or the body.
    let leftover = &buf[head.len..];
    match plan {
        #[cfg(target_os = "linux")]
        Plan::Connect { .. }
            if let Some(interceptor) =
                rules.intercept.as_ref().filter(|i| i.covers(&host, port)) =>
        {
            tracing::debug!(peer = %peer, "egress: CONNECT {host}:{port}, credentials added");
            intercepted(client, upstream, leftover, interceptor, &host, port, rules).await;
        }
        Plan::Connect { .. } => {
            tracing::debug!(peer = %peer, "egress: CONNECT {host}:{port}");
            tunnel(client, upstream, leftover, rules).await;
        }
        Plan::Http {
            head: out_head,
            body_len,
            ..
        } => {
            tracing::debug!(peer = %peer, "egress: {} http://{host}:{port}", head.method);
            forward(client, upstream, &out_head, leftover, body_len, rules).await;
        }
    }
    Ok(())
}

/// CONNECT: answers 200, sends what already followed the head, and relays.
async fn tunnel<S>(client: &mut S, mut upstream: TcpStream, leftover: &[u8], rules: &EgressConfig)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let ready = async {
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        client.flush().await?;
        if !leftover.is_empty() {
            upstream.write_all(leftover).await?;
        }
        io::Result::Ok(())
    };
    if timeout(rules.idle_timeout, ready)
        .await
        .is_ok_and(|r| r.is_ok())
    {
        relay::relay(client, upstream, None, rules.idle_timeout).await;
    }
}

/// CONNECT to an index with credentials: answers 200, then ends the TLS
/// here and sends each request on with them (see `intercept.rs`).
#[cfg(target_os = "linux")]
async fn intercepted<S>(
    client: &mut S,
    upstream: TcpStream,
    leftover: &[u8],
    interceptor: &super::Interceptor,
    host: &Host,
    port: u16,
    rules: &EgressConfig,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    use tokio::io::AsyncReadExt;
    let ready = async {
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        client.flush().await
    };
    if !timeout(rules.idle_timeout, ready)
        .await
        .is_ok_and(|r| r.is_ok())
    {
        return;
    }
    // The TLS hello may have come with the CONNECT head.
    let (read, write) = tokio::io::split(client);
    let read = std::io::Cursor::new(leftover.to_vec()).chain(read);
    let stream = tokio::io::join(read, write);
    let reconnect = || -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<TcpStream, String>> + Send + '_>> {
        Box::pin(async move {
            upstream::connect(rules, host, port)
                .await
                .map_err(|r| r.message().to_string())
        })
    };
    if let Err(e) = interceptor
        .serve(stream, upstream, &reconnect, host, port, rules)
        .await
    {
        tracing::warn!("egress: {host}:{port} with credentials: {e:#}");
    }
}

/// Plain HTTP: sends the rewritten head and the body's first bytes, then
/// relays the rest of the body (and nothing after it) and the response.
async fn forward<S>(
    client: &mut S,
    mut upstream: TcpStream,
    out_head: &[u8],
    leftover: &[u8],
    body_len: u64,
    rules: &EgressConfig,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let first = leftover
        .len()
        .min(usize::try_from(body_len).unwrap_or(usize::MAX));
    let sent = async {
        upstream.write_all(out_head).await?;
        upstream.write_all(&leftover[..first]).await?;
        upstream.flush().await
    };
    if timeout(rules.idle_timeout, sent)
        .await
        .is_ok_and(|r| r.is_ok())
    {
        let rest = body_len - first as u64;
        relay::relay(client, upstream, Some(rest), rules.idle_timeout).await;
    }
}

fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

#[cfg(test)]
mod tests;
