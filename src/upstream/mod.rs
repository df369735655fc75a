//! Code calls tools: the operator's upstream MCP servers (`--mcp-servers
//! FILE`), reached by ferrepl's MCP client on behalf of a session's code,
//! which calls them through its worker's control channel (the sandbox has
//! no network and never sees the servers' environment or headers). Each
//! tenant has its own connections and sees only the servers granted to it
//! and, of those, only the allowed tools.

mod child;
pub use child::SpawnRules;
pub mod config;
mod connection;
pub mod contain;
pub mod result;
mod sniff;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::{Value, json};

pub use config::{ServerSpec, Transport, UpstreamConfig};
use connection::{Connection, InUse};
pub use connection::{Failure, ProgressSink};

use crate::output::redact::Secrets;

/// Installs rustls's ring provider for the process (once; one installed
/// before, by anyone, does as well). The HTTP client needs one even for
/// plain http on Linux, where its TLS has no provider of its own.
pub fn ensure_tls() {
    #[cfg(target_os = "linux")]
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The bounds of code's tool calls (`--mcp-*` flags).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Per call, unless the server sets `timeoutSeconds`.
    pub call_timeout: Duration,
    /// Payload of one result passed to the session.
    pub max_result_bytes: usize,
    /// Calls one session may have in flight at once.
    pub max_in_flight: usize,
    /// Calls one cell may make.
    pub max_cell_calls: u64,
    /// Upstream servers (processes or HTTP sessions) a tenant may keep.
    pub max_servers: usize,
    /// An unused server is ended after this long.
    pub idle: Duration,
}

/// What a call came to.
#[derive(Debug)]
pub enum CallOutcome {
    /// The driver's form of the result (see [`result::for_driver`]).
    Ok(Value),
    /// The tool answered with an error result: its message.
    ToolError(String),
    Failure(Failure),
}

/// Checks that the servers file still lies where no session can reach it
/// (run again before a reload).
pub type PlaceCheck = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

struct Shared {
    config: RwLock<Arc<UpstreamConfig>>,
    path: Option<PathBuf>,
    limits: Limits,
    place_check: PlaceCheck,
    rules: Arc<child::SpawnRules>,
    /// Everything ferrepl hands out, redacted from what servers say.
    secrets: Secrets,
}

impl Shared {
    /// The servers as last read (a reload swaps them whole).
    fn config(&self) -> Arc<UpstreamConfig> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Every tenant's upstream connections.
pub struct Upstreams {
    shared: Arc<Shared>,
    tenants: Mutex<HashMap<String, Arc<TenantUpstreams>>>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").finish_non_exhaustive()
    }
}

impl Upstreams {
    /// Reads `--mcp-servers` (None: no servers, every call refused with
    /// why). Servers never run from (nor with PATH entries in) `writable`,
    /// what sessions can write; relative paths are the file's directory's.
    /// The servers' secrets join `secrets`, which is redacted from all
    /// they say before a session sees it.
    pub fn new(
        path: Option<PathBuf>,
        limits: Limits,
        writable: crate::sandbox::paths::Writable,
        place_check: PlaceCheck,
        secrets: Secrets,
    ) -> Result<Arc<Self>, String> {
        let config = match &path {
            Some(p) => UpstreamConfig::read(p)?,
            None => UpstreamConfig::default(),
        };
        secrets.add(config.secrets());
        let base_dir = path
            .as_deref()
            .and_then(|p| std::path::absolute(p).ok())
            .and_then(|p| p.canonicalize().ok())
            .and_then(|p| p.parent().map(std::path::Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("/"));
        let upstreams = Arc::new(Upstreams {
            shared: Arc::new(Shared {
                config: RwLock::new(Arc::new(config)),
                path,
                limits,
                place_check,
                rules: Arc::new(child::SpawnRules { writable, base_dir }),
                secrets,
            }),
            tenants: Mutex::new(HashMap::new()),
        });
        if upstreams.configured() {
            upstreams.spawn_idle_sweep();
        }
        Ok(upstreams)
    }

    pub fn configured(&self) -> bool {
        !self.config().servers.is_empty()
    }

    pub fn config(&self) -> Arc<UpstreamConfig> {
        self.shared.config()
    }

    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// `tenant`'s view ("local" for a one-tenant server).
    pub fn tenant(&self, tenant: &str) -> Arc<TenantUpstreams> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        tenants
            .entry(tenant.to_string())
            .or_insert_with(|| {
                Arc::new(TenantUpstreams {
                    tenant: tenant.to_string(),
                    shared: self.shared.clone(),
                    conns: tokio::sync::Mutex::new(HashMap::new()),
                    freed: Arc::new(tokio::sync::Notify::new()),
                })
            })
            .clone()
    }

