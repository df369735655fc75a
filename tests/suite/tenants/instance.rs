//! The instance's own surface: health, readiness and metrics by the
//! listeners' rules, JSON logs, and the settings refused at start.

use std::time::Duration;

use super::{ALPHA, exec, get, start, tokens_file};
use crate::support::{HttpServer, Launch, path_str};

#[tokio::test]
async fn health_readiness_and_metrics_follow_the_listeners_rules() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path(), &format!("{ALPHA} alpha\n"));
    let server = start(&tokens, &["--metrics-addr", "127.0.0.1:0"]).await;
    let metrics_port = server
        .metrics_port
        .expect("the metrics listener's port in the log");
    let host = format!("127.0.0.1:{}", server.port);
    let auth = format!("Bearer {ALPHA}");
    let main = [("Host", host.as_str()), ("Authorization", auth.as_str())];

    let (code, body) = get(server.port, "/healthz", &main).await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, body) = get(server.port, "/readyz", &main).await;
    assert_eq!((code, body.as_str()), (200, "ready\n"));
    // The main listener wants the token and a known Host.
    let (code, _) = get(server.port, "/metrics", &[("Host", &host)]).await;
    assert_eq!(code, 401);
    let (code, body) = get(
        server.port,
        "/metrics",
        &[("Host", "10.1.2.3:8000"), ("Authorization", &auth)],
    )
    .await;
    assert_eq!(code, 403, "{body}");
    // A tenant's token does not read the whole instance's metrics there.
    let (code, body) = get(server.port, "/metrics", &main).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("--metrics-addr"), "{body}");
    // The metrics listener wants neither (a kubelet sends the pod's IP).
    let (code, body) = get(metrics_port, "/readyz", &[("Host", "10.1.2.3:9100")]).await;
    assert_eq!((code, body.as_str()), (200, "ready\n"));

    let alpha = server.connect_at("/mcp", ALPHA).await;
    for i in 0..3 {
        assert!(!exec(&alpha, &format!("{i} + 1")).await.is_error);
    }
    let (code, body) = get(metrics_port, "/metrics", &[]).await;
    assert_eq!(code, 200);
    assert!(body.contains("ferrepl_up 1"), "{body}");
    assert!(body.contains("tenant=\"alpha\""), "{body}");
    assert!(
        metric_sum(&body, "ferrepl_tool_calls_total") >= 3.0,
        "three python_exec calls must be counted:\n{body}"
    );
    assert!(metric_sum(&body, "ferrepl_cells_total") >= 3.0, "{body}");
}

/// The sum of every sample of `family` (any labels).
fn metric_sum(body: &str, family: &str) -> f64 {
    body.lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Starts `launch`, which must exit at once with a failure; its stderr.
async fn refused_start(launch: Launch) -> String {
    let mut spawned = launch.spawn_stdio();
    let status = tokio::time::timeout(Duration::from_secs(30), spawned.child.wait())
        .await
        .expect("the server refuses at once")
        .expect("wait");
    spawned.stderr.wait_closed(Duration::from_secs(10)).await;
    let err = spawned.stderr.text();
    assert!(!status.success(), "the server started: {err}");
    err
}

#[tokio::test]
async fn tenant_tokens_need_http() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path(), &format!("{ALPHA} alpha\n"));
    let err = refused_start(Launch::new(&["--auth-token-file", path_str(&tokens)])).await;
    assert!(err.contains("--http"), "{err}");
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let mut server = HttpServer::start(&["--log-format", "json", "--warm-pool", "0"], &[]).await;
    let client = server.connect(None).await;
    assert!(!exec(&client, "1").await.is_error);
    let log = server.stderr_log();
    let mut lines = 0;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
        lines += 1;
    }
    assert!(lines >= 2, "{log}");
    server.assert_alive();
}

/// Nothing writable may be shared between tenants, and their stores may not
/// sit where a tenant's workspace could be.
#[tokio::test]
async fn tenants_refuse_shared_writable_places_and_no_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path(), &format!("{ALPHA} alpha\n"));
    let shared = dir.path().join("shared");
    let venv = shared.join("venv");
    let work = dir.path().join("work");
    let inside = work.join("state");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let refusals: [(&[&str], &str); 4] = [
        (&["--allow-write", path_str(&shared)], "--allow-write"),
        (&["--venv", path_str(&venv)], "--venv"),
        (&["--state-dir", path_str(&inside)], "--state-dir"),
        // Nothing would keep one tenant out of another's workspace.
        (&["--sandbox", "off"], "tenants need a sandbox"),
    ];
    for (extra, flag) in refusals {
        let mut args = vec![
            "--http",
            "127.0.0.1:0",
            "--workdir",
            path_str(&work),
            "--auth-token-file",
            path_str(&tokens),
        ];
        args.extend_from_slice(extra);
        let err = refused_start(Launch::new(&args).without_workdir_flag()).await;
        assert!(err.contains(flag), "{extra:?}: {err}");
    }
}
