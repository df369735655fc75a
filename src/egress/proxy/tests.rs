use super::*;
use std::net::SocketAddr;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::mpsc;

const BOUND: Duration = Duration::from_secs(10);

fn test_cfg(ports: Vec<u16>) -> EgressConfig {
    let mut cfg = EgressConfig::new(vec!["localhost".to_string()]);
    cfg.ports = ports;
    cfg.allow_private = true;
    cfg
}

struct Proxy {
    addr: SocketAddr,
    shutdown: CancellationToken,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start_proxy(cfg: EgressConfig) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(serve_tcp(listener, Arc::new(cfg), shutdown.clone()));
    Proxy { addr, shutdown }
}

/// An upstream that echoes every connection's bytes back.
async fn start_echo() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

/// A tiny HTTP upstream: sends each request head it reads on `tx`,
/// answers "hello" and closes.
async fn start_http() -> (u16, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(s);
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                let _ = tx.send(head);
                let mut s = reader.into_inner();
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                    )
                    .await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, rx)
}

/// Reads everything until the proxy closes.
async fn read_all(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// An echo server and a proxy that allows its port, configured by `adjust`.
async fn echo_behind_proxy(adjust: impl FnOnce(&mut EgressConfig)) -> (u16, Proxy) {
    let echo = start_echo().await;
    let mut cfg = test_cfg(vec![echo]);
    adjust(&mut cfg);
    (echo, start_proxy(cfg).await)
}

/// Sends `request` and returns the whole answer.
async fn exchange(proxy: &Proxy, request: &[u8]) -> String {
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(request).await.unwrap();
    read_all(&mut s).await
}

/// Sends a request of `line` (e.g. "CONNECT host:443") and no headers; the
/// answer must have status `code` and a body that says `says`.
async fn refused(proxy: &Proxy, line: &str, code: u16, says: &str) -> String {
    let response = exchange(proxy, format!("{line} HTTP/1.1\r\n\r\n").as_bytes()).await;
    assert_eq!(status(&response), code, "{response}");
    assert!(body(&response).contains(says), "{response}");
    response
}

/// A tunnel to `target` (host:port) through the proxy, established.
async fn tunnel(proxy: &Proxy, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!("CONNECT {target} HTTP/1.1\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    assert_eq!(status(&read_response_head(&mut s).await), 200);
    s
}

/// Reads a response head (through the blank line), byte by byte.
async fn read_response_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.unwrap() == 0 {
            break;
        }
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn status(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn body(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    timeout(BOUND, f).await.expect("test timed out")
}

#[tokio::test]
async fn connect_tunnels_both_ways() {
    bounded(async {
        let (echo, proxy) = echo_behind_proxy(|_| {}).await;
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        // Bytes sent right behind the head are forwarded too.
        s.write_all(
            format!("CONNECT localhost:{echo} HTTP/1.1\r\nHost: localhost:{echo}\r\n\r\nearly")
                .as_bytes(),
        )
        .await
        .unwrap();
        let head = read_response_head(&mut s).await;
        assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
        let mut got = [0u8; 5];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"early");
        s.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        // Half-close travels upstream; the echo's close comes back.
        s.shutdown().await.unwrap();
        assert_eq!(read_all(&mut s).await, "");
    })
    .await;
}

#[tokio::test]
async fn connect_host_case_and_trailing_dot() {
    bounded(async {
        let (echo, proxy) = echo_behind_proxy(|_| {}).await;
        tunnel(&proxy, &format!("LocalHost.:{echo}")).await;
    })
    .await;
}

#[tokio::test]
async fn plain_http_is_forwarded_in_origin_form() {
    bounded(async {
        let (port, mut heads) = start_http().await;
        let proxy = start_proxy(test_cfg(vec![port])).await;
        let request = format!(
            "GET http://localhost:{port}/simple/six/?x=1 HTTP/1.1\r\n\
             Host: evil.example\r\n\
             User-Agent: pip/24\r\n\
             Proxy-Connection: keep-alive\r\n\
             Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
             Accept: */*\r\n\r\n"
        );
        let response = exchange(&proxy, request.as_bytes()).await;
        assert_eq!(status(&response), 200, "{response}");
        assert_eq!(body(&response), "hello");
        let head = heads.recv().await.unwrap();
        let mut lines = head.split("\r\n");
        assert_eq!(lines.next(), Some("GET /simple/six/?x=1 HTTP/1.1"));
        assert!(
            head.contains(&format!("Host: localhost:{port}\r\n")),
            "{head}"
        );
        assert!(!head.contains("evil.example"), "{head}");
        assert!(head.contains("User-Agent: pip/24\r\n"), "{head}");
        assert!(head.contains("Accept: */*\r\n"), "{head}");
        assert!(head.contains("Connection: close\r\n"), "{head}");
        assert!(!head.to_ascii_lowercase().contains("proxy-"), "{head}");
        assert!(!head.contains("keep-alive"), "{head}");
    })
    .await;
}

#[tokio::test]
async fn plain_http_body_is_forwarded_and_nothing_after_it() {
    bounded(async {
        // The request is not half-closed upstream (HTTP servers may take
        // that as an abort), so the echo never ends: the idle timeout does.
        let (echo, proxy) =
            echo_behind_proxy(|cfg| cfg.idle_timeout = Duration::from_millis(500)).await;
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        s.write_all(
            format!(
                "POST http://localhost:{echo}/up HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789GET http://x/ HTTP/1.1\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        s.shutdown().await.unwrap();
        let echoed = read_all(&mut s).await;
        assert!(echoed.starts_with(&format!("POST /up HTTP/1.1\r\nHost: localhost:{echo}\r\n")), "{echoed}");
        assert!(echoed.ends_with("Connection: close\r\n\r\n0123456789"), "{echoed}");
    })
    .await;
}

#[tokio::test]
async fn host_not_allowed_is_403_naming_host_and_list() {
    bounded(async {
        let echo = start_echo().await;
        let mut cfg = test_cfg(vec![echo, 443]);
        cfg.allowed_hosts = vec!["localhost".into(), "pypi.org".into()];
        let proxy = start_proxy(cfg).await;
        let response = refused(&proxy, "CONNECT Example.COM:443", 403, "").await;
        assert_eq!(
            body(&response),
            "ferrepl: egress to example.com is not allowed; allowed: localhost, pypi.org; \
             the operator can add hosts with --allow-host-egress\n"
        );
        // The reason phrase says it too (pip shows only that).
        assert!(response.starts_with("HTTP/1.1 403 ferrepl: egress to example.com is not allowed"));
        refused(&proxy, "GET http://example.com/", 403, "").await;
        // A bare IP is a host like any other.
        refused(&proxy, &format!("CONNECT 127.0.0.1:{echo}"), 403, "").await;
        refused(&proxy, &format!("CONNECT [::1]:{echo}"), 403, "").await;
    })
    .await;
}

#[tokio::test]
async fn port_not_allowed_is_403() {
    bounded(async {
        let echo = start_echo().await;
        let proxy = start_proxy(test_cfg(vec![443])).await;
        let says = format!("port {echo} is not allowed; allowed ports: 443");
        refused(&proxy, &format!("CONNECT localhost:{echo}"), 403, &says).await;
        refused(&proxy, &format!("GET http://localhost:{echo}/"), 403, "").await;
    })
    .await;
}

#[tokio::test]
async fn private_destination_is_403() {
    bounded(async {
        let (echo, proxy) = echo_behind_proxy(|cfg| {
            cfg.allow_private = false;
            cfg.allowed_hosts.push("127.0.0.1".into());
        })
        .await;
        let says = "resolves to a private or loopback address";
        for target in ["localhost", "127.0.0.1"] {
            refused(&proxy, &format!("CONNECT {target}:{echo}"), 403, says).await;
        }
    })
    .await;
}

#[tokio::test]
async fn malformed_and_origin_form_are_400() {
    bounded(async {
        let proxy = start_proxy(test_cfg(vec![80])).await;
        for request in [
            &b"HELLO\r\n\r\n"[..],
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
            b"GET https://localhost/ HTTP/1.1\r\n\r\n",
            b"CONNECT localhost HTTP/1.1\r\n\r\n",
            b"CONNECT localhost:0 HTTP/1.1\r\n\r\n",
            b"CONNECT localhost:99999 HTTP/1.1\r\n\r\n",
            b"CONNECT ::1:443 HTTP/1.1\r\n\r\n",
            b"CONNECT local_host!:443 HTTP/1.1\r\n\r\n",
            b"GET http://localhost/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"GET http://user:pw@localhost/ HTTP/1.1\r\n\r\n",
        ] {
            let response = exchange(&proxy, request).await;
            assert_eq!(status(&response), 400, "{request:?} -> {response}");
            assert!(body(&response).starts_with("ferrepl: "), "{response}");
        }
        let chunked = b"POST http://localhost/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let response = exchange(&proxy, chunked).await;
        assert_eq!(status(&response), 501, "{response}");
    })
    .await;
}

#[tokio::test]
async fn head_too_large_is_431() {
    bounded(async {
        let mut cfg = test_cfg(vec![80]);
        cfg.max_head_bytes = 1024;
        let proxy = start_proxy(cfg).await;
        let mut request = b"GET http://localhost/ HTTP/1.1\r\nX-Big: ".to_vec();
        request.extend(std::iter::repeat_n(b'a', 64 * 1024));
        request.extend_from_slice(b"\r\n\r\n");
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        // The proxy may answer before taking everything: ignore write errors.
        let (mut r, mut w) = s.split();
        let (_, response) = tokio::join!(w.write_all(&request), async {
            let mut out = Vec::new();
            let _ = r.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).into_owned()
        });
        assert_eq!(status(&response), 431, "{response}");
    })
    .await;
}

#[tokio::test]
async fn silent_client_gets_408() {
    bounded(async {
        let mut cfg = test_cfg(vec![80]);
        cfg.head_timeout = Duration::from_millis(200);
        let proxy = start_proxy(cfg).await;
        let started = std::time::Instant::now();
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        let response = read_all(&mut s).await;
        assert_eq!(status(&response), 408, "{response}");
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert!(started.elapsed() < Duration::from_secs(3));
        // A client that dribbles a partial head gets the same.
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        s.write_all(b"GET http://localhost/ HTTP/1.1\r\n")
            .await
            .unwrap();
        assert_eq!(status(&read_all(&mut s).await), 408);
    })
    .await;
}

#[tokio::test]
async fn idle_tunnel_is_closed() {
    bounded(async {
        let (echo, proxy) =
            echo_behind_proxy(|cfg| cfg.idle_timeout = Duration::from_millis(300)).await;
        let mut s = tunnel(&proxy, &format!("localhost:{echo}")).await;
        // Traffic keeps it open past the idle timeout...
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            s.write_all(b"x").await.unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.unwrap();
        }
        // ...silence closes it.
        let started = std::time::Instant::now();
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).await.unwrap_or(0), 0);
        assert!(started.elapsed() >= Duration::from_millis(200));
    })
    .await;
}

#[tokio::test]
async fn over_max_connections_is_503() {
    bounded(async {
        let mut cfg = test_cfg(vec![80]);
        cfg.max_connections = 1;
        let proxy = start_proxy(cfg).await;
        let mut first = TcpStream::connect(proxy.addr).await.unwrap();
        first.write_all(b"GET http://loc").await.unwrap();
        let says = "too many egress connections";
        refused(&proxy, "CONNECT localhost:80", 503, says).await;
        // Once the first is gone, its slot is free again.
        drop(first);
        let mut ok = false;
        for _ in 0..50 {
            let response = exchange(&proxy, b"HELLO\r\n\r\n").await;
            if status(&response) == 400 {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(ok, "the slot was not released");
    })
    .await;
}

#[tokio::test]
async fn large_body_through_tunnel_is_intact() {
    bounded(async {
        let (echo, proxy) = echo_behind_proxy(|_| {}).await;
        let mut s = tunnel(&proxy, &format!("localhost:{echo}")).await;
        let data: Vec<u8> = (0..8 * 1024 * 1024u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let (mut r, mut w) = s.split();
        let (_, back) = tokio::join!(
            async {
                w.write_all(&data).await.unwrap();
                w.shutdown().await.unwrap();
            },
            async {
                let mut back = Vec::with_capacity(data.len());
                r.read_to_end(&mut back).await.unwrap();
                back
            }
        );
        assert_eq!(back.len(), data.len());
        assert!(back == data, "tunnelled bytes differ");
    })
    .await;
}

#[tokio::test]
async fn connect_failure_is_502() {
    bounded(async {
        // A port nothing listens on (bound then released).
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let mut cfg = test_cfg(vec![port]);
        cfg.connect_timeout = Duration::from_secs(3);
        cfg.allowed_hosts.push("no-such-host.invalid".into());
        let proxy = start_proxy(cfg).await;
        for (host, says) in [
            ("localhost", "cannot connect to localhost"),
            (
                "no-such-host.invalid",
                "cannot resolve no-such-host.invalid",
            ),
        ] {
            refused(&proxy, &format!("CONNECT {host}:{port}"), 502, says).await;
        }
    })
    .await;
}

#[tokio::test]
async fn unix_listener_serves_too_and_shutdown_stops_it() {
    bounded(async {
        let echo = start_echo().await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            Arc::new(test_cfg(vec![echo])),
            shutdown.clone(),
        ));
        let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
        s.write_all(format!("CONNECT localhost:{echo} HTTP/1.1\r\n\r\nhi").as_bytes())
            .await
            .unwrap();
        let mut got = vec![0u8; "HTTP/1.1 200 Connection established\r\n\r\nhi".len()];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"HTTP/1.1 200 Connection established\r\n\r\nhi");
        shutdown.cancel();
        server.await.unwrap();
        // The open tunnel is closed as well.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
        assert!(rest.is_empty());
    })
    .await;
}

/// The cells' proxy (`--network domains`) admitting `patterns`.
async fn cells_proxy(patterns: &[&str]) -> Proxy {
    let patterns = patterns
        .iter()
        .map(|p| crate::egress::DomainPattern::parse(p).unwrap())
        .collect();
    let mut cfg = EgressConfig::for_cells(patterns);
    cfg.allow_private = true;
    start_proxy(cfg).await
}

#[tokio::test]
async fn cells_proxy_admits_its_patterns_with_their_ports_and_names_the_flag() {
    let echo = start_echo().await;
    let proxy = cells_proxy(&[&format!("localhost:{echo}"), "**.example.org"]).await;
    let mut s = bounded(tunnel(&proxy, &format!("localhost:{echo}"))).await;
    s.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    bounded(s.read_exact(&mut buf)).await.unwrap();
    assert_eq!(&buf, b"ping");

    let other = refused(&proxy, "CONNECT api.other.example:443", 403, "").await;
    assert!(
        other.contains("api.other.example is not in --allow-domain (localhost:")
            && other.contains("the operator can add it"),
        "the refusal names the host and the flag, in the reason phrase too: {other}"
    );
    assert!(!other.contains("--allow-host-egress"), "{other}");
    let port = refused(&proxy, "CONNECT localhost:443", 403, "").await;
    assert!(
        port.contains("localhost port 443 is not in --allow-domain")
            && port.contains("add it as localhost:443"),
        "{port}"
    );
    // An IP literal needs an entry of its own, whatever names resolve to it.
    refused(
        &proxy,
        &format!("CONNECT 127.0.0.1:{echo}"),
        403,
        "127.0.0.1 is not in --allow-domain",
    )
    .await;
}