    fn all_tenants(&self) -> Vec<Arc<TenantUpstreams>> {
        self.tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Reads the file again (SIGHUP). On an error the previous settings stay.
    /// Servers whose settings changed or that are gone are ended.
    pub async fn reload(&self) -> Result<String, String> {
        let Some(path) = &self.shared.path else {
            return Ok("no --mcp-servers file".into());
        };
        (self.shared.place_check)()?;
        let config = Arc::new(UpstreamConfig::read(path)?);
        // Known before any server is started with them.
        self.shared.secrets.add(config.secrets());
        *self
            .shared
            .config
            .write()
            .unwrap_or_else(|e| e.into_inner()) = config.clone();
        for tenant in self.all_tenants() {
            tenant.drop_stale(&config).await;
        }
        Ok(format!("{} MCP servers configured", config.servers.len()))
    }

    /// Ends every upstream server (ferrepl is stopping).
    pub async fn shutdown(&self) {
        for tenant in self.all_tenants() {
            tenant.stop_all().await;
        }
    }

    fn spawn_idle_sweep(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let idle = self.shared.limits.idle;
        let every = (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(upstreams) = weak.upgrade() else {
                    return;
                };
                for tenant in upstreams.all_tenants() {
                    tenant.stop_idle(idle).await;
                }
            }
        });
    }
}

/// Starts `spec`'s server, lists its tools and ends it (`ferrepl doctor`):
/// its tools' names with whether code may call each, or why not.
pub async fn probe(
    spec: &ServerSpec,
    rules: child::SpawnRules,
    within: Duration,
) -> Result<Vec<(String, bool)>, String> {
    let secrets = Secrets::of(
        UpstreamConfig {
            servers: vec![spec.clone()],
        }
        .secrets(),
    );
    let conn = Connection::new(
        Arc::new(spec.clone()),
        16 << 20,
        Arc::new(rules),
        secrets,
        None,
    );
    let listed = tokio::time::timeout(within, conn.tools()).await;
    conn.stop().await;
    match listed {
        Ok(Ok(tools)) => Ok(tools
            .iter()
            .map(|t| (t.name.to_string(), spec.allows(&t.name)))
            .collect()),
        Ok(Err(Failure::Refused(why) | Failure::Failed(why))) => Err(why),
        Err(_) => Err(format!("no tool list within {} s", within.as_secs())),
    }
}

/// `failure` with the secrets redacted from its message.
fn redacted(redactor: &crate::output::redact::Redactor, failure: Failure) -> Failure {
    match failure {
        Failure::Refused(m) => Failure::Refused(redactor.redact_string(m)),
        Failure::Failed(m) => Failure::Failed(redactor.redact_string(m)),
    }
}

/// One tenant's servers: the ones granted to it, its own connections.
pub struct TenantUpstreams {
    tenant: String,
    shared: Arc<Shared>,
    conns: tokio::sync::Mutex<HashMap<String, Arc<Connection>>>,
    /// Woken when a server's last call in flight ends (a caller waiting
    /// for room under --mcp-max-servers tries again).
    freed: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for TenantUpstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantUpstreams")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

impl TenantUpstreams {
    fn config(&self) -> Arc<UpstreamConfig> {
        self.shared.config()
    }

    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// The servers this tenant's code may call, in name order.
    pub fn servers(&self) -> Vec<String> {
        self.config()
            .servers
            .iter()
            .filter(|s| s.grants(&self.tenant))
            .map(|s| s.name.clone())
            .collect()
    }

