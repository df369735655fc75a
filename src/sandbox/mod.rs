//! OS-level confinement of workers and shell jobs (see docs/security.md).
//!
//! The server builds a [`Policy`] per process it starts and runs the program
//! through the launcher (`ferrepl __ferrepl-launch`), which applies it in a
//! single-threaded process and stays behind as a subreaper. Memory and
//! process-count limits are enforced by the server watching process trees.

pub mod cgroup;
pub mod client;
pub mod env;
pub mod launcher;
#[cfg(target_os = "linux")]
mod namespaces;
pub mod paths;
pub mod places;
#[cfg(target_os = "linux")]
mod privileges;
mod probe;
pub mod protected;
#[cfg(target_os = "linux")]
mod pty;
#[cfg(target_os = "linux")]
mod relay;
#[cfg(target_os = "linux")]
mod seccomp;
#[cfg(target_os = "linux")]
mod supervisor;
pub mod uids;
#[cfg(target_os = "linux")]
mod userns;
pub mod view;
pub mod watch;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use probe::{probe, short_description};

/// What the network namespace lets through (--network).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Network {
    Off,
    /// Package installers reach the indexes through the proxy; nothing else.
    Packages,
    /// As packages, and cells and shell jobs reach the --allow-domain hosts
    /// through a proxy of their own.
    Domains,
    On,
}

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

/// A uid and gid: the ones a root server's sandboxed programs run as, or
/// the owner of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

/// A path put back into a namespace's file system view.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Bind {
    pub path: String,
    pub writable: bool,
    /// Shown through an idmapped mount: files of this owner appear as the
    /// program's own, and what it creates is stored as this owner's.
    #[serde(default)]
    pub idmap: Option<Identity>,
}

/// A symlink in the view (`path` -> `target`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkEntry {
    pub path: String,
    pub target: String,
}

/// A small file written into the view (`/etc/passwd`, `/etc/group`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub content: String,
}

/// How the launcher builds the file system view in its namespaces: a new
/// root, empty but for these.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MountPlan {
    /// Paths bound at their own place (read-only unless writable).
    pub binds: Vec<Bind>,
    #[serde(default)]
    pub links: Vec<LinkEntry>,
    #[serde(default)]
    pub files: Vec<FileEntry>,
    /// Host devices beyond the standard few (--allow-device).
    pub devices: Vec<String>,
    /// Size of the private /dev/shm.
    pub shm_bytes: u64,
    /// The process's own temporary directory: `/tmp` points to it.
    #[serde(default)]
    pub tmp: String,
    /// Directories made only on the way to a bound path (ferrepl's state
    /// above the temporary directory, the workspace's parents): made
    /// execute-only, so a path through them works but nothing lists them.
    #[serde(default)]
    pub sealed: Vec<String>,
}

/// PID 1 listens on 127.0.0.1:`port` in the program's network namespace and
/// relays to the proxy's Unix `socket`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EgressRelay {
    pub port: u16,
    pub socket: String,
}

/// The launcher's instructions for one process.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Policy {
    pub read: Vec<String>,
    pub write: Vec<String>,
    /// Directories that may be listed (not read) beneath.
    #[serde(default)]
    pub list: Vec<String>,
    pub network: bool,
    pub landlock: bool,
    pub seccomp: bool,
    pub require: bool,
    pub max_file_bytes: Option<u64>,
    pub max_open_files: Option<u64>,
    pub max_processes: Option<u64>,
    /// The program's whole environment (nothing else is inherited).
    pub env: BTreeMap<String, String>,
    /// `cgroup.procs` files the launcher moves itself into before forking.
    #[serde(default)]
    pub cgroup_procs: Vec<String>,
    /// Private namespaces and the file system view inside them (None: the
    /// kernel does not allow them; Landlock and seccomp still apply).
    pub mounts: Option<MountPlan>,
    /// The program's working directory, entered after the mounts.
    #[serde(default)]
    pub cwd: String,
    /// The server: the launcher refuses to run once it is gone.
    #[serde(default)]
    pub server_pid: u32,
    /// Package installers: the only way out of their empty network
    /// namespace is this relay to the server's egress proxy.
    pub egress: Option<EgressRelay>,
    /// Give the program a terminal of the namespace's own devpts (relayed to
    /// the server's pty).
    #[serde(default)]
    pub pty: bool,
    /// The uid and gid the program runs as (a root server's sessions; with
    /// namespaces only). None: the launcher's own.
    #[serde(default)]
    pub identity: Option<Identity>,
    /// Apply everything, then print what is active instead of exec'ing.
    #[serde(default)]
    pub probe: bool,
    /// Places no process of the program's may create, change, rename or
    /// remove (enforced by the launcher's supervisor); None: none.
    #[serde(default)]
    pub protected: Option<protected::Protected>,
    /// IPv4/IPv6 sockets inside its empty network namespace (a Jupyter
    /// kernel binds loopback for pipes of its own); applied only with that
    /// namespace, where there is nothing to reach.
    #[serde(default)]
    pub inet_in_netns: bool,
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
    #[serde(default)]
    pub capabilities_dropped: bool,
    #[serde(default)]
    pub namespaces: bool,
    /// The uid the program ended up with.
    #[serde(default)]
    pub uid: u32,
    /// Whether the supervisor of protected places answered (None: none
    /// was asked for; Some(error) where it could not be set up).
    #[serde(default)]
    pub protection: Option<Result<(), String>>,
}

