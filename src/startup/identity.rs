//! The uid boundary: which uid a root server's sessions run as, chosen
//! before the probe (which finds how much of it the kernel allows) and
//! reported after it.

use crate::sandbox::{self, SandboxConfig, uids::TenantUids};

/// Who runs the server.
fn server_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Sets the identity the probe tries: with tenants, one of the range (each
/// tenant gets its own when it is built); alone, the workspace's owner, or
/// a uid of the range with the workspace shown as its own through an
/// idmapped mount when root owns it. An unprivileged server keeps its uid.
pub fn choose(
    cfg: &mut SandboxConfig,
    tenants: bool,
    uids: Option<&TenantUids>,
) -> anyhow::Result<()> {
    let Some(uids) = uids.filter(|_| server_uid() == 0 && cfg.enabled()) else {
        return Ok(());
    };
    cfg.idmap = true;
    if tenants {
        cfg.set_identity(Some(uids.probe_identity()), true);
        return Ok(());
    }
    match sandbox::owner_of(&cfg.workspace) {
        Some(owner) if owner.uid != 0 => {
            // The owner's own group, never the directory's (a root group
            // there would give sessions gid 0).
            let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(owner.uid))
                .ok()
                .flatten()
                .map(|u| u.gid.as_raw())
                .filter(|g| *g != 0)
                .unwrap_or(owner.uid);
            cfg.set_identity(
                Some(sandbox::Identity {
                    uid: owner.uid,
                    gid,
                }),
                true,
            );
        }
        _ => cfg.set_identity(Some(uids.identity_of(sandbox::uids::SOLE)?), false),
    }
    Ok(())
}

/// The status line's part on uids, and whether the boundary is missing
/// (a root server's sessions as uid 0, or tenants sharing one uid).
pub fn describe(cfg: &SandboxConfig, tenants: bool) -> (String, bool) {
    let uid = server_uid();
    let gap = cfg
        .identity_gap
        .as_deref()
        .unwrap_or("no private namespaces");
    match (cfg.namespaces.then_some(cfg.identity).flatten(), uid) {
        (Some(_), _) if tenants => ("sessions run as each tenant's own uid".into(), false),
        (Some(id), _) if cfg.workspace_idmapped() => (
            format!(
                "sessions run as uid {}, the workspace shown as theirs through an idmapped mount",
                id.uid
            ),
            false,
        ),
        (Some(id), _) => (
            format!(
                "sessions run as uid {}, the workspace's owner{}",
                id.uid,
                match &cfg.identity_gap {
                    Some(g) => format!(" ({g})"),
                    None => String::new(),
                }
            ),
            false,
        ),
        (None, 0) => (
            format!("uid boundary DEGRADED: sessions run as root without capabilities ({gap})"),
            true,
        ),
        (None, uid) if tenants => (
            format!(
                "uid boundary DEGRADED: every tenant's sessions run as the server's uid {uid} (an unprivileged server cannot give each its own; run it as root, e.g. root of a pod's user namespace: docs/deploy.md)"
            ),
            true,
        ),
        (None, uid) => (format!("sessions run as the server's uid {uid}"), false),
    }
}