    fn spec(&self, server: &str) -> Result<Arc<ServerSpec>, Failure> {
        let config = self.config();
        match config.get(server).filter(|s| s.grants(&self.tenant)) {
            Some(spec) => Ok(Arc::new(spec.clone())),
            None => {
                let names = self.servers();
                Err(Failure::Refused(if names.is_empty() {
                    "no MCP servers are configured for this session (the operator adds them with --mcp-servers FILE)".into()
                } else {
                    format!(
                        "there is no MCP server '{server}' for this session; there are: {}",
                        names.join(", ")
                    )
                }))
            }
        }
    }

    /// The connection to `server` (made, not started, when new), marked in
    /// use before any other caller can see it idle. With `--mcp-max-servers`
    /// servers kept, the longest-unused one with no call in flight is
    /// ended to make room; when every one has calls in flight, this waits
    /// for one to end, as long as the call itself may take.
    async fn connection(&self, server: &str) -> Result<(Arc<Connection>, InUse), Failure> {
        let within = self
            .spec(server)?
            .timeout
            .unwrap_or(self.shared.limits.call_timeout);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Read again after a wait: a reload may have changed it.
            let spec = self.spec(server)?;
            let mut conns = self.conns.lock().await;
            if let Some(conn) = conns.get(server) {
                if *conn.spec == *spec {
                    let used = conn.in_use();
                    return Ok((conn.clone(), used));
                }
                let old = conns.remove(server);
                if let Some(old) = old {
                    old.stop().await;
                }
            }
            let max = self.shared.limits.max_servers.max(1);
            if conns.len() >= max {
                let victim = conns
                    .iter()
                    .filter_map(|(n, c)| c.idle_since().map(|since| (since, n.clone())))
                    .min()
                    .map(|(_, n)| n);
                match victim.and_then(|n| conns.remove(&n)) {
                    Some(old) => old.stop().await,
                    None => {
                        // Registered before the lock is let go: a call that
                        // ends meanwhile still wakes this one.
                        let freed = self.freed.notified();
                        tokio::pin!(freed);
                        freed.as_mut().enable();
                        drop(conns);
                        if tokio::time::timeout_at(deadline, freed).await.is_err() {
                            return Err(Failure::Refused(format!(
                                "this tenant's {max} MCP servers (--mcp-max-servers) all had calls in flight for {:.0} s, as long as this call may take (timeoutSeconds, else --mcp-call-timeout); try again once some have ended",
                                within.as_secs_f64()
                            )));
                        }
                        continue;
                    }
                }
            }
            let conn = Arc::new(Connection::new(
                spec,
                self.shared
                    .limits
                    .max_result_bytes
                    .saturating_mul(2)
                    .max(1 << 20),
                self.shared.rules.clone(),
                self.shared.secrets.clone(),
                Some(self.freed.clone()),
            ));
            let used = conn.in_use();
            conns.insert(server.to_string(), conn.clone());
            return Ok((conn, used));
        }
    }

    /// The allowed tools of `server`: name, title, description, input and
    /// output schema; secrets redacted from them, and from the failure.
    pub async fn tools(&self, server: &str) -> Result<Value, Failure> {
        let redactor = self.shared.secrets.current();
        match self.listing(server).await {
            Ok(mut listing) => {
                redactor.redact_json(&mut listing);
                Ok(listing)
            }
            Err(f) => Err(redacted(&redactor, f)),
        }
    }

    async fn listing(&self, server: &str) -> Result<Value, Failure> {
        let (conn, _use) = self.connection(server).await?;
        let tools = conn.tools().await?;
        Ok(Value::Array(
            tools
                .iter()
                .filter(|t| conn.spec.allows(&t.name))
                .map(|t| {
                    let mut v = json!({
                        "name": t.name,
                        "description": t.description.as_deref().unwrap_or(""),
                        "inputSchema": Value::Object((*t.input_schema).clone()),
                    });
                    if let Some(title) = &t.title {
                        v["title"] = json!(title);
                    }
                    if let Some(out) = &t.output_schema {
                        v["outputSchema"] = Value::Object((**out).clone());
                    }
                    if let Some(why) = conn.unavailable(&t.name) {
                        v["unavailable"] = json!(why);
                    }
                    v
                })
                .collect(),
        ))
    }

