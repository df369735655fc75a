//! Installs work on first use with a plain interpreter: when the session's
//! interpreter is not a venv and the operator named none, sessions run a
//! venv ferrepl keeps for the workspace in its state directory, outside the
//! workspace; it is made inside the sandbox, sees the interpreter's own
//! packages, is shared by shell jobs, survives a restart, and gives way to
//! a workspace `.venv`.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::{Launch, StdioServer, ToolOutput, path_str, real_python3};

struct Place {
    workspace: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Place {
    fn new() -> Self {
        Place {
            workspace: tempfile::tempdir().expect("workspace"),
            state: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir"),
        }
    }

    async fn server(&self, extra: &[&str]) -> StdioServer {
        let python = real_python3();
        let mut args = vec![
            "--workdir",
            path_str(self.workspace.path()),
            "--state-dir",
            path_str(self.state.path()),
            "--python",
            path_str(&python),
        ];
        args.extend_from_slice(extra);
        let launch = Launch::new(&args).without_workdir_flag();
        StdioServer::launch(launch).await
    }

    fn workspace(&self) -> PathBuf {
        self.workspace
            .path()
            .canonicalize()
            .expect("canonical workspace")
    }
}

fn value(out: &ToolOutput) -> String {
    out.value()
        .unwrap_or_else(|| panic!("no value in {out:#?}"))
        .trim_matches(['\'', '"'])
        .to_string()
}

const PREFIXES: &str = "import sys\n(sys.prefix, sys.base_prefix)";

#[tokio::test]
async fn a_plain_interpreter_installs_on_first_use_into_a_venv_kept_outside_the_workspace() {
    let place = Place::new();
    let server = place.server(&[]).await;
    // The first call installs: the venv is made for it if no interpreter
    // started yet.
    let file = wheel(&place.workspace(), "kept_pkg");
    let out = server
        .call(
            "python_install",
            json!({ "packages": [file], "wait_s": 120 }),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert_eq!(out.structured["exit_code"], 0, "{out:#?}");
    // A short result: what was installed; the log is one call away.
    assert!(out.text.contains("Installed kept-pkg 1.0 in "), "{out:#?}");
    assert!(!out.text.contains("Processing"), "{out:#?}");
    let job = out.str_field("job").to_string();
    let log = server.call("python_output", json!({ "job": job })).await;
    assert!(
        !log.is_error && log.text.contains("Successfully installed kept-pkg-1.0"),
        "{log:#?}"
    );

    let out = server.exec("import sys\nsys.prefix").await;
    out.assert_ok();
    let prefix = PathBuf::from(value(&out));
    let state = place.state.path().canonicalize().expect("state dir");
    assert!(
        prefix.starts_with(state.join("venvs")),
        "the session runs the kept venv, not {prefix:?}"
    );
    assert!(!prefix.starts_with(place.workspace()), "{prefix:?}");
    assert!(prefix.join("pyvenv.cfg").is_file(), "{prefix:?}");
    // The interpreter's own packages stay importable (pip is one).
    server.exec("import pip").await.assert_ok();

    let out = server.exec("import kept_pkg\nkept_pkg.VALUE").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("7"));
    // Shell jobs run the same venv.
    let out = server
        .call(
            "shell_exec",
            json!({ "command": "python -c 'import kept_pkg, sys; print(kept_pkg.VALUE, sys.prefix)'", "wait_s": 60 }),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert!(
        out.text.contains(&format!("7 {}", prefix.display())),
        "{out:#?}"
    );
    server.close_and_wait().await;

    // After a restart the stored session comes back on the same venv, with
    // what was installed.
    let server = place.server(&[]).await;
    let out = server
        .exec("import kept_pkg, sys\n(kept_pkg.VALUE, sys.prefix)")
        .await;
    out.assert_ok();
    let shown = out.value().expect("a value").to_string();
    assert!(
        shown.contains('7') && shown.contains(path_str(&prefix)),
        "{out:#?}"
    );
}

#[tokio::test]
async fn a_workspace_venv_wins_and_without_a_state_dir_an_install_fails_as_an_error() {
    let place = Place::new();
    let venv = place.workspace().join(".venv");
    let status = std::process::Command::new(real_python3())
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .expect("make a venv");
    assert!(status.success());
    // A workspace .venv is found only without --python naming another.
    let workspace = place.workspace();
    let args = [
        "--workdir",
        path_str(&workspace),
        "--state-dir",
        path_str(place.state.path()),
    ];
    let server = StdioServer::launch(Launch::new(&args).without_workdir_flag()).await;
    let out = server.exec(PREFIXES).await;
    out.assert_ok();
    assert!(
        value(&out).starts_with(&format!("('{}'", venv.display())),
        "{out:#?}"
    );
    assert!(
        !place.state.path().join("venvs").exists(),
        "no venv is kept when the workspace has one"
    );
    server.close_and_wait().await;

    // Sessions not kept (--resume off): no venv either; an install into the
    // plain interpreter is refused, as an error that says what to do.
    let other = Place::new();
    let server = other.server(&["--resume", "off"]).await;
    let file = wheel(&other.workspace(), "lost_pkg");
    let out = server
        .call(
            "python_install",
            json!({ "packages": [file], "wait_s": 120 }),
        )
        .await;
    assert!(out.is_error, "{out:#?}");
    assert!(out.text.contains("--venv"), "{out:#?}");
}

/// A wheel of package `name` (VALUE = 7) in `dir`; its file name.
fn wheel(dir: &Path, name: &str) -> String {
    let built = crate::support::pure_wheel(dir, name, "1.0", 7);
    built
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .expect("a file name")
}
