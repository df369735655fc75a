//! Ready-made environments (`--preinstall`, `--requirements`,
//! `--preimport`), end to end through the real binary against the local
//! HTTPS index of `index_credentials` (one wheel, `credpkg`, every request
//! logged): the packages are installed in the background from the start
//! into the venv ferrepl keeps, and the first cell imports them without
//! python_install; the server answers while the install runs, and a cell
//! sent meanwhile answers `running` and is followed to its result; a
//! restart with the same list installs nothing (the index sees no request);
//! doctor tells both; a failed install leaves the server serving, with one
//! note; option lines of a requirements file and a module name that is
//! code are refused at start; `--preimport` modules are in `sys.modules`
//! before any cell imports them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::index_credentials::{PKG, PKG_VALUE, TestIndex};
use crate::support::{
    CALL_TIMEOUT, HttpServer, Launch, StdioServer, ToolOutput, call, path_str, real_python3,
    server_command_plain, system_python,
};

/// Bound on a preinstall from the local index (a few seconds here).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(120);
/// python_wait rounds of WAIT_S each before the queued cell counts as hung.
const WAIT_ROUNDS: usize = 8;
const WAIT_S: u64 = 20;

/// A workspace and a state directory that outlive one server (a restart
/// finds the same kept venv).
struct Place {
    workspace: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Place {
    fn new() -> Self {
        Place {
            workspace: tempfile::tempdir().expect("workspace"),
            state: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir"),
        }
    }

    /// The server flags: this place, the system interpreter with a
    /// `.venv` (installs go to the venv kept over it), the index on
    /// loopback, and `extra`.
    fn args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "--workdir",
            path_str(self.workspace.path()),
            "--state-dir",
            path_str(self.state.path()),
            "--python",
            path_str(python()),
            "--venv",
            ".venv",
            "--egress-allow-private",
        ];
        args.extend_from_slice(extra);
        args
    }

    /// The operator's index (with its credentials) and its CA.
    fn envs(index: &TestIndex) -> Vec<(&'static str, String)> {
        vec![
            ("PIP_INDEX_URL", index.url_with_credentials()),
            ("PIP_CERT", index.ca.display().to_string()),
        ]
    }

    async fn server(
        &self,
        index: &TestIndex,
        extra: &[&str],
        more_env: &[(&str, &str)],
    ) -> StdioServer {
        let envs = Self::envs(index);
        let mut all: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.extend_from_slice(more_env);
        let launch = Launch::new(&self.args(extra))
            .envs(&all)
            .without_workdir_flag();
        StdioServer::launch(launch).await
    }

    /// `ferrepl <flags> doctor` for this place: its stdout.
    async fn doctor(&self, index: &TestIndex, extra: &[&str]) -> String {
        let envs = Self::envs(index);
        let out = tokio::time::timeout(
            Duration::from_secs(120),
            server_command_plain()
                .args(self.args(extra))
                .arg("doctor")
                .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
                .output(),
        )
        .await
        .expect("doctor finishes in time")
        .expect("run doctor");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn python() -> &'static Path {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(system_python)
}

/// The index's requests for the package (its project page and wheel).
fn package_requests(index: &TestIndex) -> usize {
    index
        .requests()
        .iter()
        .filter(|l| l.contains(&format!("/{PKG}")))
        .count()
}

const IMPORT: &str = "import credpkg\ncredpkg.VALUE";

/// python_exec of `code` with `wait_s`, then python_wait (bounded) until
/// its result is in.
async fn run_to_end(server: &StdioServer, code: &str, wait_s: u64) -> (ToolOutput, ToolOutput) {
    let first = server
        .call("python_exec", json!({"code": code, "wait_s": wait_s}))
        .await;
    let mut last = first.clone();
    for _ in 0..WAIT_ROUNDS {
        if last.structured["status"] != "running" {
            return (first, last);
        }
        last = server.call("python_wait", json!({"wait_s": WAIT_S})).await;
    }
    panic!(
        "the cell did not finish: {last:#?}\nserver stderr:\n{}",
        server.stderr_log()
    );
}

