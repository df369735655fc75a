//! What ferrepl asks a kernel by message besides cells (issue 47): an
//! interrupt for a kernelspec whose `interrupt_mode` is `message`
//! (`interrupt_request` on the control socket, not SIGINT), and
//! python_inspect / r_inspect as the kernel's `inspect_request`.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::{
    Launch, StdioServer, ToolOutput, assert_status, kernels, server_command_plain, upstreams,
};

/// Starts ipykernel in a process group of its own, so SIGINT sent to the
/// session's group never reaches it: only a kernel asked by message
/// (ipykernel then signals itself) can be interrupted.
const OWN_GROUP: &str = "import os, sys; os.setpgid(0, 0); \
    os.execv(sys.executable, [sys.executable, '-m', 'ipykernel_launcher', '-f', sys.argv[1]])";

/// The same, with a kernel that takes interrupt requests and never
/// answers them.
const OWN_GROUP_DEAF: &str = "import os, sys; os.setpgid(0, 0)\n\
    import ipykernel.kernelbase as base\n\
    async def ignored(self, *args): pass\n\
    base.Kernel.interrupt_request = ignored\n\
    from ipykernel import kernelapp\n\
    kernelapp.launch_new_instance(['-f', sys.argv[1]])";

/// Writes kernelspec `name` into the Jupyter data directory `data`: the
/// `kernels` venv's ipykernel in a group of its own, interrupted as `mode` says.
fn own_group_kernel(data: &Path, name: &str, mode: Option<&str>) {
    kernelspec(data, name, OWN_GROUP, mode);
}

/// Kernelspec `name` in `data`: the `kernels` venv's python running `code`
/// with the connection file as its argument.
fn kernelspec(data: &Path, name: &str, code: &str, mode: Option<&str>) {
    let dir = data.join("kernels").join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let python = upstreams::test_env_dir().join("kernels/bin/python");
    let mut spec = json!({
        "argv": [python, "-c", code, "{connection_file}"],
        "language": "python",
        "display_name": name,
    });
    if let Some(mode) = mode {
        spec["interrupt_mode"] = json!(mode);
    }
    std::fs::write(dir.join("kernel.json"), spec.to_string()).expect("write");
}

async fn exec(server: &StdioServer, session: &str, code: &str) -> ToolOutput {
    kernels::kernel_cell(server, "python_exec", session, code).await
}

/// Runs a sleep in `session` and interrupts it: the interrupt's result.
async fn interrupt_a_sleep(server: &StdioServer, session: &str) -> ToolOutput {
    let started = server
        .call(
            "python_exec",
            json!({"session": session, "code": "time.sleep(60)", "wait_s": 0.5}),
        )
        .await;
    assert_status(&started, "running");
    server
        .call(
            "python_wait",
            json!({"session": session, "interrupt": true, "wait_s": 30}),
        )
        .await
}

#[tokio::test]
async fn a_kernel_interrupted_by_message_gets_an_interrupt_request_not_a_signal() {
    let data = tempfile::tempdir().expect("jupyter dir");
    own_group_kernel(data.path(), "by-message", Some("message"));
    own_group_kernel(data.path(), "by-signal", None);
    let launch = Launch::new(&[
        "--kernels",
        "by-message,by-signal",
        "--interrupt-grace",
        "1",
    ])
    .env("JUPYTER_PATH", data.path());
    let server = kernels::with_kernel_session(launch, "m", "by-message").await;

    exec(&server, "m", "import time; x = 1").await.assert_ok();
    let stopped = interrupt_a_sleep(&server, "m").await;
    assert_status(&stopped, "interrupted");
    assert!(
        !stopped.text.contains("second one was sent") && !stopped.text.contains("killed"),
        "the first interrupt must have stopped it: {stopped:#?}"
    );
    let out = exec(&server, "m", "x").await;
    assert_eq!(
        out.value(),
        Some("1"),
        "the kernel kept its state: {out:#?}"
    );

    // The same kernel interrupted by signal: SIGINT to the session's group
    // misses it, so ferrepl escalates to a kill. The message above was what
    // reached it.
    let out = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "s", "kernel": "by-signal"}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    exec(&server, "s", "import time; x = 1").await.assert_ok();
    let stopped = interrupt_a_sleep(&server, "s").await;
    assert!(
        stopped.text.contains("its interpreter was killed"),
        "SIGINT must not reach a kernel in its own group: {stopped:#?}"
    );
}

#[tokio::test]
async fn a_kernel_that_never_answers_its_interrupt_request_is_killed_as_a_stuck_cell_is() {
    let data = tempfile::tempdir().expect("jupyter dir");
    kernelspec(data.path(), "deaf", OWN_GROUP_DEAF, Some("message"));
    let launch = Launch::new(&["--kernels", "deaf", "--interrupt-grace", "1"])
        .env("JUPYTER_PATH", data.path());
    let server = kernels::with_kernel_session(launch, "d", "deaf").await;
    exec(&server, "d", "import time").await.assert_ok();
    let stopped = interrupt_a_sleep(&server, "d").await;
    assert!(
        stopped.text.contains(
            "The kernel did not answer the interrupt request (interrupt_request) within 1 s."
        ) && stopped.text.contains("its interpreter was killed"),
        "{stopped:#?}"
    );
    // A fresh kernel takes the next cell.
    exec(&server, "d", "1 + 1").await.assert_ok();
}

