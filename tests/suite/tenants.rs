//! Serving many agents from one HTTP instance: tokens naming tenants, each
//! tenant's sessions, workspace and transport sessions invisible to the
//! others; the token file reloaded on SIGHUP; health, readiness and
//! metrics; the instance's session budget; draining on SIGTERM.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::support::{
    Client, HttpServer, Launch, Reaper, Recorder, ToolOutput, call, finish, http_exchange,
    path_str, processes_with_arg, py_path, raw_http, session_row, start_call, wait_process_gone,
};

const ALPHA: &str = "alpha-token-0123456789abcdef";
const BETA: &str = "beta-token-0123456789abcdef0";
const GAMMA: &str = "gamma-token-0123456789abcdef";

fn tokens_file(dir: &Path, lines: &str) -> PathBuf {
    let path = dir.join("tokens");
    std::fs::write(&path, lines).expect("write the tokens file");
    path
}

/// A server with a tokens file holding `lines`; the directory holding the
/// file lives as long as the returned guard.
async fn serve(lines: &str, extra: &[&str]) -> (tempfile::TempDir, HttpServer) {
    let dir = tempfile::tempdir().expect("a directory for the tokens file");
    let tokens = tokens_file(dir.path(), lines);
    let server = start(&tokens, extra).await;
    (dir, server)
}

async fn start(tokens: &Path, extra: &[&str]) -> HttpServer {
    let mut args = vec!["--auth-token-file", path_str(tokens)];
    if !extra.contains(&"--warm-pool") {
        args.extend(["--warm-pool", "0"]);
    }
    args.extend_from_slice(extra);
    HttpServer::start(&args, &[]).await
}

/// A server with tenants alpha and beta, and a client of each on `/mcp`.
async fn two_tenants(extra: &[&str]) -> (tempfile::TempDir, HttpServer, Client, Client) {
    let (dir, server) = serve(&format!("{ALPHA} alpha\n{BETA} beta\n"), extra).await;
    let alpha = server.connect_at("/mcp", ALPHA).await;
    let beta = server.connect_at("/mcp", BETA).await;
    (dir, server, alpha, beta)
}

async fn exec(client: &Client, code: &str) -> ToolOutput {
    call(client.peer(), "python_exec", json!({ "code": code })).await
}

/// Sends `signal` to the server and waits until its log shows `logged`.
async fn signal_logged(server: &HttpServer, signal: nix::sys::signal::Signal, logged: &str) {
    let pid = nix::unistd::Pid::from_raw(server.child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, signal).expect("signal the server");
    assert!(
        server.wait_log(logged, Duration::from_secs(20)).await,
        "no '{logged}' after {signal}:\n{}",
        server.stderr_log()
    );
}

/// Writes `contents` to the tokens file, sends SIGHUP and waits until the
/// log shows `logged`.
async fn reload_logged(server: &HttpServer, tokens: &Path, contents: String, logged: &str) {
    std::fs::write(tokens, contents).expect("write the tokens file");
    signal_logged(server, nix::sys::signal::Signal::SIGHUP, logged).await;
}

/// GET `path` with `headers`; the status and the whole body.
async fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    http_exchange(port, "GET", path, headers, "").await
}

