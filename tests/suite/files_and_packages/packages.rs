//! python_install into virtual environments, with a wheel built locally (no
//! network): its refusals, --venv, and sessions created with a venv.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{
    StdioServer, ToolOutput, assert_success, assert_tool_error, path_str, real_python3,
};
use serde_json::json;

/// Run a command to completion, panicking with its output if it fails.
fn run(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The session's interpreter pid.
async fn session_pid(server: &StdioServer, session: &str) -> u32 {
    let out = server
        .exec_in(session, "import os\nos.getpid()")
        .await
        .assert_ok()
        .clone();
    out.value()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("expected a pid, got {out:#?}"))
}

/// python_install `wheel` into `session` and return the finished job result,
/// and whether the python_install call itself saw the job finish. When the
/// call comes back while the job still runs, the job is collected with
/// shell_wait (bounded).
async fn install(server: &StdioServer, session: &str, wheel: &Path) -> (ToolOutput, bool) {
    let out = server
        .call(
            "python_install",
            json!({ "packages": [path_str(wheel)], "session": session, "wait_s": 300 }),
        )
        .await;
    assert!(
        !out.is_error || out.structured.is_object(),
        "python_install was refused: {out:#?}"
    );
    let job = out.str_field("job").to_string();
    assert!(
        out.str_field("command").contains(path_str(wheel)),
        "the job command should name the wheel: {out:#?}"
    );
    let finished_in_call = out.structured["status"] != "running";
    let mut out = out;
    let mut rounds = 0;
    while out.structured["status"] == "running" {
        rounds += 1;
        assert!(rounds <= 10, "the install job never finished: {out:#?}");
        out = server
            .call("shell_wait", json!({ "job": job, "wait_s": 60 }))
            .await;
    }
    assert_eq!(
        out.structured["status"], "exited",
        "the install job did not exit normally: {out:#?}"
    );
    assert_eq!(
        out.structured["exit_code"], 0,
        "the install failed: {out:#?}"
    );
    assert!(
        !out.is_error,
        "a successful install is not an error: {out:#?}"
    );
    (out, finished_in_call)
}

