//! The uid boundary: a root server runs sessions, shell jobs, installs and R
//! as a uid that is not root (each tenant its own; alone, the workspace's
//! owner, or a uid of --tenant-uids with a root-owned workspace shown as its
//! own through an idmapped mount), so one tenant's 0600 file stays closed to
//! another even where a view shows it. Uids come from the host's table
//! (--uid-table; the suite's own here), one per (state directory, workspace,
//! tenant): two instances never share one, and a restart keeps each, with
//! or without --resume. Where the boundary is missing (root without
//! namespaces, tenants of an unprivileged server) the status says DEGRADED,
//! --sandbox-require refuses to start, and so do tenants unless
//! --allow-degraded-isolation accepts it.
//!
//! Run as root (CI) the tests assert the boundary; run as an unprivileged
//! user (scripts/escape-unprivileged.sh) they assert what a laptop gets:
//! every process runs as the server's own uid, and only tenants (which
//! would share it) make the status say DEGRADED. Uids are read from the
//! outside too: `/proc/<pid>/status` of the process the session or job is,
//! found through its PID namespace.
//!
//! `mod.rs` holds the tokens, the uids and owners read from the host, the
//! servers' launches and what a session or job is seen running as; one
//! file per part of the boundary: `one_tenant.rs` (a server alone),
//! `tenants.rs` (a uid per tenant), `uid_table.rs` (the host's table
//! shared by instances), `degraded.rs` (where the boundary is missing) and
//! `installs_and_r.rs` (install jobs and R sessions).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};

use crate::support::{
    HttpServer, Launch, ToolOutput, call, cmdline, descendants, host_pid_in_namespace, is_root,
    ns_pids, path_str, server_command, test_uid_table,
};

const ALICE: &str = "uids-alice-token-0123456789abcdef";
const BOB: &str = "uids-bob-token-0123456789abcdef00";

/// A workspace owner that is no account here (a project of some user's).
const OWNER: u32 = 4242;
/// The owner of a venv in the install test (another user again).
const VENV_OWNER: u32 = 4243;

/// The numbers of a `/proc/<pid>/status` line such as `Uid:` (real,
/// effective, saved, filesystem).
fn proc_ids(pid: u32, key: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} line in /proc/{pid}/status:\n{status}"))
        .split_whitespace()
        .map(|n| n.parse().expect("an id"))
        .collect()
}

/// The gid that goes with a session's `uid`: the same number where a root
/// server chose it, the server's own gid where the session has the
/// server's uid (unprivileged).
fn gid_of(uid: u32) -> u32 {
    if is_root() {
        uid
    } else {
        nix::unistd::getegid().as_raw()
    }
}

/// Panics unless all four uids of host process `pid` are `uid` and all
/// four gids `gid_of(uid)`.
fn assert_runs_as(pid: u32, uid: u32, what: &str) {
    let (uids, gids) = (proc_ids(pid, "Uid:"), proc_ids(pid, "Gid:"));
    assert_eq!(uids, vec![uid; 4], "{what} (host pid {pid}): Uid line");
    assert_eq!(
        gids,
        vec![gid_of(uid); 4],
        "{what} (host pid {pid}): Gid line"
    );
}

fn owner(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .uid()
}

