//! Starting the server binary: the one spawn path of the suite.
//!
//! Every server a test talks to (over stdio with the rmcp client, over HTTP,
//! or by hand with raw JSON-RPC) is started by `Launch::spawn_stdio` or
//! `Launch::spawn_http`; a test that only wants to see the binary refuse
//! to start runs `server_command()` / `server_command_plain()` itself.
//!
//! ## Which tool surface a test server has
//!
//! The server exposes only the `python` and `packages` tool groups and sends
//! no `structuredContent` unless told otherwise. Most tests exercise every
//! tool and read results through `ToolOutput::structured`, so a launch has
//! the *full* surface by default:
//!
//! - `Launch::new`, `server_command()`, `StdioServer::start*`,
//!   `HttpServer::start`: the server with `FERREPL_TOOLS=all` and
//!   `FERREPL_STRUCTURED_CONTENT=true` in its environment (every tool group,
//!   structured results and output schemas). Explicit arguments such as
//!   `--tools python` still override the tool groups; `envs` given to a
//!   launch override both variables.
//! - `Launch::plain`, `server_command_plain()`, `StdioServer::start_plain*`:
//!   the server as a user starts it, with neither variable set (the default
//!   `python,packages` groups, text-only results), for tests of the default
//!   tool surface.
//!
//! In both, none of the test's own `FERREPL_*` variables reach the server,
//! `NO_COLOR=1` is set, and the process is killed when dropped.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Upper bound for the server to start (initialize handshake, or HTTP listen).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for a process to go away after it was told to.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment that gives a test server the full tool surface: every
/// tool group, and structuredContent in results (see the module header).
pub const FULL_SURFACE_ENV: &[(&str, &str)] = &[
    ("FERREPL_TOOLS", "all"),
    ("FERREPL_STRUCTURED_CONTENT", "true"),
];

/// The ferrepl binary cargo built for this test run, or the copy named by
/// `FERREPL_TEST_SERVER_BIN`: scripts/escape-unprivileged.sh runs this test
/// binary as another user from copies that user can reach, since the
/// checkout (where cargo put both) may sit in a directory it cannot enter.
pub fn server_binary() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("FERREPL_TEST_SERVER_BIN") {
        Some(copy) if !copy.is_empty() => PathBuf::from(copy),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_ferrepl")),
    })
}

/// Which tool surface a server starts with (see the module header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Surface {
    /// Every tool group and structured results (`FULL_SURFACE_ENV`).
    Full,
    /// What a user gets with no settings: `python,packages`, text only.
    Plain,
}

/// The ferrepl binary with none of the caller's FERREPL_* settings and the
/// full tool surface (`FULL_SURFACE_ENV`): every tool group and structured
/// results. Arguments (`--tools ...`) override the tool groups.
pub fn server_command() -> Command {
    command_for(server_binary(), Surface::Full)
}

/// The ferrepl binary with none of the caller's FERREPL_* settings: the
/// default tool surface (`python,packages`, text-only results).
pub fn server_command_plain() -> Command {
    command_for(server_binary(), Surface::Plain)
}

/// `binary` with none of the caller's FERREPL_* settings, `NO_COLOR=1`,
/// killed on drop, and the environment of `surface`.
fn command_for(binary: &Path, surface: Surface) -> Command {
    let mut cmd = Command::new(binary);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("FERREPL_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("NO_COLOR", "1");
    // Stored sessions of test servers go to the build's scratch directory,
    // not the user's: one file per (temporary) workspace.
    cmd.env("XDG_STATE_HOME", test_state_home());
    // A root server's host-wide table of session uids: the suite's own,
    // not the host's /var/lib/ferrepl (an unprivileged server keeps none).
    cmd.env("FERREPL_UID_TABLE", test_uid_table());
    if !nix::unistd::geteuid().is_root() {
        // An unprivileged server's tenants share its uid (uid boundary
        // DEGRADED), which is refused unless the operator accepts it: the
        // unprivileged run accepts it for the tests of everything else.
        // The refusal itself is tested with the variable removed.
        cmd.env("FERREPL_ALLOW_DEGRADED_ISOLATION", "true");
    }
    if surface == Surface::Full {
        cmd.envs(FULL_SURFACE_ENV.iter().copied());
    }
    cmd.kill_on_drop(true);
    cmd
}

/// `XDG_STATE_HOME` of every test server, emptied once per test run: the
/// directory `FERREPL_TEST_STATE_HOME` names (scripts/escape-unprivileged.sh
/// gives its user one outside /tmp), else the build's scratch directory, or,
/// where this user cannot write there, a directory of its own in TMPDIR.
/// Never the user's own state directory.
pub fn test_state_home() -> &'static Path {
    static HOME: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    HOME.get_or_init(|| {
        if let Some(dir) = std::env::var_os("FERREPL_TEST_STATE_HOME").filter(|d| !d.is_empty()) {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).expect("create FERREPL_TEST_STATE_HOME");
            return dir;
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("state-home");
        let _ = std::fs::remove_dir_all(&dir);
        let writable = std::fs::create_dir_all(&dir).is_ok() && tempfile::tempfile_in(&dir).is_ok();
        if writable {
            return dir;
        }
        tempfile::Builder::new()
            .prefix("ferrepl-test-state-")
            .tempdir()
            .expect("create the test servers' state home in TMPDIR")
            .keep()
    })
}

