//! Process-count and memory limits on the whole tree: a fork bomb stopped, a
//! memory hog killed, cgroups enforcing them when status says so, many
//! threads not taken for a fork bomb.

use std::path::Path;
use std::time::Duration;

use super::{GONE_TIMEOUT, KILL_WAIT_S, exec_wait, sandbox_string, wait_no_process_with_arg};
use crate::support::{Reaper, StdioServer, py, unique};
use serde_json::json;

#[tokio::test]
async fn a_fork_bomb_is_stopped_and_leaves_nothing_behind() {
    let marker = unique("ferrepl-bomb-");
    let _reaper = Reaper::of_marker(&marker);
    let mut server = StdioServer::start(&["--max-processes", "64"]).await;

    let bystander = server.exec_in("bystander", "1 + 1").await;
    bystander.assert_ok();

    // Children exec `sleep` with the marker as argv[0]; the parent keeps
    // forking. The kernel refuses forks at --max-processes (RLIMIT_NPROC of
    // the session's uid): the cell says so and ends, and deleting the
    // session ends its children. Where the session runs as root (a root
    // server without namespaces: RLIMIT_NPROC does not bind root) the
    // parent holds on until the process-tree watch kills the tree.
    let code = format!(
        r#"
import os, shutil, time
sleep = shutil.which("sleep")
n = 0
for _ in range(1000):
    try:
        pid = os.fork()
    except OSError as e:
        print("REFUSED", e.errno, n)
        break
    if pid == 0:
        try:
            os.execv(sleep, [{marker}, "6001"])
        finally:
            os._exit(0)
    n += 1
else:
    time.sleep(60)
"#,
        marker = py(&marker)
    );
    let bomb = exec_wait(&server, "default", &code, KILL_WAIT_S).await;
    let refused = bomb
        .str_field("stdout")
        .lines()
        .find_map(|l| l.strip_prefix("REFUSED "))
        .map(str::to_string);
    if let Some(refused) = refused {
        let mut f = refused.split_whitespace();
        assert_eq!(
            f.next(),
            Some(libc::EAGAIN.to_string().as_str()),
            "{bomb:#?}"
        );
        let forked: u32 = f.next().and_then(|n| n.parse().ok()).expect("a count");
        assert!(forked < 64, "{forked} forks under --max-processes 64");
        bomb.assert_ok();
        let deleted = server
            .call(
                "python_sessions",
                json!({ "action": "delete", "session": "default" }),
            )
            .await;
        assert!(!deleted.is_error, "{deleted:#?}");
    } else {
        assert!(bomb.is_error, "the fork bomb must be an error: {bomb:#?}");
        assert_eq!(bomb.status(), "crashed", "{bomb:#?}");
        let notes = bomb.notes_text();
        assert!(
            notes.contains("limit of 64 processes") || notes.contains("memory limit"),
            "the notes must name the process (or memory) limit: {notes:?}; result: {bomb:#?}"
        );
        assert!(
            bomb.text.contains("limit of 64 processes") || bomb.text.contains("memory limit"),
            "the text must name the limit: {:?}",
            bomb.text
        );
    }

    server.assert_alive();
    let other = server.exec_in("bystander", "1 + 1").await;
    other.assert_ok();
    assert_eq!(other.value(), Some("2"));

    let left = wait_no_process_with_arg(&marker, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "{} bomb processes still alive after {GONE_TIMEOUT:?}: {left:?}",
        left.len()
    );

    let after = server.exec("'alive'").await;
    after.assert_ok();
    assert_eq!(after.value(), Some("'alive'"));
    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn a_memory_hog_is_killed_and_the_session_restarts() {
    let mut server = StdioServer::start(&["--memory-limit", "300M"]).await;
    server.exec("before = 1").await.assert_ok();

    // bytearray(n) zero-fills its buffer, so all of it is resident; the cell
    // then holds it until the server kills the session.
    let hog = exec_wait(
        &server,
        "default",
        "import time\nx = bytearray(800 * 1024 * 1024)\nx[::4096] = b'\\x01' * len(x[::4096])\ntime.sleep(60)",
        KILL_WAIT_S,
    )
    .await;
    assert!(hog.is_error, "the memory hog must be an error: {hog:#?}");
    assert_eq!(hog.status(), "crashed", "{hog:#?}");
    let notes = hog.notes_text();
    assert!(
        notes.contains("memory limit"),
        "the notes must name the memory limit: {notes:?}; result: {hog:#?}"
    );
    assert!(
        hog.text.contains("memory limit"),
        "the text must name the memory limit: {:?}",
        hog.text
    );

    server.assert_alive();
    let after = server.exec("1 + 1").await;
    after.assert_ok();
    assert_eq!(after.value(), Some("2"));
    assert!(
        after.text.to_lowercase().contains("lost"),
        "the first cell after the kill must say the state was lost: {:?}",
        after.text
    );
    server.exec("before").await.assert_raised("NameError");
    server.close_and_wait().await;
}

/// Where cgroups can be made (as on this machine), every session and job is
/// in its own memory and pids groups, which are removed when it ends; where
/// they cannot, the status (python_sessions {action: "status"}) says the
/// process-tree watch enforces the limits.
#[tokio::test]
async fn limits_are_kernel_enforced_by_cgroups_when_status_says_so() {
    let mut server = StdioServer::start(&["--memory-limit", "300M"]).await;
    let sandbox = sandbox_string(&server).await;
    let out = server
        .exec("print(open('/proc/self/cgroup').read(), end='')")
        .await;
    out.assert_ok();
    let worker_cgroups = out.str_field("stdout").to_string();
    let job = server
        .call("shell_exec", json!({ "command": "cat /proc/self/cgroup" }))
        .await;
    assert!(!job.is_error, "{job:#?}");
    let job_cgroups = job.structured["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    let memory_line = |text: &str| -> String {
        text.lines()
            .find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == "memory"))
            })
            .unwrap_or_default()
            .to_string()
    };
    if sandbox.contains("cgroup v1 memory") {
        let line = memory_line(&worker_cgroups);
        assert!(
            line.contains("/ferrepl-"),
            "status says cgroup, but the worker is not in a ferrepl memory group: {worker_cgroups:?}"
        );
        assert!(
            memory_line(&job_cgroups).contains("/ferrepl-"),
            "status says cgroup, but the job is not in a ferrepl memory group: {job_cgroups:?}"
        );
        let path = line.splitn(3, ':').nth(2).unwrap_or_default();
        let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
        let limit = std::fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap_or_default();
        assert_eq!(
            limit.trim(),
            (300u64 << 20).to_string(),
            "limit of {}",
            dir.display()
        );

        let reset = server
            .call("python_sessions", json!({ "action": "reset" }))
            .await;
        assert!(!reset.is_error, "{reset:#?}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while dir.exists() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the old session's cgroup {} was not removed after reset",
                dir.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        assert!(
            sandbox.contains("process-tree watch"),
            "without cgroups the status must say what enforces the limits: {sandbox:?}"
        );
    }
    server.assert_alive();
    server.close_and_wait().await;
}

