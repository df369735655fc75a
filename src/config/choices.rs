//! The operator's choices that start-up, the transports and the viewer
//! decide from, taken from the flags once and checked (sizes parsed), so
//! that nothing below `config` and `app.rs` reads the command line. Paths
//! stay as the operator named them: start-up resolves them against the
//! workspace.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::cli::SandboxFlag;
use super::{DefaultSession, Flags, Network};
use crate::sandbox::SandboxMode;

/// Which interpreters sessions run (--python, --venv, --r, --cran,
/// --allow-python).
#[derive(Debug, Clone)]
pub struct Interpreters {
    pub python: Option<PathBuf>,
    pub venv: Option<PathBuf>,
    pub allow_python: Vec<PathBuf>,
    /// --kernels: the installed Jupyter kernels sessions may run on.
    pub kernels: Vec<String>,
    pub r: Option<PathBuf>,
    /// The CRAN mirror r_install uses.
    pub cran: String,
}

/// What sessions may read, write and reach beyond the workspace, and how
/// they are confined.
#[derive(Debug, Clone)]
pub struct SandboxChoices {
    /// With `inherit`, the ceiling: workspace-write.
    pub mode: SandboxMode,
    /// --sandbox inherit: each call's client policy narrows `mode`.
    pub inherit: bool,
    /// --sandbox-require: refuse to start on a degraded sandbox.
    pub require: bool,
    pub namespaces: bool,
    pub allow_degraded_isolation: bool,
    pub network: Network,
    pub allow_host_egress: Vec<String>,
    /// --allow-domain, parsed (only with --network domains).
    pub allow_domain: Vec<crate::egress::DomainPattern>,
    pub egress_allow_private: bool,
    pub allow_source_builds: bool,
    pub allow_read: Vec<PathBuf>,
    pub allow_write: Vec<PathBuf>,
    pub allow_device: Vec<PathBuf>,
    pub protect: Vec<String>,
    pub allow_write_protected: Vec<String>,
    pub pass_env: Vec<String>,
    /// --memory-limit (None: none).
    pub memory_limit: Option<u64>,
    pub max_processes: u64,
    /// --max-file-size (u64::MAX: none).
    pub max_file_bytes: u64,
    pub max_open_files: u64,
    /// A root server's session uids and the host's table of them.
    pub tenant_uids: (u32, u32),
    pub uid_table: PathBuf,
    pub tenant_cpu_weight: u64,
}

/// The files ferrepl reads that sessions must never reach.
#[derive(Debug, Clone)]
pub struct OwnFiles {
    pub auth_token_file: Option<PathBuf>,
    pub mcp_servers: Option<PathBuf>,
    /// Only while the viewer is on.
    pub viewer_tokens: Option<PathBuf>,
}

/// How MCP clients reach the server.
#[derive(Debug, Clone)]
pub struct Serving {
    /// --http (None: stdio).
    pub http: Option<SocketAddr>,
    pub metrics_addr: Option<SocketAddr>,
    pub allow_hosts: Vec<String>,
    pub allow_origins: Vec<String>,
    pub max_request_bytes: usize,
    /// Each HTTP client has its default session of its own.
    pub per_client: bool,
    pub client_grace: std::time::Duration,
    pub session_idle: std::time::Duration,
    /// Event streams one principal may hold (--max-connections).
    pub max_streams: usize,
    /// --tools, as given (parsed by `mcp::groups`).
    pub tools: Vec<String>,
}

/// The person's viewer (--viewer and its flags).
#[derive(Debug, Clone)]
pub struct ViewerChoices {
    pub addr: Option<SocketAddr>,
    pub tokens: Option<PathBuf>,
    pub allow_hosts: Vec<String>,
    pub max_clients: usize,
}

impl Interpreters {
    pub fn from_flags(flags: &Flags) -> Self {
        Self {
            python: flags.python.clone(),
            venv: flags.venv.clone(),
            allow_python: flags.allow_python.clone(),
            kernels: flags.kernels.clone(),
            r: flags.r.clone(),
            cran: flags.cran.clone(),
        }
    }
}

