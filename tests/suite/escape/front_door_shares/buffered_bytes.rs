//! Unfinished request bodies count against their principal's share and the
//! instance's total while they arrive; refusals are 429 with Retry-After.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::escape::front_door::{Ending, initialize_from, read_until_closed, server_pid};
use crate::support::{call, initialize_body, rss_kib};

use super::*;

/// The declared length of each unfinished body: near --max-request-bytes.
const SLOW_LEN: usize = 250_000;

/// A POST of an initialize padded to `SLOW_LEN` bytes, all but its last
/// byte sent.
pub(super) struct SlowBody {
    stream: TcpStream,
}

/// An initialize, padded with spaces (JSON allows them) to `len` bytes.
fn padded_initialize(len: usize) -> Vec<u8> {
    let mut body = initialize_body().into_bytes();
    assert!(body.len() < len);
    body.resize(len, b' ');
    body
}

impl SlowBody {
    /// Sends, from `from`, the head of a POST with `token` declaring `len`
    /// bytes of body.
    async fn head(from: &str, port: u16, token: &str, len: usize) -> TcpStream {
        let mut auth = String::new();
        let headers = mcp_headers(Some(token), None, &mut auth);
        let mut stream = connect_from(from, port).await;
        stream
            .write_all(request_head(port, "POST", "/mcp", &headers, Some(len)).as_bytes())
            .await
            .expect("write the head of a POST");
        stream
    }

    /// Starts one from `from`: the head, then all of the body but its last
    /// byte.
    pub(super) async fn start(from: &str, port: u16, token: &str) -> Self {
        let mut stream = Self::head(from, port, token, SLOW_LEN).await;
        let body = padded_initialize(SLOW_LEN);
        tokio::time::timeout(ANSWER, stream.write_all(&body[..SLOW_LEN - 1]))
            .await
            .expect("writing blocked: the server did not read a body within its share")
            .expect("write all but the last byte of a body");
        Self { stream }
    }

    fn local_port(&self) -> u16 {
        self.stream.local_addr().expect("local address").port()
    }

    /// Sends the last byte; the answer's status.
    async fn finish(mut self) -> u16 {
        self.stream
            .write_all(b" ")
            .await
            .expect("write the last byte");
        expect_head(&mut self.stream, "a finished body")
            .await
            .status()
    }
}

/// For the connections of `clients` (their local ports) to the server on
/// `port`: whether every byte they sent has been read by the server (no
/// byte in the server's receive queue nor unacknowledged in the client's
/// send queue, per /proc/net/tcp), each connection still there.
fn all_read(port: u16, clients: &[u16]) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let rows: Vec<(u16, u16, u64, u64)> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port_of = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
            let (tx, rx) = f.get(4)?.split_once(':')?;
            Some((
                port_of(f.get(1)?)?,
                port_of(f.get(2)?)?,
                u64::from_str_radix(tx, 16).ok()?,
                u64::from_str_radix(rx, 16).ok()?,
            ))
        })
        .collect();
    clients.iter().all(|&client| {
        let server_side = rows
            .iter()
            .find(|r| r.0 == port && r.1 == client)
            .is_some_and(|r| r.3 == 0);
        let client_side = rows
            .iter()
            .find(|r| r.0 == client && r.1 == port)
            .is_some_and(|r| r.2 == 0);
        server_side && client_side
    })
}