/// How the launcher reports Landlock fully enforced.
pub const LANDLOCK_FULL: &str = "fully enforced";

impl Applied {
    pub fn landlock_full(&self) -> bool {
        self.landlock == LANDLOCK_FULL
    }
}

/// The server's sandbox settings, fixed at start.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    pub network: bool,
    pub require: bool,
    pub memory_limit: Option<u64>,
    pub max_processes: u64,
    pub max_file_bytes: u64,
    pub max_open_files: u64,
    /// The workspace root (--workdir): the only place sessions write.
    pub workspace: PathBuf,
    /// The server's private state directory (policies handed to launchers).
    pub state: PathBuf,
    /// The system part of the view (an allow-list: view.rs).
    pub view: view::View,
    /// Readable beyond the system: the operator's interpreters, uv, R, PATH
    /// entries, --allow-read.
    pub read: Vec<PathBuf>,
    /// Readable by package installers only: the CA bundle of the
    /// operator's pip configuration.
    pub installer_read: Vec<PathBuf>,
    /// Writable beyond the workspace: the operator's venvs, --allow-write.
    pub write: Vec<PathBuf>,
    /// Host devices added to the private /dev (--allow-device).
    pub devices: Vec<PathBuf>,
    /// Interpreters and venvs python_sessions may name outside the workspace.
    pub allowed_python: Vec<PathBuf>,
    /// The relay to the egress proxy given to package installers
    /// (`--network packages` with namespaces).
    pub egress: Option<EgressRelay>,
    /// What installers may reach, for the status line.
    pub egress_hosts: Vec<String>,
    /// The relay to the cells' egress proxy given to every other sandboxed
    /// process, sessions and shell jobs (`--network domains`).
    pub cell_egress: Option<EgressRelay>,
    /// Whether private namespaces work here (found by the probe).
    pub namespaces: bool,
    /// The environment every process starts from (allow-list + --pass-env).
    pub env: BTreeMap<String, String>,
    /// What the probe found active, for server_status and the log.
    pub active: String,
    /// Where per-session cgroups can be made (None: the limits are enforced
    /// by the process-tree watch alone).
    pub cgroups: Option<cgroup::CgroupRoot>,
    /// The uid and gid sessions run as (a root server with namespaces);
    /// None: the server's own.
    pub identity: Option<Identity>,
    /// Whether idmapped mounts work here (real root, a file system that
    /// allows them): operator-named places owned by another uid are shown
    /// as the sessions' own.
    pub idmap: bool,
    /// --allow-read paths (idmapped like the workspace and --allow-write).
    pub named_read: Vec<PathBuf>,
    /// The owner of each idmapped place, fixed when the identity is set.
    pub idmapped: Vec<(PathBuf, Identity)>,
    /// Why sessions do not run as `identity` after all, or not through
    /// idmapped mounts (found by the probe).
    pub identity_gap: Option<String>,
    /// Why there are no private namespaces (found by the probe; None where
    /// they work, or the sandbox is off).
    pub namespaces_gap: Option<String>,
    /// Protected places in what sessions share with the host (None: the
    /// sandbox is off or the workspace read-only, or every name is freed).
    pub protected: Option<protected::Protected>,
}

/// The owner of `path` (following symlinks), if it exists.
pub fn owner_of(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Identity {
        uid: meta.uid(),
        gid: meta.gid(),
    })
}

