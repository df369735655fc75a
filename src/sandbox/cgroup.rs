//! Kernel-enforced limits per session through cgroups, where we may create
//! them: the memory and pids controllers of a cgroup v1 hierarchy that is
//! writable to us (as on this machine; the launcher moves itself into the
//! groups before it forks the program, so everything below is counted).
//!
//! cgroup v2 is not used: a process may only sit in a leaf, so using v2 needs
//! a delegated subtree (systemd `Delegate=`) that ferrepl would move itself
//! into; without one the process-tree watch enforces the limits instead.

use std::path::{Path, PathBuf};

/// The parent directories (one per controller) our session groups go under.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
    /// The cpu hierarchy's directory: where tenant groups get their weight.
    cpu: Option<PathBuf>,
    /// A tenant's groups: every session gets a memory group under it (so
    /// the tenant's budget counts it) and joins its cpu group.
    tenant: bool,
}

/// A tenant's groups (memory budget, CPU weight; session groups nest
/// inside). Dropping it removes them once their sessions are gone.
#[derive(Debug)]
pub struct TenantCgroup {
    dirs: Vec<PathBuf>,
}

impl Drop for TenantCgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            empty_and_remove(dir);
        }
    }
}

/// One session's (or job's) groups. Dropping it kills whatever is still in
/// them and removes them.
#[derive(Debug)]
pub struct Cgroup {
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
    /// The tenant's cpu group, joined but not owned.
    cpu: Option<PathBuf>,
    memory_limit: Option<u64>,
    max_tasks: u64,
}

const PREFIX: &str = "ferrepl-";

/// `<pid namespace inode>-<pid>-<start time>` of a process: unique among
/// live processes across pid namespaces and pid reuse.
fn identity(pid: &str) -> Option<String> {
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    let ns: String = ns
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    // Bytes, not text: a process may name itself with bytes that are not UTF-8.
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let stat = String::from_utf8_lossy(&stat);
    let start = stat
        .rsplit(')')
        .next()?
        .split_whitespace()
        .nth(19)?
        .to_string();
    let pid = if pid == "self" {
        std::process::id().to_string()
    } else {
        pid.to_string()
    };
    Some(format!("{ns}-{pid}-{start}"))
}

/// Our own identity, computed once.
fn own_identity() -> &'static str {
    static OWN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    OWN.get_or_init(|| identity("self").unwrap_or_else(|| format!("0-{}-0", std::process::id())))
}

impl CgroupRoot {
    /// The writable v1 memory and pids hierarchies of this process, or None.
    pub fn detect() -> Option<Self> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let dir_of = |controller: &str| -> Option<PathBuf> {
            let path = own.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
                list.split(',').any(|c| c == controller).then_some(path)
            })?;
            let dir = Path::new("/sys/fs/cgroup")
                .join(controller)
                .join(path.trim_start_matches('/'));
            usable(&dir).then_some(dir)
        };
        let root = Self {
            memory: dir_of("memory"),
            pids: dir_of("pids"),
            cpu: dir_of("cpu"),
            tenant: false,
        };
        if root.memory.is_none() && root.pids.is_none() {
            return None;
        }
        root.remove_stale();
        Some(root)
    }

    pub fn has_memory(&self) -> bool {
        self.memory.is_some()
    }

    pub fn has_pids(&self) -> bool {
        self.pids.is_some()
    }

    /// Creates the groups `ferrepl-<our identity>-<label>` with the limits.
    /// `pids.max` counts threads too, so it is a ceiling well above
    /// `max_processes` (which the process-tree watch enforces exactly).
    pub fn create(&self, label: &str, memory_limit: Option<u64>, max_processes: u64) -> Cgroup {
        let name = format!("{PREFIX}{}-{label}", own_identity());
        let make = |parent: &Option<PathBuf>, limits: &[(&str, String)]| {
            make_group(parent.as_deref()?, &name, limits)
        };
        let memory = match memory_limit {
            Some(limit) => make(&self.memory, &memory_limits(Some(limit))),
            None if self.tenant => make(&self.memory, &[]),
            None => None,
        };
        let tasks = task_ceiling(max_processes);
        let pids = make(&self.pids, &[("pids.max", tasks.to_string())]);
        Cgroup {
            memory,
            pids,
            cpu: self.cpu.clone().filter(|_| self.tenant),
            memory_limit,
            max_tasks: tasks,
        }
    }

    /// Groups for tenant `name` under ours, with its memory budget (memory
    /// and swap of all its sessions and jobs together) and CPU weight
    /// (1-10000, 100 the default share): the root its sessions' groups go in.
    pub fn tenant(
        &self,
        name: &str,
        memory: Option<u64>,
        cpu_weight: u64,
    ) -> (CgroupRoot, TenantCgroup) {
        let dir_name = format!("{PREFIX}{}-tenant-{name}", own_identity());
        let mut made = Vec::new();
        let mut make = |parent: &Option<PathBuf>, limits: &[(&str, String)]| {
            let dir = make_group(parent.as_deref()?, &dir_name, limits)?;
            made.push(dir.clone());
            Some(dir)
        };
        // cgroup v1 shares: 1024 is the default weight of 100.
        let shares = (cpu_weight.clamp(1, 10_000) * 1024 / 100).max(2);
        let root = CgroupRoot {
            memory: make(&self.memory, &memory_limits(memory)),
            pids: make(&self.pids, &[]),
            cpu: make(&self.cpu, &[("cpu.shares", shares.to_string())]),
            tenant: true,
        };
        (root, TenantCgroup { dirs: made })
    }

    /// Groups left by a ferrepl that died without cleaning up.
    fn remove_stale(&self) {
        for parent in [&self.memory, &self.pids, &self.cpu].into_iter().flatten() {
            let Ok(entries) = std::fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(rest) = name.strip_prefix(PREFIX) else {
                    continue;
                };
                let mut parts = rest.splitn(4, '-');
                let (Some(ns), Some(pid), Some(start)) = (parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                // Only groups of our pid namespace can be judged from here.
                let own_ns = own_identity().split('-').next().unwrap_or_default();
                if ns != own_ns {
                    continue;
                }
                let owner_alive =
                    identity(pid).is_some_and(|id| id == format!("{ns}-{pid}-{start}"));
                if !owner_alive {
                    empty_and_remove(&entry.path());
                }
            }
        }
    }
}

