//! Secrets stay home (issue 42 §1): what ferrepl hands out — an upstream's
//! `env` values and header values, the credentials of an upstream's URL,
//! its own bearer token, the viewer's token — never comes back to a
//! session through what an upstream says: the stderr tail quoted when a
//! stdio server fails its handshake, an HTTP server's JSON-RPC error that
//! echoes the request's headers, the backoff message that repeats why a
//! start failed, `ferrepl.tools()`'s listing, a result, an error body an
//! HTTP client cut short. Each is planted verbatim, percent-encoded,
//! JSON-escaped and in base64 at the three alignments; a value under 8
//! characters planted beside it is left as it is (the control).
//!
//! The upstream (stdlib Python, `LEAKY` below) echoes what it knows: its
//! own environment, the headers of the request, and the lines of a file
//! the test writes (`LABEL VALUE`, for the tokens an upstream would only
//! know by accident: ferrepl has no reason to think that file secret).

use super::*;

/// The leaky upstream: `fail LEAKFILE` prints its environment's secrets on
/// stderr and exits before the handshake; `http PORTFILE LEAKFILE` serves
/// streamable HTTP (JSON responses) at `/mcp`, and at `/fail-init/mcp`
/// answers `initialize` with an error; its tools `error`, `result` and
/// `cut` echo the request's headers (and the planted values) in a JSON-RPC
/// error, a text result, and a body that is no JSON (which the client
/// quotes cut at 256 bytes); `tools/list` puts them in a description.
const LEAKY: &str = r#"
import base64, json, os, sys, urllib.parse
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

def forms(v):
    b = v.encode()
    out = [v, urllib.parse.quote(v, safe=""), json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1]]
    for p in (b"", b"a", b"ab"):
        out.append(base64.b64encode(p + b + b"!").decode())
    return " ~ ".join(out)

def text(values):
    return " | ".join("%s: %s" % (label, forms(v)) for label, v in values)

def planted(path):
    out = []
    with open(path) as f:
        for line in f:
            label, _, value = line.rstrip("\n").partition(" ")
            if value:
                out.append((label, value))
    return out

if sys.argv[1] == "fail":
    env = [(k, os.environ[k]) for k in ("SECRET_ENV", "SHORT_ENV") if k in os.environ]
    sys.stderr.write("env " + text(env) + "\n")
    sys.stderr.write("planted " + text(planted(sys.argv[2])) + "\n")
    # A secret across the cut of a long line (2000 bytes).
    sys.stderr.write("x" * 1994 + os.environ.get("SECRET_ENV", "") + " past the cut\n")
    sys.stderr.flush()
    sys.exit(1)

