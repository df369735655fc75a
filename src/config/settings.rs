//! The command line turned, once, into what each component is built from:
//! every duration and size checked, every default applied, nothing read
//! twice; a bad value is refused here, before anything starts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::Flags;
use super::choices::{Interpreters, OwnFiles, SandboxChoices, Serving, ViewerChoices};
use super::stores::Stores;
use crate::installer::InstallerSettings;
use crate::jobs::JobConfig;
use crate::sandbox::SandboxConfig;
use crate::session::Limits;
use crate::units::seconds;
use crate::worker::LaunchSpec;

/// How much output results and logs keep (shared by cells and jobs).
#[derive(Debug, Clone, Copy)]
pub struct OutputSizes {
    pub head_bytes: usize,
    pub tail_bytes: usize,
    /// Full output kept per cell or job (--output-log-bytes).
    pub log_bytes: u64,
}

/// The HTTP listener's bounds and the shares of each principal.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// To send each request head (from its first byte, or the opening);
    /// a body gets 6 times as long.
    pub header_timeout: Duration,
    /// With no request in flight.
    pub idle_timeout: Duration,
    /// A response the peer stops reading (its socket's buffer full) is cut
    /// after this long: the idle timeout (the viewer's is shorter).
    pub write_timeout: Duration,
    pub max_connections: usize,
    /// 0: no per-peer cap.
    pub max_per_peer: usize,
    /// Largest request head.
    pub max_head_bytes: usize,
    /// Proxies whose forwarded-for header names the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Connections one authenticated tenant may hold.
    pub tenant_connections: usize,
    /// Event streams one principal may hold open (its MCP connections).
    pub principal_streams: usize,
    /// Request body bytes buffered at once, in all and by one principal.
    pub buffered_total: usize,
    pub buffered_share: usize,
}

/// `--http-max-buffered-bytes`, by default 32 of the largest requests.
fn buffered_total(flags: &Flags) -> usize {
    flags
        .serving
        .http_max_buffered_bytes
        .unwrap_or(flags.serving.max_request_bytes.saturating_mul(32))
        .max(flags.serving.max_request_bytes)
}

/// `--http-trusted-proxy` entries: a CIDR, or an address (its own /32 or /128).
fn trusted_proxies(entries: &[String]) -> anyhow::Result<Vec<ipnet::IpNet>> {
    entries
        .iter()
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let e = e.trim();
            e.parse::<ipnet::IpNet>()
                .or_else(|_| e.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    anyhow::anyhow!(
                        "--http-trusted-proxy {e}: not an address or CIDR (e.g. 10.0.0.0/8, 127.0.0.1)"
                    )
                })
        })
        .collect()
}

/// What one named tenant may hold of the instance: by default half of
/// each instance limit (at least 1), so one tenant at its limit leaves room
/// for the others.
#[derive(Debug, Clone, Copy)]
pub struct Shares {
    pub sessions: usize,
    pub jobs: usize,
    /// Warm-pool interpreters (0 when there is no pool).
    pub warm_pool: usize,
}

/// Everything but what start-up has to discover (interpreter, sandbox).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The workspace, canonical.
    pub workdir: PathBuf,
    pub limits: Limits,
    pub output: OutputSizes,
    pub max_value_chars: usize,
    pub max_image_bytes: u64,
    pub max_jobs: usize,
    pub job_ttl: Duration,
    pub structured: bool,
    /// --checkpoints: frozen copies kept per session (0: none).
    pub checkpoints: usize,
    /// --languages, each once.
    pub languages: Vec<crate::worker::Language>,
    /// Each tenant's workspace quota (--tenant-disk) and memory budget
    /// (--tenant-memory).
    pub tenant_disk: Option<u64>,
    pub tenant_memory: Option<u64>,
    /// HTTP: how long running cells get at SIGTERM (None over stdio).
    pub drain: Option<Duration>,
    pub http: HttpLimits,
    pub shares: Shares,
    pub stores: Stores,
    pub interpreters: Interpreters,
    pub sandbox: SandboxChoices,
    pub own_files: OwnFiles,
    pub serving: Serving,
    pub viewer: ViewerChoices,
    /// The bounds on calls to the operator's upstream MCP servers.
    pub upstream: crate::upstream::Limits,
    /// What every new environment gets: --preinstall, --requirements, --preimport.
    pub ready_made: super::ready::ReadyMade,
}

