//! One line where agents stumble (issue 45 §3): a cell that runs a package
//! manager and fails is pointed to python_install; a cell that fails to
//! reach the network, when cells have none by design, is told so and which
//! flag would change it. Only when it happens, and not when cells have the
//! network (`--network on`).

use crate::support::StdioServer;
use serde_json::json;

/// What an agent reaches for: the network from a cell.
const FETCH: &str =
    "import urllib.request\nurllib.request.urlopen('http://pypi.org/simple/', timeout=5)";

#[tokio::test]
async fn a_cell_that_cannot_reach_the_network_is_told_why() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .call("python_exec", json!({"code": FETCH, "wait_s": 30}))
        .await;
    assert_eq!(out.structured["status"], "error", "{out:#?}");
    let notes = out.notes_text();
    assert!(
        notes.contains("Cells have no network by design")
            && notes.contains("--network on")
            && notes.contains("python_install"),
        "{out:#?}"
    );
    // Only when it happens: a cell that works gets no such line.
    let fine = server.call("python_exec", json!({"code": "1 + 1"})).await;
    assert!(!fine.notes_text().contains("network"), "{fine:#?}");
}

#[tokio::test]
async fn a_package_manager_run_from_a_cell_points_to_python_install() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .call(
            "python_exec",
            json!({
                "code": "import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', '--retries', '0', '--timeout', '2', 'surely-not-a-package-zz'], capture_output=True, text=True)\nprint(r.stdout + r.stderr)\nassert r.returncode == 0, 'pip failed'",
                "wait_s": 45
            }),
        )
        .await;
    let notes = out.notes_text();
    assert!(
        notes.contains("python_install {\"packages\": [...]}") && notes.contains("not from a cell"),
        "{out:#?}"
    );
}

#[tokio::test]
async fn cells_with_the_network_get_no_network_line() {
    // Whether or not this machine reaches the host, the operator gave cells
    // the network: a failure is the host's, and says nothing of the flag.
    let server = StdioServer::start(&["--network", "on"]).await;
    let out = server
        .call("python_exec", json!({"code": FETCH, "wait_s": 30}))
        .await;
    assert!(
        !out.notes_text().contains("Cells have no network"),
        "{out:#?}"
    );
}

/// `help(ferrepl)` fits one screen (pydoc's page was 12,608 characters,
/// most of it what the exception classes inherit); help on one function is
/// still pydoc's, and help() of anything else is untouched.
#[tokio::test]
async fn help_on_ferrepl_fits_a_screen() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .call(
            "python_exec",
            json!({"code": "import ferrepl, io, contextlib\ndef shown(x):\n    b = io.StringIO()\n    with contextlib.redirect_stdout(b):\n        help(x)\n    return b.getvalue()\nwhole = shown(ferrepl)\n(len(whole), 'ferrepl.acall' in whole, 'CallRefused' in whole, 'def' in shown(ferrepl.call) or 'call(server' in shown(ferrepl.call), len(shown(len)) > 50)"}),
        )
        .await;
    out.assert_ok();
    let value = out.structured["value"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let parts: Vec<&str> = value.trim_matches(['(', ')']).split(", ").collect();
    let size: usize = parts[0].parse().unwrap_or(usize::MAX);
    assert!(size <= 2000, "help(ferrepl) is {size} characters: {out:#?}");
    assert_eq!(parts[1..], ["True", "True", "True", "True"], "{out:#?}");
}