#[tokio::test]
async fn tenants_see_only_their_own_sessions_files_and_transport_sessions() {
    let (_dir, mut server) =
        serve(&format!("# two teams\n{ALPHA} alpha\n{BETA} beta\n"), &[]).await;
    let root = server.workdir.path().canonicalize().unwrap();

    let alpha = server.connect_at("/t/alpha/mcp", ALPHA).await;
    let out = exec(
        &alpha,
        "import os\nsecret = 'alpha-only'\nopen('mine.txt', 'w').write('alpha data')\nos.getcwd()",
    )
    .await;
    assert!(!out.is_error, "{out:#?}");
    assert!(
        out.text.contains(&format!("{}/alpha", root.display())),
        "alpha works in <workdir>/alpha: {}",
        out.text
    );

    // Beta, on the plain /mcp path (its token decides), shares a session
    // name with alpha but not the session.
    let beta = server.connect_at("/mcp", BETA).await;
    let out = exec(&beta, "secret").await;
    assert!(out.is_error && out.text.contains("NameError"), "{out:#?}");
    let alpha_file = root.join("alpha/mine.txt");
    let probe = format!(
        "import os\nfor p in [{}, {}]:\n    try:\n        print(p, 'READ', open(p).read() if os.path.isfile(p) else os.listdir(p))\n    except Exception as e:\n        print(p, 'DENIED', type(e).__name__)\nprint(sorted(os.listdir('.')))",
        py_path(&alpha_file),
        py_path(&root),
    );
    let out = exec(&beta, &probe).await;
    assert!(!out.is_error, "{out:#?}");
    assert!(
        !out.text.contains("alpha data") && !out.text.contains("'alpha'"),
        "beta must neither read alpha's files nor list the tenants: {}",
        out.text
    );
    let listed = call(beta.peer(), "python_sessions", json!({ "action": "list" })).await;
    assert!(!listed.text.contains("alpha"), "{}", listed.text);

    // A token used on another tenant's path is refused; so is a path for a
    // tenant that does not exist, and no token at all.
    let host = format!("127.0.0.1:{}", server.port);
    let body = crate::support::initialize_body();
    let post = |path: &'static str, token: &'static str| {
        let host = host.clone();
        let body = body.clone();
        async move {
            let auth = format!("Bearer {token}");
            let mut headers = vec![
                ("Host", host.as_str()),
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
            ];
            if !token.is_empty() {
                headers.push(("Authorization", auth.as_str()));
            }
            raw_http(server.port, "POST", path, &headers, &body).await
        }
    };
    let (code, head) = post("/t/alpha/mcp", BETA).await;
    assert_eq!(code, 403, "beta's token on alpha's path: {head}");
    let (code, head) = post("/t/nobody/mcp", BETA).await;
    assert_eq!(
        code, 403,
        "beta's token on an unknown tenant's path: {head}"
    );
    let (code, _) = post("/t/alpha/mcp", "").await;
    assert_eq!(code, 401);

    // Alpha's transport session id means nothing at beta's endpoint.
    let (code, head) = post("/t/alpha/mcp", ALPHA).await;
    assert_eq!(code, 200, "{head}");
    let alpha_session = crate::support::mcp_session_id(&head);
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;
    let beta_auth = format!("Bearer {BETA}");
    let (code, head) = raw_http(
        server.port,
        "POST",
        "/mcp",
        &[
            ("Host", &host),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Authorization", &beta_auth),
            ("Mcp-Session-Id", &alpha_session),
            ("Mcp-Protocol-Version", "2025-06-18"),
        ],
        list,
    )
    .await;
    assert_eq!(
        code, 404,
        "alpha's transport session with beta's token: {head}"
    );

    // Alpha still has its variable.
    let out = exec(&alpha, "secret").await;
    assert!(out.text.contains("alpha-only"), "{out:#?}");
    server.assert_alive();
}

/// Clients of the stateless protocol (no initialize, no Mcp-Session-Id)
/// reach their tenant's sessions the same way.
#[tokio::test]
async fn stateless_requests_reach_the_tenant_of_their_token() {
    // Per-client defaults name a session per connection; stateless requests
    // have none, so they share the tenant's default session (one new
    // session per request would fill the tenant's budget).
    let (_dir, server) = serve(
        &format!("{ALPHA} alpha\n{BETA} beta\n"),
        &["--default-session", "per-client"],
    )
    .await;
    let host = format!("127.0.0.1:{}", server.port);
    let stateless = |token: &'static str, id: u32, code: &str| {
        let host = host.clone();
        let body = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {
                "name": "python_exec",
                "arguments": { "code": code },
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": { "name": "t", "version": "0" },
                    "io.modelcontextprotocol/clientCapabilities": {}
                }
            }
        })
        .to_string();
        async move {
            let auth = format!("Bearer {token}");
            http_exchange(
                server.port,
                "POST",
                "/mcp",
                &[
                    ("Host", &host),
                    ("Content-Type", "application/json"),
                    ("Accept", "application/json, text/event-stream"),
                    ("MCP-Protocol-Version", "2026-07-28"),
                    ("Mcp-Method", "tools/call"),
                    ("Mcp-Name", "python_exec"),
                    ("Authorization", &auth),
                ],
                &body,
            )
            .await
        }
    };
    let (code, body) = stateless(ALPHA, 1, "kept = 'alpha-stateless'").await;
    assert_eq!(code, 200, "{body}");
    let (_, body) = stateless(ALPHA, 2, "kept").await;
    assert!(body.contains("alpha-stateless"), "{body}");
    let (_, body) = stateless(BETA, 3, "kept").await;
    assert!(
        body.contains("NameError") && !body.contains("alpha-stateless"),
        "{body}"
    );
}

