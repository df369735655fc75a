//! Fork checkpoints: going back to a cell resumes a frozen copy of the
//! state after it (nothing re-run), the live state is kept as a copy too,
//! interrupts never wait in a copy, copies past --checkpoints are dropped
//! (their cells are re-run), a process with threads is not copied, a crash
//! after a switch reports the real signal, and copies' shared memory counts
//! once against the memory limit.

use serde_json::json;

use crate::support::StdioServer;

const FAST: [&str; 2] = ["--checkpoint-min-ms", "0"];

async fn server(extra: &[&str]) -> StdioServer {
    let mut args = FAST.to_vec();
    args.extend_from_slice(extra);
    StdioServer::start(&args).await
}

/// A cell that counts its runs in a file of the workspace.
fn counted(name: &str, code: &str) -> String {
    format!("open({name:?}, 'a').write('+')\n{code}")
}

fn runs(server: &StdioServer, name: &str) -> usize {
    std::fs::read_to_string(server.workdir.path().join(name))
        .map(|s| s.len())
        .unwrap_or(0)
}

#[tokio::test]
async fn going_back_resumes_a_copy_and_reruns_nothing() {
    let server = server(&[]).await;
    server
        .exec_in("k", &counted("one.txt", "a = 1"))
        .await
        .assert_ok();
    server
        .exec_in("k", &counted("two.txt", "a = 2\nb = 'two'"))
        .await
        .assert_ok();

    let back = server.exec_after("k", json!(1), "a").await;
    back.assert_ok();
    assert_eq!(back.value(), Some("1"), "{back:#?}");
    let said = back.notes_text();
    assert!(
        said.contains("switched to the state after cell 1 by resuming its checkpoint")
            && said.contains("nothing was re-run"),
        "{said}"
    );
    assert_eq!(runs(&server, "one.txt"), 1, "cell 1 ran again");

    // The state left behind was kept as a copy as well.
    let forth = server.exec_after("k", json!(2), "(a, b)").await;
    forth.assert_ok();
    assert_eq!(forth.value(), Some("(2, 'two')"), "{forth:#?}");
    assert!(
        forth.notes_text().contains("resuming its checkpoint"),
        "{forth:#?}"
    );
    assert_eq!((runs(&server, "one.txt"), runs(&server, "two.txt")), (1, 1));

    // And the session goes on as usual from there.
    let next = server.exec_in("k", "a + 40").await;
    assert_eq!(next.value(), Some("42"), "{next:#?}");
}

#[tokio::test]
async fn an_interrupt_does_not_wait_in_a_copy() {
    let server = server(&[]).await;
    server.exec_in("k", "x = 1").await.assert_ok();
    let long = server
        .call(
            "python_exec",
            json!({"session": "k", "code": "import time\ntime.sleep(30)", "wait_s": 0.3}),
        )
        .await;
    assert_eq!(long.str_field("status"), "running", "{long:#?}");
    let stopped = server
        .call("python_wait", json!({"session": "k", "interrupt": true}))
        .await;
    assert_eq!(stopped.str_field("status"), "interrupted", "{stopped:#?}");
    // The copy of cell 1 was frozen while the interrupt was sent to the
    // session: resumed, it runs a slow cell to its end.
    let resumed = server
        .exec_after("k", json!(1), "import time\ntime.sleep(0.5)\nx")
        .await;
    resumed.assert_ok();
    assert_eq!(resumed.value(), Some("1"), "{resumed:#?}");
    assert!(
        resumed.notes_text().contains("resuming its checkpoint"),
        "{resumed:#?}"
    );
}

#[tokio::test]
async fn copies_past_the_limit_are_rebuilt_by_rerunning() {
    let server = server(&["--checkpoints", "1"]).await;
    server
        .exec_in("k", &counted("one.txt", "a = 1"))
        .await
        .assert_ok();
    server.exec_in("k", "a = 2").await.assert_ok();
    server.exec_in("k", "a = 3").await.assert_ok();
    let back = server.exec_after("k", json!(1), "a").await;
    back.assert_ok();
    assert_eq!(back.value(), Some("1"), "{back:#?}");
    let said = back.notes_text();
    assert!(
        said.contains("re-running cells 1 ") && !said.contains("resuming its checkpoint"),
        "{said}"
    );
    assert_eq!(runs(&server, "one.txt"), 2);
}

#[tokio::test]
async fn a_process_with_threads_is_not_copied() {
    let server = server(&[]).await;
    server
        .exec_in(
            "k",
            &counted(
                "one.txt",
                "import threading, time\nt = threading.Thread(target=time.sleep, args=(60,), daemon=True, name='sleeper')\nt.start()\na = 1",
            ),
        )
        .await
        .assert_ok();
    server.exec_in("k", "a = 2").await.assert_ok();
    let back = server.exec_after("k", json!(1), "(a, t.is_alive())").await;
    back.assert_ok();
    // Re-run in a fresh interpreter: the thread is there again.
    assert_eq!(back.value(), Some("(1, True)"), "{back:#?}");
    let said = back.notes_text();
    assert!(said.contains("re-running cells 1 "), "{said}");
    assert!(
        said.contains("Cell 1 has no checkpoint: threads are running (sleeper)"),
        "{said}"
    );
    assert_eq!(runs(&server, "one.txt"), 2);
}

