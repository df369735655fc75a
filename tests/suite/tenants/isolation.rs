//! Tenants kept apart: each sees only its own sessions, files and transport
//! sessions, stateless requests reach their token's tenant, and a restarted
//! instance resumes each tenant's sessions.

use std::time::Duration;

use super::{ALPHA, BETA, exec, serve, tokens_file};
use crate::support::{
    Client, HttpServer, Launch, call, http_exchange, path_str, py_path, raw_http,
};
use serde_json::json;

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