    /// Calls `tool` of `server` with `arguments` (a JSON object passed as
    /// is). Dropping the future cancels the call upstream. Whatever it
    /// comes to, the secrets ferrepl holds are redacted from it.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        progress: Option<ProgressSink>,
    ) -> CallOutcome {
        let redactor = self.shared.secrets.current();
        match self
            .call_unredacted(server, tool, arguments, progress, &redactor)
            .await
        {
            // Redacted before it was cut to size (result::for_driver).
            CallOutcome::Ok(v) => CallOutcome::Ok(v),
            CallOutcome::ToolError(m) => CallOutcome::ToolError(redactor.redact_string(m)),
            CallOutcome::Failure(f) => CallOutcome::Failure(redacted(&redactor, f)),
        }
    }

    async fn call_unredacted(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        progress: Option<ProgressSink>,
        redactor: &crate::output::redact::Redactor,
    ) -> CallOutcome {
        let (conn, _use) = match self.connection(server).await {
            Ok(c) => c,
            Err(f) => return CallOutcome::Failure(f),
        };
        if !conn.spec.allows(tool) {
            let allowed = match conn.tools().await {
                Ok(tools) => tools
                    .iter()
                    .filter(|t| conn.spec.allows(&t.name))
                    .map(|t| t.name.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                Err(_) => conn
                    .spec
                    .allow_tools
                    .as_ref()
                    .map(|p| p.join(", "))
                    .unwrap_or_default(),
            };
            return CallOutcome::Failure(Failure::Refused(format!(
                "tool '{tool}' of MCP server '{server}' is not allowed for sessions; allowed: {allowed}"
            )));
        }
        let timeout = conn.spec.timeout.unwrap_or(self.shared.limits.call_timeout);
        let outcome = match conn.call(tool, arguments, timeout, progress).await {
            Ok(result) => {
                match result::for_driver(&result, self.shared.limits.max_result_bytes, redactor) {
                    Ok(v) => return CallOutcome::Ok(v),
                    Err(message) => CallOutcome::ToolError(message),
                }
            }
            Err(f) => CallOutcome::Failure(f),
        };
        // A tool the server does not list failed (as a protocol error,
        // -32602, or a tool error, as servers differ): a refusal, as
        // documented (CallRefused), with the tools there are.
        match conn.tools().await {
            Ok(tools) if !tools.iter().any(|t| t.name == tool) => {
                let listed: Vec<String> = tools
                    .iter()
                    .filter(|t| conn.spec.allows(&t.name))
                    .map(|t| t.name.to_string())
                    .collect();
                CallOutcome::Failure(Failure::Refused(format!(
                    "MCP server '{server}' has no tool '{tool}'; its tools: {} (ferrepl.tools('{server}') describes them)",
                    listed.join(", ")
                )))
            }
            _ => outcome,
        }
    }

    async fn drop_stale(&self, config: &UpstreamConfig) {
        let mut conns = self.conns.lock().await;
        let stale: Vec<String> = conns
            .iter()
            .filter(|(name, conn)| {
                config
                    .get(name)
                    .filter(|s| s.grants(&self.tenant))
                    .is_none_or(|s| *s != *conn.spec)
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in stale {
            if let Some(conn) = conns.remove(&name) {
                conn.stop().await;
            }
        }
    }

    async fn stop_idle(&self, idle: Duration) {
        let conns: Vec<Arc<Connection>> = self.conns.lock().await.values().cloned().collect();
        for conn in conns {
            if conn.idle_for(idle) && conn.is_live().await {
                conn.stop().await;
            }
        }
    }

    async fn stop_all(&self) {
        let conns: Vec<Arc<Connection>> = self.conns.lock().await.drain().map(|(_, c)| c).collect();
        for conn in conns {
            conn.stop().await;
        }
    }
}
