//! `--network packages` (the default, issue 11), end to end through the real
//! binary: `python_install` reaches the package index through the server's
//! allow-listing proxy and the package imports in the running session; a
//! host off the allow-list is refused at once with the way out; cells and
//! shell jobs reach nothing (not the index, not the relay's port, not the
//! proxy's Unix socket); `--network off` fails an install fast;
//! the status (`python_sessions {action: "status"}`) lists the allowed hosts; installs take wheels only unless
//! the operator passed `--allow-source-builds`.
//!
//! These tests need the package index (PyPI or the machine's mirror of it,
//! with the CA in pip.conf's `cert`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::{StdioServer, ToolOutput, path_str, system_python};
use serde_json::json;

/// wait_s of an install call: below `support::CALL_TIMEOUT` (60 s), so a slow
/// install comes back "running" instead of tripping the harness's timeout.
const INSTALL_WAIT_S: u64 = 45;
/// shell_wait rounds (of INSTALL_WAIT_S each) before an install counts as hung.
const INSTALL_ROUNDS: usize = 6;

// ------------------------------------------------------------------ helpers

/// A server with the system interpreter, `--venv .venv` (made by the server
/// inside the workspace) and `extra` flags.
async fn start_with_venv(extra: &[&str]) -> StdioServer {
    let python = system_python();
    let python = path_str(&python);
    let mut args = vec!["--python", python, "--venv", ".venv"];
    args.extend_from_slice(extra);
    let server = StdioServer::start(&args).await;
    assert!(
        server.workdir.path().join(".venv/bin/python").exists(),
        "--venv .venv creates the environment in the workspace"
    );
    server
}

/// The python_install result, and the job's final result: collected with
/// shell_wait (bounded) when the call came back "running".
pub(crate) async fn install(server: &StdioServer, packages: &[&str]) -> (ToolOutput, ToolOutput) {
    let first = server
        .call(
            "python_install",
            json!({ "packages": packages, "wait_s": INSTALL_WAIT_S }),
        )
        .await;
    assert!(
        first.structured.is_object(),
        "python_install {packages:?} was refused before starting a job: {first:#?}"
    );
    let job = first.str_field("job").to_string();
    let mut last = first.clone();
    let mut rounds = 0;
    while last.structured["status"] == "running" {
        rounds += 1;
        assert!(
            rounds <= INSTALL_ROUNDS,
            "the install job {job} never finished: {last:#?}\nserver stderr:\n{}",
            server.stderr_log()
        );
        last = server
            .call(
                "shell_wait",
                json!({ "job": job, "wait_s": INSTALL_WAIT_S }),
            )
            .await;
    }
    (first, last)
}

/// Panics unless `out` is a finished, successful install job.
fn assert_installed(out: &ToolOutput, what: &str, server: &StdioServer) {
    assert!(
        !out.is_error && out.structured["status"] == "exited" && out.structured["exit_code"] == 0,
        "{what}: the install failed: {out:#?}\nserver stderr:\n{}",
        server.stderr_log()
    );
}

/// Panics unless `out` is a finished install job that failed.
fn assert_install_failed(out: &ToolOutput, what: &str) {
    assert!(out.is_error, "{what}: expected is_error=true, got {out:#?}");
    assert_eq!(
        out.structured["status"], "exited",
        "{what}: the job must have finished within its wait: {out:#?}"
    );
    assert_ne!(
        out.structured["exit_code"], 0,
        "{what}: the job must exit non-zero: {out:#?}"
    );
}

/// Everything the job printed (the result's text and its stdout/stderr fields).
fn job_text(out: &ToolOutput) -> String {
    format!(
        "{}\n{}\n{}",
        out.text,
        out.structured["stdout"].as_str().unwrap_or_default(),
        out.structured["stderr"].as_str().unwrap_or_default()
    )
}

/// The pid python_sessions lists for `session`.
async fn listed_pid(server: &StdioServer, session: &str) -> u64 {
    let out = server.call("python_sessions", json!({})).await;
    assert!(!out.is_error, "python_sessions: {out:#?}");
    out.structured["sessions"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == session))
        .and_then(|s| s["pid"].as_u64())
        .unwrap_or_else(|| panic!("no pid for session {session:?} in {out:#?}"))
}

