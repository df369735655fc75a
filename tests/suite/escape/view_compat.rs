//! The allow-listed view still makes a believable system for the tools
//! agents run: user and home lookups (`getpass`, `pwd`, `~`, `id`,
//! `whoami`) answer from the `/etc/passwd` written for the sandbox (which
//! names only the process's uid, root and nobody), git and make work in a
//! shell job, TLS finds the CA certificates, the CPU count and time zone
//! are there, a background process shows in `ps` and can be killed, and
//! `/tmp` is the process's own temporary directory (or, where the workspace
//! or TMPDIR lies under /tmp, a read-only directory holding the way to
//! them). Plots are covered by `rich_output.rs` (its interpreter lives in
//! root's pyenv, which the unprivileged run cannot start).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::view::{cell, job};
use crate::support::{Launch, StdioServer, ToolOutput, json_line, path_str};

/// A job that must exit 0.
async fn job_ok(server: &StdioServer, command: &str) -> ToolOutput {
    let out = job(server.peer(), command).await;
    assert_eq!(
        out.structured["exit_code"], 0,
        "`{command}` failed in a shell job: {out:#?}"
    );
    out
}

const USER_PROBE: &str = r#"
import getpass, grp, json, os, pwd
r = {"uid": os.getuid(), "env_user": os.environ.get("USER"), "home": os.environ["HOME"]}
r["getuser"] = getpass.getuser()
saved = {k: os.environ.pop(k) for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if k in os.environ}
r["getuser_from_passwd"] = getpass.getuser()
os.environ.update(saved)
entry = pwd.getpwuid(os.getuid())
r["pw_name"], r["pw_dir"] = entry.pw_name, entry.pw_dir
r["expanduser"] = os.path.expanduser("~")
home = os.environ.pop("HOME")
r["expanduser_from_passwd"] = os.path.expanduser("~")
os.environ["HOME"] = home
r["group"] = grp.getgrgid(os.getgid()).gr_name
r["passwd_uids"] = [int(l.split(":")[2]) for l in open("/etc/passwd") if l.count(":") >= 6]
print("USERS=" + json.dumps(r))
"#;

