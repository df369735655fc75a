//! Attacks found in review of the first hardening: a planted launcher, an
//! interpreter on the operator's PATH inside the workspace, ferrepl's state
//! inside the workspace, a home hidden only through `$HOME`, the file tools
//! under `--sandbox read-only`, host sockets outside /tmp and /run.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::support::{
    ATTEMPT, Launch, StdioServer, assert_failed, path_str, py, py_path, server_binary,
    server_command, system_python, unique,
};

/// A server started from `binary` (the one built, or a copy of it) with
/// `--workdir workdir` and extra arguments and environment, with the full
/// tool surface.
async fn start(binary: &Path, workdir: &Path, args: &[&str], env: &[(&str, &str)]) -> StdioServer {
    let mut all = vec!["--workdir", path_str(workdir)];
    all.extend_from_slice(args);
    StdioServer::launch(
        Launch::new(&all)
            .binary(binary)
            .envs(env)
            .without_workdir_flag(),
    )
    .await
}

/// A directory outside every workspace that the test (not a session) can
/// write.
fn outside() -> tempfile::TempDir {
    super::args::outside_dir()
}

#[tokio::test]
async fn a_planted_launcher_is_never_run() {
    let ws = tempfile::tempdir().expect("workspace");
    let bin = ws.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    let copy = bin.join("ferrepl");
    std::fs::copy(server_binary(), &copy).expect("copy the binary");
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
    let system = system_python();
    let server = start(
        server_binary(),
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
        server_command()
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

/// The home directory of the user running the test, from the password
/// database (getpwuid_r: other test threads may use it at the same time).
fn real_home() -> PathBuf {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getpwuid_r writes only into `pw` and `buf` (of the length
    // given); `found` points into them and is read before they go away.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            libc::geteuid(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        );
        assert!(rc == 0 && !found.is_null(), "no passwd entry for this user");
        let dir = std::ffi::CStr::from_ptr((*found).pw_dir);
        PathBuf::from(dir.to_string_lossy().into_owned())
    }
}

#[tokio::test]
async fn the_home_is_hidden_even_when_home_is_not_set() {
    let ws = tempfile::tempdir().expect("workspace");
    let home = real_home();
    let system = system_python();
    let cmd_env = [("HOME", "/nonexistent-home-for-test")];
    let server = start(
        server_binary(),
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
    let server = start(server_binary(), ws.path(), &["--sandbox", "read-only"], &[]).await;
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
    let server = start(server_binary(), ws.path(), &[], &[]).await;
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

/// A new pseudo-terminal (master, slave), both close-on-exec: the other
/// tests of the binary start processes at the same time, and none of them
/// may inherit this terminal.
fn open_pty() -> (OwnedFd, OwnedFd) {
    // SAFETY: plain libc calls on descriptors this function owns; each
    // result is checked before it is used, and every descriptor is wrapped
    // in an OwnedFd at once.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(
            master >= 0,
            "posix_openpt: {}",
            std::io::Error::last_os_error()
        );
        let master = OwnedFd::from_raw_fd(master);
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0, "grantpt");
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0, "unlockpt");
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(
            libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()),
            0,
            "ptsname_r"
        );
        let slave = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        assert!(
            slave >= 0,
            "open the pty slave: {}",
            std::io::Error::last_os_error()
        );
        (master, OwnedFd::from_raw_fd(slave))
    }
}

#[tokio::test]
async fn sessions_cannot_reach_the_servers_controlling_terminal() {
    // The server gets a terminal of its own as controlling terminal, as
    // when an agent CLI runs it from the user's terminal. It inherits both
    // ends (as it would from openpty); no other process does.
    let (master, slave) = open_pty();
    let (master_fd, slave_fd) = (master.as_raw_fd(), slave.as_raw_fd());
    // SAFETY: only async-signal-safe calls (setsid, ioctl, fcntl) between
    // fork and exec.
    let launch = unsafe {
        Launch::new(&[]).pre_exec(move || {
            if libc::setsid() < 0
                || libc::ioctl(slave_fd, libc::TIOCSCTTY, 0) < 0
                || libc::fcntl(master_fd, libc::F_SETFD, 0) < 0
                || libc::fcntl(slave_fd, libc::F_SETFD, 0) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let server = StdioServer::launch(launch).await;
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
    drop((master, slave));
}
