//! Command line and environment configuration. Every flag has a FERREPL_* variable.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

pub use serving::ServingFlags;
pub use tenants::TenantFlags;

/// What `ferrepl SUBCOMMAND` does instead of serving MCP.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Add ferrepl to agent clients' MCP configuration (--client NAME).
    ///
    /// Clients: claude-code, claude-desktop, codex, cursor, vscode, gemini, all; everything else
    /// in their files is kept.
    Install(super::commands::InstallArgs),
    /// Remove ferrepl from agent clients' MCP configuration.
    ///
    /// A file, or a project's client directory, that held nothing else goes too.
    Uninstall(super::commands::UninstallArgs),
    /// Check this machine before connecting an agent (`ferrepl --python X doctor`).
    ///
    /// Interpreters, sandbox layers, package index reachability, configured clients, for the
    /// server flags given before it. Exit code 1 when something required is missing.
    Doctor(super::commands::DoctorOptions),
    /// Open a Jupyter console on a kernel session's kernel (run on the server's machine).
    ///
    /// What you run there is the agent's kernel's too: its next result says someone else ran
    /// cells, python_history lists them. --print prints the connection file for another client.
    /// The kernel holds the same key: attach only to sessions whose agent you would let type in
    /// your console, and prefer the console to a JupyterLab (which runs outputs as live HTML/JS).
    Attach(super::commands::AttachArgs),
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "ferrepl",
    version,
    about = "Persistent, fast, safe Python sessions for AI agents over MCP.",
    after_help = "Rarer flags (tenants, state, limits, output...): --help.",
    after_long_help = "Every flag can also be set by its FERREPL_* environment variable.",
    long_about = "ferrepl serves the Model Context Protocol (MCP). By default it speaks MCP on stdin/stdout, \
which is how agent clients (Claude Code, Codex, Cursor...) launch it; with --http it serves streamable HTTP at /mcp. \
Each named session is its own long-lived Python interpreter process. Logs go to stderr."
)]
pub struct Flags {
    /// Instead of serving: set ferrepl up in agent clients, or check this machine.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Working directory of the sessions (default: ferrepl's own).
    #[arg(long, env = "FERREPL_WORKDIR", value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// Python interpreter for sessions.
    ///
    /// Default: the nearest .venv/bin/python from the working directory upward, else python3 on
    /// PATH.
    #[arg(long, env = "FERREPL_PYTHON", value_name = "PATH")]
    pub python: Option<PathBuf>,

    /// Your virtual environment for sessions (made if missing).
    ///
    /// Made with uv when available, else python -m venv. Read-only to sessions: they run, and python_install
    /// installs into, a venv ferrepl keeps over it in its state directory.
    #[arg(long, env = "FERREPL_VENV", value_name = "DIR")]
    pub venv: Option<PathBuf>,

