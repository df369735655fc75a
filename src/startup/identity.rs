//! The uid boundary: which uid a root server's sessions run as, chosen
//! before the probe (which finds how much of it the kernel allows) and
//! reported after it.

use std::path::Path;

use crate::config::settings::Settings;
use crate::sandbox::{self, SandboxConfig, uids::TenantUids};

/// Who runs the server.
fn server_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The host's table of session uids (--uid-table) as this instance uses
/// it: checked now (a table that is not root's alone refuses the start);
/// `peek` (doctor) reads it and writes nothing. None for an unprivileged
/// server, which keeps none and runs sessions as itself. The instance's
/// keys are made of its state directory (`kept_in`, else --state-dir or its
/// default as named, with no link in it where it exists: whatever --resume
/// says) and its workspace.
pub fn uid_table(
    settings: &Settings,
    workdir: &Path,
    kept_in: Option<&Path>,
    peek: bool,
) -> anyhow::Result<Option<TenantUids>> {
    if server_uid() != 0 {
        return Ok(None);
    }
    let state_dir = kept_in.map(Path::to_path_buf).or_else(|| {
        settings
            .stores
            .named_dir
            .clone()
            .map(|d| d.canonicalize().unwrap_or(d))
    });
    let instance = sandbox::uids::Instance {
        state_dir,
        workdir: workdir.to_path_buf(),
    };
    if peek {
        return Ok(Some(TenantUids::peek(
            &settings.sandbox.uid_table,
            instance,
            settings.sandbox.tenant_uids,
        )));
    }
    Ok(Some(TenantUids::open(
        &settings.sandbox.uid_table,
        instance,
        settings.sandbox.tenant_uids,
    )?))
}

/// Sets the identity the probe tries: with tenants, one of the range (each
/// tenant gets its own when it is built); alone, the workspace's owner, or
/// a uid of the range with the workspace shown as its own through an
/// idmapped mount when root owns it. An unprivileged server keeps its uid.
pub fn choose(
    policy: &mut SandboxConfig,
    tenants: bool,
    uids: Option<&TenantUids>,
) -> anyhow::Result<()> {
    let Some(uids) = uids.filter(|_| server_uid() == 0 && policy.enabled()) else {
        return Ok(());
    };
    policy.idmap = true;
    if tenants {
        // Their uids are looked up at each tenant's first request: a table
        // that cannot be kept refuses the start now.
        uids.prepare()?;
        policy.set_identity(Some(uids.probe_identity()), true);
        return Ok(());
    }
    match sandbox::owner_of(&policy.workspace) {
        Some(owner) if owner.uid != 0 => {
            // The owner's own group, never the directory's (a root group
            // there would give sessions gid 0).
            let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(owner.uid))
                .ok()
                .flatten()
                .map(|u| u.gid.as_raw())
                .filter(|g| *g != 0)
                .unwrap_or(owner.uid);
            warn_busy_owner(owner.uid, policy.max_processes);
            policy.set_identity(
                Some(sandbox::Identity {
                    uid: owner.uid,
                    gid,
                }),
                true,
            );
        }
        _ => policy.set_identity(Some(uids.identity_of(sandbox::uids::SOLE)?), false),
    }
    Ok(())
}

/// Sessions that run as the workspace's owner share RLIMIT_NPROC
/// (--max-processes) with everything that user runs on the host (a
/// desktop's browser threads count): said at start when half of it is
/// taken already.
fn warn_busy_owner(uid: u32, max_processes: u64) {
    let tasks = tasks_of(uid);
    if tasks.saturating_mul(2) >= max_processes {
        tracing::warn!(
            "sessions run as uid {uid}, the workspace's owner, whose processes on this host already hold {tasks} tasks (threads count); RLIMIT_NPROC, --max-processes {max_processes}, counts them all, so sessions may be refused new processes and threads: raise --max-processes"
        );
    }
}

/// Tasks (threads) of processes whose real uid is `uid`, from /proc.
fn tasks_of(uid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let field = |status: &str, key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
        .filter(|s| field(s, "Uid:") == Some(u64::from(uid)))
        .map(|s| field(&s, "Threads:").unwrap_or(1))
        .sum()
}

/// The status line's part on uids, and whether the boundary is missing
/// (a root server's sessions as uid 0, or tenants sharing one uid).
pub fn describe(policy: &SandboxConfig, tenants: bool) -> (String, bool) {
    let uid = server_uid();
    let gap = policy
        .identity_gap
        .as_deref()
        .unwrap_or("no private namespaces");
    match (policy.namespaces.then_some(policy.identity).flatten(), uid) {
        (Some(_), _) if tenants => ("sessions run as each tenant's own uid".into(), false),
        (Some(id), _) if policy.workspace_idmapped() => (
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
                match &policy.identity_gap {
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

/// With tenants, isolation that is not whole — no private namespaces, or
/// the uid boundary DEGRADED — refuses the start unless the operator named
/// the risk with --allow-degraded-isolation (then a warning). One tenant
/// alone has only the status line's word for it (nobody else shares its
/// sessions' /proc, /dev/shm or uid).
pub fn refuse_degraded_tenants(
    policy: &SandboxConfig,
    namespaces: bool,
    allowed: bool,
) -> anyhow::Result<()> {
    let mut gaps = Vec::new();
    if !namespaces {
        gaps.push(format!(
            "NO private namespaces ({}): every tenant's sessions share the host's /proc (they list each other's processes and read their command lines), /dev/shm (they read and write each other's shared memory files), SysV IPC and host Unix sockets",
            policy.namespaces_gap
                .as_deref()
                .unwrap_or("not on this system")
        ));
    }
    let (uid_part, degraded) = describe(policy, true);
    if degraded {
        gaps.push(format!(
            "{uid_part}; so to the kernel every tenant is one user, and a file one tenant's session leaves where another's reaches is open to it (modes and owners no longer keep tenants apart)"
        ));
    }
    if gaps.is_empty() {
        return Ok(());
    }
    if allowed {
        tracing::warn!(
            "tenants run on degraded isolation, as --allow-degraded-isolation accepts: {}",
            gaps.join("; ")
        );
        return Ok(());
    }
    anyhow::bail!(
        "refusing to serve tenants on degraded isolation: {}. Either run where private namespaces and a uid per tenant work (ferrepl as root, e.g. root of a pod's user namespace, on a kernel that allows namespaces, without --no-namespaces: docs/deploy.md), or accept the risk with --allow-degraded-isolation (FERREPL_ALLOW_DEGRADED_ISOLATION=true)",
        gaps.join("; ")
    )
}
