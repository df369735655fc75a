//! What the agent's code can send the server through the kernel's own
//! sockets and key: frames the protocol crate cannot read (a wrong
//! signature, JSON nested past any parser's depth, a header without its
//! fields) must cost that message only, not the kernel's channel, and one
//! huge message must not take the server's memory.

use serde_json::json;

use super::{PROTOCOL, exec, kernel_server, memory_kib};
use crate::support::StdioServer;

/// Runs `attack` (after the protocol prelude) in a fresh kernel session
/// `session`, then a plain cell: both must end, the second with its value.
/// Returns what went wrong, if anything.
async fn survives(server: &StdioServer, session: &str, attack: &str) -> Option<String> {
    let created = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": session, "kernel": "python3"}),
        )
        .await;
    assert!(!created.is_error, "{created:#?}");
    let code = format!("{PROTOCOL}\n{attack}\nprint('sent')\n'attacked'");
    let out = server
        .call(
            "python_exec",
            json!({"session": session, "code": code, "wait_s": 20}),
        )
        .await;
    if out.status() != "ok" || !out.str_field("stdout").contains("sent") {
        return Some(format!(
            "{session}: the attacking cell did not end: {out:#?}"
        ));
    }
    let out = server
        .call(
            "python_exec",
            json!({"session": session, "code": "6 * 7", "wait_s": 30}),
        )
        .await;
    (out.value() != Some("42"))
        .then(|| format!("{session}: the next cell did not end with its value: {out:#?}"))
}

#[tokio::test]
async fn unreadable_kernel_messages_cost_only_themselves() {
    let server = kernel_server(&[], &[]).await;
    let stream = r#"s.pack({'name': 'stdout', 'text': 'x'})"#;
    let attacks = [
        (
            "badsig",
            format!("raw_iopub('stream', [s.pack(header('stream')), s.pack(me), b'{{}}', {stream}], sign=False)"),
        ),
        (
            "deep",
            "raw_iopub('stream', [s.pack(header('stream')), s.pack(me), b'{}', b'[' * 100000 + b']' * 100000])".to_string(),
        ),
        (
            "noheader",
            format!("raw_iopub('stream', [b'{{}}', s.pack(me), b'{{}}', {stream}])"),
        ),
        (
            "fewparts",
            "raw_iopub('stream', [s.pack(header('stream')), s.pack(me)])".to_string(),
        ),
        (
            "notjson",
            "raw_iopub('stream', [s.pack(header('stream')), s.pack(me), b'{}', b'\\xff\\xfe not json'])".to_string(),
        ),
    ];
    let mut broken = Vec::new();
    for (session, attack) in &attacks {
        if let Some(why) = survives(&server, session, attack).await {
            broken.push(why);
        }
    }
    // The server still serves a session nobody attacked.
    exec(&server, "k", "1 + 1").await.assert_ok();
    assert!(
        broken.is_empty(),
        "{} of {} unreadable messages broke their session:\n{}",
        broken.len(),
        attacks.len(),
        broken.join("\n\n")
    );
}

#[tokio::test]
async fn one_huge_kernel_message_does_not_take_the_servers_memory() {
    let server = kernel_server(&[], &[]).await;
    exec(&server, "k", "1").await.assert_ok();
    let pid = server.pid();
    let before = memory_kib(pid, "VmHWM");
    // One display_data of 256 MiB of text, signed with the kernel's key:
    // the server shows a capped value of it, and must not hold it whole.
    let mib = 256;
    let code = format!(
        "{PROTOCOL}\npublish('display_data', {{'data': {{'text/plain': 'y' * ({mib} << 20)}}, 'metadata': {{}}}}, me)\n'sent'"
    );
    let out = server
        .call(
            "python_exec",
            json!({"session": "k", "code": code, "wait_s": 120}),
        )
        .await;
    let grown_mib = memory_kib(pid, "VmHWM").saturating_sub(before) / 1024;
    assert!(
        out.text.len() < 1 << 20,
        "{} bytes of result",
        out.text.len()
    );
    assert!(
        grown_mib < mib,
        "one {mib} MiB message from the kernel grew the server's peak memory by {grown_mib} MiB: kernel messages have no size limit"
    );
    // The kernel was stopped, and the cell says why and what to do.
    assert_eq!(out.status(), "crashed", "{out:#?}");
    for words in [
        "sent a message of 257 MiB or more, over the 128 MiB a kernel message may be",
        "Write output that large to a file",
        "The next call starts a fresh interpreter",
    ] {
        assert!(out.text.contains(words), "no '{words}' in {out:#?}");
    }
    exec(&server, "k", "1 + 1").await.assert_ok();
    // A message under the cap (16 MiB) still reaches the cell, capped.
    let code = format!(
        "{PROTOCOL}\npublish('display_data', {{'data': {{'text/plain': 'z' * (16 << 20)}}, 'metadata': {{}}}}, me)\n'sent'"
    );
    let out = exec(&server, "k", &code).await;
    out.assert_ok();
    assert!(out.str_field("stdout").contains("zzzz"), "{out:#?}");
}

