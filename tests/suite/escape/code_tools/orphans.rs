//! An upstream's detached grandchild ends with the server, SIGKILLed or shut
//! down normally.

use std::path::Path;

use serde_json::json;

use crate::support::upstreams::{minimal_upstream_with_children, write_servers_file};
use crate::support::{EXIT_TIMEOUT, Reaper, StdioServer};

use super::*;

/// A server whose upstream `c` started a detached `sleep` (setsid): the
/// server, and the `(host pid, argv marker)` of the upstream's launcher,
/// its interpreter and the sleep, all checked alive; a reaper of them.
async fn upstream_with_a_detached_grandchild(
    dir: &Path,
) -> (StdioServer, Vec<(u32, String)>, Reaper) {
    let c = minimal_upstream_with_children(dir);
    let script = c["args"][0].as_str().expect("script").to_string();
    let file = write_servers_file(dir, json!({ "c": c }));
    let server = StdioServer::launch(with_servers(&file, &[])).await;
    // A duration no other process is likely to use: it marks our sleep.
    let seconds = 1000
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_micros() % 100_000)
            .unwrap_or(0);
    let answer = cell_json(
        &server,
        "default",
        &format!("import ferrepl, json\nprint(json.dumps(ferrepl.call('c', 'children', seconds={seconds})))"),
    )
    .await;
    let answer = answer.as_str().expect("a text answer").to_string();
    let [upstream, sleep] = upstream_host_pids(&answer)[..] else {
        panic!("expected two pids in {answer:?}");
    };
    let launchers = upstream_launchers(server.pid());
    assert!(
        !launchers.is_empty(),
        "no containment launcher under the server"
    );
    let mut procs: Vec<(u32, String)> = launchers
        .into_iter()
        .map(|pid| (pid, "__ferrepl-upstream".to_string()))
        .collect();
    assert_ne!(
        session_of(sleep),
        session_of(upstream),
        "the sleep is in a session of its own (setsid)"
    );
    procs.push((upstream, script));
    procs.push((sleep, seconds.to_string()));
    for (pid, arg) in &procs {
        assert!(
            !gone(*pid, arg),
            "process {pid} ({arg}) should be alive before the server ends"
        );
    }
    let reaper = Reaper {
        markers: Vec::new(),
        pids: procs.clone(),
    };
    (server, procs, reaper)
}

/// SIGKILL leaves ferrepl no chance to clean up: the upstream's whole
/// tree, a grandchild in a session of its own included, still ends with
/// it (parent-death signal, PID namespace).
#[tokio::test]
async fn an_upstreams_detached_grandchild_dies_with_a_sigkilled_server() {
    let dir = outside();
    let (server, procs, _reaper) = upstream_with_a_detached_grandchild(dir.path()).await;
    let log_tail = server.stderr_log();
    server.sigkill_and_reap(EXIT_TIMEOUT).await;
    let left = wait_all_gone(&procs, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "after SIGKILL of the server these upstream processes survived {GONE_TIMEOUT:?}: {left:?} \
         (of launcher, upstream, detached sleep: {procs:?}); server log:\n{}",
        crate::support::tail(&log_tail, 3000)
    );
}

/// A normal shutdown (stdin closed) ends the upstream's whole tree too.
#[tokio::test]
async fn an_upstreams_detached_grandchild_ends_with_a_normal_shutdown() {
    let dir = outside();
    let (server, procs, _reaper) = upstream_with_a_detached_grandchild(dir.path()).await;
    let status = server.close_and_wait().await;
    assert!(status.success(), "the server exited with {status:?}");
    let left = wait_all_gone(&procs, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "after the server's shutdown these upstream processes survived {GONE_TIMEOUT:?}: {left:?} (of {procs:?})"
    );
}