#[tokio::test]
async fn the_first_cell_imports_the_preinstalled_package_and_a_restart_installs_nothing() {
    let index = TestIndex::start().await;
    let place = Place::new();
    let before = place.doctor(&index, &["--preinstall", PKG]).await;
    assert!(
        before.contains(&format!("would install {PKG} into the kept venv")),
        "doctor tells what a start would install: {before}"
    );

    let server = place.server(&index, &["--preinstall", PKG], &[]).await;
    let (_, done) = run_to_end(&server, IMPORT, 45).await;
    assert_eq!(
        done.value(),
        Some(PKG_VALUE.to_string().as_str()),
        "the first cell imports the preinstalled package, no python_install: {done:#?}\nserver stderr:\n{}\n{}",
        server.stderr_log(),
        index.diagnostics()
    );
    assert!(
        server
            .wait_stderr_contains("preinstall done", INSTALL_TIMEOUT)
            .await,
        "the log says the preinstall ended: {}",
        server.stderr_log()
    );
    let log = server.stderr_log();
    assert!(
        log.contains(&format!(
            "preinstall: installing {PKG} into the sessions' venv"
        )),
        "the log says it started: {log}"
    );
    let installed = package_requests(&index);
    assert!(
        installed > 0,
        "the install reached the index: {}",
        index.diagnostics()
    );
    // The stamp lies beside the kept venv, out of the sessions' reach: a
    // cell can neither forge nor remove it.
    let forged = server
        .exec(
            "import os, sys\n\
             stamp = sys.prefix.rstrip('/') + '.preinstalled'\n\
             try:\n    open(stamp, 'w').write('forged')\n    r = 'written'\n\
             except OSError as e:\n    r = type(e).__name__\n\
             try:\n    os.unlink(stamp)\n    r += ' removed'\n\
             except OSError as e:\n    r += ' ' + type(e).__name__\n\
             r",
        )
        .await;
    let shown = forged.value().unwrap_or_default().to_string();
    assert!(
        !shown.is_empty() && !shown.contains("written") && !shown.contains("removed"),
        "a cell reached the stamp: {forged:#?}"
    );
    let stamps: Vec<PathBuf> = std::fs::read_dir(place.state.path().join("venvs"))
        .expect("the kept venvs")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".preinstalled"))
        .collect();
    assert_eq!(stamps.len(), 1, "{stamps:?}");
    let stamp = std::fs::read_to_string(&stamps[0]).expect("the stamp");
    assert!(stamp.contains(PKG) && !stamp.contains("forged"), "{stamp}");
    server.stop().await;

    let after = place.doctor(&index, &["--preinstall", PKG]).await;
    assert!(
        after.contains(&format!("{PKG}: already in the kept venv")),
        "doctor sees it installed: {after}"
    );

    let again = place.server(&index, &["--preinstall", PKG], &[]).await;
    let (_, done) = run_to_end(&again, IMPORT, 45).await;
    assert_eq!(
        done.value(),
        Some(PKG_VALUE.to_string().as_str()),
        "{done:#?}"
    );
    assert!(
        again
            .wait_stderr_contains("nothing to install", INSTALL_TIMEOUT)
            .await,
        "a restart with the same list skips the install: {}",
        again.stderr_log()
    );
    assert_eq!(
        package_requests(&index),
        installed,
        "a restart asked the index for nothing: {}",
        index.diagnostics()
    );
}

