//! R inside the sandbox: no home directory or /etc/shadow, writes only in
//! the workspace, no network.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::Path;

use super::{R_ATTEMPT, R_LANGS, assert_r_ok, r_exec, r_server, r_str};
use crate::support::{
    StdioServer, ToolOutput, assert_failed, assert_succeeded, everything, path_str, unique,
};

/// A probing cell (R_ATTEMPT and `body`) that must run to completion.
async fn r_probe(server: &StdioServer, body: &str) -> ToolOutput {
    let out = r_exec(server, &format!("{R_ATTEMPT}\n{body}")).await;
    assert_r_ok(&out);
    out
}

#[tokio::test]
async fn r_cannot_read_the_home_directory_or_etc_shadow() {
    let secret = unique("SECRET-");
    let home = crate::support::visible_outside_dir();
    let ssh = home.path().join(".ssh");
    std::fs::create_dir(&ssh).expect("mkdir .ssh");
    let key = ssh.join("id_rsa");
    std::fs::write(&key, format!("{secret}\n")).expect("write the fake key");
    let home_str = path_str(home.path()).to_string();
    let server = StdioServer::start_with_env(R_LANGS, &[("HOME", home_str.as_str())]).await;

    let body = format!(
        "attempt('key', readLines({key}))\n\
         attempt('listing', stopifnot(length(dir({home})) > 0))\n\
         attempt('shadow', system('cat /etc/shadow', intern = TRUE))\n\
         cat('HOME=', Sys.getenv('HOME'), '\\n', sep = '')",
        key = r_str(path_str(&key)),
        home = r_str(&home_str),
    );
    let out = r_probe(&server, &body).await;
    assert_failed(&out, "key", "the server's HOME is hidden");
    assert_failed(&out, "listing", "the server's HOME is hidden");
    assert_failed(&out, "shadow", "/etc/shadow is not readable");
    let all = everything(&out);
    assert!(!all.contains(&secret), "the secret leaked: {all}");
    assert!(!all.contains("root:"), "/etc/shadow leaked: {all}");
    if let Ok(shadow) = std::fs::read_to_string("/etc/shadow")
        && let Some(first) = shadow.lines().next().filter(|l| !l.is_empty())
    {
        assert!(!all.contains(first), "/etc/shadow leaked: {all}");
    }
    let session_home = outcome_line(&out, "HOME=");
    assert!(
        !Path::new(&session_home).starts_with(home.path()),
        "the session's HOME ({session_home}) is the server's"
    );
}

/// The rest of the stdout line starting with `prefix`.
fn outcome_line(out: &ToolOutput, prefix: &str) -> String {
    out.str_field("stdout")
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line in {out:#?}"))
        .to_string()
}

#[tokio::test]
async fn r_writes_only_inside_the_workspace() {
    let visible = crate::support::visible_outside_dir();
    let visible_target = visible.path().join("escaped.txt");
    let system_target = format!("/usr/local/{}", unique("ferrepl-test-"));
    let server = r_server().await;
    let inside = server.workdir.path().join("inside.txt");

    let body = format!(
        "attempt('system', writeLines('x', {system}))\n\
         attempt('visible', writeLines('x', {visible}))\n\
         attempt('inside', writeLines('kept', {inside}))\n\
         attempt('relative', writeLines('here', 'relative.txt'))",
        system = r_str(&system_target),
        visible = r_str(path_str(&visible_target)),
        inside = r_str(path_str(&inside)),
    );
    let out = r_probe(&server, &body).await;
    assert_failed(&out, "system", "outside the workspace");
    assert_failed(&out, "visible", "outside the workspace");
    for path in [Path::new(&system_target), visible_target.as_path()] {
        assert!(!path.exists(), "{} was created", path.display());
    }
    assert_succeeded(&out, "inside");
    assert_succeeded(&out, "relative");
    let read = |p: &Path| std::fs::read_to_string(p).expect("read a file the cell wrote");
    assert_eq!(read(&inside), "kept\n");
    assert_eq!(read(&server.workdir.path().join("relative.txt")), "here\n");
}

#[tokio::test]
async fn r_has_no_network() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a TCP listener");
    listener.set_nonblocking(true).expect("non-blocking");
    let port = listener.local_addr().expect("addr").port();
    let server = r_server().await;
    let body = format!(
        "options(timeout = 10)\n\
         attempt('local_socket', socketConnection('127.0.0.1', {port}, blocking = TRUE, timeout = 10))\n\
         attempt('local_url', readLines(url('http://127.0.0.1:{port}/')))\n\
         attempt('remote_socket', socketConnection('example.com', 80, blocking = TRUE, timeout = 10))\n\
         attempt('remote_url', readLines(url('http://example.com')))"
    );
    let out = r_probe(&server, &body).await;
    for label in ["local_socket", "local_url", "remote_socket", "remote_url"] {
        assert_failed(&out, label, "the network is off");
    }
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("the R cell reached the test's listener from {peer}"),
        Err(e) => panic!("accept on the test's listener failed: {e}"),
    }
}
