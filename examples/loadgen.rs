//! Bounded, open-loop load generator for an MCP server over streamable HTTP.
//!
//! Each client gets its own keep-alive connection and MCP transport session, creates the Python
//! session `load-<i>`, then calls `python_exec` at a fixed rate. Latency counts from each call's
//! *scheduled* time when it had to wait for the previous call, so a stalled server shows up in
//! the numbers (no coordinated omission); the plain service time (send to response) is kept too.
//!
//!     cargo build --release --example loadgen
//!     target/release/examples/loadgen --url http://127.0.0.1:8790/mcp --clients 32 --rate 10

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use clap::Parser;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

const PROTOCOL: &str = "2025-11-25";
const MAX_BODY: usize = 1 << 20;
const MAX_LINE: u64 = 16 * 1024;
const MAX_HEADERS: usize = 100;
const MAX_CALLS: usize = 2_000_000;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser)]
#[command(about = "Open-loop python_exec load against an MCP streamable-HTTP endpoint")]
struct Args {
    /// Endpoint, http://HOST:PORT/PATH (plain http only).
    #[arg(long)]
    url: String,
    /// Concurrent clients, each with its own connection and session.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1000))]
    clients: u32,
    /// Calls per second per client (0 < rate <= 1000).
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Length of the timed phase.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=3600))]
    seconds: u32,
    /// Bearer token sent as "Authorization: Bearer TOKEN".
    #[arg(long)]
    token: Option<String>,
    /// Also write the summary as a JSON object to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Where requests go: HOST:PORT (to connect to, and the Host header) and the path.
#[derive(Default)]
struct Target {
    authority: String,
    path: String,
    token: Option<String>,
}

#[derive(Default)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>, // names in lower case
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        let found = self.headers.iter().find(|(n, _)| n == name);
        found.map(|(_, v)| v.as_str())
    }

    fn expect(&self, what: &str, ok: impl Fn(u16) -> bool) -> Result<()> {
        let body = String::from_utf8_lossy(&self.body[..self.body.len().min(300)]);
        ensure!(ok(self.status), "{what}: HTTP {}: {body}", self.status);
        Ok(())
    }
}

type Conn = BufReader<TcpStream>;

/// One line (CRLF or LF) of at most MAX_LINE bytes, without its line end.
async fn read_line(r: &mut Conn) -> Result<String> {
    let mut buf = Vec::new();
    (&mut *r).take(MAX_LINE).read_until(b'\n', &mut buf).await?;
    ensure!(!buf.is_empty(), "connection closed");
    ensure!(buf.ends_with(b"\n"), "header line too long");
    let line = String::from_utf8(buf).context("header line is not UTF-8")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

/// Appends exactly `n` more bytes to `body`, keeping it within MAX_BODY.
async fn read_body(r: &mut Conn, body: &mut Vec<u8>, n: usize) -> Result<()> {
    let start = body.len();
    ensure!(start + n <= MAX_BODY, "response body over {MAX_BODY} bytes");
    body.resize(start + n, 0);
    r.read_exact(&mut body[start..]).await?;
    Ok(())
}

async fn read_response(r: &mut Conn) -> Result<Response> {
    let mut resp = Response::default();
    let line = read_line(r).await?;
    ensure!(line.starts_with("HTTP/1."), "bad status line {line:?}");
    let code = line.split(' ').nth(1).and_then(|c| c.parse().ok());
    resp.status = code.context("bad status line")?;
    loop {
        let line = read_line(r).await?;
        if line.is_empty() {
            break;
        }
        ensure!(resp.headers.len() < MAX_HEADERS, "too many headers");
        let (name, value) = line.split_once(':').context("bad response header")?;
        let header = (name.trim().to_ascii_lowercase(), value.trim().to_owned());
        resp.headers.push(header);
    }
    let encoding = resp.header("transfer-encoding").unwrap_or("");
    if encoding.to_ascii_lowercase().contains("chunked") {
        loop {
            let line = read_line(r).await?;
            let size = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size, 16).context("bad chunk size")?;
            if size == 0 {
                while !read_line(r).await?.is_empty() {} // trailers
                break;
            }
            read_body(r, &mut resp.body, size).await?;
            ensure!(read_line(r).await?.is_empty(), "chunk not followed by CRLF");
        }
    } else if let Some(len) = resp.header("content-length") {
        let len = len.parse().context("bad content-length")?;
        read_body(r, &mut resp.body, len).await?;
    } else if resp.status >= 200 && ![204, 304].contains(&resp.status) {
        bail!("reply has neither content-length nor chunked encoding");
    }
    Ok(resp)
}

