//! An HTTP upstream's headers never reach the session.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::support::upstreams::write_servers_file;
use crate::support::{StdioServer, everything, run_job, unique};

use super::*;

/// A stdlib streamable-HTTP MCP server (JSON responses, no sessions):
/// tool `auth` answers the SHA-256 of the Authorization header it got.
/// argv: PORT-FILE.
const HTTP_UPSTREAM: &str = r#"
import hashlib, json, sys
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def empty(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def do_GET(self):
        self.empty(405)
    def do_DELETE(self):
        self.empty(200)
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            m = json.loads(body)
        except ValueError:
            return self.empty(400)
        if not isinstance(m, dict) or "method" not in m or "id" not in m:
            return self.empty(202)
        method, p = m["method"], m.get("params") or {}
        if method == "initialize":
            result = {"protocolVersion": p.get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}},
                      "serverInfo": {"name": "http-minimal", "version": "0"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "auth", "description": "SHA-256 of the Authorization header",
                                 "inputSchema": {"type": "object", "properties": {}}}]}
        elif method == "tools/call":
            digest = hashlib.sha256(self.headers.get("Authorization", "").encode()).hexdigest()
            result = {"content": [{"type": "text", "text": digest}]}
        else:
            result = {}
        data = json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
server.serve_forever()
"#;

/// The HTTP upstream, started by the test (killed on drop), and its port.
async fn http_upstream(dir: &Path) -> (tokio::process::Child, u16) {
    let script = dir.join("http_upstream.py");
    std::fs::write(&script, HTTP_UPSTREAM).expect("write the HTTP upstream");
    let port_file = dir.join("http_upstream.port");
    let child = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(&port_file)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the HTTP upstream");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&port_file)
            && let Ok(port) = text.trim().parse()
        {
            return (child, port);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the HTTP upstream did not write its port"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn sha256_hex(text: &str) -> String {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())",
            text,
        ])
        .output()
        .expect("run python3 for a digest");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An HTTP upstream's headers live in the server process only: the
/// upstream gets its Authorization header (its tool answers the header's
/// digest), while the session finds the token nowhere it can read, cannot
/// open the servers file, and cannot reach the upstream's port itself
/// (no network: it could not bypass allowTools nor replay the header).
#[tokio::test]
async fn an_http_upstreams_headers_never_reach_the_session() {
    let dir = outside();
    let (_upstream, port) = http_upstream(dir.path()).await;
    let token = unique("headertoken");
    let header = format!("Bearer {token}");
    let file = write_servers_file(
        dir.path(),
        json!({ "h": {
            "url": format!("http://127.0.0.1:{port}/mcp"),
            "headers": { "Authorization": header },
        }}),
    );
    let server = StdioServer::launch(with_servers(&file, &[])).await;

    let digest = cell_json(
        &server,
        "probe",
        "import ferrepl, json\nprint(json.dumps(ferrepl.call('h', 'auth')))",
    )
    .await;
    assert_eq!(
        digest,
        json!(sha256_hex(&header)),
        "the upstream got the configured header"
    );

    let control = plant_control(server.workdir.path());
    let scan = cell_json(&server, "probe", &scan_code(&control, &[&token], &file)).await;
    assert_scan_clean(&scan, "a cell");
    let direct = cell_json(
        &server,
        "probe",
        &format!(
            "import json, socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n    r = 'connected'\n\
             except OSError as e:\n    r = '%s errno=%s' % (type(e).__name__, e.errno)\nprint(json.dumps(r))"
        ),
    )
    .await;
    assert_ne!(
        direct,
        json!("connected"),
        "a session reached the HTTP upstream's port directly"
    );

    let job = run_job(&server, dump_job(&file)).await;
    let seen = everything(&job);
    assert!(!seen.contains(&token), "a shell job saw the header's token");
    assert!(
        !seen.contains("SERVERS-FILE-READ"),
        "a job read the servers file"
    );
}
