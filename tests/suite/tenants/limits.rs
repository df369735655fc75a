//! What tenants share: the instance's session budget, each tenant's share of
//! it, jobs counted toward it, each tenant's memory and cpu groups, a
//! workspace's quota.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ALPHA, exec, get, serve, two_tenants};
use crate::support::{Client, call, path_str};
use serde_json::json;

#[tokio::test]
async fn the_instance_session_budget_counts_every_tenant() {
    let (_dir, _server, alpha, beta) =
        two_tenants(&["--max-sessions", "2", "--tenant-max-sessions", "2"]).await;
    // Each tenant's default session takes one of the two.
    assert!(!exec(&alpha, "1").await.is_error);
    assert!(!exec(&beta, "1").await.is_error);
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": "2", "session": "second" }),
    )
    .await;
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text.contains("--max-sessions") && out.text.contains("over all tenants"),
        "{}",
        out.text
    );
}

/// One tenant at its share leaves the others theirs: with --max-jobs 2 and
/// --max-sessions 4, each tenant gets one job and two sessions by default;
/// alpha at both limits is refused with its share named, and beta still
/// gets a job and a session.
#[tokio::test]
async fn a_tenant_at_its_share_leaves_the_others_theirs() {
    // Two pooled interpreters over the instance: one each by default.
    let (_dir, server, alpha, beta) = two_tenants(&[
        "--tools",
        "all",
        "--max-jobs",
        "2",
        "--max-sessions",
        "4",
        "--warm-pool",
        "2",
        "--metrics-addr",
        "127.0.0.1:0",
    ])
    .await;
    let shell = |client: &Client, command: &str| {
        let args = json!({ "command": command, "wait_s": 0 });
        let peer = client.peer().clone();
        async move { call(&peer, "shell_exec", args).await }
    };
    let first = shell(&alpha, "sleep 600").await;
    assert!(!first.is_error, "{first:#?}");
    let out = shell(&alpha, "sleep 600").await;
    assert!(
        out.is_error && out.text.contains("--tenant-max-jobs"),
        "{out:#?}"
    );
    let out = call(
        beta.peer(),
        "shell_exec",
        json!({ "command": "echo beta-ran", "wait_s": 30 }),
    )
    .await;
    assert!(!out.is_error && out.text.contains("beta-ran"), "{out:#?}");

    assert!(!exec(&alpha, "1").await.is_error);
    let second = json!({ "code": "2", "session": "second" });
    assert!(!call(alpha.peer(), "python_exec", second).await.is_error);
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": "3", "session": "third" }),
    )
    .await;
    // Whose limit: the tenant's share, not the instance's.
    assert!(
        out.is_error
            && out.text.contains("this tenant holds 2 sessions")
            && out.text.contains("--tenant-max-sessions")
            && !out.text.contains("--max-sessions"),
        "{out:#?}"
    );
    assert!(
        !exec(&beta, "1").await.is_error,
        "beta still gets a session"
    );

    // The shares and their refusals are in /metrics.
    let metrics_port = server.metrics_port.expect("the metrics port");
    let (_, metrics) = get(metrics_port, "/metrics", &[]).await;
    for line in [
        r#"ferrepl_limit{limit="max_sessions"} 4"#,
        r#"ferrepl_limit{limit="tenant_max_sessions"} 2"#,
        r#"ferrepl_limit{limit="tenant_max_jobs"} 1"#,
        r#"ferrepl_limit{limit="tenant_warm_pool"} 1"#,
        r#"ferrepl_limit{limit="http_max_connections"} 4096"#,
        r#"ferrepl_admission_refusals_total{reason="tenant_sessions_full"} 1"#,
        r#"ferrepl_admission_refusals_total{reason="tenant_jobs_full"} 1"#,
    ] {
        assert!(metrics.contains(line), "no {line} in:\n{metrics}");
    }

    // Installs are jobs: alpha's share holds them too.
    let out = call(
        alpha.peer(),
        "python_install",
        json!({ "packages": ["six"], "wait_s": 0 }),
    )
    .await;
    assert!(
        out.is_error && out.text.contains("--tenant-max-jobs"),
        "{out:#?}"
    );

    // The warm pool: alpha took two interpreters and refilled, yet holds at
    // most her share, and beta's pool fills to his.
    let status = call(
        alpha.peer(),
        "python_sessions",
        json!({ "action": "status" }),
    )
    .await;
    assert!(status.text.contains(" warm-pool=1"), "{}", status.text);
    let alpha_pool = pool_of(&alpha).await;
    assert!(alpha_pool <= 1, "alpha's pool holds {alpha_pool}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pool_of(&beta).await != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "beta's warm pool never got its place"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pool_of(&alpha).await <= 1);
}

