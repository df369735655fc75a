//! Attacks on "wheels only" (run as root and unprivileged): specs that make
//! an installer run a build backend from the workspace — a project
//! directory named every way pip accepts it, a directory named like a
//! wheel — are refused before any job starts, unless the operator passed
//! --allow-source-builds (then the backend does run: the test would see
//! it).

use std::path::Path;

use serde_json::json;

use crate::support::{StdioServer, path_str, system_python};

/// An in-tree build backend that leaves `marker` in the workspace when
/// the installer imports it.
fn plant_project(dir: &Path, marker: &str) {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(
        dir.join("pyproject.toml"),
        "[build-system]\nrequires = []\nbuild-backend = \"backend\"\nbackend-path = [\".\"]\n\n[project]\nname = \"proj\"\nversion = \"1.0\"\n",
    )
    .expect("pyproject");
    std::fs::write(
        dir.join("backend.py"),
        format!(
            "import os\nopen(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', {marker:?}), 'w').write('ran')\n\
def get_requires_for_build_wheel(config_settings=None):\n    return []\n\
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n    raise SystemExit('no')\n"
        ),
    )
    .expect("backend");
}

async fn start(extra: &[&str]) -> StdioServer {
    let python = system_python();
    let mut args = vec!["--python", path_str(&python), "--venv", ".venv"];
    args.extend_from_slice(extra);
    StdioServer::start(&args).await
}

#[tokio::test]
async fn project_directories_in_every_spelling_are_refused_without_source_builds() {
    let server = start(&[]).await;
    let ws = server.workdir.path();
    plant_project(&ws.join("proj1"), "RAN-proj1");
    plant_project(&ws.join("dir.whl"), "RAN-dirwhl");
    let abs = ws.join("proj1");
    let specs = [
        "file:proj1".to_string(),
        "./proj1".to_string(),
        "proj1".to_string(),
        format!("file://{}", abs.display()),
        format!("proj @ file://{}", abs.display()),
        "./dir.whl".to_string(),
        "dir.whl".to_string(),
        "git+https://example.invalid/a/b".to_string(),
    ];
    for spec in &specs {
        let out = server
            .call(
                "python_install",
                json!({ "packages": [spec], "wait_s": 30 }),
            )
            .await;
        assert!(out.is_error, "{spec}: must be refused: {out:#?}");
        assert!(
            out.text.contains("--allow-source-builds"),
            "{spec}: the refusal says how to allow it: {out:#?}"
        );
        assert!(
            !out.structured.is_object(),
            "{spec}: refused before a job started: {out:#?}"
        );
    }
    assert!(!ws.join("RAN-proj1").exists() && !ws.join("RAN-dirwhl").exists());
}

#[tokio::test]
async fn with_source_builds_allowed_the_backend_does_run() {
    let server = start(&["--allow-source-builds"]).await;
    let ws = server.workdir.path();
    plant_project(&ws.join("proj1"), "RAN-proj1");
    let out = server
        .call(
            "python_install",
            json!({ "packages": ["./proj1"], "wait_s": 50 }),
        )
        .await;
    assert!(out.structured.is_object(), "a job ran: {out:#?}");
    let mut ran = ws.join("RAN-proj1").exists();
    for _ in 0..100 {
        if ran {
            break;
        }
        let job = out.str_field("job").to_string();
        let _ = server
            .call("shell_wait", json!({ "job": job, "wait_s": 5 }))
            .await;
        ran = ws.join("RAN-proj1").exists();
    }
    assert!(
        ran,
        "the in-tree backend ran (the refusal above is what stops it): {out:#?}"
    );
}
