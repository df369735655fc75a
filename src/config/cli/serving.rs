//! The flags of serving over HTTP (heading "Serving (HTTP)"): bearer
//! tokens, the hosts and origins accepted, the metrics address, the drain,
//! and the transport's limits. Flattened into `Flags` as `flags.serving`.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::DefaultSession;

#[derive(Debug, Clone, clap::Args)]
pub struct ServingFlags {
    /// Bearer tokens for HTTP: one bare token, or "TOKEN TENANT" lines (tenants).
    ///
    /// Read from FILE instead of the command line, where every local process can see them; each
    /// tenant gets its own sessions, jobs and workspace (<workdir>/<tenant>). Reloaded on
    /// SIGHUP.
    #[arg(help_heading = "Serving (HTTP)")]
    #[arg(long, env = "FERREPL_AUTH_TOKEN_FILE", value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// Require "Authorization: Bearer TOKEN" on every HTTP request. Required when --http binds a
    /// non-loopback address.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_AUTH_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub auth_token: Option<String>,

    /// Extra HTTP Host values to accept (comma separated), beyond localhost, 127.0.0.1 and ::1.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long = "allow-host",
        env = "FERREPL_ALLOW_HOSTS",
        value_delimiter = ',',
        value_name = "HOST"
    )]
    pub allow_hosts: Vec<String>,

    /// Extra browser Origins to accept (comma separated, with scheme, e.g. https://app.example:443),
    /// beyond http://localhost, http://127.0.0.1 and http://[::1] on any port.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long = "allow-origin",
        env = "FERREPL_ALLOW_ORIGINS",
        value_delimiter = ',',
        value_name = "ORIGIN"
    )]
    pub allow_origins: Vec<String>,

    /// Serve /healthz, /readyz and /metrics on ADDR too, without auth or Host checks (for
    /// probes and Prometheus).
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(long, env = "FERREPL_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// HTTP mode: on SIGTERM, seconds running cells get to finish and the calls waiting for
    /// them to be answered before the exit; a result no call waits for holds nothing (a second
    /// SIGTERM exits at once).
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_DRAIN_SECONDS",
        default_value_t = 30.0,
        value_name = "SECONDS"
    )]
    pub drain_seconds: f64,

    /// Over HTTP, what an omitted `session` means: `shared` (one "default"
    /// session for every client of the server) or `per-client` (each MCP
    /// connection gets its own default session).
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_DEFAULT_SESSION",
        default_value = "shared",
        value_name = "MODE"
    )]
    pub default_session: DefaultSession,

    /// With `--default-session per-client`: seconds a client's sessions outlive it. They end
    /// once their last result is collected, or when this runs out (a running cell is stopped);
    /// a new session needing room ends the oldest first.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_CLIENT_GRACE",
        default_value_t = 600,
        value_name = "SECONDS"
    )]
    pub client_grace: u64,

    /// Seconds an HTTP MCP connection (an Mcp-Session-Id) may go without a request before it
    /// ends; a client then starts a new one.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_HTTP_SESSION_IDLE",
        default_value_t = 300,
        value_name = "SECONDS"
    )]
    pub http_session_idle: u64,

    /// MCP connections (transport sessions) one tenant may hold open over
    /// HTTP; an idle one ends 5 minutes after its last request.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_MAX_CONNECTIONS",
        default_value_t = 256,
        value_name = "N"
    )]
    pub max_connections: usize,

    /// HTTP: seconds a connection gets to send each request head (and 6 times as long for its
    /// body); then it is closed. Counted from its first byte, or from its opening.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_HTTP_HEADER_TIMEOUT",
        default_value_t = 10.0,
        value_name = "SECONDS"
    )]
    pub http_header_timeout: f64,

    /// HTTP: seconds a keep-alive connection may sit with no request in flight before it is
    /// closed (a stream or a call in progress is never cut, unless the client stops reading
    /// it for as long).
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_HTTP_IDLE_TIMEOUT",
        default_value_t = 120.0,
        value_name = "SECONDS"
    )]
    pub http_idle_timeout: f64,

    /// HTTP: TCP connections open at once, authenticated or not; past it new ones are closed
    /// (not --max-connections, which counts MCP sessions).
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_HTTP_MAX_CONNECTIONS",
        default_value_t = 4096,
        value_name = "N"
    )]
    pub http_max_connections: usize,

    /// HTTP: TCP connections one peer address may hold (default an eighth of
    /// --http-max-connections; 0: no cap). Peers named by --http-trusted-proxy are not capped:
    /// the addresses they forward are, request by request.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(long, env = "FERREPL_HTTP_MAX_CONNECTIONS_PER_PEER", value_name = "N")]
    pub http_max_connections_per_peer: Option<usize>,

    /// HTTP: proxies (CIDR or address, comma separated) whose X-Forwarded-For / Forwarded
    /// header names the client; the client's address is then the peer each share counts.
    /// Headers from any other peer are ignored.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_HTTP_TRUSTED_PROXY",
        value_delimiter = ',',
        value_name = "CIDR"
    )]
    pub http_trusted_proxy: Vec<String>,

    /// HTTP: request body bytes buffered at once over all connections (default 32 times
    /// --max-request-bytes); one principal (a tenant, or a peer without a token) may hold a
    /// quarter of it. Past it a request gets 503 with Retry-After.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(long, env = "FERREPL_HTTP_MAX_BUFFERED_BYTES", value_name = "BYTES")]
    pub http_max_buffered_bytes: Option<usize>,

    /// Largest request accepted, in bytes: an HTTP body or one stdio line.
    #[arg(help_heading = "Serving (HTTP)", hide_short_help = true)]
    #[arg(long, env = "FERREPL_MAX_REQUEST_BYTES", default_value_t = 8 * 1024 * 1024, value_name = "BYTES")]
    pub max_request_bytes: usize,
}
