//! Attacks on the limits an instance's tenants share (run as root and as
//! an unprivileged user): a directory made unreadable to hide data from the
//! workspace quota, a job that takes more memory than --memory-limit or more
//! processes than --max-processes, and memory held behind a process's exited
//! main thread.

use std::time::Duration;

use serde_json::json;

use crate::support::{HttpServer, StdioServer, ToolOutput, call, path_str};

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
    // SAFETY: geteuid has no preconditions.
    let expected = if unsafe { libc::geteuid() } == 0 {
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

/// A job is held to --max-processes also where cgroups hold it (their pids
/// ceiling is far above the flag): the process-tree watch kills it (as
/// root, where RLIMIT_NPROC does not apply).
#[tokio::test]
async fn a_job_over_the_process_limit_is_killed_and_told_so() {
    let server = StdioServer::start(&["--tools", "all", "--max-processes", "64"]).await;
    let forks = "for i in $(seq 100); do sleep 120 & done; wait";
    let out = job_to_its_end(&server, forks).await;
    // Unprivileged, RLIMIT_NPROC (per user) refuses the forks first.
    let watched = out
        .text
        .contains("The job went over its limit of 64 processes (--max-processes");
    assert!(watched || out.text.contains("Cannot fork"), "{out:#?}");
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