#[tokio::test]
async fn the_server_answers_while_the_preinstall_runs_and_a_cell_waits_for_it() {
    let index = TestIndex::start().await;
    let place = Place::new();
    let gate = place.state.path().join("let-the-preinstall-go");
    let server = place
        .server(
            &index,
            &["--preinstall", PKG],
            &[("FERREPL_TEST_PREINSTALL_GATE", path_str(&gate))],
        )
        .await;
    // The handshake is done (initialize answered) with the install held.
    let tools = tokio::time::timeout(CALL_TIMEOUT, server.peer().list_all_tools())
        .await
        .expect("tools/list answers while the preinstall is held")
        .expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "python_exec"));

    let first = server
        .call("python_exec", json!({"code": IMPORT, "wait_s": 1}))
        .await;
    assert_eq!(first.structured["status"], "running", "{first:#?}");
    let notes = first.notes_text();
    assert!(
        notes.contains(&format!("preinstalling {PKG}")) && notes.contains("python_wait follows it"),
        "the running answer says what it waits for and how to follow it: {notes}"
    );
    assert_eq!(package_requests(&index), 0, "nothing installed yet");
    let busy = server
        .call("python_exec", json!({"code": "1", "wait_s": 1}))
        .await;
    assert!(
        busy.is_error && busy.text.contains("queued behind the preinstall"),
        "a second cell is refused while one is queued: {busy:#?}"
    );

    let install = server
        .call("python_install", json!({"packages": ["six"]}))
        .await;
    assert!(
        install.is_error
            && install.text.contains(&format!("preinstalling {PKG}"))
            && install
                .text
                .contains("call python_install again once it has ended"),
        "no second installer runs in the venv meanwhile: {install:#?}"
    );

    std::fs::write(&gate, "").expect("open the gate");
    let mut last = first;
    for _ in 0..WAIT_ROUNDS {
        if last.structured["status"] != "running" {
            break;
        }
        last = server.call("python_wait", json!({"wait_s": WAIT_S})).await;
    }
    assert_eq!(
        last.value(),
        Some(PKG_VALUE.to_string().as_str()),
        "python_wait follows the queued cell to its result: {last:#?}\nserver stderr:\n{}",
        server.stderr_log()
    );
}

#[tokio::test]
async fn a_failed_preinstall_leaves_the_server_serving_with_one_note() {
    let index = TestIndex::start().await;
    let place = Place::new();
    let missing = "nosuchpkg-ferrepl-test";
    let server = place.server(&index, &["--preinstall", missing], &[]).await;
    assert!(
        server
            .wait_stderr_contains("preinstall failed", INSTALL_TIMEOUT)
            .await,
        "the log says it failed: {}",
        server.stderr_log()
    );
    let (_, done) = run_to_end(&server, "1 + 1", 45).await;
    assert_eq!(done.value(), Some("2"), "{done:#?}");
    let notes = done.notes_text();
    assert!(
        notes.contains(&format!(
            "The preinstall of {missing} (--preinstall) failed"
        )) && notes.contains("python_output"),
        "the first result says it failed and where to see why: {notes}"
    );
    let (_, next) = run_to_end(&server, "2 + 2", 45).await;
    assert!(
        !next.notes_text().contains("preinstall"),
        "told once: {next:#?}"
    );
}

/// [`refused_launch`] of `ferrepl args` with a fresh `--workdir`.
async fn refused(args: &[&str]) -> String {
    refused_launch(Launch::new(args)).await
}

/// Starts `launch`, which must exit at once with a failure: its stderr.
async fn refused_launch(launch: Launch) -> String {
    let mut spawned = launch.spawn_stdio();
    let status = tokio::time::timeout(Duration::from_secs(30), spawned.child.wait())
        .await
        .expect("the server refuses at once")
        .expect("wait");
    spawned.stderr.wait_closed(Duration::from_secs(10)).await;
    let err = spawned.stderr.text();
    assert!(!status.success(), "the server started: {err}");
    err
}

