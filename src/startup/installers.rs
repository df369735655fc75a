//! How installers run, decided at start: the operator's index settings and
//! allow-list (`installer::InstallerSettings`), index credentials kept out
//! of what install jobs see, and with `--network packages` the egress proxy
//! installers reach the indexes through (started only once every start-up
//! check has passed).

use std::path::PathBuf;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::{self, settings::Settings};
use crate::{egress, installer, sandbox, state, worker};

/// The egress proxy installers reach the indexes through, to be started
/// once every start-up check has passed.
pub(super) struct EgressProxy {
    socket: PathBuf,
    config: egress::EgressConfig,
}

impl EgressProxy {
    pub(super) fn start(self) -> anyhow::Result<()> {
        let listener = tokio::net::UnixListener::bind(&self.socket)
            .with_context(|| format!("cannot listen on {}", self.socket.display()))?;
        let proxy = std::sync::Arc::new(self.config);
        tracing::info!("package installers may reach: {}", proxy.describe());
        tokio::spawn(egress::serve(listener, proxy, CancellationToken::new()));
        Ok(())
    }
}

/// The operator's installer settings, and with `--network packages` the
/// egress proxy installers reach the indexes through (started by the caller).
pub(super) fn settle(
    settings: &Settings,
    sandbox_cfg: &mut sandbox::SandboxConfig,
    state_dir: &state::RuntimeDir,
    writable: &sandbox::paths::Writable,
) -> anyhow::Result<(installer::InstallerSettings, Option<EgressProxy>)> {
    let mut mode = settings.sandbox.network;
    if mode == config::Network::Domains {
        // Installers keep their own proxy and allow-list: the cells'
        // --allow-domain hosts are not theirs, nor the indexes the cells'.
        mode = config::Network::Packages;
    }
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
    let mut extra_hosts = settings.sandbox.allow_host_egress.clone();
    let mut extra_ports = Vec::new();
    if settings.languages.contains(&worker::Language::R) {
        extra_hosts.extend(crate::egress::host_of_url(&settings.interpreters.cran));
        // A mirror named with its port (an internal one on :8080) is
        // reached on that port as well as on 443 and 80.
        extra_ports.extend(crate::egress::port_of_url(&settings.interpreters.cran));
    }
    let mut installer = installer::InstallerSettings::discover(
        mode,
        &extra_hosts,
        settings.sandbox.allow_source_builds,
        writable,
    );
    installer.cran = settings.interpreters.cran.clone();
    index_credentials(&mut installer, mode, sandbox_cfg.enabled())?;
    extra_ports.extend(installer.index_ports());
    // The operator's CA bundle: in the view of installers only, at its
    // resolved path (the one they are given); not from where sessions
    // write (they could swap it for a symlink).
    let cert = installer.cert.take();
    if let Some(c) = cert.as_ref().filter(|c| writable.contains(c)) {
        tracing::warn!(
            "the CA bundle {} lies where sessions can write; installers do not get it (move it outside the workspace and the writable paths)",
            c.display()
        );
    }
    installer.cert = cert
        .filter(|c| !writable.contains(c))
        .map(|c| c.canonicalize().unwrap_or(c));
    #[cfg(target_os = "linux")]
    let interceptor = match installer.credentials.is_empty() || mode != config::Network::Packages {
        true => None,
        false => Some(index_interceptor(&mut installer, state_dir)?),
    };
    sandbox_cfg.installer_read = installer
        .cert
        .iter()
        .filter(|c| c.is_absolute() && !sandbox_cfg.view.shows(c))
        .cloned()
        .collect();

    let mut proxy = None;
    if mode == config::Network::Packages {
        let socket = state_dir.path().join("egress.sock");
        let mut config = egress::EgressConfig::new(installer.allowed_hosts.clone());
        config.ports.extend(extra_ports);
        config.allow_private = settings.sandbox.egress_allow_private;
        #[cfg(target_os = "linux")]
        {
            config.intercept = interceptor;
        }
        sandbox_cfg.egress = Some(sandbox::EgressRelay {
            port: installer::RELAY_PORT,
            socket: socket.display().to_string(),
        });
        sandbox_cfg.egress_hosts = installer.allowed_hosts.clone();
        sandbox_cfg.active.push_str(&format!(
            "; package installers reach only {} (HTTPS/HTTP through ferrepl's proxy)",
            installer.allowed_hosts.join(", ")
        ));
        proxy = Some(EgressProxy { socket, config });
    }
    Ok((installer, proxy))
}

/// Index URLs with credentials (issue 42 §2): the egress proxy adds them,
/// so install jobs get the URLs without. Refused where the proxy cannot:
/// over plain HTTP, or when installers reach the network directly while
/// sessions are sandboxed.
fn index_credentials(
    settings: &mut installer::InstallerSettings,
    mode: config::Network,
    sandboxed: bool,
) -> anyhow::Result<()> {
    if !settings.unusable.is_empty() {
        anyhow::bail!(
            "an index URL (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, UV_INDEX, UV_DEFAULT_INDEX, pip.conf or uv.toml) seems to hold credentials (user:password@) that ferrepl cannot take out of it: percent-encode the user and password (# as %23, @ as %40, : in the user as %3A) and check the host name"
        );
    }
    if settings.credentials.is_empty() {
        return Ok(());
    }
    if !sandboxed {
        // Nothing is confined: a session could read pip.conf itself.
        settings.embed_credentials();
        return Ok(());
    }
    if let Some(plain) = settings.credentials.iter().find(|c| !c.https) {
        anyhow::bail!(
            "the package index {plain} (from PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, uv's variables, pip.conf or uv.toml) has credentials but is plain http: ferrepl sends index credentials only over https; use the index's https URL"
        );
    }
    if mode == config::Network::On {
        anyhow::bail!(
            "the package index has credentials, and with --network on install jobs reach it directly, so they would hold the credentials: use --network packages (the default), where ferrepl's proxy adds them"
        );
    }
    if !cfg!(target_os = "linux") && mode == config::Network::Packages {
        anyhow::bail!(
            "index credentials are added by ferrepl's proxy on Linux only; on this system use an index without credentials or local wheels"
        );
    }
    Ok(())
}

/// The CA that the egress proxy ends installers' TLS to credentialed
/// indexes with, and the bundle installers trust it by (in place of the
/// operator's CA bundle, which it includes), written to the state directory.
#[cfg(target_os = "linux")]
fn index_interceptor(
    settings: &mut installer::InstallerSettings,
    state_dir: &state::RuntimeDir,
) -> anyhow::Result<std::sync::Arc<egress::Interceptor>> {
    let operator_ca = settings.cert.clone();
    let interceptor =
        egress::Interceptor::new(settings.credentials.clone(), operator_ca.as_deref())
            .context("cannot set up the proxy that adds index credentials")?;
    let bundle = state_dir.path().join("installer-ca.pem");
    let pem = interceptor.trust_bundle(operator_ca.as_deref())?;
    let written = std::fs::write(&bundle, pem.as_bytes()).and_then(|()| {
        use std::os::unix::fs::PermissionsExt;
        // Public: read by install jobs under the sessions' uid.
        std::fs::set_permissions(&bundle, std::fs::Permissions::from_mode(0o644))
    });
    written.with_context(|| format!("cannot write {}", bundle.display()))?;
    tracing::info!(
        "index credentials stay in the server: installers trust its CA by {}",
        bundle.display()
    );
    settings.cert = Some(bundle);
    Ok(std::sync::Arc::new(interceptor))
}
