//! One tenant's event streams stop at its share; another tenant is served.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::call;

use super::*;

/// Tenant alice opens more event streams than her share (--max-connections
/// 8; one MCP session, whose GET /mcp streams rmcp keeps as shadows): the
/// ones past it get 429 with Retry-After, while tenant bob initializes,
/// opens his own stream and runs python_exec. Once alice's streams close,
/// her share is hers again.
#[tokio::test]
async fn one_tenants_event_streams_stop_at_its_share() {
    const SHARE: usize = 8;
    let (server, _dir, _tokens) = start(
        &[(ALICE, "alice"), (BOB, "bob")],
        &[
            "--http-max-connections",
            "64",
            "--http-max-connections-per-peer",
            "0",
            "--max-connections",
            "8",
        ],
    )
    .await;
    let port = server.port;
    let bob = match server.try_connect_at("/mcp", (), Some(BOB)).await {
        Ok(c) => c,
        Err(e) => panic!("bob's client: {e:#}\nstderr:\n{}", server.stderr_log()),
    };
    let session = open_session(port, Some(ALICE)).await;

    let mut held = Vec::new();
    for n in 1..=SHARE {
        let (head, stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
        assert!(
            is_stream(&head),
            "alice's stream {n} of her share of {SHARE}:\n{}",
            head.0
        );
        held.push(stream);
    }
    let mut refused = Vec::new();
    for n in SHARE + 1..=SHARE + 4 {
        let (head, stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
        assert_eq!(
            head.status(),
            429,
            "alice's stream {n}, past her share of {SHARE}:\n{}",
            head.0
        );
        head.retry_after();
        assert!(
            head.body().contains("event streams"),
            "the refusal of a stream says why:\n{}",
            head.0
        );
        refused.push(stream);
    }

    // Bob keeps his: a new MCP session, an event stream, a call.
    let bob_session = open_session(port, Some(BOB)).await;
    let (head, _bob_stream) = open_stream("127.0.0.1", port, Some(BOB), &bob_session, &[]).await;
    assert!(
        is_stream(&head),
        "bob's stream while alice holds her share:\n{}",
        head.0
    );
    let out = call(bob.peer(), "python_exec", json!({ "code": "6 * 7" })).await;
    assert_eq!(out.value(), Some("42"), "bob's python_exec: {out:#?}");

    // Alice's streams end: her whole share comes back once the server sees
    // them go (polled, bounded), and no more than it.
    drop(held);
    drop(refused);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut again = Vec::new();
    while again.len() < SHARE {
        let (head, stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
        if is_stream(&head) {
            again.push(stream);
            continue;
        }
        assert_eq!(head.status(), 429, "{}", head.0);
        assert!(
            Instant::now() < deadline,
            "20 s after alice closed her streams, only {} of her share of {SHARE} came back",
            again.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (head, _stream) = open_stream("127.0.0.1", port, Some(ALICE), &session, &[]).await;
    assert_eq!(head.status(), 429, "past her share again:\n{}", head.0);
}
