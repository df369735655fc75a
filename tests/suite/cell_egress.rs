//! `--network domains` with `--allow-domain` (issue 46 §2), end to end
//! through the real binary: cells and shell jobs reach the named hosts over
//! HTTP and HTTPS (CONNECT) through the cells' own egress proxy, with the
//! proxy variables set for them; any other host is refused at once, the
//! refusal naming the host and the flag, and counted in `/metrics`; direct
//! connections reach nothing; loopback targets need
//! `--egress-allow-private` even when named; the installers' proxy and the
//! cells' keep their own lists; one session, or one tenant, cannot hold
//! more than its share of the cells' proxy; and bad flags are refused at
//! start.
//!
//! The destinations are servers of the test's own on loopback (`TestSites`:
//! Python's `http.server`, one plain and one with TLS, a certificate for
//! `localhost` made with the `openssl` CLI), so the servers under test run
//! with `--egress-allow-private` except where that refusal is the subject.
//! Names: `localhost` is what the tests allow (the proxy resolves it on the
//! host); the IP literal `127.0.0.1` is a different entry, refused unless
//! named; `api.other.example` is refused before any lookup.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{
    Client, HttpServer, StdioServer, ToolOutput, call, http_exchange, path_str, server_command,
    system_python,
};

/// Upper bound for the sites to print their ports, and for a refused start.
const START: Duration = Duration::from_secs(30);

/// The sites: each answers every GET with `hello <scheme> <path>`.
const SITES_PY: &str = r#"
import ssl, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

cert, key = sys.argv[1], sys.argv[2]

def handler(scheme):
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"hello {scheme} {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    return H

class Server(ThreadingHTTPServer):
    # Tests hold dozens of connections open at once.
    request_queue_size = 128

plain = Server(("127.0.0.1", 0), handler("http"))
tls = Server(("127.0.0.1", 0), handler("https"))
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
# The handshake in each connection's own thread, not in the accept loop.
tls.socket = ctx.wrap_socket(tls.socket, server_side=True, do_handshake_on_connect=False)
for s in (plain, tls):
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("PORTS", plain.server_address[1], tls.server_address[1], flush=True)
sys.stdin.read()
"#;

/// A plain HTTP and an HTTPS site on loopback, killed on drop.
struct TestSites {
    http: u16,
    https: u16,
    /// The HTTPS site's certificate (PEM), for cells to verify it by.
    cert: PathBuf,
    _dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl TestSites {
    async fn start() -> TestSites {
        let dir = tempfile::tempdir().expect("a directory for the sites");
        let d = dir.path();
        let out = std::process::Command::new("openssl")
            .current_dir(d)
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "key.pem",
                "-out",
                "cert.pem",
                "-days",
                "2",
                "-subj",
                "/CN=localhost",
                "-addext",
                "subjectAltName=DNS:localhost",
            ])
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut child = tokio::process::Command::new(system_python())
            .arg("-c")
            .arg(SITES_PY)
            .arg(d.join("cert.pem"))
            .arg(d.join("key.pem"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the sites");
        let stdout = child.stdout.take().expect("the sites' stdout");
        let mut line = String::new();
        tokio::time::timeout(START, BufReader::new(stdout).read_line(&mut line))
            .await
            .expect("the sites print their ports")
            .expect("read the sites' ports");
        let ports: Vec<u16> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|p| p.parse().ok())
            .collect();
        assert_eq!(ports.len(), 2, "PORTS line: {line:?}");
        TestSites {
            http: ports[0],
            https: ports[1],
            cert: d.join("cert.pem"),
            _dir: dir,
            _child: child,
        }
    }

    /// `--allow-domain` for both sites by name.
    fn allow_localhost(&self) -> String {
        format!("localhost:{},localhost:{}", self.http, self.https)
    }
}