/// Device paths sessions and jobs may open for writing (with namespaces
/// the private ones; without, the host's /dev/pts and /dev/shm stay shared).
const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
];

static NEXT_POLICY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl SandboxConfig {
    pub fn enabled(&self) -> bool {
        self.mode != SandboxMode::Off
    }

    /// The environment of a process with temporary directory `tmp`: the
    /// inherited allow-list, HOME and TMPDIR, then `extra` (agent-given
    /// variables were checked by `env::check`).
    pub fn environment(
        &self,
        tmp: Option<&Path>,
        extra: &[(String, String)],
    ) -> BTreeMap<String, String> {
        let mut env = self.env.clone();
        if let Some(tmp) = tmp {
            env.insert("HOME".into(), tmp.display().to_string());
            env.insert("TMPDIR".into(), tmp.display().to_string());
        }
        for (k, v) in extra {
            env.insert(k.clone(), v.clone());
        }
        env
    }

    /// The policy of one process: `tmp` its own temporary directory (also
    /// HOME and TMPDIR), `cwd` where it starts, `env` its environment. The
    /// same for every process but for these: no tool argument reaches it.
    pub fn policy(&self, tmp: &Path, cwd: &Path, env: BTreeMap<String, String>) -> Policy {
        let show = |p: &Path| p.display().to_string();
        let workspace_writable = self.mode == SandboxMode::WorkspaceWrite;
        // Landlock reads the same allow-list the view is built from (without
        // namespaces it is the whole rule set).
        let mut read: Vec<String> = self.view.binds.iter().map(|p| show(p)).collect();
        read.extend(["/proc", "/etc/passwd", "/etc/group"].map(String::from));
        read.push(show(&self.workspace));
        read.extend(self.read.iter().map(|p| show(p)));
        // Device nodes one by one, never all of /dev (without namespaces
        // that would be the host's /dev/kmsg, loop devices, terminals...).
        let mut write = vec![show(tmp)];
        write.extend(WRITABLE_DEVICES.iter().map(|d| d.to_string()));
        if workspace_writable {
            write.push(show(&self.workspace));
        }
        write.extend(self.write.iter().map(|p| show(p)));
        write.extend(self.devices.iter().map(|p| show(p)));
        let mounts = self
            .namespaces
            .then(|| self.mount_plan(tmp, workspace_writable));
        let protected = match &self.protected {
            Some(p) if workspace_writable || !self.write.is_empty() => {
                let mut p = p.clone();
                p.unshared = write.iter().map(PathBuf::from).collect();
                Some(p)
            }
            _ => None,
        };
        Policy {
            read,
            write,
            // Inside the view every name is allow-listed: listing is harmless.
            list: if self.namespaces {
                vec!["/".into()]
            } else {
                Vec::new()
            },
            network: self.network,
            landlock: true,
            seccomp: true,
            require: self.require,
            max_file_bytes: Some(self.max_file_bytes),
            max_open_files: Some(self.max_open_files),
            max_processes: Some(self.max_processes),
            env,
            cgroup_procs: Vec::new(),
            mounts,
            cwd: show(cwd),
            server_pid: std::process::id(),
            pty: false,
            identity: if self.namespaces { self.identity } else { None },
            egress: None,
            probe: false,
            protected,
            inet_in_netns: false,
        }
    }

    /// The view of a process whose temporary directory is `tmp`: the system
    /// allow-list, the workspace, `tmp` alone, the operator's paths, and
    /// accounts naming the process's uid with `tmp` as its home.
    fn mount_plan(&self, tmp: &Path, workspace_writable: bool) -> MountPlan {
        let show = |p: &Path| p.display().to_string();
        let bind = |p: &Path, writable: bool| Bind {
            path: show(p),
            writable,
            idmap: self
                .idmapped
                .iter()
                .find(|(q, _)| q.as_path() == p)
                .map(|(_, owner)| *owner),
        };
        let mut binds: Vec<Bind> = self.view.binds.iter().map(|p| bind(p, false)).collect();
        let system = binds.len();
        binds.push(bind(&self.workspace, workspace_writable));
        binds.push(bind(tmp, true));
        binds.extend(self.read.iter().map(|p| bind(p, false)));
        binds.extend(self.write.iter().map(|p| bind(p, true)));
        // The parents of the system entries (/etc, /var/cache, /sys/...)
        // hold only allow-listed names; the others hold private ones.
        let open: Vec<&Path> = self.view.binds.iter().flat_map(|p| p.ancestors()).collect();
        let mut sealed: Vec<String> = binds[system..]
            .iter()
            .flat_map(|b| Path::new(&b.path).ancestors().skip(1))
            .filter(|a| *a != Path::new("/") && !open.contains(a))
            .map(show)
            .collect();
        sealed.sort();
        sealed.dedup();
        let id = self.program_identity();
        let (passwd, group) = self.view.accounts(id.uid, id.gid, &show(tmp));
        MountPlan {
            binds,
            links: self
                .view
                .links
                .iter()
                .map(|l| LinkEntry {
                    path: show(&l.path),
                    target: show(&l.target),
                })
                .collect(),
            files: vec![
                FileEntry {
                    path: "/etc/passwd".into(),
                    content: passwd,
                },
                FileEntry {
                    path: "/etc/group".into(),
                    content: group,
                },
            ],
            devices: self.devices.iter().map(|p| show(p)).collect(),
            shm_bytes: self.memory_limit.unwrap_or(1 << 30),
            tmp: show(tmp),
            sealed,
        }
    }

    /// The uid and gid sandboxed programs run as.
    pub fn program_identity(&self) -> Identity {
        match (self.namespaces, self.identity) {
            (true, Some(id)) => id,
            _ => Identity {
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
            },
        }
    }

    /// Sessions run as `identity` (None: the server's uid). With idmapped
    /// mounts, --allow-write and --allow-read paths owned by another uid,
    /// and the workspace unless `owns_workspace`, are shown as the
    /// sessions' own.
    pub fn set_identity(&mut self, identity: Option<Identity>, owns_workspace: bool) {
        self.identity = identity;
        self.idmapped.clear();
        if let Some(id) = identity {
            // Its accounts' names: the owner's, where it is a known user.
            let (user, group) = view::account_names(id.uid, id.gid);
            self.view.user = user;
            self.view.group = group;
        }
        let (Some(id), true) = (identity, self.idmap) else {
            return;
        };
        let workspace = (!owns_workspace).then_some(&self.workspace);
        let named = workspace
            .into_iter()
            .chain(&self.write)
            .chain(&self.named_read);
        for path in named {
            if let Some(owner) = owner_of(path)
                && owner.uid != id.uid
                && !self.idmapped.iter().any(|(p, _)| p == path)
            {
                self.idmapped.push((path.clone(), owner));
            }
        }
    }

    /// Whether the workspace is shown through an idmapped mount.
    pub fn workspace_idmapped(&self) -> bool {
        self.idmapped.iter().any(|(p, _)| *p == self.workspace)
    }

    /// A package installer's policy also reads the operator's CA bundle.
    pub fn add_installer_reads(&self, policy: &mut Policy) {
        self.add_reads(policy, &self.installer_read);
    }

    /// `paths` readable (and in the view, read-only) besides the policy's.
    pub fn add_reads(&self, policy: &mut Policy, paths: &[PathBuf]) {
        for path in paths {
            let path = path.display().to_string();
            policy.read.push(path.clone());
            if let Some(plan) = policy.mounts.as_mut() {
                plan.binds.push(Bind {
                    path,
                    writable: false,
                    idmap: None,
                });
            }
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
    /// The policy goes to the launcher in a file of the private state
    /// directory (the launcher removes it), not on a command line every
    /// process can read; its SHA-256 goes on the command line.
    pub fn wrap(
        &self,
        policy: &Policy,
        program: &Path,
        args: &[OsString],
    ) -> std::io::Result<(PathBuf, Vec<OsString>)> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // The running binary itself, never a path name: the file at the path
        // may have been replaced (a binary inside the workspace can be
        // deleted and its "(deleted)" name planted by a session).
        let exe = PathBuf::from("/proc/self/exe");
        let n = NEXT_POLICY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = self.state.join(format!("policy-{n}.json"));
        let json = serde_json::to_vec(policy).map_err(std::io::Error::other)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&file)?
            .write_all(&json)?;
        // The file's digest travels on the command line, which nobody else
        // can change: a policy swapped in the file is refused.
        let mut at = OsString::from("@");
        at.push(file.as_os_str());
        at.push(format!("#{}", launcher::digest(&json)));
        let mut out: Vec<OsString> = vec![
            launcher::LAUNCH_ARG.into(),
            at,
            "--".into(),
            program.as_os_str().to_owned(),
        ];
        out.extend(args.iter().cloned());
        Ok((exe, out))
    }
}