/// Waits (bounded) until the server has read all that `bodies` sent.
pub(super) async fn until_read(port: u16, bodies: &[SlowBody], whose: &str) {
    let clients: Vec<u16> = bodies.iter().map(SlowBody::local_port).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut steady = 0;
    while steady < 2 {
        steady = if all_read(port, &clients) {
            steady + 1
        } else {
            0
        };
        assert!(
            Instant::now() < deadline,
            "the server did not read {whose} unfinished bodies within 20 s (refused, or not read?)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` unfinished bodies of `token`, read by the server.
async fn slow_bodies(port: u16, token: &str, n: usize, whose: &str) -> Vec<SlowBody> {
    let mut bodies = Vec::new();
    for _ in 0..n {
        bodies.push(SlowBody::start("127.0.0.1", port, token).await);
    }
    until_read(port, &bodies, whose).await;
    bodies
}

/// The answer to the head of a POST from `from` with `token` declaring
/// `len` bytes, none of which is sent: a refusal comes at once.
pub(super) async fn refused_head(
    from: &str,
    port: u16,
    token: &str,
    len: usize,
    what: &str,
) -> Head {
    let mut stream = SlowBody::head(from, port, token, len).await;
    expect_head(
        &mut stream,
        &format!("{what} ({len} bytes declared, none sent)"),
    )
    .await
}

/// A whole SLOW_LEN-byte POST with `token`: its status.
async fn whole_body(port: u16, token: &str) -> u16 {
    let mut stream = SlowBody::head("127.0.0.1", port, token, SLOW_LEN).await;
    stream
        .write_all(&padded_initialize(SLOW_LEN))
        .await
        .expect("write a whole body");
    expect_head(&mut stream, "a whole body").await.status()
}

/// Unfinished request bodies count against their principal while they
/// arrive (--max-request-bytes 256 KiB, --http-max-buffered-bytes 4 MiB: a
/// share of 1 MiB): alice's 4 bodies of 250,000 bytes hold her share, and a
/// 5th is refused with 429 before the server reads a byte of it, as are
/// 160 more she sends whole, the server's memory growing by far less than
/// their 40 MB; bob is served. With four tenants at their shares the
/// instance's 4 MiB are held, and bob's big POST gets 503, his call still
/// served. A body that arrives whole stops counting; so does one whose
/// client goes away.
#[tokio::test]
async fn unfinished_bodies_stop_at_each_principals_share_and_the_total() {
    let (server, _dir, _tokens) = start(
        &[
            (ALICE, "alice"),
            (BOB, "bob"),
            (CAROL, "carol"),
            (DAVE, "dave"),
            (ERIN, "erin"),
        ],
        BUFFERED_FLAGS,
    )
    .await;
    let (port, pid) = (server.port, server_pid(&server));
    let bob = match server.try_connect_at("/mcp", (), Some(BOB)).await {
        Ok(c) => c,
        Err(e) => panic!("bob's client: {e:#}\nstderr:\n{}", server.stderr_log()),
    };
    let bob_calls = async || {
        let out = call(bob.peer(), "python_exec", json!({ "code": "6 * 7" })).await;
        assert_eq!(out.value(), Some("42"), "bob's python_exec: {out:#?}");
    };
    bob_calls().await;
    // A whole body near the largest request is served (and the allocator
    // has seen one) before the server's memory is measured.
    assert_eq!(whole_body(port, ALICE).await, 200);
    let baseline = rss_kib(pid);

    // Alice's share: 4 bodies of 250,000 bytes, one byte short each.
    let alice = slow_bodies(port, ALICE, 4, "alice's").await;
    let head = refused_head("127.0.0.1", port, ALICE, SLOW_LEN, "alice's 5th POST").await;
    assert_eq!(
        head.status(),
        429,
        "alice's 5th unfinished body:\n{}",
        head.0
    );
    head.retry_after();
    bob_calls().await;
    let status = initialize_from("127.0.0.1", port, BOB)
        .await
        .unwrap_or_else(|e| panic!("bob's initialize: {e}"));
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "bob's initialize: {status}"
    );

    // 160 more, sent whole, in waves of 20: each refused after its head.
    let mut peak = rss_kib(pid);
    let mut seen_429 = 0;
    for _ in 0..8 {
        let wave = (0..20).map(|_| async {
            let mut stream = SlowBody::head("127.0.0.1", port, ALICE, SLOW_LEN).await;
            let _ =
                tokio::time::timeout(ANSWER, stream.write_all(&padded_initialize(SLOW_LEN))).await;
            read_until_closed(&mut stream, Instant::now() + ANSWER).await
        });
        for ending in futures::future::join_all(wave).await {
            let text = String::from_utf8_lossy(ending.bytes()).into_owned();
            assert!(
                ending.is_closed() && (text.is_empty() || text.starts_with("HTTP/1.1 429")),
                "a body of alice's past her share ({}): {text:?}",
                ending.how()
            );
            seen_429 += usize::from(!text.is_empty());
        }
        peak = peak.max(rss_kib(pid));
    }
    let grown_kib = peak.saturating_sub(baseline);
    eprintln!(
        "server RSS {baseline} KiB before the unfinished bodies, at most {peak} KiB during 160 refused ones ({seen_429} answers read before the reset)"
    );
    // Unbounded, 164 bodies of 250,000 bytes would take 40 MB.
    assert!(
        grown_kib < 12 * 1024,
        "the server grew by {grown_kib} KiB while alice sent 164 bodies of {SLOW_LEN} bytes with a share of 1 MiB"
    );

    // The instance's total: carol, dave and erin at their shares too.
    let mut others = Vec::new();
    for (token, whose) in [(CAROL, "carol's"), (DAVE, "dave's"), (ERIN, "erin's")] {
        others.push(slow_bodies(port, token, 4, whose).await);
    }
    let head = refused_head("127.0.0.1", port, BOB, SLOW_LEN, "bob's big POST").await;
    assert_eq!(
        head.status(),
        503,
        "bob's big POST with the instance's buffered bytes all held:\n{}",
        head.0
    );
    head.retry_after();
    bob_calls().await;

    // A body that arrives whole stops counting: alice's 4 are answered, and
    // 4 new ones fit her share again.
    for body in alice {
        assert_eq!(body.finish().await, 200, "alice's finished body");
    }
    let again = slow_bodies(port, ALICE, 4, "alice's new").await;
    for body in again {
        assert_eq!(body.finish().await, 200, "alice's new body, finished");
    }

    // A body whose client goes away stops counting once the server sees it.
    let carol = others.remove(0);
    drop(carol);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match whole_body(port, CAROL).await {
            200 => break,
            429 if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            status => panic!("carol's POST after her unfinished bodies went away: {status}"),
        }
    }
    let carol = slow_bodies(port, CAROL, 4, "carol's new").await;
    for body in carol {
        assert_eq!(body.finish().await, 200, "carol's new body, finished");
    }

    let body = metrics(&server).await;
    for share in ["buffered_bytes", "buffered_bytes_total"] {
        let n = share_refusals(&body, share, "tenant");
        assert!(n >= 1.0, "no {share} refusal of a tenant counted ({n})");
    }
    drop(others);
}

/// Flags of a server whose principals may each buffer 1 MiB of request
/// bodies (a quarter of 4 MiB), no more than 256 KiB a request.
const BUFFERED_FLAGS: &[&str] = &[
    "--max-request-bytes",
    "262144",
    "--http-max-buffered-bytes",
    "4194304",
    "--http-max-connections",
    "64",
    "--http-max-connections-per-peer",
    "0",
    "--max-connections",
    "32",
    "--http-header-timeout",
    "30",
];

/// POSTs `body` to /mcp with `token` (in `session`, if any) as one chunk of
/// a chunked body, which declares no length; the answer.
async fn chunked_post(port: u16, token: &str, session: Option<&str>, body: &[u8]) -> Head {
    let mut auth = String::new();
    let mut headers = mcp_headers(Some(token), session, &mut auth);
    headers.push(("Transfer-Encoding", "chunked"));
    let mut stream = connect_from("127.0.0.1", port).await;
    let mut request = request_head(port, "POST", "/mcp", &headers, None).into_bytes();
    request.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    request.extend_from_slice(b"\r\n0\r\n\r\n");
    let _ = stream.write_all(&request).await;
    expect_head(&mut stream, "a chunked POST").await
}

/// `what` and its answer, unless the answer is a refusal for the
/// principal's share (429 with Retry-After).
fn not_a_share_refusal(what: &str, head: &Head) -> Option<String> {
    let refusal = head.status() == 429 && head.header("retry-after").is_some();
    (!refusal).then(|| {
        format!(
            "{what}: {} {:?}",
            head.0.lines().next().unwrap_or_default(),
            head.body().trim()
        )
    })
}

/// A body refused while it arrives is refused for its principal's share,
/// as one refused before a byte is read: 429 with Retry-After, not "over
/// --max-request-bytes" (413) nor a server error (500), for a body that
/// declares no length (chunked) and for one of several declared at once
/// that together pass the share (each declared length fitting when its
/// head came).
#[tokio::test]
async fn a_body_refused_while_it_arrives_gets_429_with_retry_after() {
    let (server, _dir, _tokens) = start(&[(ALICE, "alice"), (BOB, "bob")], BUFFERED_FLAGS).await;
    let port = server.port;
    let session = open_session(port, Some(ALICE)).await;
    let mut wrong = Vec::new();

    // Alice at her share, a chunked body of 100,000 bytes does not fit.
    let alice = slow_bodies(port, ALICE, 4, "alice's").await;
    let head = chunked_post(port, ALICE, None, &padded_initialize(100_000)).await;
    wrong.extend(not_a_share_refusal(
        "a chunked initialize of 100,000 bytes, alice at her share",
        &head,
    ));
    let mut list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#.to_vec();
    list.resize(100_000, b' ');
    let head = chunked_post(port, ALICE, Some(&session), &list).await;
    wrong.extend(not_a_share_refusal(
        "a chunked tools/list of 100,000 bytes in her MCP session, alice at her share",
        &head,
    ));
    for body in alice {
        assert_eq!(body.finish().await, 200, "alice's finished body");
    }

    // Five heads declaring 250,000 bytes each come before their bodies:
    // each fits when it comes; the bodies, all but a byte of each, do not.
    let mut five = Vec::new();
    for _ in 0..5 {
        five.push(SlowBody::head("127.0.0.1", port, ALICE, SLOW_LEN).await);
    }
    let body = padded_initialize(SLOW_LEN);
    for stream in &mut five {
        let _ = tokio::time::timeout(ANSWER, stream.write_all(&body[..SLOW_LEN - 1])).await;
    }
    // Those within her share wait for their last byte; the others are
    // answered (and closed).
    let answers = futures::future::join_all(
        five.iter_mut()
            .map(|s| read_head(s, Duration::from_secs(2))),
    )
    .await;
    let mut refused = 0;
    let mut waiting = Vec::new();
    for (stream, answer) in five.into_iter().zip(answers) {
        match answer {
            Ok(head) => {
                refused += 1;
                wrong.extend(not_a_share_refusal(
                    "one of five bodies declared at once, past alice's share as they arrived",
                    &head,
                ));
            }
            Err(Ending::Open(_)) => waiting.push(SlowBody { stream }),
            Err(ending) => wrong.push(format!(
                "one of five bodies declared at once: closed without an answer ({})",
                ending.how()
            )),
        }
    }
    assert!(
        refused >= 1 || !wrong.is_empty(),
        "five bodies of {SLOW_LEN} bytes, all but a byte each, were all held within a share of 1 MiB"
    );
    for body in waiting {
        assert_eq!(
            body.finish().await,
            200,
            "a body within alice's share, finished"
        );
    }
    assert!(
        wrong.is_empty(),
        "bodies refused while they arrived, for alice's share, were not answered 429 with Retry-After:\n{}",
        wrong.join("\n")
    );
}
