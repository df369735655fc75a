//! ferrepl: persistent Python sessions for AI agents over MCP.

mod config;
mod egress;
mod files;
mod installer;
mod jobs;
mod mcp;
mod sandbox;
mod session;
mod state;
mod worker;

use std::process::ExitCode;

use anyhow::Context;
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use config::{Config, seconds};
use session::{Limits, SessionManager};
use worker::LaunchSpec;

fn main() -> ExitCode {
    // Launcher modes run before anything else (single-threaded, no runtime).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(sandbox::launcher::LAUNCH_ARG) {
        sandbox::launcher::run(&args[2..]);
    }
    // Sessions run as the same user: keep them out of this process's memory
    // and /proc/<pid>/environ (the auth token, the operator's environment).
    // SAFETY: prctl(PR_SET_DUMPABLE) has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    let matches = <Config as clap::CommandFactory>::command().get_matches();
    let mut cfg = match <Config as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let token_on_command_line =
        matches.value_source("auth_token") == Some(clap::parser::ValueSource::CommandLine);
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferrepl: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if token_on_command_line {
        tracing::warn!(
            "--auth-token on the command line is visible to every local process (ps, /proc); use --auth-token-file FILE or FERREPL_AUTH_TOKEN"
        );
    }
    if let Some(file) = &cfg.auth_token_file {
        match std::fs::read_to_string(file) {
            Ok(text) => cfg.auth_token = text.lines().next().map(|l| l.trim().to_string()),
            Err(e) => {
                tracing::error!("--auth-token-file {}: {e}", file.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let code = match runtime.block_on(run(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    };
    // A blocking read of stdin (when it is not a pipe) cannot be cancelled
    // and would hold the runtime's drop until the client writes or closes
    // it; everything that matters has been cleaned up by now.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    code
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    let workdir = match &cfg.workdir {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let workdir = workdir
        .canonicalize()
        .with_context(|| format!("--workdir {} does not exist", workdir.display()))?;
    let (mut python, mut source) = worker::python::resolve(cfg.python.as_deref(), &workdir);
    // What sessions can write: nothing there is trusted or run by the
    // server outside the sandbox.
    let mut writable = sandbox::paths::Writable(vec![workdir.clone()]);
    let abs = |p: &std::path::PathBuf| sandbox::paths::normalize(p, &workdir);
    writable.0.extend(cfg.allow_write.iter().map(abs));
    writable.0.extend(
        cfg.allow_python
            .iter()
            .map(abs)
            .filter(|p| p.join("pyvenv.cfg").is_file()),
    );
    let mut venvs = Vec::new();
    if let Some(venv) = &cfg.venv {
        venvs.push(abs(venv));
    } else if source == worker::python::PythonSource::Venv
        && let Some(dir) = python.parent().and_then(std::path::Path::parent)
    {
        venvs.push(dir.to_path_buf());
    }
    writable.0.extend(venvs.iter().cloned());
    // The system interpreter on PATH is the base for creating venvs and for
    // finding the installation sessions need to read.
    let path_python = writable
        .find_on_path("python3")
        .and_then(|p| sandbox::paths::real_executable(&p));
    if !writable.contains(&python)
        && let Some(real) = sandbox::paths::real_executable(&python)
    {
        // A pyenv/asdf shim would pick its version per session from files
        // the agent can write; sessions run the binary it selects now.
        python = real;
    }
    let base_python = if writable.contains(&python) {
        path_python.clone().unwrap_or_else(|| python.clone())
    } else {
        python.clone()
    };
    if let Some(dir) = cfg.venv.as_ref().map(abs) {
        python = worker::python::ensure_venv(&dir, &base_python, &writable)?;
        source = worker::python::PythonSource::VenvFlag;
    }
    tracing::info!(python = %python.display(), ?source, workdir = %workdir.display(), "ferrepl {} starting", env!("CARGO_PKG_VERSION"));

    // Spilled output, the sessions' temporary homes; private, removed at exit.
    let state_dir = state::StateDir::create()?;
    let log_dir = state_dir.path().to_path_buf();
    let mut sandbox_cfg = sandbox_settings(
        &cfg,
        &workdir,
        &state_dir,
        (&python, &base_python),
        &venvs,
        &writable,
    )?;
    let installer = installer_settings(&cfg, &mut sandbox_cfg, &state_dir, &writable)?;
    if sandbox_cfg.enabled() {
        tracing::info!("sandbox: {}", sandbox_cfg.active);
    } else {
        tracing::warn!("sandbox: {}", sandbox_cfg.active);
    }
    let sandbox_cfg = std::sync::Arc::new(sandbox_cfg);
    let spec = LaunchSpec {
        python,
        workdir,
        env: Vec::new(),
        output_head_bytes: cfg.output_head_bytes,
        output_tail_bytes: cfg.output_tail_bytes,
        max_value_chars: cfg.max_value_chars,
        max_image_bytes: cfg.max_image_bytes,
        log_dir: log_dir.clone(),
        cell_log_bytes: cfg.output_log_bytes,
        sandbox: Some(sandbox_cfg.clone()),
    };
    let limits = Limits {
        default_wait: seconds(cfg.default_wait, "--default-wait")?,
        max_wait: seconds(cfg.max_wait, "--max-wait")?,
        start_timeout: seconds(cfg.start_timeout, "--start-timeout")?,
        max_sessions: cfg.max_sessions.max(1),
        inspect_timeout: std::time::Duration::from_secs(10),
        crash_grace: std::time::Duration::from_millis(500),
        interrupt_grace: seconds(cfg.interrupt_grace, "--interrupt-grace")?,
        max_images: cfg.max_images,
        keep_cells: cfg.output_keep_cells.max(1),
        session_ttl: match cfg.session_ttl {
            s if s > 0.0 => Some(seconds(s, "--session-ttl")?),
            _ => None,
        },
        cell_log_bytes: cfg.output_log_bytes,
        max_cell: match cfg.max_cell_seconds {
            Some(s) if s > 0.0 => Some(seconds(s, "--max-cell-seconds")?),
            _ => None,
        },
    };
    let jobs = jobs::JobManager::new(jobs::JobConfig {
        workdir: spec.workdir.clone(),
        output_head_bytes: cfg.output_head_bytes,
        output_tail_bytes: cfg.output_tail_bytes,
        log_dir: log_dir.clone(),
        log_bytes: cfg.output_log_bytes,
        max_running: cfg.max_jobs.max(1),
        keep_finished: seconds(cfg.job_ttl, "--job-ttl")?,
        max_kept: 100,
        drain_grace: std::time::Duration::from_millis(500),
        sandbox: Some(sandbox_cfg.clone()),
        installer: std::sync::Arc::new(installer),
    });
    let workspace = files::Workspace::new(&spec.workdir)
        .with_context(|| format!("workspace root {}", spec.workdir.display()))?
        .read_only(cfg.sandbox == sandbox::SandboxMode::ReadOnly);
    let groups =
        mcp::groups::ToolGroups::parse(&cfg.tools).map_err(|e| anyhow::anyhow!("--tools: {e}"))?;
    let manager = SessionManager::new(spec, limits);
    manager.warm_up();
    manager.spawn_reaper();
    manager.spawn_resource_watch();

    let shutdown = CancellationToken::new();
    spawn_signal_watch(shutdown.clone());
    {
        // End the workers as soon as shutdown starts, so calls in flight
        // finish at once instead of holding the transport open.
        let (manager, jobs, shutdown) = (manager.clone(), jobs.clone(), shutdown.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            jobs.shutdown();
            manager.shutdown().await;
        });
    }
    let result = match cfg.http {
        Some(addr) => {
            let app = (manager.clone(), jobs.clone(), workspace, groups);
            mcp::http::serve(addr, &cfg, app, shutdown.clone()).await
        }
        None => {
            let app = (manager.clone(), jobs.clone(), workspace, groups);
            serve_stdio(app, cfg.max_request_bytes, shutdown.clone()).await
        }
    };
    jobs.shutdown();
    manager.shutdown().await;
    drop(state_dir);
    tracing::info!("ferrepl stopped");
    result
}

/// The sandbox fixed from the operator's flags and environment: what every
/// session and job may read, write and reach, and which interpreters
/// python_sessions may name. Then probed.
fn sandbox_settings(
    cfg: &Config,
    workdir: &std::path::Path,
    state_dir: &state::StateDir,
    (python, base_python): (&std::path::Path, &std::path::Path),
    venvs: &[std::path::PathBuf],
    writable: &sandbox::paths::Writable,
) -> anyhow::Result<sandbox::SandboxConfig> {
    use sandbox::paths::{interpreter_dirs, normalize};
    let abs = |p: &std::path::PathBuf| normalize(p, workdir);
    let outside = |p: &std::path::Path| !p.starts_with(workdir);
    let mut read = interpreter_dirs(python, writable);
    read.extend(interpreter_dirs(base_python, writable));
    let mut write: Vec<std::path::PathBuf> = venvs.iter().filter(|v| outside(v)).cloned().collect();
    let mut allowed_python = vec![python.to_path_buf(), base_python.to_path_buf()];
    allowed_python.extend(venvs.iter().cloned());
    for p in cfg.allow_python.iter().map(abs) {
        if p.join("pyvenv.cfg").is_file() {
            // A venv: writable (installs), never run by the server; its base
            // must be readable already (--python, or another --allow-python).
            if outside(&p) {
                read.push(p.clone());
                write.push(p.clone());
            }
        } else if p.is_dir() {
            read.extend(interpreter_dirs(&p.join("bin").join("python3"), writable));
        } else {
            read.extend(interpreter_dirs(&p, writable));
        }
        allowed_python.push(p);
    }
    if let Some(uv) = writable.find_on_path("uv")
        && let Ok(real) = uv.canonicalize()
        && let Some(dir) = real.parent()
    {
        read.push(dir.to_path_buf());
    }
    read.extend(cfg.allow_read.iter().map(abs));
    write.extend(cfg.allow_write.iter().map(abs));
    read.sort();
    read.dedup();
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .filter(|h| h.is_absolute() && h != std::path::Path::new("/"));
    let hidden = sandbox::paths::hidden_places(home.as_deref(), state_dir.root());
    if cfg.sandbox != sandbox::SandboxMode::Off
        && let Some(h) = hidden
            .iter()
            .find(|h| h.starts_with(workdir) && *h != workdir)
    {
        anyhow::bail!(
            "the workspace {} contains {}, which sessions must not see (a home, a temporary or runtime directory, or ferrepl's own state); pick a narrower --workdir, or set XDG_RUNTIME_DIR/TMPDIR elsewhere",
            workdir.display(),
            h.display()
        );
    }
    for p in cfg.allow_read.iter().chain(&cfg.allow_write).map(abs) {
        if p.starts_with(workdir) {
            anyhow::bail!(
                "--allow-read/--allow-write {} is inside the workspace, which sessions can already use (and could swap for a symlink); give paths outside it",
                p.display()
            );
        }
    }
    let mut sandbox_cfg = sandbox::SandboxConfig {
        mode: cfg.sandbox,
        network: cfg.network == config::Network::On,
        egress: None,
        egress_hosts: Vec::new(),
        require: cfg.sandbox_require,
        memory_limit: config::parse_bytes(&cfg.memory_limit)?,
        max_processes: cfg.max_processes,
        max_file_bytes: config::parse_bytes(&cfg.max_file_size)?.unwrap_or(u64::MAX),
        max_open_files: cfg.max_open_files,
        workspace: workdir.to_path_buf(),
        state: state_dir.path().to_path_buf(),
        system: sandbox::paths::readable_except(&hidden),
        hidden,
        read,
        write,
        devices: cfg.allow_device.iter().map(abs).collect(),
        allowed_python,
        namespaces: !cfg.no_namespaces,
        env: sandbox::env::inherited(&cfg.pass_env),
        active: String::new(),
        cgroups: None,
    };
    if sandbox_cfg.enabled() {
        sandbox_cfg.cgroups = sandbox::cgroup::CgroupRoot::detect();
    }
    sandbox::probe(&mut sandbox_cfg)?;
    if sandbox_cfg.enabled() {
        warn_unreadable_interpreter(&sandbox_cfg, python);
    }
    Ok(sandbox_cfg)
}

/// The operator's installer settings, and with `--network packages` the
/// egress proxy installers reach the indexes through (started here).
fn installer_settings(
    cfg: &Config,
    sandbox_cfg: &mut sandbox::SandboxConfig,
    state_dir: &state::StateDir,
    writable: &sandbox::paths::Writable,
) -> anyhow::Result<installer::InstallerSettings> {
    let mut mode = cfg.network;
    if mode == config::Network::Packages && !sandbox_cfg.enabled() {
        // Without a sandbox nothing is confined: installers reach the network as
        // everything else does.
        mode = config::Network::On;
    }
    if mode == config::Network::Packages && !sandbox_cfg.namespaces {
        tracing::warn!(
            "--network packages needs private network namespaces, which are not available: package installers get no network (use --network on, or install local wheels)"
        );
        mode = config::Network::Off;
    }
    let settings = installer::InstallerSettings::discover(
        mode,
        &cfg.allow_host_egress,
        cfg.allow_source_builds,
        writable,
    );
    if mode == config::Network::Packages {
        let socket = state_dir.path().join("egress.sock");
        let listener = tokio::net::UnixListener::bind(&socket)
            .with_context(|| format!("cannot listen on {}", socket.display()))?;
        let proxy = std::sync::Arc::new(egress::EgressConfig::new(settings.allowed_hosts.clone()));
        tracing::info!("package installers may reach: {}", proxy.describe());
        tokio::spawn(egress::serve(listener, proxy, CancellationToken::new()));
        sandbox_cfg.egress = Some(sandbox::EgressRelay {
            port: installer::RELAY_PORT,
            socket: socket.display().to_string(),
        });
        sandbox_cfg.egress_hosts = settings.allowed_hosts.clone();
        sandbox_cfg.active.push_str(&format!(
            "; package installers reach only {} (HTTPS/HTTP through ferrepl's proxy)",
            settings.allowed_hosts.join(", ")
        ));
    }
    Ok(settings)
}

/// An interpreter inside the workspace (a `.venv`) whose real binary lies in
/// a place sessions may not read cannot start in the sandbox; nothing is
/// widened for it (the agent can rewrite it), but the operator is told how.
fn warn_unreadable_interpreter(cfg: &sandbox::SandboxConfig, python: &std::path::Path) {
    if !python.starts_with(&cfg.workspace) {
        return;
    }
    let Ok(real) = python.canonicalize() else {
        return;
    };
    let readable = real.starts_with(&cfg.workspace)
        || cfg.read.iter().any(|r| real.starts_with(r))
        || !cfg.hidden.iter().any(|h| real.starts_with(h));
    if !readable {
        tracing::warn!(
            "the interpreter {} is {}, which sessions may not read (hidden place); start ferrepl with --allow-python {} or --python PATH",
            python.display(),
            real.display(),
            real.display()
        );
    }
}

async fn serve_stdio(
    app: mcp::server::AppParts,
    max_request_bytes: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (manager, jobs, files, groups) = app;
    let server = mcp::server::FerreplServer::new(manager, jobs, files, groups);
    // Stdin's end cancels `shutdown`: rmcp drains in-flight calls for a while
    // after EOF, and ending the workers at once makes those calls finish
    // (crashed) and the process exit promptly.
    let stdin_closed = CancellationToken::new();
    let transport = mcp::stdio::StdioTransport::start(max_request_bytes, stdin_closed.clone());
    {
        let (stdin_closed, shutdown) = (stdin_closed.clone(), shutdown.clone());
        tokio::spawn(async move {
            stdin_closed.cancelled().await;
            shutdown.cancel();
        });
    }
    let running = tokio::select! {
        r = server.serve(transport) => r.context("MCP handshake on stdio failed")?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    let waiting = running.waiting();
    tokio::pin!(waiting);
    tokio::select! {
        r = &mut waiting => { r.context("stdio service failed")?; }
        _ = shutdown.cancelled() => {
            // After stdin's end, calls in flight end quickly once the workers
            // are gone; let their answers out before exiting. (After a
            // signal the client is not listening.)
            if stdin_closed.is_cancelled() {
                let _ = tokio::time::timeout(STDIO_DRAIN, &mut waiting).await;
            }
        }
    }
    Ok(())
}

/// How long answers to calls in flight may delay the exit after shutdown.
const STDIO_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

fn spawn_signal_watch(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::warn!("cannot watch SIGTERM/SIGINT");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        shutdown.cancel();
    });
}
