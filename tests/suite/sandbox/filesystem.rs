//! The filesystem: writes confined to the workspace and a private home, a
//! read-only sandbox, secrets in the user's home unreadable.

use std::path::Path;

use super::{assert_denied, assert_denied_or_hidden, fake_home};
use crate::support::{ATTEMPT, StdioServer, assert_succeeded, everything, py_path, unique};

#[tokio::test]
async fn writes_are_confined_to_the_workspace_and_a_private_home() {
    // One directory outside the view, one the operator shows read-only
    // (--allow-read).
    let outside = tempfile::tempdir().expect("create a directory outside the workspace");
    let target = outside.path().join("escaped.txt");
    let visible = crate::support::visible_outside_dir();
    let visible_target = visible.path().join("escaped.txt");
    let real_home = std::env::var("HOME").unwrap_or_default();

    let visible_arg = visible.path().to_str().expect("utf-8 path");
    let mut server = StdioServer::start(&["--allow-read", visible_arg]).await;
    let inside = server.workdir.path().join("inside.txt");
    let code = format!(
        r#"{ATTEMPT}
import os
def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return "written"
attempt("outside", lambda: write({target}, "escaped"))
attempt("outside_visible", lambda: write({visible_target}, "escaped"))
attempt("inside", lambda: write({inside}, "kept"))
attempt("home", lambda: write(os.path.join(os.environ["HOME"], "probe.txt"), "h"))
attempt("tmpdir", lambda: write(os.path.join(os.environ["TMPDIR"], "probe.txt"), "t"))
print("HOME=" + os.environ["HOME"])
print("TMPDIR=" + os.environ["TMPDIR"])
"#,
        target = py_path(&target),
        visible_target = py_path(&visible_target),
        inside = py_path(&inside),
    );
    let out = server.exec(&code).await;
    out.assert_ok();

    assert_denied_or_hidden(&out, "outside");
    assert_denied(&out, "outside_visible");
    for path in [&target, &visible_target] {
        assert!(
            !path.exists(),
            "{} was created outside the workspace",
            path.display()
        );
    }

    assert_succeeded(&out, "inside");
    assert_eq!(
        std::fs::read_to_string(&inside).expect("read the file the cell wrote"),
        "kept"
    );

    assert_succeeded(&out, "home");
    assert_succeeded(&out, "tmpdir");
    let stdout = out.str_field("stdout");
    let value_of = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} line in {stdout:?}"))
            .to_string()
    };
    let home = value_of("HOME=");
    let tmpdir = value_of("TMPDIR=");
    for (name, dir) in [("HOME", &home), ("TMPDIR", &tmpdir)] {
        assert!(!dir.is_empty(), "{name} is empty in the session");
        if !real_home.is_empty() {
            assert_ne!(
                Path::new(dir),
                Path::new(&real_home),
                "{name} of the session is the real HOME"
            );
            assert!(
                !Path::new(dir).starts_with(&real_home),
                "{name} of the session ({dir}) is inside the real HOME ({real_home})"
            );
        }
    }

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn read_only_sandbox_refuses_workspace_writes_but_allows_tmpdir() {
    let mut server = StdioServer::start(&["--sandbox", "read-only"]).await;
    let inside = server.workdir.path().join("inside.txt");
    let code = format!(
        r#"{ATTEMPT}
import os
def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return "written"
attempt("workspace", lambda: write({inside}, "nope"))
attempt("tmpdir", lambda: write(os.path.join(os.environ["TMPDIR"], "probe.txt"), "t"))
"#,
        inside = py_path(&inside),
    );
    let out = server.exec(&code).await;
    out.assert_ok();
    assert_denied(&out, "workspace");
    assert!(
        !inside.exists(),
        "{} was written under --sandbox read-only",
        inside.display()
    );
    assert_succeeded(&out, "tmpdir");

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn secrets_in_the_home_directory_cannot_be_read() {
    let secret = unique("SECRET-");
    let home = fake_home(&secret);
    let key = home.path().join(".ssh").join("id_rsa");
    let home_str = home.path().to_str().expect("UTF-8 home").to_string();

    let mut server = StdioServer::start_with_env(&[], &[("HOME", home_str.as_str())]).await;
    assert!(
        !server.workdir.path().starts_with(home.path()),
        "the workspace must be outside the fake HOME"
    );
    let out = server
        .exec(&format!("open({}).read()", py_path(&key)))
        .await;
    // The home is hidden: refused, or (covered by an empty tmpfs) not there.
    assert!(
        out.is_error && out.status() == "error",
        "reading the key must raise: {out:#?}"
    );
    assert!(
        matches!(out.error_type(), "PermissionError" | "FileNotFoundError"),
        "reading the key must raise PermissionError or FileNotFoundError: {out:#?}"
    );
    let all = everything(&out);
    assert!(
        !all.contains("SECRET"),
        "the secret leaked into the result: {all}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}