    /// Languages whose tools are exposed, comma separated: python, r.
    #[arg(
        long,
        env = "FERREPL_LANGUAGES",
        value_delimiter = ',',
        default_value = "python",
        value_name = "LANGS"
    )]
    pub languages: Vec<String>,

    /// R for R sessions (its `R` front end).
    ///
    /// Default: $R_HOME/bin/R, else R on PATH.
    #[arg(long = "r", env = "FERREPL_R", value_name = "PATH")]
    pub r: Option<PathBuf>,

    /// Tool groups to expose, comma separated: python, packages, more, shell, files, or all.
    ///
    /// The default suits agents that have their own
    /// shell and file tools (Claude Code, Codex, Cursor).
    #[arg(
        long,
        env = "FERREPL_TOOLS",
        value_delimiter = ',',
        default_value = "python,packages",
        value_name = "GROUPS"
    )]
    pub tools: Vec<String>,

    /// Serve streamable HTTP at /mcp on ADDR instead of stdio (a port alone means 127.0.0.1).
    #[arg(long, env = "FERREPL_HTTP", value_name = "ADDR", value_parser = listen_addr)]
    pub http: Option<SocketAddr>,

    /// The CRAN mirror r_install uses; its host joins the installers' allow-list.
    #[arg(hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_CRAN",
        default_value = "https://cloud.r-project.org",
        value_name = "URL"
    )]
    pub cran: String,

    /// Interpreters or virtual environments (comma separated) that python_sessions may name
    /// besides those inside the workspace; their installations become readable (venvs too,
    /// read-only).
    #[arg(hide_short_help = true)]
    #[arg(
        long = "allow-python",
        env = "FERREPL_ALLOW_PYTHON",
        value_delimiter = ',',
        value_name = "PATH"
    )]
    pub allow_python: Vec<PathBuf>,

    /// Installed Jupyter kernels (comma separated names) python_sessions may create sessions on
    /// (`"kernel": NAME`); their kernelspecs are read once at start from JUPYTER_PATH and the
    /// Jupyter data directories, never from where sessions write. Python and R kernels (an R
    /// kernel's sessions answer through the r_ tools: --languages python,r), or of another
    /// language (bash, julia, ...): those add the tool kernel_exec.
    #[arg(hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_KERNELS",
        value_delimiter = ',',
        value_name = "NAMES"
    )]
    pub kernels: Vec<String>,

    /// Add structuredContent to results and outputSchema to tools, for
    /// programs that read results as JSON. Off by default: Claude Code and
    /// VS Code then show the model only the JSON, not the text and images.
    #[arg(hide_short_help = true)]
    #[arg(long, env = "FERREPL_STRUCTURED_CONTENT")]
    pub structured_content: bool,

    /// OS confinement of sessions and shell jobs.
    ///
    /// workspace-write (write only the workspace and a per-session temporary directory), read-only (only the temporary directory), danger-full-access (no confinement; "off" is an alias), or inherit (Codex's policy per call, within the workspace-write ceiling of the other flags; "inherit-codex" is an alias).
    #[arg(help_heading = "Sandbox")]
    #[arg(
        long,
        env = "FERREPL_SANDBOX",
        value_enum,
        default_value = "workspace-write"
    )]
    pub sandbox: SandboxFlag,

    /// Network access of sessions, shell jobs and installers.
    ///
    /// packages (package installers reach only the package indexes, through
    /// ferrepl's allow-listing proxy; cells and shell jobs reach nothing), domains (as packages,
    /// and cells and shell jobs reach the --allow-domain hosts over HTTP(S) through a proxy of
    /// their own), off (nothing reaches anything) or on (everything reaches everything). Unix
    /// sockets always work.
    #[arg(help_heading = "Sandbox")]
    #[arg(long, env = "FERREPL_NETWORK", value_enum, default_value = "packages")]
    pub network: Network,

    /// Extra paths sessions and jobs may read (comma separated).
    ///
    /// E.g. a dataset outside the workspace or inside the (otherwise hidden) home directory.
    #[arg(help_heading = "Sandbox")]
    #[arg(
        long = "allow-read",
        env = "FERREPL_ALLOW_READ",
        value_delimiter = ',',
        value_name = "PATH"
    )]
    pub allow_read: Vec<PathBuf>,

    /// Extra paths sessions and jobs may write (comma separated).
    #[arg(help_heading = "Sandbox")]
    #[arg(
        long = "allow-write",
        env = "FERREPL_ALLOW_WRITE",
        value_delimiter = ',',
        value_name = "PATH"
    )]
    pub allow_write: Vec<PathBuf>,

    /// Extra hosts package installers may reach (comma separated), e.g. a private index.
    ///
    /// PyPI and the index URLs of your PIP_INDEX_URL, UV_INDEX_URL, pip.conf and uv.toml are
    /// allowed already. Cells and shell jobs never get these hosts; theirs are --allow-domain's.
    #[arg(help_heading = "Sandbox")]
    #[arg(
        long = "allow-host-egress",
        env = "FERREPL_ALLOW_HOST_EGRESS",
        value_delimiter = ',',
        value_name = "HOST"
    )]
    pub allow_host_egress: Vec<String>,

    /// Hosts cells and shell jobs may reach with --network domains (comma separated).
    ///
    /// example.com, *.example.com (subdomains only), **.example.com (the domain and its
    /// subdomains), an IP exactly; :PORT for a port other than 80 and 443. Repeatable.
    /// Over HTTP(S) through ferrepl's proxy (sessions get HTTP_PROXY and HTTPS_PROXY); direct
    /// connections stay refused. Unlike --allow-host-egress, which adds hosts for package
    /// installers only, these are for code the agent runs; installers do not get them.
    #[arg(help_heading = "Sandbox")]
    #[arg(
        long = "allow-domain",
        env = "FERREPL_ALLOW_DOMAIN",
        value_delimiter = ',',
        value_name = "PATTERN"
    )]
    pub allow_domain: Vec<String>,

    /// Memory limit of each session and shell job, e.g. 2G, 512M; "off" for none.
    ///
    /// A cgroup where one can be made, else a watch of its process tree's RSS.
    #[arg(help_heading = "Sandbox")]
    #[arg(
        long,
        env = "FERREPL_MEMORY_LIMIT",
        default_value = "4G",
        value_name = "SIZE"
    )]
    pub memory_limit: String,

    /// Also protect this place from every sandboxed write, existing or not (repeatable): a bare
    /// name at any depth of the workspace, a relative path at that place, or an absolute path.
    /// Built in: .git, agent clients' and editors' settings, R's start-up files, .venv...
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(
        long = "protect",
        env = "FERREPL_PROTECT",
        value_delimiter = ',',
        value_name = "PATH"
    )]
    pub protect: Vec<String>,

    /// Let sessions write a protected name after all (repeatable), e.g. .git for an agent meant
    /// to commit; 'all' frees every one.
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(
        long = "allow-write-protected",
        env = "FERREPL_ALLOW_WRITE_PROTECTED",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub allow_write_protected: Vec<String>,

    /// Host devices added to the sessions' private /dev (comma separated), e.g. /dev/nvidia0.
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(
        long = "allow-device",
        env = "FERREPL_ALLOW_DEVICE",
        value_delimiter = ',',
        value_name = "PATH"
    )]
    pub allow_device: Vec<PathBuf>,

    /// Environment variables of the server passed on to sessions and jobs (comma separated),
    /// beyond PATH, LANG, LC_*, TERM, TZ and a few other harmless ones. Nothing else is inherited.
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(
        long = "pass-env",
        env = "FERREPL_PASS_ENV",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub pass_env: Vec<String>,

    /// Let installers (and with --network domains, cells) reach allowed hosts whose names
    /// resolve to private or loopback addresses (an internal package mirror); refused by default.
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(long, env = "FERREPL_EGRESS_ALLOW_PRIVATE")]
    pub egress_allow_private: bool,

    /// Let installs build source distributions (their build scripts run with the installer's
    /// network access); by default installs take wheels only.
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(long, env = "FERREPL_ALLOW_SOURCE_BUILDS")]
    pub allow_source_builds: bool,

    /// Do not use private namespaces (mount, PID, network...) even where the kernel allows them;
    /// Landlock, seccomp and the rest still apply. For debugging, or hosts where they misbehave.
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(long, env = "FERREPL_NO_NAMESPACES")]
    pub no_namespaces: bool,

    /// Refuse to start unless every requested protection is available on this kernel.
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(long, env = "FERREPL_SANDBOX_REQUIRE")]
    pub sandbox_require: bool,

    /// Most processes in one session's or job's process tree (a fork bomb is stopped there), and
    /// the RLIMIT_NPROC of its uid, which counts threads too: under host root that bound is per
    /// tenant (all its sessions and jobs run as its uid; alone in a user's workspace, everything
    /// that user runs), where sessions get a user namespace of their own (an unprivileged server,
    /// root of a pod's namespace) per session.
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_MAX_PROCESSES",
        default_value_t = 512,
        value_name = "N"
    )]
    pub max_processes: u64,

    /// Largest file a session or job may write (RLIMIT_FSIZE), e.g. 10G; "off" for none.
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_MAX_FILE_SIZE",
        default_value = "16G",
        value_name = "SIZE"
    )]
    pub max_file_size: String,

    /// Most open files per process (RLIMIT_NOFILE).
    #[arg(help_heading = "Sandbox", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_MAX_OPEN_FILES",
        default_value_t = 4096,
        value_name = "N"
    )]
    pub max_open_files: u64,

    /// HTTP serving: tokens, hosts, limits (cli/serving.rs).
    #[command(flatten)]
    pub serving: ServingFlags,

    /// Tenants: shares, uids, isolation (cli/tenants.rs).
    #[command(flatten)]
    pub tenants: TenantFlags,

    /// Serve a live, read-only view of the sessions to a browser on ADDR (port 0 picks one).
    ///
    /// E.g. 127.0.0.1:8765, its own listener. The URL is printed on stderr.
    #[arg(help_heading = "Viewer")]
    #[arg(long, env = "FERREPL_VIEWER", value_name = "ADDR")]
    pub viewer: Option<SocketAddr>,

    /// The viewer's tokens (the format of --auth-token-file: one bare token, or "TOKEN TENANT"
    /// lines, each token at least 16 characters); each tenant's viewer sees only its own
    /// sessions. Needed off loopback and with tenants. Reloaded on SIGHUP.
    #[arg(help_heading = "Viewer", hide_short_help = true)]
    #[arg(long, env = "FERREPL_VIEWER_TOKENS", value_name = "FILE")]
    pub viewer_tokens: Option<PathBuf>,

    /// More Host names the viewer answers to (comma separated, NAME or NAME:PORT), e.g. the
    /// name of a proxy in front of it; https://NAME means the browser reaches it over TLS (its
    /// login cookie is then Secure). The first is the URL printed.
    #[arg(help_heading = "Viewer", hide_short_help = true)]
    #[arg(
        long = "viewer-allow-host",
        env = "FERREPL_VIEWER_ALLOW_HOSTS",
        value_delimiter = ',',
        value_name = "HOST"
    )]
    pub viewer_allow_hosts: Vec<String>,

    /// Browsers the viewer serves live updates to at once.
    #[arg(help_heading = "Viewer", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_VIEWER_MAX_CLIENTS",
        value_name = "N",
        default_value_t = 16
    )]
    pub viewer_max_clients: usize,

    /// Upstream MCP servers sessions' code may call (`import ferrepl`), from a JSON file.
    ///
    /// The mcpServers format, with optional allowTools, timeoutSeconds and tenants per server.
    /// Read at start and on SIGHUP; never visible to sessions.
    #[arg(help_heading = "Code tools (upstream MCP servers)")]
    #[arg(long, env = "FERREPL_MCP_SERVERS", value_name = "FILE")]
    pub mcp_servers: Option<PathBuf>,

    /// Seconds a tool call from code may take, unless its server sets timeoutSeconds.
    #[arg(
        help_heading = "Code tools (upstream MCP servers)",
        hide_short_help = true
    )]
    #[arg(
        long,
        env = "FERREPL_MCP_CALL_TIMEOUT",
        default_value_t = 60.0,
        value_name = "SECONDS"
    )]
    pub mcp_call_timeout: f64,

    /// Bytes of one tool result passed to a session's code (a larger one is cut, with a marker).
    #[arg(
        help_heading = "Code tools (upstream MCP servers)",
        hide_short_help = true
    )]
    #[arg(
        long,
        env = "FERREPL_MCP_MAX_RESULT_BYTES",
        default_value_t = 1_000_000,
        value_name = "BYTES"
    )]
    pub mcp_max_result_bytes: usize,

    /// Tool calls one session may have in flight at once; more wait for a slot.
    #[arg(
        help_heading = "Code tools (upstream MCP servers)",
        hide_short_help = true
    )]
    #[arg(
        long,
        env = "FERREPL_MCP_MAX_IN_FLIGHT",
        default_value_t = 16,
        value_name = "N"
    )]
    pub mcp_max_in_flight: usize,

    /// Tool calls one cell may make; more are refused.
    #[arg(
        help_heading = "Code tools (upstream MCP servers)",
        hide_short_help = true
    )]
    #[arg(
        long,
        env = "FERREPL_MCP_MAX_CELL_CALLS",
        default_value_t = 1000,
        value_name = "N"
    )]
    pub mcp_max_cell_calls: u64,

    /// Upstream servers (processes or HTTP connections) each tenant may keep; a call to one
    /// more waits for one with no call in flight.
    #[arg(
        help_heading = "Code tools (upstream MCP servers)",
        hide_short_help = true
    )]
    #[arg(
        long,
        env = "FERREPL_MCP_MAX_SERVERS",
        default_value_t = 8,
        value_name = "N"
    )]
    pub mcp_max_servers: usize,

    /// Seconds an unused upstream server is kept before it is ended.
    #[arg(
        help_heading = "Code tools (upstream MCP servers)",
        hide_short_help = true
    )]
    #[arg(
        long,
        env = "FERREPL_MCP_IDLE",
        default_value_t = 600.0,
        value_name = "SECONDS"
    )]
    pub mcp_idle: f64,

    /// Where sessions are kept across restarts (one SQLite file per workspace; private to
    /// the user). Default: $XDG_STATE_HOME/ferrepl, else ~/.local/state/ferrepl.
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(long, env = "FERREPL_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Python interpreters kept started and sandboxed ahead of need, so a new session or a
    /// reset takes one at once (each holds an idle interpreter's memory); 0 starts each on
    /// demand. At most 64.
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_WARM_POOL",
        default_value_t = 1,
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(0..=64)
    )]
    pub warm_pool: u16,

    /// Seconds a session may stay idle before it is ended (0: never).
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_SESSION_TTL",
        default_value_t = 7200.0,
        value_name = "SECONDS"
    )]
    pub session_ttl: f64,

    /// Seconds a new interpreter may take to start before the call fails.
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_START_TIMEOUT",
        default_value_t = 30.0,
        value_name = "SECONDS"
    )]
    pub start_timeout: f64,

    /// Keep sessions across restarts, dormant until an agent confirms a rebuild that re-runs their cells (on), or not (off).
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(long, env = "FERREPL_RESUME", default_value = "on", value_parser = ["on", "off"])]
    pub resume: String,

    /// Most cells one rebuild of a session re-runs.
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_RESUME_MAX_CELLS",
        default_value_t = 200,
        value_name = "N"
    )]
    pub resume_max_cells: usize,

    /// Longest time one rebuild of a session may take.
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_RESUME_MAX_SECONDS",
        default_value_t = 120.0,
        value_name = "SECONDS"
    )]
    pub resume_max_seconds: f64,

    /// Cells kept per stored session (the oldest beyond are dropped).
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_STATE_MAX_CELLS",
        default_value_t = 1000,
        value_name = "N"
    )]
    pub state_max_cells: usize,

    /// Size bound of a workspace's session store, in MiB: the least recently used
    /// sessions are removed first.
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_STATE_MAX_MB",
        default_value_t = 512,
        value_name = "MIB"
    )]
    pub state_max_mb: u64,

    /// Days a stored session that is not used is kept.
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_STATE_KEEP_DAYS",
        default_value_t = 30.0,
        value_name = "DAYS"
    )]
    pub state_keep_days: f64,

    /// Frozen copies (fork checkpoints) of earlier states kept per Python session, so that
    /// going back to one (python_exec parent) re-runs nothing; 0 turns them off.
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_CHECKPOINTS",
        default_value_t = 4,
        value_name = "N"
    )]
    pub checkpoints: usize,

    /// Only cells that ran at least this long get a checkpoint (quicker ones are re-run).
    #[arg(help_heading = "Sessions and saved state", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_CHECKPOINT_MIN_MS",
        default_value_t = 100.0,
        value_name = "MS"
    )]
    pub checkpoint_min_ms: f64,

    /// Most sessions that may exist at once (over all tenants).
    #[arg(help_heading = "Limits", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_MAX_SESSIONS",
        default_value_t = 32,
        value_name = "N"
    )]
    pub max_sessions: usize,

    /// Shell and install jobs that may run at once, over all tenants (each
    /// tenant may run as many).
    #[arg(help_heading = "Limits", hide_short_help = true)]
    #[arg(long, env = "FERREPL_MAX_JOBS", default_value_t = 16, value_name = "N")]
    pub max_jobs: usize,

    /// Seconds a finished shell job (and its output) is kept (at most 100 are kept).
    #[arg(help_heading = "Limits", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_JOB_TTL",
        default_value_t = 3600.0,
        value_name = "SECONDS"
    )]
    pub job_ttl: f64,

    /// Seconds a python_exec / python_wait call waits for a cell when wait_s is not given.
    #[arg(help_heading = "Limits", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_DEFAULT_WAIT",
        default_value_t = 30.0,
        value_name = "SECONDS"
    )]
    pub default_wait: f64,

    /// Upper bound on any wait_s an agent asks for. Below the 60 s request
    /// timeout of the TypeScript SDK (Claude Code, Cursor, VS Code), which
    /// cancels the call; raise it only for clients with longer timeouts.
    #[arg(help_heading = "Limits", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_MAX_WAIT",
        default_value_t = 50.0,
        value_name = "SECONDS"
    )]
    pub max_wait: f64,

    /// Time limit of one cell in seconds: past it the cell is interrupted (then killed if it
    /// ignores interrupts). Off by default.
    #[arg(help_heading = "Limits", hide_short_help = true)]
    #[arg(long, env = "FERREPL_MAX_CELL_SECONDS", value_name = "SECONDS")]
    pub max_cell_seconds: Option<f64>,

    /// Seconds each interrupt step waits before escalating (second SIGINT, then kill).
    #[arg(help_heading = "Limits", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_INTERRUPT_GRACE",
        default_value_t = 2.0,
        value_name = "SECONDS"
    )]
    pub interrupt_grace: f64,

    /// Bytes of a result's output kept from its start (the middle of larger output is omitted).
    #[arg(help_heading = "Output", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_OUTPUT_HEAD_BYTES",
        default_value_t = 10_000,
        value_name = "BYTES"
    )]
    pub output_head_bytes: usize,

    /// Bytes of a result's output kept from its end.
    #[arg(help_heading = "Output", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_OUTPUT_TAIL_BYTES",
        default_value_t = 10_000,
        value_name = "BYTES"
    )]
    pub output_tail_bytes: usize,

    /// Full output kept per cell for python_output (beyond 64 KiB it spills to a file in the
    /// temporary directory); bytes past this are counted but not kept.
    #[arg(help_heading = "Output", hide_short_help = true)]
    #[arg(long, env = "FERREPL_OUTPUT_LOG_BYTES", default_value_t = 64 * 1024 * 1024, value_name = "BYTES")]
    pub output_log_bytes: u64,

    /// How many recent cells per session keep their full output for python_output.
    #[arg(help_heading = "Output", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_OUTPUT_KEEP_CELLS",
        default_value_t = 50,
        value_name = "N"
    )]
    pub output_keep_cells: usize,

    /// Longest repr of a cell's value, in characters.
    #[arg(help_heading = "Output", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_MAX_VALUE_CHARS",
        default_value_t = 20_000,
        value_name = "CHARS"
    )]
    pub max_value_chars: usize,

    /// Images returned in one result; more are listed but not attached.
    #[arg(help_heading = "Output", hide_short_help = true)]
    #[arg(
        long,
        env = "FERREPL_MAX_IMAGES",
        default_value_t = 8,
        value_name = "N"
    )]
    pub max_images: usize,

    /// Largest image attached to a result, in bytes.
    #[arg(help_heading = "Output", hide_short_help = true)]
    #[arg(long, env = "FERREPL_MAX_IMAGE_BYTES", default_value_t = 4 * 1024 * 1024, value_name = "BYTES")]
    pub max_image_bytes: u64,

    /// Python packages every session of the workspace has, installed once (comma separated).
    ///
    /// Installed per workspace (and tenant) into the venv ferrepl keeps for it, in the
    /// background from the start, through the same proxy and wheels-only rules as
    /// python_install; the first session waits for them.
    #[arg(help_heading = "Ready-made environments")]
    #[arg(
        long,
        env = "FERREPL_PREINSTALL",
        value_delimiter = ',',
        value_name = "SPEC"
    )]
    pub preinstall: Vec<String>,

    /// A requirements file (relative to --workdir) whose packages are preinstalled like
    /// --preinstall's: requirement lines, comments and blank lines only; installer options
    /// are refused.
    #[arg(hide_short_help = true)]
    #[arg(help_heading = "Ready-made environments")]
    #[arg(long, env = "FERREPL_REQUIREMENTS", value_name = "FILE")]
    pub requirements: Option<PathBuf>,

    /// Python modules imported in every interpreter before its first cell (warm-pool ones
    /// ahead of need), so the first import in a session costs nothing.
    #[arg(hide_short_help = true)]
    #[arg(help_heading = "Ready-made environments")]
    #[arg(
        long,
        env = "FERREPL_PREIMPORT",
        value_delimiter = ',',
        value_name = "MODULE"
    )]
    pub preimport: Vec<String>,

    /// Log filter for stderr (error, warn, info, debug, trace, or a tracing filter).
    ///
    /// Below debug, the MCP library's own lines (rmcp) are kept to errors unless the filter
    /// names it (e.g. info,rmcp=info).
    #[arg(help_heading = "Logging")]
    #[arg(
        long = "log-level",
        alias = "log",
        env = "FERREPL_LOG_LEVEL",
        default_value = "info",
        value_name = "FILTER"
    )]
    pub log_level: String,

    /// Log line format on stderr: text, or json for log collectors.
    #[arg(help_heading = "Logging", hide_short_help = true)]
    #[arg(long, env = "FERREPL_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// The tracing filter for `--log-level`: as given, with the MCP library's
