use super::*;

fn bounds() -> Bounds {
    Bounds {
        header_timeout: Duration::from_millis(50),
        idle_timeout: Duration::from_millis(200),
        write_timeout: Duration::from_millis(100),
        max_connections: 2,
        max_per_peer: 1,
        max_head_bytes: 16 * 1024,
        trusted_proxies: vec!["10.0.0.0/8".parse().expect("cidr")],
        tenant_connections: 2,
        principal_streams: 2,
        buffered_total: 1 << 20,
        buffered_share: 1 << 18,
    }
}

#[test]
fn a_trusted_proxys_forwarded_address_is_the_client_and_no_one_elses_is() {
    use axum::http::HeaderMap;
    let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().expect("cidr")];
    let headers = |pairs: &[(&str, &str)]| {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    };
    let proxy: IpAddr = "10.1.2.3".parse().expect("ip");
    let stranger: IpAddr = "192.0.2.9".parse().expect("ip");
    let xff = headers(&[("x-forwarded-for", "203.0.113.5, 198.51.100.7")]);
    // The right-most untrusted hop: the client as the proxy saw it.
    assert_eq!(
        client_addr(proxy, &xff, &trusted),
        "198.51.100.7".parse::<IpAddr>().expect("ip")
    );
    // Anyone else's header is ignored.
    assert_eq!(client_addr(stranger, &xff, &trusted), stranger);
    let chained = headers(&[("x-forwarded-for", "198.51.100.7, 10.9.9.9")]);
    assert_eq!(
        client_addr(proxy, &chained, &trusted),
        "198.51.100.7".parse::<IpAddr>().expect("ip")
    );
    let fwd = headers(&[(
        "forwarded",
        "for=\"[2001:db8::1]:4711\";proto=https, for=10.0.0.2",
    )]);
    assert_eq!(
        client_addr(proxy, &fwd, &trusted),
        "2001:db8::1".parse::<IpAddr>().expect("ip")
    );
    // Nothing usable forwarded: the proxy itself.
    assert_eq!(
        client_addr(proxy, &headers(&[("x-forwarded-for", "junk")]), &trusted),
        proxy
    );
}

#[test]
fn caps_count_in_total_and_per_peer_and_free_on_drop() {
    let open = Arc::new(Mutex::new(Open::default()));
    let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
        "127.0.0.1".parse().expect("ip"),
        "127.0.0.2".parse().expect("ip"),
        "127.0.0.3".parse().expect("ip"),
    );
    let first = take_slot(&open, a, &bounds()).expect("first");
    assert!(matches!(
        take_slot(&open, a, &bounds()),
        Err(Refusal::PerPeer)
    ));
    let second = take_slot(&open, b, &bounds()).expect("another peer");
    assert!(matches!(
        take_slot(&open, c, &bounds()),
        Err(Refusal::MaxConnections)
    ));
    drop(first);
    drop(second);
    take_slot(&open, a, &bounds()).expect("freed");
}

/// A response the peer stops reading is cut after the write timeout,
/// however long it could go on (here: without end).
#[tokio::test]
async fn a_peer_that_stops_reading_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let endless = || async {
        let chunk = axum::body::Bytes::from(vec![b'x'; 64 * 1024]);
        let stream =
            futures::stream::repeat_with(move || Ok::<_, std::convert::Infallible>(chunk.clone()));
        Body::from_stream(stream)
    };
    let router = Router::new().route("/", axum::routing::get(endless));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    let mut limits = bounds();
    limits.header_timeout = Duration::from_secs(5);
    limits.idle_timeout = Duration::from_secs(5);
    tokio::spawn(serve(listener, router, limits, shutdown.clone()));
    let cut = || {
        crate::metrics::render(&[], false)
            .lines()
            .find(|l| l.starts_with(r#"ferrepl_http_refusals_total{reason="write_timeout"}"#))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = cut();
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    // Not reading: the server's writes fill the buffers and wait.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cut() == before {
        assert!(
            Instant::now() < deadline,
            "a stalled response was never cut"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What was buffered drains, then the connection ends.
    let mut sink = vec![0u8; 1 << 20];
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match tcp.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection was left open");
    shutdown.cancel();
}

#[test]
fn a_silent_connection_times_out_on_its_head_and_an_idle_one_later() {
    let activity = Activity::new();
    std::thread::sleep(Duration::from_millis(60));
    assert!(matches!(
        activity.check(&bounds()),
        Err(Refusal::HeaderTimeout)
    ));
    // A request answered: idle, not waiting for a head.
    activity.request_started();
    assert!(activity.check(&bounds()).is_ok(), "in flight: never cut");
    activity.request_done();
    std::thread::sleep(Duration::from_millis(60));
    assert!(activity.check(&bounds()).is_ok(), "idle, within its limit");
    std::thread::sleep(Duration::from_millis(160));
    assert!(matches!(
        activity.check(&bounds()),
        Err(Refusal::IdleTimeout)
    ));
}
