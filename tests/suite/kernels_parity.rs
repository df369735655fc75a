//! A kernel session (--kernels) answers with the same bounds and follow-ups
//! as a built-in one: a long output is cut in the middle and read back with
//! python_output, a cell past its wait answers `running` and python_wait
//! ends it, its notebook names its kernel, and its cells run as MCP tasks
//! (with tasks.rs's client) that tasks/cancel interrupts.

use std::time::Duration;

use rmcp::model::{CancelTaskParams, TaskStatus};
use serde_json::json;

use crate::support::{HttpServer, Launch, StdioServer, ToolOutput, call, kernels, path_str};
use crate::tasks::{completed, settled, start_task, tasks_client};

/// A server offering the `nb` venv's python3 kernel, and a session `k` on it.
async fn kernel_server() -> StdioServer {
    let launch = Launch::new(&["--kernels", "python3"])
        .env("JUPYTER_PATH", kernels::jupyter_path("nb", "python3"));
    kernels::with_kernel_session(launch, "k", "python3").await
}

fn count(out: &ToolOutput, key: &str) -> u64 {
    out.structured[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer {key} in {out:#?}"))
}

#[tokio::test]
async fn a_long_kernel_output_is_cut_in_the_middle_and_read_back_with_python_output() {
    let server = kernel_server().await;
    let code = "for i in range(100000): print('line', i)";
    let out = kernels::kernel_cell(&server, "python_exec", "k", code).await;
    out.assert_ok();
    let whole: usize = (0..100_000).map(|i| format!("line {i}\n").len()).sum();
    assert_eq!(count(&out, "output_bytes"), whole as u64, "{out:#?}");
    let omitted = count(&out, "omitted_bytes");
    assert!(omitted > 0, "{out:#?}");
    assert!(
        out.text.starts_with("line 0\nline 1\n"),
        "{}",
        &out.text[..200]
    );
    assert!(out.text.contains("\nline 99999\n"), "the end is kept");
    assert!(
        !out.text.contains("\nline 50000\n"),
        "the middle was not cut"
    );
    assert!(out.text.len() < 40_000, "{} bytes", out.text.len());

    let grep = server
        .call(
            "python_output",
            json!({"session": "k", "cell": out.cell(), "grep": "line 5000[0-9]$", "context": 0}),
        )
        .await;
    assert!(!grep.is_error, "{grep:#?}");
    assert_eq!(count(&grep, "matches"), 10, "{grep:#?}");
    assert_eq!(count(&grep, "total_lines"), 100_000, "{grep:#?}");
}

#[tokio::test]
async fn a_kernel_cell_past_its_wait_is_running_and_python_wait_ends_it() {
    let server = kernel_server().await;
    let code = "import time\nprint('started', flush=True)\ntime.sleep(2)\n6 * 7";
    let out = server
        .call(
            "python_exec",
            json!({"session": "k", "code": code, "wait_s": 0.3}),
        )
        .await;
    assert_eq!(out.status(), "running", "{out:#?}");
    let done = server
        .call("python_wait", json!({"session": "k", "wait_s": 30}))
        .await;
    done.assert_ok();
    assert_eq!(done.value(), Some("42"), "{done:#?}");
    // Its output is told once: in the `running` answer or in the end's.
    let told = [&out, &done]
        .iter()
        .filter(|o| o.text.contains("started"))
        .count();
    assert_eq!(told, 1, "{out:#?}\n{done:#?}");
}

#[tokio::test]
async fn a_kernel_sessions_notebook_names_its_kernel_and_holds_its_cells() {
    let server = kernel_server().await;
    kernels::kernel_cell(
        &server,
        "python_exec",
        "k",
        "y = 20 + 1\nprint('printed', y)",
    )
    .await
    .assert_ok();
    let out = server
        .call(
            "python_export",
            json!({"session": "k", "path": "k.ipynb", "format": "ipynb"}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    let text = std::fs::read_to_string(server.workdir.path().join("k.ipynb")).expect("notebook");
    let notebook: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        notebook["metadata"]["kernelspec"]["name"], "python3",
        "{notebook:#}"
    );
    assert_eq!(notebook["metadata"]["language_info"]["name"], "python");
    assert!(
        text.contains("y = 20 + 1") && text.contains("printed 21"),
        "{text}"
    );
}

#[tokio::test]
async fn a_kernel_sessions_cell_runs_as_a_task_and_tasks_cancel_interrupts_it() {
    let jupyter = kernels::jupyter_path("nb", "python3");
    let server = HttpServer::start(
        &["--kernels", "python3"],
        &[("JUPYTER_PATH", path_str(&jupyter))],
    )
    .await;
    let client = server.connect_modern_with(tasks_client(), None).await;
    let peer = client.peer();
    let made = call(
        peer,
        "python_sessions",
        json!({"action": "create", "session": "k", "kernel": "python3"}),
    )
    .await;
    assert!(!made.is_error, "{made:#?}");

    let code = "import time\nkept = 41\nprint('kernel done')\ntime.sleep(1.5)\nkept + 1";
    let args = json!({"session": "k", "code": code, "wait_s": 0.2});
    let id = start_task(peer, "python_exec", args).await;
    let out = completed(&settled(peer, &id, Duration::from_secs(60)).await);
    out.assert_ok();
    assert_eq!(out.value(), Some("42"), "{out:#?}");
    assert!(out.text.contains("kernel done"), "{out:#?}");

    let code = "while True: time.sleep(0.05)";
    let args = json!({"session": "k", "code": code, "wait_s": 0.5});
    let id = start_task(peer, "python_exec", args).await;
    peer.cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .expect("tasks/cancel");
    let done = settled(peer, &id, Duration::from_secs(30)).await;
    assert_eq!(done.status(), TaskStatus::Cancelled, "{done:?}");
    let out = call(peer, "python_wait", json!({"session": "k", "wait_s": 10})).await;
    assert_eq!(out.status(), "interrupted", "{out:#?}");
    let out = call(
        peer,
        "python_exec",
        json!({"session": "k", "code": "kept", "wait_s": 10}),
    )
    .await;
    assert_eq!(out.assert_ok().value(), Some("41"), "{out:#?}");
}
