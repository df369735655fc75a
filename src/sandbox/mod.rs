//! OS-level confinement of workers and shell jobs (see docs/security.md).
//!
//! The server builds a [`Policy`] per process it starts and runs the program
//! through the launcher (`ferrepl __ferrepl-launch`), which applies it in a
//! single-threaded process and stays behind as a subreaper. Memory and
//! process-count limits are enforced by the server watching process trees.

pub mod cgroup;
pub mod launcher;
pub mod watch;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What the workers may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// No confinement at all.
    Off,
    /// Writes only to the session's temporary directory.
    ReadOnly,
    /// Writes to the workspace and the session's temporary directory.
    WorkspaceWrite,
}

/// The launcher's instructions for one process.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Policy {
    pub read: Vec<String>,
    pub write: Vec<String>,
    pub network: bool,
    pub landlock: bool,
    pub seccomp: bool,
    pub require: bool,
    pub max_file_bytes: Option<u64>,
    pub max_open_files: Option<u64>,
    pub max_processes: Option<u64>,
    pub env: BTreeMap<String, String>,
    /// `cgroup.procs` files the launcher moves itself into before forking.
    #[serde(default)]
    pub cgroup_procs: Vec<String>,
}

/// What the launcher could apply (reported by the startup probe).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    pub no_new_privs: bool,
    pub landlock: String,
    pub seccomp: bool,
    pub seccomp_error: Option<String>,
    pub rlimits: Vec<String>,
    pub network_blocked: bool,
}

/// The server's sandbox settings.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    pub network: bool,
    pub require: bool,
    pub memory_limit: Option<u64>,
    pub max_processes: u64,
    pub max_file_bytes: u64,
    pub max_open_files: u64,
    /// Home of the user running ferrepl: hidden from workers (secrets).
    pub home: Option<PathBuf>,
    /// What the probe found active, for server_status and the log.
    pub active: String,
    /// Where per-session cgroups can be made (None: the limits are enforced
    /// by the process-tree watch alone).
    pub cgroups: Option<cgroup::CgroupRoot>,
}

impl SandboxConfig {
    pub fn enabled(&self) -> bool {
        self.mode != SandboxMode::Off
    }

    /// The policy of one process: `workspace` its workspace, `tmp` its own
    /// temporary directory (also HOME and TMPDIR), `python` its interpreter.
    pub fn policy(&self, workspace: &Path, tmp: &Path, python: Option<&Path>) -> Policy {
        let mut read = Vec::new();
        let hidden_top = self.home.as_deref().and_then(top_level);
        if let Ok(entries) = std::fs::read_dir("/") {
            for e in entries.filter_map(Result::ok) {
                let path = e.path();
                if Some(&path) != hidden_top.as_ref() {
                    read.push(path.display().to_string());
                }
            }
        }
        read.push(workspace.display().to_string());
        if let Some(python) = python {
            for dir in interpreter_dirs(python) {
                read.push(dir.display().to_string());
            }
        }
        let mut write = vec![tmp.display().to_string(), "/dev".to_string()];
        if self.mode == SandboxMode::WorkspaceWrite {
            write.push(workspace.display().to_string());
        }
        if let Some(venv) = python.and_then(venv_of) {
            // python_install writes into the session's venv.
            write.push(venv.display().to_string());
        }
        let mut env = BTreeMap::new();
        env.insert("HOME".into(), tmp.display().to_string());
        env.insert("TMPDIR".into(), tmp.display().to_string());
        Policy {
            read,
            write,
            network: self.network,
            landlock: true,
            seccomp: true,
            require: self.require,
            max_file_bytes: Some(self.max_file_bytes),
            max_open_files: Some(self.max_open_files),
            max_processes: Some(self.max_processes),
            env,
            cgroup_procs: Vec::new(),
        }
    }

    /// New cgroups `label` with the configured limits, joined by whoever is
    /// launched with `policy` (None where no cgroup can be made).
    pub fn cgroup_for(&self, policy: &mut Policy, label: &str) -> Option<cgroup::Cgroup> {
        let group = self
            .cgroups
            .as_ref()?
            .create(label, self.memory_limit, self.max_processes);
        policy.cgroup_procs = group.procs_files();
        Some(group)
    }

