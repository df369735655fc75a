//! Kernel sessions (`--kernels`): the test environment's Jupyter data
//! directories, a server with a session on a kernel, a cell in it, and
//! another client (a real `jupyter_client`) running a cell in its kernel.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::json;

use super::launch::{Launch, server_binary};
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

/// The `kernels` venv: its python (with jupyter_client) and its Jupyter
/// data directory (kernels/python3).
pub fn kernels_venv() -> PathBuf {
    let dir = test_env_dir().join("kernels");
    assert!(
        dir.join("share/jupyter/kernels/python3/kernel.json")
            .is_file(),
        "{} has no python3 kernel: run `bash scripts/test-env.sh`",
        dir.display()
    );
    dir
}

/// `ferrepl attach ARGS` run in `cwd` with the runtime directory the
/// servers use.
pub fn attach(runtime: &Path, cwd: &Path, args: &[&str]) -> Output {
    std::process::Command::new(server_binary())
        .arg("attach")
        .args(args)
        .current_dir(cwd)
        .env("XDG_RUNTIME_DIR", runtime)
        .output()
        .expect("run ferrepl attach")
}

/// Its stdout and stderr, as text.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The connection file of kernel session `session` of the server whose
/// workspace is `cwd`, as `ferrepl attach --print` finds it.
pub fn connection_file(runtime: &Path, cwd: &Path, session: &str) -> PathBuf {
    let out = attach(runtime, cwd, &[session, "--print"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let file = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(file.is_file(), "{}", file.display());
    file
}

/// A real Jupyter client (the `kernels` venv's `jupyter_client`) on
/// `connection_file` runs `code` in the kernel and waits for its end; the
/// test fails unless the cell ran.
pub fn another_client_runs(connection_file: &Path, code: &str) {
    let out = std::process::Command::new(kernels_venv().join("bin/python"))
        .args([
            "-c",
            "import sys, jupyter_client\n\
             c = jupyter_client.BlockingKernelClient()\n\
             c.load_connection_file(sys.argv[1])\n\
             c.start_channels()\n\
             c.wait_for_ready(timeout=60)\n\
             r = c.execute_interactive(sys.argv[2], timeout=60)\n\
             print('STATUS', r['content']['status'])\n",
        ])
        .arg(connection_file)
        .arg(code)
        .output()
        .expect("run the Jupyter client");
    assert!(
        output_text(&out).contains("STATUS ok"),
        "the client did not run its cell: {}",
        output_text(&out)
    );
}

/// In kernel session `k`: `ask` (a cell reading a line after the prompt
/// `who? ` and printing `hello NAME`) waits for input, which `wait`
/// answers; then `sleep` (a cell sleeping a minute) is interrupted by
/// `wait` and ends interrupted. `exec` and `wait` are the language's tools.
pub async fn answer_input_then_interrupt(
    server: &StdioServer,
    (exec, wait): (&str, &str),
    ask: &str,
    sleep: &str,
) {
    let out = kernel_cell(server, exec, "k", ask).await;
    super::assert_status(&out, "waiting_input");
    assert_eq!(out.structured["prompt"], "who? ", "{out:#?}");
    let answer = json!({"session": "k", "input": "ada", "wait_s": 30});
    let out = server.call(wait, answer).await;
    super::assert_status(&out, "ok");
    assert!(out.str_field("stdout").contains("hello ada"), "{out:#?}");

    let sleeping = json!({"session": "k", "code": sleep, "wait_s": 0.5});
    super::assert_status(&server.call(exec, sleeping).await, "running");
    let interrupt = json!({"session": "k", "interrupt": true, "wait_s": 30});
    super::assert_status(&server.call(wait, interrupt).await, "interrupted");
}