#[tokio::test]
async fn an_input_request_storm_stays_bounded() {
    let server = kernel_server(&[], &[]).await;
    // A prompt of a MiB, then thousands more for the running cell, sent
    // on the kernel's stdin socket as the kernel would; the cell itself
    // asks nothing and ends.
    let code = format!(
        "{PROTOCOL}\nident = k._parent_ident['shell']\n\
         parent = k.get_parent()\n\
         s.send(k.stdin_socket, 'input_request', {{'prompt': 'Q' * (1 << 20), 'password': False}}, parent=parent, ident=ident)\n\
         for i in range(2000):\n    s.send(k.stdin_socket, 'input_request', {{'prompt': 'P%d> ' % i, 'password': False}}, parent=parent, ident=ident)\n\
         'stormed'"
    );
    let mut out = server
        .call(
            "python_exec",
            json!({"session": "k", "code": code, "wait_s": 30}),
        )
        .await;
    let mut sizes = vec![out.text.len()];
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let status = out.structured["status"]
            .as_str()
            .unwrap_or("an error")
            .to_string();
        statuses.push(status.clone());
        if status != "waiting_input" {
            break;
        }
        out = server
            .call(
                "python_wait",
                json!({"session": "k", "input": "x", "wait_s": 10}),
            )
            .await;
        sizes.push(out.text.len());
    }
    if out.structured["status"] == "waiting_input" || out.structured["status"] == "running" {
        // The agent's way out of prompts that do not end.
        out = server
            .call(
                "python_wait",
                json!({"session": "k", "interrupt": true, "wait_s": 30}),
            )
            .await;
        sizes.push(out.text.len());
    }
    let after = exec(&server, "k", "1 + 1").await;
    assert!(
        sizes.iter().all(|s| *s < 256 * 1024),
        "results of {sizes:?} bytes: a prompt is not capped"
    );
    assert_eq!(
        after.value(),
        Some("2"),
        "after answers ({statuses:?}) and an interrupt, the session is stuck: {after:#?}"
    );
}

#[tokio::test]
async fn a_cell_whose_idle_status_never_comes_ends_after_its_reply() {
    let server = kernel_server(&[], &[]).await;
    // The kernel stops publishing its idle status (as when its output
    // channel drops it in a burst): the reply still says the cell ended.
    let code = "k = get_ipython().kernel\n\
        k._publish_status = lambda status, channel, parent=None: None if status == 'idle' else type(k)._publish_status(k, status, channel, parent)\n\
        print('patched')\n'no idle'";
    let out = server
        .call(
            "python_exec",
            json!({"session": "k", "code": code, "wait_s": 30}),
        )
        .await;
    assert_eq!(out.status(), "ok", "{out:#?}");
    assert_eq!(out.value(), Some("'no idle'"), "{out:#?}");
    assert!(
        out.text
            .contains("the kernel's output channel dropped messages"),
        "the result does not say its output may be incomplete: {}",
        out.text
    );
    // Restored: the next cell ends with its own idle status, and says nothing.
    let next = exec(&server, "k", "del k._publish_status\n6 * 7").await;
    assert_eq!(next.value(), Some("42"), "{next:#?}");
    assert!(!next.text.contains("dropped messages"), "{}", next.text);
}
