//! Floods from the agent's kernel: cells "of another client" it forges
//! (execute_input under a session id not the bridge's, which it can sign),
//! a stream of output messages while another session works, displays by
//! the thousand and an error of many megabytes. The history, the notes,
//! the result and the server's memory stay bounded, and other sessions
//! are served meanwhile.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{PROTOCOL, exec, kernel_server, memory_kib, settle};
use crate::support::image_blocks;

/// What --output-keep-cells defaults to; the history keeps four times it.
const KEEP_CELLS: usize = 50;

#[tokio::test]
async fn forged_cells_of_another_client_stay_bounded() {
    let server = kernel_server(&[], &[]).await;
    let other = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "k2", "kernel": "python3"}),
        )
        .await;
    assert!(!other.is_error, "{other:#?}");
    exec(&server, "k", "mine = 1").await.assert_ok();
    // 1000 "foreign" cells of 20,000 characters of code each, with
    // output, ended by an idle status: 25 MB through the bridge, paced
    // (5 ms a cell) so that the burst of a_burst_of_output_messages...
    // does not decide it. The cell says how long the kernel took.
    let code = format!(
        "{PROTOCOL}\nimport time\nt0 = time.time()\nfor i in range(1000):\n    p = header('execute_request', 'forged-client-%d' % (i % 7))\n    \
         publish('execute_input', {{'code': 'F' * 20000 + str(i), 'execution_count': i}}, p)\n    \
         publish('stream', {{'name': 'stdout', 'text': 'O' * 5000}}, p)\n    \
         publish('status', {{'execution_state': 'idle'}}, p)\n    time.sleep(0.005)\nprint('sent in', round(time.time() - t0, 1), 's')\n'forged'"
    );
    let started = Instant::now();
    let first = server
        .call(
            "python_exec",
            json!({"session": "k", "code": code, "wait_s": 2}),
        )
        .await;
    // Another session is served meanwhile.
    let at = Instant::now();
    exec(&server, "k2", "2 + 2").await.assert_ok();
    let other_took = at.elapsed();
    let out = settle(&server, "k", first, Duration::from_secs(150)).await;
    let took = started.elapsed();
    let sent_in = out.str_field("stdout").to_string();
    out.assert_ok();
    let next = exec(&server, "k", "mine").await;
    next.assert_ok();
    let told = format!("{}\n{}", next.text, next.notes_text());
    assert!(
        told.len() < 64 * 1024,
        "{} bytes of result after the forged cells",
        told.len()
    );
    let history = server.call("python_history", json!({"session": "k"})).await;
    let cells = history.structured["cells"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let foreign = cells.iter().filter(|c| c["by"] == "another client").count();
    assert!(
        foreign <= KEEP_CELLS * 4,
        "{foreign} rows of another client's cells in the history"
    );
    assert!(
        history.text.len() < 4 << 20,
        "python_history answers {} bytes",
        history.text.len()
    );
    let rss_mib = memory_kib(server.pid(), "VmRSS") / 1024;
    assert!(
        rss_mib < 512,
        "the server holds {rss_mib} MiB after the forged cells"
    );
    assert!(
        other_took < Duration::from_secs(10),
        "another session's cell took {other_took:?} during the forged cells"
    );
    assert!(
        took < Duration::from_secs(60),
        "1000 forged cells took the server {took:?} to get through ({sent_in})"
    );
}

#[tokio::test]
async fn a_flood_of_output_messages_leaves_other_sessions_served() {
    let server = kernel_server(&[], &[]).await;
    let other = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "k2", "kernel": "python3"}),
        )
        .await;
    assert!(!other.is_error, "{other:#?}");
    exec(&server, "k2", "1").await.assert_ok();
    // 40 seconds of signed stream messages as fast as the kernel sends.
    let flood = format!(
        "{PROTOCOL}\nimport time\nend = time.time() + 40\nn = 0\n\
         while time.time() < end:\n    publish('stream', {{'name': 'stdout', 'text': 'z' * 4000 + '\\n'}}, me)\n    n += 1\nn"
    );
    let started = server
        .call(
            "python_exec",
            json!({"session": "k", "code": flood, "wait_s": 1}),
        )
        .await;
    assert_eq!(started.status(), "running", "{started:#?}");
    let mut slowest = Duration::ZERO;
    for i in 0..5 {
        let at = Instant::now();
        let out = exec(&server, "k2", &format!("{i} + 1")).await;
        out.assert_ok();
        slowest = slowest.max(at.elapsed());
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let rss_mib = memory_kib(server.pid(), "VmRSS") / 1024;
    let stopping = server
        .call(
            "python_wait",
            json!({"session": "k", "interrupt": true, "wait_s": 50}),
        )
        .await;
    let stopped = settle(&server, "k", stopping, Duration::from_secs(120)).await;
    assert!(
        stopped.text.len() < 1 << 20,
        "{} bytes of result",
        stopped.text.len()
    );
    assert!(
        slowest < Duration::from_secs(10),
        "another session's cell took {slowest:?} during the flood"
    );
    assert!(
        rss_mib < 512,
        "the server holds {rss_mib} MiB during the flood"
    );
}