LEAK = sys.argv[3]

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def empty(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def send(self, data, ctype="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def answer(self, mid, result=None, error=None):
        m = {"jsonrpc": "2.0", "id": mid}
        if error is not None:
            m["error"] = {"code": -32000, "message": error}
        else:
            m["result"] = result
        self.send(json.dumps(m).encode())
    def leak(self):
        values = [(k, self.headers[k]) for k in ("Authorization", "X-Api-Key", "X-Control") if self.headers.get(k)]
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            values += [("basic-user", user), ("basic-password", password)]
        return text(values + planted(LEAK))
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
        method, p, mid = m["method"], m.get("params") or {}, m["id"]
        if method == "initialize":
            if self.path.startswith("/fail-init"):
                return self.answer(mid, error="initialize refused; the request carried " + self.leak())
            return self.answer(mid, {"protocolVersion": p.get("protocolVersion", "2025-06-18"),
                                     "capabilities": {"tools": {}}, "serverInfo": {"name": "leaky", "version": "0"}})
        if method == "tools/list":
            schema = {"type": "object", "properties": {}}
            return self.answer(mid, {"tools": [
                {"name": "error", "description": "echoes " + self.leak(), "inputSchema": schema},
                {"name": "result", "description": "a result", "inputSchema": schema},
                {"name": "cut", "description": "no JSON", "inputSchema": schema}]})
        if method == "tools/call":
            name = p.get("name")
            if name == "error":
                return self.answer(mid, error="request refused; it carried " + self.leak())
            if name == "cut":
                # 12 characters of the bearer token before the client's cut at 256.
                head = b"not json: " + b"." * (256 - 10 - len("Bearer ") - 12)
                return self.send(head + self.headers.get("Authorization", "").encode() + b" and more")
            return self.answer(mid, {"content": [{"type": "text", "text": self.leak()}]})
        return self.answer(mid, {})

server = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
server.serve_forever()
"#;

/// The leaky upstream's script in `dir`; its path.
fn leaky_script(dir: &Path) -> PathBuf {
    let script = dir.join("leaky.py");
    std::fs::write(&script, LEAKY).expect("write the leaky upstream");
    script
}

/// The leaky HTTP upstream, started by the test (killed on drop), and its port.
async fn leaky_http(dir: &Path, leak: &Path) -> (tokio::process::Child, u16) {
    let script = leaky_script(dir);
    let port_file = dir.join("leaky.port");
    let child = tokio::process::Command::new("python3")
        .arg(&script)
        .arg("http")
        .arg(&port_file)
        .arg(leak)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the leaky HTTP upstream");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&port_file)
            && let Ok(port) = text.trim().parse()
        {
            return (child, port);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leaky HTTP upstream did not write its port"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Every byte but the unreserved ones as %XX (Python's quote(v, safe="")).
fn percent(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The forms a secret must never appear in: as it is, percent-encoded,
/// JSON-escaped (minimal and ASCII-only), and the characters of its
/// base64 made of its bits alone at each of the three alignments.
fn secret_forms(secret: &str) -> Vec<String> {
    let json = serde_json::to_string(secret).expect("json");
    let json = json[1..json.len() - 1].to_string();
    let ascii: String = json
        .chars()
        .map(|c| {
            if c.is_ascii() {
                c.to_string()
            } else {
                let mut units = [0u16; 2];
                c.encode_utf16(&mut units)
                    .iter()
                    .map(|u| format!("\\u{u:04x}"))
                    .collect()
            }
        })
        .collect();
    let mut forms = vec![secret.to_string(), percent(secret), json, ascii];
    for align in 0..3usize {
        let mut bytes = vec![0u8; align];
        bytes.extend_from_slice(secret.as_bytes());
        bytes.extend_from_slice(&[0, 0]);
        let encoded = b64(&bytes);
        let (start, end) = ((8 * align).div_ceil(6), 8 * (align + secret.len()) / 6);
        forms.push(encoded[start..end].to_string());
    }
    forms
}

/// The forms the upstream writes a value in (a control must show them all,
/// base64 whole: nothing of it is redacted).
fn control_forms(v: &str) -> Vec<String> {
    let json = serde_json::to_string(v).expect("json");
    let mut forms = vec![
        v.to_string(),
        percent(v),
        json[1..json.len() - 1].to_string(),
    ];
    for p in ["", "a", "ab"] {
        forms.push(b64(format!("{p}{v}!").as_bytes()));
    }
    forms
}

/// Every string of a tool result: its text blocks and each string of its
/// structured content (decoded, so a JSON-escaped form is seen as such).
fn result_strings(out: &ToolOutput) -> Vec<String> {
    fn walk(v: &Value, into: &mut Vec<String>) {
        match v {
            Value::String(s) => into.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|v| walk(v, into)),
            Value::Object(o) => o.iter().for_each(|(k, v)| {
                into.push(k.clone());
                walk(v, into);
            }),
            _ => {}
        }
    }
    let mut all: Vec<String> = out
        .raw
        .content
        .iter()
        .filter_map(|b| b.as_text().map(|t| t.text.clone()))
        .collect();
    walk(&out.structured, &mut all);
    all
}

/// Panics naming each (kind, form) of `secrets` found in `out`, or the
/// first 6 characters of a form (the start of a secret a cut left; not for
/// a value of several words, `Bearer TOKEN`, whose words are checked).
fn assert_no_secret(out: &ToolOutput, secrets: &[(&str, &str)]) {
    let texts = result_strings(out);
    let mut found = Vec::new();
    for (kind, secret) in secrets {
        let one_word = !secret.contains(char::is_whitespace);
        for form in secret_forms(secret) {
            let start: String = form.chars().take(6).collect();
            let needles = if one_word {
                vec![&form, &start]
            } else {
                vec![&form]
            };
            for needle in needles {
                if texts.iter().any(|t| t.contains(needle.as_str())) {
                    found.push(format!("{kind}: {needle:?}"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "secrets reached the tool result: {found:#?}\nresult: {out:#?}"
    );
}

/// The lines `LABEL\tTEXT` the probe cell printed, by label.
fn printed_paths(out: &ToolOutput) -> std::collections::BTreeMap<String, String> {
    out.str_field("stdout")
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Each `(label, code)` run, printing `label\t` and its result or
/// exception (`ferrepl.Error`: `Kind: message`) on one line; then `last`,
/// uncaught.
fn probe_cell(paths: &[(&str, &str)], last: &str) -> String {
    let mut code = String::from(
        "import ferrepl\n\
         def show(label, f):\n    \
             try:\n        r = f()\n        r = r if isinstance(r, str) else repr(r)\n    \
             except ferrepl.Error as e:\n        r = '%s: %s' % (type(e).__name__, e)\n    \
             print(label + '\\t' + r.replace('\\n', ' '))\n",
    );
    for (label, call) in paths {
        code.push_str(&format!("show({}, lambda: {call})\n", py(label)));
    }
    code.push_str(last);
    code.push('\n');
    code
}

/// A secret with characters every encoding changes (ASCII only: header
/// values must be visible ASCII).
fn ascii_secret(tag: &str) -> String {
    format!("{}/{tag}+k=\"q\\z", unique("Zq"))
}

/// Every kind of secret, in every path, in every encoding: none reaches
/// the cell's output, its exception or the tool result; the short
/// controls beside them do, as they were.
#[tokio::test]
async fn secrets_never_come_back_from_upstreams_in_any_encoding() {
    let dir = outside();
    let env_secret = format!("{}é", ascii_secret("env"));
    let bearer = ascii_secret("bearer");
    let api_key = ascii_secret("apikey");
    let (url_user, url_password) = ("deploy-bot-7", ascii_secret("pw"));
    let auth_token = format!("{}-mcp-token", unique("Mt"));
    let viewer_token = format!("{}-viewer-token", unique("Vt"));
    let (short_env, short_header, short_planted, short_password) =
        ("c0ntr1x", "k3y-7ch", "pl4nt7x", "pw12345");

    let leak = dir.path().join("leak.txt");
    std::fs::write(
        &leak,
        format!("auth-token {auth_token}\nviewer-token {viewer_token}\nshort {short_planted}\n"),
    )
    .expect("write the planted values");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{auth_token}\n")).expect("write the token");
    let viewer_tokens = dir.path().join("viewer-tokens");
    std::fs::write(&viewer_tokens, format!("{viewer_token}\n")).expect("write the viewer token");

    let (_http, port) = leaky_http(dir.path(), &leak).await;
    let script = path_str(&leaky_script(dir.path())).to_string();
    let headers = json!({
        "Authorization": format!("Bearer {bearer}"),
        "X-Api-Key": api_key,
        "X-Control": short_header,
    });
    let userinfo = format!("{url_user}:{}", percent(&url_password));
    let file = write_servers_file(
        dir.path(),
        json!({
            "fail": {
                "command": "python3", "args": [script, "fail", path_str(&leak)],
                "env": { "SECRET_ENV": env_secret, "SHORT_ENV": short_env },
            },
            "h": { "url": format!("http://127.0.0.1:{port}/mcp"), "headers": headers },
            "hi": { "url": format!("http://127.0.0.1:{port}/fail-init/mcp"), "headers": headers },
            "u": { "url": format!("http://{userinfo}@127.0.0.1:{port}/mcp") },
            "us": { "url": format!("http://usr:{short_password}@127.0.0.1:{port}/mcp") },
        }),
    );
    let server = StdioServer::launch(with_servers(
        &file,
        &[
            "--auth-token-file",
            path_str(&tokens),
            "--viewer",
            "127.0.0.1:0",
            "--viewer-tokens",
            path_str(&viewer_tokens),
        ],
    ))
    .await;

    let paths = [
        ("fail.start", "ferrepl.call('fail', 'x')"),
        ("fail.backoff", "ferrepl.call('fail', 'x')"),
        ("fail.tools", "ferrepl.tools('fail')"),
        ("h.tools", "ferrepl.tools('h')"),
        ("h.error", "ferrepl.call('h', 'error')"),
        ("h.result", "ferrepl.call('h', 'result')"),
        ("h.cut", "ferrepl.call('h', 'cut')"),
        ("hi.start", "ferrepl.call('hi', 'result')"),
        ("hi.backoff", "ferrepl.call('hi', 'result')"),
        ("hi.tools", "ferrepl.tools('hi')"),
        ("u.result", "ferrepl.call('u', 'result')"),
        ("u.error", "ferrepl.call('u', 'error')"),
        ("u.tools", "ferrepl.tools('u')"),
        ("us.result", "ferrepl.call('us', 'result')"),
    ];
    let out = server
        .call(
            "python_exec",
            json!({ "code": probe_cell(&paths, "ferrepl.call('h', 'error')"), "wait_s": 60 }),
        )
        .await;
    // The last call's exception, uncaught, is the cell's.
    out.assert_raised("UpstreamError");
    let seen = printed_paths(&out);
    let marker = "[redacted]";
    for (label, _) in &paths {
        let text = seen
            .get(*label)
            .unwrap_or_else(|| panic!("the cell printed nothing for {label}: {out:#?}"));
        if *label != "us.result" {
            assert!(
                text.contains(marker),
                "{label}: nothing was redacted: {text}"
            );
        }
    }
    // The controls went the same ways and came back as they were.
    for (label, control) in [
        ("fail.start", short_env),
        ("fail.start", short_planted),
        ("fail.backoff", short_env),
        ("h.tools", short_header),
        ("h.error", short_header),
        ("h.result", short_header),
        ("h.result", short_planted),
        ("hi.start", short_header),
        ("hi.backoff", short_header),
        ("u.result", short_planted),
        ("us.result", short_password),
    ] {
        for form in control_forms(control) {
            assert!(
                seen[label].contains(&form),
                "{label}: the control {control:?} is not there as {form:?}: {}",
                seen[label]
            );
        }
    }
    // The long stderr line was cut after the secret was redacted.
    assert!(
        seen["fail.start"].contains(&format!("{}[redac [cut]", "x".repeat(20))),
        "{}",
        seen["fail.start"]
    );
    assert!(
        seen["fail.backoff"].contains("ferrepl starts it again in"),
        "the second call is refused by the backoff: {}",
        seen["fail.backoff"]
    );
    assert!(
        seen["hi.backoff"].contains("ferrepl starts it again in"),
        "{}",
        seen["hi.backoff"]
    );
    let url_both = format!("{url_user}:{url_password}");
    assert_no_secret(
        &out,
        &[
            ("env value", &env_secret),
            ("header value", &format!("Bearer {bearer}")),
            ("bearer token", &bearer),
            ("x-api-key", &api_key),
            ("URL user", url_user),
            ("URL password", &url_password),
            ("URL credentials", &url_both),
            ("auth token", &auth_token),
            ("viewer token", &viewer_token),
        ],
    );
}

/// SIGHUP adds the secrets of the files it reloads: a header value only
/// the new servers file holds, a token only the new token file holds.
#[tokio::test]
async fn a_reload_adds_the_new_files_secrets() {
    let dir = outside();
    let first_key = ascii_secret("first");
    let second_key = ascii_secret("second");
    let first_token = format!("{}-first-token", unique("Ft"));
    let second_token = format!("{}-second-token", unique("St"));
    let leak = dir.path().join("leak.txt");
    std::fs::write(&leak, format!("token {second_token}\n")).expect("write the planted token");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{first_token}\n")).expect("write the token");
    let (_http, port) = leaky_http(dir.path(), &leak).await;
    let servers = |key: &str| json!({ "h": { "url": format!("http://127.0.0.1:{port}/mcp"), "headers": { "X-Api-Key": key } } });
    let file = write_servers_file(dir.path(), servers(&first_key));
    let server = StdioServer::launch(with_servers(
        &file,
        &["--auth-token-file", path_str(&tokens)],
    ))
    .await;
    let call = probe_cell(&[("h.result", "ferrepl.call('h', 'result')")], "");
    let before = server
        .call("python_exec", json!({ "code": call, "wait_s": 60 }))
        .await;
    before.assert_ok();
    assert_no_secret(&before, &[("header value", &first_key)]);
    // Not yet a secret: it is shown (the test sees the path works).
    assert!(
        printed_paths(&before)["h.result"].contains(&second_token),
        "{before:#?}"
    );

    write_servers_file(dir.path(), servers(&second_key));
    std::fs::write(&tokens, format!("{second_token}\n")).expect("write the new token");
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(server.pid() as libc::pid_t, libc::SIGHUP);
    }
    assert!(
        server
            .wait_stderr_contains("SIGHUP: 1 MCP servers configured", Duration::from_secs(60))
            .await,
        "the servers file was not reloaded: {}",
        server.stderr_log()
    );
    let after = server
        .call("python_exec", json!({ "code": call, "wait_s": 60 }))
        .await;
    after.assert_ok();
    assert!(
        printed_paths(&after)["h.result"].contains("[redacted]"),
        "{after:#?}"
    );
    assert_no_secret(
        &after,
        &[
            ("the reloaded header value", &second_key),
            ("the reloaded token", &second_token),
            ("the first token, replaced", &first_token),
        ],
    );
}