/// Runs `code` in the default session; when the install finished through
/// shell_wait (the session's import refresh then runs in the background) a
/// failed import is retried, bounded, until the refresh is seen.
async fn exec_after_install(
    server: &StdioServer,
    code: &str,
    finished_in_call: bool,
) -> ToolOutput {
    let mut last = server.exec(code).await;
    let retries = if finished_in_call { 0 } else { 100 };
    for _ in 0..retries {
        if !last.is_error {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = server.exec(code).await;
    }
    last
}

/// The cell's value, without the quotes of a str repr.
fn value_text(out: &ToolOutput) -> String {
    out.value()
        .unwrap_or_else(|| panic!("expected a value: {out:#?}"))
        .trim()
        .trim_matches(['\'', '"'])
        .to_string()
}

/// `elapsed_ms` of a cell or job result (a JSON number, possibly fractional).
fn elapsed_ms(out: &ToolOutput) -> f64 {
    out.structured["elapsed_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("no elapsed_ms in {out:#?}"))
}

// ------------------------------------------------------------------ 1

#[tokio::test]
async fn default_start_installs_from_the_index_and_imports_without_restart() {
    let server = start_with_venv(&[]).await;
    server
        .exec("import six")
        .await
        .assert_raised("ModuleNotFoundError");
    let pid_before = listed_pid(&server, "default").await;

    let (first, done) = install(&server, &["six"]).await;
    assert_installed(&done, "python_install six", &server);
    let finished_in_call = first.structured["status"] != "running";

    // The shown command is the short one: no index, proxy or policy flags.
    let shown = first.str_field("command");
    for hidden in [
        "--index-url",
        "--only-binary",
        "--cert",
        "3128",
        "PIP_CONFIG_FILE",
    ] {
        assert!(
            !shown.contains(hidden),
            "the shown command should not carry {hidden:?}: {shown:?}"
        );
    }
    assert!(
        shown.contains("six"),
        "the command names the package: {shown:?}"
    );

    let imported = exec_after_install(
        &server,
        "import six, sys\n(six.__version__, six.__file__.startswith(sys.prefix))",
        finished_in_call,
    )
    .await;
    imported.assert_ok();
    let value = value_text(&imported);
    assert!(
        value.ends_with("True)") && value.starts_with("('1."),
        "six imports from the venv: {imported:#?}"
    );
    assert_eq!(
        listed_pid(&server, "default").await,
        pid_before,
        "the install must not restart the session"
    );
}

// ------------------------------------------------------------------ 2

#[tokio::test]
async fn a_host_off_the_allow_list_is_refused_at_once_with_the_way_out() {
    let server = start_with_venv(&[]).await;
    let out = server
        .call(
            "python_install",
            json!({ "packages": ["https://example.com/x-1.0-py3-none-any.whl"], "wait_s": INSTALL_WAIT_S }),
        )
        .await;
    assert_install_failed(&out, "install from example.com");
    assert!(
        elapsed_ms(&out) < 15_000.0,
        "the refusal answers within seconds, not after long retries: {out:#?}"
    );
    let text = job_text(&out);
    assert!(
        text.contains("not allowed"),
        "the refusal says the host is not allowed: {out:#?}"
    );
    assert!(
        text.contains("--allow-host-egress"),
        "the refusal names --allow-host-egress: {out:#?}"
    );
    assert!(
        text.contains("example.com"),
        "the refusal names the host: {out:#?}"
    );
    assert!(
        server
            .wait_stderr_contains(
                "egress refused: ferrepl: egress to example.com is not allowed",
                Duration::from_secs(5)
            )
            .await,
        "the proxy logs the refusal: {}",
        server.stderr_log()
    );
}

// ------------------------------------------------------------------ 3

#[tokio::test]
async fn cells_and_shell_jobs_have_no_network_by_default() {
    let python = system_python();
    let python = path_str(&python);
    let server = StdioServer::start(&["--python", python]).await;

    // The index itself: an immediate failure, not a connect timeout.
    let index = server
        .exec(
            "import urllib.request\n\
             try:\n    urllib.request.urlopen('https://pypi.org/simple/six/', timeout=5)\n    r = 'reached'\n\
             except OSError as e:\n    r = 'failed: ' + repr(e)\n\
             r",
        )
        .await;
    index.assert_ok();
    let shown = value_text(&index);
    assert!(
        shown.starts_with("failed: "),
        "a cell must not reach pypi.org: {index:#?}"
    );
    assert!(
        !shown.contains("timed out"),
        "the failure is immediate, not a timeout: {index:#?}"
    );
    assert!(
        elapsed_ms(&index) < 5000.0,
        "the failure is immediate: {index:#?}"
    );

    // The relay's port exists only in installer namespaces.
    let relay = server
        .exec(
            "import socket\n\
             try:\n    socket.create_connection(('127.0.0.1', 3128), timeout=2).close()\n    r = 'connected'\n\
             except OSError as e:\n    r = 'failed: ' + repr(e)\n\
             r",
        )
        .await;
    relay.assert_ok();
    assert!(
        value_text(&relay).starts_with("failed: "),
        "a cell has no route to the relay: {relay:#?}"
    );
    assert!(
        elapsed_ms(&relay) < 2000.0,
        "refused, not timed out: {relay:#?}"
    );

    // A shell job: the script exits 3 exactly when the request fails with a
    // network error, so a broken interpreter cannot pass for a refusal.
    let script = "import sys, urllib.request\n\
                  try:\n    urllib.request.urlopen('https://pypi.org/simple/', timeout=5)\n\
                  except OSError as e:\n    print('NETFAIL', repr(e)); sys.exit(3)\n\
                  print('REACHED')";
    let job = server
        .call(
            "shell_exec",
            json!({
                "command": format!("{python} -c \"$SCRIPT\""),
                "env": { "SCRIPT": script },
                "wait_s": 30,
            }),
        )
        .await;
    assert_eq!(
        job.structured["status"], "exited",
        "the shell job finished: {job:#?}"
    );
    assert!(job.is_error, "a non-zero exit is an error: {job:#?}");
    assert_eq!(
        job.structured["exit_code"], 3,
        "the job failed on the network: {job:#?}"
    );
    assert!(job_text(&job).contains("NETFAIL"), "{job:#?}");
    assert!(!job_text(&job).contains("REACHED"), "{job:#?}");
    assert!(elapsed_ms(&job) < 10_000.0, "fails fast: {job:#?}");
}

// ------------------------------------------------------------------ 4

#[tokio::test]
async fn the_proxy_socket_is_out_of_a_cells_reach() {
    let tmp = tempfile::tempdir().expect("TMPDIR for the server");
    let tmp_path = tmp.path().canonicalize().expect("canonical TMPDIR");
    let python = system_python();
    let python = path_str(&python);
    let server = StdioServer::start_with_env(
        &["--python", python],
        &[
            ("TMPDIR", tmp_path.to_str().expect("utf-8 TMPDIR")),
            // Not absolute: ignored, so the state directory lands in TMPDIR.
            ("XDG_RUNTIME_DIR", ""),
        ],
    )
    .await;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let pid = server.child.id().expect("the server's pid");
    let socket: PathBuf = tmp_path.join(format!("ferrepl-{uid}/{pid}/egress.sock"));
    assert!(
        socket.exists(),
        "the proxy listens at {}: {}",
        socket.display(),
        server.stderr_log()
    );

    // The path is live: from outside the sandbox the proxy answers, and
    // refuses a host off the list.
    let mut stream = UnixStream::connect(&socket).expect("connect to the proxy socket");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream
        .write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        .expect("write CONNECT");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains("not allowed"),
        "the proxy refuses example.com: {answer:?}"
    );

    let shown = socket.display().to_string();
    let cell = server
        .exec(&format!(
            "import socket\n\
             s = socket.socket(socket.AF_UNIX)\n\
             try:\n    s.connect({shown:?})\n    r = 'connected'\n\
             except OSError as e:\n    r = 'failed: ' + repr(e)\n\
             r"
        ))
        .await;
    cell.assert_ok();
    assert!(
        value_text(&cell).starts_with("failed: "),
        "a cell must not reach the proxy's socket: {cell:#?}"
    );
    drop(server);
    drop(tmp);
}

// ------------------------------------------------------------------ 5

#[tokio::test]
async fn network_off_fails_an_install_within_seconds() {
    let server = start_with_venv(&["--network", "off"]).await;
    let out = server
        .call(
            "python_install",
            json!({ "packages": ["six"], "wait_s": 50 }),
        )
        .await;
    assert_install_failed(&out, "install under --network off");
    assert!(
        elapsed_ms(&out) < 20_000.0,
        "the failure answers within seconds: {out:#?}"
    );
    server
        .exec("import six")
        .await
        .assert_raised("ModuleNotFoundError");
}

// ------------------------------------------------------------------ 6

#[tokio::test]
async fn sessions_status_lists_the_allowed_hosts() {
    let server = StdioServer::start(&[]).await;
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "{status:#?}");
    for host in ["pypi.org", "files.pythonhosted.org"] {
        assert!(
            status.text.contains(host),
            "the status lists {host}: {}",
            status.text
        );
    }
    assert!(!status.text.contains("my-index.example"), "{}", status.text);

    let server = StdioServer::start(&["--allow-host-egress", "my-index.example"]).await;
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "{status:#?}");
    for host in ["pypi.org", "files.pythonhosted.org", "my-index.example"] {
        assert!(
            status.text.contains(host),
            "the status lists {host} with --allow-host-egress: {}",
            status.text
        );
    }
}