/// The `nb` venv's python3 kernel, and a session `k` on it.
async fn python_kernel_server() -> StdioServer {
    let launch = Launch::new(&["--kernels", "python3"])
        .env("JUPYTER_PATH", kernels::jupyter_path("nb", "python3"));
    kernels::with_kernel_session(launch, "k", "python3").await
}

#[tokio::test]
async fn python_inspect_on_a_kernel_is_its_inspect_request() {
    let server = python_kernel_server().await;
    exec(
        &server,
        "k",
        "def scale(value, factor=2):\n    \"\"\"Multiplies value by factor.\"\"\"\n    return value * factor",
    )
    .await
    .assert_ok();
    let out = server
        .call("python_inspect", json!({"session": "k", "name": "scale"}))
        .await;
    assert!(!out.is_error, "{out:#?}");
    let text = out.structured["detail"]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("scale(value, factor=2)") && text.contains("Multiplies value by factor."),
        "{out:#?}"
    );
    assert!(!text.contains('\u{1b}'), "ANSI colours left in: {out:#?}");
    assert_eq!(out.structured["detail"]["name"], "scale", "{out:#?}");
    assert!(out.text.contains("Multiplies value by factor."), "{out:#?}");

    let out = server
        .call(
            "python_inspect",
            json!({"session": "k", "name": "no_such_thing"}),
        )
        .await;
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text
            .contains("'no_such_thing' was not found by the kernel"),
        "{out:#?}"
    );

    // Without a name: a kernel lists no variables, and says what does.
    let out = server.call("python_inspect", json!({"session": "k"})).await;
    assert!(out.is_error, "{out:#?}");
    assert!(out.text.contains("%whos"), "{out:#?}");

    // While a cell runs the kernel reads no shell requests: inspection and
    // completion are refused, not left to time out.
    let started = server
        .call(
            "python_exec",
            json!({"session": "k", "code": "import time; time.sleep(30)", "wait_s": 0.5}),
        )
        .await;
    assert_status(&started, "running");
    let out = server
        .call("python_inspect", json!({"session": "k", "name": "scale"}))
        .await;
    assert!(out.is_error && out.text.contains("busy"), "{out:#?}");
    let out = server
        .call("python_complete", json!({"session": "k", "code": "sca"}))
        .await;
    assert!(out.is_error && out.text.contains("busy"), "{out:#?}");
}

/// The `kernels` venv's Jupyter data directory (kernels/ir, bash, python3).
fn kernels_venv() -> PathBuf {
    kernels::jupyter_path("kernels", "ir")
}

#[tokio::test]
async fn r_inspect_on_an_r_kernel_is_its_inspect_request() {
    let launch = Launch::new(&["--kernels", "ir", "--languages", "python,r"])
        .env("JUPYTER_PATH", kernels_venv());
    let server = kernels::with_kernel_session(launch, "k", "ir").await;
    // IRkernel shows a value's class and print; a function, its help page.
    kernels::kernel_cell(&server, "r_exec", "k", "halves <- c(0.25, 1.75)")
        .await
        .assert_ok();
    let out = server
        .call("r_inspect", json!({"session": "k", "name": "halves"}))
        .await;
    assert!(!out.is_error, "{out:#?}");
    let text = out.structured["detail"]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("numeric") && text.contains("0.25") && text.contains("1.75"),
        "{out:#?}"
    );

    // IRkernel says it found every name: an unknown one's answer is R's
    // help saying there is none, passed on as the kernel's words.
    let out = server
        .call(
            "r_inspect",
            json!({"session": "k", "name": "no_such_thing"}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    let text = out.structured["detail"]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("No documentation for") && !text.ends_with('\n'),
        "{out:#?}"
    );
}

#[tokio::test]
async fn an_interrupt_mode_jupyter_does_not_know_is_refused_at_start() {
    let data = tempfile::tempdir().expect("jupyter dir");
    own_group_kernel(data.path(), "odd", Some("--help; rm -rf /"));
    let workspace = tempfile::tempdir().expect("workspace");
    let mut cmd = server_command_plain();
    cmd.arg("--workdir")
        .arg(workspace.path())
        .args(["--kernels", "odd"])
        .env("JUPYTER_PATH", data.path())
        .stdin(std::process::Stdio::piped());
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), cmd.output())
        .await
        .expect("the refused server exits")
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("interrupt_mode") && stderr.contains("\"signal\" and \"message\" only"),
        "{stderr}"
    );
}
