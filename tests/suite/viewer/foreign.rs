//! The viewer of a kernel session shows the cells another client ran in
//! its kernel (issue 47): a real `jupyter_client` on the connection file
//! `ferrepl attach --print` finds runs a cell, and the session's event
//! stream carries it live, marked as that client's, placed after the
//! agent's cell it followed, as data (hostile code stays a JSON string);
//! a stream opened later, or resumed with Last-Event-ID, has it once; the
//! viewer's look leaves the agent its note. The page's rendering of it is
//! tests/viewer/browser_check.py's.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{host, viewer_port};
use crate::support::kernels::{self, another_client_runs, connection_file, kernels_venv};
use crate::support::{Launch, StdioServer};

const HOSTILE: &str = "<img src=x onerror=window.__pwned=1>";

/// An open `/events/s/<session>` stream and what it sent so far.
struct Stream {
    tcp: tokio::net::TcpStream,
    got: String,
}

impl Stream {
    async fn open(port: u16, session: &str, last_event_id: Option<u64>) -> Stream {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let mut req = format!(
            "GET /events/s/{session} HTTP/1.1\r\nHost: {}\r\n",
            host(port)
        );
        if let Some(id) = last_event_id {
            req.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        req.push_str("\r\n");
        tcp.write_all(req.as_bytes()).await.expect("send");
        Stream {
            tcp,
            got: String::new(),
        }
    }

    /// Reads until `done` holds for what came (or a minute passes).
    async fn until(&mut self, what: &str, done: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut buf = vec![0u8; 65536];
        while !done(&self.got) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.tcp.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => self.got.push_str(&String::from_utf8_lossy(&buf[..n])),
                _ => panic!("no {what} on the stream; it sent:\n{}", self.got),
            }
        }
    }

    /// The data of each `event` sent so far, with its id line if any.
    fn events(&self, event: &str) -> Vec<(Option<String>, Value)> {
        let head = format!("event: {event}\ndata: ");
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(at) = self.got[from..].find(&head) {
            let start = from + at;
            let data = &self.got[start + head.len()..];
            let line = data.split('\n').next().unwrap_or_default();
            // The id line, when there is one, is just before the event line.
            let id = self.got[..start]
                .strip_suffix('\n')
                .and_then(|before| before.rsplit('\n').next())
                .and_then(|l| l.strip_prefix("id: "))
                .map(str::to_string);
            found.push((id, serde_json::from_str(line).expect("an event's JSON")));
            from = start + head.len();
        }
        found
    }
}

/// A server with a viewer and a kernel session `k` (its own runtime
/// directory, so `ferrepl attach` finds only it), and its viewer's port.
async fn kernel_viewer(runtime: &Path) -> (StdioServer, u16) {
    let launch = Launch::new(&["--kernels", "python3", "--viewer", "127.0.0.1:0"])
        .env("JUPYTER_PATH", kernels_venv().join("share/jupyter"))
        .env("XDG_RUNTIME_DIR", runtime);
    let server = kernels::with_kernel_session(launch, "k", "python3").await;
    assert!(
        server
            .wait_stderr_contains("ferrepl viewer:", Duration::from_secs(20))
            .await,
        "{}",
        server.stderr_log()
    );
    let port = viewer_port(&server.stderr_log()).expect("the viewer's port");
    (server, port)
}

async fn agent_runs(server: &StdioServer, code: &str) -> crate::support::ToolOutput {
    let out = kernels::kernel_cell(server, "python_exec", "k", code).await;
    out.assert_ok();
    out
}

