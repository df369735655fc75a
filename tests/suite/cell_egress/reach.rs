//! What cells, shell jobs and R cells reach under `--network domains`,
//! what is refused (named, counted), and the two proxies' separate lists.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::{
    TestSites, cell_refusals, field, give_cert, metrics, probe_program, probe_result, tool,
};
use crate::support::{HttpServer, StdioServer, path_str, system_python};

#[tokio::test]
async fn cells_reach_the_named_hosts_and_nothing_else_and_refusals_are_counted() {
    let sites = TestSites::start().await;
    let python = system_python();
    let allow = sites.allow_localhost();
    let server = HttpServer::start(
        &[
            "--python",
            path_str(&python),
            "--network",
            "domains",
            "--allow-domain",
            &allow,
            "--egress-allow-private",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        &[],
    )
    .await;
    let before = metrics(&server).await;
    assert_eq!(cell_refusals(&before, "host"), 0, "nothing refused yet");
    let cert = give_cert(&sites, server.workdir.path());
    let client = server.connect(None).await;

    let code = format!(
        "{}\nprint('RESULT', json.dumps(out))",
        probe_program(&sites, &cert)
    );
    let out = tool(&client, "python_exec", json!({ "code": code })).await;
    assert!(!out.is_error, "the probe cell ran: {out:#?}");
    let got = probe_result(&out);
    let proxy = "http://127.0.0.1:3128";
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        assert_eq!(got["env"][var], proxy, "{var} points at the relay: {got:#}");
    }
    assert!(
        field(&got["env"], "NO_PROXY").contains("localhost"),
        "loopback bypasses the proxy: {got:#}"
    );
    assert_eq!(field(&got, "http"), "ok: hello http /plain", "{got:#}");
    assert_eq!(
        field(&got, "https"),
        "ok: hello https /tls",
        "HTTPS through CONNECT, the site's own certificate verified: {got:#}"
    );
    let ip = field(&got, "ip_literal");
    assert!(
        ip.contains("403") && ip.contains("127.0.0.1 is not in --allow-domain"),
        "an IP literal needs an entry of its own: {got:#}"
    );
    let other = field(&got, "other_name");
    assert!(
        other.contains("403")
            && other.contains("api.other.example is not in --allow-domain")
            && other.contains("the operator can add it"),
        "the refusal names the host and the flag: {got:#}"
    );
    let port = field(&got, "unnamed_port");
    assert!(
        port.contains("localhost port 9 is not in --allow-domain"),
        "a port no entry names is refused: {got:#}"
    );
    assert!(
        field(&got, "direct").starts_with("failed: "),
        "a direct connection reaches nothing: {got:#}"
    );

    // A shell job: the same proxy, the same list.
    let job_script = format!(
        "{}\nprint('RESULT', json.dumps(out))",
        probe_program(&sites, &cert)
    );
    let job = tool(
        &client,
        "shell_exec",
        json!({
            "command": format!("{} -c \"$SCRIPT\"", path_str(&python)),
            "env": { "SCRIPT": job_script },
            "wait_s": 50,
        }),
    )
    .await;
    assert_eq!(
        job.structured["exit_code"], 0,
        "the probe job ran: {job:#?}"
    );
    let got = probe_result(&job);
    assert_eq!(field(&got, "http"), "ok: hello http /plain", "{got:#}");
    assert_eq!(field(&got, "https"), "ok: hello https /tls", "{got:#}");
    assert!(
        field(&got, "other_name").contains("api.other.example is not in --allow-domain"),
        "{got:#}"
    );
    assert!(field(&got, "direct").starts_with("failed: "), "{got:#}");

    // Two refused names per probe (the IP literal, api.other.example), by
    // reason and never by host.
    let after = metrics(&server).await;
    assert!(
        cell_refusals(&after, "host") >= 4,
        "refusals are counted: {after}"
    );
    assert!(cell_refusals(&after, "port") >= 2, "{after}");
    assert!(
        !after.contains("api.other.example"),
        "no host name becomes a label"
    );

    let status = tool(&client, "python_sessions", json!({ "action": "status" })).await;
    assert!(
        status.text.contains(&format!(
            "cells and shell jobs reach only localhost:{}",
            sites.http
        )),
        "the status says what cells reach: {}",
        status.text
    );
    let _ = client.cancel().await;
}

