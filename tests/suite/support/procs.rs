//! Processes as the test sees them in /proc: liveness, descendants, argv,
//! memory, signals, and the translation of the pids a session or a job
//! prints (pids of its own PID namespace) to the test's pids.
//!
//! Every session and shell job runs in a PID namespace of its own: the pids
//! a cell or a job prints (`os.getpid()`, `Popen(...).pid`, `$!`) are pids of
//! that namespace. `host_pid*` translate them to the pids the test (in the
//! server's namespace) sees, through `/proc/<pid>/status` `NSpid:` (the
//! process's pid in each namespace it is in, outermost first).

use std::path::Path;
use std::time::Duration;

use super::stdio::StdioServer;

/// How long the translation waits for a just-started process to show up.
const HOST_PID_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `pid` names a live (non-zombie) process.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // The state letter follows the parenthesised command name.
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next())
                .unwrap_or("?");
            !matches!(state, "Z" | "X" | "x")
        }
    }
}

/// Wait (bounded) for `pid` to disappear; true once it is gone.
pub async fn wait_process_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if !process_alive(pid) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Wait (bounded) for a file to exist and hold a full line; returns its text.
pub async fn wait_for_file_line(path: &Path, timeout: Duration) -> String {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} did not appear within {timeout:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// SIGKILL `pid` (whether or not it is still there).
pub fn sigkill(pid: u32) {
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

/// Kills, when the test ends (passing or not), whatever is still alive of
/// the processes it made the sandbox start: those with one of `markers` in
/// their argv, and the given pids whose argv still holds the expected
/// argument. So a failing run leaves no `sleep 1000` behind.
#[derive(Default)]
pub struct Reaper {
    pub markers: Vec<String>,
    pub pids: Vec<(u32, String)>,
}

impl Reaper {
    /// A reaper of whatever carries `marker` in its argv.
    pub fn of_marker(marker: &str) -> Self {
        Reaper {
            markers: vec![marker.to_string()],
            pids: Vec::new(),
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for marker in &self.markers {
            for pid in processes_with_arg(marker) {
                sigkill(pid);
            }
        }
        for (pid, arg) in &self.pids {
            if cmdline(*pid).is_some_and(|argv| argv.iter().any(|a| a == arg)) {
                sigkill(*pid);
            }
        }
    }
}

/// The argv of a process as the test sees it, or None when it is gone.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    if !process_alive(pid) {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if raw.is_empty() {
        return None;
    }
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Live processes (seen from the test) with `marker` as one of their arguments.
pub fn processes_with_arg(marker: &str) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|pid| cmdline(*pid).is_some_and(|argv| argv.iter().any(|a| a == marker)))
        .collect()
}

/// Resident set size of a process, in KiB, from /proc/<pid>/status.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS line in /proc/{pid}/status:\n{status}"))
}