#[tokio::test]
async fn another_clients_cell_shows_live_marked_in_its_place_and_once_after_a_reconnect() {
    let runtime = tempfile::tempdir().expect("tempdir");
    let (server, port) = kernel_viewer(runtime.path()).await;
    agent_runs(&server, "x = 1").await;
    let mut live = Stream::open(port, "k", None).await;
    live.until("cell 1", |got| got.contains("id: 1\n")).await;

    let file = connection_file(runtime.path(), server.workdir.path(), "k");
    another_client_runs(
        &file,
        &format!("s = {HOSTILE:?}\nprint(s)\nprint('from the operator')"),
    );
    // Live: no call of the agent's looked at the session.
    live.until("the other client's cell", |got| {
        got.contains("event: foreign")
    })
    .await;
    let foreign = live.events("foreign");
    assert_eq!(foreign.len(), 1, "{}", live.got);
    let (id, cell) = &foreign[0];
    // No event id: Last-Event-ID stays the agent's last cell.
    assert_eq!(id, &None, "{}", live.got);
    assert_eq!(cell["by"], "another client", "{cell}");
    assert_eq!(cell["seq"], 1, "{cell}");
    assert_eq!(cell["after"], 1, "it ran after the agent's cell 1: {cell}");
    assert_eq!(cell["status"], "ok", "{cell}");
    // The hostile string is data: a JSON string, whole, nowhere as markup
    // outside it.
    assert!(
        cell["code"].as_str().is_some_and(|c| c.contains(HOSTILE)),
        "{cell}"
    );
    assert!(
        cell["output"]
            .as_str()
            .is_some_and(|o| o.contains(HOSTILE) && o.contains("from the operator")),
        "{cell}"
    );

    // The viewer took it from the worker; the agent is told all the same,
    // and its next cell comes after it.
    let out = agent_runs(&server, "s[:4]").await;
    assert!(
        out.text.contains("Someone else") && out.text.contains("ran 1 cell in this kernel"),
        "the viewer's look took the agent's note: {out:#?}"
    );
    live.until("cell 2", |got| got.contains("id: 2\n")).await;
    assert_eq!(live.events("foreign").len(), 1, "{}", live.got);

    // A viewer that connects later, and one that resumes after cell 2, get
    // the kept cell once each; the resumed one none of the agent's cells.
    for (last, code) in [(None, "10 + 1"), (Some(2), "20 + 1")] {
        let mut later = Stream::open(port, "k", last).await;
        later
            .until("the kept cell", |got| got.contains("event: foreign"))
            .await;
        // Another of the agent's cells after it: the stream went past it.
        agent_runs(&server, code).await;
        let shown = format!("\"code\":\"{code}\"");
        later
            .until("the agent's next cell", |got| got.contains(&shown))
            .await;
        let again = later.events("foreign");
        assert_eq!(again.len(), 1, "{last:?}: {}", later.got);
        assert_eq!(again[0].1["seq"], 1, "{}", later.got);
        let cells: Vec<u64> = later
            .events("cell")
            .iter()
            .filter_map(|(_, c)| c["cell"].as_u64())
            .collect();
        match last {
            None => assert!(cells.starts_with(&[1, 2]), "{cells:?}"),
            Some(_) => assert!(!cells.contains(&1) && !cells.contains(&2), "{cells:?}"),
        }
    }

    // The agent's history has it once, marked, before the agent's cell 2.
    let history = server.call("python_history", json!({"session": "k"})).await;
    let rows = history.structured["cells"].as_array().expect("cells");
    let at = |pred: &dyn Fn(&Value) -> bool| rows.iter().position(pred);
    let theirs = at(&|c| c["by"] == "another client").expect("the other client's row");
    let second = at(&|c| c["code"] == "s[:4]").expect("the agent's cell 2");
    assert!(theirs < second, "{history:#?}");
    assert_eq!(
        rows.iter().filter(|c| c["by"] == "another client").count(),
        1,
        "{history:#?}"
    );
}

#[tokio::test]
async fn the_page_script_puts_data_in_the_page_as_text_only() {
    // The other client's code and output are shown as the agent's are:
    // through textContent and text nodes, never parsed as markup.
    let js = include_str!("../../../src/viewer/pages/viewer.js");
    for sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "createContextualFragment",
        "eval(",
        "new Function",
    ] {
        assert!(!js.contains(sink), "viewer.js uses {sink}");
    }
    assert!(
        js.contains("addEventListener('foreign'") && js.contains("function foreignNode("),
        "the page does not show other clients' cells"
    );
}