/// The JSON-RPC message in `resp` that answers request `id`: the whole body for
/// application/json, else the data of the SSE event whose JSON carries that id.
fn find_reply(resp: &Response, id: u64) -> Result<Value> {
    let ctype = resp.header("content-type").unwrap_or("");
    let ctype = ctype.to_ascii_lowercase();
    let text = std::str::from_utf8(&resp.body).context("response body is not UTF-8")?;
    let is_reply = |v: &Value| v.get("id") == Some(&json!(id));
    if ctype.starts_with("application/json") {
        let v: Value = serde_json::from_str(text).context("response body is not JSON")?;
        ensure!(is_reply(&v), "JSON reply does not carry id {id}");
        return Ok(v);
    }
    ensure!(ctype.starts_with("text/event-stream"), "got {ctype:?}");
    let mut data = String::new();
    for line in text.lines().chain([""]) {
        if line.is_empty() {
            match serde_json::from_str::<Value>(&data) {
                Ok(v) if is_reply(&v) => return Ok(v),
                _ => data.clear(),
            }
        } else if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    bail!("no event in the stream answers id {id}")
}

/// One MCP client: a keep-alive connection (reopened after a failure) and its transport session.
#[derive(Default)]
struct Client {
    target: Arc<Target>,
    conn: Option<Conn>,
    session: Option<String>,
    next_id: u64,
}

impl Client {
    async fn send(&mut self, verb: &str, body: Option<&Value>, max: Duration) -> Result<Response> {
        let result = tokio::time::timeout(max, self.exchange(verb, body)).await;
        let result = result.unwrap_or_else(|_| Err(anyhow!("no response within {max:?}")));
        if result.is_err() {
            self.conn = None; // in an unknown state: never reuse it
        }
        result
    }

    async fn exchange(&mut self, method: &str, body: Option<&Value>) -> Result<Response> {
        let t = &*self.target;
        if self.conn.is_none() {
            let stream = TcpStream::connect(&t.authority).await;
            let stream = stream.with_context(|| format!("connect to {}", t.authority))?;
            stream.set_nodelay(true)?;
            self.conn = Some(BufReader::new(stream));
        }
        let payload = body.map_or(Ok(vec![]), serde_json::to_vec)?;
        let mut head = format!("{method} {} HTTP/1.1\r\nHost: {}\r\n", t.path, t.authority);
        head += "Accept: application/json, text/event-stream\r\n";
        if body.is_some() {
            head += "Content-Type: application/json\r\n";
        }
        write!(head, "Content-Length: {}\r\n", payload.len())?;
        if let Some(s) = &self.session {
            write!(head, "Mcp-Session-Id: {s}\r\n")?;
            write!(head, "MCP-Protocol-Version: {PROTOCOL}\r\n")?;
        }
        if let Some(token) = &t.token {
            write!(head, "Authorization: Bearer {token}\r\n")?;
        }
        let mut request = (head + "\r\n").into_bytes();
        request.extend_from_slice(&payload);
        let conn = self.conn.as_mut().expect("connected above");
        conn.get_mut().write_all(&request).await?;
        let resp = read_response(conn).await?;
        let connection = resp.header("connection").unwrap_or("");
        if connection.eq_ignore_ascii_case("close") {
            self.conn = None;
        }
        if self.session.is_none() {
            self.session = resp.header("mcp-session-id").map(str::to_owned);
        }
        Ok(resp)
    }

    /// A JSON-RPC request; its `result`, or an error.
    async fn rpc(&mut self, method: &str, params: Value, limit: Duration) -> Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let resp = self.send("POST", Some(&req), limit).await?;
        resp.expect(method, |s| s == 200)?;
        let mut reply = find_reply(&resp, id).with_context(|| format!("{method} reply"))?;
        if let Some(err) = reply.get("error") {
            bail!("{method}: JSON-RPC error {err}");
        }
        let result = reply.get_mut("result").map(Value::take);
        result.with_context(|| format!("{method}: reply has no result"))
    }

    async fn exec(&mut self, code: &str, session: &str, limit: Duration) -> Result<()> {
        let args = json!({"code": code, "session": session});
        let params = json!({"name": "python_exec", "arguments": args});
        let result = self.rpc("tools/call", params, limit).await?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            bail!("python_exec returned isError: {result}");
        }
        Ok(())
    }

    /// MCP handshake, then the first call, which starts the client's Python session.
    async fn setup(target: Arc<Target>, i: u32) -> Result<Client> {
        let mut c = Client {
            target,
            ..Client::default()
        };
        let info = json!({"name": "ferrepl-loadgen", "version": "0.1"});
        let params = json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": info});
        c.rpc("initialize", params, REQUEST_TIMEOUT).await?;
        ensure!(c.session.is_some(), "initialize: no Mcp-Session-Id");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = c.send("POST", Some(&note), REQUEST_TIMEOUT).await?;
        resp.expect("notifications/initialized", |s| s == 202)?;
        let created = c.exec("x = 0", &format!("load-{i}"), CREATE_TIMEOUT).await;
        created.context("creating the Python session")?;
        Ok(c)
    }

    async fn teardown(&mut self) -> Result<()> {
        let resp = self.send("DELETE", None, REQUEST_TIMEOUT).await?;
        self.conn = None;
        resp.expect("DELETE", |s| (200..300).contains(&s))
    }

    /// `n` calls due at `first + k/rate`. A call's latency counts from its due time when it had
    /// to wait for the previous call (so stalls are not hidden), else from when it was sent (so
    /// the timer's own millisecond of slack is not charged to the server).
    async fn drive(&mut self, i: u32, first: Instant, rate: f64, n: usize) -> Tally {
        let session = format!("load-{i}");
        let mut t = Tally::default();
        t.latency.reserve_exact(n);
        t.service.reserve_exact(n);
        let mut prev_done = first;
        for k in 0..n {
            let due = first + Duration::from_secs_f64(k as f64 / rate);
            tokio::time::sleep_until(due).await; // returns at once when late
            let sent = Instant::now();
            let result = self.exec("x = x + 1", &session, REQUEST_TIMEOUT).await;
            let done = Instant::now();
            let origin = if prev_done > due { due } else { sent };
            prev_done = done;
            t.calls += 1;
            match result {
                Ok(()) => {
                    t.latency.push((done - origin).as_secs_f64() * 1e3);
                    t.service.push((done - sent).as_secs_f64() * 1e3);
                }
                Err(e) if t.errors == 0 => {
                    t.errors = 1;
                    eprintln!("loadgen: error: client {i}: {e:#}");
                }
                Err(_) => t.errors += 1,
            }
        }
        t
    }
}

