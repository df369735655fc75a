//! Index credentials never enter the install job (issue 42 §2), end to end
//! through the real binary, against an HTTPS package index the test serves
//! itself.
//!
//! The operator configures a private index with credentials,
//! `PIP_INDEX_URL=https://alice:TOKEN@localhost:PORT/simple`, and its CA in
//! `PIP_CERT`. `python_install` runs pip in a sandboxed install job, where
//! code the agent wrote runs too (a `.pth` in the kept venv it installs
//! into, the venv's own pip), so the job must never hold the credentials:
//! it gets the index URL without userinfo and a CA bundle of ferrepl's own;
//! ferrepl's egress proxy ends the job's TLS to the index with a
//! certificate of that CA and re-originates GET and HEAD, with
//! `Authorization: Basic ...` under the index's root only, answering
//! anything else 405 itself.
//!
//! The index (`TestIndex`): a throwaway CA and a certificate for
//! `localhost` (DNS:localhost, IP:127.0.0.1) made with the `openssl` CLI,
//! and a PEP 503 simple index in Python (`http.server` + `ssl`, port 0)
//! listing one locally built wheel, which demands the credentials on every
//! request (401 with `WWW-Authenticate` otherwise) and logs each request as
//! `METHOD path auth=ok|missing|bad`, and the names of its headers. It
//! serves the index at `/simple/` and at `/team/simple/` (root `/team/`),
//! beside an npm login outside both roots that hands the credentials back,
//! sets session cookies, and can close its connections after every answer
//! (see `INDEX_PY`). It is on loopback, so the servers run with
//! `--egress-allow-private`. Needs `openssl` and `python3` on the host.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{
    StdioServer, ToolOutput, b64_encode, path_str, py, server_command, system_python,
};

const USER: &str = "alice";
const TOKEN: &str = "S3cr3tT0ken-xyz";
/// The package the index serves: module `credpkg`, `VALUE = 4242`.
pub(crate) const PKG: &str = "credpkg";
pub(crate) const PKG_VALUE: i64 = 4242;
const WHEEL: &str = "credpkg-1.0-py3-none-any.whl";

/// Upper bound for the index to print its port, and for a refused start.
const INDEX_START: Duration = Duration::from_secs(30);
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(60);

/// `base64("alice:S3cr3tT0ken-xyz")`: what an `Authorization` header
/// carrying the credentials holds.
fn basic_b64() -> String {
    b64_encode(format!("{USER}:{TOKEN}").as_bytes())
}

/// Panics if `text` (`what`) holds the token or its Basic-auth base64,
/// showing where.
fn assert_no_secret(text: &str, what: &str) {
    for secret in [TOKEN.to_string(), basic_b64()] {
        if let Some(at) = text.find(&secret) {
            let mut start = at.saturating_sub(300);
            while !text.is_char_boundary(start) {
                start -= 1;
            }
            let mut end = (at + secret.len() + 300).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            panic!(
                "{what} holds the index credentials ({secret:?}) at byte {at}:\n...{}...",
                &text[start..end]
            );
        }
    }
}

// ------------------------------------------------------------ the index

/// The index: a PEP 503 simple index over HTTPS for one wheel, every
/// request demanding `Authorization: Basic base64(user:password)`, each
/// request logged as `METHOD path auth=ok|missing|bad` (a failed TLS
/// handshake as `TLS-FAIL ...`), and the names of the headers it came with
/// in a second log, `METHOD path name,name,...`. Prints its port, then
/// serves until its stdin closes (the test process gone) or it is killed.
///
/// It serves two layouts at once: the index at `/simple/` (files at
/// `/files/`) and at `/team/simple/` (files at `/team/files/`), whose root
/// is `/team/`. Outside both, at the host's root, it has what a real
/// repository manager has beside its PyPI index: an npm login
/// (Artifactory's `/artifactory/api/npm/auth`), which hands the
/// credentials back (`_auth = base64(user:password)`) and a session cookie
/// to whoever sends them. Its project pages set a session cookie too. It
/// resolves dot segments and percent-escapes in paths before routing, as
/// servers in front of such managers do. With `close` as its last argument
/// every answer says `Connection: close` and the connection is closed;
/// with `drop`, the connection is closed after every answer unannounced.
const INDEX_PY: &str = r##"
import base64, hashlib, os, posixpath, ssl, sys, threading, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

cert, key, wheel, log_path, user, password, headers_log, mode = sys.argv[1:9]
close = mode == "close"
drop = mode == "drop"
npm_auth = "_auth = " + base64.b64encode(f"{user}:{password}".encode()).decode() + "\nalways-auth = true\n"
name = os.path.basename(wheel)
project = name.split("-")[0]
with open(wheel, "rb") as f:
    data = f.read()
digest = hashlib.sha256(data).hexdigest()
expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
lock = threading.Lock()
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)

