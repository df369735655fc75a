//! The real Codex CLI (`@openai/codex`, pinned in scripts/test-env.sh)
//! runs ferrepl as its MCP server under `--sandbox inherit`, driven offline
//! by a Responses-API endpoint of the test's own: a custom provider with a
//! `base_url`, a dummy key, approval `never`, no update check. The endpoint
//! answers the first request with a call of ferrepl's `python_exec` (its
//! name taken from the request's `tools`), the second with a message, and
//! keeps both requests, so the test reads what the tool returned to Codex.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::support::{server_binary, test_state_home, test_uid_table, visible_outside_dir};

fn codex_binary() -> PathBuf {
    let env_dir = match std::env::var_os("FERREPL_TEST_ENV") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-env"),
    };
    let codex = env_dir.join("codex/node_modules/.bin/codex");
    assert!(
        codex.exists(),
        "the Codex CLI {} is missing: run `bash scripts/test-env.sh`",
        codex.display()
    );
    codex
}

/// The test's Responses API: every request body it got, in order.
struct Endpoint {
    port: u16,
    requests: Arc<Mutex<Vec<Value>>>,
}

fn sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect()
}

/// The namespace Codex lists ferrepl's tools under (`mcp__ferrepl`).
fn ferrepl_namespace(body: &Value) -> Option<String> {
    body["tools"].as_array()?.iter().find_map(|t| {
        let name = t["name"].as_str()?;
        (t["type"] == "namespace" && name.contains("ferrepl")).then(|| name.to_string())
    })
}

fn answer(body: &Value, arguments: &str) -> String {
    let done = json!({"type": "response.completed", "response": {"id": "r1", "usage": {
        "input_tokens": 0, "input_tokens_details": null, "output_tokens": 0,
        "output_tokens_details": null, "total_tokens": 0}}});
    let created = json!({"type": "response.created", "response": {"id": "r1"}});
    let answered = body["input"]
        .as_array()
        .is_some_and(|items| items.iter().any(|i| i["type"] == "function_call_output"));
    let item = match ferrepl_namespace(body) {
        Some(namespace) if !answered => json!({"type": "function_call", "call_id": "c1",
            "namespace": namespace, "name": "python_exec", "arguments": arguments}),
        _ => json!({"type": "message", "role": "assistant", "id": "m1",
            "content": [{"type": "output_text", "text": "done"}]}),
    };
    sse(&[
        created,
        json!({"type": "response.output_item.done", "item": item}),
        done,
    ])
}

impl Endpoint {
    /// Answers with a python_exec call of `arguments` (a JSON string).
    fn start(arguments: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let kept = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let kept = kept.clone();
                let arguments = arguments.clone();
                std::thread::spawn(move || serve(stream, &kept, &arguments));
            }
        });
        Endpoint { port, requests }
    }

    fn tool_output(&self) -> String {
        let requests = self.requests.lock().expect("lock");
        requests
            .iter()
            .flat_map(|r| r["input"].as_array().cloned().unwrap_or_default())
            .filter(|i| i["type"] == "function_call_output")
            .map(|i| i["output"].to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// One connection: requests read by Content-Length, each answered and
/// the connection closed (Codex opens another).
fn serve(stream: std::net::TcpStream, kept: &Mutex<Vec<Value>>, arguments: &str) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut length = 0usize;
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let mut stream = stream;
    if !first.starts_with("POST") {
        let _ = stream
            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return;
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reply = answer(&body, arguments);
    kept.lock().expect("lock").push(body);
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reply.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(reply.as_bytes());
}

/// Codex's home: the test's provider, no approvals, ferrepl as its MCP
/// server with `server_args`.
fn codex_home(dir: &Path, port: u16, workspace: &Path, server_args: &[&str]) -> PathBuf {
    let home = dir.join("codex-home");
    std::fs::create_dir_all(&home).expect("codex home");
    let mut args = vec![
        "--workdir".to_string(),
        workspace.display().to_string(),
        "--warm-pool".to_string(),
        "0".to_string(),
    ];
    args.extend(server_args.iter().map(|a| a.to_string()));
    let config = format!(
        r#"model = "mock-model"
model_provider = "mock"
approval_policy = "never"
check_for_update_on_startup = false

[model_providers.mock]
name = "mock"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "MOCK_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[mcp_servers.ferrepl]
command = {command}
args = {args}
default_tools_approval_mode = "approve"
tool_timeout_sec = 120
startup_timeout_sec = 60

[mcp_servers.ferrepl.env]
XDG_STATE_HOME = {state}
FERREPL_UID_TABLE = {uids}
FERREPL_ALLOW_DEGRADED_ISOLATION = "true"
"#,
        command = toml_string(&server_binary().display().to_string()),
        args = serde_json::to_string(&args).expect("args"),
        state = toml_string(&test_state_home().display().to_string()),
        uids = toml_string(&test_uid_table().display().to_string()),
    );
    std::fs::write(home.join("config.toml"), config).expect("config.toml");
    home
}

/// A TOML basic string (JSON's escapes are TOML's for these paths).
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).expect("string")
}

