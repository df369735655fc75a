//! OS confinement of sessions and shell jobs: network off by default, writes
//! limited to the workspace and a per-session temporary directory, the user's
//! home hidden, process-count and memory limits enforced on the whole process
//! tree, every process of a session (daemonized ones included) ended on reset
//! and delete, and `--sandbox off` lifting all of it.
//!
//! Every test talks to a real server over stdio through an rmcp client. The
//! network probes go to sockets the test itself opened, so the test can tell
//! from its own side that nothing reached them.
//!
//! One file per subject: `network`, `filesystem`, `limits`, `cleanup`,
//! `modes` (what status says, `--sandbox off` and `require`), `shell_jobs`,
//! `own_files` (ferrepl's own files and the view). The shared helpers below
//! recognise denials, run cells and probe the network.

mod cleanup;
mod filesystem;
mod limits;
mod modes;
mod network;
mod own_files;
mod shell_jobs;

use crate::support::{ATTEMPT, StdioServer, ToolOutput, outcome, processes_with_arg};
use serde_json::json;
use std::time::Duration;

/// Upper bound for processes of a killed session to disappear.
pub(super) const GONE_TIMEOUT: Duration = Duration::from_secs(15);
/// wait_s of cells that only end when the server kills them: past it the cell
/// comes back "running", which fails the test instead of hanging it.
pub(super) const KILL_WAIT_S: f64 = 25.0;

/// Whether an `attempt` outcome is a refusal: PermissionError, or an
/// OSError carrying EPERM/EACCES, or EROFS (the sandbox's mount namespace
/// makes everything but the workspace and the session's own directories
/// read-only at the mount level).
fn is_denial(got: &str) -> bool {
    got.starts_with("PermissionError")
        || (got.starts_with("OSError")
            && [libc::EPERM, libc::EACCES, libc::EROFS]
                .iter()
                .any(|e| got.ends_with(&format!("errno={e}"))))
}

/// Panics unless `label` failed with a permission error (PermissionError, or
/// an OSError carrying EPERM/EACCES/EROFS).
pub(super) fn assert_denied(out: &ToolOutput, label: &str) {
    let got = outcome(out, label);
    assert!(
        is_denial(&got),
        "'{label}' should have been refused with PermissionError/OSError(EPERM|EACCES|EROFS), got '{got}'; result: {out:#?}"
    );
}

/// Like `assert_denied`, for a path in a place the sandbox hides (the host's
/// temporary directory, the user's home): there the path does not exist at
/// all (FileNotFoundError, ENOENT), which is a refusal too.
pub(super) fn assert_denied_or_hidden(out: &ToolOutput, label: &str) {
    let got = outcome(out, label);
    let hidden =
        got.starts_with("FileNotFoundError") && got.ends_with(&format!("errno={}", libc::ENOENT));
    assert!(
        is_denial(&got) || hidden,
        "'{label}' should have been refused (PermissionError/OSError(EPERM|EACCES|EROFS)) or not found in a hidden place (ENOENT), got '{got}'; result: {out:#?}"
    );
}

/// python_exec with an explicit wait window.
pub(super) async fn exec_wait(
    server: &StdioServer,
    session: &str,
    code: &str,
    wait_s: f64,
) -> ToolOutput {
    server
        .call(
            "python_exec",
            json!({ "code": code, "session": session, "wait_s": wait_s }),
        )
        .await
}

/// Bounded poll until no live process carries `marker`; returns the survivors.
pub(super) async fn wait_no_process_with_arg(marker: &str, timeout: Duration) -> Vec<u32> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = processes_with_arg(marker);
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fake home directory holding `.ssh/id_rsa` with `secret` in it, made
/// outside the host's temporary directory.
pub(super) fn fake_home(secret: &str) -> tempfile::TempDir {
    let home = crate::support::visible_outside_dir();
    let ssh = home.path().join(".ssh");
    std::fs::create_dir(&ssh).expect("mkdir .ssh");
    std::fs::write(ssh.join("id_rsa"), format!("{secret}\n")).expect("write the fake key");
    home
}

/// Cell probing the network against the test's own TCP and UDP sockets.
pub(super) fn network_cell(tcp_port: u16, udp_port: u16) -> String {
    format!(
        r#"{ATTEMPT}
import socket
def tcp():
    s = socket.create_connection(("127.0.0.1", {tcp_port}), timeout=10)
    s.close()
    return "connected"
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        return s.sendto(b"ping", ("127.0.0.1", {udp_port}))
    finally:
        s.close()
def ipv6():
    socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    return "created"
def unix_pair():
    a, b = socket.socketpair()
    a.sendall(b"hi")
    got = b.recv(2)
    a.close(); b.close()
    return got
attempt("tcp", tcp)
attempt("udp", udp)
attempt("ipv6", ipv6)
attempt("unix", unix_pair)
"#
    )
}

pub(super) async fn sandbox_string(server: &StdioServer) -> String {
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(
        !status.is_error,
        "python_sessions status failed: {status:#?}"
    );
    status.structured["server"]["sandbox"]
        .as_str()
        .unwrap_or_else(|| panic!("the status has no server.sandbox: {status:#?}"))
        .to_string()
}
