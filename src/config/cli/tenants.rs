//! The flags of tenants (heading "Tenants"): each named tenant's share of
//! sessions, jobs, the warm pool, memory, CPU, disk and connections, the
//! uids sessions run as, and whether degraded isolation is accepted.
//! Flattened into `Flags` as `flags.tenants`.

use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct TenantFlags {
    /// Most sessions of one tenant (default: half of --max-sessions, at least 1).
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(long, env = "FERREPL_TENANT_MAX_SESSIONS", value_name = "N")]
    pub tenant_max_sessions: Option<usize>,

    /// Jobs (shell and install) one tenant may run at once (default: half of --max-jobs, at
    /// least 1, so one tenant cannot take every slot).
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(long, env = "FERREPL_TENANT_MAX_JOBS", value_name = "N")]
    pub tenant_max_jobs: Option<usize>,

    /// Warm-pool interpreters one tenant may hold (default: half of --warm-pool, at least 1
    /// when it is not 0); with tenants, --warm-pool counts over all of them.
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(long, env = "FERREPL_TENANT_WARM_POOL", value_name = "N")]
    pub tenant_warm_pool: Option<usize>,

    /// Memory all sessions and jobs of one tenant may use together (cgroup), e.g. 4G.
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(long, env = "FERREPL_TENANT_MEMORY", value_name = "BYTES")]
    pub tenant_memory: Option<String>,

    /// CPU weight of each tenant against the others (1-10000, cgroup), default 100.
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(long, env = "FERREPL_TENANT_CPU_WEIGHT", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10000), value_name = "N")]
    pub tenant_cpu_weight: u64,

    /// Size a tenant's workspace may grow to, e.g. 10G: past it, new cells and jobs are refused
    /// until files are deleted (checked every few seconds).
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(long, env = "FERREPL_TENANT_DISK", value_name = "BYTES")]
    pub tenant_disk: Option<String>,

    /// HTTP: TCP connections one tenant may hold once authenticated (default half of
    /// --http-max-connections); past it its requests get 429.
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(long, env = "FERREPL_TENANT_MAX_HTTP_CONNECTIONS", value_name = "N")]
    pub tenant_max_http_connections: Option<usize>,

    /// Uids (and gids) a root server runs sessions as: one for each tenant of each instance on
    /// the host, kept in --uid-table.
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(long, env = "FERREPL_TENANT_UIDS", default_value = "20000-59999", value_parser = crate::sandbox::uids::parse_range, value_name = "START-END")]
    pub tenant_uids: (u32, u32),

    /// The host's table of session uids a root server keeps: each (state directory, workspace,
    /// tenant) gets a uid of --tenant-uids that no other instance on the host has, kept whatever
    /// --resume says. It and its directory must be root's and writable by nobody else; the
    /// directory is made (0700) if missing. Ignored by an unprivileged server, which keeps none.
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_UID_TABLE",
        default_value = crate::sandbox::uids::DEFAULT_TABLE,
        value_name = "FILE"
    )]
    pub uid_table: PathBuf,

    /// With tenants, start even where isolation between them is degraded, which is refused
    /// otherwise: without private namespaces (--no-namespaces, or a kernel that refuses them)
    /// tenants' sessions share the host's /dev/shm and /proc (each other's processes and command
    /// lines), IPC and Unix sockets; without a uid of each tenant's own (an unprivileged server,
    /// root without namespaces) they may all run as one uid. One tenant alone only gets the
    /// status line's warning.
    #[arg(help_heading = "Tenants", hide_short_help = true)]
    #[arg(long, env = "FERREPL_ALLOW_DEGRADED_ISOLATION")]
    pub allow_degraded_isolation: bool,
}