def log(line, path=log_path):
    with lock, open(path, "a") as f:
        f.write(line + "\n")

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    # Every method comes here (no do_METHOD lookup, no 501 unlogged).
    def handle_one_request(self):
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            self.serve()
            self.wfile.flush()
        except (OSError, ssl.SSLError):
            self.close_connection = True

    def reply(self, code, body, ctype="text/plain", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        if close:
            # send_header sees it: the server closes after this answer.
            self.send_header("Connection", "close")
        self.end_headers()
        if drop:
            # Closed after this answer without a word (an idle timeout).
            self.close_connection = True
        if self.command != "HEAD":
            self.wfile.write(body)

    def serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        got = self.headers.get("Authorization")
        auth = "missing" if got is None else ("ok" if got == expected else "bad")
        log(f"{self.command} {self.path} auth={auth}")
        names = ",".join(sorted({k.lower() for k in self.headers.keys()}))
        log(f"{self.command} {self.path} {names}", headers_log)
        if auth != "ok":
            return self.reply(401, b"credentials required\n",
                              extra=[("WWW-Authenticate", 'Basic realm="test index"')])
        if self.command in ("POST", "PUT", "PATCH", "DELETE"):
            # A writable index: an upload that got here succeeded.
            return self.reply(201, b"stored\n")
        if self.command not in ("GET", "HEAD"):
            return self.reply(405, b"method not allowed\n")
        # Routed as servers that normalize paths route: escapes decoded,
        # dot segments resolved.
        path = posixpath.normpath(urllib.parse.unquote(self.path.split("?")[0])).rstrip("/")
        if path == "/artifactory/api/npm/auth":
            return self.reply(200, npm_auth.encode(),
                              extra=[("Set-Cookie", "SESSION=for-alice; Path=/; HttpOnly")])
        prefix = "/team" if path == "/team" or path.startswith("/team/") else ""
        rest = path[len(prefix):]
        if rest == "/simple":
            body = f'<html><body><a href="{prefix}/simple/{project}/">{project}</a></body></html>\n'
            return self.reply(200, body.encode(), "text/html")
        if rest == f"/simple/{project}":
            body = (f'<html><body><a href="{prefix}/files/{name}#sha256={digest}">{name}</a>'
                    "</body></html>\n")
            return self.reply(200, body.encode(), "text/html",
                              extra=[("Set-Cookie", "INDEXSESSION=page-for-alice; Path=/")])
        if rest == f"/files/{name}":
            return self.reply(200, data, "application/octet-stream")
        return self.reply(404, b"not found\n")

class Server(ThreadingHTTPServer):
    daemon_threads = True

    # The handshake runs on the request's own thread, not the accept loop.
    def finish_request(self, request, client_address):
        request.settimeout(60)
        try:
            conn = ctx.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as e:
            log(f"TLS-FAIL {type(e).__name__}: {e}")
            return
        try:
            self.RequestHandlerClass(conn, client_address, self)
        finally:
            conn.close()

def watch_stdin():
    sys.stdin.buffer.read()
    os._exit(0)

srv = Server(("127.0.0.1", 0), Handler)
threading.Thread(target=watch_stdin, daemon=True).start()
print(srv.server_address[1], flush=True)
srv.serve_forever()
"##;

/// Checks, from the host and without any proxy, that the index demands the
/// credentials: no header and a wrong password get 401 with
/// `WWW-Authenticate: Basic`, the right ones get the project page.
const PROBE_PY: &str = r##"
import base64, ssl, sys, urllib.error, urllib.request
url, ca, user, password, wheel = sys.argv[1:6]
ctx = ssl.create_default_context(cafile=ca)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                     urllib.request.HTTPSHandler(context=ctx))
def get(headers):
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.headers.get("WWW-Authenticate"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("WWW-Authenticate"), ""
basic = lambda u, p: {"Authorization": "Basic " + base64.b64encode(f"{u}:{p}".encode()).decode()}
status, www, _ = get({})
assert status == 401 and www and www.startswith("Basic"), ("no credentials", status, www)
status, www, _ = get(basic(user, "wrong"))
assert status == 401 and www and www.startswith("Basic"), ("wrong password", status, www)
status, _, body = get(basic(user, password))
assert status == 200 and wheel in body and "#sha256=" in body, ("credentials", status, body)
print("index ok")
"##;

/// The test's own index. The Python process is killed when this is dropped
/// (and exits by itself when the test process goes, its stdin closing).
pub(crate) struct TestIndex {
    child: tokio::process::Child,
    dir: tempfile::TempDir,
    port: u16,
    /// The CA that signed the index's certificate (the operator's PIP_CERT).
    pub(crate) ca: PathBuf,
    log: PathBuf,
    /// `METHOD path header-names` of each request.
    headers_log: PathBuf,
    // Held so that the index's stdin stays open while the test runs.
    _stdin: tokio::process::ChildStdin,
    _stdout: BufReader<tokio::process::ChildStdout>,
}

/// Runs `openssl args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How the index ends its answers.
#[derive(Clone, Copy, PartialEq)]
enum Connections {
    /// HTTP/1.1 keep-alive, as indexes do.
    KeepAlive,
    /// `Connection: close` on every answer, and the connection closed.
    Close,
    /// The connection closed after every answer, nothing said (as an
    /// index's idle timeout does between an installer's requests).
    Drop,
}

impl TestIndex {
    /// A CA, a `localhost` certificate it signed, the wheel, and the index
    /// listening on a port of its choosing.
    pub(crate) async fn start() -> TestIndex {
        TestIndex::start_with(Connections::KeepAlive).await
    }

    async fn start_with(connections: Connections) -> TestIndex {
        let dir = tempfile::tempdir().expect("a directory for the index");
        let d = dir.path();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca_args = vec!["req", "-x509"];
        ca_args.extend(ec);
        ca_args.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=ferrepl index_credentials test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(d, &ca_args);
        let mut csr_args = vec!["req", "-new"];
        csr_args.extend(ec);
        csr_args.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        openssl(d, &csr_args);
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n\
             basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\n",
        )
        .expect("write the certificate's extensions");
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
        let wheels = d.join("wheels");
        std::fs::create_dir_all(&wheels).expect("mkdir wheels");
        let wheel = crate::support::pure_wheel(&wheels, PKG, "1.0", PKG_VALUE);
        assert_eq!(wheel.file_name().and_then(|n| n.to_str()), Some(WHEEL));
        let script = d.join("index.py");
        std::fs::write(&script, INDEX_PY).expect("write the index script");
        let log = d.join("requests.log");
        let headers_log = d.join("headers.log");
        let stderr = std::fs::File::create(d.join("index.stderr")).expect("index stderr");

        let mut child = tokio::process::Command::new("python3")
            .arg(&script)
            .args([
                d.join("server.pem"),
                d.join("server.key"),
                wheel,
                log.clone(),
            ])
            .args([USER, TOKEN])
            .arg(&headers_log)
            .arg(match connections {
                Connections::KeepAlive => "keep-alive",
                Connections::Close => "close",
                Connections::Drop => "drop",
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start the index (python3)");
        let stdin = child.stdin.take().expect("the index's stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("the index's stdout"));
        let mut line = String::new();
        let read = tokio::time::timeout(INDEX_START, stdout.read_line(&mut line)).await;
        let port: u16 = match read {
            Ok(Ok(_)) => line.trim().parse().unwrap_or_else(|_| {
                panic!(
                    "the index printed {line:?}, not a port; stderr:\n{}",
                    std::fs::read_to_string(d.join("index.stderr")).unwrap_or_default()
                )
            }),
            other => panic!(
                "the index printed no port within {INDEX_START:?} ({other:?}); stderr:\n{}",
                std::fs::read_to_string(d.join("index.stderr")).unwrap_or_default()
            ),
        };
        TestIndex {
            child,
            ca: d.join("ca.pem"),
            dir,
            port,
            log,
            headers_log,
            _stdin: stdin,
            _stdout: stdout,
        }
    }

    /// The index URL as the job must see it: no userinfo.
    fn url(&self) -> String {
        format!("https://localhost:{}/simple", self.port)
    }

    /// The operator's PIP_INDEX_URL: with the credentials.
    pub(crate) fn url_with_credentials(&self) -> String {
        format!("https://{USER}:{TOKEN}@localhost:{}/simple", self.port)
    }

    /// The index of the `/team/` layout (its root `/team/`), with the
    /// credentials.
    fn team_url_with_credentials(&self) -> String {
        format!("https://{USER}:{TOKEN}@localhost:{}/team/simple", self.port)
    }

    /// `https://localhost:PORT`, no path.
    fn origin(&self) -> String {
        format!("https://localhost:{}", self.port)
    }

    /// Every line of the header log so far (`METHOD path names`).
    fn header_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.headers_log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The project's page.
    fn project_url(&self) -> String {
        format!("{}/{PKG}/", self.url())
    }

    /// Every line the index logged so far.
    pub(crate) fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The log and the index's stderr, for failure messages.
    pub(crate) fn diagnostics(&self) -> String {
        format!(
            "index log:\n{}\nindex stderr:\n{}",
            self.requests().join("\n"),
            std::fs::read_to_string(self.dir.path().join("index.stderr")).unwrap_or_default()
        )
    }

    /// From the host, no proxy: the index refuses a request without the
    /// credentials or with a wrong password (401, `WWW-Authenticate:
    /// Basic`) and serves the project page with them; the log shows the
    /// three requests as missing, bad and ok.
    fn assert_demands_credentials(&self) {
        let before = self.requests().len();
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                PROBE_PY,
                &self.project_url(),
                path_str(&self.ca),
                USER,
            ])
            .args([TOKEN, WHEEL])
            .output()
            .expect("run python3 to probe the index");
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("index ok"),
            "the test index does not behave: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.diagnostics()
        );
        let page = format!("/simple/{PKG}/");
        let expected: Vec<String> = ["missing", "bad", "ok"]
            .iter()
            .map(|a| format!("GET {page} auth={a}"))
            .collect();
        assert_eq!(
            self.requests()[before..],
            expected[..],
            "the index logs each request with its credentials' state"
        );
    }
}

