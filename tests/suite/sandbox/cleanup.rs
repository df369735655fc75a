//! Every process of a session, daemonized grandchildren included, ended on
//! reset and delete.

use std::path::Path;
use std::time::Duration;

use super::GONE_TIMEOUT;
use crate::support::{
    Reaper, StdioServer, cmdline, host_pid_in_namespace, py, session_pid_namespace,
    wait_for_file_line, wait_process_gone,
};
use serde_json::json;

/// Starts a daemonized (setsid) `sleep 6002` from `session` and returns its
/// host pid once it is running (the pid file holds its pid in the session's
/// own PID namespace).
async fn start_daemon(
    server: &StdioServer,
    session: &str,
    pid_file: &Path,
    reaper: &mut Reaper,
) -> u32 {
    let script = format!("sleep 6002 & echo $! > {}; wait", pid_file.display());
    let code = format!(
        "import subprocess\n_daemon = subprocess.Popen(['setsid', 'sh', '-c', {}])",
        py(&script)
    );
    server.exec_in(session, &code).await.assert_ok();
    let namespace = session_pid_namespace(server, session).await;
    let line = wait_for_file_line(pid_file, Duration::from_secs(15)).await;
    let inner: u32 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("bad pid file content {line:?}"));
    let pid = host_pid_in_namespace(&namespace, inner);
    reaper.pids.push((pid, "6002".into()));
    // `$!` is known before the forked shell has exec'd sleep: poll (bounded)
    // until the pid runs `sleep 6002`.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !cmdline(pid).is_some_and(|argv| argv.iter().any(|a| a == "6002")) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pid {pid} from {} did not become a live `sleep 6002` (argv {:?})",
            pid_file.display(),
            cmdline(pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pid
}

#[tokio::test]
async fn reset_and_delete_kill_daemonized_grandchildren() {
    let mut server = StdioServer::start(&[]).await;
    let mut reaper = Reaper::default();

    let pid_file = server.workdir.path().join("d.pid");
    let pid = start_daemon(&server, "default", &pid_file, &mut reaper).await;
    let reset = server
        .call(
            "python_sessions",
            json!({ "action": "reset", "session": "default" }),
        )
        .await;
    assert!(!reset.is_error, "reset failed: {reset:#?}");
    assert!(
        wait_process_gone(pid, GONE_TIMEOUT).await,
        "the daemonized sleep (pid {pid}) survived a reset (python_sessions reset)"
    );

    let pid_file = server.workdir.path().join("d2.pid");
    let pid2 = start_daemon(&server, "named", &pid_file, &mut reaper).await;
    let deleted = server
        .call(
            "python_sessions",
            json!({ "action": "delete", "session": "named" }),
        )
        .await;
    assert!(!deleted.is_error, "delete failed: {deleted:#?}");
    assert!(
        wait_process_gone(pid2, GONE_TIMEOUT).await,
        "the daemonized sleep (pid {pid2}) survived python_sessions delete"
    );

    server.assert_alive();
    server.close_and_wait().await;
}