#[tokio::test]
async fn a_crash_after_a_switch_reports_the_signal() {
    let server = server(&[]).await;
    server.exec_in("k", "a = 1").await.assert_ok();
    server.exec_in("k", "a = 2").await.assert_ok();
    server.exec_after("k", json!(1), "a").await.assert_ok();
    let crash = server
        .exec_in(
            "k",
            "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        )
        .await;
    assert_eq!(crash.str_field("status"), "crashed", "{crash:#?}");
    assert!(crash.notes_text().contains("SIGKILL"), "{crash:#?}");
    let fresh = server.exec_in("k", "'a' in globals()").await;
    assert_eq!(fresh.value(), Some("False"), "{fresh:#?}");
}

#[tokio::test]
async fn copies_share_memory_and_count_it_once() {
    // Three copies of a 300 MB state would be 1.2 GB counted as RSS: over
    // the limit. As PSS (and for the kernel) it is about 300 MB.
    let server = server(&["--memory-limit", "800M"]).await;
    server
        .exec_in("k", "big = b'x' * (300 << 20)")
        .await
        .assert_ok();
    server.exec_in("k", "y = 1").await.assert_ok();
    server.exec_in("k", "z = 2").await.assert_ok();
    let back = server.exec_after("k", json!(1), "len(big) >> 20").await;
    back.assert_ok();
    assert_eq!(back.value(), Some("300"), "{back:#?}");
    assert!(
        back.notes_text().contains("resuming its checkpoint"),
        "{back:#?}"
    );
    let listing = server.call("python_sessions", json!({})).await;
    let row = listing.structured["sessions"]
        .as_array()
        .and_then(|s| s.iter().find(|r| r["name"] == "k").cloned())
        .unwrap_or_default();
    let memory = row["memory_bytes"].as_u64().unwrap_or(0);
    // (The kernel may page out some of a copy's cold memory: no tight
    // lower bound.)
    assert!(
        memory > (100 << 20) && memory < (600 << 20),
        "memory of the session with its copies: {memory} ({row:#?})"
    );
    server.exec_in("k", "still = 'alive'").await.assert_ok();
}

#[tokio::test]
async fn copies_give_way_before_the_memory_limit() {
    // Each cell replaces `a` with another 150 MiB: the copies of cells 1
    // and 2 pin the old ones. Past 3/4 of the 600 MiB limit the least
    // recently used copy is dropped instead of the session being killed.
    let server = server(&["--memory-limit", "600M"]).await;
    for byte in ["1", "2", "3"] {
        server
            .exec_in("k", &format!("a = b'{byte}' * (150 << 20)"))
            .await
            .assert_ok();
    }
    assert!(
        server
            .wait_stderr_contains("checkpoint dropped", std::time::Duration::from_secs(20))
            .await,
        "no copy was dropped: {}",
        server.stderr_log()
    );
    let back = server.exec_after("k", json!(1), "a[:1]").await;
    back.assert_ok();
    assert_eq!(back.value(), Some("b'1'"), "{back:#?}");
    assert!(
        back.notes_text()
            .contains("it was dropped to keep the session under its memory limit"),
        "{back:#?}"
    );
}

#[tokio::test]
async fn a_copy_of_the_same_code_on_the_same_state_serves() {
    let server = server(&["--checkpoints", "2"]).await;
    server
        .exec_in("k", &counted("one.txt", "a = 1"))
        .await
        .assert_ok();
    // A fresh interpreter runs the same code again (cell 2): its copy is
    // the state after cell 1 as well, once cell 1's own copy is gone.
    server
        .exec_after("k", json!(0), &counted("one.txt", "a = 1"))
        .await
        .assert_ok();
    server.exec_in("k", "b = a + 1").await.assert_ok();
    assert_eq!(runs(&server, "one.txt"), 2);
    let back = server
        .exec_after("k", json!(1), "('b' in globals(), a)")
        .await;
    back.assert_ok();
    assert_eq!(back.value(), Some("(False, 1)"), "{back:#?}");
    let said = back.notes_text();
    assert!(
        said.contains("resuming its checkpoint (cell 2 ran the same code on the same state)"),
        "{said}"
    );
    assert_eq!(runs(&server, "one.txt"), 2, "cell 1 was re-run");
}

/// A cell's `socket.setdefaulttimeout()` reaches neither the driver's
/// sockets nor its copies': idle past that timeout, the resumed interpreter
/// keeps waiting for the next cell and the copy for its switch.
#[tokio::test]
async fn a_default_socket_timeout_ends_neither_the_session_nor_its_copies() {
    let server = server(&[]).await;
    let timeout = "import socket\nsocket.setdefaulttimeout(0.05)\na = 1";
    server
        .exec_in("k", &counted("one.txt", timeout))
        .await
        .assert_ok();
    server
        .exec_in("k", &counted("two.txt", "a = 2"))
        .await
        .assert_ok();
    let back = server.exec_after("k", json!(1), "a").await;
    back.assert_ok();
    assert_eq!(back.value(), Some("1"), "{back:#?}");
    // The idle time is what is tested: six times the timeout.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let forth = server.exec_after("k", json!(2), "a").await;
    forth.assert_ok();
    assert_eq!(forth.value(), Some("2"), "{forth:#?}");
    assert!(
        forth.notes_text().contains("resuming its checkpoint"),
        "{forth:#?}"
    );
    assert_eq!((runs(&server, "one.txt"), runs(&server, "two.txt")), (1, 1));
}