impl Drop for TestIndex {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.try_wait();
    }
}

/// The request lines (`METHOD path auth=...`) of `lines`, without the
/// diagnostic `TLS-FAIL` lines.
fn request_lines(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.contains(" auth=")).collect()
}

// ------------------------------------------------------------ the server

/// ferrepl with the system interpreter, `--venv .venv` (made by the server
/// in the workspace; installs go to the venv it keeps over it),
/// `--egress-allow-private` (the index is on loopback), and the operator's
/// credentialed index and its CA in its environment.
async fn start_server(index: &TestIndex) -> StdioServer {
    start_server_with(index, &[("PIP_INDEX_URL", &index.url_with_credentials())]).await
}

/// `start_server` with the index (and its credentials) named by `envs`
/// instead (PIP_CERT is still the index's CA).
async fn start_server_with(index: &TestIndex, envs: &[(&str, &str)]) -> StdioServer {
    let python = system_python();
    let mut all = envs.to_vec();
    all.push(("PIP_CERT", path_str(&index.ca)));
    StdioServer::start_with_env(
        &[
            "--python",
            path_str(&python),
            "--venv",
            ".venv",
            "--egress-allow-private",
        ],
        &all,
    )
    .await
}

/// Plants `payload` (its `__DUMP__` replaced by the path of `dump`, a file
/// in the workspace) in the site-packages of the venv the default session
/// runs (the kept venv installs go to), imported by a `.pth` there, so
/// every interpreter of the next install job runs it at start. The dump's
/// path, as the sandbox sees it.
async fn plant(server: &StdioServer, payload: &str, dump: &str) -> String {
    let plant = server
        .exec(&format!(
            "import os, sysconfig, json\n\
             site = sysconfig.get_paths()['purelib']\n\
             dump = os.path.join(os.getcwd(), {})\n\
             payload = {}.replace('__DUMP__', repr(dump))\n\
             with open(os.path.join(site, '_credprobe_payload.py'), 'w') as f:\n    f.write(payload)\n\
             with open(os.path.join(site, '00_credprobe.pth'), 'w') as f:\n    f.write('import _credprobe_payload\\n')\n\
             print(json.dumps([site, dump]))",
            py(dump),
            py(payload)
        ))
        .await;
    plant.assert_ok();
    let planted: Vec<String> = serde_json::from_str(plant.str_field("stdout").trim())
        .unwrap_or_else(|e| panic!("the planting cell's answer ({e}): {plant:#?}"));
    assert!(
        !planted[0].starts_with(path_str(server.workdir.path())),
        "the session runs the kept venv, not the workspace's .venv: {}",
        planted[0]
    );
    planted[1].clone()
}