/// Every pid in the test's /proc.
fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The parent of `pid`, from /proc/<pid>/stat.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// The live descendants of `ancestor` (not itself), as host pids.
pub fn descendants(ancestor: u32) -> Vec<u32> {
    let parents: std::collections::HashMap<u32, u32> = all_pids()
        .into_iter()
        .filter_map(|pid| Some((pid, parent_pid(pid)?)))
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![ancestor];
    while let Some(parent) = frontier.pop() {
        for (&pid, &ppid) in &parents {
            if ppid == parent && pid != ancestor && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found.retain(|pid| process_alive(*pid));
    found
}

// ------------------------------------------------------------------ pid namespaces

/// Python lines defining `_os` and `_pid_ns`, the interpreter's PID
/// namespace as `pid:[inode]` (the same string the test reads from
/// `/proc/<pid>/ns/pid` on its side).
pub const PID_PROBE_LINES: &str = "import os as _os\n_pid_ns = _os.readlink('/proc/self/ns/pid')";

/// A cell's code whose value is `'pid:[inode] <pid>'`: the interpreter's PID
/// namespace and its pid there (parse with `parse_namespaced_pids`).
pub fn pid_probe_code() -> String {
    format!("{PID_PROBE_LINES}\n'%s %d' % (_pid_ns, _os.getpid())")
}

/// Parses a cell value `'pid:[inode] PID PID...'` into the namespace and
/// the pids.
pub fn parse_namespaced_pids(value: Option<&str>) -> (String, Vec<u32>) {
    let text = value
        .unwrap_or_else(|| panic!("expected 'pid:[inode] PID...' as the cell's value, got None"))
        .trim()
        .trim_matches(|c| c == '\'' || c == '"');
    let mut words = text.split_whitespace();
    let namespace = words
        .next()
        .filter(|w| w.starts_with("pid:["))
        .unwrap_or_else(|| panic!("no pid namespace at the start of {text:?}"))
        .to_string();
    let pids = words
        .map(|w| {
            w.parse::<u32>()
                .unwrap_or_else(|_| panic!("{w:?} is not a pid in {text:?}"))
        })
        .collect();
    (namespace, pids)
}

/// The pids of `pid` in each PID namespace it is in, outermost (the test's)
/// first, innermost (its own) last; None when it is gone.
pub fn ns_pids(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Vec<u32> = line
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    (!pids.is_empty()).then_some(pids)
}

/// `pid:[inode]`, the PID namespace of `pid`; None when it is gone.
pub fn pid_namespace(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// Polls (bounded) until `candidates` yields exactly one pid; panics with
/// `what` when none shows up, or at once when several match.
fn unique_pid(what: &str, candidates: impl Fn() -> Vec<u32>) -> u32 {
    let deadline = std::time::Instant::now() + HOST_PID_TIMEOUT;
    loop {
        match candidates()[..] {
            [pid] => return pid,
            [] => {}
            ref several => panic!("{what} is ambiguous: host pids {several:?} all match"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: no such live process within {HOST_PID_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The host pid of the live descendant of `ancestor` (e.g. the server's pid,
/// or a job's launcher) whose pid in its own namespace is `inner`. Panics
/// when there is none (after a short bounded wait) or several (two sessions
/// each have a pid 2: pass a narrower ancestor, or use
/// `host_pid_in_namespace`).
pub fn host_pid(ancestor: u32, inner: u32) -> u32 {
    unique_pid(
        &format!("the descendant of {ancestor} with pid {inner} in its own PID namespace"),
        || {
            descendants(ancestor)
                .into_iter()
                .filter(|pid| ns_pids(*pid).and_then(|p| p.last().copied()) == Some(inner))
                .collect()
        },
    )
}

/// The host pid of the live process that is `inner` in the PID namespace
/// `namespace` (`pid:[inode]`, as `PID_PROBE_LINES` reads it in a session).
pub fn host_pid_in_namespace(namespace: &str, inner: u32) -> u32 {
    unique_pid(
        &format!("the process with pid {inner} in {namespace}"),
        || {
            all_pids()
                .into_iter()
                .filter(|pid| {
                    ns_pids(*pid).and_then(|p| p.last().copied()) == Some(inner)
                        && pid_namespace(*pid).as_deref() == Some(namespace)
                        && process_alive(*pid)
                })
                .collect()
        },
    )
}

/// The host pid of the interpreter of `session` (started if need be), found
/// from a cell's own view of its pid and namespace.
pub async fn session_host_pid(server: &StdioServer, session: &str) -> u32 {
    let out = server.exec_in(session, &pid_probe_code()).await;
    out.assert_ok();
    let (namespace, pids) = parse_namespaced_pids(out.value());
    host_pid_in_namespace(&namespace, pids[0])
}

/// The PID namespace (`pid:[inode]`) of `session`'s interpreter.
pub async fn session_pid_namespace(server: &StdioServer, session: &str) -> String {
    let out = server.exec_in(session, &pid_probe_code()).await;
    out.assert_ok();
    parse_namespaced_pids(out.value()).0
}

/// Has the default session start `sleep 300` and returns the HOST pids of
/// (worker, sleep), both checked alive: what a shutdown must take down.
/// (Inside the session, pids are those of its private PID namespace.)
pub async fn worker_with_a_sleeping_child(server: &StdioServer) -> (u32, u32) {
    let started = server
        .exec(&format!(
            "import subprocess\n_sleeper = subprocess.Popen(['sleep', '300'])\n{PID_PROBE_LINES}\n\
             '%s %d %d' % (_pid_ns, _os.getpid(), _sleeper.pid)"
        ))
        .await;
    started.assert_ok();
    let (namespace, inner) = parse_namespaced_pids(started.value());
    let [worker_inner, sleep_inner] = inner[..] else {
        panic!("expected two pids in {:?}", started.value());
    };
    let worker_pid = host_pid_in_namespace(&namespace, worker_inner);
    let sleep_pid = host_pid_in_namespace(&namespace, sleep_inner);
    let server_pid = server.pid();
    for (what, pid) in [("worker", worker_pid), ("sleep", sleep_pid)] {
        assert!(
            descendants(server_pid).contains(&pid),
            "the {what} (host pid {pid}) is not a descendant of the server {server_pid}"
        );
        assert!(process_alive(pid), "the {what} (host pid {pid}) is alive");
    }
    (worker_pid, sleep_pid)
}
