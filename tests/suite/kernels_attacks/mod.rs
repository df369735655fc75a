//! A hostile agent against kernel sessions (--kernels, issue 47): its code
//! runs in the kernel, holds the kernel's key and sockets, and writes the
//! workspace the operator may run `ferrepl attach` from. Each test makes
//! one attack through the real binary and asserts the server defends:
//! the sandbox (`sandbox.rs`), what the kernel sends back over the
//! protocol (`protocol.rs`, `floods.rs`), kernelspecs the agent plants
//! (`planted.rs`) and the operator's `ferrepl attach` (`attach.rs`).

mod attach;
mod floods;
mod planted;
mod protocol;
mod sandbox;

use std::path::PathBuf;

use crate::support::{Launch, StdioServer, ToolOutput, kernels};

/// The `nb` venv's Jupyter data directory (its kernels/python3).
fn jupyter_path() -> PathBuf {
    kernels::jupyter_path("nb", "python3")
}

/// A server offering the `nb` venv's python3 kernel with `extra` flags and
/// variables, and a session `k` on it.
async fn kernel_server(extra: &[&str], envs: &[(&str, &str)]) -> StdioServer {
    let mut args = vec!["--kernels", "python3"];
    args.extend_from_slice(extra);
    let launch = Launch::new(&args)
        .env("JUPYTER_PATH", jupyter_path())
        .envs(envs);
    kernels::with_kernel_session(launch, "k", "python3").await
}

/// `code` run in session `session` (python_exec, up to a minute).
async fn exec(server: &StdioServer, session: &str, code: &str) -> ToolOutput {
    kernels::kernel_cell(server, "python_exec", session, code).await
}

/// Python prelude of a cell speaking the Jupyter protocol itself, as the
/// agent's code can: the kernel's own Session (its key) and sockets.
/// `header(type, session)` makes a header (of another client when
/// `session` is given); `publish` sends a signed message on IOPub;
/// `raw_iopub` sends frames as given (`sign=False`: a wrong signature);
/// `me` is the header of the request the running cell answers.
const PROTOCOL: &str = r#"
k = get_ipython().kernel
s = k.session
def header(msg_type, session=None):
    h = s.msg_header(msg_type)
    if session:
        h['session'] = session
    return h
def publish(msg_type, content, parent):
    s.send(k.iopub_socket, msg_type, content, parent=parent)
def raw_iopub(msg_type, parts, sign=True):
    sig = s.sign(parts) if sign else b'0' * 64
    k.iopub_socket.send_multipart([msg_type.encode(), b'<IDS|MSG>', sig] + parts)
me = k.get_parent()['header']
"#;

/// A process's `field` (VmRSS, VmHWM) in KiB, from /proc.
fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `first`, or once its cell in `session` is no longer running (waited
/// for 50 s at a time, `limit` in all) the result python_wait gave then.
async fn settle(
    server: &StdioServer,
    session: &str,
    first: ToolOutput,
    limit: std::time::Duration,
) -> ToolOutput {
    let start = std::time::Instant::now();
    let mut out = first;
    while out.status() == "running" && start.elapsed() < limit {
        out = server
            .call(
                "python_wait",
                serde_json::json!({"session": session, "wait_s": 50}),
            )
            .await;
    }
    out
}