/// `--uid-table` of every test server (a root one uses it): a file in a
/// directory of the build's scratch space, mode 0700 (a root server refuses
/// a table directory others may write). Shared by every test server, of
/// this run and of runs beside it, as the host's is by every instance; kept
/// across runs (never removed under a running server): the servers drop
/// the keys of workspaces that are gone themselves. Unprivileged, the path
/// is only named (such a server keeps no table).
pub fn test_uid_table() -> &'static Path {
    static TABLE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("uid-table");
        if nix::unistd::geteuid().is_root() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::create_dir_all(&dir).expect("create the test servers' uid table directory");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .expect("chmod 0700 the test servers' uid table directory");
        }
        dir.join("uids.json")
    })
}

type PreExec = Arc<dyn Fn() -> io::Result<()> + Send + Sync>;

/// A server process to start: which binary, tool surface, arguments and
/// environment. By default: the binary under test, the full surface, and
/// `--workdir <a fresh temporary directory>` before the arguments.
#[derive(Clone)]
pub struct Launch {
    binary: PathBuf,
    surface: Surface,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    env_removed: Vec<OsString>,
    workdir_flag: bool,
    pre_exec: Option<PreExec>,
}

impl Launch {
    /// `ferrepl --workdir <fresh tempdir> args...` with the full surface.
    pub fn new(args: &[&str]) -> Self {
        Launch {
            binary: server_binary().to_path_buf(),
            surface: Surface::Full,
            args: args.iter().map(OsString::from).collect(),
            envs: Vec::new(),
            env_removed: Vec::new(),
            workdir_flag: true,
            pre_exec: None,
        }
    }

    /// The default tool surface instead of the full one.
    pub fn plain(mut self) -> Self {
        self.surface = Surface::Plain;
        self
    }

    /// Start `binary` (e.g. a copy of the server) instead of the one built.
    pub fn binary(mut self, binary: &Path) -> Self {
        self.binary = binary.to_path_buf();
        self
    }

