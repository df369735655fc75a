//! /dev/shm is private to each session, reset, and counted against the
//! memory limit.

use std::path::Path;

use serde_json::json;

use crate::support::{
    ATTEMPT, StdioServer, assert_succeeded, outcome, py, py_path, run_cell, run_job, unique,
};

use super::*;

#[tokio::test]
async fn dev_shm_is_private_to_each_session_and_reset() {
    let marker = unique("ferrepl-escape-shm-");
    let host_path = Path::new("/dev/shm").join(&marker);
    let _cleanup = Cleanup(vec![host_path.clone()]);
    let mut server = StdioServer::start(&[]).await;
    let shm = py_path(&host_path);

    let write = run_cell(
        &server,
        "a",
        &format!(
            "{ATTEMPT}\ndef put():\n    with open({shm}, 'w') as f:\n        return f.write('x')\n\
             attempt('write', put)\nattempt('exists', lambda: os.path.exists({shm}))\n"
        ),
    )
    .await;
    assert_succeeded(&write, "write");
    assert_eq!(outcome(&write, "exists"), "OK True", "{write:#?}");

    assert!(
        !host_path.exists(),
        "session a's /dev/shm file appeared in the host's /dev/shm"
    );

    let look = format!(
        "{ATTEMPT}\nattempt('exists', lambda: os.path.exists({shm}))\n\
         attempt('listed', lambda: {m} in os.listdir('/dev/shm'))\n",
        m = py(&marker)
    );
    let b = run_cell(&server, "b", &look).await;
    assert_eq!(
        outcome(&b, "exists"),
        "OK False",
        "session b sees a's /dev/shm file: {b:#?}"
    );
    assert!(
        outcome(&b, "listed") != "OK True",
        "session b lists a's /dev/shm file: {b:#?}"
    );

    let job = run_job(
        &server,
        json!({ "command": format!("test -e {} && echo present || echo absent", host_path.display()) }),
    )
    .await;
    assert!(
        job.str_field("stdout").contains("absent"),
        "a shell job sees session a's /dev/shm file: {job:#?}"
    );

    let reset = server
        .call(
            "python_sessions",
            json!({ "action": "reset", "session": "a" }),
        )
        .await;
    assert!(!reset.is_error, "resetting session a failed: {reset:#?}");
    let after = run_cell(&server, "a", &look).await;
    assert_eq!(
        outcome(&after, "exists"),
        "OK False",
        "session a's /dev/shm file survived a reset: {after:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn dev_shm_is_counted_against_the_memory_limit() {
    // Room for the sandbox's own processes (launcher, init, the supervisor
    // of protected places: ~35 MiB of resident memory in a debug build).
    const LIMIT_MIB: u64 = 96;
    const WRITE_MIB: u64 = 160;
    let marker = unique("ferrepl-escape-shm-big-");
    let host_path = Path::new("/dev/shm").join(&marker);
    let _cleanup = Cleanup(vec![host_path.clone()]);
    let mut server = StdioServer::start(&["--memory-limit", &format!("{LIMIT_MIB}M")]).await;

    let code = format!(
        r#"
import os
chunk = b"\1" * (1 << 20)
fd = os.open({shm}, os.O_WRONLY | os.O_CREAT, 0o600)
written = 0
try:
    for _ in range({WRITE_MIB}):
        os.write(fd, chunk)
        written += 1
        if written % 8 == 0:
            print(f"progress={{written}}", flush=True)
finally:
    print(f"wrote={{written}}", flush=True)
"#,
        shm = py_path(&host_path),
    );
    let out = server
        .call(
            "python_exec",
            json!({ "code": code, "session": "big", "wait_s": 60 }),
        )
        .await;
    assert_ne!(
        out.structured["status"], "running",
        "the cell should have ended: {out:#?}"
    );
    let stdout = out.structured["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout.contains("progress=8\n"),
        "writing into /dev/shm should work up to the limit: {out:#?}"
    );
    assert!(
        !stdout.contains(&format!("wrote={WRITE_MIB}")),
        "{WRITE_MIB} MiB went into /dev/shm under --memory-limit {LIMIT_MIB}M: {out:#?}"
    );
    assert!(
        !host_path.exists(),
        "the session's /dev/shm file is in the host's /dev/shm (and outlives the session)"
    );

    server.assert_alive();
    server.close_and_wait().await;
}