impl Shares {
    fn from_flags(flags: &Flags) -> Self {
        let half = |n: usize| (n / 2).max(1);
        let pool = usize::from(flags.warm_pool);
        Self {
            sessions: flags
                .tenants
                .tenant_max_sessions
                .unwrap_or(half(flags.max_sessions))
                .max(1),
            jobs: flags
                .tenants
                .tenant_max_jobs
                .unwrap_or(half(flags.max_jobs))
                .max(1),
            warm_pool: match pool {
                0 => 0,
                _ => flags
                    .tenants
                    .tenant_warm_pool
                    .unwrap_or(half(pool))
                    .min(pool),
            },
        }
    }
}

impl Settings {
    pub fn from_flags(flags: &Flags) -> anyhow::Result<Self> {
        let workdir = match &flags.workdir {
            Some(dir) => dir.clone(),
            None => std::env::current_dir().context("cannot read the current directory")?,
        };
        let workdir = workdir.canonicalize().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow::anyhow!(
                "--workdir {} does not exist: create it, or give an existing directory with \
                 --workdir DIR",
                workdir.display()
            ),
            _ => anyhow::anyhow!("--workdir {}: {e}", workdir.display()),
        })?;
        let optional = |value: Option<f64>, flag: &str| match value {
            Some(s) if s > 0.0 => seconds(s, flag).map(Some),
            _ => Ok(None),
        };
        let limits = Limits {
            default_wait: seconds(flags.default_wait, "--default-wait")?,
            max_wait: seconds(flags.max_wait, "--max-wait")?,
            start_timeout: seconds(flags.start_timeout, "--start-timeout")?,
            max_sessions: flags.max_sessions.max(1),
            sessions_share: false,
            inspect_timeout: Duration::from_secs(10),
            crash_grace: Duration::from_millis(500),
            interrupt_grace: seconds(flags.interrupt_grace, "--interrupt-grace")?,
            max_images: flags.max_images,
            keep_cells: flags.output_keep_cells.max(1),
            session_ttl: optional(Some(flags.session_ttl), "--session-ttl")?,
            warm_pool: usize::from(flags.warm_pool),
            cell_log_bytes: flags.output_log_bytes,
            max_cell: optional(flags.max_cell_seconds, "--max-cell-seconds")?,
            cells_offline: false,
            client_sandbox: false,
        };
        let sandbox = SandboxChoices::from_flags(flags)?;
        let ready_made = super::ready::ReadyMade::from_flags(flags, &workdir)?;
        let mut limits = limits;
        limits.cells_offline = sandbox.cells_offline();
        limits.client_sandbox = sandbox.inherit;
        Ok(Self {
            workdir,
            limits,
            output: OutputSizes {
                head_bytes: flags.output_head_bytes,
                tail_bytes: flags.output_tail_bytes,
                log_bytes: flags.output_log_bytes,
            },
            max_value_chars: flags.max_value_chars,
            max_image_bytes: flags.max_image_bytes,
            max_jobs: flags.max_jobs.max(1),
            job_ttl: seconds(flags.job_ttl, "--job-ttl")?,
            structured: flags.structured_content,
            checkpoints: flags.checkpoints,
            languages: parse_languages(&flags.languages)?,
            tenant_disk: parse_size(flags.tenants.tenant_disk.as_deref(), "--tenant-disk")?,
            tenant_memory: parse_size(flags.tenants.tenant_memory.as_deref(), "--tenant-memory")?,
            drain: match flags.http {
                Some(_) => Some(seconds(flags.serving.drain_seconds, "--drain-seconds")?),
                None => None,
            },
            http: HttpLimits {
                header_timeout: seconds(
                    flags.serving.http_header_timeout,
                    "--http-header-timeout",
                )?,
                idle_timeout: seconds(flags.serving.http_idle_timeout, "--http-idle-timeout")?,
                write_timeout: seconds(flags.serving.http_idle_timeout, "--http-idle-timeout")?,
                max_connections: flags.serving.http_max_connections.max(1),
                max_per_peer: flags
                    .serving
                    .http_max_connections_per_peer
                    .unwrap_or((flags.serving.http_max_connections / 8).max(1)),
                max_head_bytes: 64 * 1024,
                trusted_proxies: trusted_proxies(&flags.serving.http_trusted_proxy)?,
                tenant_connections: flags
                    .tenants
                    .tenant_max_http_connections
                    .unwrap_or(flags.serving.http_max_connections / 2)
                    .max(1),
                principal_streams: flags.serving.max_connections.max(1),
                buffered_total: buffered_total(flags),
                buffered_share: (buffered_total(flags) / 4).max(flags.serving.max_request_bytes),
            },
            shares: Shares::from_flags(flags),
            stores: Stores::from_flags(flags)?,
            interpreters: Interpreters::from_flags(flags),
            sandbox,
            own_files: OwnFiles::from_flags(flags),
            serving: Serving::from_flags(flags),
            viewer: ViewerChoices::from_flags(flags),
            ready_made,
            upstream: crate::upstream::Limits {
                call_timeout: seconds(flags.mcp_call_timeout, "--mcp-call-timeout")?,
                max_result_bytes: flags.mcp_max_result_bytes.max(1),
                max_in_flight: flags.mcp_max_in_flight.max(1),
                max_cell_calls: flags.mcp_max_cell_calls,
                max_servers: flags.mcp_max_servers.max(1),
                idle: seconds(flags.mcp_idle, "--mcp-idle")?,
            },
        })
    }

    /// The limits `/metrics` reports (`ferrepl_limit{limit}`), named as
    /// their flags; the shares only where there are tenants.
    pub fn limit_gauges(&self, tenants: bool) -> Vec<(&'static str, u64)> {
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        let mut out = vec![
            ("max_sessions", n(self.limits.max_sessions)),
            ("max_jobs", n(self.max_jobs)),
            ("warm_pool", n(self.limits.warm_pool)),
            ("http_max_connections", n(self.http.max_connections)),
            ("http_max_connections_per_peer", n(self.http.max_per_peer)),
            (
                "http_max_streams_per_principal",
                n(self.http.principal_streams),
            ),
            ("http_max_buffered_bytes", n(self.http.buffered_total)),
            (
                "http_max_buffered_bytes_per_principal",
                n(self.http.buffered_share),
            ),
            (
                "http_header_timeout_seconds",
                self.http.header_timeout.as_secs(),
            ),
            (
                "http_idle_timeout_seconds",
                self.http.idle_timeout.as_secs(),
            ),
        ];
        if tenants {
            out.extend([
                ("tenant_max_sessions", n(self.shares.sessions)),
                ("tenant_max_jobs", n(self.shares.jobs)),
                ("tenant_warm_pool", n(self.shares.warm_pool)),
                (
                    "tenant_max_http_connections",
                    n(self.http.tenant_connections),
                ),
            ]);
        }
        out
    }

    /// How session interpreters are started.
    pub fn launch_spec(
        &self,
        language: crate::worker::Language,
        program: PathBuf,
        log_dir: &Path,
        sandbox: Arc<SandboxConfig>,
    ) -> LaunchSpec {
        LaunchSpec {
            language,
            program,
            workdir: self.workdir.clone(),
            env: Vec::new(),
            output_head_bytes: self.output.head_bytes,
            output_tail_bytes: self.output.tail_bytes,
            max_value_chars: self.max_value_chars,
            max_image_bytes: self.max_image_bytes,
            log_dir: log_dir.to_path_buf(),
            cell_log_bytes: self.output.log_bytes,
            sandbox: Some(sandbox),
            checkpoints: self.checkpoints > 0,
            venv: None,
            upstream: None,
            preimport: self.ready_made.preimport.clone(),
            kernel: None,
            kernels: Arc::from([]),
        }
    }

    /// How shell and install jobs run.
    pub fn job_config(
        &self,
        log_dir: &Path,
        sandbox: Arc<SandboxConfig>,
        installer: InstallerSettings,
    ) -> JobConfig {
        JobConfig {
            workdir: self.workdir.clone(),
            output_head_bytes: self.output.head_bytes,
            output_tail_bytes: self.output.tail_bytes,
            log_dir: log_dir.to_path_buf(),
            log_bytes: self.output.log_bytes,
            max_running: self.max_jobs,
            keep_finished: self.job_ttl,
            max_kept: 100,
            drain_grace: Duration::from_millis(500),
            sandbox: Some(sandbox),
            installer: Arc::new(installer),
            gate: None,
        }
    }
}

fn parse_size(value: Option<&str>, flag: &str) -> anyhow::Result<Option<u64>> {
    match value {
        Some(v) => crate::units::parse_bytes(v).with_context(|| flag.to_string()),
        None => Ok(None),
    }
}

/// `--languages`: each named once, at least one.
fn parse_languages(names: &[String]) -> anyhow::Result<Vec<crate::worker::Language>> {
    let mut out = Vec::new();
    for name in names.iter().map(|n| n.trim().to_ascii_lowercase()) {
        if name.is_empty() {
            continue;
        }
        let lang = crate::worker::Language::parse(&name).ok_or_else(|| {
            anyhow::anyhow!("--languages: unknown language '{name}'; choose from python, r")
        })?;
        if !out.contains(&lang) {
            out.push(lang);
        }
    }
    if out.is_empty() {
        anyhow::bail!("--languages: name at least one of python, r");
    }
    Ok(out)
}
