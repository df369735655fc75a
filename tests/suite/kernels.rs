//! Sessions backed by an installed Jupyter kernel (--kernels, issue 47):
//! ipykernel from the test environment's `nb` venv, its kernelspec found
//! through JUPYTER_PATH outside the workspace. The kernel answers through
//! python_exec and its companions (values, streams, errors, input,
//! interrupts, images); kernelspecs sessions could write and unknown names
//! are refused at start. Its sandbox is tested in `escape::kernels`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::support::{
    Launch, StdioServer, ToolOutput, image_blocks, kernels, server_command_plain,
    upstreams::test_env_dir,
};

/// The `nb` venv's Jupyter data directory (its kernels/python3).
fn jupyter_path() -> PathBuf {
    kernels::jupyter_path("nb", "python3")
}

/// A server offering the `nb` venv's python3 kernel, and a session `k` on it.
async fn kernel_server(extra: &[&str]) -> StdioServer {
    let mut args = vec!["--kernels", "python3"];
    args.extend_from_slice(extra);
    let launch = Launch::new(&args).env("JUPYTER_PATH", jupyter_path());
    kernels::with_kernel_session(launch, "k", "python3").await
}

async fn exec(server: &StdioServer, code: &str) -> ToolOutput {
    kernels::kernel_cell(server, "python_exec", "k", code).await
}