/// The probes a cell or job runs, as one Python program that leaves a JSON
/// object in `out`: `fetch(url)` is "ok: BODY" or "refused: WHY"
/// (the proxy's reason phrase, which is what clients show), `direct` a TCP
/// connection to the HTTP site's address without the proxy.
fn probe_program(sites: &TestSites, cert_in_workspace: &str) -> String {
    format!(
        r#"
import json, os, socket, ssl, urllib.error, urllib.request
env = {{k: os.environ.get(k) for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY")}}
# localhost is loopback, which NO_PROXY sends direct (the cell's own
# namespace); the test names the host's localhost through the proxy.
for k in ("NO_PROXY", "no_proxy"):
    os.environ.pop(k, None)
ctx = ssl.create_default_context(cafile={cert_in_workspace:?})
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=20, context=ctx) as r:
            return "ok: " + r.read().decode()
    except urllib.error.HTTPError as e:
        return "refused: %s %s" % (e.code, e.reason)
    except OSError as e:
        return "refused: " + str(getattr(e, "reason", e))
def direct():
    try:
        socket.create_connection(("127.0.0.1", {http}), timeout=5).close()
        return "connected"
    except OSError as e:
        return "failed: " + repr(e)
out = {{
    "env": env,
    "http": fetch("http://localhost:{http}/plain"),
    "https": fetch("https://localhost:{https}/tls"),
    "ip_literal": fetch("http://127.0.0.1:{http}/ip"),
    "other_name": fetch("https://api.other.example/"),
    "unnamed_port": fetch("http://localhost:9/"),
    "direct": direct(),
}}
"#,
        http = sites.http,
        https = sites.https,
    )
}

/// The JSON object a probe printed (`RESULT {...}`), from a cell's or a
/// job's output.
fn probe_result(out: &ToolOutput) -> Value {
    let stdout = out.structured["stdout"].as_str().unwrap_or_default();
    let line = [out.text.as_str(), stdout]
        .iter()
        .flat_map(|t| t.lines())
        .find_map(|l| l.trim().strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("the probe printed its result: {out:#?}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

fn field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {v:#}"))
}

async fn tool(client: &Client, name: &str, args: Value) -> ToolOutput {
    call(client.peer(), name, args).await
}

/// `ferrepl_egress_refusals_total{proxy="cells",reason=REASON}` in `metrics`.
fn cell_refusals(metrics: &str, reason: &str) -> u64 {
    let series = format!("ferrepl_egress_refusals_total{{proxy=\"cells\",reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{metrics}"))
}

async fn metrics(server: &HttpServer) -> String {
    let port = server.metrics_port.expect("the metrics listener's port");
    let (code, body) = http_exchange(port, "GET", "/metrics", &[], "").await;
    assert_eq!(code, 200, "{body}");
    body
}

/// Copies the sites' certificate into the workspace; its name there.
fn give_cert(sites: &TestSites, workdir: &Path) -> String {
    std::fs::copy(&sites.cert, workdir.join("site-cert.pem")).expect("copy the certificate");
    workdir.join("site-cert.pem").display().to_string()
}

// ------------------------------------------------------------------ 1

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

// ------------------------------------------------------------------ 2

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

// ------------------------------------------------------------------ 3

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

// ------------------------------------------------------------------ 4

/// A cell that opens `n` CONNECT tunnels to `target` through the relay and
/// keeps them open (in `held`); the status line of each answer, one a line.
fn tunnels_cell(n: usize, target: &str) -> String {
    format!(
        r#"
import socket
held = globals().setdefault("held", [])
lines = []
for _ in range({n}):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    held.append(s)
    lines.append(head.decode(errors="replace").split("\r\n")[0])
print("\n".join(lines))
"#
    )
}

/// The status lines a [`tunnels_cell`] printed.
fn status_lines(out: &ToolOutput) -> Vec<String> {
    assert!(!out.is_error, "the tunnels cell ran: {out:#?}");
    out.text
        .lines()
        .filter(|l| l.starts_with("HTTP/1.1 "))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn one_session_cannot_take_every_connection_of_the_cells_proxy() {
    let share = ferrepl::egress::CELL_CONNECTIONS_PER_CLIENT;
    let sites = TestSites::start().await;
    let python = system_python();
    let allow = sites.allow_localhost();
    let server = StdioServer::start(&[
        "--python",
        path_str(&python),
        "--network",
        "domains",
        "--allow-domain",
        &allow,
        "--egress-allow-private",
    ])
    .await;
    // The plain site: a tunnel to it needs no TLS handshake to stay open.
    let target = format!("localhost:{}", sites.http);
    let greedy = status_lines(
        &server
            .exec_in("greedy", &tunnels_cell(share + 1, &target))
            .await,
    );
    assert_eq!(greedy.len(), share + 1, "{greedy:#?}");
    assert!(
        greedy[..share]
            .iter()
            .all(|l| l.starts_with("HTTP/1.1 200")),
        "a session's first {share} tunnels open: {greedy:#?}"
    );
    assert!(
        greedy[share].starts_with("HTTP/1.1 503")
            && greedy[share].contains(&format!("already holds {share} egress connections")),
        "its next one is refused, saying why: {greedy:#?}"
    );
    // Another session, meanwhile, still gets its own.
    let other = status_lines(&server.exec_in("other", &tunnels_cell(2, &target)).await);
    assert!(
        other.len() == 2 && other.iter().all(|l| l.starts_with("HTTP/1.1 200")),
        "another session is not starved: {other:#?}"
    );
}

/// With tenants each has a listener of its own on the cells' proxy, by
/// which the proxy counts the tenant's share: one tenant's sessions holding
/// all of theirs leave the other tenant room.
#[tokio::test]
async fn one_tenant_cannot_take_every_connection_of_the_cells_proxy() {
    let per_session = ferrepl::egress::CELL_CONNECTIONS_PER_CLIENT;
    let per_tenant = ferrepl::egress::CELL_CONNECTIONS_PER_TENANT;
    let sessions = per_tenant / per_session;
    let sites = TestSites::start().await;
    let python = system_python();
    let allow = sites.allow_localhost();
    let max_sessions = (2 * (sessions + 2)).to_string();
    let (_dir, _server, alpha, beta) = crate::tenants::two_tenants(&[
        "--python",
        path_str(&python),
        "--network",
        "domains",
        "--allow-domain",
        &allow,
        "--egress-allow-private",
        "--max-sessions",
        &max_sessions,
    ])
    .await;
    let target = format!("localhost:{}", sites.http);
    for i in 0..sessions {
        let out = tool(
            &alpha,
            "python_exec",
            json!({ "code": tunnels_cell(per_session, &target), "session": format!("s{i}") }),
        )
        .await;
        let lines = status_lines(&out);
        assert!(
            lines.len() == per_session && lines.iter().all(|l| l.starts_with("HTTP/1.1 200")),
            "alpha's session s{i} opens its share: {lines:#?}"
        );
    }
    let over = tool(
        &alpha,
        "python_exec",
        json!({ "code": tunnels_cell(1, &target), "session": "over" }),
    )
    .await;
    let over = status_lines(&over);
    assert!(
        over.len() == 1
            && over[0].starts_with("HTTP/1.1 503")
            && over[0].contains(&format!(
                "this tenant's sessions and jobs already hold {per_tenant}"
            )),
        "alpha is at its share: {over:#?}"
    );
    let other = tool(
        &beta,
        "python_exec",
        json!({ "code": tunnels_cell(2, &target) }),
    )
    .await;
    let other = status_lines(&other);
    assert!(
        other.len() == 2 && other.iter().all(|l| l.starts_with("HTTP/1.1 200")),
        "beta still connects: {other:#?}"
    );
}

// ------------------------------------------------------------------ 5

/// Runs ferrepl with `args` until it exits: it must refuse to start. Its stderr.
async fn refused(args: &[&str]) -> String {
    let workdir = tempfile::tempdir().expect("workdir");
    let mut cmd = server_command();
    cmd.arg("--workdir")
        .arg(workdir.path())
        .args(args)
        .stdin(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(START, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{args:?}: ferrepl neither refused nor exited"))
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "ferrepl must refuse to start with {args:?}; it exited {}:\n{stderr}",
        out.status
    );
    stderr
}

#[tokio::test]
async fn bad_allow_domain_flags_are_refused_at_start_saying_what_to_do() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--network", "domains"],
            &["--network domains needs", "--allow-domain"],
        ),
        (
            &["--allow-domain", "api.example.com"],
            &["add --network domains"],
        ),
        (
            &["--network", "on", "--allow-domain", "api.example.com"],
            &["add --network domains"],
        ),
        (
            &[
                "--sandbox",
                "off",
                "--network",
                "domains",
                "--allow-domain",
                "api.example.com",
            ],
            &["needs the sandbox"],
        ),
        (
            &[
                "--no-namespaces",
                "--allow-degraded-isolation",
                "--network",
                "domains",
                "--allow-domain",
                "api.example.com",
            ],
            &["--network domains needs private network namespaces"],
        ),
        (
            &["--network", "domains", "--allow-domain", "*"],
            &["--allow-domain \"*\"", "alone"],
        ),
        (
            &["--network", "domains", "--allow-domain", "ok.example,**"],
            &["alone"],
        ),
        (
            &["--network", "domains", "--allow-domain", "*.com"],
            &["top-level"],
        ),
        (
            &[
                "--network",
                "domains",
                "--allow-domain",
                "api.*.example.com",
            ],
            &["wildcard may only open"],
        ),
        (
            &["--network", "domains", "--allow-domain", "*.10.0.0.1"],
            &["IP address cannot take a wildcard"],
        ),
        (
            &[
                "--network",
                "domains",
                "--allow-domain",
                "example.com:99999",
            ],
            &["not a port"],
        ),
        (
            &[
                "--network",
                "domains",
                "--allow-domain",
                "https://example.com/",
            ],
            &["--allow-domain \"https://example.com/\""],
        ),
        (
            &[
                "--network",
                "domains",
                "--allow-domain",
                "a.example,,b.example",
            ],
            &["empty"],
        ),
        (
            &["--network", "domains", "--allow-domain", "ex ample.com"],
            &["not a host"],
        ),
    ];
    for (args, says) in cases {
        let stderr = refused(args).await;
        for needle in *says {
            assert!(
                stderr.contains(needle),
                "{args:?}: the refusal says {needle:?}:\n{stderr}"
            );
        }
    }
}

// ------------------------------------------------------------------ 6

/// docs/security.md states the cells' proxy's bounds: they are the code's.
#[test]
fn the_documented_connection_bounds_are_the_codes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/security.md");
    let text = std::fs::read_to_string(&path).expect("read docs/security.md");
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let stated = format!(
        "The cells' proxy serves {} connections at once, {} of them from one sandboxed process tree",
        ferrepl::egress::CELL_CONNECTIONS,
        ferrepl::egress::CELL_CONNECTIONS_PER_CLIENT
    );
    assert!(text.contains(&stated), "docs/security.md says: {stated:?}");
    let tenant = format!(
        "and {} from one tenant's",
        ferrepl::egress::CELL_CONNECTIONS_PER_TENANT
    );
    assert!(text.contains(&tenant), "docs/security.md says: {tenant:?}");
}
