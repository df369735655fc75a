//! Kernel sessions (`--kernels`): the test environment's Jupyter data
//! directories, a server with a session on a kernel, and a cell in it.

use std::path::PathBuf;

use serde_json::json;

use super::launch::Launch;
use super::result::ToolOutput;
use super::stdio::StdioServer;
use super::upstreams::test_env_dir;

/// The Jupyter data directory of the test environment's venv `venv` (`nb`
/// or `kernels`), which must hold the kernelspec `kernel`.
pub fn jupyter_path(venv: &str, kernel: &str) -> PathBuf {
    let dir = test_env_dir().join(venv).join("share/jupyter");
    assert!(
        dir.join("kernels")
            .join(kernel)
            .join("kernel.json")
            .is_file(),
        "{} has no {kernel} kernel: run `bash scripts/test-env.sh`",
        dir.display()
    );
    dir
}

/// The server `launch` starts, with a session `session` created on `kernel`.
pub async fn with_kernel_session(launch: Launch, session: &str, kernel: &str) -> StdioServer {
    let server = StdioServer::launch(launch).await;
    let out = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": session, "kernel": kernel}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    server
}

/// `code` run by `tool` in `session`, waiting up to a minute.
pub async fn kernel_cell(
    server: &StdioServer,
    tool: &str,
    session: &str,
    code: &str,
) -> ToolOutput {
    server
        .call(
            tool,
            json!({"session": session, "code": code, "wait_s": 60}),
        )
        .await
}