#[tokio::test]
async fn a_kernel_session_keeps_state_and_answers_values_streams_and_errors() {
    let server = kernel_server(&[]).await;
    exec(&server, "x = 41").await.assert_ok();
    let out = exec(&server, "x + 1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("42"), "{out:#?}");

    let out = exec(
        &server,
        "import sys\nprint('to out')\nprint('to err', file=sys.stderr)",
    )
    .await;
    out.assert_ok();
    assert!(out.str_field("stdout").contains("to out"), "{out:#?}");
    assert!(out.str_field("stderr").contains("to err"), "{out:#?}");

    let out = exec(&server, "def f():\n    return 1 / 0\nf()").await;
    out.assert_raised("ZeroDivisionError");
    let text = serde_json::to_string(&out.structured).expect("json");
    assert!(text.contains("1 / 0") || text.contains("1/0"), "{out:#?}");
    assert!(!text.contains("\\u001b["), "ANSI colours left in: {out:#?}");

    // The session's interpreter is the kernel's, and the list says so.
    let out = exec(&server, "import sys; sys.executable").await;
    let python = test_env_dir().join("nb/bin/python");
    assert!(
        out.value().is_some_and(|v| v.contains("nb/bin/python")),
        "{out:#?} (expected {})",
        python.display()
    );
    let sessions = server.sessions().await;
    let row = sessions
        .iter()
        .find(|s| s["name"] == "k")
        .expect("session k listed");
    assert_eq!(row["kernel"], "python3", "{sessions:#?}");
}

#[tokio::test]
async fn input_waits_for_python_wait_and_an_interrupt_keeps_the_kernel_state() {
    let server = kernel_server(&[]).await;
    exec(&server, "kept = 'still here'").await.assert_ok();
    kernels::answer_input_then_interrupt(
        &server,
        ("python_exec", "python_wait"),
        "name = input('who? ')\nprint('hello', name)",
        "import time; time.sleep(60)",
    )
    .await;
    let out = exec(&server, "kept").await;
    assert_eq!(out.value(), Some("'still here'"), "{out:#?}");
}

#[tokio::test]
async fn a_displayed_png_comes_back_as_an_image() {
    let server = kernel_server(&[]).await;
    // A 1x1 PNG through IPython's display machinery (no matplotlib in
    // the nb venv).
    let code = "import base64\nfrom IPython.display import Image, display\n\
        png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\n\
        display(Image(data=png))\nprint('after')";
    let out = exec(&server, code).await;
    out.assert_ok();
    let images = image_blocks(&out);
    assert_eq!(images.len(), 1, "{out:#?}");
    assert_eq!(images[0].mime, "image/png");
    assert!(images[0].data.starts_with(b"\x89PNG"), "{out:#?}");
    let display = out.display();
    assert_eq!(
        (display[0]["bytes"].as_u64(), display[0]["width"].as_u64()),
        (Some(70), Some(1)),
        "{display:#?}"
    );
    assert!(out.str_field("stdout").contains("after"), "{out:#?}");
}

#[tokio::test]
async fn a_png_over_max_image_bytes_is_named_as_the_driver_names_it() {
    let server = kernel_server(&["--max-image-bytes", "64"]).await;
    let code = "import base64\nfrom IPython.display import Image, display\n\
        display(Image(data=base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')))";
    let out = exec(&server, code).await;
    out.assert_ok();
    assert!(image_blocks(&out).is_empty(), "{out:#?}");
    assert!(
        out.text
            .contains("image/png of 70 bytes is over the limit of 64 bytes (--max-image-bytes)"),
        "{}",
        out.text
    );
}

#[tokio::test]
async fn completion_is_the_kernels_and_what_a_kernel_session_lacks_is_said() {
    let server = kernel_server(&[]).await;
    let out = server
        .call(
            "python_namespace",
            json!({"session": "k", "action": "clear"}),
        )
        .await;
    assert!(out.is_error, "{out:#?}");
    assert!(out.text.contains("built-in Python session"), "{out:#?}");
    // Completion is the kernel's own.
    exec(&server, "import collections").await.assert_ok();
    let out = server
        .call(
            "python_complete",
            json!({"session": "k", "code": "collections.Ordered"}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert_eq!(out.structured["engine"], "kernel", "{out:#?}");
    assert!(out.text.contains("OrderedDict"), "{out:#?}");
    let status = server
        .call("python_sessions", json!({"action": "status"}))
        .await;
    assert!(
        status
            .text
            .contains("kernels: python3 (a session on a kernel has no checkpoints"),
        "{status:#?}"
    );
}

#[tokio::test]
async fn kernel_arguments_name_only_the_offered_kernels() {
    let server = kernel_server(&[]).await;
    let long = "p".repeat(10_000);
    for name in ["../python3", "/bin/sh", "python3\u{0}", "", long.as_str()] {
        let out = server
            .call(
                "python_sessions",
                json!({"action": "create", "session": "bad", "kernel": name}),
            )
            .await;
        assert!(out.is_error, "{name:?}: {out:#?}");
        assert!(
            out.text
                .contains("the kernels offered (--kernels) are: python3"),
            "{out:#?}"
        );
    }
    // Its interpreter is the kernel's: no other one on top.
    let out = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "bad", "kernel": "python3", "python": "/bin/sh"}),
        )
        .await;
    assert!(
        out.is_error && out.text.contains("leave out python"),
        "{out:#?}"
    );

    // A server without --kernels neither lists the argument nor takes it.
    let plain = StdioServer::launch(Launch::new(&[])).await;
    let tools = plain.peer().list_all_tools().await.expect("tools");
    let sessions = tools
        .iter()
        .find(|t| t.name == "python_sessions")
        .expect("python_sessions");
    assert!(
        sessions.input_schema["properties"].get("kernel").is_none(),
        "{:?}",
        sessions.input_schema
    );
    let out = plain
        .call(
            "python_sessions",
            json!({"action": "create", "session": "bad", "kernel": "python3"}),
        )
        .await;
    assert!(out.is_error && out.text.contains("--kernels"), "{out:#?}");
}

#[tokio::test]
async fn a_kernel_that_dies_at_start_says_why_and_reset_gives_a_fresh_one() {
    let data = tempfile::tempdir().expect("jupyter dir");
    let broken = data.path().join("kernels/broken");
    std::fs::create_dir_all(&broken).expect("mkdir");
    let python = test_env_dir().join("nb/bin/python");
    let spec = json!({
        "argv": [python, "-c", "import sys; print('no kernel here', file=sys.stderr); sys.exit(3)", "{connection_file}"],
        "language": "python",
    });
    std::fs::write(broken.join("kernel.json"), spec.to_string()).expect("write");
    let paths = std::env::join_paths([data.path().to_path_buf(), jupyter_path()]).expect("join");
    let launch = Launch::new(&["--kernels", "python3,broken"]).env("JUPYTER_PATH", paths);
    let server = StdioServer::launch(launch).await;
    let out = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "b", "kernel": "broken"}),
        )
        .await;
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text
            .contains("could not start the Jupyter kernel 'broken'")
            && out.text.contains("exit code 3")
            && out.text.contains("no kernel here"),
        "{out:#?}"
    );

    let out = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "k", "kernel": "python3"}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    exec(&server, "gone = 1").await.assert_ok();
    let out = server
        .call(
            "python_sessions",
            json!({"action": "reset", "session": "k"}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    let out = exec(&server, "'gone' in globals()").await;
    assert_eq!(out.value(), Some("False"), "{out:#?}");
}

/// Runs ferrepl with `args`, JUPYTER_PATH `jupyter` and the workspace
/// `workdir`: it must exit non-zero; its stderr.
async fn refused_start(workdir: &Path, args: &[&str], jupyter: &Path) -> String {
    let mut cmd = server_command_plain();
    cmd.arg("--workdir")
        .arg(workdir)
        .args(args)
        .env("JUPYTER_PATH", jupyter)
        .stdin(std::process::Stdio::piped());
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the refused server exits")
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} must be refused:\n{stderr}");
    stderr
}

#[tokio::test]
async fn an_unknown_kernel_is_refused_with_those_found() {
    let workspace = tempfile::tempdir().expect("workspace");
    let log = refused_start(workspace.path(), &["--kernels", "nope"], &jupyter_path()).await;
    assert!(log.contains("no kernel 'nope' is installed"), "{log}");
    assert!(log.contains("python3"), "{log}");
}

#[tokio::test]
async fn a_kernelspec_sessions_could_write_is_refused() {
    let workspace = tempfile::tempdir().expect("workspace");
    let planted = workspace.path().join("jupyter/kernels/python3");
    std::fs::create_dir_all(&planted).expect("mkdir");
    std::fs::write(
        planted.join("kernel.json"),
        r#"{"argv": ["/bin/sh", "-c", "touch /tmp/owned"], "language": "python"}"#,
    )
    .expect("write");
    let jupyter = workspace.path().join("jupyter");
    let log = refused_start(workspace.path(), &["--kernels", "python3"], &jupyter).await;
    assert!(log.contains("which sessions can write"), "{log}");
}
