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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::{Value, json};

pub use config::{ServerSpec, Transport, UpstreamConfig};
use connection::Connection;
pub use connection::{Failure, ProgressSink};

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
    pub fn new(
        path: Option<PathBuf>,
        limits: Limits,
        writable: crate::sandbox::paths::Writable,
        place_check: PlaceCheck,
    ) -> Result<Arc<Self>, String> {
        let config = match &path {
            Some(p) => UpstreamConfig::read(p)?,
            None => UpstreamConfig::default(),
        };
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
    let conn = Connection::new(Arc::new(spec.clone()), 16 << 20, Arc::new(rules));
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

/// One tenant's servers: the ones granted to it, its own connections.
pub struct TenantUpstreams {
    tenant: String,
    shared: Arc<Shared>,
    conns: tokio::sync::Mutex<HashMap<String, Arc<Connection>>>,
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

    /// The connection to `server` (made, not started, when new).
    async fn connection(&self, server: &str) -> Result<Arc<Connection>, Failure> {
        let spec = self.spec(server)?;
        let mut conns = self.conns.lock().await;
        if let Some(conn) = conns.get(server) {
            if *conn.spec == *spec {
                return Ok(conn.clone());
            }
            let old = conns.remove(server);
            if let Some(old) = old {
                old.stop().await;
            }
        }
        let max = self.shared.limits.max_servers.max(1);
        if conns.len() >= max {
            // Make room by ending the longest-unused server with no call in flight.
            let victim = conns
                .iter()
                .filter(|(_, c)| c.idle_for(Duration::ZERO))
                .map(|(n, _)| n.clone())
                .next();
            match victim.and_then(|n| conns.remove(&n)) {
                Some(old) => old.stop().await,
                None => {
                    return Err(Failure::Refused(format!(
                        "this tenant already uses {max} MCP servers, each with calls in flight (--mcp-max-servers); wait for those calls to end"
                    )));
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
        ));
        conns.insert(server.to_string(), conn.clone());
        Ok(conn)
    }

    /// The allowed tools of `server`: name, title, description, input and
    /// output schema.
    pub async fn tools(&self, server: &str) -> Result<Value, Failure> {
        let conn = self.connection(server).await?;
        let _use = conn.in_use();
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
                    v
                })
                .collect(),
        ))
    }

    /// Calls `tool` of `server` with `arguments` (a JSON object passed as
    /// is). Dropping the future cancels the call upstream.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        progress: Option<ProgressSink>,
    ) -> CallOutcome {
        let conn = match self.connection(server).await {
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
        let _use = conn.in_use();
        let timeout = conn.spec.timeout.unwrap_or(self.shared.limits.call_timeout);
        match conn.call(tool, arguments, timeout, progress).await {
            Ok(result) => match result::for_driver(&result, self.shared.limits.max_result_bytes) {
                Ok(v) => CallOutcome::Ok(v),
                Err(message) => CallOutcome::ToolError(message),
            },
            Err(f) => CallOutcome::Failure(f),
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