/// A workspace and a state directory that outlive the servers of a test
/// (both made before a server starts, so they can be prepared).
struct Place {
    workspace: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Place {
    fn new() -> Self {
        Place {
            workspace: tempfile::tempdir().expect("workspace"),
            state: tempfile::tempdir().expect("state directory"),
        }
    }

    fn ws(&self) -> &Path {
        self.workspace.path()
    }

    /// `--workdir`, `--state-dir`, `--tenant-uids range`, no warm pool,
    /// then `extra`.
    fn launch(&self, range: &str, extra: &[&str]) -> Launch {
        launch_at(self.ws(), self.state.path(), range, extra)
    }

    /// This place's keys in the host's uid table (the suite's
    /// `--uid-table`): tenant ("*" alone) to uid; empty when it has none.
    fn uid_table(&self) -> serde_json::Map<String, Value> {
        uid_entries(self.ws(), self.state.path())
    }
}

/// `--workdir workspace --state-dir state --tenant-uids range`, no warm
/// pool, then `extra`.
fn launch_at(workspace: &Path, state: &Path, range: &str, extra: &[&str]) -> Launch {
    let mut args = vec![
        "--workdir",
        path_str(workspace),
        "--state-dir",
        path_str(state),
        "--tenant-uids",
        range,
        "--warm-pool",
        "0",
    ];
    args.extend_from_slice(extra);
    Launch::new(&args).without_workdir_flag()
}

/// The keys of the instance on `workspace` and `state` in the host's uid
/// table (tests/suite/support's `--uid-table`): tenant to uid.
fn uid_entries(workspace: &Path, state: &Path) -> serde_json::Map<String, Value> {
    let real = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let (ws, state) = (real(workspace), real(state));
    let Ok(text) = std::fs::read_to_string(test_uid_table()) else {
        return serde_json::Map::new();
    };
    let table: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the uid table is not JSON ({e}): {text}"));
    let entries = table["entries"].as_array().cloned().unwrap_or_default();
    entries
        .iter()
        .filter(|e| e["state_dir"].as_str() == state.to_str())
        .filter(|e| {
            let w = PathBuf::from(e["workspace"].as_str().unwrap_or_default());
            w == ws || w.parent() == Some(ws.as_path())
        })
        .map(|e| {
            let tenant = e["tenant"].as_str().expect("a tenant").to_string();
            (tenant, e["uid"].clone())
        })
        .collect()
}

/// Panics unless `uid` lies in `range` ("START-END").
fn assert_in_range(uid: u32, range: &str) {
    let (a, b) = range.split_once('-').expect("START-END");
    let (a, b): (u32, u32) = (a.parse().expect("start"), b.parse().expect("end"));
    assert!(
        (a..=b).contains(&uid),
        "uid {uid} is not from --tenant-uids {range}"
    );
}

/// The `sandbox: ...` line of python_sessions {action: status}.
async fn sandbox_line(peer: &Peer<RoleClient>) -> String {
    let status = call(peer, "python_sessions", json!({ "action": "status" })).await;
    assert!(!status.is_error, "{status:#?}");
    status.structured["server"]["sandbox"]
        .as_str()
        .unwrap_or_else(|| panic!("no server.sandbox in {status:#?}"))
        .to_string()
}

/// What a session says of itself and the host pid of its interpreter.
struct Seen {
    uid: u32,
    gid: u32,
    host_pid: u32,
}

/// Runs a cell in `session` printing its uids and its pid in its own PID
/// namespace, and finds its interpreter on the host; `extra` runs first.
async fn seen_in(peer: &Peer<RoleClient>, session: &str, extra: &str) -> (Seen, ToolOutput) {
    let code = format!(
        "{extra}\nimport json as _j, os as _o\n\
         print('IDS', _j.dumps([_o.getuid(), _o.geteuid(), _o.getgid(), _o.getegid(), \
         _o.readlink('/proc/self/ns/pid'), _o.getpid()]))"
    );
    let out = call(
        peer,
        "python_exec",
        json!({ "code": code, "session": session, "wait_s": 30 }),
    )
    .await;
    out.assert_ok();
    let line = out
        .str_field("stdout")
        .lines()
        .find_map(|l| l.strip_prefix("IDS "))
        .unwrap_or_else(|| panic!("no IDS line: {out:#?}"))
        .to_string();
    let v: Vec<Value> = serde_json::from_str(&line).expect("the IDS line is JSON");
    let n = |i: usize| v[i].as_u64().expect("a number") as u32;
    assert_eq!((n(0), n(2)), (n(1), n(3)), "real and effective ids: {line}");
    let host_pid = host_pid_in_namespace(v[4].as_str().expect("a namespace"), n(5));
    let seen = Seen {
        uid: n(0),
        gid: n(2),
        host_pid,
    };
    (seen, out)
}

/// The host pid of the `sleep 30` a job's shell became: the server's
/// descendant that is `inner` in its own PID namespace (the job's `pid`
/// itself or one of its descendants), once it has exec'd.
async fn job_process(server_pid: u32, job_pid: u32, inner: u32) -> u32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<u32> = descendants(server_pid)
            .into_iter()
            .filter(|p| *p == job_pid || descendants(job_pid).contains(p))
            .filter(|p| ns_pids(*p).and_then(|n| n.last().copied()) == Some(inner))
            .filter(|p| cmdline(*p).is_some_and(|a| a == ["sleep", "30"]))
            .collect();
        if let [pid] = found[..] {
            return pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no single `sleep 30` of job pid {job_pid} with pid {inner} in its namespace: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Runs the server until it exits (it must refuse to start); its stderr.
async fn refused_start(args: &[&str]) -> String {
    refused_start_with(args, &[], &[]).await
}

/// `refused_start` with these variables set, and those removed.
async fn refused_start_with(
    args: &[&str],
    envs: &[(&str, &std::ffi::OsStr)],
    removed: &[&str],
) -> String {
    let ws = tempfile::tempdir().expect("workspace");
    let mut cmd = server_command();
    cmd.arg("--workdir")
        .arg(ws.path())
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    for k in removed {
        cmd.env_remove(k);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("ferrepl {args:?} did not exit: it must refuse to start"))
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "ferrepl {args:?} must refuse to start: {stderr}"
    );
    stderr
}

/// A tokens file naming alice and bob, in the order given.
fn write_tokens(path: &Path, bob_first: bool) {
    let (a, b) = (format!("{ALICE} alice\n"), format!("{BOB} bob\n"));
    let text = if bob_first { b + &a } else { a + &b };
    std::fs::write(path, text).expect("write the tokens file");
}

/// SIGTERM (a drain) and wait for the server to exit.
async fn drain(mut server: HttpServer) {
    let pid = nix::unistd::Pid::from_raw(server.child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    tokio::time::timeout(Duration::from_secs(60), server.child.wait())
        .await
        .expect("the drained server exits")
        .expect("wait");
}

mod degraded;
mod installs_and_r;
mod one_tenant;
mod tenants;
mod uid_table;
