//! The startup probe: the launcher run once with the real policy, to learn
//! (and tell the operator) which protections this system gives.

use std::path::Path;

use super::{Applied, SandboxConfig, SandboxMode};

/// Runs the launcher once with the real policy (namespaces first, without
/// them if the kernel refuses) and records what is active in `cfg`; fails
/// when --sandbox-require is set and something is missing. Returns what
/// the launcher applied (nothing with the sandbox off).
pub fn probe(cfg: &mut SandboxConfig) -> anyhow::Result<Applied> {
    if !cfg.enabled() {
        cfg.namespaces = false;
        cfg.active = "OFF: no OS confinement; sessions can read and write everything ferrepl can, and use the network".into();
        return Ok(Applied::default());
    }
    let tmp = cfg.state.join("probe");
    std::fs::create_dir_all(&tmp)?;
    let mut gap = None;
    if cfg.identity.is_some() && cfg.namespaces {
        settle_identity(cfg, &tmp);
    }
    if !cfg!(target_os = "linux") {
        cfg.namespaces = false;
        gap = Some("Linux only".to_string());
    } else if !cfg.namespaces {
        gap = Some("turned off with --no-namespaces".to_string());
    }
    let applied = match run_probe(cfg, &tmp) {
        Ok(a) => a,
        Err(e) if cfg.namespaces => {
            tracing::warn!("private namespaces are not available here: {e:#}");
            gap = Some(format!("{e:#}"));
            cfg.namespaces = false;
            run_probe(cfg, &tmp)?
        }
        Err(e) => return Err(e),
    };
    let _ = std::fs::remove_dir_all(&tmp);
    cfg.namespaces_gap = if applied.namespaces {
        None
    } else {
        Some(gap.clone().unwrap_or_else(|| "not on this system".into()))
    };
    if !cfg.namespaces && cfg.identity.is_some() {
        // Without namespaces the launcher keeps the server's uid: nothing
        // (a tenant's workspace, a kept venv) may be given to another, or
        // sessions could not write their own places.
        cfg.set_identity(None, false);
    }
    // Where writes are confined at all (Landlock, namespaces), protected
    // places must be too; where nothing confines them (macOS for now),
    // the status line says so.
    let confined = applied.landlock_full() || applied.namespaces;
    if confined && cfg.protected.is_some() && applied.protection != Some(Ok(())) {
        // The launch itself fails where the supervisor cannot start; a
        // probe that says nothing of it is refused the same way.
        anyhow::bail!(
            "the protected places (.git, agent clients' settings, R's start-up files, .venv...) cannot be kept from sessions here; run where seccomp user notification works (Linux 5.14 or later), or free them with --allow-write-protected all"
        );
    }
    let mut parts = confinement(cfg, &applied, gap.as_deref());
    parts.extend(limits(cfg));
    cfg.active = parts.join("; ");
    if cfg.require && !fully_protected(cfg, &applied) {
        anyhow::bail!(
            "--sandbox-require: not every protection is available: {}",
            cfg.active
        );
    }
    Ok(applied)
}

/// Whether every protection is active.
fn fully_protected(cfg: &SandboxConfig, applied: &Applied) -> bool {
    applied.seccomp
        && applied.landlock_full()
        && applied.no_new_privs
        && applied.capabilities_dropped
        && applied.namespaces
        && (cfg.network || applied.network_blocked)
}

/// The probe's findings in one short line for the start-up log (the whole
/// description, `cfg.active`, is logged at debug level and shown by
/// `ferrepl doctor`): the mode, the layers in force, and those missing.
pub fn short_description(cfg: &SandboxConfig, applied: &Applied) -> String {
    let mode = match cfg.mode {
        SandboxMode::ReadOnly => "read-only",
        _ => "workspace-write",
    };
    let cgroups = cfg
        .cgroups
        .as_ref()
        .is_some_and(|c| c.has_memory() && c.has_pids());
    let mut layers = vec![
        (applied.landlock_full(), "Landlock"),
        (applied.namespaces, "namespaces"),
        (applied.seccomp, "seccomp"),
        (
            applied.capabilities_dropped && applied.no_new_privs,
            "no privileges",
        ),
        (cgroups, "cgroup limits"),
    ];
    if cfg.mode == SandboxMode::WorkspaceWrite {
        layers.push((
            cfg.protected.is_some() && applied.protection == Some(Ok(())),
            "protected places",
        ));
    }
    if !cfg.network {
        layers.push((applied.network_blocked, "no network"));
    }
    let on: Vec<&str> = layers.iter().filter(|l| l.0).map(|l| l.1).collect();
    let off: Vec<&str> = layers.iter().filter(|l| !l.0).map(|l| l.1).collect();
    let mut line = mode.to_string();
    if !on.is_empty() {
        line.push_str(&format!(": {}", on.join(", ")));
    }
    if cfg.network {
        line.push_str("; network on");
    }
    if !off.is_empty() {
        line.push_str(&format!("; NOT in force: {}", off.join(", ")));
    }
    // Said at every start, not only at debug: an operator must see it.
    if cfg.active.contains("uid boundary DEGRADED") {
        line.push_str("; uid boundary DEGRADED");
    }
    line
}