    /// Set these variables in the server's environment (after the surface's,
    /// so they override it).
    pub fn envs(mut self, envs: &[(&str, &str)]) -> Self {
        self.envs.extend(
            envs.iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        self
    }

    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Remove `key` from the server's environment.
    pub fn env_remove(mut self, key: &str) -> Self {
        self.env_removed.push(key.into());
        self
    }

    /// No `--workdir` flag (the temporary directory is still made and kept,
    /// for the test to pass some other way, or not at all).
    pub fn without_workdir_flag(mut self) -> Self {
        self.workdir_flag = false;
        self
    }

    /// Run `hook` in the child between fork and exec.
    ///
    /// # Safety
    ///
    /// As for `std::os::unix::process::CommandExt::pre_exec`: `hook` may
    /// only make async-signal-safe calls.
    pub unsafe fn pre_exec(
        mut self,
        hook: impl Fn() -> io::Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.pre_exec = Some(Arc::new(hook));
        self
    }

    /// The command: the surface's environment, `--workdir workdir` (unless
    /// left out), the extra arguments, variables and hook.
    fn command(&self, workdir: &Path, leading: &[OsString]) -> Command {
        let mut cmd = command_for(&self.binary, self.surface);
        cmd.args(leading);
        if self.workdir_flag {
            cmd.arg("--workdir").arg(workdir);
        }
        cmd.args(&self.args).envs(self.envs.iter().cloned());
        for key in &self.env_removed {
            cmd.env_remove(key);
        }
        if let Some(hook) = self.pre_exec.clone() {
            // SAFETY: the hook's contract is that of `pre_exec` (see
            // `Launch::pre_exec`).
            unsafe {
                cmd.pre_exec(move || hook());
            }
        }
        cmd
    }

    /// Start the server on the stdio transport: stdin and stdout piped to
    /// the test, stderr collected.
    pub fn spawn_stdio(self) -> Spawned {
        self.spawn(&[], Stdio::piped, |_| {})
    }

    /// Start the server with `--http 127.0.0.1:port` (stdin and stdout
    /// null), calling `on_stderr_line` with each line it logs.
    pub fn spawn_http(
        self,
        port: u16,
        on_stderr_line: impl FnMut(&str) + Send + 'static,
    ) -> Spawned {
        let leading = [
            OsString::from("--http"),
            OsString::from(format!("127.0.0.1:{port}")),
        ];
        self.spawn(&leading, Stdio::null, on_stderr_line)
    }

    fn spawn(
        self,
        leading: &[OsString],
        stdio: impl Fn() -> Stdio,
        on_stderr_line: impl FnMut(&str) + Send + 'static,
    ) -> Spawned {
        let workdir = tempfile::tempdir().expect("create a temporary workdir");
        let mut cmd = self.command(workdir.path(), leading);
        cmd.stdin(stdio()).stdout(stdio()).stderr(Stdio::piped());
        let mut child = spawn_retrying_busy_text(&mut cmd)
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.binary.display()));
        let stderr = StderrLog::collect(child.stderr.take().expect("piped stderr"), on_stderr_line);
        Spawned {
            stdin: child.stdin.take(),
            stdout: child.stdout.take(),
            child,
            stderr,
            workdir,
        }
    }
}

/// `cmd.spawn()`, tried again a few times on ETXTBSY. A test that writes an
/// executable and starts it (a copy of the server) can see it "busy" for a
/// moment: another test thread forked while the file was open for writing,
/// and its child holds the descriptor until it execs.
fn spawn_retrying_busy_text(cmd: &mut Command) -> io::Result<Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// A started server process, before any protocol is spoken.
pub struct Spawned {
    /// Killed on drop.
    pub child: Child,
    /// The pipes of the stdio transport (None over HTTP).
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: StderrLog,
    /// The workspace (`--workdir`), removed on drop.
    pub workdir: tempfile::TempDir,
}

/// Everything a server wrote on stderr so far, collected by a task.
#[derive(Clone)]
pub struct StderrLog {
    text: Arc<Mutex<String>>,
    reader: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl StderrLog {
    /// Collect `stderr` line by line (lossily decoded), calling `on_line`
    /// with each line before it is added.
    fn collect(
        stderr: tokio::process::ChildStderr,
        mut on_line: impl FnMut(&str) + Send + 'static,
    ) -> Self {
        let text = Arc::new(Mutex::new(String::new()));
        let sink = text.clone();
        let reader = tokio::spawn(async move {
            let mut reader = BufReader::new(stderr);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let shown = String::from_utf8_lossy(&line).into_owned();
                        on_line(&shown);
                        sink.lock().expect("stderr lock").push_str(&shown);
                    }
                }
            }
        });
        StderrLog {
            text,
            reader: Arc::new(Mutex::new(Some(reader))),
        }
    }

    /// The whole log so far.
    pub fn text(&self) -> String {
        self.text.lock().expect("stderr lock").clone()
    }

    /// The last `max` bytes of the log so far, for failure messages.
    pub fn tail(&self, max: usize) -> String {
        tail(&self.text(), max).to_string()
    }

    /// Wait (bounded) until the log contains `needle`.
    pub async fn wait_contains(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.text().contains(needle) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Wait (at most `timeout`) until the server closed its stderr and all
    /// of it is in the log.
    pub async fn wait_closed(&self, timeout: Duration) {
        let reader = self.reader.lock().expect("stderr reader lock").take();
        if let Some(reader) = reader {
            let _ = tokio::time::timeout(timeout, reader).await;
        }
    }
}

/// The last `max` bytes of `log` (from a char boundary), for failure messages.
pub fn tail(log: &str, max: usize) -> &str {
    let mut start = log.len().saturating_sub(max);
    while !log.is_char_boundary(start) {
        start += 1;
    }
    &log[start..]
}

/// Remove ANSI colour sequences (ESC [ ... letter) from a log line.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
