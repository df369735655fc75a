//! Attacks on the limits an instance's tenants share (run as root and as
//! an unprivileged user): a directory made unreadable to hide data from the
//! workspace quota, a job that takes more memory than --memory-limit, a
//! session or job that starts more processes than --max-processes (its
//! RLIMIT_NPROC, set once the program runs as the session's uid), and memory
//! held behind a process's exited main thread.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{
    HttpServer, Reaper, StdioServer, ToolOutput, call, host_pid_in_namespace, is_root, path_str,
    processes_with_arg, py, unique,
};

const TOKEN: &str = "quota-token-0123456789abcdef";

/// A tenant's server with a 1 MiB --tenant-disk, and a client of it.
async fn tenant_with_a_1m_quota() -> (HttpServer, crate::support::Client<()>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a directory for the tokens file");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN} alpha\n")).expect("write the tokens");
    let args = [
        "--auth-token-file",
        path_str(&tokens),
        "--tenant-disk",
        "1M",
        "--warm-pool",
        "0",
    ];
    let server = HttpServer::start(&args, &[]).await;
    let client = match server.try_connect_at("/mcp", (), Some(TOKEN)).await {
        Ok(c) => c,
        Err(e) => panic!("connect: {e:#}\nstderr:\n{}", server.stderr_log()),
    };
    (server, client, dir)
}

