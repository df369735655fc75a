//! The tokens file reloaded on SIGHUP (a bad file keeps the old tokens), and
//! a revoked tenant's running work killed at the reload.

use std::time::Duration;

use super::{ALPHA, BETA, GAMMA, exec, reload_logged, serve, two_tenants};
use crate::support::{Reaper, call, processes_with_arg, wait_process_gone};
use serde_json::json;

#[tokio::test]
async fn sighup_reloads_the_tokens_and_a_bad_file_keeps_the_old_ones() {
    let (dir, mut server) = serve(&format!("{ALPHA} alpha\n"), &[]).await;
    let tokens = dir.path().join("tokens");
    assert!(
        server
            .try_connect_at("/mcp", (), Some(GAMMA))
            .await
            .is_err()
    );

    let reload = async |contents: String, logged: &str| {
        reload_logged(&server, &tokens, contents, logged).await;
    };
    reload(format!("{GAMMA} gamma\n"), "tokens reloaded").await;
    let gamma = server.connect_at("/t/gamma/mcp", GAMMA).await;
    assert!(!exec(&gamma, "1 + 1").await.is_error);
    assert!(
        server
            .try_connect_at("/mcp", (), Some(ALPHA))
            .await
            .is_err(),
        "a token removed from the file must stop working"
    );

    // A file that does not parse changes nothing.
    reload("short gamma\n".into(), "the tokens were not reloaded").await;
    let again = server.connect_at("/mcp", GAMMA).await;
    assert!(!exec(&again, "2").await.is_error);
    server.assert_alive();
}

/// The pids (as the test sees them) of processes with `marker` among their
/// arguments, once there is one (bounded).
async fn marked_processes(marker: &str) -> Vec<u32> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pids = processes_with_arg(marker);
        if !pids.is_empty() {
            return pids;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no process with argument {marker} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Removing a tenant's token ends its running work at the reload (its
/// interpreters, what they started, its jobs), not when that work would
/// have ended; other tenants are untouched; the token's return brings the
/// tenant's sessions back, with the reason their cells and jobs ended.
#[tokio::test]
async fn a_revoked_tenants_running_work_is_killed_at_the_reload() {
    let (dir, mut server, alpha, beta) = two_tenants(&["--tools", "all"]).await;
    let tokens = dir.path().join("tokens");
    let in_cell = format!("beta-cell-{}", std::process::id());
    let in_job = format!("beta-job-{}", std::process::id());
    let _reaper = Reaper {
        markers: vec![in_cell.clone(), in_job.clone()],
        pids: Vec::new(),
    };
    assert!(!exec(&alpha, "y = 1").await.is_error);
    let code = format!(
        "import subprocess, time\nsubprocess.Popen(['sh', '-c', 'sleep 600; true', '{in_cell}'])\nwhile True:\n    time.sleep(0.05)"
    );
    let cell = call(
        beta.peer(),
        "python_exec",
        json!({ "code": code, "wait_s": 0 }),
    )
    .await;
    assert_eq!(cell.structured["status"], "running", "{cell:#?}");
    let command = format!("sh -c 'sleep 600; true' {in_job}");
    let job = call(
        beta.peer(),
        "shell_exec",
        json!({ "command": command, "wait_s": 0 }),
    )
    .await;
    assert!(!job.is_error, "{job:#?}");
    let mut doomed = marked_processes(&in_cell).await;
    doomed.extend(marked_processes(&in_job).await);
    doomed.push(job.structured["pid"].as_u64().expect("the job's pid") as u32);

    let revoked = "tenant 'beta' revoked: 1 interpreter(s) and 1 job(s) killed";
    reload_logged(&server, &tokens, format!("{ALPHA} alpha\n"), revoked).await;
    for pid in doomed {
        assert!(
            wait_process_gone(pid, Duration::from_secs(30)).await,
            "process {pid} of the revoked tenant still runs"
        );
    }
    let out = exec(&alpha, "y").await;
    assert!(!out.is_error && out.text.contains('1'), "{out:#?}");

    let both = format!("{ALPHA} alpha\n{BETA} beta\n");
    reload_logged(&server, &tokens, both, "tenant 'beta' reinstated").await;
    let back = server.connect_at("/mcp", BETA).await;
    let ended = call(back.peer(), "python_wait", json!({ "wait_s": 30 })).await;
    assert!(
        ended.text.contains(
            "The operator revoked this tenant's token, so ferrepl ended session 'default'"
        ),
        "{ended:#?}"
    );
    let job = call(
        back.peer(),
        "shell_wait",
        json!({ "job": "j1", "wait_s": 30 }),
    )
    .await;
    assert!(
        job.text.contains("killed by SIGKILL")
            && job
                .text
                .contains("The operator revoked this tenant's token, so ferrepl killed the job."),
        "{job:#?}"
    );
    let out = exec(&back, "1 + 1").await;
    assert!(!out.is_error && out.text.contains('2'), "{out:#?}");
    server.assert_alive();
}