/// `parent/name`, made afresh (a leftover's counters would be stale), with
/// `limits` written; None (and no group) when a limit cannot be set.
fn make_group(parent: &Path, name: &str, limits: &[(&str, String)]) -> Option<PathBuf> {
    let dir = parent.join(name);
    if dir.exists() {
        empty_and_remove(&dir);
    }
    if let Err(e) = std::fs::create_dir(&dir) {
        tracing::warn!("cannot create cgroup {}: {e}", dir.display());
        return None;
    }
    for (file, value) in limits {
        // memsw (memory + swap) exists only with swap accounting.
        if let Err(e) = std::fs::write(dir.join(file), value)
            && !file.contains("memsw")
        {
            tracing::warn!("cannot set {file} of {}: {e}", dir.display());
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
    }
    Some(dir)
}

/// The memory (and memory + swap) limit files for `limit`.
fn memory_limits(limit: Option<u64>) -> Vec<(&'static str, String)> {
    limit
        .map(|m| {
            vec![
                ("memory.limit_in_bytes", m.to_string()),
                ("memory.memsw.limit_in_bytes", m.to_string()),
            ]
        })
        .unwrap_or_default()
}

/// Threads count against `pids.max`: numeric libraries start one per core.
fn task_ceiling(max_processes: u64) -> u64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    max_processes.saturating_mul(8).max(4096).max(cores * 64)
}

/// A cgroup directory we can create groups in.
fn usable(dir: &Path) -> bool {
    if !dir.join("cgroup.procs").is_file() {
        return false;
    }
    let probe = dir.join(format!("{PREFIX}{}-probe", std::process::id()));
    let ok = std::fs::create_dir(&probe).is_ok();
    let _ = std::fs::remove_dir(&probe);
    ok
}

impl Cgroup {
    /// The `cgroup.procs` files the launcher writes itself into.
    pub fn procs_files(&self) -> Vec<String> {
        self.dirs()
            .chain(&self.cpu)
            .map(|d| d.join("cgroup.procs").display().to_string())
            .collect()
    }

    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.memory, &self.pids].into_iter().flatten()
    }

    /// Which kernel limit was reached, if one was: "went over its memory
    /// limit of ..." (the caller names the session or job and says what
    /// happened next).
    pub fn limit_hit(&self) -> Option<String> {
        if self.oom_kills() > 0 {
            return Some(format!(
                "went over its memory limit of {} (--memory-limit; the kernel's memory cgroup killed a process)",
                crate::units::human_bytes(self.memory_limit.unwrap_or(0))
            ));
        }
        None
    }

    /// For a job's result: the kernel refused to start more tasks.
    pub fn task_limit_note(&self) -> Option<String> {
        (self.fork_refusals() > 0).then(|| {
            format!(
                "reached the ceiling of {} processes and threads (pids cgroup; a fork bomb?): the kernel refused to start more",
                self.max_tasks
            )
        })
    }

    /// Processes the kernel killed for going over the memory limit.
    pub fn oom_kills(&self) -> u64 {
        let Some(dir) = &self.memory else { return 0 };
        let text = std::fs::read_to_string(dir.join("memory.oom_control")).unwrap_or_default();
        counter(&text, "oom_kill")
    }

    /// Forks refused because the process limit was reached.
    pub fn fork_refusals(&self) -> u64 {
        let Some(dir) = &self.pids else { return 0 };
        let text = std::fs::read_to_string(dir.join("pids.events")).unwrap_or_default();
        counter(&text, "max")
    }

    /// SIGKILL to every member until none is left.
    pub fn kill_all(&self) {
        for dir in self.dirs() {
            kill_members(dir);
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for dir in self.dirs() {
            empty_and_remove(dir);
        }
    }
}

fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or(0)
}

fn read_procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn kill_members(dir: &Path) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for _ in 0..100 {
        let pids = read_procs(dir);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

fn empty_and_remove(dir: &Path) {
    // A tenant's group holds its sessions' groups: those go first.
    if let Ok(children) = std::fs::read_dir(dir) {
        for child in children.filter_map(Result::ok) {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                empty_and_remove(&child.path());
            }
        }
    }
    kill_members(dir);
    // A killed process leaves the group only once it is reaped; its parent
    // (our launcher or the server) may take a moment.
    for _ in 0..200 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
        }
    }
    tracing::warn!("cannot remove cgroup {}", dir.display());
}

#[cfg(test)]
mod tests {
    use super::counter;

    #[test]
    fn counters_are_read_by_name() {
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(counter(oom, "oom_kill"), 3);
        assert_eq!(counter("max 7\n", "max"), 7);
        assert_eq!(counter("", "max"), 0);
    }
}
