//! The network: off by default, Unix sockets still working.

use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};

use super::{assert_denied, network_cell};
use crate::support::{StdioServer, outcome};

#[tokio::test]
async fn network_is_off_by_default_but_unix_sockets_work() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a TCP listener");
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    let tcp_port = listener.local_addr().expect("tcp addr").port();
    let udp = UdpSocket::bind("127.0.0.1:0").expect("bind a UDP socket");
    udp.set_nonblocking(true).expect("non-blocking UDP socket");
    let udp_port = udp.local_addr().expect("udp addr").port();

    let mut server = StdioServer::start(&[]).await;
    let out = server.exec(&network_cell(tcp_port, udp_port)).await;
    out.assert_ok();

    assert_denied(&out, "tcp");
    assert_denied(&out, "udp");
    assert_denied(&out, "ipv6");
    assert_eq!(
        outcome(&out, "unix"),
        "OK b'hi'",
        "socketpair() must work: {out:#?}"
    );

    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("the sandboxed cell reached the test's TCP listener from {peer}"),
        Err(e) => panic!("accept on the test's listener failed: {e}"),
    }
    let mut buf = [0u8; 64];
    match udp.recv_from(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((n, peer)) => panic!("the sandboxed cell sent {n} UDP bytes from {peer}"),
        Err(e) => panic!("recv on the test's UDP socket failed: {e}"),
    }

    server.assert_alive();
    server.close_and_wait().await;
}