/// How many interpreters the tenant's warm pool holds ready now.
async fn pool_of(client: &Client) -> usize {
    let out = call(
        client.peer(),
        "python_sessions",
        json!({ "action": "status" }),
    )
    .await;
    assert!(!out.is_error, "{out:#?}");
    out.text
        .lines()
        .find_map(|l| l.strip_prefix("warm pool: "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no warm pool line in {}", out.text))
}

#[tokio::test]
async fn jobs_count_toward_the_instance_and_never_share_a_home() {
    // Shares as large as the instance: the instance's own budget is tested.
    let (_dir, server, alpha, beta) = two_tenants(&[
        "--tools",
        "all",
        "--max-jobs",
        "2",
        "--tenant-max-jobs",
        "2",
    ])
    .await;
    // A job of `command`, waited for `wait_s` seconds.
    let shell = |client: &Client, command: &str, wait_s: u64| {
        let args = json!({ "command": command, "wait_s": wait_s });
        let peer = client.peer().clone();
        async move { call(&peer, "shell_exec", args).await }
    };
    // Alpha's job 1 leaves a mark in its home and keeps running; beta's job
    // 1 must get a home of its own.
    let mark = "echo alpha > \"$HOME/mark\"; echo >> started; sleep 600";
    let first = shell(&alpha, mark, 0).await;
    assert!(!first.is_error, "{first:#?}");
    let started = server.workdir.path().join("alpha/started");
    crate::support::wait_for_file_line(&started, Duration::from_secs(30)).await;
    let out = shell(&beta, "cat \"$HOME/mark\" 2>/dev/null || echo no-mark", 30).await;
    assert!(!out.is_error && out.text.contains("no-mark"), "{out:#?}");

    // Two of alpha's jobs fill the instance's two slots: beta is refused.
    let second = shell(&alpha, "sleep 600", 0).await;
    assert!(!second.is_error, "{second:#?}");
    let out = shell(&beta, "echo hi", 30).await;
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text.contains("--max-jobs") && out.text.contains("over all tenants"),
        "{}",
        out.text
    );
    // A finished job gives its slot back.
    let killed = call(
        alpha.peer(),
        "shell_wait",
        json!({ "job": "j2", "signal": "KILL", "wait_s": 30 }),
    )
    .await;
    assert!(killed.text.contains("killed by SIGKILL"), "{killed:#?}");
    let out = shell(&beta, "echo hi", 30).await;
    assert!(!out.is_error && out.text.contains("hi"), "{out:#?}");
}

#[tokio::test]
async fn a_tenant_runs_in_its_own_memory_and_cpu_groups() {
    let (_dir, server) = serve(
        &format!("{ALPHA} alpha\n"),
        &["--tenant-memory", "3G", "--tenant-cpu-weight", "50"],
    )
    .await;
    let alpha = server.connect_at("/mcp", ALPHA).await;
    assert!(!exec(&alpha, "1").await.is_error);
    let pid = crate::support::session_pid(alpha.peer(), "default").await;
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let dir_of = |controller: &str| -> PathBuf {
        let line = groups
            .lines()
            .find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == controller))
            })
            .unwrap_or_else(|| panic!("no {controller} line in {groups}"));
        Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(line.rsplit(':').next().unwrap().trim_start_matches('/'))
    };
    let memory = dir_of("memory");
    let tenant_memory = memory.parent().unwrap();
    assert!(
        path_str(tenant_memory).ends_with("-tenant-alpha"),
        "the session's memory group sits in the tenant's: {}",
        memory.display()
    );
    let budget = std::fs::read_to_string(tenant_memory.join("memory.limit_in_bytes")).unwrap();
    assert_eq!(budget.trim(), (3u64 << 30).to_string());
    let cpu = dir_of("cpu");
    assert!(
        path_str(&cpu).ends_with("-tenant-alpha"),
        "{}",
        cpu.display()
    );
    let shares = std::fs::read_to_string(cpu.join("cpu.shares")).unwrap();
    assert_eq!(shares.trim(), "512");
}

#[tokio::test]
async fn a_workspace_over_its_quota_refuses_new_cells() {
    let (_dir, server) = serve(&format!("{ALPHA} alpha\n"), &["--tenant-disk", "1M"]).await;
    let alpha = server.connect_at("/mcp", ALPHA).await;
    let out = exec(&alpha, "open('big.bin', 'wb').write(b'x' * 3_000_000)").await;
    assert!(!out.is_error, "{out:#?}");
    // Measured in the background: poll until it is seen (bounded).
    let mut refused = None;
    for _ in 0..100 {
        let out = exec(&alpha, "1").await;
        if out.is_error {
            refused = Some(out);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = refused.expect("a workspace of 3 MB over a 1 MB quota must refuse cells");
    assert!(out.text.contains("--tenant-disk"), "{}", out.text);
    let job = call(alpha.peer(), "shell_exec", json!({ "command": "true" })).await;
    assert!(
        job.is_error && job.text.contains("--tenant-disk"),
        "{job:#?}"
    );
}
