//! R around the sessions: a missing R, r_install from a CRAN mirror through
//! the installers' egress proxy (a small repository served on loopback
//! stands in for CRAN, which CI cannot reach), no R process outliving the
//! server, and the cell time limit.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::support::{StdioServer, ToolOutput, path_str};

const R_FLAGS: [&str; 2] = ["--languages", "python,r"];

/// A CRAN-like repository (`src/contrib` with PACKAGES) holding the test
/// package, served over HTTP on 127.0.0.1 until dropped.
struct Mirror {
    url: String,
    /// Killed on drop.
    _server: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl Mirror {
    async fn start() -> Mirror {
        let dir = tempfile::tempdir().expect("tempdir");
        let contrib = dir.path().join("src/contrib");
        std::fs::create_dir_all(&contrib).expect("mkdir src/contrib");
        let tarball = crate::r_sessions::build_test_package(&contrib).await;
        assert!(contrib.join(tarball).is_file());
        let indexed = tokio::process::Command::new("R")
            .args(["--vanilla", "--quiet", "--no-echo", "-e"])
            .arg("tools::write_PACKAGES('.', type = 'source')")
            .current_dir(&contrib)
            .output()
            .await
            .expect("run R for write_PACKAGES");
        assert!(
            indexed.status.success() && contrib.join("PACKAGES").is_file(),
            "write_PACKAGES failed: {}",
            String::from_utf8_lossy(&indexed.stderr)
        );
        // Port 0: the kernel picks it, and the server says which.
        let mut server = tokio::process::Command::new("python3")
            .args(["-u", "-m", "http.server", "--bind", "127.0.0.1", "0"])
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start python3 -m http.server");
        let stdout = server.stdout.take().expect("the mirror's stdout");
        let port = tokio::time::timeout(Duration::from_secs(20), serving_port(stdout))
            .await
            .expect("the mirror did not say its port within 20 s")
            .expect("the mirror exited without saying its port");
        Mirror {
            url: format!("http://127.0.0.1:{port}"),
            _server: server,
            _dir: dir,
        }
    }
}

/// The port from http.server's first line, "Serving HTTP on 127.0.0.1 port N (...)".
async fn serving_port(stdout: tokio::process::ChildStdout) -> Option<u16> {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let port = line.split(" port ").nth(1).and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        });
        if port.is_some() {
            return port;
        }
    }
    None
}

async fn install(server: &StdioServer, package: &str) -> ToolOutput {
    let args = json!({ "packages": [package], "wait_s": 45 });
    let mut out = server.call("r_install", args.clone()).await;
    for _ in 0..8 {
        if out.structured["status"] != "running" {
            break;
        }
        out = server.call("r_install", args.clone()).await;
    }
    out
}

#[tokio::test]
async fn r_install_reaches_the_cran_mirror_through_the_proxy() {
    let mirror = Mirror::start().await;
    let server = StdioServer::start(&[
        "--languages",
        "python,r",
        "--cran",
        &mirror.url,
        "--egress-allow-private",
    ])
    .await;
    let out = install(&server, "ferrepltestpkg").await;
    assert!(
        !out.is_error && out.structured["exit_code"] == 0,
        "the install from the mirror failed: {out:#?}\n{}",
        server.stderr_log()
    );
    assert!(
        library_has(server.workdir.path(), "ferrepltestpkg"),
        "the package is in the workspace library"
    );
    let used = server
        .call(
            "r_exec",
            json!({"code": "library(ferrepltestpkg); hello()", "wait_s": 30}),
        )
        .await;
    used.assert_ok();
    assert!(used.text.contains("hi from pkg"), "{used:#?}");
}