#[tokio::test]
async fn displays_by_the_thousand_stay_bounded() {
    let server = kernel_server(&[], &[]).await;
    let code = "import base64\nfrom IPython.display import Image, display\n\
        png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\n\
        import time\nfor i in range(5000):\n    display(Image(data=png))\n    time.sleep(0.002)\n\
        from IPython.display import HTML\nfor i in range(2000):\n    display(HTML('<b>' + 'h' * 10000 + '</b>'))\n    time.sleep(0.002)\n'shown'";
    let first = exec(&server, "k", code).await;
    let started = Instant::now();
    let out = settle(&server, "k", first, Duration::from_secs(150)).await;
    let took = started.elapsed();
    out.assert_ok();
    let images = image_blocks(&out).len();
    assert!(images <= 64, "{images} images in one result");
    let size = serde_json::to_string(&out.raw).map_or(0, |s| s.len());
    assert!(
        size < 256 * 1024,
        "a result of 7000 displays is {size} bytes ({} entries in its display list)",
        out.display().len()
    );
    assert!(
        took < Duration::from_secs(60),
        "7000 displays took the server {took:?} past the first 60 s"
    );
}

#[tokio::test]
async fn an_error_of_fifty_megabytes_stays_bounded() {
    let server = kernel_server(&[], &[]).await;
    // An error whose value and traceback are 50 MB: plain Python, no
    // protocol needed.
    let out = exec(
        &server,
        "k",
        "class Huge(Exception):\n    pass\nraise Huge('E' * 50_000_000)",
    )
    .await;
    assert_eq!(
        out.structured["status"],
        "error",
        "a cell raising an error of 50 MB did not end within 50 s: {}\n(the server's log {} an oversized event)",
        out.text,
        if server.stderr_log().contains("oversized event") {
            "mentions"
        } else {
            "does not mention"
        }
    );
    out.assert_raised("Huge");
    let size = serde_json::to_string(&out.raw).map_or(0, |s| s.len());
    assert!(size < 1 << 20, "an error's result is {size} bytes");
    let history = server.call("python_history", json!({"session": "k"})).await;
    assert!(
        history.text.len() < 1 << 20,
        "python_history answers {} bytes",
        history.text.len()
    );
    let rss_mib = memory_kib(server.pid(), "VmRSS") / 1024;
    assert!(rss_mib < 512, "the server holds {rss_mib} MiB");
}

#[tokio::test]
async fn a_burst_of_output_messages_ends_with_its_cell() {
    let server = kernel_server(&[], &[]).await;
    let other = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "d", "kernel": "python3"}),
        )
        .await;
    assert!(!other.is_error, "{other:#?}");
    // Messages as fast as the kernel sends them, more than the 1000 a
    // ZeroMQ PUB socket queues for a subscriber by default: signed stream
    // messages, and plain display() calls (no protocol, ordinary code).
    let bursts = [
        (
            "k",
            format!(
                "{PROTOCOL}\nfor i in range(3000):\n    publish('stream', {{'name': 'stdout', 'text': 'x' * 2000}}, me)\n'burst'"
            ),
        ),
        (
            "d",
            "import base64\nfrom IPython.display import HTML, Image, display\n\
             png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\n\
             for i in range(5000):\n    display(Image(data=png))\n\
             for i in range(2000):\n    display(HTML('<b>' + 'h' * 10000 + '</b>'))\n'shown'".to_string(),
        ),
    ];
    let mut hung = Vec::new();
    // Whether a burst is lost is a race: twelve rounds of the stream
    // burst (under a second each when nothing is lost), one of displays.
    let rounds = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    for (round, which) in rounds.iter().enumerate() {
        let (session, code) = &bursts[*which];
        if hung
            .iter()
            .any(|h: &String| h.starts_with(&format!("session {session}:")))
        {
            continue;
        }
        let first = server
            .call(
                "python_exec",
                json!({"session": session, "code": code, "wait_s": 50}),
            )
            .await;
        let out = settle(&server, session, first, Duration::from_secs(60)).await;
        if out.structured["status"] == "ok" {
            continue;
        }
        let stopped = server
            .call(
                "python_wait",
                json!({"session": session, "interrupt": true, "wait_s": 30}),
            )
            .await;
        hung.push(format!(
            "session {session}: round {round}: {}\nan interrupt then gave: {}",
            out.text
                .chars()
                .rev()
                .take(200)
                .collect::<String>()
                .chars()
                .rev()
                .collect::<String>(),
            stopped.text.chars().take(400).collect::<String>(),
        ));
    }
    let log = server.stderr_log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("fence") || l.contains("iopub") || l.contains("kernel"))
        .take(20)
        .collect();
    assert!(
        hung.is_empty(),
        "cells that sent a burst of output messages did not end within 100 s (the kernel sends them in seconds):\n{}\nthe server's log on it:\n{}",
        hung.join("\n\n"),
        said.join("\n")
    );
}
