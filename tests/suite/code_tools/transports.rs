//! Code calls tools over streamable HTTP and https.

use super::*;

// ---------------------------------------------------------------- HTTP

/// Our upstream over streamable HTTP (with `extra` flags), logging to the
/// test's log: the process (ended on drop) and its port.
async fn own_http_upstream(up: &Upstreams, extra: &[&str]) -> (tokio::process::Child, u16) {
    let port_file = up.dir.path().join("port");
    let port_arg = path_str(&port_file);
    let mut flags = vec!["--http", "0", "--port-file", &port_arg];
    flags.extend_from_slice(extra);
    let spec = own_upstream(&flags);
    let args: Vec<&str> = spec["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg"))
        .collect();
    let child = tokio::process::Command::new(spec["command"].as_str().expect("command"))
        .args(&args)
        .env("UPSTREAM_LOG", up.log())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start our upstream over HTTP");
    let port = wait_for_file_line(&port_file, EVENT_TIMEOUT)
        .await
        .trim()
        .parse()
        .expect("a port number");
    (child, port)
}

#[tokio::test]
async fn http_upstreams_with_and_without_required_headers() {
    let up = Upstreams::new();

    // Our upstream over streamable HTTP, refusing requests without the token.
    let (_own, own_port) =
        own_http_upstream(&up, &["--require-header", "Authorization: Bearer t0k"]).await;

    // server-everything over streamable HTTP.
    let every_port = free_port();
    let (node, node_args) = everything_http_command();
    let mut everything = tokio::process::Command::new(node)
        .args(&node_args)
        .env("PORT", every_port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start server-everything over HTTP");
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while tokio::net::TcpStream::connect(("127.0.0.1", every_port))
        .await
        .is_err()
    {
        if let Some(status) = everything.try_wait().expect("try_wait") {
            panic!("server-everything exited ({status}) before listening on {every_port}");
        }
        assert!(
            Instant::now() < deadline,
            "server-everything did not listen on {every_port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let own_url = format!("http://127.0.0.1:{own_port}/mcp");
    let file = up.write(json!({
        "own": {"url": own_url, "headers": {"Authorization": "Bearer t0k"}},
        "tokenless": {"url": own_url},
        "everything": {"url": format!("http://127.0.0.1:{every_port}/mcp")},
    }));
    let server = start(&file, &[]).await;

    let out = run(
        &server,
        r#"print(json.dumps({
    "own": caught(ferrepl.call, "own", "echo", text="over http"),
    "add": caught(ferrepl.call, "own", "add", a=20, b=22),
    "everything": caught(ferrepl.call, "everything", "echo", message="over http"),
    "tokenless": caught(ferrepl.call, "tokenless", "echo", text="no token"),
}))"#,
    )
    .await;
    let got = printed(&out);
    assert_eq!(got["own"], json!(["ok", "over http"]), "{got:#}");
    assert_eq!(got["add"], json!(["ok", {"sum": 42}]), "{got:#}");
    assert_eq!(
        got["everything"],
        json!(["ok", "Echo: over http"]),
        "{got:#}"
    );
    // Without the header the upstream refuses: the header above was sent.
    assert_caught(&got["tokenless"], "UpstreamError", &["tokenless"]);
    let log = log_text(&up.log());
    assert!(
        log.contains("refused POST without authorization"),
        "the tokenless server's requests were refused for lack of the header: {log}"
    );
    assert_eq!(
        log.lines().filter(|l| *l == "called echo").count(),
        1,
        "only the call with the header reached the tool: {log}"
    );
}

/// Runs `openssl` with `args` in `dir`; it must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn an_https_upstream_is_reached_with_the_systems_roots() {
    // A test CA and a certificate for 127.0.0.1 from it; our upstream over
    // HTTP behind a TLS front. ferrepl trusts the CA only through
    // SSL_CERT_FILE (the system's roots, as rustls reads them).
    let up = Upstreams::new();
    let dir = up.dir.path();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=ferrepl-test-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "srv.key",
            "-out",
            "srv.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write ext.cnf");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "srv.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );

    let (_own, own_port) = own_http_upstream(&up, &[]).await;
    let front_file = dir.join("front-port");
    let proxy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/tls_proxy.py");
    let _front = tokio::process::Command::new("python3")
        .arg(&proxy)
        .arg(dir.join("srv.pem"))
        .arg(dir.join("srv.key"))
        .arg(own_port.to_string())
        .arg(&front_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the TLS front");
    let front_port = wait_for_file_line(&front_file, EVENT_TIMEOUT).await;
    let file = up.write(json!({
        "sec": {"url": format!("https://127.0.0.1:{}/mcp", front_port.trim())},
    }));
    let ca = dir.join("ca.pem");
    let trusted = StdioServer::start_with_env(
        &["--mcp-servers", &file],
        &[("SSL_CERT_FILE", ca.to_str().expect("utf-8"))],
    )
    .await;
    let out = run(
        &trusted,
        r#"print(json.dumps(caught(ferrepl.call, "sec", "echo", text="over tls")))"#,
    )
    .await;
    assert_eq!(printed(&out), json!(["ok", "over tls"]), "{out:#?}");
    // Without the CA the certificate is not trusted: no call gets through.
    let untrusted = start(&file, &[]).await;
    let out = run(
        &untrusted,
        r#"print(json.dumps(caught(ferrepl.call, "sec", "echo", text="x")))"#,
    )
    .await;
    assert_caught(&printed(&out), "UpstreamError", &["sec"]);
    let log = log_text(&up.log());
    assert_eq!(
        log.lines().filter(|l| *l == "called echo").count(),
        1,
        "only the call over a trusted connection reached the tool: {log}"
    );
}
