//! Attacks found in review of the first hardening: a planted launcher, an
//! interpreter on the operator's PATH inside the workspace, ferrepl's state
//! inside the workspace, a home hidden only through `$HOME`, the file tools
//! under `--sandbox read-only`, host sockets outside /tmp and /run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rmcp::ServiceExt;
use serde_json::json;

use crate::args::{ATTEMPT, assert_failed, py, py_path, unique};
use crate::common::{self, Client, START_TIMEOUT, ToolOutput};

/// A server started from `binary` with extra arguments and environment.
struct Server {
    client: Client,
    child: tokio::process::Child,
}

async fn start(binary: &Path, workdir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut cmd = tokio::process::Command::new(binary);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("FERREPL_") {
            cmd.env_remove(key);
        }
    }
    // Every tool group and structured results, as in tests/common.
    cmd.envs(common::FULL_SURFACE_ENV.iter().copied())
        .arg("--workdir")
        .arg(workdir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn ferrepl");
    let stdout = child.stdout.take().expect("stdout");
    let stdin = child.stdin.take().expect("stdin");
    let client = tokio::time::timeout(START_TIMEOUT, ().serve((stdout, stdin)))
        .await
        .expect("initialize in time")
        .expect("initialize");
    Server { client, child }
}

impl Server {
    async fn call(&self, tool: &str, args: serde_json::Value) -> ToolOutput {
        common::call(self.client.peer(), tool, args).await
    }
}

/// A directory outside every workspace that the test (not a session) can
/// write.
fn outside() -> tempfile::TempDir {
    crate::args::outside_dir()
}

#[tokio::test]
async fn a_planted_launcher_is_never_run() {
    let ws = tempfile::tempdir().expect("workspace");
    let bin = ws.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    let copy = bin.join("ferrepl");
    std::fs::copy(env!("CARGO_BIN_EXE_ferrepl"), &copy).expect("copy the binary");
    let marks = outside();
    let marker = marks.path().join("planted-ran");
    let server = start(&copy, ws.path(), &[], &[]).await;

    // The binary the server runs from is deleted and a program planted
    // under the name /proc/self/exe then shows.
    let plant = format!(
        "rm bin/ferrepl && printf '#!/bin/sh\\necho ran > {}\\nexit 1\\n' > 'bin/ferrepl (deleted)' && chmod +x 'bin/ferrepl (deleted)'",
        marker.display()
    );
    let planted = server
        .call("shell_exec", json!({ "command": plant, "wait_s": 20 }))
        .await;
    assert!(!planted.is_error, "planting failed: {planted:#?}");
    assert!(ws.path().join("bin/ferrepl (deleted)").is_file());

    let next = server
        .call(
            "shell_exec",
            json!({ "command": "echo still-sandboxed", "wait_s": 20 }),
        )
        .await;
    assert!(
        !next.is_error && next.text.contains("still-sandboxed"),
        "jobs still start through the real launcher: {next:#?}"
    );
    let session = server
        .call("python_exec", json!({ "code": "1+1", "session": "fresh" }))
        .await;
    assert!(!session.is_error, "{session:#?}");
    assert!(
        !marker.exists(),
        "the planted launcher ran outside the sandbox"
    );
    drop(server.child);
}

#[tokio::test]
async fn an_interpreter_on_path_inside_the_workspace_is_not_run_at_start() {
    let ws = tempfile::tempdir().expect("workspace");
    let marks = outside();
    let marker = marks.path().join("python-ran");
    let evil = ws.path().join("evil");
    std::fs::create_dir(&evil).expect("mkdir");
    let script = evil.join("python3");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho ran > {}\nexit 1\n", marker.display()),
    )
    .expect("write the fake python3");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path = format!(
        "{}:{}",
        evil.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let system = crate::args::system_python();
    let server = start(
        Path::new(env!("CARGO_BIN_EXE_ferrepl")),
        ws.path(),
        &["--python", system.to_str().expect("utf-8")],
        &[("PATH", path.as_str())],
    )
    .await;
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "{status:#?}");
    assert!(
        !marker.exists(),
        "the server ran an interpreter from the workspace outside the sandbox"
    );
    drop(server.child);
}

#[tokio::test]
async fn the_state_directory_may_not_lie_in_the_workspace() {
    let ws = tempfile::tempdir().expect("workspace");
    let tmp = ws.path().join("t");
    std::fs::create_dir(&tmp).expect("mkdir");
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        common::server_command()
            .arg("--workdir")
            .arg(ws.path())
            .env("TMPDIR", &tmp)
            .env_remove("XDG_RUNTIME_DIR")
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("the server answers in time")
    .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must refuse to start: {stderr}");
    assert!(
        stderr.contains("contains") && stderr.contains("--workdir"),
        "the refusal says why and what to do: {stderr}"
    );
}

