//! Output captured from a worker's stdout/stderr pipes.
//!
//! Two pieces live here: [`MarkerScanner`], which finds the driver's fence
//! markers in a raw byte stream (markers may be split across reads), and
//! [`Capture`], a bounded record of one span of output that keeps the head and
//! the tail and counts what was dropped in between.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
    /// Lines ferrepl adds to the text (image placeholders): not program output.
    Meta,
}

/// What the scanner found in a stretch of bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Segment {
    Data(Vec<u8>),
    /// A numbered marker. `event` fences close output owned by a control
    /// event; the others only order the two pipes against each other.
    Fence {
        number: u64,
        event: bool,
    },
}

/// Number of hex digits of the fence number, then a NUL, after the prefix.
const MARKER_TAIL: usize = 17;

/// Finds `\0FERREPL:<nonce>:<16 hex digits><kind>` markers in a byte stream,
/// where kind is `\0` (event fence) or `\x01` (sync fence).
pub struct MarkerScanner {
    prefix: Vec<u8>,
    pending: Vec<u8>,
}

impl MarkerScanner {
    pub fn new(nonce: &str) -> Self {
        let mut prefix = b"\0FERREPL:".to_vec();
        prefix.extend_from_slice(nonce.as_bytes());
        prefix.push(b':');
        Self {
            prefix,
            pending: Vec::new(),
        }
    }

    /// Feeds bytes just read; appends data and fences, in stream order, to `out`.
    /// Bytes that might begin a marker are held back until the next call.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<Segment>) {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(input);
        let mut pos = 0;
        let finder = memchr::memmem::Finder::new(&self.prefix);
        while pos < buf.len() {
            match finder.find(&buf[pos..]) {
                Some(rel) => {
                    let start = pos + rel;
                    let end = start + self.prefix.len() + MARKER_TAIL;
                    if buf.len() < end {
                        push_data(out, &buf[pos..start]);
                        self.pending = buf[start..].to_vec();
                        return;
                    }
                    push_data(out, &buf[pos..start]);
                    let digits = &buf[start + self.prefix.len()..end - 1];
                    let number = std::str::from_utf8(digits)
                        .ok()
                        .and_then(|s| u64::from_str_radix(s, 16).ok());
                    match (number, buf[end - 1]) {
                        (Some(n), kind @ (0 | 1)) => out.push(Segment::Fence {
                            number: n,
                            event: kind == 0,
                        }),
                        // Not one of ours after all: keep it as output.
                        _ => push_data(out, &buf[start..end]),
                    }
                    pos = end;
                }
                None => {
                    let rest = &buf[pos..];
                    let keep = partial_prefix_len(rest, &self.prefix);
                    push_data(out, &rest[..rest.len() - keep]);
                    self.pending = rest[rest.len() - keep..].to_vec();
                    return;
                }
            }
        }
    }

    /// At end of stream: whatever was held back is plain output.
    pub fn finish(&mut self, out: &mut Vec<Segment>) {
        let rest = std::mem::take(&mut self.pending);
        push_data(out, &rest);
    }
}

fn push_data(out: &mut Vec<Segment>, data: &[u8]) {
    if !data.is_empty() {
        out.push(Segment::Data(data.to_vec()));
    }
}

/// Length of the longest suffix of `buf` that is a proper prefix of `prefix`.
fn partial_prefix_len(buf: &[u8], prefix: &[u8]) -> usize {
    let max = buf.len().min(prefix.len() - 1);
    (1..=max)
        .rev()
        .find(|&k| buf[buf.len() - k..] == prefix[..k])
        .unwrap_or(0)
}

#[derive(Debug, Clone)]
struct Chunk {
    stream: Stream,
    bytes: Vec<u8>,
}

/// Where a capture also records its full output (see `log.rs`).
#[derive(Debug, Clone)]
pub struct LogSink {
    pub dir: Arc<PathBuf>,
    /// Bytes the current cell may still record.
    pub budget: u64,
}

/// A bounded span of output: the first `head_cap` bytes and the last
/// `tail_cap` bytes are kept, the middle is counted and dropped. With a log
/// sink, every byte is also recorded in full log segments.
#[derive(Debug)]
pub struct Capture {
    log: Vec<super::log::Segment>,
    sink: Option<LogSink>,
    head: Vec<Chunk>,
    head_len: usize,
    tail: VecDeque<Chunk>,
    tail_len: usize,
    head_cap: usize,
    tail_cap: usize,
    /// The tool that reads the whole output, named where a result cuts it.
    reader: &'static str,
    omitted_bytes: u64,
    omitted_lines: u64,
    total_bytes: u64,
}

/// Text of a capture, ready for a result.
#[derive(Debug, Default, Clone)]
pub struct RenderedOutput {
    /// Both streams in arrival order, with a marker where bytes were omitted.
    pub combined: String,
    pub stdout: String,
    pub stderr: String,
    pub omitted_bytes: u64,
    pub total_bytes: u64,
}

