//! /dev is minimal, and pty jobs are out of reach of other sessions and jobs.

use std::collections::BTreeSet;

use serde_json::json;

use crate::support::{
    ATTEMPT, StdioServer, ToolOutput, assert_failed, assert_succeeded, errno_of, job_python,
    json_line, outcome, py, run_cell, run_job, unique,
};

use super::*;

/// What a sandbox's /dev may hold.
const DEV_ALLOWED: &[&str] = &[
    "null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd", "stdin",
    "stdout", "stderr", "console",
];

/// Host devices that must be absent or unopenable.
const DEV_FORBIDDEN: &[&str] = &[
    "/dev/kmsg",
    "/dev/mem",
    "/dev/kmem",
    "/dev/port",
    "/dev/loop0",
    "/dev/loop-control",
    "/dev/net/tun",
    "/dev/sda",
    "/dev/vda",
    "/dev/nvme0n1",
    "/dev/kvm",
    "/dev/fuse",
];

#[tokio::test]
async fn dev_is_minimal() {
    let mut server = StdioServer::start(&[]).await;
    let mut probes = String::new();
    for dev in DEV_FORBIDDEN {
        probes.push_str(&format!(
            "attempt({d}, lambda: os.close(os.open({d}, os.O_RDONLY | os.O_NONBLOCK)))\n",
            d = py(dev)
        ));
    }
    let code = format!(
        r#"{ATTEMPT}
import json
print("DEV=" + json.dumps(sorted(os.listdir("/dev"))))
{probes}
def write_null():
    with open("/dev/null", "wb") as f:
        return f.write(b"x")
def read(path):
    with open(path, "rb") as f:
        return len(f.read(8))
attempt("null", write_null)
attempt("zero", lambda: read("/dev/zero"))
attempt("urandom", lambda: read("/dev/urandom"))
"#
    );
    let out = run_cell(&server, "default", &code).await;
    let allowed: BTreeSet<String> = DEV_ALLOWED.iter().map(|s| s.to_string()).collect();
    let listed = string_set(&json_line(&out, "DEV"));
    let extra: Vec<&String> = listed.difference(&allowed).collect();
    assert!(
        extra.is_empty(),
        "the session's /dev holds more than the minimal set: {extra:?} (all: {listed:?})"
    );
    for dev in DEV_FORBIDDEN {
        assert_failed(&out, dev, "the device is not in a minimal /dev");
    }
    for ok in ["null", "zero", "urandom"] {
        assert_succeeded(&out, ok);
    }

    // A shell job's /dev likewise.
    let job = run_job(&server, json!({ "command": "ls -A /dev" })).await;
    let job_listed: BTreeSet<String> = job
        .str_field("stdout")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let extra: Vec<&String> = job_listed.difference(&allowed).collect();
    assert!(
        extra.is_empty(),
        "a job's /dev holds more than the minimal set: {extra:?} (all: {job_listed:?})"
    );

    server.assert_alive();
    server.close_and_wait().await;
}

// ------------------------------------------------------------------ 11. ptys

/// Python that opens `tty` (O_RDWR, no controlling tty) and, if it could,
/// TIOCSTIs `inject` into it, printing `open: OK '<st_dev>:<major>:<minor>'`
/// (hex numbers, as `stat -c %d:%t:%T`) and `tiocsti: ...`.
fn pty_attack(tty: &str, inject: &str) -> String {
    format!(
        r#"{ATTEMPT}
import fcntl, termios
fd = None
def open_tty():
    global fd
    fd = os.open({tty}, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    st = os.fstat(fd)
    return f"{{st.st_dev}}:{{os.major(st.st_rdev):x}}:{{os.minor(st.st_rdev):x}}"
print("", flush=True)
attempt("open", open_tty)
if fd is None:
    print("tiocsti: SKIP", flush=True)
else:
    def sti():
        for ch in ({inject} + "\n").encode():
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
        return "injected"
    attempt("tiocsti", sti)
    os.close(fd)
"#,
        tty = py(tty),
        inject = py(inject),
    )
}

/// The attack on job A's terminal failed: it could not be opened, or what
/// was opened is another terminal and TIOCSTI was refused with EPERM.
fn assert_pty_attack_failed(who: &str, out: &ToolOutput, a_device: &str) {
    let opened = outcome(out, "open");
    if let Some(device) = opened.strip_prefix("OK ") {
        assert_ne!(
            device.trim_matches('\''),
            a_device,
            "{who} opened job A's terminal itself (it could read what is typed there): {out:#?}"
        );
        let sti = outcome(out, "tiocsti");
        assert!(
            errno_of(&sti) == Some(libc::EPERM),
            "{who}: TIOCSTI should fail with EPERM, got '{sti}': {out:#?}"
        );
    }
}

#[tokio::test]
async fn pty_jobs_are_out_of_reach_of_other_sessions_and_jobs() {
    let mut server = StdioServer::start(&[]).await;
    let inject = unique("INJECTED-");
    let sentinel = unique("END-");

    // Job A: a terminal waiting for input.
    let a = server
        .call(
            "shell_exec",
            json!({
                "command": "tty; stat -L -c 'ttydev=%d:%t:%T' /proc/self/fd/0; cat",
                "pty": true,
                "wait_s": 1,
            }),
        )
        .await;
    assert_eq!(a.structured["status"], "running", "{a:#?}");
    let a_job = a.str_field("job").to_string();
    let a_out = wait_job_output(&server, &a_job, |t| t.contains("ttydev=")).await;
    let line_of = |prefix: &str| {
        a_out
            .lines()
            .map(|l| l.trim())
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| {
                panic!("no line starting with {prefix} in job A's output: {a_out:?}")
            })
            .to_string()
    };
    let tty = line_of("/dev/");
    let a_device = line_of("ttydev=").trim_start_matches("ttydev=").to_string();

    // Session B tries to open it and inject keystrokes.
    let b = run_cell(&server, "b", &pty_attack(&tty, &inject)).await;
    assert_pty_attack_failed("session b", &b, &a_device);

    // Job C, on a terminal of its own, tries the same.
    let script = server.workdir.path().join("pty_attack.py");
    std::fs::write(&script, pty_attack(&tty, &inject)).expect("write the attack script");
    let c = run_job(
        &server,
        json!({
            "command": format!("{} {}", job_python(), script.display()),
            "pty": true,
        }),
    )
    .await;
    assert_pty_attack_failed("job c", &c, &a_device);

    // Anything injected sits in A's input before this line: once cat has
    // echoed the sentinel (the terminal echo, then cat's copy), the output
    // shows everything that reached A.
    let typed = server
        .call("shell_wait", json!({ "job": a_job, "input": sentinel }))
        .await;
    assert!(!typed.is_error, "input to job A failed: {typed:#?}");
    let a_out = wait_job_output(&server, &a_job, |t| {
        t.matches(sentinel.as_str()).count() >= 2
    })
    .await;
    assert!(
        !a_out.contains(&inject),
        "keystrokes injected from another session or job reached job A: {a_out:?}"
    );

    let _ = server
        .call("shell_wait", json!({ "job": a_job, "signal": "KILL" }))
        .await;
    server.assert_alive();
    server.close_and_wait().await;
}
