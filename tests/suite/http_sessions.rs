//! Whose sessions are they, and does a result survive a lost response?
//!
//! Over HTTP, sessions belong to whoever holds the server's token, not to the
//! MCP connection: a client that reconnects finds its sessions and the result
//! it missed (`python_wait` delivers the last result again). Clients share
//! sessions by name; `--default-session per-client` gives each connection its
//! own default. A DELETE of a transport session that does not exist is 404.
//! Assertions read the result text, which every mode has.

use crate::support::{
    Client, HttpServer, StdioServer, ToolOutput, call, mcp_post_headers, mcp_session_id, raw_http,
    raw_post_mcp,
};
use serde_json::{Value, json};

async fn tool(client: &Client, name: &str, args: Value) -> ToolOutput {
    call(client.peer(), name, args).await
}

/// The text of a result that must not be an error.
fn ok_text(out: &ToolOutput) -> &str {
    assert!(!out.is_error, "unexpected error: {out:#?}");
    &out.text
}

#[tokio::test]
async fn delete_of_an_unknown_transport_session_is_404() {
    let server = HttpServer::start(&[], &[]).await;
    let port = server.port;
    let host = format!("127.0.0.1:{port}");
    let (status, head) = raw_http(
        port,
        "DELETE",
        "/mcp",
        &[("Host", &host), ("Mcp-Session-Id", "no-such-session")],
        "",
    )
    .await;
    assert_eq!(
        status, 404,
        "DELETE of a session that never existed: {head}"
    );

    let (status, head) = raw_post_mcp(port, &mcp_post_headers(port)).await;
    assert!((200..300).contains(&status), "initialize: {head}");
    let session = mcp_session_id(&head);
    let delete = |id: String| {
        let host = host.clone();
        async move {
            raw_http(
                port,
                "DELETE",
                "/mcp",
                &[("Host", &host), ("Mcp-Session-Id", &id)],
                "",
            )
            .await
        }
    };
    let (status, head) = delete(session.clone()).await;
    assert_eq!(status, 204, "DELETE of a live session: {head}");
    let (status, head) = delete(session).await;
    assert_eq!(status, 404, "a second DELETE of the same session: {head}");
}

#[tokio::test]
async fn clients_share_sessions_by_name_and_a_reconnecting_client_gets_the_result() {
    let server = HttpServer::start(&[], &[]).await;
    let first = server.connect(None).await;
    let out = tool(
        &first,
        "python_exec",
        json!({"code": "shared_x = 6\nshared_x * 7"}),
    )
    .await;
    assert!(ok_text(&out).contains("42"), "{out:#?}");
    // The client goes away; a new connection is the same principal.
    let _ = first.cancel().await;

    let second = server.connect(None).await;
    let again = tool(&second, "python_wait", json!({})).await;
    let text = ok_text(&again);
    assert!(text.contains("Sent again"), "{again:#?}");
    assert!(
        text.contains("42") && text.contains("-- ok | cell 1 |"),
        "{again:#?}"
    );
    let seen = tool(&second, "python_exec", json!({"code": "shared_x + 1"})).await;
    assert!(ok_text(&seen).contains('7'), "{seen:#?}");
    // A new cell acknowledges the old result: the next redelivery is cell 2's.
    let latest = tool(&second, "python_wait", json!({})).await;
    assert!(ok_text(&latest).contains("-- ok | cell 2 |"), "{latest:#?}");
    let _ = second.cancel().await;
}

#[tokio::test]
async fn per_client_default_sessions_are_separate_but_named_ones_are_shared() {
    let server = HttpServer::start(&["--default-session", "per-client"], &[]).await;
    let a = server.connect(None).await;
    let b = server.connect(None).await;

    let set = tool(&a, "python_exec", json!({"code": "mine = 'a'"})).await;
    ok_text(&set);
    let other = tool(&b, "python_exec", json!({"code": "mine"})).await;
    assert!(
        other.is_error,
        "b must not see a's default session: {other:#?}"
    );
    assert!(other.text.contains("NameError"), "{other:#?}");

    let named = tool(
        &a,
        "python_exec",
        json!({"code": "common_value = 5", "session": "team"}),
    )
    .await;
    ok_text(&named);
    let read = tool(
        &b,
        "python_exec",
        json!({"code": "common_value * 2", "session": "team"}),
    )
    .await;
    assert!(ok_text(&read).contains("10"), "{read:#?}");

    // Each connection's default exists at once: inspecting and resetting it
    // never fails as unknown.
    let inspect = tool(&b, "python_inspect", json!({})).await;
    ok_text(&inspect);
    let reset = tool(&a, "python_sessions", json!({"action": "reset"})).await;
    ok_text(&reset);
    let gone = tool(&a, "python_exec", json!({"code": "mine"})).await;
    assert!(
        gone.text.contains("NameError"),
        "reset cleared a's default: {gone:#?}"
    );
    let _ = a.cancel().await;
    let _ = b.cancel().await;
}

#[tokio::test]
async fn python_wait_repeats_the_last_result_until_a_new_cell_starts() {
    let server = StdioServer::start(&[]).await;
    let never = server
        .call("python_wait", json!({"session": "fresh"}))
        .await;
    assert!(never.is_error, "nothing ran in 'fresh' yet: {never:#?}");

    let done = server.call("python_exec", json!({"code": "6*7"})).await;
    assert!(ok_text(&done).contains("42"), "{done:#?}");
    for _ in 0..2 {
        let again = server.call("python_wait", json!({})).await;
        let text = ok_text(&again);
        assert!(
            text.contains("Sent again") && text.contains("42"),
            "{again:#?}"
        );
        assert!(text.contains("-- ok | cell 1 |"), "{again:#?}");
    }
    let failed = server.call("python_exec", json!({"code": "1/0"})).await;
    assert!(failed.is_error, "{failed:#?}");
    let again = server.call("python_wait", json!({})).await;
    assert!(
        again.is_error,
        "an error result is repeated as an error: {again:#?}"
    );
    assert!(
        again.text.contains("ZeroDivisionError") && again.text.contains("Sent again"),
        "{again:#?}"
    );
    // A reset forgets it: there is nothing left to deliver.
    let reset = server
        .call("python_sessions", json!({"action": "reset"}))
        .await;
    ok_text(&reset);
    let after = server.call("python_wait", json!({})).await;
    assert!(
        after.is_error,
        "after a reset nothing is repeated: {after:#?}"
    );
}
