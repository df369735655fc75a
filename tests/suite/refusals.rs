//! Start-up refusals from the flags (issue 31): a non-loopback `--http`
//! without a token, a `--python` (or FERREPL_PYTHON) that does not exist, a
//! `--venv` that is not a venv or cannot be made, and an `--http` address
//! in use. Each exits non-zero at once with the flag and the fix in its
//! message, before anything is started: no runtime or state directory, no
//! sandbox probe, no session, no listener.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::server_command_plain;

/// A refusal needs no start-up; a debug binary on a loaded machine still
/// answers well within this.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A machine for one refused start: the workspace, the stores' place and
/// the runtime directory, each in its own temporary directory.
struct Place {
    workdir: tempfile::TempDir,
    state: tempfile::TempDir,
    runtime: tempfile::TempDir,
}

impl Place {
    fn new() -> Self {
        Place {
            workdir: tempfile::tempdir().expect("workdir"),
            state: tempfile::tempdir().expect("state"),
            runtime: tempfile::tempdir().expect("runtime"),
        }
    }

    /// `--state-dir`: not made yet (a start makes it).
    fn state_dir(&self) -> std::path::PathBuf {
        self.state.path().join("stores")
    }

    /// Runs ferrepl with `args` and `envs`: it must exit non-zero within
    /// REFUSAL_TIMEOUT; its stderr.
    async fn refused(&self, args: &[&str], envs: &[(&str, &str)]) -> String {
        let mut cmd = server_command_plain();
        cmd.arg("--workdir")
            .arg(self.workdir.path())
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(args)
            .env("XDG_RUNTIME_DIR", self.runtime.path())
            .envs(envs.iter().copied())
            .stdin(Stdio::piped());
        let started = Instant::now();
        let out = tokio::time::timeout(REFUSAL_TIMEOUT, cmd.output())
            .await
            .unwrap_or_else(|_| panic!("{args:?} was not refused within {REFUSAL_TIMEOUT:?}"))
            .expect("run ferrepl");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} must be refused:\n{stderr}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: stdout carries MCP only: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(started.elapsed() < REFUSAL_TIMEOUT, "{args:?}");
        stderr
    }

    /// Nothing was started: no line but the refusal, no runtime directory,
    /// no stores.
    fn assert_nothing_started(&self, stderr: &str) {
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            lines.len() == 1 && lines[0].contains("ERROR"),
            "only the refusal is logged:\n{stderr}"
        );
        assert!(
            !self.state_dir().exists(),
            "the stores' directory was made:\n{stderr}"
        );
        let made: Vec<_> = std::fs::read_dir(self.runtime.path())
            .expect("read the runtime directory")
            .collect();
        assert!(made.is_empty(), "the runtime directory was used: {made:?}");
    }
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

#[tokio::test]
async fn a_non_loopback_http_without_a_token_is_refused_before_anything_starts() {
    let place = Place::new();
    let stderr = place.refused(&["--http", "0.0.0.0:0"], &[]).await;
    for needle in ["--http 0.0.0.0:0", "--auth-token-file", "127.0.0.1"] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    assert!(!stderr.contains("listening on"), "{stderr}");
    place.assert_nothing_started(&stderr);
}

#[tokio::test]
async fn a_missing_python_is_refused_naming_the_path_and_the_fix() {
    let place = Place::new();
    let stderr = place
        .refused(&["--python", "/nonexistent/python"], &[])
        .await;
    for needle in [
        "--python /nonexistent/python does not exist",
        "python3 on PATH",
    ] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    place.assert_nothing_started(&stderr);
    // From the environment too, which the message names.
    let stderr = place
        .refused(&[], &[("FERREPL_PYTHON", "/nonexistent/py-from-env")])
        .await;
    for needle in ["/nonexistent/py-from-env", "FERREPL_PYTHON"] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    place.assert_nothing_started(&stderr);
    // A bare name not on PATH, and a directory.
    let stderr = place
        .refused(&["--python", "no-such-python-for-ferrepl"], &[])
        .await;
    assert!(stderr.contains("no such program on PATH"), "{stderr}");
    let dir = place.workdir.path();
    let stderr = place.refused(&["--python", text(dir)], &[]).await;
    assert!(stderr.contains("is a directory"), "{stderr}");
    place.assert_nothing_started(&stderr);
}

