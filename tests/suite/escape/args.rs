//! Tool arguments cannot widen the sandbox, and nothing the agent chooses
//! runs unconfined (issue 10, classes 1 and 2, and the inherited
//! environment):
//!
//! * `python_sessions create` `workdir` must resolve inside `--workdir`;
//! * `venv` / `python` may name only interpreters inside the workspace or
//!   ones the operator allowed (`--allow-python`);
//! * no read rule is derived from a `pyvenv.cfg` the agent can write, neither
//!   for a created session nor for a `.venv` planted for later server starts;
//! * loader variables (`LD_PRELOAD`...) are refused on sessions and jobs;
//! * the server's environment is not inherited (only an allow-list plus
//!   `--pass-env`);
//! * an agent-made "interpreter" script runs confined, also when
//!   `python_install` probes it.
//!
//! Some helpers at the top are shared with the other modules of the escape
//! suite (`degraded`, `review`); the probes themselves are in
//! `support::probes`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::support::{
    ATTEMPT, StdioServer, ToolOutput, assert_failed, everything, path_str, py_path, py_repr,
    session_names, sh_quote, system_python, unique,
};

// ------------------------------------------------------------------ helpers

/// Panics unless the call was refused with a message naming `needle`.
fn assert_refused_naming(out: &ToolOutput, needle: &str, what: &str) {
    assert!(
        out.is_error,
        "{what} must be refused (is_error), but it was accepted: {out:#?}"
    );
    assert!(
        out.text.contains(needle),
        "the refusal of {what} must name '{needle}': {:?}",
        out.text
    );
}

async fn assert_no_session(server: &StdioServer, name: &str, why: &str) {
    let names = session_names(server.peer()).await;
    assert!(
        !names.iter().any(|n| n == name),
        "session '{name}' exists although {why}; sessions: {names:?}"
    );
}

/// `python_sessions create` with `name` and the extra arguments in `opts`.
async fn create_session(server: &StdioServer, name: &str, opts: Value) -> ToolOutput {
    let mut args = json!({ "action": "create", "session": name });
    if let (Value::Object(into), Value::Object(from)) = (&mut args, opts) {
        into.extend(from);
    }
    server.call("python_sessions", args).await
}

