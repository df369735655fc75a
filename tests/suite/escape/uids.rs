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

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};

use crate::support::{
    ATTEMPT, HttpServer, Launch, StdioServer, ToolOutput, assert_failed, assert_succeeded, call,
    cmdline, descendants, everything, host_pid_in_namespace, is_root, ns_pids, outcome, own_uid,
    path_str, py, py_path, real_python3, server_command, test_uid_table, unique,
    wait_for_file_line,
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

// ------------------------------------------------------------------ one tenant

/// Claim: a root server alone, in a root-owned workspace, runs the session's
/// interpreter and a shell job as a uid of --tenant-uids (kept under "*"),
/// never root, with the workspace shown as theirs: a root 0600 file there
/// is readable, and what they create belongs to root on the host. The
/// attack this closes: code in a session acting as root on host files
/// (anything a namespace or view leaves reachable). Unprivileged: the
/// server's own uid, not called degraded.
#[tokio::test]
async fn a_root_servers_session_and_job_run_as_a_uid_of_their_own() {
    let range = "3100000-3100009";
    let place = Place::new();
    let secret = unique("root-0600-");
    let secret_file = place.ws().join("root-secret.txt");
    std::fs::write(&secret_file, &secret).expect("write");
    std::fs::set_permissions(&secret_file, PermissionsExt::from_mode(0o600)).expect("chmod");
    let server = StdioServer::launch(place.launch(range, &[])).await;

    let (seen, out) = seen_in(
        server.peer(),
        "default",
        "open('made-by-session.txt', 'w').write('x')\nprint('SECRET', open('root-secret.txt').read())",
    )
    .await;
    assert!(
        out.str_field("stdout")
            .contains(&format!("SECRET {secret}")),
        "the session reads the workspace's 0600 file: {out:#?}"
    );
    assert!(
        descendants(server.pid()).contains(&seen.host_pid),
        "the interpreter {} is the server's",
        seen.host_pid
    );
    assert_runs_as(seen.host_pid, seen.uid, "the session's interpreter");
    assert_eq!(seen.gid, gid_of(seen.uid));

    // A shell job: its shell's pid (of its namespace) in a file, then the
    // shell becomes `sleep`.
    let job = server
        .call(
            "shell_exec",
            json!({ "command": "echo $$ > job.pid; exec sleep 30", "wait_s": 1 }),
        )
        .await;
    assert_eq!(job.structured["status"], "running", "{job:#?}");
    let job_pid = u32::try_from(job.structured["pid"].as_u64().expect("pid")).expect("u32");
    let inner: u32 = wait_for_file_line(&place.ws().join("job.pid"), Duration::from_secs(20))
        .await
        .trim()
        .parse()
        .expect("a pid");
    let sleeper = job_process(server.pid(), job_pid, inner).await;
    assert_runs_as(sleeper, seen.uid, "the shell job");
    let killed = server
        .call(
            "shell_wait",
            json!({ "job": job.str_field("job"), "signal": "KILL" }),
        )
        .await;
    assert_eq!(killed.structured["status"], "exited", "{killed:#?}");

    let sandbox = sandbox_line(server.peer()).await;
    let made = owner(&place.ws().join("made-by-session.txt"));
    if is_root() {
        assert_ne!(seen.uid, 0, "a root server's session must not run as root");
        assert_in_range(seen.uid, range);
        assert_eq!(
            place.uid_table().get("*"),
            Some(&json!(seen.uid)),
            "the sole tenant's uid is kept under \"*\""
        );
        assert_eq!(
            made, 0,
            "through the idmapped workspace, root's on the host"
        );
        assert_eq!(owner(&place.ws().join("job.pid")), 0);
        let part = format!(
            "sessions run as uid {}, the workspace shown as theirs through an idmapped mount",
            seen.uid
        );
        assert!(sandbox.contains(&part), "{sandbox}");
    } else {
        assert_eq!(seen.uid, own_uid(), "unprivileged: the server's uid");
        assert_eq!(made, own_uid());
        let part = format!("sessions run as the server's uid {}", own_uid());
        assert!(sandbox.contains(&part), "{sandbox}");
    }
    assert!(!sandbox.contains("DEGRADED"), "{sandbox}");
}

/// Attack: in a root-owned workspace shown as the session's own (idmapped),
/// copy a shell and make it set-user-ID and set-group-ID: on the host it
/// would be root's, and run as root for anyone who executes it. Both
/// chmod(2) forms are refused, and the host copy keeps no set-id bit. (As
/// the server's own uid, the same: no set-id program is made anywhere.)
#[tokio::test]
async fn a_session_cannot_leave_a_set_id_program_in_the_workspace() {
    let place = Place::new();
    let server = StdioServer::launch(place.launch("3100080-3100089", &[])).await;
    let code = "import os, shutil\nshutil.copy('/bin/sh', 'sh2')\nfd = os.open('sh2', os.O_RDONLY)\nfor how, call in [('chmod', lambda m: os.chmod('sh2', m)), ('fchmod', lambda m: os.fchmod(fd, m))]:\n    for mode in (0o4755, 0o2755, 0o6755):\n        try:\n            call(mode)\n            print('ALLOWED', how, oct(mode))\n        except PermissionError:\n            print('REFUSED', how, oct(mode))\nos.chmod('sh2', 0o755)\nprint('PLAIN OK')";
    let out = server.call("python_exec", json!({ "code": code })).await;
    let stdout = out.str_field("stdout");
    assert!(!stdout.contains("ALLOWED"), "{out:#?}");
    assert_eq!(stdout.matches("REFUSED").count(), 6, "{out:#?}");
    assert!(
        stdout.contains("PLAIN OK"),
        "an ordinary chmod still works: {out:#?}"
    );
    let mode = std::fs::metadata(place.ws().join("sh2"))
        .expect("sh2")
        .permissions()
        .mode();
    assert_eq!(mode & 0o6000, 0, "no set-id bit on the host: {mode:o}");
    if is_root() {
        assert_eq!(owner(&place.ws().join("sh2")), 0, "root's on the host");
    }
}

/// Claim: a root server alone in a user's workspace runs sessions as that
/// user, whose RLIMIT_NPROC (--max-processes) counts everything the user
/// runs on the host: when half of it is taken at start, the server says so
/// (a session that could not start a thread would otherwise be a puzzle).
#[tokio::test]
async fn a_busy_workspace_owner_is_named_at_start() {
    if !is_root() {
        return; // sessions run as the server's own uid
    }
    let place = Place::new();
    std::os::unix::fs::chown(place.ws(), Some(OWNER), Some(OWNER)).expect("chown");
    // Two processes of the owner's on the host.
    let mut owned = Vec::new();
    for _ in 0..2 {
        let child = std::process::Command::new("sleep")
            .arg("60")
            .uid(OWNER)
            .gid(OWNER)
            .spawn()
            .expect("sleep as the owner");
        owned.push(child);
    }
    let server =
        StdioServer::launch(place.launch("3100130-3100139", &["--max-processes", "4"])).await;
    let log = server.stderr_log();
    for mut child in owned {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        log.contains(&format!("sessions run as uid {OWNER}, the workspace's owner, whose processes on this host already hold"))
            && log.contains("raise --max-processes"),
        "{log}"
    );
}

/// Claim: a root server alone in a workspace owned by a user (uid 4242)
/// runs its sessions as that user, and what the session and the server's
/// own tools (file_write, python_export) create there is that user's, so
/// the project stays the user's own; file_read reads what the session
/// wrote. Unprivileged (no chown possible): all of it as the server's uid.
#[tokio::test]
async fn a_workspace_owned_by_a_user_is_worked_in_as_that_user() {
    let place = Place::new();
    let expected = if is_root() {
        std::os::unix::fs::chown(place.ws(), Some(OWNER), Some(OWNER)).expect("chown");
        OWNER
    } else {
        own_uid()
    };
    let server = StdioServer::launch(place.launch("3100090-3100099", &[])).await;
    let (seen, _) = seen_in(
        server.peer(),
        "default",
        "open('by-session.txt', 'w').write('written by the session\\n')",
    )
    .await;
    assert_eq!(seen.uid, expected, "the session's uid");
    assert_eq!(seen.gid, gid_of(expected), "the session's gid");
    assert_runs_as(seen.host_pid, expected, "the session's interpreter");

    let wrote = server
        .call(
            "file_write",
            json!({ "path": "by-tool/w.txt", "text": "by the tool\n" }),
        )
        .await;
    assert!(!wrote.is_error, "{wrote:#?}");
    let exported = server
        .call(
            "python_export",
            json!({ "path": "nb.ipynb", "format": "ipynb" }),
        )
        .await;
    assert!(!exported.is_error, "{exported:#?}");
    let notebook = std::fs::read_to_string(place.ws().join("nb.ipynb")).expect("the notebook");
    assert!(notebook.contains("by-session.txt"), "{notebook}");
    let read = server
        .call("file_read", json!({ "path": "by-session.txt" }))
        .await;
    assert!(!read.is_error, "{read:#?}");
    assert_eq!(
        read.structured["text"], "written by the session\n",
        "{read:#?}"
    );

    for made in ["by-session.txt", "by-tool", "by-tool/w.txt", "nb.ipynb"] {
        assert_eq!(
            owner(&place.ws().join(made)),
            expected,
            "{made} belongs to the workspace's owner"
        );
    }
    let sandbox = sandbox_line(server.peer()).await;
    let part = if is_root() {
        format!("sessions run as uid {OWNER}, the workspace's owner")
    } else {
        format!("sessions run as the server's uid {}", own_uid())
    };
    assert!(sandbox.contains(&part), "{sandbox}");
    assert!(
        !place.uid_table().contains_key("*"),
        "no uid of the range is taken for an owned workspace: {:?}",
        place.uid_table()
    );
}

// ------------------------------------------------------------------ tenants

/// Claim: each tenant of a root server runs as its own uid (not root, not
/// another's), owns its workspace, and keeps that uid across a restart on
/// the same state directory with the tokens file reordered and the other
/// tenant coming first: a uid once given never moves to another name. With
/// --resume off too (the attack: with the uids kept in memory only, they
/// followed the first requests' order, and alice and bob swapped uids after
/// a restart). Unprivileged: tenants share the server's uid and the status
/// says DEGRADED.
#[tokio::test]
async fn each_tenant_has_its_own_uid_kept_across_restarts_and_reorders() {
    let range = "3100010-3100019";
    let place = Place::new();
    let tokens_dir = tempfile::tempdir().expect("tokens dir");
    let tokens = tokens_dir.path().join("tokens");
    write_tokens(&tokens, false);
    let launch = || {
        place.launch(
            range,
            &["--auth-token-file", path_str(&tokens), "--resume", "off"],
        )
    };

    let first = HttpServer::launch(launch()).await;
    let alice = first.connect_at("/mcp", ALICE).await;
    let (a, _) = seen_in(alice.peer(), "default", "").await;
    let bob = first.connect_at("/mcp", BOB).await;
    let (b, _) = seen_in(bob.peer(), "default", "").await;
    assert_runs_as(a.host_pid, a.uid, "alice's interpreter");
    assert_runs_as(b.host_pid, b.uid, "bob's interpreter");
    let alice_sandbox = sandbox_line(alice.peer()).await;
    if is_root() {
        assert!(a.uid != 0 && b.uid != 0, "tenants never run as root");
        assert_ne!(a.uid, b.uid, "two tenants never share a uid");
        assert_in_range(a.uid, range);
        assert_in_range(b.uid, range);
        assert_eq!(owner(&place.ws().join("alice")), a.uid);
        assert_eq!(owner(&place.ws().join("bob")), b.uid);
        let table = place.uid_table();
        assert_eq!(table.get("alice"), Some(&json!(a.uid)), "{table:?}");
        assert_eq!(table.get("bob"), Some(&json!(b.uid)), "{table:?}");
        let part = format!("sessions run as this tenant's own uid {}", a.uid);
        assert!(alice_sandbox.contains(&part), "{alice_sandbox}");
        assert!(!alice_sandbox.contains("DEGRADED"), "{alice_sandbox}");
    } else {
        assert_eq!((a.uid, b.uid), (own_uid(), own_uid()));
        assert!(
            alice_sandbox.contains("uid boundary DEGRADED"),
            "{alice_sandbox}"
        );
    }
    drop((alice, bob));
    drain(first).await;

    // Bob first in the file and first to come back.
    write_tokens(&tokens, true);
    let second = HttpServer::launch(launch()).await;
    let bob = second.connect_at("/mcp", BOB).await;
    let (b2, _) = seen_in(bob.peer(), "default", "").await;
    let alice = second.connect_at("/mcp", ALICE).await;
    let (a2, _) = seen_in(alice.peer(), "default", "").await;
    assert_runs_as(b2.host_pid, b.uid, "bob's interpreter after the restart");
    assert_runs_as(a2.host_pid, a.uid, "alice's interpreter after the restart");
    assert_eq!((a2.uid, b2.uid), (a.uid, b.uid));
    if is_root() {
        let table = place.uid_table();
        assert_eq!(table.len(), 2, "{table:?}");
        assert_eq!(table.get("alice"), Some(&json!(a.uid)), "{table:?}");
        assert_eq!(table.get("bob"), Some(&json!(b.uid)), "{table:?}");
    }
    drop((alice, bob));
    drain(second).await;
}

/// Attack: bob reads alice's files where a view shows them. The debug-build
/// hook FERREPL_TEST_TENANT_EXTRA_READ binds the whole --workdir (every
/// tenant's workspace) into bob's view, so only uids stand between them: as
/// root, alice's 0644 file is readable (the bind is there) and her 0600
/// file is not. Unprivileged, tenants share a uid: the status says
/// DEGRADED and bob does read it (what DEGRADED means).
#[tokio::test]
async fn another_tenants_0600_file_stays_closed_where_the_view_shows_it() {
    let place = Place::new();
    // The workdir's root is traversable (as it would be by mistake): the
    // file's mode and owner are what is tested.
    std::fs::set_permissions(place.ws(), PermissionsExt::from_mode(0o755)).expect("chmod");
    let tokens_dir = tempfile::tempdir().expect("tokens dir");
    let tokens = tokens_dir.path().join("tokens");
    write_tokens(&tokens, false);
    let launch = place
        .launch("3100020-3100029", &["--auth-token-file", path_str(&tokens)])
        .env("FERREPL_TEST_TENANT_EXTRA_READ", place.ws());
    let server = HttpServer::launch(launch).await;

    let secret = unique("alice-0600-");
    let public = unique("alice-0644-");
    let alice = server.connect_at("/mcp", ALICE).await;
    let wrote = call(
        alice.peer(),
        "python_exec",
        json!({ "code": format!(
            "import os\nos.chmod('.', 0o755)\n\
             open('secret', 'w').write({s})\nos.chmod('secret', 0o600)\n\
             open('public', 'w').write({p})\nos.chmod('public', 0o644)",
            s = py(&secret), p = py(&public)), "wait_s": 30 }),
    )
    .await;
    wrote.assert_ok();
    let alice_dir = place.ws().join("alice");
    let mode = std::fs::metadata(alice_dir.join("secret"))
        .expect("secret")
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let bob = server.connect_at("/mcp", BOB).await;
    let code = format!(
        "{ATTEMPT}\nattempt('public', lambda: open({p}).read())\nattempt('secret', lambda: open({s}).read())",
        p = py_path(&alice_dir.join("public")),
        s = py_path(&alice_dir.join("secret")),
    );
    let out = call(
        bob.peer(),
        "python_exec",
        json!({ "code": code, "wait_s": 30 }),
    )
    .await;
    out.assert_ok();
    assert_succeeded(&out, "public");
    assert!(outcome(&out, "public").contains(&public), "{out:#?}");
    let bob_sandbox = sandbox_line(bob.peer()).await;
    if is_root() {
        assert_failed(&out, "secret", "alice's 0600 file is not bob's uid's");
        assert!(
            outcome(&out, "secret").starts_with("PermissionError"),
            "{out:#?}"
        );
        assert!(!everything(&out).contains(&secret));
        assert!(!bob_sandbox.contains("DEGRADED"), "{bob_sandbox}");
    } else {
        assert!(
            bob_sandbox.contains("uid boundary DEGRADED"),
            "{bob_sandbox}"
        );
        assert!(outcome(&out, "secret").contains(&secret), "{out:#?}");
    }
}

// ------------------------------------------------------------------ the host's table

/// The uid the default session of `server` runs as (checked from the host).
async fn session_uid(server: &StdioServer) -> u32 {
    let (seen, _) = seen_in(server.peer(), "default", "").await;
    assert_runs_as(seen.host_pid, seen.uid, "the session's interpreter");
    seen.uid
}

/// Attack: every project's root server ran its sessions as the same uid
/// (kept per state directory as "*", the default state directory shared by
/// all), so one project's session used up the uid's inotify instances and
/// processes and another's got EMFILE. Claim: root instances on other
/// projects, other state directories, or another project under the same
/// state directory never share a uid; each gets its own back after a
/// restart with --resume off (in the other order), kept in the host's table
/// under its (state directory, workspace). Unprivileged: all run as the
/// server's uid, and no table is kept.
#[tokio::test]
async fn instances_on_a_host_never_share_a_uid_and_keep_theirs_without_resume() {
    let range = "3100100-3100109";
    let (a, b) = (Place::new(), Place::new());
    // c: another project under a's state directory.
    let c_ws = tempfile::tempdir().expect("c's workspace");
    let instances = [
        (a.ws(), a.state.path()),
        (b.ws(), b.state.path()),
        (c_ws.path(), a.state.path()),
    ];
    let start = |i: usize| {
        let (ws, state) = instances[i];
        StdioServer::launch(launch_at(ws, state, range, &["--resume", "off"]))
    };
    let mut first = Vec::new();
    for i in 0..3 {
        let server = start(i).await;
        first.push(session_uid(&server).await);
        server.close_and_wait().await;
    }
    let mut again = vec![0; 3];
    for i in (0..3).rev() {
        let server = start(i).await;
        again[i] = session_uid(&server).await;
        server.close_and_wait().await;
    }
    assert_eq!(again, first, "each instance gets its own uid back");
    if is_root() {
        assert!(
            first[0] != first[1] && first[1] != first[2] && first[0] != first[2],
            "three instances, three uids: {first:?}"
        );
        for (i, (ws, state)) in instances.iter().enumerate() {
            assert_in_range(first[i], range);
            let keys = uid_entries(ws, state);
            assert_eq!(keys.get("*"), Some(&json!(first[i])), "{keys:?}");
            assert_eq!(keys.len(), 1, "{keys:?}");
        }
    } else {
        assert_eq!(first, vec![own_uid(); 3]);
        assert!(uid_entries(a.ws(), a.state.path()).is_empty());
    }
}

/// Claim: when every uid of --tenant-uids is held by an instance whose
/// workspace exists, the next instance refuses to start, naming the table
/// and how to prune it; once the holder has exited and its workspace is
/// gone, its uid is free again and the next instance starts on it.
/// Unprivileged: no table, both start.
#[tokio::test]
async fn a_full_range_refuses_the_next_instance_until_a_holder_is_gone() {
    let range = "3100110-3100110";
    let holder_place = Place::new();
    let holder = StdioServer::launch(holder_place.launch(range, &[])).await;
    let held = session_uid(&holder).await;
    let other = Place::new();
    if is_root() {
        assert_eq!(held, 3100110);
        let stderr = refused_start_with(
            &[
                "--state-dir",
                path_str(other.state.path()),
                "--tenant-uids",
                range,
            ],
            &[],
            &[],
        )
        .await;
        let table = test_uid_table().display().to_string();
        assert!(
            stderr.contains("no free uid left in --tenant-uids 3100110-3100110")
                && stderr.contains(&table)
                && stderr.contains("remove the entries")
                && stderr.contains("wider --tenant-uids"),
            "{stderr}"
        );
    }
    holder.close_and_wait().await;
    drop(holder_place);
    let next = StdioServer::launch(other.launch(range, &[])).await;
    let uid = session_uid(&next).await;
    if is_root() {
        assert_eq!(uid, held, "the gone workspace's uid is given again");
        assert_eq!(other.uid_table().get("*"), Some(&json!(uid)));
    } else {
        assert_eq!(uid, own_uid());
    }
}

/// Attack: a table someone else can write would let them give two
/// instances (two tenants) one uid. Claim: a root server refuses a table
/// whose directory is another user's, or a table file writable by others,
/// naming it; an unprivileged server keeps no table and ignores the
/// setting.
#[tokio::test]
async fn a_uid_table_that_is_not_roots_alone_is_refused() {
    let dir = tempfile::tempdir().expect("a directory");
    let table = dir.path().join("uids.json");
    if !is_root() {
        let server = StdioServer::launch(
            Launch::new(&["--warm-pool", "0"]).env("FERREPL_UID_TABLE", &table),
        )
        .await;
        assert_eq!(session_uid(&server).await, own_uid());
        assert!(!table.exists());
        return;
    }
    std::os::unix::fs::chown(dir.path(), Some(OWNER), Some(OWNER)).expect("chown");
    let env = [("FERREPL_UID_TABLE", table.as_os_str())];
    let stderr = refused_start_with(&["--warm-pool", "0"], &env, &[]).await;
    assert!(
        stderr.contains(&dir.path().display().to_string())
            && stderr.contains(&format!("uid {OWNER}"))
            && stderr.contains("--uid-table"),
        "{stderr}"
    );
    std::os::unix::fs::chown(dir.path(), Some(0), Some(0)).expect("chown");
    std::fs::write(&table, "{\"version\": 1, \"entries\": []}").expect("write");
    std::fs::set_permissions(&table, PermissionsExt::from_mode(0o666)).expect("chmod");
    let stderr = refused_start_with(&["--warm-pool", "0"], &env, &[]).await;
    assert!(
        stderr.contains(&table.display().to_string()) && stderr.contains("mode 666"),
        "{stderr}"
    );
}

// ------------------------------------------------------------------ degraded

/// Claim: where the boundary is missing the status says so and
/// --sandbox-require refuses to start. As root: --no-namespaces leaves the
/// sessions root without capabilities (DEGRADED), refused with
/// --sandbox-require; tenants with namespaces start under it. Unprivileged:
/// alone it is not degraded (even without namespaces), tenants (sharing
/// the server's uid) are refused under --sandbox-require.
#[tokio::test]
async fn a_missing_uid_boundary_is_named_and_refused_when_required() {
    let tokens_dir = tempfile::tempdir().expect("tokens dir");
    let tokens = tokens_dir.path().join("tokens");
    write_tokens(&tokens, false);
    let tenants = [
        "--auth-token-file",
        path_str(&tokens),
        "--tenant-uids",
        "3100030-3100039",
        "--sandbox-require",
        "--warm-pool",
        "0",
    ];

    let server = StdioServer::start(&["--no-namespaces", "--warm-pool", "0"]).await;
    let sandbox = sandbox_line(server.peer()).await;
    let (seen, _) = seen_in(server.peer(), "default", "").await;
    if is_root() {
        assert!(sandbox.contains("uid boundary DEGRADED"), "{sandbox}");
        assert_eq!(seen.uid, 0, "degraded: root without capabilities");
        // Refused; the missing namespaces are named first (the uid part
        // of the status is settled after that check).
        let stderr = refused_start(&["--no-namespaces", "--sandbox-require"]).await;
        assert!(
            stderr.contains("--sandbox-require")
                && (stderr.contains("uid boundary") || stderr.contains("NO private namespaces")),
            "{stderr}"
        );
        // With namespaces, tenants are held apart by uids: not refused.
        let mut up = HttpServer::start(&tenants, &[]).await;
        up.assert_alive();
    } else {
        let part = format!("sessions run as the server's uid {}", own_uid());
        assert!(
            sandbox.contains(&part) && !sandbox.contains("DEGRADED"),
            "{sandbox}"
        );
        assert_eq!(seen.uid, own_uid());
        let mut args = vec!["--http", "127.0.0.1:0"];
        args.extend_from_slice(&tenants);
        let stderr = refused_start(&args).await;
        assert!(stderr.contains("uid boundary"), "{stderr}");
    }
}

/// Attack: with --no-namespaces (Landlock still full) a server with tenants
/// started, warning only: their sessions shared the host's /dev/shm and
/// /proc (alice read and appended to bob's shared memory file, and read his
/// job's command line), as root without capabilities. Claim: tenants with
/// degraded isolation refuse to start, saying what is degraded, why it
/// matters across tenants and the two ways out; with
/// --allow-degraded-isolation they start (with a warning); one tenant alone
/// still starts, the status naming the gap. Unprivileged, tenants sharing
/// the server's uid are refused even with namespaces.
#[tokio::test]
async fn tenants_refuse_degraded_isolation_unless_the_operator_accepts_it() {
    let tokens_dir = tempfile::tempdir().expect("tokens dir");
    let tokens = tokens_dir.path().join("tokens");
    write_tokens(&tokens, false);
    let accept = "FERREPL_ALLOW_DEGRADED_ISOLATION";
    let tenants = [
        "--auth-token-file",
        path_str(&tokens),
        "--tenant-uids",
        "3100120-3100129",
        "--warm-pool",
        "0",
    ];
    let mut args = vec!["--http", "127.0.0.1:0", "--no-namespaces"];
    args.extend_from_slice(&tenants);
    let stderr = refused_start_with(&args, &[], &[accept]).await;
    for part in [
        "refusing to serve tenants on degraded isolation",
        "NO private namespaces (turned off with --no-namespaces)",
        "/dev/shm",
        "/proc",
        "without --no-namespaces",
        "--allow-degraded-isolation",
    ] {
        assert!(stderr.contains(part), "{part:?} in {stderr}");
    }
    let uid_part = if is_root() {
        "uid boundary DEGRADED: sessions run as root without capabilities"
    } else {
        "uid boundary DEGRADED: every tenant's sessions run as the server's uid"
    };
    assert!(stderr.contains(uid_part), "{stderr}");

    // The operator names the risk: it starts, says so, and serves.
    let mut accepted = vec!["--no-namespaces", "--allow-degraded-isolation"];
    accepted.extend_from_slice(&tenants);
    let server = HttpServer::launch(Launch::new(&accepted).env_remove(accept)).await;
    let alice = server.connect_at("/mcp", ALICE).await;
    let (seen, _) = seen_in(alice.peer(), "default", "").await;
    assert_eq!(seen.uid, if is_root() { 0 } else { own_uid() });
    let log = server.stderr_log();
    assert!(
        log.contains("tenants run on degraded isolation, as --allow-degraded-isolation accepts"),
        "{log}"
    );
    drop(alice);
    drop(server);

    // One tenant alone: today's warning, no refusal.
    let sole = StdioServer::launch(
        Launch::new(&["--no-namespaces", "--warm-pool", "0"]).env_remove(accept),
    )
    .await;
    let sandbox = sandbox_line(sole.peer()).await;
    assert!(sandbox.contains("NO private namespaces"), "{sandbox}");
    assert!(
        sole.stderr_log().contains("NOT in force: namespaces"),
        "{}",
        sole.stderr_log()
    );
    assert!(!sole.stderr_log().contains("refusing"));

    if !is_root() {
        // With namespaces, tenants still share the server's uid.
        let mut args = vec!["--http", "127.0.0.1:0"];
        args.extend_from_slice(&tenants);
        let stderr = refused_start_with(&args, &[], &[accept]).await;
        assert!(
            stderr.contains("refusing to serve tenants on degraded isolation")
                && stderr.contains(uid_part)
                && !stderr.contains("NO private namespaces"),
            "{stderr}"
        );
    }
}

// ------------------------------------------------------------------ installs and R

/// A wheel `<dir>/<name>-1.0-py3-none-any.whl` whose module has `VALUE`.
fn wheel(dir: &Path, name: &str, value: u32) -> PathBuf {
    let path = dir.join(format!("{name}-1.0-py3-none-any.whl"));
    let script = "import sys, zipfile\npath, name, value = sys.argv[1:4]\ninfo = name + '-1.0.dist-info'\n\
        with zipfile.ZipFile(path, 'w') as z:\n\
        \x20   z.writestr(name + '/__init__.py', 'VALUE = ' + value + '\\n')\n\
        \x20   z.writestr(info + '/METADATA', 'Metadata-Version: 2.1\\nName: ' + name + '\\nVersion: 1.0\\n')\n\
        \x20   z.writestr(info + '/WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
        \x20   z.writestr(info + '/RECORD', '')\n";
    let out = std::process::Command::new(real_python3())
        .args(["-c", script])
        .arg(&path)
        .arg(name)
        .arg(value.to_string())
        .output()
        .expect("run python");
    assert!(out.status.success(), "build the wheel: {out:?}");
    path
}

/// Changes the owner of everything under `dir` (symlinks themselves).
fn chown_tree(dir: &Path, uid: u32) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        std::os::unix::fs::lchown(&p, Some(uid), Some(uid)).expect("lchown");
        if std::fs::symlink_metadata(&p).expect("stat").is_dir() {
            for e in std::fs::read_dir(&p).expect("read_dir") {
                stack.push(e.expect("entry").path());
            }
        }
    }
}

