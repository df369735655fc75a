//! Assembling the server: settings from the command line, the components
//! built from them, then the transport until shutdown.

use anyhow::Context;
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use crate::config::Flags;
use crate::config::settings::Settings;
use crate::session::gate::Gate;
use crate::tenants::{self, Tenant, TokenTable};
use crate::{mcp, session, startup, state};

/// Runs the server until its transport ends or a signal arrives.
pub async fn run(flags: Flags) -> anyhow::Result<()> {
    // Watched from the start: a Ctrl-C while sessions start (the person
    // read the hint and changed their mind) ends the server as one after.
    let signals = Signals::watch();
    let settings = Settings::from_flags(&flags)?;
    let groups = mcp::groups::ToolGroups::parse(&settings.serving.tools, &settings.languages)
        .map_err(|e| anyhow::anyhow!("--tools: {e}"))?;
    let tokens = TokenTable::from_flags(&flags)?;
    drop(flags);
    // Refusals from the flags alone come before anything is started.
    startup::preflight::check(&settings, &tokens)?;
    let viewer_tokens = crate::viewer::check(&settings, &tokens)?;
    // Every secret ferrepl hands out, redacted from what its holders say
    // (the upstream servers add theirs when their file is read).
    let secrets = crate::output::redact::Secrets::new();
    secrets.add(tokens.secrets());
    if let Some(viewer_tokens) = &viewer_tokens {
        secrets.add(viewer_tokens.secrets());
    }
    let viewer = crate::viewer::bind(&settings, viewer_tokens).await?;
    let terminal = settings.serving.http.is_none() && crate::setup::terminal::stdin_is_terminal();
    if terminal {
        eprint!(
            "{}",
            crate::setup::terminal::hint(viewer.as_ref().map(|v| v.url.as_str()))
        );
    }
    if let Some(viewer) = &viewer {
        eprint!("{}", viewer.announce()?);
    }
    raise_open_files();
    let state_dir = state::RuntimeDir::create()?;
    let log_dir = state_dir.path().to_path_buf();
    // Checked where it lies, then opened and checked, before the uid table
    // or a kept venv writes there.
    startup::preflight::state_dir_place(&settings)?;
    let kept_in = tenants::store::dir(&settings.stores)?;
    // A root server's sessions run as uids of their own (the uid boundary),
    // from the host's table.
    let uids = startup::uid_table(&settings, &settings.workdir, kept_in.as_deref(), false)?
        .map(std::sync::Arc::new);
    let startup::Prepared {
        python,
        kept_venvs,
        sandbox,
        installer,
        places,
        cell_egress,
        kernels,
    } = startup::prepare(
        &settings,
        startup::Instance {
            runtime: &state_dir,
            stores: kept_in.as_deref(),
            tenants: tokens.has_tenants(),
            uids: uids.as_deref(),
            peek: false,
        },
    )?;
    if kept_venvs.is_none() && !settings.ready_made.preinstall.is_empty() {
        anyhow::bail!(
            "--preinstall/--requirements install into the venv ferrepl keeps for the workspace, and there is none here: sessions are not kept (--resume off), or the interpreter is one sessions can write; drop --resume off, or give --python an interpreter outside the workspace"
        );
    }
    // Bound before any session starts: an address in use is a refusal too.
    let listeners = match settings.serving.http {
        Some(addr) => Some(crate::serve::http::Listeners::bind(addr, &settings).await?),
        None => None,
    };
    let gate = Gate::new(
        settings.limits.max_sessions,
        settings.max_jobs,
        settings.limits.warm_pool,
    );
    secrets.add(
        installer
            .credentials
            .iter()
            .flat_map(|c| c.secrets().iter().cloned())
            .chain(installer.unusable.iter().cloned()),
    );
    let upstreams = upstream_servers(&settings, places.writable(), secrets.clone())?;
    let base = tenants::Base {
        settings: settings.clone(),
        groups,
        python,
        kept_venvs,
        sandbox,
        installer,
        log_dir,
        gate,
        uids,
        upstreams: upstreams.clone(),
        viewer_url: viewer.as_ref().map(|v| v.url.clone()),
        cell_egress,
        kernels: kernels.into_iter().map(std::sync::Arc::new).collect(),
    };
    crate::metrics::set_limits(&base.settings.limit_gauges(tokens.has_tenants()));
    let instance = tenants::Instance::new(base, tokens, settings.own_files.auth_token_file.clone());
    if !instance.tokens().has_tenants() {
        // The sole tenant starts at once: its default session warms up
        // while the client connects.
        instance.tenant(&Tenant::Sole)?;
    }

    let shutdown = CancellationToken::new();
    let viewer = viewer.map(|v| v.spawn(&settings, instance.clone(), shutdown.clone()));
    spawn_signal_watch(
        signals,
        Reloaded {
            instance: instance.clone(),
            upstreams: upstreams.clone(),
            viewer,
            secrets,
        },
        shutdown.clone(),
        instance.base().settings.drain,
    );
    {
        // End the workers as soon as shutdown starts, so calls in flight
        // finish at once instead of holding the transport open.
        let (instance, shutdown) = (instance.clone(), shutdown.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            instance.shutdown().await;
        });
    }
    let result = match listeners {
        Some(listeners) => {
            crate::serve::http::serve(listeners, &settings, instance.clone(), shutdown.clone())
                .await
        }
        None => {
            let app = instance.tenant(&Tenant::Sole)?;
            serve_stdio(
                &app.parts,
                settings.serving.max_request_bytes,
                shutdown.clone(),
            )
            .await
        }
    };
    instance.shutdown().await;
    upstreams.shutdown().await;
    drop(instance);
    drop(state_dir);
    tracing::info!("ferrepl stopped");
    result
}