/// One `codex exec` turn in `workspace` under Codex's `sandbox` mode;
/// returns what ferrepl's python_exec gave Codex.
async fn codex_turn(workspace: &Path, sandbox: &str, code: &str, server_args: &[&str]) -> String {
    let endpoint = Endpoint::start(json!({"code": code}).to_string());
    let scratch = tempfile::tempdir().expect("scratch");
    let home = codex_home(scratch.path(), endpoint.port, workspace, server_args);
    let out = tokio::process::Command::new(codex_binary())
        .args([
            "exec",
            "--skip-git-repo-check",
            "-s",
            sandbox,
            "run the cell",
        ])
        .current_dir(workspace)
        .env("CODEX_HOME", &home)
        .env("MOCK_API_KEY", "x")
        .env_remove("OPENAI_API_KEY")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(180), out)
        .await
        .expect("codex exec finished")
        .expect("codex exec ran");
    let output = endpoint.tool_output();
    assert!(
        !output.is_empty(),
        "Codex returned no tool output (exit {:?}); stderr:\n{}\nstdout:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    output
}

const WRITE_CELL: &str = "import os\ntry:\n    open('NAME', 'w').write('x')\n    r = 'wrote NAME'\nexcept OSError as e:\n    r = f'refused {e.errno}'\nr";

#[tokio::test(flavor = "multi_thread")]
async fn a_real_codex_turn_runs_the_cell_under_codexs_workspace_write_policy() {
    let dir = visible_outside_dir();
    let ws = dir.path().canonicalize().expect("ws");
    let code = WRITE_CELL.replace("NAME", "by_codex.txt");
    let output = codex_turn(&ws, "workspace-write", &code, &["--sandbox", "inherit"]).await;
    assert!(output.contains("wrote by_codex.txt"), "{output}");
    assert!(ws.join("by_codex.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_codex_turn_under_read_only_cannot_write_the_workspace() {
    let dir = visible_outside_dir();
    let ws = dir.path().canonicalize().expect("ws");
    let code = WRITE_CELL.replace("NAME", "by_codex.txt");
    let output = codex_turn(&ws, "read-only", &code, &["--sandbox", "inherit"]).await;
    assert!(output.contains("refused"), "{output}");
    assert!(!ws.join("by_codex.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn codexs_policy_never_widens_an_explicit_mode() {
    // The operator said read-only: Codex's danger-full-access changes
    // nothing (the server does not ask for Codex's policy at all).
    let dir = visible_outside_dir();
    let ws = dir.path().canonicalize().expect("ws");
    let code = WRITE_CELL.replace("NAME", "by_codex.txt");
    let output = codex_turn(
        &ws,
        "danger-full-access",
        &code,
        &["--sandbox", "read-only"],
    )
    .await;
    assert!(output.contains("refused"), "{output}");
    assert!(!ws.join("by_codex.txt").exists());
}