/// What one client measured in the timed phase (milliseconds).
#[derive(Default)]
struct Tally {
    latency: Vec<f64>,
    service: Vec<f64>,
    calls: u64,
    errors: u64,
}

/// Nearest-rank percentile of sorted values (None when empty).
fn pct(sorted: &[f64], p: f64) -> Option<f64> {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.max(1) - 1).copied()
}

async fn run(args: Args) -> Result<()> {
    let (rate, seconds, nclients) = (args.rate, f64::from(args.seconds), args.clients);
    ensure!(rate > 0.0 && rate <= 1000.0, "--rate must be in (0, 1000]");
    let per_client = (rate * seconds).ceil() as usize;
    let total = per_client * nclients as usize;
    ensure!(
        total <= MAX_CALLS,
        "clients*rate*seconds is over {MAX_CALLS}"
    );
    let rest = args.url.strip_prefix("http://");
    let rest = rest.context("--url must be http://HOST:PORT/PATH")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path }.to_owned();
    let target = Arc::new(Target {
        authority: authority.to_owned(),
        path,
        token: args.token,
    });

    let mut clients = Vec::with_capacity(nclients as usize);
    for i in 0..nclients {
        match Client::setup(target.clone(), i).await {
            Ok(c) => clients.push(c),
            Err(e) => {
                for c in &mut clients {
                    let _ = c.teardown().await;
                }
                return Err(e.context(format!("setup of client {i}")));
            }
        }
    }

    // Client i's schedule is offset by i/(clients*rate): together they spread over one interval.
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::with_capacity(clients.len());
    for (i, mut c) in (0..).zip(clients) {
        let offset = f64::from(i) / (f64::from(nclients) * rate);
        let n = (((seconds - offset) * rate).ceil() as usize).min(per_client);
        let first = start + Duration::from_secs_f64(offset);
        let task = async move { (c.drive(i, first, rate, n).await, c) };
        tasks.push(tokio::spawn(task));
    }
    let (mut latency, mut service) = (Vec::with_capacity(total), Vec::with_capacity(total));
    let (mut calls, mut errors, mut teardown_ok) = (0, 0, true);
    for task in tasks {
        let (t, mut c) = task.await.context("client task panicked")?;
        latency.extend(t.latency);
        service.extend(t.service);
        (calls, errors) = (calls + t.calls, errors + t.errors);
        if let Err(e) = c.teardown().await {
            eprintln!("loadgen: error: teardown: {e:#}");
            teardown_ok = false;
        }
    }
    latency.sort_by(f64::total_cmp);
    service.sort_by(f64::total_cmp);

    let [l50, l90, l99, lmax] = [50.0, 90.0, 99.0, 100.0].map(|p| pct(&latency, p));
    let [s50, s99] = [50.0, 99.0].map(|p| pct(&service, p));
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
    println!("clients {nclients}, rate {rate}/s each, {seconds} s: {calls} calls, {errors} errors");
    let (l50s, l90s, l99s, lmaxs) = (ms(l50), ms(l90), ms(l99), ms(lmax));
    println!("latency from schedule ms: p50 {l50s} p90 {l90s} p99 {l99s} max {lmaxs}");
    println!("service time ms:          p50 {} p99 {}", ms(s50), ms(s99));
    if let Some(path) = &args.json {
        let summary = json!({
            "clients": nclients, "rate": rate, "seconds": args.seconds,
            "calls": calls, "errors": errors,
            "latency_ms": {"p50": l50, "p90": l90, "p99": l99, "max": lmax},
            "service_ms": {"p50": s50, "p99": s99},
        });
        let text = serde_json::to_string_pretty(&summary)? + "\n";
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))?;
    }
    ensure!(errors == 0, "{errors} of {calls} calls failed");
    ensure!(teardown_ok, "closing the transport sessions failed");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