// ------------------------------------------------------------------ 7

/// docopt has only ever been published as an sdist (0.6.2, 2014).
///
/// A local project directory or sdist file is no test of the policy: pip
/// builds those whatever `--only-binary :all:` says (pip 23.0.1 checked).
const SDIST_ONLY: &str = "docopt";

#[tokio::test]
async fn installs_take_wheels_only_unless_the_operator_allows_builds() {
    let server = start_with_venv(&[]).await;
    let option = server
        .call(
            "python_install",
            json!({ "packages": ["--no-binary=:all:"] }),
        )
        .await;
    assert!(
        option.is_error && option.text.contains("no installer options"),
        "installer options are refused: {option:#?}"
    );

    // The index is reachable (a wheel installs), so the refusal below is
    // the wheels-only policy, not a missing network (whose pip message is
    // the same "No matching distribution").
    let (_, wheel) = install(&server, &["six"]).await;
    assert_installed(&wheel, "a wheel under the default", &server);

    let (_, out) = install(&server, &[SDIST_ONLY]).await;
    assert_install_failed(&out, "an sdist-only package under the default");
    let text = job_text(&out);
    assert!(
        text.contains("No matching distribution") || text.contains("from versions: none"),
        "pip finds no wheel for {SDIST_ONLY}: {out:#?}"
    );
    assert!(
        !text.contains("Building wheel") && !text.contains("setup.py"),
        "no build ran: {out:#?}"
    );
    server
        .exec("import docopt")
        .await
        .assert_raised("ModuleNotFoundError");
}