/// A drained instance restarted on the same state directory gives each
/// tenant its sessions back: a new server is a new conversation, so each
/// tenant's 'default' comes back as 'earlier-default', and the state the
/// drain saved is loaded when the tenant names it (no cell re-run).
#[tokio::test]
async fn a_restarted_instance_resumes_each_tenants_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path(), &format!("{ALPHA} alpha\n{BETA} beta\n"));
    let work = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let launch = |extra: &[&str]| {
        let mut args = vec![
            "--workdir",
            path_str(work.path()),
            "--state-dir",
            path_str(&state),
            "--auth-token-file",
            path_str(&tokens),
            "--warm-pool",
            "0",
        ];
        args.extend_from_slice(extra);
        Launch::new(&args).without_workdir_flag()
    };
    let drain = |mut server: HttpServer| async move {
        let pid = nix::unistd::Pid::from_raw(server.child.id().expect("pid") as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        tokio::time::timeout(Duration::from_secs(60), server.child.wait())
            .await
            .expect("the drained server exits")
            .expect("wait");
    };
    // Over HTTP the token's shared default stays itself across restarts
    // (only a stdio server, a conversation of its own, renames it
    // earlier-default): resumed from its saved state.
    const EARLIER: &str = "default";
    let resumed = async |client: &Client, code: &str, value: &str| {
        let out = call(
            client.peer(),
            "python_exec",
            json!({ "session": EARLIER, "code": code }),
        )
        .await;
        let said = out.notes_text();
        assert!(
            !out.is_error
                && out.value() == Some(value)
                && said.contains("Session 'default' was resumed from its state saved")
                && said.contains("no cell was re-run"),
            "{out:#?}"
        );
    };
    let first = HttpServer::launch(launch(&[])).await;
    let alpha = first.connect_at("/mcp", ALPHA).await;
    let beta = first.connect_at("/mcp", BETA).await;
    assert!(!exec(&alpha, "team = 'alpha'; n = 41").await.is_error);
    assert!(!exec(&beta, "team = 'beta'").await.is_error);
    drain(first).await;

    let second = HttpServer::launch(launch(&[])).await;
    let alpha = second.connect_at("/mcp", ALPHA).await;
    resumed(&alpha, "team, n + 1", "('alpha', 42)").await;
    let beta = second.connect_at("/mcp", BETA).await;
    resumed(&beta, "team", "'beta'").await;
    // Each tenant's default is its own.
    let out = exec(&alpha, "team").await;
    assert_eq!(out.value(), Some("'alpha'"), "{out:#?}");
    drain(second).await;

    // What comes back counts toward the instance's budget: with room for
    // one session, alpha (started first) takes it and beta's stays stored.
    let third = HttpServer::launch(launch(&["--max-sessions", "1"])).await;
    let alpha = third.connect_at("/mcp", ALPHA).await;
    resumed(&alpha, "team", "'alpha'").await;
    let beta = third.connect_at("/mcp", BETA).await;
    let out = call(
        beta.peer(),
        "python_exec",
        json!({ "session": EARLIER, "code": "team" }),
    )
    .await;
    assert!(
        out.is_error && out.text.contains("--max-sessions"),
        "{out:#?}"
    );
    // Once there is room, beta's stored session comes back as it was (not
    // a fresh one written over its stored cells).
    let deleted = call(
        alpha.peer(),
        "python_sessions",
        json!({ "action": "delete", "session": EARLIER }),
    )
    .await;
    assert!(!deleted.is_error, "{deleted:#?}");
    resumed(&beta, "team", "'beta'").await;
}

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