/// Also a warm pool's interpreter: started before any session asked for
/// it, it has the same relay and variables.
#[tokio::test]
async fn a_named_loopback_host_is_refused_without_egress_allow_private() {
    let sites = TestSites::start().await;
    let python = system_python();
    let allow = format!("{},127.0.0.1:{}", sites.allow_localhost(), sites.http);
    let server = StdioServer::start(&[
        "--python",
        path_str(&python),
        "--network",
        "domains",
        "--allow-domain",
        &allow,
        "--warm-pool",
        "1",
    ])
    .await;
    crate::warm_pool::wait_pool_full(&server, 1).await;
    let cert = give_cert(&sites, server.workdir.path());
    let out = server
        .exec_in(
            "pooled",
            &format!(
                "{}\nprint('RESULT', json.dumps(out))",
                probe_program(&sites, &cert)
            ),
        )
        .await;
    assert!(!out.is_error, "the probe cell ran: {out:#?}");
    let got = probe_result(&out);
    for key in ["http", "https", "ip_literal"] {
        let said = field(&got, key);
        assert!(
            said.contains("private or loopback address") && said.contains("--egress-allow-private"),
            "{key}: a loopback target is refused even when named, saying which flag allows it: {got:#}"
        );
    }
}

/// The proxy at `socket` answers `CONNECT target`: its status line and body.
fn connect_through(socket: &Path, target: &str) -> String {
    let mut stream = UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .expect("write CONNECT");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// Also: R cells reach the named hosts the same way.
#[tokio::test]
async fn installers_and_cells_keep_their_own_lists() {
    let sites = TestSites::start().await;
    let tmp = tempfile::tempdir().expect("TMPDIR for the server");
    let tmp_path = tmp.path().canonicalize().expect("canonical TMPDIR");
    let python = system_python();
    let allow = sites.allow_localhost();
    let server = StdioServer::start_with_env(
        &[
            "--python",
            path_str(&python),
            "--languages",
            "python,r",
            "--network",
            "domains",
            "--allow-domain",
            &allow,
            "--allow-host-egress",
            "installers-only.example",
            "--egress-allow-private",
        ],
        &[
            ("TMPDIR", tmp_path.to_str().expect("utf-8 TMPDIR")),
            // Not absolute: ignored, so the state directory lands in TMPDIR.
            ("XDG_RUNTIME_DIR", ""),
        ],
    )
    .await;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let pid = server.child.id().expect("the server's pid");
    let runtime = tmp_path.join(format!("ferrepl-{uid}/{pid}"));
    let installers = runtime.join("egress.sock");
    let cells = runtime.join("cell-egress.sock");

    // The installers' proxy: the indexes and --allow-host-egress, never
    // the --allow-domain hosts.
    let site = format!("localhost:{}", sites.https);
    let answer = connect_through(&installers, &site);
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains("--allow-host-egress"),
        "installers do not get the cells' hosts: {answer:?}"
    );
    // The cells' proxy: never the indexes nor --allow-host-egress.
    for host in ["pypi.org:443", "installers-only.example:443"] {
        let answer = connect_through(&cells, host);
        assert!(
            answer.starts_with("HTTP/1.1 403") && answer.contains("is not in --allow-domain"),
            "cells do not get {host}: {answer:?}"
        );
    }
    assert!(
        connect_through(&cells, &site).starts_with("HTTP/1.1 200"),
        "the cells' proxy admits their host"
    );

    // R cells have the same variables (libcurl reads the lowercase ones).
    let r = server
        .call(
            "r_exec",
            json!({
                "code": format!(
                    "Sys.unsetenv(c('no_proxy', 'NO_PROXY'))\n\
                     readLines(url('http://localhost:{}/r'), warn = FALSE)",
                    sites.http
                ),
                "wait_s": 30,
            }),
        )
        .await;
    assert!(
        !r.is_error && r.text.contains("hello http /r"),
        "an R cell reaches the named host through the proxy: {r:#?}"
    );
    drop(server);
    drop(tmp);
}