fn real_home() -> PathBuf {
    // SAFETY: getpwuid's result is read at once; the test is the only user.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        assert!(!pw.is_null(), "no passwd entry for this user");
        let dir = std::ffi::CStr::from_ptr((*pw).pw_dir);
        PathBuf::from(dir.to_string_lossy().into_owned())
    }
}

#[tokio::test]
async fn the_home_is_hidden_even_when_home_is_not_set() {
    let ws = tempfile::tempdir().expect("workspace");
    let home = real_home();
    let system = crate::args::system_python();
    let cmd_env = [("HOME", "/nonexistent-home-for-test")];
    let server = start(
        Path::new(env!("CARGO_BIN_EXE_ferrepl")),
        ws.path(),
        &["--python", system.to_str().expect("utf-8")],
        &cmd_env,
    )
    .await;
    let code = format!(
        "{ATTEMPT}\nimport os\nattempt('home', lambda: os.listdir({}))\nattempt('homes', lambda: os.listdir('/home'))\n",
        py_path(&home)
    );
    let out = server.call("python_exec", json!({ "code": code })).await;
    assert!(!out.is_error, "{out:#?}");
    assert_failed(&out, "home", "the user's real home is hidden");
    assert_failed(&out, "homes", "every home is hidden");
    drop(server.child);
}

#[tokio::test]
async fn read_only_mode_covers_the_file_tools() {
    let ws = tempfile::tempdir().expect("workspace");
    let server = start(
        Path::new(env!("CARGO_BIN_EXE_ferrepl")),
        ws.path(),
        &["--sandbox", "read-only"],
        &[],
    )
    .await;
    std::fs::write(ws.path().join("keep.txt"), "keep").expect("write");
    let write = server
        .call("file_write", json!({ "path": "new.txt", "text": "x" }))
        .await;
    assert!(
        write.is_error && write.text.contains("read-only"),
        "{write:#?}"
    );
    let delete = server
        .call("file_delete", json!({ "path": "keep.txt" }))
        .await;
    assert!(delete.is_error, "{delete:#?}");
    assert!(!ws.path().join("new.txt").exists());
    assert!(ws.path().join("keep.txt").exists());
    drop(server.child);
}

#[tokio::test]
async fn host_sockets_under_var_tmp_are_out_of_reach() {
    let name = unique("ferrepl-escape-");
    let path = Path::new("/var/tmp").join(format!("{name}.sock"));
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind a host socket");
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _cleanup = Remove(path.clone());
    let ws = tempfile::tempdir().expect("workspace");
    let server = start(
        Path::new(env!("CARGO_BIN_EXE_ferrepl")),
        ws.path(),
        &[],
        &[],
    )
    .await;
    let code = format!(
        "{ATTEMPT}\nimport socket\nattempt('connect', lambda: socket.socket(socket.AF_UNIX).connect({}))\n",
        py(path.to_str().expect("utf-8"))
    );
    let out = server.call("python_exec", json!({ "code": code })).await;
    assert!(!out.is_error, "{out:#?}");
    assert_failed(&out, "connect", "host sockets in /var/tmp are hidden");
    drop(listener);
    drop(server.child);
}

#[tokio::test]
async fn sessions_cannot_reach_the_servers_controlling_terminal() {
    // The server gets a terminal of its own as controlling terminal, as
    // when an agent CLI runs it from the user's terminal.
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors into our ints.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty failed");
    let ws = tempfile::tempdir().expect("workspace");
    let mut cmd = common::server_command();
    cmd.arg("--workdir")
        .arg(ws.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(slave, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn ferrepl");
    let stdout = child.stdout.take().expect("stdout");
    let stdin = child.stdin.take().expect("stdin");
    let client = tokio::time::timeout(START_TIMEOUT, ().serve((stdout, stdin)))
        .await
        .expect("initialize in time")
        .expect("initialize");
    let server = Server { client, child };
    let code =
        format!("{ATTEMPT}\nimport os\nattempt('tty', lambda: os.open('/dev/tty', os.O_WRONLY))\n");
    let cell = server.call("python_exec", json!({ "code": code })).await;
    assert!(!cell.is_error, "{cell:#?}");
    assert_failed(&cell, "tty", "the server's terminal is not the session's");
    let job = server
        .call(
            "shell_exec",
            json!({ "command": "echo injected > /dev/tty && echo opened", "wait_s": 20 }),
        )
        .await;
    assert!(
        !job.text.contains("opened"),
        "a job wrote to the server's terminal: {job:#?}"
    );
    drop(server.child);
    // SAFETY: closing the two descriptors openpty gave us.
    unsafe {
        libc::close(master);
        libc::close(slave);
    }
}