#[tokio::test]
async fn a_bad_venv_is_refused_before_anything_starts() {
    let place = Place::new();
    let other = tempfile::tempdir().expect("other");
    // A directory that is not a venv: never written into.
    let not_venv = other.path().join("data");
    std::fs::create_dir(&not_venv).expect("mkdir");
    std::fs::write(not_venv.join("keep.txt"), "mine").expect("write");
    let stderr = place.refused(&["--venv", text(&not_venv)], &[]).await;
    for needle in ["--venv", "not a virtual environment", "another directory"] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    place.assert_nothing_started(&stderr);
    let entries = std::fs::read_dir(&not_venv).expect("read").count();
    assert_eq!(entries, 1, "the directory was written into");
    // A venv whose parent is missing.
    let orphan = other.path().join("missing/parent/venv");
    let stderr = place.refused(&["--venv", text(&orphan)], &[]).await;
    for needle in ["--venv", "parent directory is missing", "create it first"] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    place.assert_nothing_started(&stderr);
    assert!(!other.path().join("missing").exists());
}

/// An address in use is refused once the checks pass, before any session
/// (and the default session's interpreter) starts.
#[tokio::test]
async fn an_http_address_in_use_is_refused_before_any_session_starts() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let place = Place::new();
    let stderr = place.refused(&["--http", &addr], &[]).await;
    // The refusal names the fix, not only the socket's error.
    assert!(
        stderr.contains(&format!(
            "--http: {addr} is in use: stop the other server or pick another port with --http PORT"
        )),
        "{stderr}"
    );
    for started in [
        "tenant started",
        "session interpreter started",
        "listening on",
    ] {
        assert!(!stderr.contains(started), "{started}: {stderr}");
    }
    let stderr = place.refused(&["--viewer", &addr], &[]).await;
    assert!(
        stderr.contains(&format!("--viewer: {addr} is in use: stop the other server or pick another port with --viewer ADDR")),
        "{stderr}"
    );
    assert!(!stderr.contains("session interpreter started"), "{stderr}");
}

#[tokio::test]
async fn a_missing_workdir_is_refused_with_the_fix() {
    let place = Place::new();
    let missing = place.workdir.path().join("not-made");
    let mut cmd = server_command_plain();
    cmd.arg("--workdir")
        .arg(&missing)
        .arg("--state-dir")
        .arg(place.state_dir())
        .env("XDG_RUNTIME_DIR", place.runtime.path())
        .stdin(Stdio::piped());
    let out = tokio::time::timeout(REFUSAL_TIMEOUT, cmd.output())
        .await
        .expect("refused in time")
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--workdir {} does not exist: create it, or give an existing directory with --workdir DIR",
            missing.display()
        )),
        "{stderr}"
    );
    place.assert_nothing_started(&stderr);
}

#[tokio::test]
async fn an_mcp_servers_file_in_the_workspace_malformed_or_missing_is_refused() {
    // Code calls tools (issue 33): the file holds the upstreams' tokens and
    // commands; a typo such as allowTool must not widen the policy.
    let place = Place::new();
    let inside = crate::support::upstreams::write_servers_file(
        place.workdir.path(),
        serde_json::json!({ "own": {"command": "python3"} }),
    );
    let stderr = place.refused(&["--mcp-servers", text(&inside)], &[]).await;
    assert!(
        stderr.contains("--mcp-servers") && stderr.contains("lies inside"),
        "{stderr}"
    );
    place.assert_nothing_started(&stderr);

    let outside = tempfile::tempdir().expect("outside");
    let bad = outside.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"mcpServers": {"a": {"command": "x", "allowTool": ["y"]}}}"#,
    )
    .expect("write");
    let stderr = place.refused(&["--mcp-servers", text(&bad)], &[]).await;
    assert!(
        stderr.contains("allowTool"),
        "the unknown key is named: {stderr}"
    );
    place.assert_nothing_started(&stderr);

    let missing = outside.path().join("missing.json");
    let stderr = place.refused(&["--mcp-servers", text(&missing)], &[]).await;
    assert!(
        stderr.contains("missing.json"),
        "the file is named: {stderr}"
    );
    place.assert_nothing_started(&stderr);
}

