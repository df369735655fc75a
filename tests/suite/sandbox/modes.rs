//! The sandbox's modes: what status says of the default one, `--sandbox off`
//! lifting everything, `--sandbox require` starting when all is available.

use std::net::{TcpListener, UdpSocket};

use super::{fake_home, network_cell, sandbox_string};
use crate::support::{ATTEMPT, StdioServer, assert_succeeded, outcome, py_path, unique};

#[tokio::test]
async fn sandbox_off_with_network_on_allows_everything() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a TCP listener");
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    let tcp_port = listener.local_addr().expect("tcp addr").port();
    let udp = UdpSocket::bind("127.0.0.1:0").expect("bind a UDP socket");
    let udp_port = udp.local_addr().expect("udp addr").port();

    let secret = unique("SECRET-");
    let home = fake_home(&secret);
    let key = home.path().join(".ssh").join("id_rsa");
    let home_str = home.path().to_str().expect("UTF-8 home").to_string();
    let outside = tempfile::tempdir().expect("create a directory outside the workspace");
    let target = outside.path().join("written.txt");

    let mut server = StdioServer::start_with_env(
        &["--sandbox", "off", "--network", "on"],
        &[("HOME", home_str.as_str())],
    )
    .await;

    let out = server.exec(&network_cell(tcp_port, udp_port)).await;
    out.assert_ok();
    assert_eq!(outcome(&out, "tcp"), "OK 'connected'", "{out:#?}");
    match listener.accept() {
        Ok(_) => {}
        Err(e) => panic!("the test's listener has no connection from the cell: {e}"),
    }

    let code = format!(
        r#"{ATTEMPT}
def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return "written"
def read(path):
    with open(path) as f:
        return f.read()
attempt("outside", lambda: write({target}, "out"))
attempt("secret", lambda: read({key}))
"#,
        target = py_path(&target),
        key = py_path(&key),
    );
    let out = server.exec(&code).await;
    out.assert_ok();
    assert_succeeded(&out, "outside");
    assert_eq!(
        std::fs::read_to_string(&target).expect("the file written outside the workspace"),
        "out"
    );
    assert!(
        outcome(&out, "secret").contains(&secret),
        "the fake key should be readable with --sandbox off: {out:#?}"
    );

    assert!(
        sandbox_string(&server).await.contains("OFF"),
        "the status must say the sandbox is OFF"
    );
    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn sessions_status_describes_the_default_sandbox() {
    let mut server = StdioServer::start(&[]).await;
    let sandbox = sandbox_string(&server).await;
    for needle in ["Landlock", "seccomp", "network off"] {
        assert!(
            sandbox.contains(needle),
            "the status's sandbox should mention {needle:?}: {sandbox:?}"
        );
    }
    assert!(
        !sandbox.contains("OFF"),
        "the default sandbox must not be OFF: {sandbox:?}"
    );
    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn sessions_status_says_off_when_the_sandbox_is_off() {
    let mut server = StdioServer::start(&["--sandbox", "off"]).await;
    let sandbox = sandbox_string(&server).await;
    assert!(
        sandbox.contains("OFF"),
        "the status's sandbox should say OFF: {sandbox:?}"
    );
    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn sandbox_require_starts_when_everything_is_available() {
    let mut server = StdioServer::start(&["--sandbox-require"]).await;
    let out = server.exec("1 + 1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("2"));
    let sandbox = sandbox_string(&server).await;
    assert!(
        sandbox.contains("Landlock") && sandbox.contains("seccomp"),
        "{sandbox:?}"
    );
    server.assert_alive();
    server.close_and_wait().await;
}