/// What confines each process, for the status line; `gap` says why there
/// are no private namespaces.
fn confinement(cfg: &SandboxConfig, applied: &Applied, gap: Option<&str>) -> Vec<String> {
    let mut parts = vec![format!(
        "{}: Landlock filesystem {}",
        match cfg.mode {
            SandboxMode::ReadOnly => "read-only",
            _ => "workspace-write",
        },
        applied.landlock
    )];
    parts.push(match (gap, applied.namespaces) {
        (_, true) => format!(
            "private mount, PID, IPC, UTS{} namespaces (a root of only the allow-listed system, read-only, with its own /dev and /proc)",
            if cfg.network { "" } else { " and network" }
        ),
        (Some(e), false) => format!(
            "NO private namespaces ({e}): reads are held to the allow-list by Landlock, but other processes, host Unix sockets and file metadata outside the workspace are not isolated"
        ),
        (None, false) => "no private namespaces on this system".into(),
    });
    parts.push(if applied.capabilities_dropped {
        "all capabilities dropped".into()
    } else {
        "capabilities NOT fully dropped".into()
    });
    parts.push(if applied.seccomp {
        "seccomp filter on".into()
    } else {
        format!(
            "seccomp unavailable ({})",
            applied.seccomp_error.clone().unwrap_or_default()
        )
    });
    parts.push(if cfg.network {
        "network on".into()
    } else if applied.network_blocked {
        "network off (only Unix sockets)".into()
    } else {
        "network off requested but NOT enforced".into()
    });
    parts.push(format!(
        "no_new_privs {}",
        if applied.no_new_privs { "on" } else { "off" }
    ));
    if cfg.protected.is_some() && applied.protection != Some(Ok(())) {
        parts.push(
            "protected places NOT kept: nothing confines writes here (no Landlock, no namespaces)"
                .into(),
        );
    } else if let Some(protected) = &cfg.protected {
        parts.push(format!(
            "protected places kept from every write by a supervisor: {}{}",
            protected.names.join(" "),
            protected
                .paths
                .iter()
                .map(|p| format!(" {}", p.display()))
                .collect::<String>()
        ));
    } else if cfg.mode == SandboxMode::WorkspaceWrite {
        parts.push("protected places: all freed by --allow-write-protected".into());
    }
    if !applied.rlimits.is_empty() {
        parts.push(format!("rlimits: {}", applied.rlimits.join(", ")));
    }
    parts
}

/// The memory and process limits and the environment, for the status line.
fn limits(cfg: &SandboxConfig) -> Vec<String> {
    let cgroups = cfg.cgroups.as_ref();
    let memory = match cfg.memory_limit {
        Some(b) if cgroups.is_some_and(|c| c.has_memory()) => format!(
            "memory limit {} MiB per session and per job (cgroup v1 memory, enforced by the kernel; also a process-tree watch)",
            b / (1024 * 1024)
        ),
        Some(b) => format!(
            "memory limit {} MiB per session and per job (process-tree watch; no writable memory cgroup)",
            b / (1024 * 1024)
        ),
        None => "no memory limit".into(),
    };
    let processes = if cgroups.is_some_and(|c| c.has_pids()) {
        format!(
            "at most {} processes per session (process-tree watch), and a kernel ceiling on tasks per session and per job (cgroup v1 pids)",
            cfg.max_processes
        )
    } else {
        format!(
            "at most {} processes per session (process-tree watch; no writable pids cgroup)",
            cfg.max_processes
        )
    };
    vec![
        memory,
        processes,
        "environment: an allow-list plus --pass-env; HOME and TMPDIR are per-session temporary directories".into(),
    ]
}

/// Finds how far the uid boundary goes here: the identity with idmapped
/// mounts, without them (when the workspace is the identity's own), or not
/// at all; records why in `identity_gap`.
fn settle_identity(cfg: &mut SandboxConfig, tmp: &Path) {
    let Some(id) = cfg.identity else {
        return;
    };
    let owns_workspace = !cfg.workspace_idmapped();
    let works = |cfg: &SandboxConfig| match run_probe(cfg, tmp) {
        Ok(a) if a.uid == id.uid => Ok(()),
        Ok(a) => Err(format!("the launcher ran as uid {}", a.uid)),
        Err(e) => Err(format!("{e:#}")),
    };
    let Err(first) = works(cfg) else {
        return;
    };
    if !cfg.idmapped.is_empty() {
        cfg.idmap = false;
        cfg.set_identity(Some(id), owns_workspace);
        if owns_workspace && works(cfg).is_ok() {
            tracing::warn!(
                "idmapped mounts are not available here ({first}); writable places owned by another uid are not writable by sessions"
            );
            cfg.identity_gap = Some(format!("no idmapped mounts: {first}"));
            return;
        }
    }
    tracing::warn!("sessions cannot run as uid {} here: {first}", id.uid);
    cfg.set_identity(None, false);
    cfg.identity_gap = Some(first);
}

fn run_probe(cfg: &SandboxConfig, tmp: &Path) -> anyhow::Result<Applied> {
    if cfg.namespaces
        && let Some(id) = cfg.identity
    {
        std::os::unix::fs::chown(tmp, Some(id.uid), Some(id.gid))?;
    }
    let mut policy = cfg.policy(tmp, &cfg.workspace, cfg.environment(Some(tmp), &[]));
    policy.probe = true;
    let (exe, args) = cfg.wrap(&policy, Path::new("/bin/true"), &[])?;
    let out = std::process::Command::new(exe)
        .args(args)
        .env_clear()
        .current_dir(&cfg.workspace)
        .stdin(std::process::Stdio::null())
        .output()?;
    if !out.status.success() {
        anyhow::bail!(
            "{}",
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .trim_start_matches("ferrepl launcher: ")
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}