/// The upstream MCP servers of --mcp-servers, with their bounds.
fn upstream_servers(
    settings: &Settings,
    writable: crate::sandbox::paths::Writable,
    secrets: crate::output::redact::Secrets,
) -> anyhow::Result<Arc<crate::upstream::Upstreams>> {
    // A reload checks the file's place again, as the start did.
    let place_settings = settings.clone();
    let place_check: crate::upstream::PlaceCheck = Box::new(move || {
        startup::preflight::mcp_servers_place(&place_settings).map_err(|e| e.to_string())
    });
    let upstreams = crate::upstream::Upstreams::new(
        settings.own_files.mcp_servers.clone(),
        settings.upstream.clone(),
        writable,
        place_check,
        secrets,
    )
    .map_err(|e| anyhow::anyhow!("--mcp-servers {e}"))?;
    let config = upstreams.config();
    if !config.servers.is_empty() {
        let names: Vec<&str> = config.servers.iter().map(|s| s.name.as_str()).collect();
        tracing::info!("MCP servers for sessions' code: {}", names.join(", "));
        if settings.sandbox.mode == crate::sandbox::SandboxMode::Off {
            tracing::warn!(
                "--sandbox off: sessions run as this user, unconfined, and can read --mcp-servers and the upstream servers' environment (their tokens)"
            );
        }
        let http = config
            .servers
            .iter()
            .any(|s| matches!(s.transport, crate::upstream::Transport::Http { .. }));
        if http && settings.sandbox.network == crate::sandbox::Network::On {
            tracing::warn!(
                "--network on: sessions can reach the HTTP upstream MCP servers directly, around allowTools and without their headers; keep --network off or packages with HTTP upstreams"
            );
        }
    }
    Ok(upstreams)
}

/// The soft limit on open descriptors raised to the hard one: every
/// connection, session pipe and log takes one, and the usual soft 1024 is
/// what a flood of half-open connections would exhaust first.
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!("open files: soft limit raised from {soft} to {hard}"),
            Err(e) => tracing::warn!("open files: cannot raise the soft limit {soft}: {e}"),
        }
    }
}

