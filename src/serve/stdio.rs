//! The stdio transport: one JSON-RPC message per line on stdin and stdout.
//!
//! rmcp's line transport drops a line it cannot parse without a word (and an
//! oversized one with only a log line), so a client waiting on that request
//! hangs. This one answers every bad request it can attribute: a line that is
//! not JSON gets a parse error with a null id (JSON-RPC 2.0 §5.1), invalid
//! UTF-8 and oversized lines get an error carrying the request's own id (found
//! by a streaming scan, so even the id of a line too large to keep is
//! recovered), and a well-formed JSON value that is not a message gets
//! "invalid request". Bad notifications (no id) are only logged: there is
//! nobody waiting for them.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{ErrorCode, JsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::{StdioReader, StdioWriter, Transport};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;

type Out = Arc<Mutex<StdioWriter>>;

pub struct StdioTransport {
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    out: Out,
    on_eof: CancellationToken,
}

impl StdioTransport {
    /// Starts reading stdin. `on_eof` is cancelled when stdin ends.
    pub fn start(max_line_bytes: usize, on_eof: CancellationToken) -> Self {
        let (reader, writer) = rmcp::transport::stdio_pipes();
        let out = Arc::new(Mutex::new(writer));
        let (tx, incoming) = mpsc::channel(64);
        tokio::spawn(read_loop(reader, max_line_bytes, tx, out.clone()));
        Self {
            incoming,
            out,
            on_eof,
        }
    }
}

impl Transport<RoleServer> for StdioTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = self.out.clone();
        let item = explain_unknown_method(item);
        async move {
            let line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            write_line(&out, line).await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        let message = self.incoming.recv().await;
        // Only once rmcp has taken every message read before the end:
        // requests piped in just before stdin closed are still served.
        if message.is_none() {
            self.on_eof.cancel();
        }
        message
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.incoming.close();
        self.out.lock().await.flush().await
    }
}

/// rmcp's "method not found" error carries only the method's name.
fn explain_unknown_method(mut item: TxJsonRpcMessage<RoleServer>) -> TxJsonRpcMessage<RoleServer> {
    if let JsonRpcMessage::Error(e) = &mut item
        && e.error.code == ErrorCode::METHOD_NOT_FOUND
        && !e.error.message.contains(' ')
    {
        e.error.message = format!(
            "method '{}' is not supported by this server; it serves MCP tools: tools/list to see them, tools/call to run one",
            e.error.message
        )
        .into();
    }
    item
}

async fn write_line(out: &Out, mut line: Vec<u8>) -> std::io::Result<()> {
    line.push(b'\n');
    let mut out = out.lock().await;
    out.write_all(&line).await?;
    out.flush().await
}

async fn read_loop(
    reader: StdioReader,
    max_line_bytes: usize,
    tx: mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    out: Out,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut line: Vec<u8> = Vec::new();
    // Set while the rest of an oversized line is skipped; the scan keeps
    // looking for its id.
    let mut oversized: Option<(IdScanner, usize)> = None;
    // Whether anything came: an end before that (Ctrl-D in a terminal, a
    // client that gave up) is only a debug line.
    let mut read_any = false;
    loop {
        let (consumed, ended) = {
            let available = match reader.fill_buf().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!("cannot read stdin: {e}");
                    break;
                }
            };
            if available.is_empty() {
                if read_any {
                    tracing::info!("stdin closed: shutting down");
                } else {
                    tracing::debug!("stdin closed before any message: shutting down");
                }
                break;
            }
            read_any = true;
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let chunk = &available[..take];
            if let Some((scan, total)) = oversized.as_mut() {
                scan.feed(chunk);
                *total += take;
            } else if line.len() + take > max_line_bytes.saturating_add(1) {
                let mut scan = IdScanner::default();
                scan.feed(&line);
                scan.feed(chunk);
                oversized = Some((scan, line.len() + take));
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
            (take, newline.is_some())
        };
        reader.consume(consumed);
        if !ended {
            continue;
        }
        if let Some((scan, total)) = oversized.take() {
            let message = format!(
                "request of {total} bytes refused: the limit is {max_line_bytes} bytes (--max-request-bytes / FERREPL_MAX_REQUEST_BYTES). Send less per call: put large data in a file (file_write in parts, or have the cell read it) and pass its path."
            );
            reply_error(&out, Some(scan.id()), INVALID_REQUEST, &message).await;
            continue;
        }
        let message = handle_line(&line, &out).await;
        line.clear();
        if line.capacity() > 1024 * 1024 {
            line = Vec::new();
        }
        if let Some(message) = message
            && tx.send(message).await.is_err()
        {
            return;
        }
    }
}