/// Threads are not processes to the process-tree watch: a session that
/// starts many (numeric libraries start one per core) is not taken for a
/// fork bomb and killed. The kernel's RLIMIT_NPROC (--max-processes, set
/// on the session's uid) counts threads too: past it a thread is refused
/// (RuntimeError in the cell), and the session lives on.
#[tokio::test]
async fn many_threads_are_not_a_fork_bomb() {
    let mut server = StdioServer::start(&["--max-processes", "64"]).await;
    let code = "import threading\n\
gate = threading.Event()\n\
threads, refused = [], None\n\
for _ in range(600):\n\
\x20   t = threading.Thread(target=gate.wait)\n\
\x20   try:\n\
\x20       t.start()\n\
\x20   except RuntimeError as e:\n\
\x20       refused = str(e)\n\
\x20       break\n\
\x20   threads.append(t)\n\
alive = sum(t.is_alive() for t in threads)\n\
gate.set()\n\
for t in threads:\n    t.join()\n\
(alive, refused)";
    let out = server.exec(code).await;
    out.assert_ok();
    let value = out.value().unwrap_or_default().to_string();
    let started: u32 = value
        .trim_start_matches('(')
        .split(',')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("(alive, refused): {out:#?}"));
    assert!(
        (16..64).contains(&started) && value.contains("can't start new thread"),
        "threads up to the uid's 64 tasks, then refused: {out:#?}"
    );
    let after = server.exec("alive").await;
    after.assert_ok();
    assert_eq!(
        after.value(),
        Some(started.to_string().as_str()),
        "the session survived: {after:#?}"
    );
    server.assert_alive();
    server.close_and_wait().await;
}