#[tokio::test]
async fn a_loopback_mirror_is_refused_without_the_operator_flag() {
    let mirror = Mirror::start().await;
    let server = StdioServer::start(&["--languages", "python,r", "--cran", &mirror.url]).await;
    let out = install(&server, "ferrepltestpkg").await;
    assert!(out.is_error, "the install must fail: {out:#?}");
    let text = format!(
        "{}{}",
        out.text,
        out.structured["stderr"].as_str().unwrap_or_default()
    );
    assert!(
        text.contains("not installed: ferrepltestpkg"),
        "the job says what did not install: {text}"
    );
    assert!(!library_has(server.workdir.path(), "ferrepltestpkg"));
}

#[tokio::test]
async fn a_missing_r_is_reported_with_how_to_install_it() {
    let missing = tempfile::tempdir().expect("tempdir");
    let r = missing.path().join("R");
    let server = StdioServer::start(&["--languages", "python,r", "--r", path_str(&r)]).await;
    let out = server.call("r_exec", json!({"code": "1"})).await;
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text.contains("apt-get install r-base-core") && out.text.contains("--r PATH"),
        "the error says how to get R: {:?}",
        out.text
    );
    server.exec("1 + 1").await.assert_ok();
}

fn library_has(workdir: &Path, package: &str) -> bool {
    workdir
        .join(".ferrepl/r-library")
        .join(package)
        .join("DESCRIPTION")
        .is_file()
}

#[tokio::test]
async fn killing_the_server_leaves_no_r_process_behind() {
    let server = StdioServer::start(&R_FLAGS).await;
    let out = server
        .call(
            "r_exec",
            json!({"code": "system('sleep 300', wait = FALSE); cat('started\\n')", "wait_s": 30}),
        )
        .await;
    out.assert_ok();
    let worker = crate::support::session_pid(server.peer(), "r").await;
    // The sandbox's init (R's grandparent, above the supervisor of
    // protected places) adopts the background sleep.
    let root = crate::support::parent_pid(worker)
        .and_then(crate::support::parent_pid)
        .unwrap_or(worker);
    let mut tree = crate::support::descendants(root);
    tree.push(root);
    assert!(
        tree.contains(&worker) && tree.len() >= 3,
        "R, its init and the sleeping child: {tree:?}"
    );
    server.sigkill_and_reap(Duration::from_secs(10)).await;
    for pid in tree {
        assert!(
            crate::support::wait_process_gone(pid, Duration::from_secs(15)).await,
            "process {pid} of the R session outlived the server"
        );
    }
}

#[tokio::test]
async fn the_cell_time_limit_interrupts_an_r_cell_and_keeps_the_session() {
    let server = StdioServer::start(&["--languages", "python,r", "--max-cell-seconds", "1"]).await;
    let setup = server
        .call("r_exec", json!({"code": "kept <- 7", "wait_s": 30}))
        .await;
    setup.assert_ok();
    let out = server
        .call("r_exec", json!({"code": "Sys.sleep(60)", "wait_s": 30}))
        .await;
    assert_eq!(out.structured["status"], "interrupted", "{out:#?}");
    assert!(out.text.contains("max-cell-seconds"), "{:?}", out.text);
    let after = server
        .call("r_exec", json!({"code": "kept", "wait_s": 30}))
        .await;
    after.assert_ok();
    assert!(after.text.contains("[1] 7"), "{after:#?}");
}

#[tokio::test]
async fn r_alone_starts_no_python() {
    let server = StdioServer::start(&["--languages", "r"]).await;
    server
        .call("r_exec", json!({"code": "cat('ready\\n')", "wait_s": 30}))
        .await
        .assert_ok();
    let created = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "extra"}),
        )
        .await;
    assert!(!created.is_error, "{created:#?}");
    let sessions = created.structured["sessions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<(&str, &str)> = sessions
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or(""),
                s["language"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(names, [("extra", "r"), ("r", "r")], "{created:#?}");
    let pythons: Vec<u32> = crate::support::descendants(server.pid())
        .into_iter()
        .filter(|pid| {
            crate::support::cmdline(*pid)
                .is_some_and(|args| args.iter().any(|a| a.contains("python")))
        })
        .collect();
    assert!(
        pythons.is_empty(),
        "a Python process under an R-only server: {pythons:?}"
    );
}
