//! One upstream server as ferrepl's MCP client sees it: started on first
//! use, kept while used, started again after a crash (with backoff), ended
//! when idle or when ferrepl ends.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam,
    ClientRequest, ProgressNotificationParam, ProgressToken, RequestId, ServerResult, Tool,
};
use rmcp::service::{
    MaybeSendFuture, NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningService,
};
use tokio::sync::Mutex;

use super::child::{SpawnRules, UpstreamChild};
use super::config::{ServerSpec, Transport};
use crate::output::redact::Secrets;

/// How long a server may take to start and answer `initialize`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// First wait before starting a server again after it failed; doubles up
/// to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Why a call did not reach a result.
#[derive(Debug, Clone)]
pub enum Failure {
    /// Not allowed or not possible by policy: nothing was sent upstream.
    Refused(String),
    /// The upstream failed (start, crash, timeout, transport).
    Failed(String),
}

/// Where an upstream's progress on one call goes: its latest report.
pub type ProgressSink = Arc<StdMutex<Option<String>>>;

/// ferrepl's client handler: progress notifications of calls in flight go
/// to their callers' sinks, secrets redacted (everything else keeps rmcp's
/// defaults).
#[derive(Clone, Default)]
struct ProgressRelay {
    sinks: Arc<StdMutex<HashMap<ProgressToken, ProgressSink>>>,
    secrets: Secrets,
}

impl ProgressRelay {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ProgressToken, ProgressSink>> {
        self.sinks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl rmcp::ClientHandler for ProgressRelay {
    fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        if let Some(sink) = self.map().get(&params.progress_token) {
            let amount = match params.total {
                Some(total) => format!("{}/{}", params.progress, total),
                None => format!("{}", params.progress),
            };
            let text = match &params.message {
                Some(m) if !m.is_empty() => format!("{amount} {m}"),
                _ => amount,
            };
            // Redacted before the cut, which could leave a secret's start.
            let mut text = self.secrets.redact(text);
            if text.len() > 200 {
                let mut cut = 200;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
            }
            *sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
        }
        std::future::ready(())
    }
}

/// Sends `notifications/cancelled` for a call whose answer is no longer
/// awaited, unless disarmed (the answer came); stops relaying its progress.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: RequestId,
    token: ProgressToken,
    relay: ProgressRelay,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.relay.map().remove(&self.token);
        if !self.armed {
            return;
        }
        let peer = self.peer.clone();
        let notification = CancelledNotification::new(CancelledNotificationParam::new(
            Some(self.id.clone()),
            Some("the session's code stopped waiting".into()),
        ));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = peer.send_notification(notification.into()).await;
            });
        }
    }
}

struct Live {
    service: RunningService<RoleClient, ProgressRelay>,
    /// The child process of a stdio server (ended with its group on drop).
    child: Option<UpstreamChild>,
    /// Its tools, listed once per start.
    tools: Option<Arc<Vec<Tool>>>,
}

enum State {
    Stopped,
    Live(Box<Live>),
    /// Failed to start or crashed: not started again before `retry_at`.
    Backoff {
        retry_at: Instant,
        delay: Duration,
        why: String,
    },
}

pub struct Connection {
    pub spec: Arc<ServerSpec>,
    state: Mutex<State>,
    relay: ProgressRelay,
    /// Calls in flight and the last use, for idle shutdown.
    use_state: StdMutex<(usize, Instant)>,
    max_response_bytes: usize,
    rules: Arc<SpawnRules>,
    /// What the server must never pass on to a session.
    secrets: Secrets,
    /// Woken when its last call in flight ends.
    freed: Option<Arc<tokio::sync::Notify>>,
    /// Tools that run only as MCP tasks (`execution.taskSupport:
    /// "required"`), which calls from code cannot follow. rmcp's `Tool`
    /// drops `execution`: a stdio server's are read from its tools/list
    /// (sniff.rs), any server's learnt from its refusal of a plain call.
    task_only: super::sniff::TaskOnly,
}

impl Connection {
    pub fn new(
        spec: Arc<ServerSpec>,
        max_response_bytes: usize,
        rules: Arc<SpawnRules>,
        secrets: Secrets,
        freed: Option<Arc<tokio::sync::Notify>>,
    ) -> Self {
        Connection {
            spec,
            state: Mutex::new(State::Stopped),
            relay: ProgressRelay {
                sinks: Default::default(),
                secrets: secrets.clone(),
            },
            use_state: StdMutex::new((0, Instant::now())),
            max_response_bytes,
            rules,
            secrets,
            freed,
            task_only: Default::default(),
        }
    }

