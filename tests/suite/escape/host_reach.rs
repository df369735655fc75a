//! What of the host a session cannot reach besides its files: the user's
//! home when only `$HOME` would say where it is, host sockets outside /tmp
//! and /run, and the terminal the server was started from.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::{
    ATTEMPT, Launch, StdioServer, assert_failed, py, py_path, server_binary, system_python, unique,
};

use super::planted::start;

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
