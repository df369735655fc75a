//! Assembling the server: settings from the command line, the components
//! built from them, then the transport until shutdown.

use anyhow::Context;
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::config::settings::Settings;
use crate::session::SessionManager;
use crate::worker::Language;
use crate::{files, jobs, mcp, session, startup, state};

/// Runs the server until its transport ends or a signal arrives.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let settings = Settings::from_config(&cfg)?;
    let languages = parse_languages(&cfg.languages)?;
    let groups = mcp::groups::ToolGroups::parse(&cfg.tools, &languages)
        .map_err(|e| anyhow::anyhow!("--tools: {e}"))?;
    let state_dir = state::StateDir::create()?;
    let log_dir = state_dir.path().to_path_buf();
    let durable = open_store(&cfg, &settings.workdir)?;
    let kept_in = durable
        .store
        .as_ref()
        .and_then(|s| s.path().parent().map(std::path::Path::to_path_buf));
    let startup::Prepared {
        python,
        sandbox,
        installer,
    } = startup::prepare(&cfg, &settings.workdir, &state_dir, kept_in.as_deref())?;
    let sandbox = std::sync::Arc::new(sandbox);
    let jobs = jobs::JobManager::new(settings.job_config(&log_dir, sandbox.clone(), installer));
    let workspace = files::Workspace::new(&settings.workdir)
        .with_context(|| format!("workspace root {}", settings.workdir.display()))?
        .read_only(cfg.sandbox == crate::sandbox::SandboxMode::ReadOnly);
    let spec = settings.launch_spec(Language::Python, python, &log_dir, sandbox.clone());
    let r_spec = languages.contains(&Language::R).then(|| {
        let r = crate::worker::r::resolve(cfg.r.as_deref());
        if r.is_none() {
            tracing::warn!(
                "R sessions are enabled but no R was found: {}",
                crate::worker::r::INSTALL_HINT
            );
        }
        let r = r.unwrap_or_else(|| "R".into());
        let mut spec = settings.launch_spec(Language::R, r, &log_dir, sandbox.clone());
        let library = settings.workdir.join(crate::worker::r::LIBRARY);
        spec.env
            .push(("R_LIBS_USER".into(), library.display().to_string()));
        spec
    });
    let manager = SessionManager::new(
        spec,
        languages.contains(&Language::Python),
        r_spec,
        settings.limits.clone(),
        durable,
    );
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
    let app = mcp::server::AppParts::new(
        manager.clone(),
        jobs.clone(),
        workspace,
        groups,
        settings.structured,
    );
    let result = match cfg.http {
        Some(addr) => mcp::transport::http::serve(addr, &cfg, app, shutdown.clone()).await,
        None => serve_stdio(app, cfg.max_request_bytes, shutdown.clone()).await,
    };
    jobs.shutdown();
    manager.shutdown().await;
    drop(state_dir);
    tracing::info!("ferrepl stopped");
    result
}

/// The store that keeps sessions across restarts (--state-dir, --resume).
/// Sessions work without it: a store that cannot be used is a warning,
/// unless the operator named its directory.
fn open_store(cfg: &Config, workdir: &std::path::Path) -> anyhow::Result<session::Durability> {
    use crate::store::{Opened, Store, StoreConfig};
    let mut durable = session::Durability::off();
    durable.max_cells = cfg.resume_max_cells.max(1);
    durable.max_tree = cfg.state_max_cells.max(1);
    durable.checkpoints = cfg.checkpoints;
    durable.checkpoint_min =
        std::time::Duration::from_secs_f64(cfg.checkpoint_min_ms.clamp(0.0, 86_400_000.0) / 1000.0);
    durable.max_time = crate::units::seconds(cfg.resume_max_seconds, "--resume-max-seconds")?;
    if cfg.resume == "off" {
        return Ok(durable);
    }
    let Some(dir) = cfg.state_dir.clone().or_else(default_state_dir) else {
        tracing::warn!(
            "sessions are not kept across restarts: no HOME or XDG_STATE_HOME; pass --state-dir"
        );
        return Ok(durable);
    };
    let keep = crate::units::seconds(cfg.state_keep_days * 86400.0, "--state-keep-days")?;
    let opened = Store::open(&StoreConfig {
        dir,
        workspace: workdir.to_path_buf(),
        principal: "local".into(),
        max_cells_per_session: cfg.state_max_cells.max(1),
        keep,
        max_sessions: cfg.max_sessions.max(1) * 4,
        max_bytes: cfg.state_max_mb.max(1).saturating_mul(1 << 20),
    });
    match opened {
        Ok(Opened::Ready(store)) => {
            tracing::info!(
                "sessions are kept across restarts in {}",
                store.path().display()
            );
            durable.store = Some(store);
        }
        Ok(Opened::Locked { path, holder_pid }) => tracing::warn!(
            "another ferrepl ({}) keeps this workspace's sessions in {}; this server's sessions are not kept across restarts",
            holder_pid.map_or_else(|| "pid unknown".to_string(), |p| format!("pid {p}")),
            path.display()
        ),
        Err(e) if cfg.state_dir.is_some() => {
            return Err(anyhow::anyhow!("--state-dir: {e}"));
        }
        Err(e) => tracing::warn!("sessions are not kept across restarts: {e}"),
    }
    Ok(durable)
}

/// $XDG_STATE_HOME/ferrepl, else ~/.local/state/ferrepl.
fn default_state_dir() -> Option<std::path::PathBuf> {
    let absolute = |v: std::ffi::OsString| {
        let p = std::path::PathBuf::from(v);
        p.is_absolute().then_some(p)
    };
    std::env::var_os("XDG_STATE_HOME")
        .and_then(absolute)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(absolute)
                .map(|h| h.join(".local/state"))
        })
        .map(|d| d.join("ferrepl"))
}

/// `--languages`: each named once, at least one.
fn parse_languages(names: &[String]) -> anyhow::Result<Vec<Language>> {
    let mut out = Vec::new();
    for name in names.iter().map(|n| n.trim().to_ascii_lowercase()) {
        if name.is_empty() {
            continue;
        }
        let lang = Language::parse(&name).ok_or_else(|| {
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
    let transport =
        mcp::transport::stdio::StdioTransport::start(max_request_bytes, stdin_closed.clone());
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