#[tokio::test]
async fn a_viewer_tokens_file_sessions_can_read_is_refused() {
    // The viewer's tokens log a browser in to a tenant's sessions: one
    // tenant's agent reading them would read its way into another's.
    let place = Place::new();
    let token = "viewer-token-0123456789abcdef";
    let inside = place.workdir.path().join("views");
    std::fs::write(&inside, format!("{token}\n")).expect("write");
    let shared = tempfile::tempdir().expect("an --allow-read place");
    let readable = shared.path().join("views");
    std::fs::write(&readable, format!("{token}\n")).expect("write");
    // Named as it is, and through a link in the workspace to a file the
    // sessions cannot otherwise see.
    let outside = tempfile::tempdir().expect("outside");
    let hidden = outside.path().join("views");
    std::fs::write(&hidden, format!("{token}\n")).expect("write");
    let link = place.workdir.path().join("views-link");
    std::os::unix::fs::symlink(&hidden, &link).expect("symlink");
    for (file, extra) in [
        (&inside, vec![]),
        (&readable, vec!["--allow-read", text(shared.path())]),
        (&link, vec![]),
    ] {
        let mut args = vec!["--viewer", "127.0.0.1:0", "--viewer-tokens", text(file)];
        args.extend(extra);
        let stderr = place.refused(&args, &[]).await;
        assert!(
            stderr.contains("--viewer-tokens") && stderr.contains("lies inside"),
            "{file:?}: {stderr}"
        );
        assert!(!stderr.contains(token), "{stderr}");
        place.assert_nothing_started(&stderr);
    }
}

/// The server user's home, from the password database (not $HOME), when
/// it is a directory other than `/`.
fn own_home() -> Option<std::path::PathBuf> {
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok()??;
    let home = user.dir.canonicalize().ok()?;
    (home != Path::new("/") && home.is_dir()).then_some(home)
}

/// A workspace that is a home directory (issue 40): its shell and ssh
/// start-up files would be writable by sessions. The home is found from
/// the password database, whatever $HOME says; the refusal comes before
/// anything starts, names the fix, and doctor reports it.
#[tokio::test]
async fn a_home_directory_as_the_workspace_is_refused() {
    let Some(home) = own_home() else {
        eprintln!("skipped: this user's home is / or missing");
        return;
    };
    let place = Place::new();
    let elsewhere = tempfile::tempdir().expect("a decoy HOME");
    let mut cmd = server_command_plain();
    cmd.arg("--workdir")
        .arg(&home)
        .arg("--state-dir")
        .arg(place.state_dir())
        .env("HOME", elsewhere.path())
        .env("XDG_RUNTIME_DIR", place.runtime.path())
        .stdin(Stdio::piped());
    let out = tokio::time::timeout(REFUSAL_TIMEOUT, cmd.output())
        .await
        .expect("refused in time")
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "a home workspace must be refused:\n{stderr}"
    );
    for needle in [
        format!("--workdir {} is a home directory", home.display()),
        ".bashrc".to_string(),
        "would be writable by sessions".to_string(),
        "give a project directory inside it instead".to_string(),
    ] {
        assert!(stderr.contains(&needle), "{needle}: {stderr}");
    }
    place.assert_nothing_started(&stderr);
    // Read-only: its private files would be readable.
    let mut cmd = server_command_plain();
    cmd.args(["--sandbox", "read-only", "--workdir"])
        .arg(&home)
        .arg("--state-dir")
        .arg(place.state_dir())
        .env("XDG_RUNTIME_DIR", place.runtime.path())
        .stdin(Stdio::piped());
    let out = tokio::time::timeout(REFUSAL_TIMEOUT, cmd.output())
        .await
        .expect("refused in time")
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("would be readable by sessions"), "{stderr}");

    // Doctor says the server would refuse to start, with the same reason.
    let mut cmd = server_command_plain();
    cmd.args(["doctor", "--json", "--workdir"])
        .arg(&home)
        .env("HOME", elsewhere.path());
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("doctor in time")
        .expect("run ferrepl doctor");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor's JSON");
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let config = report["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|i| i["name"] == "config")
        .unwrap_or_else(|| panic!("no config item: {report:#}"));
    assert_eq!(config["status"], "missing", "{config}");
    let detail = config["detail"].as_str().expect("detail");
    assert!(
        detail.contains("the server would refuse to start")
            && detail.contains("is a home directory"),
        "{detail}"
    );
}

/// The stores' bounds are checked once, at start: a bad value is refused
/// before anything starts, not on each tenant's first request.
#[tokio::test]
async fn a_bad_stores_value_is_refused_before_anything_starts() {
    let place = Place::new();
    for (flag, value) in [("--resume-max-seconds", "-1"), ("--state-keep-days", "NaN")] {
        let stderr = place.refused(&[&format!("{flag}={value}")], &[]).await;
        assert!(stderr.contains(flag), "{flag}: {stderr}");
        assert!(stderr.contains("non-negative number"), "{flag}: {stderr}");
        place.assert_nothing_started(&stderr);
    }
}
