//! With `--network domains` (issue 46 §2): the egress proxy cells and
//! shell jobs reach the `--allow-domain` hosts through, beside the
//! installers' (a socket, an allow-list and a relay of its own; no index
//! credentials), started once every start-up check has passed, with a
//! listener of its own for each tenant so that the proxy counts each
//! tenant's share. Installers never use it, and it never admits the indexes
//! on their account.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::{self, settings::Settings};
use crate::{egress, installer, sandbox, state};

/// The cells' proxy, to be started once every start-up check has passed.
pub(super) struct CellProxy {
    socket: PathBuf,
    config: egress::EgressConfig,
}

impl CellProxy {
    /// Starts it on the server's own socket (the sole tenant's sessions,
    /// no tenant's share); tenants get listeners of their own.
    pub(super) fn start(self) -> anyhow::Result<Arc<CellEgress>> {
        let listener = tokio::net::UnixListener::bind(&self.socket)
            .with_context(|| format!("cannot listen on {}", self.socket.display()))?;
        tracing::info!(
            "cells and shell jobs may reach: {} (no port: 80 and 443)",
            self.config.describe()
        );
        let proxy = egress::SharedProxy::new(self.config);
        proxy.spawn(listener, None, CancellationToken::new());
        let dir = self.socket.parent().map(PathBuf::from).unwrap_or_default();
        Ok(Arc::new(CellEgress {
            proxy,
            dir,
            next: AtomicU64::new(0),
        }))
    }
}

/// The cells' proxy once started: each tenant gets a listener of its own
/// ([`CellEgress::for_tenant`]), by which the proxy counts its share.
pub struct CellEgress {
    proxy: egress::SharedProxy,
    /// Where the tenants' sockets go: the server's runtime directory.
    dir: PathBuf,
    next: AtomicU64,
}

/// A tenant's listener on the cells' proxy and the relay its sandboxed
/// processes get; dropping it closes the listener and its connections and
/// removes the socket.
pub struct TenantEgress {
    pub relay: sandbox::EgressRelay,
    socket: PathBuf,
    stop: CancellationToken,
}

impl CellEgress {
    pub fn for_tenant(&self, name: &str) -> anyhow::Result<TenantEgress> {
        // Numbered, not named: a tenant's name is the operator's text.
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let socket = self.dir.join(format!("cell-egress-{n}.sock"));
        let listener = tokio::net::UnixListener::bind(&socket)
            .with_context(|| format!("cannot listen on {}", socket.display()))?;
        let stop = CancellationToken::new();
        self.proxy
            .spawn(listener, Some(name.to_string()), stop.clone());
        Ok(TenantEgress {
            relay: sandbox::EgressRelay {
                port: installer::RELAY_PORT,
                socket: socket.display().to_string(),
            },
            socket,
            stop,
        })
    }
}

impl Drop for TenantEgress {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The cells' proxy to start, its relay put on `sandbox_cfg` (None
/// without `--network domains`).
pub(super) fn settle(
    settings: &Settings,
    sandbox_cfg: &mut sandbox::SandboxConfig,
    state_dir: &state::RuntimeDir,
) -> anyhow::Result<Option<CellProxy>> {
    if settings.sandbox.network != config::Network::Domains {
        return Ok(None);
    }
    // Refused in config already; kept for whoever builds settings another way.
    anyhow::ensure!(
        sandbox_cfg.enabled(),
        "--network domains needs the sandbox: use --sandbox workspace-write or read-only"
    );
    if !sandbox_cfg.namespaces {
        anyhow::bail!(
            "--network domains needs private network namespaces, which are not available here{}: cells could not be confined to the --allow-domain hosts. Use --network packages (cells reach nothing) or --network on (cells reach everything)",
            match settings.sandbox.namespaces {
                true => "",
                false => " (--no-namespaces)",
            }
        );
    }
    let domains = settings.sandbox.allow_domain.clone();
    let socket = state_dir.path().join("cell-egress.sock");
    let mut config = egress::EgressConfig::for_cells(domains.clone());
    config.allow_private = settings.sandbox.egress_allow_private;
    sandbox_cfg.cell_egress = Some(sandbox::EgressRelay {
        port: installer::RELAY_PORT,
        socket: socket.display().to_string(),
    });
    sandbox_cfg.active.push_str(&format!(
        "; cells and shell jobs reach only {} (HTTP/HTTPS through ferrepl's proxy{})",
        egress::describe_domains(&domains),
        if config.allow_private {
            ", private addresses allowed"
        } else {
            ""
        }
    ));
    Ok(Some(CellProxy { socket, config }))
}