async fn serve_stdio(
    app: &mcp::server::AppParts,
    max_request_bytes: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let server = mcp::server::FerreplServer::new(app, session::DEFAULT_SESSION.to_string());
    // Stdin's end cancels `shutdown`: rmcp drains in-flight calls for a while
    // after EOF, and ending the workers at once makes those calls finish
    // (crashed) and the process exit promptly.
    let stdin_closed = CancellationToken::new();
    let transport =
        crate::serve::stdio::StdioTransport::start(max_request_bytes, stdin_closed.clone());
    {
        let (stdin_closed, shutdown) = (stdin_closed.clone(), shutdown.clone());
        tokio::spawn(async move {
            stdin_closed.cancelled().await;
            shutdown.cancel();
        });
    }
    let running = tokio::select! {
        r = server.serve(transport) => match r {
            Ok(running) => running,
            // Ctrl-D in a terminal, or a client that left before
            // initializing: nobody to serve, and nothing went wrong here.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(during)) => {
                tracing::debug!("stdin closed before the MCP handshake finished ({during})");
                return Ok(());
            }
            Err(e) => return Err(e).context("MCP handshake on stdio failed"),
        },
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

/// SIGINT ends the server at once. SIGTERM too over stdio; over HTTP it
/// drains first (`drain`: readiness off, new work refused, running cells
/// given time to finish and the calls waiting for them answered), and a second SIGTERM ends the
/// drain at once. SIGHUP reloads the token files.
/// SIGTERM, SIGINT and SIGHUP, each recorded from the moment it is
/// watched (None: they cannot be, and the defaults apply).
struct Signals(
    Option<(
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
    )>,
);

impl Signals {
    fn watch() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(term), Ok(int), Ok(hup)) => Self(Some((term, int, hup))),
            _ => {
                tracing::warn!("cannot watch SIGTERM/SIGINT/SIGHUP");
                Self(None)
            }
        }
    }
}

/// What SIGHUP reloads.
struct Reloaded {
    instance: Arc<tenants::Instance>,
    upstreams: Arc<crate::upstream::Upstreams>,
    viewer: Option<Arc<crate::viewer::Viewer>>,
    secrets: crate::output::redact::Secrets,
}

fn spawn_signal_watch(
    signals: Signals,
    reloaded: Reloaded,
    shutdown: CancellationToken,
    drain: Option<std::time::Duration>,
) {
    let instance = reloaded.instance.clone();
    tokio::spawn(async move {
        let Some((mut term, mut int, mut hup)) = signals.0 else {
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => {
                    tracing::info!("SIGINT: shutting down");
                    shutdown.cancel();
                    return;
                }
                _ = hup.recv() => reload(&reloaded).await,
            }
        }
        let Some(grace) = drain else {
            tracing::info!("SIGTERM: shutting down");
            shutdown.cancel();
            return;
        };
        tracing::info!(
            "SIGTERM: draining (up to {:.0} s; a second SIGTERM exits at once)",
            grace.as_secs_f64()
        );
        let drained = instance.drain(grace);
        tokio::pin!(drained);
        loop {
            tokio::select! {
                left = &mut drained => {
                    if left == 0 {
                        tracing::info!("drained: no cell is running and every call was answered");
                    } else {
                        tracing::warn!("drain time is up: {left} cells were still running");
                    }
                    break;
                }
                _ = term.recv() => {
                    tracing::info!("second SIGTERM: shutting down at once");
                    break;
                }
                _ = int.recv() => {
                    tracing::info!("SIGINT: shutting down");
                    break;
                }
                // A revoked token stops working during a drain too.
                _ = hup.recv() => reload(&reloaded).await,
            }
        }
        shutdown.cancel();
    });
}

/// SIGHUP: the token file, the viewer's tokens (after it: a revoked
/// tenant's viewer logins end) and the MCP servers file, each kept as it
/// was when it cannot be read. The secrets they hold join those redacted
/// (the servers file's, by its own reload, before a server starts).
async fn reload(reloaded: &Reloaded) {
    let Reloaded {
        instance,
        upstreams,
        viewer,
        secrets,
    } = reloaded;
    reload_tokens(instance).await;
    secrets.add(instance.tokens().secrets());
    if let Some(viewer) = viewer {
        viewer.reload();
        secrets.add(viewer.token_secrets());
    }
    match upstreams.reload().await {
        Ok(done) => tracing::info!("SIGHUP: {done}"),
        Err(e) => tracing::error!(
            "SIGHUP: the MCP servers were not reloaded (the previous ones stay): {e}"
        ),
    }
}

/// On a blocking thread: revoking a tenant kills its process trees.
async fn reload_tokens(instance: &Arc<tenants::Instance>) {
    let instance = instance.clone();
    match tokio::task::spawn_blocking(move || instance.reload_tokens()).await {
        Ok(Ok(done)) => tracing::info!("SIGHUP: {done}"),
        Ok(Err(e)) => tracing::error!("SIGHUP: the tokens were not reloaded: {e}"),
        Err(e) => tracing::error!("SIGHUP: the reload failed: {e}"),
    }
}