/// A parsed message, or None after answering (or logging) a bad line.
async fn handle_line(raw: &[u8], out: &Out) -> Option<RxJsonRpcMessage<RoleServer>> {
    let mut line = raw.strip_suffix(b"\n").unwrap_or(raw);
    line = line.strip_suffix(b"\r").unwrap_or(line);
    line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        Err(e) => {
            let mut scan = IdScanner::default();
            scan.feed(line);
            let message = format!(
                "message is not valid UTF-8 (invalid byte at offset {}); MCP messages are UTF-8 JSON. Encode the text as UTF-8, or send binary data as base64.",
                e.valid_up_to()
            );
            reply_error(out, Some(scan.id()), PARSE_ERROR, &message).await;
            return None;
        }
    };
    let error = match serde_json::from_str::<RxJsonRpcMessage<RoleServer>>(text) {
        Ok(message) => return Some(message),
        Err(e) => e,
    };
    match serde_json::from_str::<Value>(text) {
        Err(e) => {
            let message =
                format!("message is not valid JSON ({e}); send one JSON-RPC 2.0 object per line");
            reply_error(out, Some(Value::Null), PARSE_ERROR, &message).await;
        }
        Ok(Value::Array(_)) => {
            let message = "JSON-RPC batches are not supported by MCP; send one message per line";
            reply_error(out, Some(Value::Null), INVALID_REQUEST, message).await;
        }
        Ok(value) => match value
            .get("id")
            .filter(|id| id.is_string() || id.is_number())
        {
            Some(id) => {
                let message = format!("invalid JSON-RPC message: {error}");
                reply_error(out, Some(id.clone()), INVALID_REQUEST, &message).await;
            }
            // Notifications nobody waits for; non-standard ones are normal
            // from some clients.
            None => tracing::debug!("ignoring an unusable notification: {error}"),
        },
    }
    None
}

/// Writes an error response; with no id (a notification) it is only logged.
async fn reply_error(out: &Out, id: Option<Value>, code: i64, message: &str) {
    tracing::warn!("bad message on stdin: {message}");
    let Some(id) = id else {
        return;
    };
    let response = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message },
    });
    if let Ok(line) = serde_json::to_vec(&response)
        && let Err(e) = write_line(out, line).await
    {
        tracing::error!("cannot write to stdout: {e}");
    }
}

/// Finds the top-level `"id"` of a JSON object fed in pieces, in constant
/// memory, ignoring ids nested in params.
#[derive(Default)]
struct IdScanner {
    depth: u32,
    in_string: bool,
    escaped: bool,
    expect_key: bool,
    key: Option<Vec<u8>>,
    key_is_id: bool,
    value: Option<Vec<u8>>,
    found: Option<Value>,
    /// Not a JSON object, or the id value was too long to be one.
    gave_up: bool,
}

const MAX_ID_BYTES: usize = 256;

impl IdScanner {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.found.is_some() || self.gave_up {
                return;
            }
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        if self.in_string {
            let closing = !self.escaped && b == b'"';
            self.escaped = !self.escaped && b == b'\\';
            if closing {
                self.in_string = false;
            }
            if let Some(key) = self.key.as_mut() {
                if closing {
                    self.key_is_id = key == b"id";
                    self.key = None;
                } else if key.len() < 8 {
                    key.push(b);
                }
            }
            self.push_value(b);
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.key = Some(Vec::new());
                } else {
                    self.push_value(b);
                }
            }
            b'{' | b'[' => {
                if self.depth == 0 && b == b'[' {
                    self.gave_up = true;
                }
                self.push_value(b);
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = true;
                }
            }
            b'}' | b']' => {
                if self.depth == 1 {
                    self.finish_value();
                } else {
                    self.push_value(b);
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b',' if self.depth == 1 => {
                self.finish_value();
                self.expect_key = true;
            }
            b':' if self.depth == 1 && self.key_is_id && self.value.is_none() => {
                self.key_is_id = false;
                self.value = Some(Vec::new());
            }
            b':' if self.depth == 1 => self.key_is_id = false,
            _ => self.push_value(b),
        }
    }

    fn push_value(&mut self, b: u8) {
        if let Some(value) = self.value.as_mut() {
            if value.len() >= MAX_ID_BYTES {
                self.gave_up = true;
            } else {
                value.push(b);
            }
        }
    }

    fn finish_value(&mut self) {
        if let Some(value) = self.value.take() {
            match serde_json::from_slice::<Value>(value.trim_ascii()) {
                Ok(v) if v.is_string() || v.is_number() => self.found = Some(v),
                _ => self.gave_up = true,
            }
        }
    }

    /// The id if one was found, else `Value::Null` for a request whose id
    /// cannot be recovered (JSON-RPC's answer to an unidentifiable request).
    fn id(mut self) -> Value {
        self.finish_value();
        self.found.unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(parts: &[&[u8]]) -> Value {
        let mut s = IdScanner::default();
        for p in parts {
            s.feed(p);
        }
        s.id()
    }

    #[test]
    fn finds_the_top_level_id_before_or_after_params() {
        let before = br#"{"jsonrpc":"2.0","id":7,"method":"x","params":{"id":99}}"#;
        assert_eq!(scan(&[before]), json!(7));
        let after = br#"{"method":"x","params":{"a":{"id":99},"s":"\"id\":5"},"id":"abc"}"#;
        assert_eq!(scan(&[after]), json!("abc"));
    }

    #[test]
    fn finds_an_id_split_across_pieces() {
        assert_eq!(
            scan(&[b"{\"method\":\"x\", \"i", b"d\" : 1", b"2 , \"params\":{}}"]),
            json!(12)
        );
    }

    #[test]
    fn null_when_there_is_no_usable_id() {
        assert_eq!(scan(&[br#"{"method":"x"}"#]), Value::Null);
        assert_eq!(scan(&[br#"[{"id":1}]"#]), Value::Null);
        assert_eq!(scan(&[br#"{"id":{"nested":1}}"#]), Value::Null);
        assert_eq!(scan(&[b"not json at all"]), Value::Null);
    }
}
