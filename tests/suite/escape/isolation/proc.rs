//! /proc shows neither the server nor other sessions, nor their environment.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{
    Reaper, StdioServer, ToolOutput, cmdline, everything, job_python, json_line,
    processes_with_arg, py, py_path, run_cell, run_job, unique,
};

use super::*;

/// A scanner for sessions (`scan(needles_path)`) and jobs (`python3 FILE
/// NEEDLES`): lists the pids of `/proc`, reads every `cmdline` and `environ`
/// it can, and reports on one short `SCAN=<json>` line: which files hold a
/// needle, where the server's argv shows up, what the server's own pid is
/// there, what reading the server's environ gave, and which of its own
/// environment variables hold a needle. Nothing read is printed (it may
/// carry secrets of the host). The needles come from a file so that they
/// appear in no command line.
const SCANNER: &str = r#"
import json, os, sys

def scan(needles_path):
    with open(needles_path) as f:
        spec = json.load(f)
    needles = [n.encode() for n in spec["needles"]]
    server_pid = str(spec["server_pid"])
    server_argv = [a.encode() for a in spec["server_argv"]]
    pids = sorted(p for p in os.listdir("/proc") if p.isdigit())
    hits, server_argv_at, server_pid_status = [], [], "absent"
    for p in pids:
        if p == server_pid:
            server_pid_status = "unreadable"
        for what in ("cmdline", "environ"):
            try:
                with open(f"/proc/{p}/{what}", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if what == "cmdline":
                argv = [a for a in data.split(b"\0") if a]
                if argv == server_argv:
                    server_argv_at.append(p)
                if p == server_pid:
                    server_pid_status = "the server" if argv == server_argv else "another process"
            if any(n in data for n in needles):
                hits.append(f"{p}/{what}")
    try:
        with open(f"/proc/{server_pid}/environ", "rb") as f:
            data = f.read()
        server_environ = "readable, needle " + ("FOUND" if any(n in data for n in needles) else "absent")
    except OSError as e:
        server_environ = f"{type(e).__name__} errno={e.errno}"
    own = [k for k, v in os.environ.items() if any(n in (k + "=" + v).encode() for n in needles)]
    print("SCAN=" + json.dumps({
        "npids": len(pids), "hits": hits[:20], "nhits": len(hits),
        "server_argv_at": server_argv_at[:20], "server_pid": server_pid_status,
        "server_environ": server_environ, "own_env": own,
    }), flush=True)

if __name__ == "__main__":
    scan(sys.argv[1])
"#;

/// Writes the scanner and its needles into the workspace; returns the
/// (scanner, needles) paths.
fn write_scanner(ws: &Path, needles: &[&str], server_pid: u32) -> (PathBuf, PathBuf) {
    let scanner = ws.join("proc_scan.py");
    let spec = ws.join("proc_scan_needles.json");
    let server_argv = cmdline(server_pid).expect("the server's argv");
    std::fs::write(&scanner, SCANNER).expect("write the scanner");
    std::fs::write(
        &spec,
        json!({ "needles": needles, "server_pid": server_pid, "server_argv": server_argv })
            .to_string(),
    )
    .expect("write the needles");
    (scanner, spec)
}

/// Runs the scanner in `session` and in a shell job; returns both reports.
async fn scan_from_session_and_job(
    server: &StdioServer,
    session: &str,
    scanner: &Path,
    spec: &Path,
) -> Vec<(String, Value, ToolOutput)> {
    let cell = format!(
        "_ns = {{}}\nexec(compile(open({s}).read(), {s}, 'exec'), _ns)\n_ns['scan']({n})\n",
        s = py_path(scanner),
        n = py_path(spec),
    );
    let from_session = run_cell(server, session, &cell).await;
    let from_job = run_job(
        server,
        json!({ "command": format!("{} {} {}", job_python(), scanner.display(), spec.display()) }),
    )
    .await;
    vec![
        (
            format!("session {session}"),
            json_line(&from_session, "SCAN"),
            from_session,
        ),
        (
            "a shell job".to_string(),
            json_line(&from_job, "SCAN"),
            from_job,
        ),
    ]
}

/// Asserts that a scan report saw none of the needles and not the server.
fn assert_nothing_found(who: &str, report: &Value, out: &ToolOutput, needles: &[&str]) {
    assert_eq!(
        report["nhits"],
        json!(0),
        "{who} found a needle in /proc files (among {} pids): {report}",
        report["npids"]
    );
    assert_eq!(
        report["own_env"],
        json!([]),
        "{who} holds a needle in its own environment (names shown): {report}"
    );
    let server_environ = report["server_environ"].as_str().unwrap_or_default();
    assert!(
        !server_environ.contains("FOUND"),
        "{who} read the server's environment: {report}"
    );
    assert_eq!(
        report["server_argv_at"],
        json!([]),
        "{who} sees the server's process: {report}"
    );
    // The same number inside a PID namespace may be another process.
    assert!(
        matches!(
            report["server_pid"].as_str(),
            Some("absent" | "another process")
        ),
        "{who} lists the server's pid: {report}"
    );
    let all = everything(out);
    for needle in needles {
        assert!(
            !all.contains(needle),
            "{who}'s result carries the needle {needle}"
        );
    }
}

#[tokio::test]
async fn proc_shows_neither_the_server_nor_other_sessions() {
    let secret = unique("DECOY-SECRET-");
    let marker = unique("ferrepl-escape-marker-");
    let _reaper = Reaper::of_marker(&marker);
    let mut server = StdioServer::start_with_env(&[], &[("DECOY_SECRET", &secret)]).await;
    let server_pid = server.child.id().expect("the server's pid");

    // Session A runs a long sleeper carrying the marker.
    let started = run_cell(
        &server,
        "a",
        &format!(
            "import subprocess, sys\n_sleeper = subprocess.Popen([sys.executable, '-c', \
             'import time; time.sleep(1000)', {}])\n'started'",
            py(&marker)
        ),
    )
    .await;
    assert_eq!(started.value(), Some("'started'"), "{started:#?}");
    let deadline = tokio::time::Instant::now() + POLL_TIMEOUT;
    while processes_with_arg(&marker).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "session a's marked sleeper never appeared on the host"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let (scanner, spec) = write_scanner(server.workdir.path(), &[&secret, &marker], server_pid);
    for (who, report, out) in scan_from_session_and_job(&server, "b", &scanner, &spec).await {
        assert_nothing_found(&who, &report, &out, &[&secret, &marker]);
    }

    server.assert_alive();
    server.close_and_wait().await;
}

#[tokio::test]
async fn another_sessions_environment_is_out_of_reach() {
    let secret = unique("A-SECRET-");
    let mut server = StdioServer::start(&[]).await;
    let server_pid = server.child.id().expect("the server's pid");

    let created = server
        .call(
            "python_sessions",
            json!({ "action": "create", "session": "a", "env": { "A_SECRET": secret } }),
        )
        .await;
    assert!(!created.is_error, "creating session a failed: {created:#?}");
    // The decoy really is in session a's environment.
    let check = run_cell(
        &server,
        "a",
        "import os\nlen(os.environ.get('A_SECRET', ''))",
    )
    .await;
    assert_eq!(
        check.value(),
        Some(secret.len().to_string().as_str()),
        "session a should hold A_SECRET: {check:#?}"
    );

    let (scanner, spec) = write_scanner(server.workdir.path(), &[&secret], server_pid);
    for (who, report, out) in scan_from_session_and_job(&server, "b", &scanner, &spec).await {
        assert_nothing_found(&who, &report, &out, &[&secret]);
    }

    server.assert_alive();
    server.close_and_wait().await;
}
