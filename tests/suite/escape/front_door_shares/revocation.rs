//! A revoked or rotated token's open stream and connections close at the reload.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use crate::escape::front_door::read_until_closed;
use crate::support::tail;

use super::*;

/// A tenant removed from the tokens file (SIGHUP) loses its open event
/// stream at once, within a second; another tenant's stays open, and the
/// removed token gets 401.
#[tokio::test]
async fn a_revoked_tenants_open_stream_is_closed_at_the_reload() {
    let (server, _dir, tokens) = start(&[(ALICE, "alice"), (BOB, "bob")], &[]).await;
    let port = server.port;
    let alice_session = open_session(port, Some(ALICE)).await;
    let bob_session = open_session(port, Some(BOB)).await;
    let (head, mut alice_stream) =
        open_stream("127.0.0.1", port, Some(ALICE), &alice_session, &[]).await;
    assert!(is_stream(&head), "alice's stream:\n{}", head.0);
    let (head, mut bob_stream) = open_stream("127.0.0.1", port, Some(BOB), &bob_session, &[]).await;
    assert!(is_stream(&head), "bob's stream:\n{}", head.0);

    rewrite_tokens(&tokens, &[(BOB, "bob")]);
    let sent = sighup(&server);
    let ending = closed_by_reload(&server, &mut alice_stream, sent).await;
    assert!(
        ending.is_closed(),
        "alice's event stream was still open 1 s after SIGHUP removed her token (and the reload); stderr:\n{}",
        tail(&server.stderr_log(), 3000)
    );
    assert!(
        server.wait_log("tenant 'alice' revoked", ANSWER).await,
        "no revocation in the log:\n{}",
        tail(&server.stderr_log(), 3000)
    );
    let ending =
        read_until_closed(&mut bob_stream, Instant::now() + Duration::from_millis(300)).await;
    assert!(
        !ending.is_closed(),
        "bob's stream was closed with alice's: {ending:?}"
    );
    let (head, _) = mcp_post(port, Some(ALICE), Some(&alice_session), "{}").await;
    assert_eq!(head.status(), 401, "alice's removed token:\n{}", head.0);
    // Bob's session goes on.
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}"#;
    let (head, messages) = mcp_post(port, Some(BOB), Some(&bob_session), list).await;
    assert_eq!(head.status(), 200, "bob's tools/list:\n{}", head.0);
    assert!(
        messages
            .iter()
            .any(|m| m["id"] == 3 && m["result"]["tools"].is_array()),
        "bob's tools/list: {messages:?}"
    );
}

/// A tenant's token replaced (same tenant, new token) and SIGHUP: what was
/// last used with the old token (an event stream, a keep-alive connection)
/// is closed within a second, the old token gets 401, and the new one on
/// the same Mcp-Session-Id finds the tenant's Python session as it was.
#[tokio::test]
async fn a_rotated_tokens_stream_closes_and_the_tenants_session_survives() {
    let (server, _dir, tokens) = start(&[(ALICE, "alice"), (BOB, "bob")], &[]).await;
    let port = server.port;
    let session = open_session(port, Some(ALICE)).await;
    let (head, out) = python(port, ALICE, &session, "x = 41").await;
    assert_eq!(head.status(), 200, "{}", head.0);
    let out = out.expect("a result of x = 41");
    assert!(!out.is_error, "{out:#?}");
    let (head, mut stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
    assert!(is_stream(&head), "alice's stream:\n{}", head.0);
    // A keep-alive connection whose last request had the old token.
    let mut idle = connect_from("127.0.0.1", port).await;
    let auth = format!("Bearer {ALICE}");
    idle.write_all(
        request_head(port, "GET", "/healthz", &[("Authorization", &auth)], None).as_bytes(),
    )
    .await
    .expect("write GET /healthz");
    let head = expect_head(&mut idle, "GET /healthz").await;
    assert_eq!(head.status(), 200, "{}", head.0);
    let bob_session = open_session(port, Some(BOB)).await;
    let (head, mut bob_stream) = open_stream("127.0.0.1", port, Some(BOB), &bob_session, &[]).await;
    assert!(is_stream(&head), "bob's stream:\n{}", head.0);

    rewrite_tokens(&tokens, &[(ALICE_ROTATED, "alice"), (BOB, "bob")]);
    let sent = sighup(&server);
    let ending = closed_by_reload(&server, &mut stream, sent).await;
    assert!(
        ending.is_closed(),
        "alice's stream opened with her replaced token was still open 1 s after SIGHUP (and the reload); stderr:\n{}",
        tail(&server.stderr_log(), 3000)
    );
    let ending = closed_by_reload(&server, &mut idle, sent).await;
    assert!(
        ending.is_closed(),
        "alice's keep-alive connection last used with her replaced token was still open 1 s after SIGHUP (and the reload): {ending:?}"
    );
    let ending =
        read_until_closed(&mut bob_stream, Instant::now() + Duration::from_millis(300)).await;
    assert!(
        !ending.is_closed(),
        "bob's stream was closed with alice's: {ending:?}"
    );

    let (head, _) = python(port, ALICE, &session, "x + 1").await;
    assert_eq!(head.status(), 401, "the replaced token:\n{}", head.0);
    assert!(
        head.closes(),
        "a 401 without Connection: close:\n{}",
        head.0
    );
    let (head, out) = python(port, ALICE_ROTATED, &session, "x + 1").await;
    assert_eq!(
        head.status(),
        200,
        "the new token on alice's MCP session:\n{}",
        head.0
    );
    let out = out.expect("a result of x + 1");
    assert_eq!(
        out.value(),
        Some("42"),
        "alice's session after the rotation: {out:#?}"
    );
    let (head, stream_again) =
        open_stream("127.0.0.1", port, Some(ALICE_ROTATED), &session, &[]).await;
    assert!(
        is_stream(&head),
        "alice's stream with the new token:\n{}",
        head.0
    );
    drop(stream_again);
}