#[tokio::test]
async fn user_names_and_the_home_resolve_from_the_sandboxes_passwd() {
    let server = StdioServer::start(&[]).await;
    let out = cell(server.peer(), "default", USER_PROBE).await;
    let r = json_line(&out, "USERS");
    let home = r["home"].as_str().expect("HOME");
    let uid = r["uid"].as_u64().expect("uid");
    if let Some(user) = r["env_user"].as_str() {
        assert_eq!(r["getuser"], user, "getpass.getuser() with USER set: {r}");
    }
    let name = r["getuser_from_passwd"].as_str().unwrap_or_default();
    assert!(
        !name.is_empty() && r["pw_name"] == name,
        "getpass.getuser() without the variables asks /etc/passwd: {r}"
    );
    assert_eq!(r["pw_dir"], home, "pwd's home is the process's HOME: {r}");
    assert_eq!(r["expanduser"], home, "{r}");
    assert_eq!(r["expanduser_from_passwd"], home, "~ without HOME: {r}");
    assert!(
        r["group"].as_str().is_some_and(|g| !g.is_empty()),
        "the process's group has a name: {r}"
    );
    // The sandbox's passwd names the process, root and nobody: not the
    // host's accounts.
    let uids: BTreeSet<u64> = r["passwd_uids"]
        .as_array()
        .expect("uids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let allowed: BTreeSet<u64> = [0, 65534, uid].into();
    assert!(
        uids.contains(&uid) && uids.is_subset(&allowed),
        "/etc/passwd should list uid {uid}, root and nobody only, lists {uids:?}"
    );

    let out = job_ok(
        &server,
        "id -un; whoami; id; cd ~ && echo \"CD_HOME=$(pwd -P)\" && echo \"HOME=$(cd \"$HOME\" && pwd -P)\"",
    )
    .await;
    let stdout = out.str_field("stdout");
    let mut lines = stdout.lines();
    let (id_name, whoami) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    assert!(
        !id_name.is_empty() && id_name == whoami && !stdout.contains("cannot find name"),
        "id -un and whoami print the process's name: {out:#?}"
    );
    let line = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(line("CD_HOME="), line("HOME="), "cd ~ goes HOME: {out:#?}");
}

#[tokio::test]
async fn git_and_make_work_in_a_shell_job() {
    // .git is a protected place (docs/security.md): an agent meant to
    // commit gets it freed by the operator.
    let server = StdioServer::start(&["--allow-write-protected", ".git"]).await;
    let ws = server.workdir.path();
    std::fs::write(
        ws.join("Makefile"),
        "all: out.txt\nout.txt:\n\techo made > out.txt\n",
    )
    .expect("write the Makefile");
    job_ok(&server, "make").await;
    assert_eq!(
        std::fs::read_to_string(ws.join("out.txt")).unwrap_or_default(),
        "made\n",
        "make ran the rule"
    );

    let out = job_ok(
        &server,
        "git init -q repo && cd repo && \
         git -c user.email=a@b -c user.name=n commit -q --allow-empty -m view-commit && \
         git log --oneline",
    )
    .await;
    assert!(
        out.str_field("stdout").contains(" view-commit"),
        "git log shows the commit: {out:#?}"
    );
}

#[tokio::test]
async fn certificates_cpus_time_and_names_are_there() {
    let server = StdioServer::start(&[]).await;
    let code = r#"
import json, locale, os, socket, ssl, time
r = {}
r["x509_ca"] = ssl.create_default_context().cert_store_stats()["x509_ca"]
r["cpus"] = os.cpu_count()
r["online"] = open("/sys/devices/system/cpu/online").read().strip()
r["localtime"] = list(time.localtime())[:6]
r["zone"] = time.strftime("%z")
r["locale"] = locale.setlocale(locale.LC_ALL, "")
r["etc_localtime"] = os.path.exists("/etc/localtime")
r["localhost"] = sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80)})
print("SYSTEM=" + json.dumps(r))
"#;
    let out = cell(server.peer(), "default", code).await;
    let r = json_line(&out, "SYSTEM");
    assert!(
        r["x509_ca"].as_u64().is_some_and(|n| n > 0),
        "TLS finds the CA certificates: {r}"
    );
    assert!(r["cpus"].as_u64().is_some_and(|n| n >= 1), "{r}");
    assert!(
        r["online"].as_str().is_some_and(|s| !s.is_empty()),
        "/sys/devices/system/cpu/online reads: {r}"
    );
    assert_eq!(
        r["etc_localtime"],
        Path::new("/etc/localtime").exists(),
        "/etc/localtime is there as on the host: {r}"
    );
    let host_zone = std::process::Command::new("date")
        .arg("+%z")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .expect("run date");
    assert_eq!(
        r["zone"], host_zone,
        "the session's time zone is the host's: {r}"
    );
    assert!(
        r["localhost"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "127.0.0.1" || x == "::1")),
        "localhost resolves through /etc/hosts: {r}"
    );
}

#[tokio::test]
async fn a_background_process_shows_in_ps_and_is_killed() {
    let server = StdioServer::start(&[]).await;
    let out = job_ok(
        &server,
        "sleep 300 & p=$!; ps -e -o pid=,comm= | awk -v p=$p '$1 == p {print \"PS:\" $2}'; \
         kill $p; wait $p; echo \"STATUS:$?\"",
    )
    .await;
    let stdout = out.str_field("stdout");
    assert!(
        stdout.contains("PS:sleep"),
        "ps -e lists the background sleep: {out:#?}"
    );
    assert!(
        stdout.contains("STATUS:143"),
        "kill ended it with SIGTERM: {out:#?}"
    );
}