#[tokio::test]
async fn option_lines_urls_and_code_for_module_names_are_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("requirements.txt");
    std::fs::write(
        &file,
        "# ok\nsix\n\n--extra-index-url https://evil.example/simple\n",
    )
    .expect("write");
    // Relative to --workdir: the project's file, wherever the client
    // started the server.
    let err = refused_launch(
        Launch::new(&[
            "--workdir",
            path_str(dir.path()),
            "--requirements",
            "requirements.txt",
        ])
        .without_workdir_flag(),
    )
    .await;
    assert!(
        err.contains("line 4: --extra-index-url is an installer option"),
        "the refusal names the line and the option: {err}"
    );

    std::fs::write(&file, "six\n-e .\n").expect("write");
    let err = refused(&["--requirements", path_str(&file)]).await;
    assert!(err.contains("line 2: -e is an installer option"), "{err}");

    std::fs::write(
        &file,
        "evil @ https://evil.example/evil-1.0-py3-none-any.whl\n",
    )
    .expect("write");
    let err = refused(&["--requirements", path_str(&file)]).await;
    assert!(
        err.contains("line 1") && err.contains("names a URL"),
        "{err}"
    );

    // A FIFO would hang a reader that waits for a writer.
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let err = refused(&["--requirements", path_str(&fifo)]).await;
    assert!(err.contains("not a regular file"), "{err}");

    let err = refused(&["--preimport", "os;import x"]).await;
    assert!(
        err.contains("\"os;import x\" is not a module name"),
        "code in a module name is refused: {err}"
    );
    let err = refused(&["--preimport", "json,__import__('os').system('id')"]).await;
    assert!(err.contains("is not a module name"), "{err}");

    let err = refused(&["--preinstall", "six", "--resume", "off"]).await;
    assert!(
        err.contains("--preinstall/--requirements install into the venv ferrepl keeps"),
        "no kept venv, no preinstall: {err}"
    );
}

#[tokio::test]
async fn preimported_modules_are_loaded_before_the_first_cell() {
    // colorsys and wave: standard modules nothing of the driver imports.
    let server = StdioServer::start(&["--preimport", "colorsys,no_such_module_ferrepl"]).await;
    let probe = "import sys\n('colorsys' in sys.modules, 'wave' in sys.modules)";
    let default = server.exec(probe).await;
    assert_eq!(default.value(), Some("(True, False)"), "{default:#?}");
    // A second session: an interpreter of the warm pool.
    let other = server.exec_in("other", probe).await;
    assert_eq!(other.value(), Some("(True, False)"), "{other:#?}");
    let log = server.stderr_log();
    assert_eq!(
        log.matches("--preimport: no_such_module_ferrepl: ModuleNotFoundError")
            .count(),
        1,
        "a module that does not import is reported once: {log}"
    );
}

#[tokio::test]
async fn each_tenant_gets_the_packages_in_its_own_kept_venv() {
    let index = TestIndex::start().await;
    let place = Place::new();
    let tokens = place.state.path().join("tokens");
    std::fs::write(
        &tokens,
        "alpha-token-0123456789abcdef alpha\nbeta-token-0123456789abcdef0 beta\n",
    )
    .expect("tokens");
    let state = place.state.path().join("state");
    let python = real_python3();
    let envs = Place::envs(&index);
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = HttpServer::start(
        &[
            "--auth-token-file",
            path_str(&tokens),
            "--warm-pool",
            "0",
            "--state-dir",
            path_str(&state),
            "--python",
            path_str(&python),
            "--egress-allow-private",
            "--preinstall",
            PKG,
        ],
        &envs,
    )
    .await;
    for token in [
        "alpha-token-0123456789abcdef",
        "beta-token-0123456789abcdef0",
    ] {
        let client = server.connect_at("/mcp", token).await;
        let mut last = call(
            client.peer(),
            "python_exec",
            json!({"code": IMPORT, "wait_s": 45}),
        )
        .await;
        for _ in 0..WAIT_ROUNDS {
            if last.structured["status"] != "running" {
                break;
            }
            last = call(client.peer(), "python_wait", json!({"wait_s": WAIT_S})).await;
        }
        assert_eq!(
            last.value(),
            Some(PKG_VALUE.to_string().as_str()),
            "each tenant's first cell imports the package: {last:#?}\nserver stderr:\n{}\n{}",
            server.stderr_log(),
            index.diagnostics()
        );
    }
    // One install, and one stamp, per tenant's venv.
    let log = server.stderr_log();
    assert_eq!(log.matches("preinstall done").count(), 2, "{log}");
    let stamps: Vec<String> = std::fs::read_dir(state.join("venvs"))
        .expect("the kept venvs")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".preinstalled"))
        .collect();
    assert_eq!(stamps.len(), 2, "{stamps:?}");
    assert!(
        stamps.iter().any(|s| s.ends_with("-alpha.preinstalled"))
            && stamps.iter().any(|s| s.ends_with("-beta.preinstalled")),
        "{stamps:?}"
    );
}