/// own lines (which dump whole messages at INFO and WARN, e.g. every error
/// answer) kept to errors unless the operator names it or asks for debug or
/// trace, so that the default log is ferrepl's own words.
pub fn log_directives(level: &str) -> String {
    let level = level.trim();
    let verbose = level
        .split(',')
        .map(str::trim)
        .any(|d| d.eq_ignore_ascii_case("debug") || d.eq_ignore_ascii_case("trace"));
    if level.contains("rmcp") || verbose {
        return level.to_string();
    }
    match level {
        "" => "rmcp=error".to_string(),
        _ => format!("{level},rmcp=error"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub use crate::sandbox::Network;

/// The values of --sandbox: the names Codex users know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SandboxFlag {
    ReadOnly,
    WorkspaceWrite,
    #[value(alias = "off")]
    DangerFullAccess,
    /// The client's policy per call (Codex's sandbox metadata), narrowing
    /// workspace-write with the other flags.
    #[value(alias = "inherit-codex")]
    Inherit,
}

/// What an omitted `session` argument names (see `--default-session`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DefaultSession {
    Shared,
    PerClient,
}

/// HOST:PORT, or a port alone for 127.0.0.1 (`--http 8000`): the error
/// names both forms.
fn listen_addr(value: &str) -> Result<SocketAddr, String> {
    let value = value.trim();
    if let Ok(port) = value.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    value.parse().map_err(|_| {
        format!("'{value}' is not an address to listen on: give HOST:PORT (127.0.0.1:8000, [::1]:8000, 0.0.0.0:8000) or a port alone (8000, for 127.0.0.1)")
    })
}

mod serving;
mod tenants;

#[cfg(test)]
mod tests;