// The python_install result and the job's final result: packages_egress's
// `install`, which follows a running job with shell_wait (bounded).
use crate::packages_egress::install;

/// Panics unless `out` is a finished, successful install job.
fn assert_installed(out: &ToolOutput, server: &StdioServer, index: &TestIndex) {
    assert!(
        !out.is_error && out.structured["status"] == "exited" && out.structured["exit_code"] == 0,
        "the install from the credentialed index failed: {out:#?}\nserver stderr:\n{}\n{}",
        server.stderr_log(),
        index.diagnostics()
    );
}

/// `import credpkg; credpkg.VALUE` in the default session; when the
/// install finished through shell_wait (the import refresh then runs in the
/// background) a failed import is retried, bounded, until it is seen.
async fn imported_value(server: &StdioServer, finished_in_call: bool) -> ToolOutput {
    let code = format!("import {PKG}\n{PKG}.VALUE");
    let mut last = server.exec(&code).await;
    let retries = if finished_in_call { 0 } else { 100 };
    for _ in 0..retries {
        if !last.is_error {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = server.exec(&code).await;
    }
    last
}

/// A tool result as the client received it, all of it (text, structured
/// content with stdout, stderr, the shown command, notes).
fn whole(out: &ToolOutput) -> String {
    serde_json::to_string(&out.raw).expect("serialize a tool result")
}

mod attacks;
mod installs;
