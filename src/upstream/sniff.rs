//! What a stdio server says about its tools that rmcp does not pass on:
//! rmcp's `Tool` drops `execution`, so the tools that run only as MCP tasks
//! (`execution.taskSupport: "required"`) are read from the server's own
//! lines as they pass to rmcp, unchanged.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// Names of tools that run only as tasks, shared with the connection.
pub type TaskOnly = Arc<Mutex<BTreeSet<String>>>;

/// The server's stdout, read through: each whole line that mentions
/// taskSupport is parsed for a tools/list result.
pub struct Sniffer<R> {
    inner: R,
    /// The current line; None while skipping one longer than `max_line`.
    line: Option<Vec<u8>>,
    max_line: usize,
    found: TaskOnly,
}

impl<R> Sniffer<R> {
    pub fn new(inner: R, max_line: usize, found: TaskOnly) -> Self {
        Sniffer {
            inner,
            line: Some(Vec::new()),
            max_line,
            found,
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let (part, ended) = match rest.iter().position(|b| *b == b'\n') {
                Some(at) => (&rest[..at], true),
                None => (rest, false),
            };
            rest = &rest[part.len() + usize::from(ended)..];
            if let Some(line) = &mut self.line {
                if line.len() + part.len() > self.max_line {
                    // Too long to be read here: rmcp judges it.
                    self.line = None;
                } else {
                    line.extend_from_slice(part);
                }
            }
            if ended && let Some(line) = self.line.replace(Vec::new()) {
                record(&line, &self.found);
            }
        }
    }
}

/// Adds the task-only tools of `line`, when it is a tools/list result.
fn record(line: &[u8], found: &TaskOnly) {
    if !line.windows(11).any(|w| w == b"taskSupport") {
        return;
    }
    let Ok(message) = serde_json::from_slice::<serde_json::Value>(line) else {
        return;
    };
    let Some(tools) = message["result"]["tools"].as_array() else {
        return;
    };
    let mut found = found.lock().unwrap_or_else(|e| e.into_inner());
    for tool in tools {
        if tool["execution"]["taskSupport"] == "required"
            && let Some(name) = tool["name"].as_str()
        {
            found.insert(name.to_string());
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Sniffer<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.scan(&buf.filled()[before..]);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn task_only_tools_are_read_from_a_tools_list_passed_through_unchanged() {
        let first = concat!(
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":["#,
            r#"{"name":"plain","inputSchema":{}},"#,
            r#"{"name":"optional","execution":{"taskSupport":"optional"},"inputSchema":{}},"#,
            r#"{"name":"task-only","execution":{"taskSupport":"required"},"inputSchema":{}}]}}"#,
        );
        // Longer than the cap: skipped.
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":2,"result":{{"tools":[{{"name":"long","description":"{}","execution":{{"taskSupport":"required"}}}}]}}}}"#,
            "x".repeat(first.len())
        );
        let listing = format!("{first}\n{long}\n");
        let found = TaskOnly::default();
        let mut sniffer = Sniffer::new(listing.as_bytes(), first.len() + 1, found.clone());
        let mut passed = String::new();
        sniffer
            .read_to_string(&mut passed)
            .await
            .expect("read through");
        assert_eq!(passed, listing);
        let found = found.lock().expect("lock").clone();
        assert_eq!(found, BTreeSet::from(["task-only".to_string()]));
    }
}
