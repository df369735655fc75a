//! A server started by hand in a terminal (issue 31): through a
//! pseudo-terminal it prints a short hint on stderr (what it is, how to
//! connect a client) and Ctrl-D or Ctrl-C ends it with exit code 0 and no
//! error; started with stdin a pipe (as clients start it) it prints no hint,
//! its stdout carries MCP messages only, and a client that closes stdin
//! before the handshake is no error either.

use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;

use crate::support::server_command_plain;

/// The hint's first words.
const HINT: &str = "ferrepl is an MCP server";
/// Start-up, up to serving stdin.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(15);

/// A server whose stdin is the terminal side of a pseudo-terminal (its
/// controlling terminal, as in a shell), stdout and stderr piped.
struct TerminalServer {
    child: Child,
    /// What a person types goes in here; kept open until the server exits.
    master: std::fs::File,
    stderr: Arc<Mutex<String>>,
    stdout: tokio::process::ChildStdout,
    _workdir: tempfile::TempDir,
}

impl TerminalServer {
    fn start() -> Self {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let workdir = tempfile::tempdir().expect("workdir");
        let slave: OwnedFd = pty.slave;
        let mut cmd = server_command_plain();
        cmd.arg("--workdir")
            .arg(workdir.path())
            .stdin(Stdio::from(slave))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // A session of its own with the terminal as its controlling
                // one, so that Ctrl-C reaches it as SIGINT.
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn ferrepl on a terminal");
        drop(cmd);
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = BufReader::new(child.stderr.take().expect("piped stderr"));
        let collected = stderr.clone();
        tokio::spawn(async move {
            let mut line = String::new();
            while pipe.read_line(&mut line).await.is_ok_and(|n| n > 0) {
                collected.lock().expect("stderr lock").push_str(&line);
                line.clear();
            }
        });
        TerminalServer {
            stdout: child.stdout.take().expect("piped stdout"),
            child,
            master: std::fs::File::from(pty.master),
            stderr,
            _workdir: workdir,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr lock").clone()
    }

    /// Waits until the server serves stdin (its tenant has started).
    async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        while !self.stderr().contains("tenant started") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the server did not start:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Types `bytes` at the terminal.
    fn type_keys(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.master.write_all(bytes).expect("write to the terminal");
    }

    /// The exit code, and everything the server wrote on stdout.
    async fn exit(mut self) -> (Option<i32>, Vec<u8>, String) {
        let status = tokio::time::timeout(EXIT_TIMEOUT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the server did not exit:\n{}", self.stderr()))
            .expect("wait for the server");
        let mut out = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(2), self.stdout.read_to_end(&mut out)).await;
        // The collector has read everything once the pipe is closed.
        tokio::time::sleep(Duration::from_millis(100)).await;
        (status.code(), out, self.stderr())
    }
}

/// The hint on stderr, then `key` at an empty line ends the server: exit
/// code 0, no ERROR, nothing on stdout.
async fn ended_by(key: u8) {
    let mut server = TerminalServer::start();
    server.wait_ready().await;
    let hint = server.stderr();
    for needle in [
        HINT,
        "waits for an MCP client on stdin",
        "ferrepl install --client",
        "claude-code",
        "ferrepl doctor",
        "ferrepl --help",
        "Ctrl-D",
    ] {
        assert!(hint.contains(needle), "the hint lacks {needle:?}:\n{hint}");
    }
    server.type_keys(&[key]);
    let (code, stdout, stderr) = server.exit().await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("ERROR"), "an error at the exit:\n{stderr}");
    assert!(
        stdout.is_empty(),
        "stdout carries MCP messages only: {:?}",
        String::from_utf8_lossy(&stdout)
    );
    // Short log lines: the sandbox's whole description waits for debug.
    let sandbox = stderr
        .lines()
        .find(|l| l.contains("sandbox: "))
        .unwrap_or_else(|| panic!("no sandbox line:\n{stderr}"));
    assert!(
        sandbox.len() <= 250 && !sandbox.contains("rlimits"),
        "the sandbox's whole description at info level: {sandbox}"
    );
}

#[tokio::test]
async fn a_terminal_start_prints_the_hint_and_ctrl_d_exits_quietly() {
    ended_by(0x04).await;
}

#[tokio::test]
async fn ctrl_c_in_the_terminal_exits_0() {
    ended_by(0x03).await;
}

/// Ctrl-C typed as soon as the hint shows, while the sessions start: the
/// signal is watched from the first step, so the server ends as it would
/// later (exit 0), not killed by SIGINT's default.
#[tokio::test]
async fn ctrl_c_while_starting_exits_0() {
    let mut server = TerminalServer::start();
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    while !server.stderr().contains(HINT) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no hint:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.type_keys(&[0x03]);
    let (code, stdout, stderr) = server.exit().await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.is_empty(), "{:?}", String::from_utf8_lossy(&stdout));
}

/// stdin a pipe: the handshake answered, no hint, every stdout line JSON,
/// exit 0 when the client closes stdin.
#[tokio::test]
async fn a_client_start_gets_no_hint_and_mcp_only_on_stdout() {
    let workdir = tempfile::tempdir().expect("workdir");
    let mut child = server_command_plain()
        .arg("--workdir")
        .arg(workdir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferrepl");
    let mut stdin = child.stdin.take().expect("stdin");
    let initialize = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "terminal-test", "version": "1"}
        }
    });
    stdin
        .write_all(format!("{initialize}\n").as_bytes())
        .await
        .expect("write initialize");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    tokio::time::timeout(READY_TIMEOUT, stdout.read_line(&mut first))
        .await
        .expect("initialize answered in time")
        .expect("read stdout");
    drop(stdin);
    let out = tokio::time::timeout(EXIT_TIMEOUT, child.wait_with_output())
        .await
        .expect("the server exits when stdin closes")
        .expect("wait for the server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains(HINT), "a hint for a client:\n{stderr}");
    let stdout = format!("{first}{}", String::from_utf8_lossy(&out.stdout));
    for line in stdout.lines() {
        let message: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a non-JSON line on stdout ({e}): {line:?}"));
        assert_eq!(message["jsonrpc"], "2.0", "{line}");
    }
    assert!(stdout.contains("protocolVersion"), "{stdout}");
}

/// A client that closes stdin before initializing: not an error of the
/// server's (exit 0, no ERROR, nothing on stdout).
#[tokio::test]
async fn stdin_closed_before_the_handshake_is_no_error() {
    let workdir = tempfile::tempdir().expect("workdir");
    let out = server_command_plain()
        .arg("--workdir")
        .arg(workdir.path())
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(READY_TIMEOUT + EXIT_TIMEOUT, out)
        .await
        .expect("the server exits")
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("ERROR"), "{stderr}");
    assert!(!stderr.contains(HINT), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
}
