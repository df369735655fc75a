//! Sessions on a Jupyter kernel of another language than Python or R
//! (bash_kernel from the test environment's `kernels` venv): kernel_exec
//! runs their cells, listed only when --kernels names such a kernel, and
//! python_wait and python_output follow them. Its sandbox is tested in
//! `escape::kernels`.

use serde_json::json;

use crate::support::{Launch, StdioServer, ToolOutput, assert_status, kernels, tool_names};

/// A server offering the bash kernel (every tool group), and a session
/// `sh` on it.
async fn bash_server() -> StdioServer {
    let path = kernels::jupyter_path("kernels", "bash");
    let launch = Launch::new(&["--kernels", "bash", "--tools", "all"]).env("JUPYTER_PATH", path);
    kernels::with_kernel_session(launch, "sh", "bash").await
}

async fn bash(server: &StdioServer, code: &str) -> ToolOutput {
    kernels::kernel_cell(server, "kernel_exec", "sh", code).await
}

#[tokio::test]
async fn bash_cells_keep_state_and_report_output_and_exit_status() {
    let server = bash_server().await;
    bash(&server, "X=5").await.assert_ok();
    let out = bash(&server, "echo $((X + 1))").await;
    out.assert_ok();
    assert!(out.str_field("stdout").contains('6'), "{out:#?}");

    // bash_kernel runs bash on a terminal: stderr comes as output; a
    // non-zero exit status is the cell's error.
    let out = bash(&server, "echo to-err >&2; (exit 3)").await;
    assert_status(&out, "error");
    assert!(out.str_field("stdout").contains("to-err"), "{out:#?}");
    assert!(
        out.text.contains("the kernel reported an error: 3"),
        "{out:#?}"
    );
    let cell = out.structured["cell"].as_u64().expect("cell");

    // The Python tools follow its cells.
    let read = server
        .call("python_output", json!({"session": "sh", "cell": cell}))
        .await;
    assert!(!read.is_error && read.text.contains("to-err"), "{read:#?}");

    // Its notebook names its kernel, not Python.
    let out = server
        .call(
            "python_export",
            json!({"session": "sh", "path": "sh.ipynb", "format": "ipynb"}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    let text = std::fs::read_to_string(server.workdir.path().join("sh.ipynb")).expect("notebook");
    let notebook: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        notebook["metadata"]["kernelspec"]["name"], "bash",
        "{notebook:#}"
    );
    assert_eq!(notebook["metadata"]["language_info"]["name"], "bash");
    assert!(text.contains("X=5"), "{text}");
}

#[tokio::test]
async fn kernel_exec_is_listed_only_with_a_kernel_of_another_language() {
    let server = bash_server().await;
    let names = tool_names(server.peer()).await;
    assert!(names.iter().any(|n| n == "kernel_exec"), "{names:?}");
    let tools = server.peer().list_all_tools().await.expect("tools");
    let tool = tools
        .iter()
        .find(|t| t.name == "kernel_exec")
        .expect("kernel_exec");
    let schema = serde_json::Value::Object((*tool.input_schema).clone());
    assert!(
        schema["properties"]["session"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("bash (bash)")),
        "{schema}"
    );
    assert!(schema["properties"].get("parent").is_none(), "{schema}");

    // Each cell tool refuses the other's sessions.
    let out = server
        .call("python_exec", json!({"session": "sh", "code": "1 + 1"}))
        .await;
    assert!(
        out.is_error && out.text.contains("runs a bash kernel") && out.text.contains("kernel_exec"),
        "{out:#?}"
    );
    for session in [json!(null), json!("nope"), json!("x".repeat(5_000))] {
        let out = server
            .call(
                "kernel_exec",
                json!({"session": session, "code": "echo hi"}),
            )
            .await;
        assert!(
            out.is_error
                && out.text.contains("python_sessions")
                && out.text.contains("bash (bash)"),
            "{out:#?}"
        );
    }

    // A Python kernel, or no kernel at all, does not add it.
    let python_only = Launch::new(&["--kernels", "python3"])
        .env("JUPYTER_PATH", kernels::jupyter_path("kernels", "bash"));
    let python_only = StdioServer::launch(python_only).await;
    let names = tool_names(python_only.peer()).await;
    assert!(!names.iter().any(|n| n == "kernel_exec"), "{names:?}");
    let plain = StdioServer::launch(Launch::new(&["--tools", "all"])).await;
    let names = tool_names(plain.peer()).await;
    assert!(!names.iter().any(|n| n == "kernel_exec"), "{names:?}");
    let refused = plain
        .try_call("kernel_exec", json!({"session": "sh", "code": "echo hi"}))
        .await
        .expect_err("an unlisted tool");
    assert!(refused.to_string().contains("--kernels"), "{refused}");
}

#[tokio::test]
async fn an_interrupt_stops_a_bash_cell_and_keeps_the_shell() {
    let server = bash_server().await;
    bash(&server, "KEPT=still-here").await.assert_ok();
    // bash_kernel gives bash no stdin of the client's: `read` waits on
    // its terminal until interrupted, as `sleep` does.
    for code in ["sleep 60", "read line"] {
        let started = server
            .call(
                "kernel_exec",
                json!({"session": "sh", "code": code, "wait_s": 0.5}),
            )
            .await;
        assert_status(&started, "running");
        let stopped = server
            .call(
                "python_wait",
                json!({"session": "sh", "interrupt": true, "wait_s": 30}),
            )
            .await;
        // bash_kernel answers an interrupted cell with the reply status
        // 'abort' (not the protocol's 'aborted') and sends no error: the
        // bridge reads the reply it could not parse as the running cell's,
        // interrupted, right after the interrupt.
        assert_status(&stopped, "interrupted");
        assert!(
            stopped.structured["elapsed_ms"]
                .as_f64()
                .is_some_and(|ms| ms < 30_000.0),
            "{stopped:#?}"
        );
    }
    let out = bash(&server, "echo $KEPT").await;
    out.assert_ok();
    assert!(out.str_field("stdout").contains("still-here"), "{out:#?}");
}

#[tokio::test]
async fn a_bash_session_is_listed_in_bash_and_a_built_in_one_in_python() {
    let server = bash_server().await;
    bash(&server, "echo hi").await.assert_ok();
    let out = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "py"}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    let sessions = server.sessions().await;
    let row = |name: &str| {
        sessions
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("session {name} listed: {sessions:#?}"))
    };
    let (sh, py) = (row("sh"), row("py"));
    assert_eq!(
        (&sh["language"], &sh["kernel"]),
        (&json!("bash"), &json!("bash")),
        "{sh:#}"
    );
    assert_eq!(py["language"], "python", "{py:#}");
    assert!(py.get("kernel").is_none(), "{py:#}");
    // The server's status lists them the same way.
    let status = server
        .call("python_sessions", json!({"action": "status"}))
        .await;
    assert!(status.text.contains("sh [kernel bash]"), "{status:#?}");
}
