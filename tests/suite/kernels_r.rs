//! Sessions on an installed R kernel (IRkernel from Debian, its kernelspec
//! `ir` under the test environment's `kernels` venv, found through
//! JUPYTER_PATH): created with `kernel: "ir"` they are R sessions and
//! answer through r_exec and its companions (state, values, output, base
//! graphics as images, errors, readline(), interrupts, completion); without
//! the r_ tools (--languages) creating one is refused with the flag that
//! fixes it. Also a matplotlib figure from the venv's python3 kernel. Its
//! sandbox is tested in `escape::kernels`.

use std::path::PathBuf;

use serde_json::json;

use crate::support::{Launch, StdioServer, ToolOutput, image_blocks, kernels};

/// The `kernels` venv's Jupyter data directory (its kernels/ir, python3).
fn jupyter_path() -> PathBuf {
    kernels::jupyter_path("kernels", "ir")
}

/// A server offering the `kernels` venv's kernels with the r_ tools, and
/// a session `k` on kernel `kernel` (its language left to the kernel).
async fn kernel_server(kernel: &str) -> StdioServer {
    kernel_server_with(kernel, &[]).await
}

async fn kernel_server_with(kernel: &str, extra: &[&str]) -> StdioServer {
    let mut args = vec!["--kernels", "ir,python3", "--languages", "python,r"];
    args.extend_from_slice(extra);
    let launch = Launch::new(&args).env("JUPYTER_PATH", jupyter_path());
    kernels::with_kernel_session(launch, "k", kernel).await
}

async fn r_exec(server: &StdioServer, code: &str) -> ToolOutput {
    kernels::kernel_cell(server, "r_exec", "k", code).await
}

#[tokio::test]
async fn an_r_kernel_session_keeps_state_and_answers_values_output_and_errors() {
    let server = kernel_server("ir").await;
    let sessions = server.sessions().await;
    let row = sessions
        .iter()
        .find(|s| s["name"] == "k")
        .expect("session k listed");
    assert_eq!(
        (&row["kernel"], &row["language"]),
        (&json!("ir"), &json!("r")),
        "{sessions:#?}"
    );
    r_exec(&server, "x <- 41").await.assert_ok();
    // Values print as in the console, like a built-in R session's.
    let out = r_exec(&server, "x + 1").await;
    out.assert_ok();
    assert_eq!(out.str_field("stdout"), "[1] 42\n", "{out:#?}");

    let out = r_exec(&server, "cat('to out\\n'); message('to err')").await;
    out.assert_ok();
    assert!(out.str_field("stdout").contains("to out"), "{out:#?}");
    assert!(out.str_field("stderr").contains("to err"), "{out:#?}");

    let out = r_exec(&server, "f <- function() stop('no such thing'); f()").await;
    // IRkernel names every error ERROR; its message keeps R's own words.
    out.assert_raised("ERROR");
    assert_eq!(
        out.structured["error"]["message"], "Error in f(): no such thing",
        "{out:#?}"
    );
    let traceback = out.structured["error"]["traceback"]
        .as_str()
        .unwrap_or_default();
    assert!(traceback.contains("stop(\"no such thing\")"), "{out:#?}");
    assert!(
        !traceback.contains('\u{1b}'),
        "ANSI colours left in: {out:#?}"
    );

    // The python_ tools refuse an R session.
    let out = server
        .call("python_exec", json!({"session": "k", "code": "1"}))
        .await;
    assert!(out.is_error, "{out:#?}");
    assert!(out.text.contains("is an R session"), "{out:#?}");
}

#[tokio::test]
async fn base_graphics_come_back_as_an_image() {
    let server = kernel_server("ir").await;
    let out = r_exec(&server, "plot(1:10)").await;
    out.assert_ok();
    let images = image_blocks(&out);
    assert_eq!(images.len(), 1, "{out:#?}");
    assert_eq!(images[0].mime, "image/png");
    assert!(images[0].data.starts_with(b"\x89PNG"), "{out:#?}");
}