impl SandboxChoices {
    pub fn from_flags(flags: &Flags) -> anyhow::Result<Self> {
        use anyhow::Context;
        Ok(Self {
            mode: match flags.sandbox {
                SandboxFlag::ReadOnly => SandboxMode::ReadOnly,
                SandboxFlag::WorkspaceWrite | SandboxFlag::Inherit => SandboxMode::WorkspaceWrite,
                SandboxFlag::DangerFullAccess => SandboxMode::Off,
            },
            inherit: flags.sandbox == SandboxFlag::Inherit,
            require: flags.sandbox_require,
            namespaces: !flags.no_namespaces,
            allow_degraded_isolation: flags.tenants.allow_degraded_isolation,
            network: flags.network,
            allow_host_egress: flags.allow_host_egress.clone(),
            allow_domain: allow_domain(flags)?,
            egress_allow_private: flags.egress_allow_private,
            allow_source_builds: flags.allow_source_builds,
            allow_read: flags.allow_read.clone(),
            allow_write: flags.allow_write.clone(),
            allow_device: flags.allow_device.clone(),
            protect: flags.protect.clone(),
            allow_write_protected: flags.allow_write_protected.clone(),
            pass_env: flags.pass_env.clone(),
            memory_limit: crate::units::parse_bytes(&flags.memory_limit)
                .context("--memory-limit")?,
            max_processes: flags.max_processes,
            max_file_bytes: crate::units::parse_bytes(&flags.max_file_size)
                .context("--max-file-size")?
                .unwrap_or(u64::MAX),
            max_open_files: flags.max_open_files,
            tenant_uids: flags.tenants.tenant_uids,
            uid_table: flags.tenants.uid_table.clone(),
            tenant_cpu_weight: flags.tenants.tenant_cpu_weight,
        })
    }

    /// Cells reach no network (the hints say so when one fails); with
    /// --network domains they reach some hosts, and a refusal names itself.
    pub fn cells_offline(&self) -> bool {
        !matches!(self.network, Network::On | Network::Domains) && self.mode != SandboxMode::Off
    }
}

/// `--allow-domain`, checked against `--network` and `--sandbox`: the
/// patterns cells may reach, refused at start when malformed or when
/// nothing would enforce them.
fn allow_domain(flags: &Flags) -> anyhow::Result<Vec<crate::egress::DomainPattern>> {
    let named: Vec<&String> = flags
        .allow_domain
        .iter()
        .filter(|p| !p.trim().is_empty())
        .collect();
    if flags.network != Network::Domains {
        if !named.is_empty() {
            anyhow::bail!(
                "--allow-domain is for --network domains (cells reach the hosts it names through ferrepl's proxy); add --network domains, or drop --allow-domain"
            );
        }
        return Ok(Vec::new());
    }
    if flags.sandbox == SandboxFlag::DangerFullAccess {
        anyhow::bail!(
            "--network domains needs the sandbox (with --sandbox danger-full-access nothing stops cells from reaching any host); use --sandbox workspace-write, read-only or inherit, or --network on"
        );
    }
    if named.is_empty() {
        anyhow::bail!(
            "--network domains needs the hosts cells may reach: add --allow-domain, e.g. --allow-domain api.example.com,**.example.org"
        );
    }
    let mut patterns = Vec::with_capacity(named.len());
    for raw in flags.allow_domain.iter() {
        // Empty entries of a comma-separated list (a trailing comma) are
        // refused too: "a,,b" is more likely a typo than intent.
        let pattern = crate::egress::DomainPattern::parse(raw).map_err(|why| {
            anyhow::anyhow!(
                "--allow-domain {raw:?}: {why}; write example.com, *.example.com (subdomains only) or **.example.com (the domain and its subdomains), optionally ending in :PORT"
            )
        })?;
        if !patterns.contains(&pattern) {
            patterns.push(pattern);
        }
    }
    Ok(patterns)
}

impl OwnFiles {
    pub fn from_flags(flags: &Flags) -> Self {
        Self {
            auth_token_file: flags.serving.auth_token_file.clone(),
            mcp_servers: flags.mcp_servers.clone(),
            viewer_tokens: flags
                .viewer_tokens
                .clone()
                .filter(|_| flags.viewer.is_some()),
        }
    }
}

impl Serving {
    pub fn from_flags(flags: &Flags) -> Self {
        Self {
            http: flags.http,
            metrics_addr: flags.serving.metrics_addr,
            allow_hosts: flags.serving.allow_hosts.clone(),
            allow_origins: flags.serving.allow_origins.clone(),
            max_request_bytes: flags.serving.max_request_bytes,
            per_client: flags.serving.default_session == DefaultSession::PerClient,
            client_grace: std::time::Duration::from_secs(flags.serving.client_grace),
            session_idle: std::time::Duration::from_secs(flags.serving.http_session_idle.max(1)),
            max_streams: flags.serving.max_connections.max(1),
            tools: flags.tools.clone(),
        }
    }
}

impl ViewerChoices {
    pub fn from_flags(flags: &Flags) -> Self {
        Self {
            addr: flags.viewer,
            tokens: flags.viewer_tokens.clone(),
            allow_hosts: flags.viewer_allow_hosts.clone(),
            max_clients: flags.viewer_max_clients.max(1),
        }
    }
}