/// `import <module>; <module>.VALUE` in `session`. When the install finished
/// via shell_wait rather than within python_install, the session's import
/// refresh happens in the background, so the import is retried a few times
/// (bounded). Returns the last result.
async fn import_value(
    server: &StdioServer,
    session: &str,
    module: &str,
    finished_in_call: bool,
) -> ToolOutput {
    let code = format!("import {module}\n{module}.VALUE");
    let mut last = server.exec_in(session, &code).await;
    let retries = if finished_in_call { 0 } else { 40 };
    for _ in 0..retries {
        if !last.is_error {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = server.exec_in(session, &code).await;
    }
    last
}

/// Create a virtual environment at `dir` with the real python3.
fn make_venv(dir: &Path) {
    run(Command::new(real_python3()).args(["-m", "venv"]).arg(dir));
    assert!(dir.join("bin/python").exists(), "no bin/python in the venv");
}

#[tokio::test]
async fn install_refuses_a_non_venv_interpreter_and_bad_arguments() {
    let python = real_python3();
    let python = path_str(&python);
    // Sessions not kept: no venv is kept for the workspace either (see
    // kept_venv.rs), so the plain interpreter is what the install meets.
    let server = StdioServer::start(&["--python", python, "--resume", "off"]).await;
    let wheel = build_wheel(server.workdir.path(), "ferrepl_refused_pkg", "1.0", 1);

    // The check runs inside the sandbox (the interpreter may be any file the
    // agent wrote), as the first step of the install job.
    let refused = server
        .call("python_install", json!({ "packages": [path_str(&wheel)] }))
        .await;
    assert!(
        refused.is_error,
        "install with a non-venv interpreter: {refused:#?}"
    );
    assert_eq!(refused.structured["exit_code"], 1, "{refused:#?}");
    assert!(
        refused.text.contains("virtual environment"),
        "the refusal says why: {refused:#?}"
    );
    assert!(
        refused.text.contains("python3 -m venv env") && refused.text.contains("--resume off"),
        "the refusal names the ways out: {refused:#?}"
    );

    for bad in ["-e", "--index-url=http://example.invalid/simple", "-r"] {
        let out = server
            .call("python_install", json!({ "packages": ["tqdm", bad] }))
            .await;
        assert_tool_error(&out, &format!("installer option {bad}"));
    }
    assert_tool_error(
        &server
            .call("python_install", json!({ "packages": [] }))
            .await,
        "empty package list",
    );

    // Nothing was installed: the session still cannot import it.
    server
        .exec("import ferrepl_refused_pkg")
        .await
        .assert_raised("ModuleNotFoundError");
}

#[tokio::test]
async fn venv_flag_creates_the_venv_and_install_imports_without_restart() {
    let venv_parent = tempfile::tempdir().expect("venv tempdir");
    let venv = venv_parent
        .path()
        .canonicalize()
        .expect("canonical venv parent")
        .join("env");
    assert!(!venv.exists());
    let python = real_python3();
    let python = path_str(&python);
    let server = StdioServer::start(&["--python", python, "--venv", path_str(&venv)]).await;
    assert!(
        venv.join("bin/python").exists() && venv.join("pyvenv.cfg").is_file(),
        "--venv creates the environment at startup"
    );

    // Sessions run the venv ferrepl keeps over it (the user's venv is
    // read-only to them: kept_venv.rs), outside the workspace.
    let prefix = server.exec("import sys\nsys.prefix").await;
    prefix.assert_ok();
    let shown = prefix.value().expect("sys.prefix value");
    let shown = Path::new(shown.trim_matches(['\'', '"']));
    assert!(
        shown != venv && !shown.starts_with(server.workdir.path()),
        "the session runs the kept venv: {prefix:#?}"
    );

    let wheel = build_wheel(server.workdir.path(), "ferrepl_probe_pkg", "0.1", 4242);
    server
        .exec("import ferrepl_probe_pkg")
        .await
        .assert_raised("ModuleNotFoundError");
    let pid_before = session_pid(&server, "default").await;

    let (_, finished_in_call) = install(&server, "default", &wheel).await;

    let value = import_value(&server, "default", "ferrepl_probe_pkg", finished_in_call).await;
    value.assert_ok();
    assert_eq!(value.value(), Some("4242"), "{value:#?}");
    let pid_after = session_pid(&server, "default").await;
    assert_eq!(
        pid_before, pid_after,
        "the install must not restart the session"
    );
    let in_site = |prefix: &Path| {
        std::fs::read_dir(prefix.join("lib"))
            .expect("venv lib")
            .filter_map(Result::ok)
            .any(|py| {
                py.path()
                    .join("site-packages/ferrepl_probe_pkg/__init__.py")
                    .is_file()
            })
    };
    assert!(in_site(shown), "the package went into the kept venv");
    assert!(!in_site(&venv), "nothing went into --venv");
}

#[tokio::test]
async fn install_into_a_session_created_with_a_venv() {
    let python = real_python3();
    let python = path_str(&python);
    let server = StdioServer::start(&["--python", python]).await;
    // A venv the agent makes inside the workspace may be named freely.
    let venv = server
        .workdir
        .path()
        .canonicalize()
        .expect("canonical workspace")
        .join("v-env");
    make_venv(&venv);

    let created = server
        .call(
            "python_sessions",
            json!({ "action": "create", "session": "v", "venv": path_str(&venv) }),
        )
        .await;
    assert_success(&created, "python_sessions create with venv");

    let prefix = server.exec_in("v", "import sys\nsys.prefix").await;
    prefix.assert_ok();
    let shown = prefix.value().expect("sys.prefix value");
    assert_eq!(
        Path::new(shown.trim_matches(['\'', '"']))
            .canonicalize()
            .expect("canonical sys.prefix"),
        venv,
        "session v runs the venv: {prefix:#?}"
    );

    let wheel = build_wheel(server.workdir.path(), "ferrepl_session_pkg", "2.0", 777);
    server
        .exec_in("v", "import ferrepl_session_pkg")
        .await
        .assert_raised("ModuleNotFoundError");
    let pid_before = session_pid(&server, "v").await;

    let (_, finished_in_call) = install(&server, "v", &wheel).await;

    let value = import_value(&server, "v", "ferrepl_session_pkg", finished_in_call).await;
    value.assert_ok();
    assert_eq!(value.value(), Some("777"), "{value:#?}");
    assert_eq!(
        session_pid(&server, "v").await,
        pid_before,
        "the install must not restart session v"
    );

    // The default session did not get it: it runs the venv ferrepl keeps
    // for the workspace (--python is not a venv), apart from session v's.
    server
        .exec("import ferrepl_session_pkg")
        .await
        .assert_raised("ModuleNotFoundError");
}

/// Build `<dir>/<name>-<version>-py3-none-any.whl` whose package has
/// `VALUE = <value>`; returns its path.
fn build_wheel(dir: &Path, name: &str, version: &str, value: i64) -> PathBuf {
    crate::support::pure_wheel(dir, name, version, value)
}
