//! With `--network domains` (issue 46 §2): the egress proxy cells and
//! shell jobs reach the `--allow-domain` hosts through, beside the
//! installers' (a socket, an allow-list and a relay of its own; no index
//! credentials), started once every start-up check has passed. Installers
//! never use it, and it never admits the indexes on their account.

use super::installers::EgressProxy;
use crate::config::{self, settings::Settings};
use crate::{egress, installer, sandbox, state};

/// The cells' proxy to start, its relay put on `sandbox_cfg` (None
/// without `--network domains`).
pub(super) fn settle(
    settings: &Settings,
    sandbox_cfg: &mut sandbox::SandboxConfig,
    state_dir: &state::RuntimeDir,
) -> anyhow::Result<Option<EgressProxy>> {
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
    Ok(Some(EgressProxy { socket, config }))
}