/// A directory of this user's outside /tmp (the build's scratch directory,
/// else HOME): for a workspace and a runtime directory that need no /tmp.
fn outside_tmp() -> tempfile::TempDir {
    let mut bases = vec![PathBuf::from(env!("CARGO_TARGET_TMPDIR"))];
    if let Some(home) = std::env::var_os("HOME") {
        bases.push(PathBuf::from(home));
    }
    bases
        .iter()
        .filter(|b| !b.starts_with("/tmp"))
        .find_map(|b| {
            tempfile::Builder::new()
                .prefix(".ferrepl-view-")
                .tempdir_in(b)
                .ok()
        })
        .unwrap_or_else(|| panic!("no writable directory outside /tmp among {bases:?}"))
}

const TMP_PROBE: &str = r#"
import json, os, tempfile
r = {"tmpdir": os.environ["TMPDIR"], "link": os.readlink("/tmp") if os.path.islink("/tmp") else None}
r["gettempdir"] = tempfile.gettempdir()
try:
    with open("/tmp/view-x", "w") as f:
        f.write("x")
    r["write"] = "ok"
except OSError as e:
    r["write"] = type(e).__name__
r["in_tmpdir"] = os.path.exists(os.path.join(os.environ["TMPDIR"], "view-x"))
fd, p = tempfile.mkstemp()
os.close(fd)
r["mkstemp"] = p
print("TMP=" + json.dumps(r))
"#;

#[tokio::test]
async fn tmp_is_the_processs_own_temporary_directory() {
    // Workspace, runtime and stored state (where the kept venv lies, bound
    // at its own path) outside /tmp: /tmp is a link to TMPDIR.
    let place = outside_tmp();
    let ws = place.path().join("ws");
    let run = place.path().join("run");
    let state = place.path().join("state");
    for d in [&ws, &run, &state] {
        std::fs::create_dir(d).expect("mkdir");
    }
    let server = StdioServer::launch(
        Launch::new(&["--workdir", path_str(&ws)])
            .without_workdir_flag()
            .env("XDG_RUNTIME_DIR", &run)
            .env("XDG_STATE_HOME", &state),
    )
    .await;
    let r = json_line(&cell(server.peer(), "default", TMP_PROBE).await, "TMP");
    let tmpdir = r["tmpdir"].as_str().expect("TMPDIR");
    assert_eq!(r["link"], tmpdir, "/tmp links to the TMPDIR: {r}");
    assert_eq!(r["write"], "ok", "/tmp is writable: {r}");
    assert_eq!(r["in_tmpdir"], true, "/tmp/view-x is in the TMPDIR: {r}");
    let out = job_ok(&server, "echo hi > /tmp/view-y && cat \"$TMPDIR/view-y\"").await;
    assert_eq!(out.str_field("stdout").trim(), "hi", "{out:#?}");
    drop(server);

    // The default test workspace lies in the host's temporary directory:
    // /tmp is then a read-only directory on the way to it, and temporary
    // files still go to TMPDIR.
    let server = StdioServer::start(&[]).await;
    let ws = server.workdir.path().canonicalize().expect("canonical ws");
    let r = json_line(&cell(server.peer(), "default", TMP_PROBE).await, "TMP");
    let tmpdir = r["tmpdir"].as_str().expect("TMPDIR");
    assert!(
        r["mkstemp"]
            .as_str()
            .is_some_and(|p| Path::new(p).starts_with(tmpdir)),
        "tempfile makes its files in the TMPDIR: {r}"
    );
    if ws.starts_with("/tmp") || Path::new(tmpdir).starts_with("/tmp") {
        assert_eq!(r["link"], Value::Null, "/tmp is a directory here: {r}");
        assert_ne!(r["write"], "ok", "that /tmp is read-only: {r}");
    } else {
        assert_eq!(r["link"], tmpdir, "/tmp links to the TMPDIR: {r}");
    }
}