#[tokio::test]
async fn allow_source_builds_installs_an_sdist() {
    let server = start_with_venv(&["--allow-source-builds"]).await;
    let (first, out) = install(&server, &[SDIST_ONLY]).await;
    assert_installed(
        &out,
        "an sdist-only package with --allow-source-builds",
        &server,
    );
    let imported = exec_after_install(
        &server,
        "import docopt\ndocopt.__version__",
        first.structured["status"] != "running",
    )
    .await;
    imported.assert_ok();
    assert_eq!(value_text(&imported), "0.6.2", "{imported:#?}");
}

/// docopt 0.6.2's sdist on PyPI's files host (an allowed host; PyPI file
/// URLs never change).
const SDIST_URL: &str = "https://files.pythonhosted.org/packages/a2/55/8f8cab2afd404cf578136ef2cc5dfb50baa1761b68c9da1fb1e4eed343c9/docopt-0.6.2.tar.gz";

/// Wheels-only is the operator's policy, so no tool argument may get round
/// it: an sdist named by URL on an allowed host must not be built (its
/// setup.py would run with the installer's network access) unless the
/// operator passed `--allow-source-builds`. Either the call is refused
/// before a job starts, or the job fails without running the build script.
#[tokio::test]
async fn an_sdist_url_is_not_built_without_allow_source_builds() {
    let server = start_with_venv(&[]).await;
    for spec in [SDIST_URL.to_string(), format!("docopt @ {SDIST_URL}")] {
        let out = server
            .call(
                "python_install",
                json!({ "packages": [spec], "wait_s": INSTALL_WAIT_S }),
            )
            .await;
        assert!(
            out.is_error,
            "installing {spec:?} must fail under the default (wheels only): {out:#?}"
        );
        if out.structured.is_object() {
            assert_eq!(
                out.structured["status"], "exited",
                "{spec:?}: the job must have finished: {out:#?}"
            );
            let text = job_text(&out);
            assert!(
                !text.contains("setup.py") && !text.contains("Building wheel"),
                "{spec:?}: no build script may run: {out:#?}"
            );
        }
        server
            .exec("import docopt")
            .await
            .assert_raised("ModuleNotFoundError");
    }
}