/// SIGTERM: not ready at once, new sessions refused (retryable), the
/// running cell finishes and the call waiting for it gets its result, then
/// the exit.
#[tokio::test]
async fn sigterm_drains_then_exits() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path(), &format!("{ALPHA} alpha\n{BETA} beta\n"));
    let mut server = start(
        &tokens,
        &["--metrics-addr", "127.0.0.1:0", "--drain-seconds", "60"],
    )
    .await;
    let metrics_port = server
        .metrics_port
        .expect("the metrics listener's port in the log");
    let recorder = Recorder::default();
    let alpha = server
        .try_connect_at("/mcp", recorder.clone(), Some(ALPHA))
        .await
        .expect("connect as alpha");
    let gate = server.workdir.path().join("alpha/gate");
    let code = format!(
        "import os, time\nwhile not os.path.exists({}):\n    time.sleep(0.02)\n'finished'",
        py_path(&gate)
    );
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": code, "wait_s": 0 }),
    )
    .await;
    assert!(out.text.contains("running"), "{out:#?}");

    signal_logged(
        &server,
        nix::sys::signal::Signal::SIGTERM,
        "SIGTERM: draining",
    )
    .await;
    let (code, body) = get(metrics_port, "/readyz", &[]).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("draining"), "{body}");
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": "1", "session": "another" }),
    )
    .await;
    assert!(
        out.is_error && out.text.contains("draining") && out.text.contains("retry"),
        "{out:#?}"
    );
    let (_, metrics) = get(metrics_port, "/metrics", &[]).await;
    assert!(
        metrics.contains("ferrepl_draining 1")
            && metrics.contains(r#"ferrepl_admission_refusals_total{reason="draining"} 1"#),
        "{metrics}"
    );

    // A token revoked during the drain stops working at once.
    let host = format!("127.0.0.1:{}", server.port);
    let beta_auth = format!("Bearer {BETA}");
    let as_beta = [
        ("Host", host.as_str()),
        ("Authorization", beta_auth.as_str()),
    ];
    assert_eq!(get(server.port, "/healthz", &as_beta).await.0, 200);
    tokens_file(dir.path(), &format!("{ALPHA} alpha\n"));
    signal_logged(
        &server,
        nix::sys::signal::Signal::SIGHUP,
        "SIGHUP: tokens reloaded",
    )
    .await;
    assert_eq!(get(server.port, "/healthz", &as_beta).await.0, 401);

    // The cell is let finish and the call waiting for it (in flight: its
    // first progress report arrived) gets its result.
    let waiting = start_call(alpha.peer(), "python_wait", json!({ "wait_s": 60 })).await;
    let token = waiting.progress_token.clone();
    recorder.wait_progress(&token, |_| true).await;
    std::fs::write(&gate, "").unwrap();
    let out = finish(waiting).await;
    assert!(out.text.contains("finished"), "{out:#?}");
    let status = tokio::time::timeout(Duration::from_secs(30), server.child.wait())
        .await
        .expect("the drained server exits by itself")
        .expect("wait");
    assert!(status.success(), "{status}");
    assert!(
        server.stderr_log().contains("drained"),
        "{}",
        server.stderr_log()
    );
}

/// A result no call is collecting does not hold the drain: with no cell
/// running, SIGTERM exits at once (the result stays in the store).
#[tokio::test]
async fn an_uncollected_result_does_not_hold_the_drain() {
    let (_dir, mut server) = serve(&format!("{ALPHA} alpha\n"), &["--drain-seconds", "60"]).await;
    let alpha = server.connect_at("/mcp", ALPHA).await;
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": "import time; time.sleep(0.5); 'done'", "wait_s": 0 }),
    )
    .await;
    assert!(out.text.contains("running"), "{out:#?}");
    // It finishes with no call collecting it (the state changes with no
    // notification, so this polls the listing, which collects nothing).
    let finished = async {
        loop {
            if session_row(alpha.peer(), "default").await["state"] == "idle" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), finished)
        .await
        .expect("the cell finishes");
    signal_logged(
        &server,
        nix::sys::signal::Signal::SIGTERM,
        "SIGTERM: draining",
    )
    .await;
    // Far inside the 60 s drain.
    let status = tokio::time::timeout(Duration::from_secs(30), server.child.wait())
        .await
        .expect("a drain holding only an uncollected result ends at once")
        .expect("wait");
    assert!(status.success(), "{status}");
    assert!(
        server.stderr_log().contains("drained"),
        "{}",
        server.stderr_log()
    );
}

#[tokio::test]
async fn a_second_sigterm_ends_the_drain_at_once() {
    let (_dir, mut server) = serve(&format!("{ALPHA} alpha\n"), &["--drain-seconds", "600"]).await;
    let alpha = server.connect_at("/mcp", ALPHA).await;
    let out = call(
        alpha.peer(),
        "python_exec",
        json!({ "code": "import time; time.sleep(3600)", "wait_s": 0 }),
    )
    .await;
    assert!(out.text.contains("running"), "{out:#?}");
    signal_logged(
        &server,
        nix::sys::signal::Signal::SIGTERM,
        "SIGTERM: draining",
    )
    .await;
    let pid = nix::unistd::Pid::from_raw(server.child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    // Well inside the 600 s drain.
    let status = tokio::time::timeout(Duration::from_secs(60), server.child.wait())
        .await
        .expect("a second SIGTERM must end the server")
        .expect("wait");
    assert!(status.success(), "{status}");
    assert!(server.stderr_log().contains("second SIGTERM"));
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