/// Claim: a package install job writes into the venv as the sessions' uid,
/// never as root: the venv (owned by another user, 4243) is shown to the
/// job as its own through an idmapped mount, so what the install writes
/// lands as 4243's on the host (a root install would be root's, or
/// refused), and the session imports it. Unprivileged: the server's uid.
#[tokio::test]
async fn an_install_job_writes_the_venv_as_the_sessions_uid() {
    let place = Place::new();
    let venv_dir = tempfile::tempdir().expect("venv parent");
    let venv = venv_dir.path().join("env");
    let made = std::process::Command::new(real_python3())
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .expect("run python -m venv");
    assert!(made.status.success(), "python -m venv: {made:?}");
    let venv_owner = if is_root() {
        chown_tree(&venv, VENV_OWNER);
        VENV_OWNER
    } else {
        own_uid()
    };
    let python = real_python3();
    let launch = place.launch(
        "3100040-3100049",
        &["--python", path_str(&python), "--venv", path_str(&venv)],
    );
    let server = StdioServer::launch(launch).await;
    let (seen, _) = seen_in(server.peer(), "default", "").await;
    if is_root() {
        assert_ne!(seen.uid, 0);
    } else {
        assert_eq!(seen.uid, own_uid());
    }

    let name = "ferrepl_uids_pkg";
    let whl = wheel(place.ws(), name, 31337);
    let mut out = server
        .call(
            "python_install",
            json!({ "packages": [path_str(&whl)], "wait_s": 50 }),
        )
        .await;
    for _ in 0..10 {
        if out.structured["status"] != "running" {
            break;
        }
        out = server
            .call(
                "shell_wait",
                json!({ "job": out.str_field("job"), "wait_s": 50 }),
            )
            .await;
    }
    assert_eq!(out.structured["status"], "exited", "{out:#?}");
    assert_eq!(out.structured["exit_code"], 0, "the install: {out:#?}");

    // --venv is the user's, read-only to sessions: the install went to the
    // venv ferrepl keeps over it (kept_venv.rs), given to the workspace's
    // owner and shown to the sessions' uid like the workspace.
    let installed_in = |prefix: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(prefix.join("lib"))
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .map(|py| {
                        py.path()
                            .join("site-packages")
                            .join(name)
                            .join("__init__.py")
                    })
                    .filter(|p| p.is_file())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        installed_in(&venv),
        Vec::<PathBuf>::new(),
        "nothing in --venv"
    );
    // Each kept venv has a lock file beside it (made by one server at a time).
    let kept: Vec<PathBuf> = std::fs::read_dir(place.state.path().join("venvs"))
        .expect("the kept venvs")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(kept.len(), 1, "one kept venv: {kept:?}");
    let installed = installed_in(&kept[0]);
    assert_eq!(
        installed.len(),
        1,
        "the package is in the kept venv: {installed:?}"
    );
    assert_eq!(
        owner(&installed[0]),
        owner(&kept[0]),
        "the install wrote as the kept venv's owner is shown to the sessions' uid"
    );
    assert_eq!(
        owner(installed[0].parent().expect("package dir")),
        owner(&kept[0])
    );
    assert_eq!(owner(&venv), venv_owner);

    // The session picks it up (the refresh after an install may lag).
    let mut imported = server.exec(&format!("import {name}\n{name}.VALUE")).await;
    for _ in 0..40 {
        if !imported.is_error {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        imported = server.exec(&format!("import {name}\n{name}.VALUE")).await;
    }
    imported.assert_ok();
    assert_eq!(imported.value(), Some("31337"));
}

