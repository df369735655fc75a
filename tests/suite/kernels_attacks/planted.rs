//! Kernelspecs the agent plants: the server reads kernelspecs once, at
//! start, so one written later into a Jupyter data directory it searches
//! (a JUPYTER_PATH entry or the user's data directory inside the
//! workspace) is never run: not by a reset, a new session, a SIGHUP or
//! another kernel name; a restart finds it and refuses to start.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::{exec, jupyter_path};
use crate::support::{Launch, StdioServer, kernels, py_path, server_command_plain};

/// Session code that plants kernelspec `name` in the data directory
/// `data`; it writes `marker` (in the workspace) when it runs.
fn plant(data: &Path, name: &str, marker: &Path) -> String {
    let python = crate::support::upstreams::test_env_dir().join("nb/bin/python");
    let run = format!("open({}, 'w').write('ran')", py_path(marker));
    let spec = json!({
        "argv": [python, "-c", run, "{connection_file}"],
        "language": "python",
    });
    format!(
        "import os, json\nd = os.path.join({data}, 'kernels', {name})\nos.makedirs(d, exist_ok=True)\n\
         open(os.path.join(d, 'kernel.json'), 'w').write(json.dumps({spec}))\n'planted'",
        data = py_path(data),
        name = serde_json::to_string(name).expect("a name"),
        spec = serde_json::to_string(&spec.to_string()).expect("json"),
    )
}

#[tokio::test]
async fn kernelspecs_planted_after_start_are_never_run() {
    let ws = tempfile::tempdir().expect("workspace");
    let ws = ws.path().canonicalize().expect("canonical");
    // A workspace directory searched before the operator's kernel, empty
    // at start, and the workspace as the user's home (its
    // .local/share/jupyter): the operator's python3 is found outside.
    let planted_dir = ws.join("jp");
    let paths = std::env::join_paths([planted_dir.clone(), jupyter_path()]).expect("join");
    let ws_flag = ws.display().to_string();
    let launch = Launch::new(&["--workdir", &ws_flag, "--kernels", "python3"])
        .without_workdir_flag()
        .env("JUPYTER_PATH", &paths)
        .env("HOME", &ws);
    let server = kernels::with_kernel_session(launch, "k", "python3").await;
    let marker = ws.join("planted-kernel-ran");
    for data in [planted_dir.clone(), ws.join(".local/share/jupyter")] {
        for name in ["python3", "evil"] {
            exec(&server, "k", &plant(&data, name, &marker))
                .await
                .assert_ok();
        }
    }
    let reset = server
        .call(
            "python_sessions",
            json!({"action": "reset", "session": "k"}),
        )
        .await;
    assert!(!reset.is_error, "{reset:#?}");
    let evil = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "e", "kernel": "evil"}),
        )
        .await;
    assert!(evil.is_error, "{evil:#?}");
    // SIGHUP re-reads the server's settings: never the kernelspecs.
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as i32, libc::SIGHUP) };
    let fresh = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "k3", "kernel": "python3"}),
        )
        .await;
    assert!(!fresh.is_error, "{fresh:#?}");
    let out = exec(&server, "k3", "import sys; sys.executable").await;
    assert!(
        out.value().is_some_and(|v| v.contains("nb/bin/python")),
        "{out:#?}"
    );
    assert!(!marker.exists(), "a kernelspec the session planted ran");
    drop(server);

    // Started again on the same workspace, the server finds the planted
    // python3 first and refuses it.
    let mut cmd = server_command_plain();
    cmd.arg("--workdir")
        .arg(&ws)
        .args(["--kernels", "python3"])
        .env("JUPYTER_PATH", &paths)
        .env("HOME", &ws)
        .stdin(std::process::Stdio::piped());
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the restarted server exits")
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("which sessions can write"),
        "{stderr}"
    );
    assert!(!marker.exists(), "a kernelspec the session planted ran");
}

#[tokio::test]
async fn kernel_names_that_look_like_the_offered_one_are_refused() {
    let launch = Launch::new(&["--kernels", "python3"]).env("JUPYTER_PATH", jupyter_path());
    let server = StdioServer::launch(launch).await;
    // Accepting one of these would mean the name is resolved as a path
    // or matched loosely, not compared with the offered names.
    for name in [
        "pyth\u{43e}n3",
        "./python3",
        "python3/../python3",
        "%2e%2e/python3",
        "kernels/python3",
    ] {
        let out = server
            .call(
                "python_sessions",
                json!({"action": "create", "session": "bad", "kernel": name}),
            )
            .await;
        assert!(out.is_error, "{name:?}: {out:#?}");
    }
}
