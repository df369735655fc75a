//! ferrepl's own files refused where sessions write (a tokens file under
//! every alias of a bound directory), and the operator's CA bundle seen by
//! install jobs only.

use std::path::Path;
use std::time::Duration;

use crate::support::{ATTEMPT, StdioServer, outcome, path_str, py, py_path, unique};
use serde_json::json;

/// Runs ferrepl with `args` and `envs` until it exits (it must refuse to
/// start); its stderr.
async fn refused(args: &[&str], envs: &[(&str, &Path)]) -> String {
    let mut cmd = crate::support::server_command();
    cmd.args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("ferrepl exits: it must refuse to start")
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} must be refused: {stderr}");
    stderr
}

#[tokio::test]
async fn ferrepls_own_files_may_not_lie_where_sessions_write() {
    let base = crate::support::visible_outside_dir();
    let (ws, shared) = (base.path().join("ws"), base.path().join("shared"));
    std::fs::create_dir_all(shared.join("t")).expect("mkdir");
    std::fs::create_dir_all(&ws).expect("mkdir");
    let p = |p: &Path| p.to_str().expect("utf-8").to_string();
    // The runtime directory (policies, homes, logs) in an --allow-write path:
    // a session could rewrite the next launcher's policy.
    let stderr = refused(
        &["--workdir", &p(&ws), "--allow-write", &p(&shared)],
        &[("TMPDIR", &shared.join("t"))],
    )
    .await;
    let tmp = shared.join("t");
    assert!(
        stderr.contains(tmp.to_str().expect("utf-8")) && stderr.contains("sessions"),
        "names the runtime directory's place: {stderr}"
    );
    // A tokens file reached through a symlink in the workspace: the agent
    // could point it at its own tokens before a reload.
    let real_tokens = base.path().join("tokens");
    std::fs::write(&real_tokens, "own-files-token-0123456789abcdef\n").expect("write");
    std::os::unix::fs::symlink(&real_tokens, ws.join("tokens")).expect("symlink");
    let stderr = refused(
        &[
            "--workdir",
            &p(&ws),
            "--http",
            "127.0.0.1:0",
            "--auth-token-file",
            &p(&ws.join("tokens")),
        ],
        &[],
    )
    .await;
    assert!(
        stderr.contains("--auth-token-file"),
        "names the flag: {stderr}"
    );
    // A path bound read-only inside one sessions write: swappable.
    let stderr = refused(
        &[
            "--workdir",
            &p(&ws),
            "--allow-write",
            &p(&shared),
            "--allow-read",
            &p(&shared.join("t")),
        ],
        &[],
    )
    .await;
    assert!(
        stderr.contains("which sessions can write"),
        "a nested bind is refused: {stderr}"
    );
}

#[tokio::test]
async fn a_tokens_file_in_a_bound_tool_directory_is_refused_under_every_alias() {
    // A tool directory on PATH, reached directly or through a symlink,
    // holding the tokens file: the view would show it, so the start is
    // refused (a cover would not survive the file's rotation).
    let base = crate::support::visible_outside_dir();
    let tool = base.path().join("tool");
    std::fs::create_dir_all(tool.join("bin")).expect("mkdir");
    std::fs::create_dir_all(tool.join("etc")).expect("mkdir");
    let tokens = tool.join("etc/tokens");
    std::fs::write(&tokens, "alias-token-0123456789abcdef\n").expect("write");
    let alias = base.path().join("alias");
    std::os::unix::fs::symlink(&tool, &alias).expect("symlink");
    let tokens_arg = tokens.to_str().expect("utf-8").to_string();
    let ws = tempfile::tempdir().expect("workspace");
    let ws_arg = ws.path().to_str().expect("utf-8").to_string();
    for entry in [tool.join("bin"), alias.join("bin")] {
        let path = format!(
            "{}:{}",
            entry.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let stderr = refused(
            &["--workdir", &ws_arg, "--auth-token-file", &tokens_arg],
            &[("PATH", Path::new(&path))],
        )
        .await;
        assert!(
            stderr.contains("--auth-token-file") && stderr.contains("which sessions can read"),
            "PATH {}: {stderr}",
            entry.display()
        );
    }
}

#[tokio::test]
async fn only_install_jobs_see_the_operators_ca_bundle() {
    // The operator's pip names a CA bundle outside every allow-listed place.
    let base = crate::support::visible_outside_dir();
    let secret = unique("CA-BUNDLE-");
    let ca = base.path().join("corp-ca.pem");
    std::fs::write(&ca, format!("{secret}\n")).expect("write the bundle");
    let ca_arg = ca.to_str().expect("utf-8").to_string();
    let server = StdioServer::start_with_env(&[], &[("PIP_CERT", ca_arg.as_str())]).await;
    let ws = server.workdir.path().to_path_buf();
    let cell = format!(
        r#"{ATTEMPT}
import subprocess, sys, glob, os
attempt('bundle', lambda: open({ca}).read())
subprocess.run([sys.executable, '-m', 'venv', '--without-pip', 'venv'], check=True)
site = glob.glob('venv/lib/python*/site-packages')[0]
line = "import os; open(%r, 'w').write(repr(open(os.environ['SSL_CERT_FILE']).read()))\n" % {report}
open(os.path.join(site, 'zz_ca_probe.pth'), 'w').write(line)
"#,
        ca = py_path(&ca),
        report = py(path_str(&ws.join("ca-report.txt"))),
    );
    let out = server.exec(&cell).await;
    out.assert_ok();
    assert!(
        !outcome(&out, "bundle").starts_with("OK"),
        "a cell must not see the installers' bundle: {out:#?}"
    );
    let created = server
        .call(
            "python_sessions",
            json!({ "action": "create", "session": "v", "venv": path_str(&ws.join("venv")) }),
        )
        .await;
    assert!(!created.is_error, "{created:#?}");
    let mut install = server
        .call(
            "python_install",
            json!({ "packages": ["ferrepl-ca-probe-not-a-package"], "session": "v", "wait_s": 50 }),
        )
        .await;
    let job = install.str_field("job").to_string();
    for _ in 0..10 {
        if install.structured["status"] != "running" {
            break;
        }
        install = server
            .call("shell_wait", json!({ "job": job, "wait_s": 50 }))
            .await;
    }
    let report = std::fs::read_to_string(ws.join("ca-report.txt"))
        .unwrap_or_else(|e| panic!("the install job left no report ({e}): {install:#?}"));
    assert!(
        report.contains(&secret),
        "the install job reads the operator's CA bundle: {report}"
    );
}