/// Claim: R sessions of a root server run as the same non-root uid as its
/// Python sessions (kept under "*"), seen from the host, and what R creates
/// in the idmapped workspace is root's there. Unprivileged: the server's
/// uid.
#[tokio::test]
async fn r_sessions_run_as_the_sessions_uid() {
    let range = "3100050-3100059";
    let place = Place::new();
    let server = StdioServer::launch(place.launch(range, &["--languages", "python,r"])).await;
    let code = "writeLines('from R', 'made-by-r.txt')\n\
        st <- readLines('/proc/self/status')\n\
        cat('UID', sub('^Uid:[[:space:]]*', '', grep('^Uid:', st, value = TRUE)), '\\n')\n\
        cat('NS', Sys.readlink('/proc/self/ns/pid'), Sys.getpid(), '\\n')";
    let out = server
        .call("r_exec", json!({ "code": code, "wait_s": 30 }))
        .await;
    assert!(!out.is_error, "{out:#?}");
    let stdout = out.str_field("stdout").to_string();
    let field = |tag: &str| -> Vec<String> {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap_or_else(|| panic!("no {tag} line: {out:#?}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let inside: Vec<u32> = field("UID ")
        .iter()
        .map(|u| u.parse().expect("a uid"))
        .collect();
    let ns = field("NS ");
    let r_pid = host_pid_in_namespace(&ns[0], ns[1].parse().expect("a pid"));
    let uid = inside[0];
    assert_eq!(inside, vec![uid; 4], "R's own Uid line");
    assert_runs_as(r_pid, uid, "the R session");
    let made = owner(&place.ws().join("made-by-r.txt"));
    if is_root() {
        assert_ne!(uid, 0, "a root server's R session must not run as root");
        assert_in_range(uid, range);
        assert_eq!(place.uid_table().get("*"), Some(&json!(uid)));
        let (py, _) = seen_in(server.peer(), "default", "").await;
        assert_eq!(py.uid, uid, "R and Python sessions share the one uid");
        assert_eq!(made, 0);
    } else {
        assert_eq!(uid, own_uid());
        assert_eq!(made, own_uid());
    }
}
