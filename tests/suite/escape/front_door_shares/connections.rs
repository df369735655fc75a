//! Unauthenticated keep-alives are closed; one address at its share of
//! connections cannot lock out another.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::escape::front_door::{Ending, initialize_from, read_until_closed};
use crate::support::initialize_body;

use super::*;

/// One unauthenticated (or misdirected) keep-alive request from 127.0.0.1
/// with an answer that closes: the answer's head. A connection refused at
/// accept (this address at its share for a moment: the server had not yet
/// let go of the previous ones) is tried again for up to 3 s.
async fn refused_keep_alive(port: u16, kind: usize) -> (Head, Ending, TcpStream) {
    let deadline = Instant::now() + Duration::from_secs(3);
    let body = initialize_body();
    let (path, token, expected) = match kind % 4 {
        0 => ("/mcp", Some(WRONG), 401),
        1 => ("/mcp", None, 401),
        2 => ("/t/bob/mcp", Some(ALICE), 403),
        _ => ("/healthz", Some(WRONG), 401),
    };
    loop {
        let mut auth = String::new();
        let headers = mcp_headers(token, None, &mut auth);
        let mut stream = connect_from("127.0.0.1", port).await;
        let request = request_head(port, "POST", path, &headers, Some(body.len())) + &body;
        let _ = stream.write_all(request.as_bytes()).await;
        let ending = read_until_closed(&mut stream, Instant::now() + Duration::from_secs(5)).await;
        let text = String::from_utf8_lossy(ending.bytes()).into_owned();
        let head = Head(
            text.split("\r\n\r\n")
                .next()
                .unwrap_or_default()
                .to_string(),
        );
        if text.starts_with("HTTP/1.1 429") && text.contains("--http-max-connections-per-peer") {
            assert!(
                Instant::now() < deadline,
                "127.0.0.1 was still refused at accept 3 s after its earlier connections were answered: they were held"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
            continue;
        }
        assert!(
            text.starts_with(&format!("HTTP/1.1 {expected}")),
            "POST {path} with {token:?}: wanted {expected}, got ({}) {text:?}",
            ending.how()
        );
        return (head, ending, stream);
    }
}

/// Requests that fail authentication (a wrong token, none) or name another
/// tenant are answered with `Connection: close` and their connections
/// closed by the server, so 32 of them, from an address allowed 4
/// connections and each kept open by its client, never lock it out. One
/// address at its share of connections (--http-max-connections-per-peer 4)
/// gets a raw 429 with Retry-After at accept for a 5th; another address is
/// served meanwhile.
#[tokio::test]
async fn unauthenticated_keep_alives_are_closed_and_one_address_cannot_lock_out_another() {
    let (server, _dir, _tokens) = start(
        &[(ALICE, "alice"), (BOB, "bob")],
        &[
            "--http-max-connections",
            "64",
            "--http-max-connections-per-peer",
            "4",
            "--http-header-timeout",
            "30",
        ],
    )
    .await;
    let port = server.port;

    let mut kept = Vec::new();
    for wave in 0..8 {
        let answers =
            futures::future::join_all((0..4).map(|i| refused_keep_alive(port, wave * 4 + i))).await;
        for (head, ending, stream) in answers {
            assert!(
                head.closes(),
                "an answer to a failed authentication without Connection: close:\n{}",
                head.0
            );
            assert!(
                ending.is_closed(),
                "the server held a connection after answering {} (still open 5 s later)",
                head.0.lines().next().unwrap_or_default()
            );
            // The client keeps its end open: only the server's close frees it.
            kept.push(stream);
        }
    }

    // 127.0.0.2 holds its 4 connections (heads not yet sent: 30 s to go).
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from("127.0.0.2", port).await);
    }
    let mut fifth = connect_from("127.0.0.2", port).await;
    let ending = read_until_closed(&mut fifth, Instant::now() + Duration::from_secs(5)).await;
    assert!(
        ending.is_closed(),
        "a 5th connection of 127.0.0.2 past --http-max-connections-per-peer 4 was still open after 5 s: {ending:?}"
    );
    let text = String::from_utf8_lossy(ending.bytes()).into_owned();
    assert!(
        text.starts_with("HTTP/1.1 429"),
        "a 5th connection of 127.0.0.2 ({}): {text:?}",
        ending.how()
    );
    Head(text.clone()).retry_after();

    // Other addresses are served while 127.0.0.2 holds its share.
    for (from, token) in [("127.0.0.3", ALICE), ("127.0.0.1", BOB)] {
        let status = initialize_from(from, port, token)
            .await
            .unwrap_or_else(|e| panic!("initialize from {from}: {e}"));
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "initialize from {from} while 127.0.0.2 is at its share: {status}"
        );
    }
    // The 4 were held, not timed out.
    for stream in &mut held {
        let ending = read_until_closed(stream, Instant::now() + Duration::from_millis(100)).await;
        assert!(
            !ending.is_closed(),
            "a connection of 127.0.0.2 within its share was closed: {ending:?}"
        );
    }
    let body = metrics(&server).await;
    let per_peer = sample(
        &body,
        "ferrepl_http_refusals_total",
        &[("reason", "per_peer")],
    );
    assert!(
        per_peer.is_some_and(|n| n >= 1.0),
        "the refusal at accept is not counted: {per_peer:?}"
    );
    drop(kept);
}
