//! Sessions and shell jobs hold no privilege, whoever runs the server: no
//! capabilities (every set empty) and `no_new_privs`; only `AF_UNIX` sockets
//! with the network off; no new namespaces; no device nodes; no TIOCSTI; no
//! fanotify, keyrings, hostname or clock changes; and the metadata of files
//! outside the workspace (mode, owner, times, xattrs) cannot be changed.
//!
//! Every attack runs in a real server (default flags plus `--workdir`)
//! through an MCP client: in `python_exec` cells and in `shell_exec` jobs.
//! Each assertion holds both when the tests run as root and as an ordinary
//! user. Syscalls Python 3.11 has no wrapper for go through ctypes, and every
//! outcome is printed by the cell as `label: OK <repr>` or
//! `label: <ExceptionType> errno=<n>`.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::{
    StdioServer, ToolOutput, assert_failed, assert_succeeded, errno_of, is_root, job_python,
    outcome, py_path, run_cell, run_job, unique,
};

// ------------------------------------------------------------------ helpers

/// Python prelude of the probing cells: `attempt(label, fn)` prints one line
/// `label: OK <repr>` or `label: <ExceptionType> errno=<n>`; `check(ret)`
/// turns a ctypes `-1` into the `OSError` of `errno`; `libc` and `NR` (the
/// syscall numbers of this architecture) are ready.
const PRELUDE: &str = r#"
import ctypes, os, platform
def attempt(label, fn):
    try:
        r = fn()
        print(f"{label}: OK {r!r}", flush=True)
    except BaseException as e:
        print(f"{label}: {type(e).__name__} errno={getattr(e, 'errno', None)}", flush=True)
libc = ctypes.CDLL(None, use_errno=True)
def check(ret):
    if ret == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return ret
NR = {
    "x86_64": {"clone": 56, "settimeofday": 164, "add_key": 248, "keyctl": 250},
    "aarch64": {"clone": 220, "settimeofday": 170, "add_key": 217, "keyctl": 219},
}.get(platform.machine())
"#;

/// Panics unless `label` failed with one of `errnos`.
fn assert_errno(out: &ToolOutput, label: &str, errnos: &[i32]) {
    let got = outcome(out, label);
    assert!(
        !got.starts_with("OK") && errno_of(&got).is_some_and(|e| errnos.contains(&e)),
        "'{label}' should have failed with errno in {errnos:?}, got '{got}'; result: {out:#?}"
    );
}

// ------------------------------------------------------------------ 1. capabilities

/// Problems with the `Cap*` and `NoNewPrivs` lines of `/proc/<pid>/status`
/// printed by `who` (lines `"<who> CapEff:\t0000..."`).
pub(super) fn privilege_problems(text: &str, who: &str) -> Vec<String> {
    let prefix = format!("{who} ");
    let fields: Vec<(String, String)> = text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut problems = Vec::new();
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        match fields.iter().find(|(k, _)| k == set) {
            Some((_, v)) if v == "0000000000000000" => {}
            Some((_, v)) => problems.push(format!("{who}: {set} is {v}")),
            None => problems.push(format!("{who}: no {set} line")),
        }
    }
    match fields.iter().find(|(k, _)| k == "NoNewPrivs") {
        Some((_, v)) if v == "1" => {}
        Some((_, v)) => problems.push(format!("{who}: NoNewPrivs is {v}")),
        None => problems.push(format!("{who}: no NoNewPrivs line")),
    }
    problems
}

