//! Host Unix sockets, the host's temporary directory and other sessions'
//! temporary directories are out of sight.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::json;

use crate::support::{
    ATTEMPT, StdioServer, assert_failed, assert_succeeded, errno_of, everything, json_line,
    outcome, py, py_path, run_cell, unique,
};

use super::*;

/// Names in a directory of the host, as the test sees them.
fn host_names(dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn host_unix_sockets_are_out_of_sight() {
    use std::os::unix::net::UnixListener;

    let mut listeners = Vec::new();
    let mut paths = Vec::new();
    for dir in ["/tmp", "/run"] {
        let path = PathBuf::from(dir).join(format!("{}.sock", unique("ferrepl-escape-")));
        match UnixListener::bind(&path) {
            Ok(l) => {
                l.set_nonblocking(true).expect("non-blocking listener");
                listeners.push(l);
                paths.push(path);
            }
            Err(e) if dir == "/tmp" => panic!("bind {}: {e}", path.display()),
            Err(_) => {} // /run not writable by this user: /tmp only.
        }
    }
    let _cleanup = Cleanup(paths.clone());
    let mut server = StdioServer::start(&[]).await;
    let ws = server.workdir.path().to_path_buf();
    let from_test = ws.join("from-test.txt");
    let from_cell = ws.join("from-cell.txt");
    std::fs::write(&from_test, "hello from the test").expect("write into the workspace");

    let mut probes = String::new();
    for (i, path) in paths.iter().enumerate() {
        probes.push_str(&format!(
            "attempt('connect{i}', lambda: connect({}))\n",
            py_path(path)
        ));
    }
    let code = format!(
        r#"{ATTEMPT}
import json, socket
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return "connected"
    finally:
        s.close()
{probes}
def names(d):
    try:
        return sorted(os.listdir(d))
    except OSError:
        return []
print("RUN=" + json.dumps(names("/run")))
print("VARRUN=" + json.dumps(names("/var/run")))
def read_ws():
    with open({from_test}) as f:
        return f.read()
def write_ws():
    with open({from_cell}, "w") as f:
        return f.write("hello from the cell")
attempt("read_ws", read_ws)
attempt("write_ws", write_ws)
"#,
        from_test = py_path(&from_test),
        from_cell = py_path(&from_cell),
    );
    let out = run_cell(&server, "default", &code).await;

    for (i, path) in paths.iter().enumerate() {
        let got = outcome(&out, &format!("connect{i}"));
        assert!(
            [libc::ENOENT, libc::EACCES, libc::EPERM]
                .iter()
                .any(|e| errno_of(&got) == Some(*e)),
            "connecting to the host socket {} should fail with ENOENT/EACCES/EPERM, got '{got}': {out:#?}",
            path.display()
        );
    }
    for l in &listeners {
        match l.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Ok(_) => panic!("the session reached the test's Unix socket"),
            Err(e) => panic!("accept on the test's Unix socket failed: {e}"),
        }
    }
    for (key, dir) in [("RUN", "/run"), ("VARRUN", "/var/run")] {
        let host = host_names(dir);
        let seen = string_set(&json_line(&out, key));
        let shared: Vec<&String> = seen.intersection(&host).collect();
        assert!(
            shared.is_empty(),
            "the session's {dir} shows the host's entries {shared:?} (session: {seen:?})"
        );
    }
    assert_eq!(
        outcome(&out, "read_ws"),
        "OK 'hello from the test'",
        "{out:#?}"
    );
    assert_succeeded(&out, "write_ws");
    assert_eq!(
        std::fs::read_to_string(&from_cell).expect("the file the cell wrote"),
        "hello from the cell"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 14. temporary directories

#[tokio::test]
async fn the_host_temp_dir_and_other_sessions_tmpdirs_are_hidden() {
    let secret = unique("TMP-SECRET-");
    let decoy = std::env::temp_dir().join(format!("{}.txt", unique("ferrepl-escape-decoy-")));
    std::fs::write(&decoy, format!("{secret}\n")).expect("write the decoy");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o644))
            .expect("chmod the decoy");
    }
    let _cleanup = Cleanup(vec![decoy.clone()]);
    let mut server = StdioServer::start(&[]).await;

    // Session A keeps a secret in its own TMPDIR.
    let a_secret = unique("A-TMP-SECRET-");
    let a = run_cell(
        &server,
        "a",
        &format!(
            "import os\n_p = os.path.join(os.environ['TMPDIR'], 'a-secret.txt')\n\
             open(_p, 'w').write({})\n_p",
            py(&a_secret)
        ),
    )
    .await;
    let a_file = a
        .value()
        .unwrap_or_else(|| panic!("no path from session a: {a:#?}"))
        .trim_matches('\'')
        .to_string();

    let code = format!(
        r#"{ATTEMPT}
def read(path):
    with open(path) as f:
        return len(f.read())
def write_tmp():
    p = os.path.join(os.environ["TMPDIR"], "own.txt")
    with open(p, "w") as f:
        f.write("mine")
    with open(p) as f:
        return f.read()
attempt("decoy", lambda: read({decoy}))
attempt("decoy_listed", lambda: {name} in os.listdir({dir}))
attempt("a_tmpdir", lambda: read({a_file}))
attempt("own_tmpdir", write_tmp)
"#,
        decoy = py_path(&decoy),
        name = py(decoy.file_name().and_then(|n| n.to_str()).expect("a name")),
        dir = py_path(decoy.parent().expect("the temp dir")),
        a_file = py(&a_file),
    );
    for session in ["b", "a"] {
        let out = run_cell(&server, session, &code).await;
        assert_failed(&out, "decoy", "the host's temporary directory is hidden");
        assert!(
            outcome(&out, "decoy_listed") != "OK True",
            "session {session} lists the decoy in the host's temp dir: {out:#?}"
        );
        if session == "b" {
            assert_failed(&out, "a_tmpdir", "another session's temporary directory");
        }
        assert_eq!(outcome(&out, "own_tmpdir"), "OK 'mine'", "{out:#?}");
        let all = everything(&out);
        assert!(!all.contains(&secret), "the decoy leaked: {out:#?}");
        assert!(
            !all.contains(&a_secret),
            "session a's secret leaked: {out:#?}"
        );
    }

    // A shell job cannot read them either.
    let job = server
        .call(
            "shell_exec",
            json!({ "command": format!("cat {} {}", decoy.display(), a_file) }),
        )
        .await;
    assert_eq!(job.structured["status"], "exited", "{job:#?}");
    let all = everything(&job);
    assert!(
        !all.contains(&secret) && !all.contains(&a_secret),
        "a shell job read a hidden temporary file: {job:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}
