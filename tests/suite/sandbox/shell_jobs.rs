//! Shell jobs confined like sessions.

use crate::support::StdioServer;
use serde_json::json;

#[tokio::test]
async fn shell_jobs_are_confined_too() {
    let outside = tempfile::tempdir().expect("create a directory outside the workspace");
    let target = outside.path().join("x");
    let mut server = StdioServer::start(&[]).await;

    let touch = server
        .call(
            "shell_exec",
            json!({ "command": format!("touch {}; echo rc=$?", target.display()) }),
        )
        .await;
    assert_eq!(touch.str_field("status"), "exited", "{touch:#?}");
    let stdout = touch.str_field("stdout");
    let rc = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("rc="))
        .unwrap_or_else(|| panic!("no rc= line in the job's stdout: {touch:#?}"));
    assert_ne!(rc, "0", "touch outside the workspace succeeded: {touch:#?}");
    assert!(
        !target.exists(),
        "the job created {} outside the workspace",
        target.display()
    );

    let net = server
        .call(
            "shell_exec",
            json!({ "command": "python3 -c \"import socket; socket.socket(); print('socket created')\"" }),
        )
        .await;
    assert_eq!(net.str_field("status"), "exited", "{net:#?}");
    let code = net.structured["exit_code"].as_i64();
    assert!(
        code.is_some_and(|c| c != 0),
        "creating an internet socket in a job should fail: {net:#?}"
    );
    let combined = format!("{}\n{}", net.str_field("stdout"), net.str_field("stderr"));
    assert!(
        !combined.contains("socket created"),
        "the job created an internet socket: {net:#?}"
    );
    assert!(
        combined.contains("PermissionError") || combined.contains("Operation not permitted"),
        "the job should fail on the socket with a permission error: {net:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}
