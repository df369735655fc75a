//! /metrics counts each refusal by share and principal kind, and shows every share.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use crate::escape::front_door::initialize_from;

use super::buffered_bytes::{SlowBody, refused_head, until_read};
use super::*;

/// /metrics on --metrics-addr counts each refusal by share and principal
/// kind, and shows every share as configured.
#[tokio::test]
async fn metrics_show_each_share_and_its_refusals() {
    let (server, _dir, _tokens) = start(
        &[(ALICE, "alice"), (BOB, "bob"), (CAROL, "carol")],
        &[
            "--http-max-connections",
            "64",
            "--http-max-connections-per-peer",
            "7",
            "--tenant-max-http-connections",
            "5",
            "--max-connections",
            "3",
            "--max-request-bytes",
            "262144",
            "--http-max-buffered-bytes",
            "1048576",
        ],
    )
    .await;
    let port = server.port;
    let body = metrics(&server).await;
    for (limit, value) in [
        ("tenant_max_http_connections", 5.0),
        ("http_max_streams_per_principal", 3.0),
        ("http_max_buffered_bytes", 1_048_576.0),
        ("http_max_buffered_bytes_per_principal", 262_144.0),
        ("http_max_connections_per_peer", 7.0),
    ] {
        assert_eq!(
            sample(&body, "ferrepl_limit", &[("limit", limit)]),
            Some(value),
            "ferrepl_limit{{limit=\"{limit}\"}}"
        );
    }

    // Connections: alice's 5 keep-alive ones hold her share; a 6th request
    // is refused (and its connection closed); bob, from another address,
    // is served.
    let auth = format!("Bearer {ALICE}");
    let healthz = request_head(port, "GET", "/healthz", &[("Authorization", &auth)], None);
    let mut alice = Vec::new();
    for n in 1..=6 {
        let mut s = connect_from("127.0.0.1", port).await;
        s.write_all(healthz.as_bytes())
            .await
            .expect("write GET /healthz");
        let head = expect_head(&mut s, "alice's GET /healthz").await;
        if n <= 5 {
            assert_eq!(
                head.status(),
                200,
                "alice's connection {n} of 5:\n{}",
                head.0
            );
        } else {
            assert_eq!(head.status(), 429, "alice's 6th connection:\n{}", head.0);
            head.retry_after();
            assert!(head.closes(), "{}", head.0);
            assert!(
                head.body().contains("--tenant-max-http-connections"),
                "not the refusal of a tenant's connection:\n{}",
                head.0
            );
        }
        alice.push(s);
    }
    let status = initialize_from("127.0.0.3", port, BOB)
        .await
        .unwrap_or_else(|e| panic!("bob's initialize: {e}"));
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "bob's initialize: {status}"
    );
    // Closed, alice's connections are hers again once the server sees them
    // go (polled, bounded): 5 of them, not 6.
    drop(alice);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut alice = Vec::new();
    while alice.len() < 5 {
        let mut s = connect_from("127.0.0.1", port).await;
        s.write_all(healthz.as_bytes())
            .await
            .expect("write GET /healthz");
        let head = expect_head(&mut s, "alice's GET /healthz").await;
        if head.status() == 200 {
            alice.push(s);
            continue;
        }
        assert_eq!(head.status(), 429, "{}", head.0);
        assert!(
            Instant::now() < deadline,
            "20 s after alice closed her connections only {} of her share of 5 came back",
            alice.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut s = connect_from("127.0.0.1", port).await;
    s.write_all(healthz.as_bytes())
        .await
        .expect("write GET /healthz");
    let head = expect_head(&mut s, "alice's GET /healthz").await;
    assert_eq!(head.status(), 429, "past her share again:\n{}", head.0);

    // Streams: bob's 4th, past --max-connections 3.
    let session = open_session(port, Some(BOB)).await;
    let mut streams = Vec::new();
    for n in 1..=4 {
        let (head, s) = open_stream("127.0.0.3", port, Some(BOB), &session, &[]).await;
        if n <= 3 {
            assert!(is_stream(&head), "bob's stream {n}:\n{}", head.0);
        } else {
            assert_eq!(head.status(), 429, "bob's 4th stream:\n{}", head.0);
        }
        streams.push(s);
    }
    // Buffered bytes: 249,999 of carol's held, another 20,000 declared.
    let slow = SlowBody::start("127.0.0.4", port, CAROL).await;
    until_read(port, std::slice::from_ref(&slow), "carol's").await;
    let head = refused_head(
        "127.0.0.4",
        port,
        CAROL,
        20_000,
        "carol's POST past her share",
    )
    .await;
    assert_eq!(head.status(), 429, "{}", head.0);
    head.retry_after();

    let body = metrics(&server).await;
    for share in ["connections", "streams", "buffered_bytes"] {
        let n = share_refusals(&body, share, "tenant");
        assert!(
            n >= 1.0,
            "ferrepl_http_share_refusals_total{{share=\"{share}\",principal=\"tenant\"}} is {n}:\n{}",
            body.lines()
                .filter(|l| l.contains("share_refusals"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    drop((alice, streams, slow));
}