/// Runs `code`, then cells until one is refused (the quota is measured in
/// the background every few seconds: polled, bounded).
async fn refused_after(client: &crate::support::Client<()>, code: &str) -> Option<ToolOutput> {
    let out = call(client.peer(), "python_exec", json!({ "code": code })).await;
    assert!(!out.is_error, "{out:#?}");
    for _ in 0..100 {
        let out = call(client.peer(), "python_exec", json!({ "code": "1" })).await;
        if out.is_error {
            return Some(out);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

#[tokio::test]
async fn an_unreadable_directory_does_not_hide_data_from_the_disk_quota() {
    let (server, client, _dir) = tenant_with_a_1m_quota().await;
    let hide = "import os\nos.makedirs('d')\nopen('d/big.bin', 'wb').write(b'x' * 3_000_000)\nos.chmod('d', 0)";
    let refused = refused_after(&client, hide).await;
    let hidden = server.workdir.path().join("alpha/d");
    let _ = std::fs::set_permissions(&hidden, std::os::unix::fs::PermissionsExt::from_mode(0o700));
    let out = refused.expect("3 MB behind an unreadable directory must not pass a 1 MB quota");
    // Root reads the directory anyway and counts it; anyone else cannot,
    // and a walk that cannot finish is refused.
    let expected = if is_root() {
        "of their 1 MiB quota"
    } else {
        "could not be measured"
    };
    assert!(
        out.text.contains("--tenant-disk") && out.text.contains(expected),
        "{}",
        out.text
    );
}

/// HOME and TMPDIR are written as freely as the workspace: they count.
#[tokio::test]
async fn the_temporary_directories_count_toward_the_disk_quota() {
    let (_server, client, _dir) = tenant_with_a_1m_quota().await;
    let fill = "import os\nopen(os.path.join(os.environ['TMPDIR'], 'big.bin'), 'wb').write(b'x' * 3_000_000)";
    let out = refused_after(&client, fill)
        .await
        .expect("3 MB in TMPDIR must not pass a 1 MB quota");
    assert!(
        out.text.contains("--tenant-disk") && out.text.contains("of their 1 MiB quota"),
        "{}",
        out.text
    );
}

/// Runs `command` as job j1 and follows it until it ends (bounded).
async fn job_to_its_end(server: &StdioServer, command: &str) -> ToolOutput {
    let mut out = server
        .call("shell_exec", json!({ "command": command, "wait_s": 60 }))
        .await;
    for _ in 0..5 {
        if !out.text.contains("running") {
            break;
        }
        out = server
            .call("shell_wait", json!({ "job": "j1", "wait_s": 60 }))
            .await;
    }
    out
}

/// A job is held to --memory-limit by its memory cgroup where one can be
/// made (root here) and by the process-tree watch where not (the
/// unprivileged run, cgroup v2 hosts).
#[tokio::test]
async fn a_job_over_the_memory_limit_is_killed_and_told_so() {
    let server = StdioServer::start(&["--tools", "all", "--memory-limit", "200M"]).await;
    let hog = "python3 -c \"import time; b = b'x' * (600 << 20); time.sleep(120)\"";
    let out = job_to_its_end(&server, hog).await;
    assert!(
        out.text
            .contains("The job went over its memory limit of 200 MiB (--memory-limit"),
        "{out:#?}"
    );
}

/// The soft and hard values of a `/proc/<pid>/limits` line such as "Max
/// processes".
fn limit(limits: &str, name: &str) -> (String, String) {
    let line = limits
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name:?} line in:\n{limits}"));
    let mut fields = line[name.len()..].split_whitespace();
    let mut next = || fields.next().unwrap_or_default().to_string();
    (next(), next())
}

/// A cell that forks `sleep` children (argv[0] `marker`) until the kernel
/// refuses; prints `FORKED <count> <errno or None>`. The count.
async fn fork_until_refused(server: &StdioServer, session: &str, marker: &str) -> (u64, Value) {
    let code = format!(
        "import os, shutil\nsleep = shutil.which('sleep')\nn, err = 0, None\n\
         for _ in range(1000):\n\
         \x20   try:\n\
         \x20       pid = os.fork()\n\
         \x20   except OSError as e:\n\
         \x20       err = e.errno\n\
         \x20       break\n\
         \x20   if pid == 0:\n\
         \x20       try:\n\
         \x20           os.execv(sleep, [{m}, '600'])\n\
         \x20       finally:\n\
         \x20           os._exit(0)\n\
         \x20   n += 1\n\
         print('FORKED', n, err)",
        m = py(marker)
    );
    let out = server
        .call(
            "python_exec",
            json!({ "code": code, "session": session, "wait_s": 60 }),
        )
        .await;
    assert!(
        !out.is_error,
        "{out:#?}\nserver log:\n{}",
        server.stderr_log()
    );
    let line = out
        .str_field("stdout")
        .lines()
        .find_map(|l| l.strip_prefix("FORKED "))
        .unwrap_or_else(|| panic!("no FORKED line: {out:#?}"))
        .to_string();
    let mut f = line.split_whitespace();
    let n: u64 = f.next().and_then(|n| n.parse().ok()).expect("a count");
    let err = match f.next() {
        Some("None") | None => Value::Null,
        Some(e) => json!(e.parse::<i64>().expect("an errno")),
    };
    (n, err)
}

/// Attack: --max-processes did not bind a root server's sessions: the
/// launcher skipped RLIMIT_NPROC while it was still root (before switching
/// to the session's uid), so a session had the host's limit. Claim: every
/// rlimit is set once the program runs as the session's uid: a cell's
/// /proc/self/limits and its interpreter's /proc/<pid>/limits read from the
/// host show --max-processes (and --max-open-files); a fork bomb in a cell
/// is stopped there (EAGAIN) and the session lives on; as root the bound
/// is the uid's, a tenant's sessions and jobs together, so a second session
/// gets only what the first left; and a job that forks past it is stopped
/// (its forks refused, or killed by the process-tree watch where cgroups
/// or the watch get there first).
#[tokio::test]
async fn the_process_limit_binds_sessions_and_jobs() {
    let marker = unique("ferrepl-nproc-");
    let _reaper = Reaper::of_marker(&marker);
    let server = StdioServer::start(&[
        "--tools",
        "all",
        "--max-processes",
        "64",
        "--max-open-files",
        "200",
        "--warm-pool",
        "0",
        "--resume",
        "off",
    ])
    .await;
    let code = "import os\nprint('NS', os.readlink('/proc/self/ns/pid'), os.getpid())\n\
                print(open('/proc/self/limits').read())";
    let out = server.call("python_exec", json!({ "code": code })).await;
    out.assert_ok();
    let inside = out.str_field("stdout").to_string();
    let ns: Vec<&str> = inside
        .lines()
        .find_map(|l| l.strip_prefix("NS "))
        .unwrap_or_else(|| panic!("no NS line: {inside}"))
        .split_whitespace()
        .collect();
    let host_pid = host_pid_in_namespace(ns[0], ns[1].parse().expect("a pid"));
    let outside = std::fs::read_to_string(format!("/proc/{host_pid}/limits"))
        .unwrap_or_else(|e| panic!("/proc/{host_pid}/limits: {e}"));
    for limits in [&inside, &outside] {
        assert_eq!(
            limit(limits, "Max processes"),
            ("64".into(), "64".into()),
            "{limits}"
        );
        assert_eq!(
            limit(limits, "Max open files"),
            ("200".into(), "200".into()),
            "{limits}"
        );
        assert_eq!(
            limit(limits, "Max core file size"),
            ("0".into(), "0".into()),
            "{limits}"
        );
    }

    // A fork bomb: stopped by the kernel short of the limit (the
    // interpreter, its supervisor and its threads count too).
    let (n, err) = fork_until_refused(&server, "bomb", &marker).await;
    assert_eq!(err, json!(libc::EAGAIN), "forks past the limit are refused");
    assert!(n < 64, "{n} processes forked under --max-processes 64");
    let alive = server.exec_in("bomb", "'alive'").await;
    alive.assert_ok();
    assert_eq!(alive.value(), Some("'alive'"));
    let root = is_root();
    let second = server.exec_in("second", "'second'").await;
    if root {
        // One uid for the instance's sessions: the bomb holds all its
        // tasks, so another session cannot even start (its launcher's
        // supervisor, or the interpreter's own processes and threads), and
        // says why.
        assert!(
            second.is_error && second.text.contains("--max-processes"),
            "{second:#?}"
        );
    } else {
        // A user namespace of its own: the session's own count.
        second.assert_ok();
    }
    let deleted = server
        .call(
            "python_sessions",
            json!({ "action": "delete", "session": "bomb" }),
        )
        .await;
    assert!(!deleted.is_error, "{deleted:#?}");
    for _ in 0..200 {
        if processes_with_arg(&marker).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        processes_with_arg(&marker).is_empty(),
        "the bomb's processes end with its session"
    );
    let second = server.exec_in("second", "'second'").await;
    second.assert_ok();

    // A job: its forks are refused (dash: "Cannot fork"), or the
    // process-tree watch kills it.
    let forks = "for i in $(seq 100); do sleep 120 & done; wait";
    let out = job_to_its_end(&server, forks).await;
    let watched = out
        .text
        .contains("The job went over its limit of 64 processes (--max-processes");
    assert!(
        watched || out.text.contains("Cannot fork") || out.text.contains("fork:"),
        "{out:#?}"
    );
}

/// A process whose main thread exits while a thread of it holds the memory
/// shows in /proc as a zombie without memory: the session is still held to
/// --memory-limit (by its cgroup as root, by the process-tree watch in the
/// unprivileged run).
#[tokio::test]
async fn memory_behind_an_exited_main_thread_is_held_to_the_memory_limit() {
    let server = StdioServer::start(&["--memory-limit", "200M"]).await;
    let code = r#"
import subprocess, sys, time
hidden = """
import ctypes, threading, time
def hog():
    time.sleep(0.5)  # the main thread is gone by then
    b = b'x' * (600 << 20)
    time.sleep(120)
threading.Thread(target=hog).start()
ctypes.CDLL(None).pthread_exit(None)
"""
subprocess.Popen([sys.executable, "-c", hidden])
time.sleep(120)
"#;
    let out = server
        .call("python_exec", json!({ "code": code, "wait_s": 60 }))
        .await;
    assert_eq!(out.structured["status"], "crashed", "{out:#?}");
    assert!(out.text.contains("--memory-limit"), "{out:#?}");
}
