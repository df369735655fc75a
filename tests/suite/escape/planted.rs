//! What the server runs and where it keeps its state never come from the
//! workspace, where a session could have planted them: a launcher beside a
//! copy of the binary, an interpreter on the operator's PATH inside the
//! workspace, ferrepl's own state directory inside the workspace.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::support::{Launch, StdioServer, path_str, server_binary, server_command, system_python};

/// A server started from `binary` (the one built, or a copy of it) with
/// `--workdir workdir` and extra arguments and environment, with the full
/// tool surface.
pub(super) async fn start(
    binary: &Path,
    workdir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> StdioServer {
    let mut all = vec!["--workdir", path_str(workdir)];
    all.extend_from_slice(args);
    StdioServer::launch(
        Launch::new(&all)
            .binary(binary)
            .envs(env)
            .without_workdir_flag(),
    )
    .await
}

/// A directory outside every workspace that the test (not a session) can
/// write.
fn outside() -> tempfile::TempDir {
    super::args::outside_dir()
}

#[tokio::test]
async fn a_planted_launcher_is_never_run() {
    let ws = tempfile::tempdir().expect("workspace");
    let bin = ws.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    let copy = bin.join("ferrepl");
    std::fs::copy(server_binary(), &copy).expect("copy the binary");
    let marks = outside();
    let marker = marks.path().join("planted-ran");
    let server = start(&copy, ws.path(), &[], &[]).await;

    // The binary the server runs from is deleted and a program planted
    // under the name /proc/self/exe then shows.
    let plant = format!(
        "rm bin/ferrepl && printf '#!/bin/sh\\necho ran > {}\\nexit 1\\n' > 'bin/ferrepl (deleted)' && chmod +x 'bin/ferrepl (deleted)'",
        marker.display()
    );
    let planted = server
        .call("shell_exec", json!({ "command": plant, "wait_s": 20 }))
        .await;
    assert!(!planted.is_error, "planting failed: {planted:#?}");
    assert!(ws.path().join("bin/ferrepl (deleted)").is_file());

    let next = server
        .call(
            "shell_exec",
            json!({ "command": "echo still-sandboxed", "wait_s": 20 }),
        )
        .await;
    assert!(
        !next.is_error && next.text.contains("still-sandboxed"),
        "jobs still start through the real launcher: {next:#?}"
    );
    let session = server
        .call("python_exec", json!({ "code": "1+1", "session": "fresh" }))
        .await;
    assert!(!session.is_error, "{session:#?}");
    assert!(
        !marker.exists(),
        "the planted launcher ran outside the sandbox"
    );
    drop(server.child);
}

#[tokio::test]
async fn an_interpreter_on_path_inside_the_workspace_is_not_run_at_start() {
    let ws = tempfile::tempdir().expect("workspace");
    let marks = outside();
    let marker = marks.path().join("python-ran");
    let evil = ws.path().join("evil");
    std::fs::create_dir(&evil).expect("mkdir");
    let script = evil.join("python3");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho ran > {}\nexit 1\n", marker.display()),
    )
    .expect("write the fake python3");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path = format!(
        "{}:{}",
        evil.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let system = system_python();
    let server = start(
        server_binary(),
        ws.path(),
        &["--python", system.to_str().expect("utf-8")],
        &[("PATH", path.as_str())],
    )
    .await;
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "{status:#?}");
    assert!(
        !marker.exists(),
        "the server ran an interpreter from the workspace outside the sandbox"
    );
    drop(server.child);
}

#[tokio::test]
async fn the_state_directory_may_not_lie_in_the_workspace() {
    let ws = tempfile::tempdir().expect("workspace");
    let tmp = ws.path().join("t");
    std::fs::create_dir(&tmp).expect("mkdir");
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        server_command()
            .arg("--workdir")
            .arg(ws.path())
            .env("TMPDIR", &tmp)
            .env_remove("XDG_RUNTIME_DIR")
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("the server answers in time")
    .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must refuse to start: {stderr}");
    assert!(
        stderr.contains("contains") && stderr.contains("--workdir"),
        "the refusal says why and what to do: {stderr}"
    );
}