#[tokio::test]
async fn readline_waits_for_r_wait_and_an_interrupt_keeps_the_session() {
    let server = kernel_server("ir").await;
    r_exec(&server, "kept <- 'still here'").await.assert_ok();
    kernels::answer_input_then_interrupt(
        &server,
        ("r_exec", "r_wait"),
        "name <- readline('who? '); cat('hello', name, '\\n')",
        "Sys.sleep(60)",
    )
    .await;
    let out = r_exec(&server, "kept").await;
    assert_eq!(out.str_field("stdout"), "[1] \"still here\"\n", "{out:#?}");
}

#[tokio::test]
async fn completion_is_the_r_kernels() {
    let server = kernel_server("ir").await;
    r_exec(&server, "my_long_variable <- 1").await.assert_ok();
    let out = server
        .call("r_complete", json!({"session": "k", "code": "my_long_va"}))
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert_eq!(out.structured["engine"], "kernel", "{out:#?}");
    assert!(out.text.contains("my_long_variable"), "{out:#?}");
    // A kernel lists no variables: r_inspect without a name says what does.
    let out = server.call("r_inspect", json!({"session": "k"})).await;
    assert!(out.is_error, "{out:#?}");
    assert!(out.text.contains("ls.str()"), "{out:#?}");
}

#[tokio::test]
async fn a_matplotlib_figure_from_a_python_kernel_is_an_image() {
    let server = kernel_server("python3").await;
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()";
    let out = server
        .call(
            "python_exec",
            json!({"session": "k", "code": code, "wait_s": 60}),
        )
        .await;
    out.assert_ok();
    let images = image_blocks(&out);
    assert_eq!(images.len(), 1, "{out:#?}");
    assert_eq!(images[0].mime, "image/png");
    assert!(images[0].data.starts_with(b"\x89PNG"), "{out:#?}");
}

#[tokio::test]
async fn an_r_kernel_without_the_r_tools_is_refused_with_the_flag() {
    let launch = Launch::new(&["--kernels", "ir"]).env("JUPYTER_PATH", jupyter_path());
    let server = StdioServer::launch(launch).await;
    let out = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "k", "kernel": "ir"}),
        )
        .await;
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text.contains("answer through r_exec") && out.text.contains("--languages python,r"),
        "{out:#?}"
    );
    // Asked for as Python, it is refused for its language.
    let launch = Launch::new(&["--kernels", "ir", "--languages", "python,r"])
        .env("JUPYTER_PATH", jupyter_path());
    let server = StdioServer::launch(launch).await;
    let out = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "k", "kernel": "ir", "language": "python"}),
        )
        .await;
    assert!(out.is_error, "{out:#?}");
    assert!(out.text.contains("an R one"), "{out:#?}");
}

#[tokio::test]
async fn r_install_reaches_an_r_kernel_session() {
    let server = kernel_server_with("ir", &["--allow-source-builds"]).await;
    // The kernel put the workspace's library first, as the driver does.
    let out = r_exec(&server, "cat(.libPaths()[1])").await;
    out.assert_ok();
    assert!(
        out.str_field("stdout").ends_with(".ferrepl/r-library"),
        "{out:#?}"
    );
    let tarball = crate::r_sessions::build_test_package(server.workdir.path()).await;
    let args = json!({"session": "k", "packages": [tarball], "wait_s": 120});
    let mut out = server.call("r_install", args.clone()).await;
    for _ in 0..10 {
        if out.structured["status"] != "running" {
            break;
        }
        out = server.call("r_install", args.clone()).await;
    }
    assert_eq!(out.structured["exit_code"], 0, "{out:#?}");
    let out = r_exec(&server, "library(ferrepltestpkg); cat(hello())").await;
    out.assert_ok();
    assert_eq!(out.str_field("stdout"), "hi from pkg", "{out:#?}");
}
