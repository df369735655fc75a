//! Plain JSON replies to quick calls over streamable HTTP.
//!
//! rmcp answers every POSTed request with an event stream. A client that
//! stops reading once it has its reply (the official Python SDK does) closes
//! the connection before the stream's last chunk, so each of its calls pays
//! a new TCP connection. The transport lets a server answer a request with
//! `application/json` instead; this layer does that when the reply is the
//! stream's first message and comes within a short window. Anything else
//! (progress or other messages first, a longer call) goes out as the event
//! stream it was, held bytes first, so nothing is lost or reordered.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt;

/// How long a reply is waited for before the stream is passed on as it is
/// (a long call then gets the stream's keep-alives and progress).
const JSON_REPLY_WINDOW: Duration = Duration::from_secs(1);

/// Most bytes held while looking for the reply; past this the stream is
/// passed on as the stream it is (a result with large images may be).
const MAX_HELD_BYTES: usize = 8 << 20;

pub async fn prefer_json_replies(req: Request, next: Next) -> Response {
    let post = req.method() == Method::POST;
    let res = next.run(req).await;
    let event_stream = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !post || res.status() != StatusCode::OK || !event_stream {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let mut upstream = body.into_data_stream();
    let mut held: Vec<Result<Bytes, axum::Error>> = Vec::new();
    let mut events = EventScanner::default();
    let deadline = tokio::time::Instant::now() + JSON_REPLY_WINDOW;
    while let Ok(Some(item)) = tokio::time::timeout_at(deadline, upstream.next()).await {
        let Ok(chunk) = item else {
            held.push(item);
            break;
        };
        let first = events.feed(&chunk);
        held.push(Ok(chunk));
        match first {
            First::Pending if events.held() <= MAX_HELD_BYTES => continue,
            First::Pending | First::Other => break,
            First::Reply(json) => {
                parts.headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                parts.headers.remove(header::CONTENT_LENGTH);
                parts.headers.remove(header::TRANSFER_ENCODING);
                parts.headers.remove(header::CACHE_CONTROL);
                return Response::from_parts(parts, Body::from(json));
            }
        }
    }
    let replay = futures::stream::iter(held).chain(upstream);
    Response::from_parts(parts, Body::from_stream(replay))
}

/// What the stream's first message (after priming events, which carry no
/// data) turned out to be.
#[derive(Debug, PartialEq)]
enum First {
    Pending,
    /// A JSON-RPC response or error: the whole reply.
    Reply(Vec<u8>),
    /// A notification or a request to the client: the stream is needed.
    Other,
}

#[derive(Default)]
struct EventScanner {
    pending: Vec<u8>,
    /// How far `pending` is known to hold no event end.
    scanned: usize,
}

impl EventScanner {
    fn held(&self) -> usize {
        self.pending.len()
    }

    fn feed(&mut self, chunk: &[u8]) -> First {
        self.pending.extend_from_slice(chunk);
        while let Some(end) = memchr::memmem::find(&self.pending[self.scanned..], b"\n\n") {
            let end = self.scanned + end;
            self.scanned = 0;
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            let data = event_data(&event[..end]);
            if data.is_empty() {
                continue;
            }
            let Ok(serde_json::Value::Object(msg)) = serde_json::from_slice(&data) else {
                return First::Other;
            };
            let reply = msg.contains_key("id")
                && !msg.contains_key("method")
                && (msg.contains_key("result") || msg.contains_key("error"));
            return if reply {
                First::Reply(data)
            } else {
                First::Other
            };
        }
        self.scanned = self.pending.len().saturating_sub(1);
        First::Pending
    }
}

/// The `data:` lines of one event, joined by newlines (SSE's rule).
fn event_data(event: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    for line in event.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(value) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a fresh scanner says after each chunk.
    fn scan(chunks: &[&[u8]]) -> Vec<First> {
        let mut s = EventScanner::default();
        chunks.iter().map(|chunk| s.feed(chunk)).collect()
    }

    fn reply(json: &[u8]) -> First {
        First::Reply(json.to_vec())
    }

    #[test]
    fn a_reply_after_a_priming_event_is_taken_whole() {
        let chunks: [&[u8]; 3] = [
            b"data: \nid: 0\nretry: 3000\n\n",
            b"data: {\"jsonrpc\":\"2.0\",\"id\":7,",
            b"\"result\":{}}\nid: 1\n\n",
        ];
        let want = reply(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}");
        assert_eq!(scan(&chunks), [First::Pending, First::Pending, want]);
    }

    #[test]
    fn an_event_end_split_across_chunks_is_found() {
        let chunks: [&[u8]; 2] = [b"data: {\"id\":1,\"result\":{}}\n", b"\n"];
        let want = reply(b"{\"id\":1,\"result\":{}}");
        assert_eq!(scan(&chunks), [First::Pending, want]);
    }

    #[test]
    fn a_notification_first_keeps_the_stream() {
        let progress =
            b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n";
        assert_eq!(scan(&[progress]), [First::Other]);
        assert_eq!(scan(&[b"data: not json\n\n"]), [First::Other]);
    }

    #[test]
    fn data_lines_join_with_newlines() {
        assert_eq!(event_data(b"id: 3\ndata: a\ndata:b\r"), b"a\nb".to_vec());
    }
}