#[tokio::test]
async fn sessions_and_jobs_have_no_capabilities_and_no_new_privs() {
    let mut server = StdioServer::start(&[]).await;

    // The interpreter itself, and a program it execs (an exec as root would
    // regain capabilities from the bounding set if it were not empty).
    let cell = r#"
import subprocess
def fields(text):
    return [l for l in text.splitlines() if l.startswith(("Cap", "NoNewPrivs"))]
for l in fields(open("/proc/self/status").read()):
    print("session", l)
child = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
for l in fields(child):
    print("exec", l)
"#;
    let out = run_cell(&server, "default", cell).await;
    let stdout = out.str_field("stdout").to_string();
    let mut problems = privilege_problems(&stdout, "session");
    problems.extend(privilege_problems(&stdout, "exec"));

    // The job's shell, and a program it runs.
    let job = run_job(
        &server,
        json!({ "command":
            "grep -E '^(Cap|NoNewPrivs)' /proc/$$/status | sed 's/^/shell /'; \
             grep -E '^(Cap|NoNewPrivs)' /proc/self/status | sed 's/^/child /'" }),
    )
    .await;
    let job_stdout = job.str_field("stdout").to_string();
    problems.extend(privilege_problems(&job_stdout, "shell"));
    problems.extend(privilege_problems(&job_stdout, "child"));

    assert!(
        problems.is_empty(),
        "sessions and jobs must hold no capability and have no_new_privs set: {problems:#?}\n\
         session:\n{stdout}\njob:\n{job_stdout}"
    );
    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 2. sockets

#[tokio::test]
async fn only_unix_sockets_can_be_created() {
    let mut server = StdioServer::start(&[]).await;
    let sock_path = server.workdir.path().join("probe.sock");
    let code = format!(
        r#"{PRELUDE}
import socket
def make(family, kind, proto=0):
    s = socket.socket(family, kind, proto)
    s.close()
    return "created"
attempt("packet", lambda: make(socket.AF_PACKET, socket.SOCK_RAW, 0))
attempt("packet_dgram", lambda: make(socket.AF_PACKET, socket.SOCK_DGRAM, 0))
attempt("netlink_route", lambda: make(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("tcp4", lambda: make(socket.AF_INET, socket.SOCK_STREAM))
attempt("udp4", lambda: make(socket.AF_INET, socket.SOCK_DGRAM))
attempt("raw4", lambda: make(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("tcp6", lambda: make(socket.AF_INET6, socket.SOCK_STREAM))
attempt("udp6", lambda: make(socket.AF_INET6, socket.SOCK_DGRAM))
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.sendall(b"hi")
    got = b.recv(2)
    a.close(); b.close()
    return got
def named():
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind({sock})
    srv.listen(1)
    cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cli.connect({sock})
    conn, _ = srv.accept()
    cli.sendall(b"yo")
    got = conn.recv(2)
    for s in (conn, cli, srv):
        s.close()
    os.unlink({sock})
    return got
attempt("unix_pair", pair)
attempt("unix_named", named)
"#,
        sock = py_path(&sock_path),
    );
    let out = run_cell(&server, "default", &code).await;

    let refused = [libc::EPERM, libc::EACCES, libc::EAFNOSUPPORT];
    for label in [
        "packet",
        "packet_dgram",
        "netlink_route",
        "tcp4",
        "udp4",
        "raw4",
        "tcp6",
        "udp6",
    ] {
        assert_errno(&out, label, &refused);
    }
    assert_eq!(outcome(&out, "unix_pair"), "OK b'hi'", "{out:#?}");
    assert_eq!(outcome(&out, "unix_named"), "OK b'yo'", "{out:#?}");

    server.assert_alive();
    server.close_and_wait().await;
}

/// `IFF_UP` of the host's loopback, as the test process sees it.
fn host_lo_is_up() -> Option<bool> {
    let flags = std::fs::read_to_string("/sys/class/net/lo/flags").ok()?;
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).ok()?;
    Some(flags & libc::IFF_UP as u32 != 0)
}

fn find_ip() -> Option<PathBuf> {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

#[tokio::test]
async fn a_job_cannot_take_the_hosts_loopback_down() {
    let Some(ip) = find_ip() else {
        eprintln!("no `ip` on this machine: only the socket test covers netlink");
        return;
    };
    let was_up = host_lo_is_up();
    let mut server = StdioServer::start(&[]).await;

    let job = server
        .call(
            "shell_exec",
            json!({ "command": format!("{} link set lo down; echo rc=$?", ip.display()) }),
        )
        .await;
    let now_up = host_lo_is_up();
    // Undo the damage at once (only possible, and only needed, as root on
    // code where the attack works), before asserting anything.
    if was_up == Some(true) && now_up == Some(false) && is_root() {
        let _ = std::process::Command::new(&ip)
            .args(["link", "set", "lo", "up"])
            .status();
    }

    assert_eq!(job.structured["status"], "exited", "{job:#?}");
    let stdout = job.str_field("stdout");
    let rc = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("rc="))
        .unwrap_or_else(|| panic!("no rc= line in the job's output: {job:#?}"));
    assert_ne!(rc, "0", "`ip link set lo down` worked in a job: {job:#?}");
    assert_eq!(
        now_up, was_up,
        "the host's loopback changed state (IFF_UP {was_up:?} -> {now_up:?}) after the job: {job:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 3. namespaces

#[tokio::test]
async fn no_new_namespaces_can_be_made() {
    let mut server = StdioServer::start(&[]).await;
    let code = format!(
        r#"{PRELUDE}
FLAGS = {{
    "user": 0x10000000, "mount": 0x00020000, "net": 0x40000000,
    "pid": 0x20000000, "ipc": 0x08000000, "uts": 0x04000000, "cgroup": 0x02000000,
}}
for name, flag in FLAGS.items():
    attempt("unshare_" + name, lambda flag=flag: check(libc.unshare(flag)))
def clone(flag):
    # A fork-like clone (no new stack) into a new namespace; the child
    # leaves at once without running any more Python.
    pid = libc.syscall(NR["clone"], flag | 17, 0, 0, 0, 0)  # 17: SIGCHLD
    if pid == 0:
        libc._exit(0)
    check(pid)
    os.waitpid(pid, 0)
    return "cloned"
for name in ("user", "net", "mount"):
    if NR is None:
        print(f"clone_{{name}}: SKIP")
    else:
        attempt("clone_" + name, lambda name=name: clone(FLAGS[name]))
"#
    );
    let out = run_cell(&server, "default", &code).await;
    for name in ["user", "mount", "net", "pid", "ipc", "uts", "cgroup"] {
        assert_errno(&out, &format!("unshare_{name}"), &[libc::EPERM]);
    }
    for name in ["user", "net", "mount"] {
        let label = format!("clone_{name}");
        if outcome(&out, &label) != "SKIP" {
            assert_errno(&out, &label, &[libc::EPERM]);
        }
    }
    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 4. devices

#[tokio::test]
async fn no_device_nodes_but_fifos_work() {
    let mut server = StdioServer::start(&[]).await;
    let ws = server.workdir.path().to_path_buf();
    let chr = ws.join("dev0");
    let blk = ws.join("dev1");
    let fifo = ws.join("fifo0");
    let code = format!(
        r#"{PRELUDE}
import stat
attempt("mknod_chr", lambda: os.mknod({chr}, stat.S_IFCHR | 0o600, os.makedev(1, 5)))
attempt("mknod_blk", lambda: os.mknod({blk}, stat.S_IFBLK | 0o600, os.makedev(7, 0)))
attempt("mkfifo", lambda: os.mkfifo({fifo}, 0o600))
"#,
        chr = py_path(&chr),
        blk = py_path(&blk),
        fifo = py_path(&fifo),
    );
    let out = run_cell(&server, "default", &code).await;

    assert_errno(&out, "mknod_chr", &[libc::EPERM, libc::EACCES]);
    assert_errno(&out, "mknod_blk", &[libc::EPERM, libc::EACCES]);
    for node in [&chr, &blk] {
        assert!(
            std::fs::symlink_metadata(node).is_err(),
            "a device node {} was made in the workspace",
            node.display()
        );
    }
    assert_succeeded(&out, "mkfifo");
    let meta = std::fs::symlink_metadata(&fifo).expect("the FIFO the cell made");
    assert!(
        meta.file_type().is_fifo(),
        "{} is not a FIFO",
        fifo.display()
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 5. TIOCSTI

#[tokio::test]
async fn a_pty_job_cannot_inject_keystrokes_with_tiocsti() {
    let mut server = StdioServer::start(&[]).await;
    let script = server.workdir.path().join("tiocsti_probe.py");
    std::fs::write(
        &script,
        r#"import fcntl, os, termios
print("isatty=%s ctty=%s" % (os.isatty(0), os.ttyname(0) if os.isatty(0) else None), flush=True)
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x")
    print("\ntiocsti: OK", flush=True)  # after the echoed "x", if any
except OSError as e:
    print("\ntiocsti: %s errno=%s" % (type(e).__name__, e.errno), flush=True)
"#,
    )
    .expect("write the probe script");

    let job = run_job(
        &server,
        json!({
            "command": format!("{} {}", job_python(), script.display()),
            "pty": true,
        }),
    )
    .await;
    assert_eq!(job.structured["pty"], json!(true), "{job:#?}");
    let stdout = job.str_field("stdout");
    assert!(
        stdout.contains("isatty=True"),
        "the probe's stdin must be the job's terminal for the test to mean anything: {job:#?}"
    );
    // EPERM, not EIO/ENOTTY: the ioctl is refused as such.
    assert_errno(&job, "tiocsti", &[libc::EPERM]);

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 6. kernel facilities

#[tokio::test]
async fn no_fanotify_keyrings_hostname_or_clock_changes() {
    let mut server = StdioServer::start(&[]).await;
    let code = format!(
        r#"{PRELUDE}
import socket
def fan(flags):
    fd = check(libc.fanotify_init(flags, os.O_RDONLY))
    os.close(fd)
    return "initialised"
attempt("fanotify", lambda: fan(0))            # FAN_CLASS_NOTIF
attempt("fanotify_fid", lambda: fan(0x200))    # FAN_CLASS_NOTIF | FAN_REPORT_FID
if NR is None:
    print("keyctl: SKIP"); print("add_key: SKIP")
else:
    # KEYCTL_GET_KEYRING_ID of KEY_SPEC_SESSION_KEYRING, creating it.
    attempt("keyctl", lambda: check(libc.syscall(NR["keyctl"], 0, -3, 1)))
    # A "user" key in KEY_SPEC_PROCESS_KEYRING.
    attempt("add_key", lambda: check(libc.syscall(NR["add_key"], b"user", b"ferrepl-escape", b"x", 1, -2)))
# The same name again: a privilege probe that changes nothing if it works.
name = socket.gethostname().encode()
attempt("sethostname", lambda: check(libc.sethostname(name, len(name))))
class timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
def settime():
    ts = timespec()
    check(libc.clock_gettime(0, ctypes.byref(ts)))          # CLOCK_REALTIME
    return check(libc.clock_settime(0, ctypes.byref(ts)))   # back to "now"
attempt("clock_settime", settime)
# Both NULL: only the permission check, nothing would change (the raw
# syscall: glibc's wrapper dereferences a NULL tv).
if NR is None:
    print("settimeofday: SKIP")
else:
    attempt("settimeofday", lambda: check(libc.syscall(NR["settimeofday"], None, None)))
"#
    );
    let out = run_cell(&server, "default", &code).await;
    let refused = [libc::EPERM, libc::EACCES];
    for label in ["fanotify", "fanotify_fid", "sethostname", "clock_settime"] {
        assert_errno(&out, label, &refused);
    }
    for label in ["keyctl", "add_key", "settimeofday"] {
        if outcome(&out, label) != "SKIP" {
            assert_errno(&out, label, &refused);
        }
    }
    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 7. metadata outside the workspace

/// A decoy directory outside the workspace, removed when dropped.
struct Decoy {
    dir: PathBuf,
}

impl Drop for Decoy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `user.*` extended attribute names of `path`, seen from the test.
fn xattr_names(path: &Path) -> Vec<String> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("a path without NUL");
    let mut buf = vec![0u8; 4096];
    // SAFETY: c_path is NUL-terminated; buf is valid for buf.len() bytes.
    let n = unsafe { libc::listxattr(c_path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Vec::new();
    }
    buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|name| !name.is_empty())
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect()
}

#[tokio::test]
async fn metadata_outside_the_workspace_cannot_be_changed() {
    use std::os::unix::fs::PermissionsExt;

    // A system-wide place outside the workspace (and outside the temporary
    // directory the sandbox hides anyway), else the temporary directory.
    let name = unique("ferrepl-escape-");
    let dir = [PathBuf::from("/var/tmp"), std::env::temp_dir()]
        .into_iter()
        .map(|base| base.join(&name))
        .find(|dir| std::fs::create_dir(dir).is_ok())
        .expect("create a decoy directory under /var/tmp or the temporary directory");
    let decoy_guard = Decoy { dir: dir.clone() };
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let decoy = dir.join("decoy");
    std::fs::write(&decoy, "decoy\n").expect("write the decoy");
    std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o644))
        .expect("chmod the decoy");
    if is_root() {
        // Owned by someone else, so that a chown to root is visible.
        std::os::unix::fs::chown(&decoy, Some(65534), Some(65534)).expect("chown the decoy");
    }
    let before = std::fs::metadata(&decoy).expect("stat the decoy");
    let xattrs_before = xattr_names(&decoy);

    let mut server = StdioServer::start(&[]).await;
    let code = format!(
        r#"{PRELUDE}
decoy = {decoy}
attempt("visible", lambda: os.stat(decoy).st_mode)
attempt("chmod", lambda: os.chmod(decoy, 0o4777))
attempt("chown", lambda: os.chown(decoy, 0, 0))
attempt("utime", lambda: os.utime(decoy, (0, 0)))
attempt("setxattr", lambda: os.setxattr(decoy, "user.x", b"1"))
"#,
        decoy = py_path(&decoy),
    );
    let out = run_cell(&server, "default", &code).await;

    let after = std::fs::metadata(&decoy).expect("stat the decoy after the cell");
    for label in ["chmod", "chown", "utime", "setxattr"] {
        assert_failed(&out, label, "metadata outside the workspace is read-only");
    }
    assert_eq!(
        after.mode(),
        before.mode(),
        "the decoy's mode changed: {out:#?}"
    );
    assert_eq!(
        (after.uid(), after.gid()),
        (before.uid(), before.gid()),
        "the decoy's owner changed: {out:#?}"
    );
    assert_eq!(
        (
            after.mtime(),
            after.mtime_nsec(),
            after.ctime(),
            after.ctime_nsec()
        ),
        (
            before.mtime(),
            before.mtime_nsec(),
            before.ctime(),
            before.ctime_nsec()
        ),
        "the decoy's times changed (mtime, or ctime: some metadata change worked): {out:#?}"
    );
    assert_eq!(
        xattr_names(&decoy),
        xattrs_before,
        "the decoy's extended attributes changed: {out:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
    drop(decoy_guard);
}
