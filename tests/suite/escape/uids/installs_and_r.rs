//! Install jobs and R sessions run as the session's uid.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::support::{
    StdioServer, host_pid_in_namespace, is_root, own_uid, path_str, real_python3,
};

use super::*;

/// A wheel `<dir>/<name>-1.0-py3-none-any.whl` whose module has `VALUE`.
fn wheel(dir: &Path, name: &str, value: u32) -> PathBuf {
    let path = dir.join(format!("{name}-1.0-py3-none-any.whl"));
    let script = "import sys, zipfile\npath, name, value = sys.argv[1:4]\ninfo = name + '-1.0.dist-info'\n\
        with zipfile.ZipFile(path, 'w') as z:\n\
        \x20   z.writestr(name + '/__init__.py', 'VALUE = ' + value + '\\n')\n\
        \x20   z.writestr(info + '/METADATA', 'Metadata-Version: 2.1\\nName: ' + name + '\\nVersion: 1.0\\n')\n\
        \x20   z.writestr(info + '/WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
        \x20   z.writestr(info + '/RECORD', '')\n";
    let out = std::process::Command::new(real_python3())
        .args(["-c", script])
        .arg(&path)
        .arg(name)
        .arg(value.to_string())
        .output()
        .expect("run python");
    assert!(out.status.success(), "build the wheel: {out:?}");
    path
}

/// Changes the owner of everything under `dir` (symlinks themselves).
fn chown_tree(dir: &Path, uid: u32) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        std::os::unix::fs::lchown(&p, Some(uid), Some(uid)).expect("lchown");
        if std::fs::symlink_metadata(&p).expect("stat").is_dir() {
            for e in std::fs::read_dir(&p).expect("read_dir") {
                stack.push(e.expect("entry").path());
            }
        }
    }
}

/// Claim: a package install job writes into the venv as the sessions' uid,
/// never as root: the venv (owned by another user, 4243) is shown to the
/// job as its own through an idmapped mount, so what the install writes
/// lands as 4243's on the host (a root install would be root's, or
/// refused), and the session imports it. Unprivileged: the server's uid.
#[tokio::test]
async fn an_install_job_writes_the_venv_as_the_sessions_uid() {
    let place = Place::new();
    let venv_dir = tempfile::tempdir().expect("venv parent");
    let venv = venv_dir.path().join("env");
    let made = std::process::Command::new(real_python3())
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .expect("run python -m venv");
    assert!(made.status.success(), "python -m venv: {made:?}");
    let venv_owner = if is_root() {
        chown_tree(&venv, VENV_OWNER);
        VENV_OWNER
    } else {
        own_uid()
    };
    let python = real_python3();
    let launch = place.launch(
        "3100040-3100049",
        &["--python", path_str(&python), "--venv", path_str(&venv)],
    );
    let server = StdioServer::launch(launch).await;
    let (seen, _) = seen_in(server.peer(), "default", "").await;
    if is_root() {
        assert_ne!(seen.uid, 0);
    } else {
        assert_eq!(seen.uid, own_uid());
    }

    let name = "ferrepl_uids_pkg";
    let whl = wheel(place.ws(), name, 31337);
    let mut out = server
        .call(
            "python_install",
            json!({ "packages": [path_str(&whl)], "wait_s": 50 }),
        )
        .await;
    for _ in 0..10 {
        if out.structured["status"] != "running" {
            break;
        }
        out = server
            .call(
                "shell_wait",
                json!({ "job": out.str_field("job"), "wait_s": 50 }),
            )
            .await;
    }
    assert_eq!(out.structured["status"], "exited", "{out:#?}");
    assert_eq!(out.structured["exit_code"], 0, "the install: {out:#?}");

    // --venv is the user's, read-only to sessions: the install went to the
    // venv ferrepl keeps over it (kept_venv.rs), given to the workspace's
    // owner and shown to the sessions' uid like the workspace.
    let installed_in = |prefix: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(prefix.join("lib"))
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .map(|py| {
                        py.path()
                            .join("site-packages")
                            .join(name)
                            .join("__init__.py")
                    })
                    .filter(|p| p.is_file())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        installed_in(&venv),
        Vec::<PathBuf>::new(),
        "nothing in --venv"
    );
    // Each kept venv has a lock file beside it (made by one server at a time).
    let kept: Vec<PathBuf> = std::fs::read_dir(place.state.path().join("venvs"))
        .expect("the kept venvs")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(kept.len(), 1, "one kept venv: {kept:?}");
    let installed = installed_in(&kept[0]);
    assert_eq!(
        installed.len(),
        1,
        "the package is in the kept venv: {installed:?}"
    );
    assert_eq!(
        owner(&installed[0]),
        owner(&kept[0]),
        "the install wrote as the kept venv's owner is shown to the sessions' uid"
    );
    assert_eq!(
        owner(installed[0].parent().expect("package dir")),
        owner(&kept[0])
    );
    assert_eq!(owner(&venv), venv_owner);

    // The session picks it up (the refresh after an install may lag).
    let mut imported = server.exec(&format!("import {name}\n{name}.VALUE")).await;
    for _ in 0..40 {
        if !imported.is_error {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        imported = server.exec(&format!("import {name}\n{name}.VALUE")).await;
    }
    imported.assert_ok();
    assert_eq!(imported.value(), Some("31337"));
}

/// Claim: R sessions of a root server run as the same non-root uid as its
/// Python sessions (kept under "*"), seen from the host, and what R creates
/// in the idmapped workspace is root's there. Unprivileged: the server's
/// uid.
#[tokio::test]
async fn r_sessions_run_as_the_sessions_uid() {
    let range = "3100050-3100059";
    let place = Place::new();
    let server = StdioServer::launch(place.launch(range, &["--languages", "python,r"])).await;
    let code = "writeLines('from R', 'made-by-r.txt')\n\
        st <- readLines('/proc/self/status')\n\
        cat('UID', sub('^Uid:[[:space:]]*', '', grep('^Uid:', st, value = TRUE)), '\\n')\n\
        cat('NS', Sys.readlink('/proc/self/ns/pid'), Sys.getpid(), '\\n')";
    let out = server
        .call("r_exec", json!({ "code": code, "wait_s": 30 }))
        .await;
    assert!(!out.is_error, "{out:#?}");
    let stdout = out.str_field("stdout").to_string();
    let field = |tag: &str| -> Vec<String> {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap_or_else(|| panic!("no {tag} line: {out:#?}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let inside: Vec<u32> = field("UID ")
        .iter()
        .map(|u| u.parse().expect("a uid"))
        .collect();
    let ns = field("NS ");
    let r_pid = host_pid_in_namespace(&ns[0], ns[1].parse().expect("a pid"));
    let uid = inside[0];
    assert_eq!(inside, vec![uid; 4], "R's own Uid line");
    assert_runs_as(r_pid, uid, "the R session");
    let made = owner(&place.ws().join("made-by-r.txt"));
    if is_root() {
        assert_ne!(uid, 0, "a root server's R session must not run as root");
        assert_in_range(uid, range);
        assert_eq!(place.uid_table().get("*"), Some(&json!(uid)));
        let (py, _) = seen_in(server.peer(), "default", "").await;
        assert_eq!(py.uid, uid, "R and Python sessions share the one uid");
        assert_eq!(made, 0);
    } else {
        assert_eq!(uid, own_uid());
        assert_eq!(made, own_uid());
    }
}