/// `python3 -m venv --without-pip dir` with the system interpreter.
fn make_venv(dir: &Path) {
    let out = std::process::Command::new(system_python())
        .args(["-m", "venv", "--without-pip"])
        .arg(dir)
        .output()
        .expect("run python3 -m venv");
    assert!(
        out.status.success() && dir.join("bin").join("python").exists(),
        "python3 -m venv --without-pip {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Rewrites the `home = ...` line of a venv's pyvenv.cfg (the interpreter
/// symlinks stay as they are, so the venv still starts).
fn set_venv_home(venv: &Path, home: &Path) {
    let cfg = venv.join("pyvenv.cfg");
    let text = std::fs::read_to_string(&cfg).expect("read pyvenv.cfg");
    let mut replaced = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("home") {
                replaced = true;
                format!("home = {}", home.display())
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(replaced, "no home line in {}: {text:?}", cfg.display());
    std::fs::write(&cfg, lines.join("\n") + "\n").expect("write pyvenv.cfg");
}

/// A fake home directory holding `.aws/x/credentials` with `secret` in it.
/// Returns the home and the directory of the credentials.
pub(super) fn fake_home_with_aws(secret: &str) -> (tempfile::TempDir, PathBuf) {
    let home = tempfile::tempdir().expect("create a fake HOME");
    let dir = home.path().join(".aws").join("x");
    std::fs::create_dir_all(&dir).expect("mkdir .aws/x");
    std::fs::write(dir.join("credentials"), format!("{secret}\n")).expect("write the decoy");
    (home, dir)
}

/// A directory outside every workspace and outside the host's /tmp (which
/// may be hidden from sessions): writable by the test, not by a session.
pub(super) fn outside_dir() -> tempfile::TempDir {
    let base = Path::new("/var/tmp");
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix("ferrepl-escape-");
        b
    };
    if base.is_dir()
        && let Ok(dir) = builder.tempdir_in(base)
    {
        return dir;
    }
    builder
        .tempdir()
        .expect("create a directory outside the workspace")
}

/// A workspace of our own, with room around it: `root/ws` is the workspace,
/// `root/elsewhere` a sibling outside it.
fn workspace_with_sibling() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::tempdir().expect("create a temporary directory");
    let ws = root.path().join("ws");
    let elsewhere = root.path().join("elsewhere");
    std::fs::create_dir(&ws).expect("mkdir ws");
    std::fs::create_dir(&elsewhere).expect("mkdir elsewhere");
    (root, ws, elsewhere)
}

async fn start_in(ws: &Path, args: &[&str], envs: &[(&str, &str)]) -> StdioServer {
    let mut all = vec!["--workdir", path_str(ws)];
    all.extend_from_slice(args);
    StdioServer::start_without_workdir_flag(&all, envs).await
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

// ------------------------------------------------------------------ A: workdir

#[tokio::test]
async fn session_workdir_must_resolve_inside_the_workspace() {
    let (_root, ws, elsewhere) = workspace_with_sibling();
    std::fs::write(elsewhere.join("decoy.txt"), unique("DECOY-")).expect("write the decoy");
    std::os::unix::fs::symlink(&elsewhere, ws.join("link")).expect("symlink to outside");
    std::fs::create_dir(ws.join("sub")).expect("mkdir sub");

    let mut server = start_in(&ws, &[], &[]).await;
    let link_abs = ws.join("link");
    let bad = [
        "/",
        "/root",
        "../elsewhere",
        path_str(&elsewhere),
        "link",
        path_str(&link_abs),
    ];
    for (i, workdir) in bad.iter().enumerate() {
        let name = format!("wd{i}");
        let out = create_session(&server, &name, json!({ "workdir": workdir })).await;
        assert_refused_naming(&out, "workdir", &format!("workdir {workdir:?}"));
        assert_no_session(
            &server,
            &name,
            &format!("its workdir {workdir:?} was refused"),
        )
        .await;
    }
    assert_eq!(
        entries(&elsewhere),
        vec!["decoy.txt".to_string()],
        "something was written outside the workspace"
    );

    // A subdirectory of the workspace, relative or absolute, works.
    let sub = ws.join("sub").canonicalize().expect("canonical sub");
    for (name, workdir) in [
        ("rel", "sub".to_string()),
        ("abs", path_str(&sub).to_string()),
    ] {
        let out = create_session(&server, name, json!({ "workdir": workdir })).await;
        assert!(
            !out.is_error,
            "workdir {workdir:?} inside the workspace must work: {out:#?}"
        );
        let cwd = server.exec_in(name, "import os; os.getcwd()").await;
        cwd.assert_ok();
        assert_eq!(
            cwd.value(),
            Some(py_repr(&sub).as_str()),
            "the session's working directory: {cwd:#?}"
        );
    }

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ B: venv / python

#[tokio::test]
async fn an_interpreter_outside_the_workspace_needs_allow_python() {
    let outside = tempfile::tempdir().expect("create a directory outside the workspace");
    let venv = outside.path().join("venv");
    make_venv(&venv);
    let before = entries(&venv);
    let venv_python = venv.join("bin").join("python");

    let mut server = StdioServer::start(&[]).await;
    let attempts = [
        ("outvenv", json!({ "venv": path_str(&venv) })),
        ("outpython", json!({ "python": path_str(&venv_python) })),
    ];
    for (name, opts) in attempts {
        let shown = opts.to_string();
        let out = create_session(&server, name, opts).await;
        assert_refused_naming(&out, "--allow-python", &format!("create with {shown}"));
        assert_no_session(&server, name, &format!("{shown} was refused")).await;
    }
    assert_eq!(
        entries(&venv),
        before,
        "the venv outside the workspace changed"
    );

    // A venv inside the workspace needs no flag.
    let inside = server.workdir.path().join("envs").join("ok");
    make_venv(&inside);
    let out = create_session(&server, "inside", json!({ "venv": path_str(&inside) })).await;
    assert!(
        !out.is_error,
        "a venv inside the workspace must work: {out:#?}"
    );
    let prefix = server.exec_in("inside", "import sys; sys.prefix").await;
    prefix.assert_ok();
    assert!(
        prefix.value().is_some_and(|v| v.contains("/envs/ok")),
        "the session must run the workspace venv: {prefix:#?}"
    );
    server.assert_alive();
    server.close_and_wait().await;

    // The operator can allow it.
    let mut server = StdioServer::start(&["--allow-python", path_str(&venv)]).await;
    let out = create_session(&server, "allowed", json!({ "venv": path_str(&venv) })).await;
    assert!(
        !out.is_error,
        "with --allow-python {} the venv must be accepted: {out:#?}",
        venv.display()
    );
    let prefix = server.exec_in("allowed", "import sys; sys.prefix").await;
    prefix.assert_ok();
    let canon = venv.canonicalize().expect("canonical venv");
    assert!(
        [&venv, &canon]
            .iter()
            .any(|p| prefix.value() == Some(py_repr(p).as_str())),
        "the session must run the allowed venv {}: {prefix:#?}",
        venv.display()
    );
    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ C: pyvenv.cfg

/// Cell reading the decoy credentials and listing their directory.
fn steal_cell(dir: &Path) -> String {
    format!(
        r#"{ATTEMPT}
import os, sys
attempt("read", lambda: open(os.path.join({dir}, "credentials")).read())
attempt("list", lambda: os.listdir({dir}))
print("PREFIX=" + sys.prefix)
"#,
        dir = py_path(dir)
    )
}

/// The outcome of running `steal_cell` (or of the session failing to start
/// at all, which also defeats the attack): the secret must stay unread.
fn assert_not_stolen(out: &ToolOutput, secret: &str) {
    assert!(
        !everything(out).contains(secret),
        "the decoy secret leaked into a result: {out:#?}"
    );
    if out.structured["status"] == "ok" {
        assert_failed(out, "read", "pyvenv.cfg must not make the home readable");
        assert_failed(out, "list", "pyvenv.cfg must not make the home listable");
    }
}

#[tokio::test]
async fn a_pyvenv_cfg_home_line_opens_nothing() {
    let secret = unique("AWS-SECRET-");
    let (home, creds) = fake_home_with_aws(&secret);
    let mut server = StdioServer::start_with_env(&[], &[("HOME", path_str(home.path()))]).await;
    assert!(
        !server.workdir.path().starts_with(home.path()),
        "the workspace must be outside the fake HOME"
    );
    let venv = server.workdir.path().join("evil");
    make_venv(&venv);
    set_venv_home(&venv, &creds.join("bin"));

    let created = create_session(&server, "evil", json!({ "venv": path_str(&venv) })).await;
    assert!(
        !everything(&created).contains(&secret),
        "the secret leaked: {created:#?}"
    );
    if !created.is_error {
        let out = server.exec_in("evil", &steal_cell(&creds)).await;
        assert_not_stolen(&out, &secret);
        if out.structured["status"] == "ok" {
            assert!(
                out.str_field("stdout").contains("/evil"),
                "the session must run the planted venv: {out:#?}"
            );
        }
    }
    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn a_planted_dot_venv_opens_nothing_on_the_next_start() {
    let secret = unique("AWS-SECRET-");
    let (home, creds) = fake_home_with_aws(&secret);
    let ws = tempfile::tempdir().expect("create a workspace");
    let venv = ws.path().join(".venv");
    make_venv(&venv);
    set_venv_home(&venv, &creds.join("bin"));

    let mut server = start_in(ws.path(), &[], &[("HOME", path_str(home.path()))]).await;
    let out = server.exec(&steal_cell(&creds)).await;
    assert_not_stolen(&out, &secret);
    if out.structured["status"] == "ok" {
        // The venv ferrepl keeps over it, made by its interpreter (which
        // read the planted home line) in the sandbox (kept_venv.rs).
        assert!(
            out.str_field("stdout").contains("/venvs/"),
            "the default session must run the venv kept over the planted .venv: {out:#?}"
        );
    }
    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ D: loader variables

const LOADER_VARS: [&str; 4] = ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH"];

/// Builds `dir/evil.so` whose constructor appends to `marker` (when a C
/// compiler is available; else the file is left empty and only the refusal
/// and the job marker prove the point).
fn evil_library(dir: &Path, marker: &Path) -> PathBuf {
    let so = dir.join("evil.so");
    let src = dir.join("evil.c");
    let code = format!(
        "#include <fcntl.h>\n#include <unistd.h>\n\
__attribute__((constructor)) static void evil(void) {{\n\
  int fd = open({marker}, O_WRONLY | O_CREAT | O_APPEND, 0644);\n\
  if (fd >= 0) {{ (void)!write(fd, \"x\\n\", 2); close(fd); }}\n}}\n",
        marker = py_path(marker)
    );
    std::fs::write(&src, code).expect("write evil.c");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .is_ok_and(|o| o.status.success());
    if !built {
        std::fs::write(&so, b"").expect("write a placeholder evil.so");
    }
    so
}

#[tokio::test]
async fn loader_variables_are_refused() {
    let outside = outside_dir();
    let so_marker = outside.path().join("library-ran");
    let mut server = StdioServer::start(&[]).await;
    let ws = server.workdir.path().to_path_buf();
    let so = evil_library(&ws, &so_marker);

    for (i, var) in LOADER_VARS.iter().enumerate() {
        let value = match *var {
            "LD_PRELOAD" | "LD_AUDIT" => path_str(&so).to_string(),
            _ => path_str(&ws).to_string(),
        };
        let name = format!("ld{i}");
        let out = create_session(&server, &name, json!({ "env": { *var: value } })).await;
        assert!(
            !so_marker.exists(),
            "python_sessions create with {var} ran the library outside the sandbox ({} exists)",
            so_marker.display()
        );
        assert_refused_naming(&out, var, &format!("python_sessions create with env {var}"));
        assert_no_session(&server, &name, &format!("{var} was refused")).await;

        let job_marker = ws.join(format!("job-ran-{i}"));
        let job = server
            .call(
                "shell_exec",
                json!({
                    "command": format!("echo ran > {}", sh_quote(path_str(&job_marker))),
                    "env": { *var: value },
                }),
            )
            .await;
        assert!(
            !so_marker.exists(),
            "shell_exec with {var} ran the library outside the sandbox ({} exists)",
            so_marker.display()
        );
        assert_refused_naming(&job, var, &format!("shell_exec with env {var}"));
        assert!(!job_marker.exists(), "the job refused for {var} ran anyway");
    }

    // Ordinary variables still reach sessions and jobs.
    let out = create_session(&server, "plain", json!({ "env": { "MY_VAR": "1" } })).await;
    assert!(!out.is_error, "env MY_VAR must be accepted: {out:#?}");
    let value = server
        .exec_in("plain", "import os; os.environ.get('MY_VAR')")
        .await;
    value.assert_ok();
    assert_eq!(value.value(), Some("'1'"), "{value:#?}");
    let job = server
        .call(
            "shell_exec",
            json!({ "command": "echo v=$MY_VAR", "env": { "MY_VAR": "1" } }),
        )
        .await;
    assert!(!job.is_error, "shell_exec with env MY_VAR failed: {job:#?}");
    assert!(
        job.str_field("stdout").contains("v=1"),
        "the job must see MY_VAR: {job:#?}"
    );
    assert!(!so_marker.exists(), "the library ran outside the sandbox");

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ E: inherited environment

const ENV_CELL: &str = "import os, json\nprint(json.dumps(dict(os.environ)))";

/// The environment a cell printed with `ENV_CELL`.
fn cell_env(out: &ToolOutput) -> serde_json::Map<String, Value> {
    out.assert_ok();
    let stdout = out.str_field("stdout").trim();
    match serde_json::from_str::<Value>(stdout) {
        Ok(Value::Object(map)) => map,
        _ => panic!("the cell did not print its environment as JSON: {out:#?}"),
    }
}

#[tokio::test]
async fn the_server_environment_is_not_inherited() {
    let secret = unique("decoy-api-key-");
    let envs = [
        ("DECOY_API_KEY", secret.as_str()),
        ("SSH_AUTH_SOCK", "/tmp/x"),
        ("LANG", "C.UTF-8"),
    ];
    let mut server = StdioServer::start_with_env(&[], &envs).await;

    for session in ["default", "named"] {
        let out = server.exec_in(session, ENV_CELL).await;
        let env = cell_env(&out);
        for hidden in ["DECOY_API_KEY", "SSH_AUTH_SOCK"] {
            assert!(
                !env.contains_key(hidden),
                "session '{session}' inherited {hidden} from the server: {env:?}"
            );
        }
        assert!(
            !everything(&out).contains(&secret),
            "the decoy key leaked into session '{session}': {out:#?}"
        );
        assert!(
            env.contains_key("PATH"),
            "session '{session}' must keep PATH: {env:?}"
        );
        assert_eq!(
            env.get("LANG"),
            Some(&json!("C.UTF-8")),
            "session '{session}' must keep LANG: {env:?}"
        );
    }

    let job = server.call("shell_exec", json!({ "command": "env" })).await;
    assert!(!job.is_error, "shell_exec env failed: {job:#?}");
    let stdout = job.str_field("stdout");
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    for hidden in ["DECOY_API_KEY", "SSH_AUTH_SOCK"] {
        assert!(
            !names.contains(&hidden),
            "the shell job inherited {hidden}: {stdout}"
        );
    }
    assert!(
        !everything(&job).contains(&secret),
        "the decoy key leaked into the job: {job:#?}"
    );
    assert!(names.contains(&"PATH"), "the job must keep PATH: {stdout}");
    assert!(
        stdout.lines().any(|l| l == "LANG=C.UTF-8"),
        "the job must keep LANG: {stdout}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn pass_env_passes_only_what_the_operator_names() {
    let secret = unique("decoy-api-key-");
    let envs = [
        ("DECOY_API_KEY", secret.as_str()),
        ("SSH_AUTH_SOCK", "/tmp/x"),
        ("LANG", "C.UTF-8"),
    ];
    let mut server = StdioServer::start_with_env(&["--pass-env", "DECOY_API_KEY"], &envs).await;
    let env = cell_env(&server.exec(ENV_CELL).await);
    assert_eq!(
        env.get("DECOY_API_KEY"),
        Some(&json!(secret)),
        "--pass-env DECOY_API_KEY must pass it: {env:?}"
    );
    assert!(
        !env.contains_key("SSH_AUTH_SOCK"),
        "SSH_AUTH_SOCK was not named by --pass-env: {env:?}"
    );
    assert!(env.contains_key("PATH"), "PATH must stay: {env:?}");
    assert_eq!(env.get("LANG"), Some(&json!("C.UTF-8")), "{env:?}");
    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ F: agent-made interpreter

#[tokio::test]
async fn an_agent_made_interpreter_never_runs_unconfined() {
    let outside = outside_dir();
    let marker = outside.path().join("ran-unconfined");
    let mut server = StdioServer::start(&[]).await;
    let ws = server.workdir.path().to_path_buf();
    let ran = ws.join("fakepy-ran");
    let fakepy = ws.join("fakepy");
    let script = format!(
        "#!/bin/sh\n( echo \"$$ $*\" >> {marker} ) 2>/dev/null\n( echo \"$$\" >> {ran} ) 2>/dev/null\nexec {python} \"$@\"\n",
        marker = sh_quote(path_str(&marker)),
        ran = sh_quote(path_str(&ran)),
        python = sh_quote(path_str(&system_python())),
    );
    std::fs::write(&fakepy, script).expect("write fakepy");
    std::fs::set_permissions(&fakepy, std::fs::Permissions::from_mode(0o755))
        .expect("chmod fakepy");

    let created = create_session(&server, "fake", json!({ "python": path_str(&fakepy) })).await;
    assert!(
        !created.is_error,
        "an interpreter inside the workspace must be accepted: {created:#?}"
    );
    let out = server.exec_in("fake", "1 + 1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("2"));
    assert!(
        ran.exists(),
        "fakepy did not run at all (no {}), so the test proves nothing",
        ran.display()
    );
    assert!(
        !marker.exists(),
        "starting the session ran fakepy unconfined: it wrote {}",
        marker.display()
    );

    let install = server
        .call(
            "python_install",
            json!({ "packages": ["x"], "session": "fake", "wait_s": 20 }),
        )
        .await;
    assert!(
        !marker.exists(),
        "python_install ran fakepy unconfined: it wrote {}; install result: {install:#?}",
        marker.display()
    );

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn shell_cwd_must_resolve_inside_the_workspace() {
    let server = StdioServer::start(&[]).await;
    let ws = server.workdir.path().canonicalize().expect("workspace");
    let outside = outside_dir();
    std::os::unix::fs::symlink(outside.path(), ws.join("out")).expect("symlink out");
    std::fs::create_dir(ws.join("sub")).expect("mkdir sub");
    for cwd in [
        "/".to_string(),
        "..".to_string(),
        "../..".to_string(),
        "out".to_string(),
        path_str(outside.path()).to_string(),
    ] {
        let out = server
            .call(
                "shell_exec",
                json!({ "command": "pwd; touch escaped", "cwd": cwd, "wait_s": 20 }),
            )
            .await;
        assert_refused_naming(&out, "cwd", &format!("shell_exec cwd {cwd:?}"));
    }
    assert!(
        !outside.path().join("escaped").exists(),
        "a job started outside the workspace"
    );
    let inside = server
        .call(
            "shell_exec",
            json!({ "command": "pwd", "cwd": "sub", "wait_s": 20 }),
        )
        .await;
    assert!(
        !inside.is_error && inside.text.contains("/sub"),
        "a directory inside works: {inside:#?}"
    );
}