    /// Records that `tool` runs only as a task: its refusal.
    fn learn_task_only(&self, tool: &str) -> Failure {
        self.task_only
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tool.to_string());
        Failure::Refused(self.unavailable(tool).unwrap_or_default())
    }

    /// Why `tool` is unavailable to sessions, if it is.
    pub fn unavailable(&self, tool: &str) -> Option<String> {
        let known = self.task_only.lock().unwrap_or_else(|e| e.into_inner());
        known.contains(tool).then(|| {
            format!(
                "tool '{tool}' of MCP server '{}' runs only as an MCP task (taskSupport: required), \
                 which calls from code do not follow: it is unavailable to sessions",
                self.spec.name
            )
        })
    }

    /// An rmcp error as messages quote it: secrets redacted, and also the
    /// start of one its text may hold where rmcp cut a body it quotes
    /// (at 256 bytes, or its diagnostic limit), which no longer matches.
    fn quoted(&self, e: &dyn std::fmt::Display) -> String {
        self.secrets
            .current()
            .redact_cut(&e.to_string())
            .into_owned()
    }

    fn uses(&self) -> std::sync::MutexGuard<'_, (usize, Instant)> {
        self.use_state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a use for as long as the guard lives.
    pub fn in_use(self: &Arc<Self>) -> InUse {
        let mut u = self.uses();
        u.0 += 1;
        u.1 = Instant::now();
        InUse(self.clone())
    }

    /// Unused for at least `idle` with nothing in flight.
    pub fn idle_for(&self, idle: Duration) -> bool {
        let u = self.uses();
        u.0 == 0 && u.1.elapsed() >= idle
    }

    /// Since when it has had no call in flight (None: it has some).
    pub fn idle_since(&self) -> Option<Instant> {
        let u = self.uses();
        (u.0 == 0).then_some(u.1)
    }

    /// Whether a server process or connection is up.
    pub async fn is_live(&self) -> bool {
        matches!(&*self.state.lock().await, State::Live(_))
    }

    /// The running service's peer, starting it when needed.
    async fn peer(&self) -> Result<Peer<RoleClient>, Failure> {
        let mut state = self.state.lock().await;
        if let State::Live(live) = &*state {
            // rmcp's own flag misses a transport that reached its end (the
            // server exited): ask the peer and the process too.
            let gone = live.service.is_closed()
                || live.service.peer().is_transport_closed()
                || live
                    .child
                    .as_ref()
                    .is_some_and(|c| c.exit_status().is_some());
            if !gone {
                return Ok(live.service.peer().clone());
            }
            let why = match live.child.as_ref().and_then(UpstreamChild::exit_status) {
                Some(status) => format!("it exited ({status})"),
                None => "it closed the connection".to_string(),
            };
            tracing::warn!(server = %self.spec.name, "upstream server stopped: {why}; starting it again");
            *state = State::Stopped;
        }
        let delay = match &*state {
            State::Backoff {
                retry_at,
                delay,
                why,
            } => {
                let now = Instant::now();
                if now < *retry_at {
                    return Err(Failure::Failed(format!(
                        "MCP server '{}' failed: {why}; ferrepl starts it again in {:.0} s",
                        self.spec.name,
                        (*retry_at - now).as_secs_f64().ceil()
                    )));
                }
                (*delay * 2).min(MAX_BACKOFF)
            }
            _ => FIRST_BACKOFF,
        };
        match tokio::time::timeout(START_TIMEOUT, self.start()).await {
            Ok(Ok(live)) => {
                let peer = live.service.peer().clone();
                *state = State::Live(Box::new(live));
                Ok(peer)
            }
            result => {
                let why = match result {
                    Ok(Err(why)) => why,
                    _ => format!(
                        "it did not answer initialize within {} s",
                        START_TIMEOUT.as_secs()
                    ),
                };
                tracing::warn!(server = %self.spec.name, "upstream server did not start: {why}");
                *state = State::Backoff {
                    retry_at: Instant::now() + delay,
                    delay,
                    why: why.clone(),
                };
                Err(Failure::Failed(format!(
                    "MCP server '{}' could not be started: {why}",
                    self.spec.name
                )))
            }
        }
    }

    async fn start(&self) -> Result<Live, String> {
        match &self.spec.transport {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let (child, stdout, stdin) = UpstreamChild::spawn(
                    &self.spec.name,
                    command,
                    args,
                    env,
                    cwd.as_deref(),
                    &self.rules,
                    &self.secrets,
                )?;
                let stdout = super::sniff::Sniffer::new(
                    stdout,
                    self.max_response_bytes,
                    self.task_only.clone(),
                );
                let served = self.relay.clone().serve((stdout, stdin)).await;
                let service = match served {
                    Ok(service) => service,
                    Err(e) => {
                        // Its last words arrive just after it closed stdout.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let status = child
                            .exit_status()
                            .map(|s| format!(" (it exited: {s})"))
                            .unwrap_or_default();
                        let tail = child.stderr_tail();
                        let said = if tail.is_empty() {
                            String::new()
                        } else {
                            format!("; it said: {tail}")
                        };
                        let e = self.quoted(&e);
                        return Err(format!("the MCP handshake failed: {e}{status}{said}"));
                    }
                };
                tracing::info!(server = %self.spec.name, pid = child.pid(), "upstream server started");
                Ok(Live {
                    service,
                    child: Some(child),
                    tools: None,
                })
            }
            #[cfg(not(target_os = "linux"))]
            Transport::Http { url, .. } if url.starts_with("https:") => Err(format!(
                "{}: this build of ferrepl (macOS) has no TLS client; reach an https server through a local TLS proxy (an http:// URL on loopback)",
                redact_url(url)
            )),
            Transport::Http { url, headers } => {
                super::ensure_tls();
                use rmcp::transport::StreamableHttpClientTransport;
                use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                for (k, v) in headers {
                    // Checked when the file was read.
                    if let (Ok(k), Ok(v)) = (
                        http::HeaderName::from_bytes(k.as_bytes()),
                        http::HeaderValue::from_str(v),
                    ) {
                        config.custom_headers.insert(k, v);
                    }
                }
                config.max_json_response_size = self.max_response_bytes;
                config.max_sse_event_size = self.max_response_bytes;
                let transport = StreamableHttpClientTransport::from_config(config);
                let shown = redact_url(url);
                let service = self.relay.clone().serve(transport).await.map_err(|e| {
                    let e = self.quoted(&without_url(&e.to_string(), url, &shown));
                    format!("the MCP handshake with {shown} failed: {e}")
                })?;
                tracing::info!(server = %self.spec.name, "upstream server connected");
                Ok(Live {
                    service,
                    child: None,
                    tools: None,
                })
            }
        }
    }

    /// Its tools (every one; the caller filters), listed once per start.
    pub async fn tools(&self) -> Result<Arc<Vec<Tool>>, Failure> {
        let peer = self.peer().await?;
        {
            let state = self.state.lock().await;
            if let State::Live(live) = &*state
                && let Some(tools) = &live.tools
            {
                return Ok(tools.clone());
            }
        }
        let listed = tokio::time::timeout(START_TIMEOUT, peer.list_all_tools())
            .await
            .map_err(|_| {
                Failure::Failed(format!(
                    "MCP server '{}' did not list its tools within {} s",
                    self.spec.name,
                    START_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| {
                Failure::Failed(format!(
                    "MCP server '{}' did not list its tools: {}",
                    self.spec.name,
                    self.quoted(&e)
                ))
            })?;
        let tools = Arc::new(listed);
        if let State::Live(live) = &mut *self.state.lock().await {
            live.tools = Some(tools.clone());
        }
        Ok(tools)
    }

    /// Calls `tool`; dropping the future cancels it upstream
    /// (`notifications/cancelled`), as the timeout does. The tool's
    /// progress reports go to `progress`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        timeout: Duration,
        progress: Option<ProgressSink>,
    ) -> Result<rmcp::model::CallToolResult, Failure> {
        if let Some(why) = self.unavailable(tool) {
            return Err(Failure::Refused(why));
        }
        let peer = self.peer().await?;
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = peer
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
            .map_err(|e| self.failed(&peer, e))?;
        let mut guard = CancelOnDrop {
            peer: peer.clone(),
            id: handle.id.clone(),
            token: handle.progress_token.clone(),
            relay: self.relay.clone(),
            armed: true,
        };
        if let Some(sink) = progress {
            self.relay.map().insert(guard.token.clone(), sink);
        }
        let answer = tokio::time::timeout(timeout, handle.await_response()).await;
        if answer.is_ok() {
            guard.armed = false;
        }
        drop(guard);
        match answer {
            // Servers answer a plain call of a task-only tool with a
            // protocol error, or (the TypeScript SDK) with that error as the
            // tool's.
            Ok(Ok(ServerResult::CallToolResult(result)))
                if result.is_error == Some(true)
                    && result
                        .content
                        .iter()
                        .any(|c| c.as_text().is_some_and(|t| needs_a_task(&t.text))) =>
            {
                Err(self.learn_task_only(tool))
            }
            Ok(Ok(ServerResult::CallToolResult(result))) => Ok(result),
            Ok(Ok(_)) => Err(Failure::Failed(format!(
                "MCP server '{}' answered {tool} with something other than a tool result",
                self.spec.name
            ))),
            Ok(Err(rmcp::ServiceError::McpError(e))) if needs_a_task(&e.message) => {
                Err(self.learn_task_only(tool))
            }
            Ok(Err(e)) => Err(self.failed(&peer, e)),
            Err(_) => Err(Failure::Failed(format!(
                "MCP server '{}' did not answer {tool} within {} s (timeoutSeconds, else --mcp-call-timeout); the call was cancelled",
                self.spec.name,
                timeout.as_secs_f64()
            ))),
        }
    }

    fn failed(&self, peer: &Peer<RoleClient>, e: rmcp::ServiceError) -> Failure {
        let closed = matches!(e, rmcp::ServiceError::TransportClosed) || peer.is_transport_closed();
        let e = match &self.spec.transport {
            Transport::Http { url, .. } => {
                self.quoted(&without_url(&e.to_string(), url, &redact_url(url)))
            }
            Transport::Stdio { .. } => self.quoted(&e),
        };
        Failure::Failed(if closed {
            format!(
                "MCP server '{}' stopped during the call (it crashed or closed the connection); the next call starts it again",
                self.spec.name
            )
        } else {
            format!("MCP server '{}': {e}", self.spec.name)
        })
    }

    /// Ends the server (its process group too) or the HTTP session.
    pub async fn stop(&self) {
        let old = std::mem::replace(&mut *self.state.lock().await, State::Stopped);
        if let State::Live(live) = old {
            let Live { service, child, .. } = *live;
            let _ = tokio::time::timeout(Duration::from_secs(2), service.cancel()).await;
            drop(child);
            tracing::info!(server = %self.spec.name, "upstream server stopped");
        }
    }
}

/// A use of a connection (calls in flight), for idle shutdown.
pub struct InUse(Arc<Connection>);

impl Drop for InUse {
    fn drop(&mut self) {
        let mut u = self.0.uses();
        u.0 = u.0.saturating_sub(1);
        u.1 = Instant::now();
        let idle = u.0 == 0;
        drop(u);
        if idle && let Some(freed) = &self.0.freed {
            freed.notify_waiters();
        }
    }
}

/// A URL as messages show it: no credentials, query or fragment (they may
/// hold a key; sessions read these messages).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or("");
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{host}{port}{}", u.scheme(), u.path())
        }
        Err(_) => "the server's URL".into(),
    }
}

/// `text` with the URL (and its query, alone) replaced by its redacted form.
fn without_url(text: &str, url: &str, shown: &str) -> String {
    let mut out = text.replace(url, shown);
    if let Ok(u) = url::Url::parse(url) {
        // Libraries print URLs normalised: that form too, and the pieces.
        out = out.replace(u.as_str(), shown);
        for secret in [u.query(), u.fragment(), u.password()]
            .into_iter()
            .flatten()
        {
            if !secret.is_empty() {
                out = out.replace(secret, "…");
            }
        }
        if !u.username().is_empty() {
            out = out.replace(u.username(), "…");
        }
    }
    out
}

/// A server's refusal of a plain call to a tool that runs only as a task
/// (the TypeScript SDK: "Tool X requires task augmentation (taskSupport:
/// 'required')").
fn needs_a_task(message: &str) -> bool {
    message.contains("task augmentation") || message.contains("taskSupport")
}