    /// The program and arguments that start `program args` under `policy`.
    pub fn wrap(
        &self,
        policy: &Policy,
        program: &Path,
        args: &[OsString],
    ) -> (PathBuf, Vec<OsString>) {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("ferrepl"));
        let mut out: Vec<OsString> = vec![
            launcher::LAUNCH_ARG.into(),
            serde_json::to_string(policy).unwrap_or_default().into(),
            "--".into(),
            program.as_os_str().to_owned(),
        ];
        out.extend(args.iter().cloned());
        (exe, out)
    }
}

fn top_level(path: &Path) -> Option<PathBuf> {
    let mut comps = path.components();
    comps.next()?;
    let first = comps.next()?;
    Some(Path::new("/").join(first))
}

/// The directories an interpreter needs: its prefix, and for a venv the
/// base installation its symlinks lead to.
fn interpreter_dirs(python: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let prefix = |p: &Path| p.parent().and_then(Path::parent).map(Path::to_path_buf);
    if let Some(d) = prefix(python) {
        dirs.push(d);
    }
    if let Ok(real) = python.canonicalize()
        && let Some(d) = prefix(&real)
    {
        dirs.push(d);
    }
    if let Some(venv) = venv_of(python)
        && let Ok(cfg) = std::fs::read_to_string(venv.join("pyvenv.cfg"))
    {
        for line in cfg.lines() {
            if let Some(home) = line
                .strip_prefix("home")
                .map(|r| r.trim_start_matches([' ', '=']))
                && let Some(d) = Path::new(home.trim()).parent()
            {
                dirs.push(d.to_path_buf());
            }
        }
    }
    dirs
}

fn venv_of(python: &Path) -> Option<PathBuf> {
    let dir = python.parent()?.parent()?;
    dir.join("pyvenv.cfg").is_file().then(|| dir.to_path_buf())
}

/// Runs the launcher's probe with this configuration and describes what is
/// active; fails when --sandbox-require is set and something is missing.
pub fn probe(cfg: &SandboxConfig, workspace: &Path, tmp: &Path) -> anyhow::Result<String> {
    if !cfg.enabled() {
        return Ok("OFF: no OS confinement; sessions can read and write everything ferrepl can, and use the network".into());
    }
    std::fs::create_dir_all(tmp)?;
    let policy = cfg.policy(workspace, tmp, None);
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .arg(launcher::PROBE_ARG)
        .arg(serde_json::to_string(&policy)?)
        .output()?;
    if !out.status.success() {
        anyhow::bail!(
            "the sandbox cannot be applied on this system: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let applied: Applied = serde_json::from_slice(&out.stdout)?;
    let mut parts = vec![format!(
        "{}: Landlock filesystem {}",
        match cfg.mode {
            SandboxMode::ReadOnly => "read-only",
            _ => "workspace-write",
        },
        applied.landlock
    )];
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
        "network off (internet sockets refused)".into()
    } else {
        "network off requested but NOT enforced".into()
    });
    parts.push(format!(
        "no_new_privs {}",
        if applied.no_new_privs { "on" } else { "off" }
    ));
    if !applied.rlimits.is_empty() {
        parts.push(format!("rlimits: {}", applied.rlimits.join(", ")));
    }
    let cgroups = cfg.cgroups.as_ref();
    parts.push(match cfg.memory_limit {
        Some(b) if cgroups.is_some_and(|c| c.has_memory()) => format!(
            "memory limit {} MiB per session and per job (cgroup v1 memory, enforced by the kernel; also a process-tree watch)",
            b / (1024 * 1024)
        ),
        Some(b) => format!(
            "memory limit {} MiB per session (process-tree watch; no writable memory cgroup)",
            b / (1024 * 1024)
        ),
        None => "no memory limit".into(),
    });
    parts.push(if cgroups.is_some_and(|c| c.has_pids()) {
        format!(
            "at most {} processes per session (process-tree watch), and a kernel ceiling on tasks per session and per job (cgroup v1 pids)",
            cfg.max_processes
        )
    } else {
        format!(
            "at most {} processes per session (process-tree watch; no writable pids cgroup)",
            cfg.max_processes
        )
    });
    parts.push(
        "home directory hidden; HOME and TMPDIR are per-session temporary directories".into(),
    );
    let fully = applied.seccomp
        && applied.landlock.starts_with("fully")
        && applied.no_new_privs
        && (cfg.network || applied.network_blocked);
    if cfg.require && !fully {
        anyhow::bail!(
            "--sandbox-require: not every protection is available: {}",
            parts.join("; ")
        );
    }
    Ok(parts.join("; "))
}
