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
//! named; `api.other.example` is refused before any lookup.//!
//! One file per subject: `reach` (what cells, jobs and R reach, what is
//! refused and counted, the two proxies' lists), `shares` (a session's and
//! a tenant's share of the proxy's connections), `flags` (refusals at
//! start, the documented bounds). The helpers below are the test sites and
//! the probes cells run against them.

mod flags;
mod reach;
mod shares;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{Client, HttpServer, ToolOutput, call, http_exchange, system_python};

/// Upper bound for the sites to print their ports, and for a refused start.
pub(super) const START: Duration = Duration::from_secs(30);

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
pub(crate) struct TestSites {
    pub(crate) http: u16,
    pub(super) https: u16,
    /// The HTTPS site's certificate (PEM), for cells to verify it by.
    cert: PathBuf,
    _dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl TestSites {
    pub(crate) async fn start() -> TestSites {
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
    pub(crate) fn allow_localhost(&self) -> String {
        format!("localhost:{},localhost:{}", self.http, self.https)
    }
}

/// The probes a cell or job runs, as one Python program that leaves a JSON
/// object in `out`: `fetch(url)` is "ok: BODY" or "refused: WHY"
/// (the proxy's reason phrase, which is what clients show), `direct` a TCP
/// connection to the HTTP site's address without the proxy.
pub(super) fn probe_program(sites: &TestSites, cert_in_workspace: &str) -> String {
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
pub(super) fn probe_result(out: &ToolOutput) -> Value {
    let stdout = out.structured["stdout"].as_str().unwrap_or_default();
    let line = [out.text.as_str(), stdout]
        .iter()
        .flat_map(|t| t.lines())
        .find_map(|l| l.trim().strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("the probe printed its result: {out:#?}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

pub(super) fn field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {v:#}"))
}

pub(super) async fn tool(client: &Client, name: &str, args: Value) -> ToolOutput {
    call(client.peer(), name, args).await
}

/// `ferrepl_egress_refusals_total{proxy="cells",reason=REASON}` in `metrics`.
pub(super) fn cell_refusals(metrics: &str, reason: &str) -> u64 {
    let series = format!("ferrepl_egress_refusals_total{{proxy=\"cells\",reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{metrics}"))
}

pub(super) async fn metrics(server: &HttpServer) -> String {
    let port = server.metrics_port.expect("the metrics listener's port");
    let (code, body) = http_exchange(port, "GET", "/metrics", &[], "").await;
    assert_eq!(code, 200, "{body}");
    body
}

/// Copies the sites' certificate into the workspace; its name there.
pub(super) fn give_cert(sites: &TestSites, workdir: &Path) -> String {
    std::fs::copy(&sites.cert, workdir.join("site-cert.pem")).expect("copy the certificate");
    workdir.join("site-cert.pem").display().to_string()
}
