//! Serving many agents from one HTTP instance: tokens naming tenants, each
//! tenant's sessions, workspace and transport sessions invisible to the
//! others; the token file reloaded on SIGHUP; health, readiness and
//! metrics; the instance's session budget; draining on SIGTERM.
//!
//! One file per subject: `isolation` (what one tenant sees of another's,
//! stateless requests, a restart), `tokens` (SIGHUP reloads, revocation),
//! `limits` (the instance's budget and each tenant's share, groups, quota),
//! `drain` (SIGTERM), `instance` (health, readiness, metrics, logs, the
//! refusals at start). The shared helpers below start instances with a
//! tokens file and send signals and plain HTTP requests.

mod drain;
mod instance;
mod isolation;
mod limits;
mod tokens;

use crate::support::{Client, HttpServer, ToolOutput, call, http_exchange, path_str};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(super) const ALPHA: &str = "alpha-token-0123456789abcdef";
pub(super) const BETA: &str = "beta-token-0123456789abcdef0";
pub(super) const GAMMA: &str = "gamma-token-0123456789abcdef";

pub(super) fn tokens_file(dir: &Path, lines: &str) -> PathBuf {
    let path = dir.join("tokens");
    std::fs::write(&path, lines).expect("write the tokens file");
    path
}

/// A server with a tokens file holding `lines`; the directory holding the
/// file lives as long as the returned guard.
pub(super) async fn serve(lines: &str, extra: &[&str]) -> (tempfile::TempDir, HttpServer) {
    let dir = tempfile::tempdir().expect("a directory for the tokens file");
    let tokens = tokens_file(dir.path(), lines);
    let server = start(&tokens, extra).await;
    (dir, server)
}

pub(super) async fn start(tokens: &Path, extra: &[&str]) -> HttpServer {
    let mut args = vec!["--auth-token-file", path_str(tokens)];
    if !extra.contains(&"--warm-pool") {
        args.extend(["--warm-pool", "0"]);
    }
    args.extend_from_slice(extra);
    HttpServer::start(&args, &[]).await
}

/// A server with tenants alpha and beta, and a client of each on `/mcp`.
pub(super) async fn two_tenants(extra: &[&str]) -> (tempfile::TempDir, HttpServer, Client, Client) {
    let (dir, server) = serve(&format!("{ALPHA} alpha\n{BETA} beta\n"), extra).await;
    let alpha = server.connect_at("/mcp", ALPHA).await;
    let beta = server.connect_at("/mcp", BETA).await;
    (dir, server, alpha, beta)
}

pub(super) async fn exec(client: &Client, code: &str) -> ToolOutput {
    call(client.peer(), "python_exec", json!({ "code": code })).await
}

/// Sends `signal` to the server and waits until its log shows `logged`.
pub(super) async fn signal_logged(
    server: &HttpServer,
    signal: nix::sys::signal::Signal,
    logged: &str,
) {
    let pid = nix::unistd::Pid::from_raw(server.child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, signal).expect("signal the server");
    assert!(
        server.wait_log(logged, Duration::from_secs(20)).await,
        "no '{logged}' after {signal}:\n{}",
        server.stderr_log()
    );
}

/// Writes `contents` to the tokens file, sends SIGHUP and waits until the
/// log shows `logged`.
pub(super) async fn reload_logged(
    server: &HttpServer,
    tokens: &Path,
    contents: String,
    logged: &str,
) {
    std::fs::write(tokens, contents).expect("write the tokens file");
    signal_logged(server, nix::sys::signal::Signal::SIGHUP, logged).await;
}

/// GET `path` with `headers`; the status and the whole body.
pub(super) async fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    http_exchange(port, "GET", path, headers, "").await
}
