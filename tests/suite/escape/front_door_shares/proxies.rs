//! Forwarded clients of a trusted proxy have shares of their own; an
//! untrusted peer's forwarding headers are ignored.

use crate::support::{HttpServer, http_exchange};

use super::*;

/// Behind a trusted proxy (--http-trusted-proxy 127.0.0.1; no tokens, so
/// principals are addresses), each forwarded client has its own share of
/// event streams (--max-connections 2): one at its share gets 429 by either
/// header, the other is served. From an untrusted peer (127.0.0.2) the
/// same headers are ignored: its streams are one principal's.
#[tokio::test]
async fn forwarded_clients_of_a_trusted_proxy_have_shares_of_their_own() {
    let server = HttpServer::start(
        &[
            "--warm-pool",
            "0",
            "--http-trusted-proxy",
            "127.0.0.1",
            "--max-connections",
            "2",
            "--http-max-connections",
            "64",
            "--http-max-connections-per-peer",
            "4",
        ],
        &[],
    )
    .await;
    let port = server.port;
    let session = open_session(port, None).await;
    let stream = async |from: &str, header: (&str, &str)| {
        open_stream(from, port, None, &session, &[header]).await
    };
    let mut held = Vec::new();
    for forwarded in ["198.51.100.1", "198.51.100.1, 127.0.0.1"] {
        let (head, s) = stream("127.0.0.1", ("X-Forwarded-For", forwarded)).await;
        assert!(
            is_stream(&head),
            "X-Forwarded-For {forwarded} within its share:\n{}",
            head.0
        );
        held.push(s);
    }
    for header in [
        ("X-Forwarded-For", "203.0.113.7, 198.51.100.1"),
        ("Forwarded", "for=198.51.100.1;proto=http"),
    ] {
        let (head, s) = stream("127.0.0.1", header).await;
        assert_eq!(
            head.status(),
            429,
            "{header:?}, a client at its share:\n{}",
            head.0
        );
        head.retry_after();
        assert!(
            head.body().contains("event streams"),
            "{header:?}: not the refusal of a stream:\n{}",
            head.0
        );
        held.push(s);
    }
    // The proxy's own address holds 5 connections now, past
    // --http-max-connections-per-peer 4: it is not capped, its clients are.
    let (head, s) = stream("127.0.0.1", ("X-Forwarded-For", "198.51.100.2")).await;
    assert!(is_stream(&head), "another forwarded client:\n{}", head.0);
    held.push(s);

    // An untrusted peer's header names no one: 198.51.100.1 is at its
    // share, 127.0.0.2 is not; and its three streams are one principal's.
    for (n, forwarded) in ["198.51.100.1", "198.51.100.3"].into_iter().enumerate() {
        let (head, s) = stream("127.0.0.2", ("X-Forwarded-For", forwarded)).await;
        assert!(
            is_stream(&head),
            "stream {} of 127.0.0.2 (untrusted, X-Forwarded-For {forwarded}):\n{}",
            n + 1,
            head.0
        );
        held.push(s);
    }
    let (head, s) = stream("127.0.0.2", ("X-Forwarded-For", "198.51.100.4")).await;
    assert_eq!(
        head.status(),
        429,
        "a 3rd stream of 127.0.0.2, whatever it forwards:\n{}",
        head.0
    );
    head.retry_after();
    held.push(s);

    // No tokens: the main listener serves /metrics.
    let (status, body) = http_exchange(port, "GET", "/metrics", &[("Host", "127.0.0.1")], "").await;
    assert_eq!(status, 200, "{body}");
    let n = share_refusals(&body, "streams", "peer");
    assert!(n >= 3.0, "stream refusals of peers counted: {n}");
    drop(held);
}