impl Capture {
    /// A capture that keeps `head_cap` and `tail_cap` bytes for results and
    /// names `reader` as the way to the rest.
    pub fn new(head_cap: usize, tail_cap: usize, reader: &'static str) -> Self {
        Self {
            reader,
            log: Vec::new(),
            sink: None,
            head: Vec::new(),
            head_len: 0,
            tail: VecDeque::new(),
            tail_len: 0,
            head_cap,
            tail_cap,
            omitted_bytes: 0,
            omitted_lines: 0,
            total_bytes: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.total_bytes == 0
    }

    /// Moves the content out, leaving an empty capture with the same limits.
    pub fn with_log(mut self, sink: LogSink) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Starts a new cell's budget for the full log.
    pub fn set_log_budget(&mut self, budget: u64) {
        if let Some(sink) = self.sink.as_mut() {
            sink.budget = budget;
        }
    }

    /// Moves the content out, leaving an empty capture with the same limits
    /// (and the same log sink, with what is left of its budget).
    pub fn take(&mut self) -> Capture {
        let mut empty = Capture::new(self.head_cap, self.tail_cap, self.reader);
        empty.sink = self.sink.take();
        std::mem::replace(self, empty)
    }

    /// Reads the full-log segments without taking them.
    pub fn read_log(&mut self, out: &mut Vec<u8>) {
        for segment in &mut self.log {
            segment.read_all(out);
        }
    }

    /// Bytes of the full-log segments not taken yet, and those dropped.
    pub fn log_len(&self) -> (u64, u64) {
        (
            super::log::segments_len(&self.log),
            self.log.iter().map(super::log::Segment::dropped).sum(),
        )
    }

    /// Bytes `from..from + n` of the full-log segments not taken yet.
    pub fn read_log_range(&mut self, from: u64, n: u64, out: &mut Vec<u8>) {
        super::log::read_segments(&mut self.log, from, n, out);
    }

    /// Where the full-log segments' bytes are (see `Segment::pieces`).
    pub fn log_pieces(&mut self, out: &mut Vec<super::log::Piece>) {
        for segment in &mut self.log {
            segment.pieces(out);
        }
    }

    /// The full-log segments recorded so far.
    pub fn take_log(&mut self) -> Vec<super::log::Segment> {
        std::mem::take(&mut self.log)
    }

    pub fn push(&mut self, stream: Stream, mut data: &[u8]) {
        if let Some(sink) = self.sink.as_mut()
            && stream != Stream::Meta
        {
            if self.log.is_empty() {
                self.log.push(super::log::Segment::default());
            }
            if let Some(segment) = self.log.last_mut() {
                sink.budget -= segment.push(data, sink.budget, &sink.dir);
            }
        }
        self.total_bytes += data.len() as u64;
        if self.head_len < self.head_cap {
            let n = (self.head_cap - self.head_len).min(data.len());
            append_chunk(&mut self.head, stream, &data[..n]);
            self.head_len += n;
            data = &data[n..];
        }
        if data.is_empty() {
            return;
        }
        match self.tail.back_mut() {
            Some(last) if last.stream == stream => last.bytes.extend_from_slice(data),
            _ => self.tail.push_back(Chunk {
                stream,
                bytes: data.to_vec(),
            }),
        }
        self.tail_len += data.len();
        while self.tail_len > self.tail_cap {
            let excess = self.tail_len - self.tail_cap;
            let Some(front) = self.tail.front_mut() else {
                break;
            };
            let cut = excess.min(front.bytes.len());
            self.omitted_bytes += cut as u64;
            self.omitted_lines += memchr::memchr_iter(b'\n', &front.bytes[..cut]).count() as u64;
            if cut == front.bytes.len() {
                self.tail.pop_front();
            } else {
                front.bytes.drain(..cut);
            }
            self.tail_len -= cut;
        }
    }

    /// Appends another capture's content (its own omissions are counted).
    pub fn append(&mut self, mut other: Capture) {
        let omitted = other.omitted_bytes;
        let omitted_lines = other.omitted_lines;
        // Its full log moves over as segments; nothing is recorded twice.
        let sink = self.sink.take();
        for chunk in other.head.iter().chain(other.tail.iter()) {
            self.push(chunk.stream, &chunk.bytes);
        }
        self.sink = sink;
        self.log.append(&mut other.log);
        self.omitted_bytes += omitted;
        self.omitted_lines += omitted_lines;
        self.total_bytes += omitted;
    }

    /// The last non-empty line kept (carriage returns count as line breaks,
    /// so a progress bar gives its latest state).
    pub fn last_line(&self) -> Option<String> {
        let chunk = self.tail.back().or(self.head.last())?;
        let text = String::from_utf8_lossy(&chunk.bytes);
        text.split(['\n', '\r'])
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .map(|l| l.chars().take(200).collect())
    }

    pub fn render(&self) -> RenderedOutput {
        let mut out = RenderedOutput {
            omitted_bytes: self.omitted_bytes,
            total_bytes: self.total_bytes,
            ..Default::default()
        };
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut combined = Vec::new();
        let mut emit = |chunk: &Chunk, combined: &mut Vec<u8>| {
            combined.extend_from_slice(&chunk.bytes);
            match chunk.stream {
                Stream::Stdout => stdout.extend_from_slice(&chunk.bytes),
                Stream::Stderr => stderr.extend_from_slice(&chunk.bytes),
                Stream::Meta => {}
            }
        };
        for chunk in &self.head {
            emit(chunk, &mut combined);
        }
        let mut combined_text = String::from_utf8_lossy(&combined).into_owned();
        combined.clear();
        if self.omitted_bytes > 0 {
            if !combined_text.ends_with('\n') && !combined_text.is_empty() {
                combined_text.push('\n');
            }
            combined_text.push_str(&format!(
                "[... {} bytes ({} lines) omitted here: a result shows the first {} and last {} bytes; read the rest with {} (by offset, lines or grep) ...]\n",
                self.omitted_bytes, self.omitted_lines, self.head_cap, self.tail_cap, self.reader
            ));
        }
        for chunk in &self.tail {
            emit(chunk, &mut combined);
        }
        combined_text.push_str(&String::from_utf8_lossy(&combined));
        out.combined = combined_text;
        out.stdout = String::from_utf8_lossy(&stdout).into_owned();
        out.stderr = String::from_utf8_lossy(&stderr).into_owned();
        out
    }
}

fn append_chunk(chunks: &mut Vec<Chunk>, stream: Stream, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    match chunks.last_mut() {
        Some(last) if last.stream == stream => last.bytes.extend_from_slice(data),
        _ => chunks.push(Chunk {
            stream,
            bytes: data.to_vec(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "0123456789abcdef0123456789abcdef";

    fn marker(n: u64) -> Vec<u8> {
        format!("\0FERREPL:{NONCE}:{n:016x}\0").into_bytes()
    }

    fn sync_marker(n: u64) -> Vec<u8> {
        format!("\0FERREPL:{NONCE}:{n:016x}\x01").into_bytes()
    }

    fn scan_in_pieces(input: &[u8], piece: usize) -> Vec<Segment> {
        let mut scanner = MarkerScanner::new(NONCE);
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            scanner.feed(chunk, &mut out);
        }
        scanner.finish(&mut out);
        // Merge adjacent data so results compare independent of piece size.
        let mut merged: Vec<Segment> = Vec::new();
        for seg in out {
            match (merged.last_mut(), seg) {
                (Some(Segment::Data(a)), Segment::Data(b)) => a.extend(b),
                (_, seg) => merged.push(seg),
            }
        }
        merged
    }

    #[test]
    fn markers_are_found_whatever_the_read_boundaries() {
        let mut input = b"hello\n".to_vec();
        input.extend(marker(1));
        input.extend(b"after\0FERREPL:not-ours");
        input.extend(marker(2));
        input.extend(sync_marker(3));
        for piece in [1, 2, 3, 7, 64, 4096] {
            let segs = scan_in_pieces(&input, piece);
            assert_eq!(
                segs,
                vec![
                    Segment::Data(b"hello\n".to_vec()),
                    Segment::Fence {
                        number: 1,
                        event: true
                    },
                    Segment::Data(b"after\0FERREPL:not-ours".to_vec()),
                    Segment::Fence {
                        number: 2,
                        event: true
                    },
                    Segment::Fence {
                        number: 3,
                        event: false
                    },
                ],
                "piece size {piece}"
            );
        }
    }

    #[test]
    fn a_truncated_marker_at_eof_is_output() {
        let m = marker(3);
        let segs = scan_in_pieces(&m[..20], 5);
        assert_eq!(segs, vec![Segment::Data(m[..20].to_vec())]);
    }

    #[test]
    fn capture_keeps_head_and_tail_and_counts_the_rest() {
        let mut cap = Capture::new(10, 10, "python_output");
        for i in 0..100 {
            cap.push(Stream::Stdout, format!("{i:03}\n").as_bytes());
        }
        let r = cap.render();
        assert_eq!(r.total_bytes, 400);
        assert_eq!(r.omitted_bytes, 380);
        assert!(r.combined.starts_with("000\n001\n00"), "{}", r.combined);
        assert!(r.combined.ends_with("8\n099\n"), "{}", r.combined);
        assert!(r.combined.contains("380 bytes"));
    }

    #[test]
    fn capture_keeps_arrival_order_across_streams() {
        let mut cap = Capture::new(100, 100, "python_output");
        cap.push(Stream::Stdout, b"a\n");
        cap.push(Stream::Stderr, b"b\n");
        cap.push(Stream::Stdout, b"c\n");
        let r = cap.render();
        assert_eq!(r.combined, "a\nb\nc\n");
        assert_eq!(r.stdout, "a\nc\n");
        assert_eq!(r.stderr, "b\n");
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        let mut cap = Capture::new(100, 100, "python_output");
        cap.push(Stream::Stdout, b"ok \xff\xfe end\n");
        assert_eq!(cap.render().stdout, "ok \u{fffd}\u{fffd} end\n");
    }
}
