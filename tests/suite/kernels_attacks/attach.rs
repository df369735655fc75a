//! The operator's `ferrepl attach`, run where operators run it: in the
//! project directory, which is the workspace the agent writes. Nothing the
//! session wrote there may run on the host by itself: not a Jupyter or
//! IPython config file in the current directory, nor a `jupyter` program
//! in a workspace directory on the operator's PATH.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::exec;
use crate::support::{
    Launch, StdioServer, kernels, py_path, server_binary, upstreams::test_env_dir,
};

/// The `kernels` venv (jupyter_client and jupyter-console).
fn kernels_venv() -> PathBuf {
    let dir = test_env_dir().join("kernels");
    assert!(
        dir.join("bin/jupyter-console").is_file(),
        "{} has no jupyter-console: run `bash scripts/test-env.sh`",
        dir.display()
    );
    dir
}

/// A server with its own runtime directory, a kernel session `k`.
async fn server_in(runtime: &Path) -> StdioServer {
    let launch = Launch::new(&["--kernels", "python3"])
        .env("JUPYTER_PATH", kernels_venv().join("share/jupyter"))
        .env("XDG_RUNTIME_DIR", runtime);
    kernels::with_kernel_session(launch, "k", "python3").await
}

/// A directory anyone may write (the files planted in the workspace run,
/// if they run, as the operator), for the markers of what ran.
fn marker_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("markers");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

/// The names of the markers in `dir`.
fn ran(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `ferrepl attach ARGS` as the operator runs it: in `cwd`, with `home`
/// and `path`, its input closed; killed after 60 s. Its output.
async fn attach(runtime: &Path, cwd: &Path, home: &Path, path: &str, args: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new(server_binary());
    cmd.arg("attach")
        .args(args)
        .current_dir(cwd)
        .env("XDG_RUNTIME_DIR", runtime)
        .env("HOME", home)
        .env("PATH", path)
        .env_remove("JUPYTER_CONFIG_DIR")
        .env_remove("IPYTHONDIR")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    match tokio::time::timeout(Duration::from_secs(60), cmd.output()).await {
        Ok(Ok(out)) => format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Ok(Err(e)) => panic!("run ferrepl attach: {e}"),
        Err(_) => "timed out".into(),
    }
}

#[tokio::test]
async fn attach_from_the_workspace_runs_no_config_the_session_wrote() {
    let runtime = tempfile::tempdir().expect("runtime");
    let server = server_in(runtime.path()).await;
    let markers = marker_dir();
    let ws = server.workdir.path().to_path_buf();
    // Every config file a Jupyter or IPython program could look for in
    // the current directory, written by the agent's cell.
    let planted = [
        "jupyter_console_config.py",
        "jupyter_config.py",
        "ipython_config.py",
        "jupyter_client_config.py",
        ".jupyter/jupyter_console_config.py",
        ".jupyter/jupyter_config.py",
        ".ipython/profile_default/ipython_config.py",
        ".ipython/profile_default/startup/00-owned.py",
        "profile_default/ipython_config.py",
    ];
    let code = format!(
        "import os\nfor name in {names}:\n    path = os.path.join({ws}, name)\n    os.makedirs(os.path.dirname(path), exist_ok=True)\n    \
         open(path, 'w').write('open(%r, \"w\").write(\"ran\")\\n' % os.path.join({markers}, name.replace('/', '_')))\n\
         open(os.path.join({ws}, 'jupyter_console_config.json'), 'w').write('{{\"ZMQTerminalInteractiveShell\": {{\"banner\": \"planted json config\"}}}}')\n'planted'",
        names = serde_json::to_string(&planted).expect("json"),
        ws = py_path(&ws),
        markers = py_path(markers.path()),
    );
    exec(&server, "k", &code).await.assert_ok();

    // The operator's own config in their home is read: the console got
    // as far as its configuration.
    let home = tempfile::tempdir().expect("home");
    let own = home.path().join(".jupyter");
    std::fs::create_dir_all(&own).expect("mkdir");
    let legit = markers.path().join("operator's own config");
    std::fs::write(
        own.join("jupyter_console_config.py"),
        format!("open({}, 'w').write('ran')\n", py_path(&legit)),
    )
    .expect("write");
    let jupyter = kernels_venv().join("bin/jupyter");
    let jupyter = jupyter.to_str().expect("utf-8");
    let out = attach(
        runtime.path(),
        &ws,
        home.path(),
        "/usr/bin:/bin",
        &["k", "--jupyter", jupyter],
    )
    .await;
    let ran = ran(markers.path());
    assert!(
        ran.iter().any(|m| m == "operator's own config"),
        "the console never read its configuration ({ran:?}): {out}"
    );
    let planted_ran: Vec<&String> = ran
        .iter()
        .filter(|m| *m != "operator's own config")
        .collect();
    assert!(
        planted_ran.is_empty(),
        "ferrepl attach, run in the workspace, ran config the session wrote: {planted_ran:?}\n{out}"
    );
    assert!(!out.contains("planted json config"), "{out}");
}

#[tokio::test]
async fn attach_never_runs_a_jupyter_the_session_wrote() {
    let runtime = tempfile::tempdir().expect("runtime");
    let server = server_in(runtime.path()).await;
    let markers = marker_dir();
    let ws = server.workdir.path().to_path_buf();
    // A project's tool directory on the operator's PATH (node_modules/.bin,
    // bin/), and an empty PATH entry (the current directory): the agent
    // puts a `jupyter` in each.
    let code = format!(
        "import os\nfor d in ['node_modules/.bin', '.']:\n    path = os.path.join({ws}, d, 'jupyter')\n    os.makedirs(os.path.dirname(path), exist_ok=True)\n    \
         open(path, 'w').write('#!/bin/sh\\necho ran > %s/%s\\n' % ({markers}, d.replace('/', '_')))\n    os.chmod(path, 0o755)\n'planted'",
        ws = py_path(&ws),
        markers = py_path(markers.path()),
    );
    exec(&server, "k", &code).await.assert_ok();
    let home = tempfile::tempdir().expect("home");
    let venv_bin = kernels_venv().join("bin");
    let tools = format!(
        "{}/node_modules/.bin:{}:/usr/bin:/bin",
        ws.display(),
        venv_bin.display()
    );
    let out = attach(runtime.path(), &ws, home.path(), &tools, &["k"]).await;
    assert!(
        ran(markers.path()).is_empty(),
        "with a workspace directory on PATH, ferrepl attach ran the session's `jupyter`: {:?}\n{out}",
        ran(markers.path())
    );
    let empty_entry = format!("/usr/bin:/bin::{}", venv_bin.display());
    let out = attach(runtime.path(), &ws, home.path(), &empty_entry, &["k"]).await;
    assert!(
        ran(markers.path()).is_empty(),
        "with an empty PATH entry, ferrepl attach ran the `jupyter` the session wrote in the workspace: {:?}\n{out}",
        ran(markers.path())
    );
}
