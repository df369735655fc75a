use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::egress::proxy::{SharedProxy, serve_tcp};
use crate::egress::{DomainPattern, EgressConfig};

const BOUND: Duration = Duration::from_secs(10);

/// An upstream that holds every connection until its client closes it.
async fn start_sink() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            });
        }
    });
    port
}

/// The cells' proxy's rules, admitting `localhost:port`.
fn cells_rules(port: u16) -> EgressConfig {
    let pattern = DomainPattern::parse(&format!("localhost:{port}")).unwrap();
    let mut rules = EgressConfig::for_cells(vec![pattern]);
    rules.allow_private = true;
    rules
}

/// Sends a CONNECT for `localhost:port` on `s`; the answer's status line.
async fn connect<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, port: u16) -> String {
    let request = format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(BOUND, async {
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).await.unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
    })
    .await
    .expect("the proxy answers");
    let head = String::from_utf8_lossy(&head).into_owned();
    head.lines().next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn one_client_cannot_take_all_of_the_cells_proxy() {
    let sink = start_sink().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    tokio::spawn(serve_tcp(
        listener,
        std::sync::Arc::new(cells_rules(sink)),
        shutdown,
    ));
    let share = crate::egress::CELL_CONNECTIONS_PER_CLIENT;
    assert!(share < crate::egress::CELL_CONNECTIONS_PER_TENANT);
    let mut held = Vec::new();
    for _ in 0..share {
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert!(connect(&mut s, sink).await.starts_with("HTTP/1.1 200"));
        held.push(s);
    }
    // Every test client is 127.0.0.1, one client: its next one is refused
    // although the proxy as a whole has room.
    let mut over = TcpStream::connect(addr).await.unwrap();
    let refused = connect(&mut over, sink).await;
    assert!(
        refused.starts_with("HTTP/1.1 503")
            && refused.contains(&format!("already holds {share} egress connections")),
        "{refused}"
    );
    // Closing one gives its place back once the proxy has seen the close.
    drop(held.pop());
    let again = tokio::time::timeout(BOUND, async {
        loop {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let status = connect(&mut s, sink).await;
            if status.starts_with("HTTP/1.1 200") {
                return status;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the share comes back");
    assert!(again.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn one_tenant_cannot_take_all_of_a_shared_proxy() {
    let sink = start_sink().await;
    let mut rules = cells_rules(sink);
    rules.max_per_principal = Some(2);
    // All test connections come from this process: one client.
    rules.max_per_client = None;
    let proxy = SharedProxy::new(rules);
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let socket = |name: &str| dir.path().join(format!("{name}.sock"));
    for (name, principal) in [("a", Some("a")), ("b", Some("b")), ("own", None)] {
        let listener = UnixListener::bind(socket(name)).unwrap();
        proxy.spawn(listener, principal.map(str::to_string), shutdown.clone());
    }
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = UnixStream::connect(socket("a")).await.unwrap();
        assert!(connect(&mut s, sink).await.starts_with("HTTP/1.1 200"));
        held.push(s);
    }
    let mut over = UnixStream::connect(socket("a")).await.unwrap();
    let refused = connect(&mut over, sink).await;
    assert!(
        refused.starts_with("HTTP/1.1 503")
            && refused.contains("this tenant's sessions and jobs already hold 2"),
        "{refused}"
    );
    // Another tenant, and the server's own listener, still have room.
    for name in ["b", "own"] {
        let mut s = UnixStream::connect(socket(name)).await.unwrap();
        let status = connect(&mut s, sink).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{name}: {status}");
        held.push(s);
    }
}
