//! ferrepl: persistent Python sessions for AI agents over MCP.

mod config;
mod egress;
mod files;
mod installer;
mod jobs;
mod mcp;
mod sandbox;
mod session;
mod startup;
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
    let state_dir = state::StateDir::create()?;
    let log_dir = state_dir.path().to_path_buf();
    let startup::Prepared {
        python,
        sandbox: sandbox_cfg,
        installer,
    } = startup::prepare(&cfg, &workdir, &state_dir)?;
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
    let app = mcp::server::AppParts {
        manager: manager.clone(),
        jobs: jobs.clone(),
        files: workspace,
        groups,
        structured: cfg.structured_content,
    };
    let result = match cfg.http {
        Some(addr) => mcp::http::serve(addr, &cfg, app, shutdown.clone()).await,
        None => serve_stdio(app, cfg.max_request_bytes, shutdown.clone()).await,
    };
    jobs.shutdown();
    manager.shutdown().await;
    drop(state_dir);
    tracing::info!("ferrepl stopped");
    result
}

async fn serve_stdio(
    app: mcp::server::AppParts,
    max_request_bytes: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let server = mcp::server::FerreplServer::new(&app, session::DEFAULT_SESSION.to_string());
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
