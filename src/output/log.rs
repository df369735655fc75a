//! The full output of cells, kept for `python_output`.
//!
//! Output is recorded as segments (one per span an event or a call took).
//! A segment keeps its first bytes in memory and spills the rest to a file in
//! the session's temporary directory; a per-cell budget bounds the disk used.
//! Files are removed when their segment is dropped (retention, reset, exit).

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of a segment kept in memory before it spills to disk.
pub const SEGMENT_MEMORY_BYTES: usize = 64 * 1024;

static NEXT_FILE: AtomicU64 = AtomicU64::new(1);

#[derive(Debug)]
struct Spill {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
    len: u64,
}

impl Drop for Spill {
    fn drop(&mut self) {
        self.writer.take();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A recorded span of combined output.
#[derive(Debug, Default)]
pub struct Segment {
    memory: Vec<u8>,
    spill: Option<Spill>,
    dropped: u64,
}

impl Segment {
    pub fn len(&self) -> u64 {
        self.memory.len() as u64 + self.spill.as_ref().map_or(0, |s| s.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Appends up to `budget` bytes (returns how many were kept).
    pub fn push(&mut self, data: &[u8], budget: u64, dir: &Path) -> u64 {
        let keep = (data.len() as u64).min(budget) as usize;
        self.dropped += (data.len() - keep) as u64;
        let data = &data[..keep];
        if data.is_empty() {
            return 0;
        }
        if self.spill.is_none() && self.memory.len() + data.len() <= SEGMENT_MEMORY_BYTES {
            self.memory.extend_from_slice(data);
            return keep as u64;
        }
        if self.spill.is_none() {
            match open_spill(dir) {
                Ok(spill) => self.spill = Some(spill),
                Err(e) => {
                    tracing::warn!("cannot spill output to {}: {e}", dir.display());
                    self.dropped += keep as u64;
                    return 0;
                }
            }
        }
        let Some(spill) = self.spill.as_mut() else {
            return 0;
        };
        let written = spill
            .writer
            .as_mut()
            .map(|w| w.write_all(data).is_ok())
            .unwrap_or(false);
        if written {
            spill.len += keep as u64;
            keep as u64
        } else {
            self.dropped += keep as u64;
            0
        }
    }

    /// Bytes `from..from + n` of the segment (as many as there are),
    /// appended to `out`: only those are read, from memory or from the
    /// spill file at that offset.
    pub fn read_range(&mut self, from: u64, n: u64, out: &mut Vec<u8>) {
        let mem = self.memory.len() as u64;
        let end = from.saturating_add(n).min(self.len());
        if from >= end {
            return;
        }
        if from < mem {
            out.extend_from_slice(&self.memory[from as usize..end.min(mem) as usize]);
        }
        if end <= mem {
            return;
        }
        let Some(spill) = self.spill.as_mut() else {
            return;
        };
        if let Some(w) = spill.writer.as_mut() {
            let _ = w.flush();
        }
        let start = from.max(mem) - mem;
        if let Ok(mut f) = File::open(&spill.path)
            && f.seek(SeekFrom::Start(start)).is_ok()
        {
            let _ = f.take(end - mem - start).read_to_end(out);
        }
    }

    /// Where its bytes are, for reading them later without the lock that
    /// guards the segment: a copy of the part in memory, the spill file
    /// (flushed) by path and length.
    pub fn pieces(&mut self, out: &mut Vec<Piece>) {
        if !self.memory.is_empty() {
            out.push(Piece::Bytes(self.memory.clone()));
        }
        if let Some(spill) = self.spill.as_mut().filter(|s| s.len > 0) {
            if let Some(w) = spill.writer.as_mut() {
                let _ = w.flush();
            }
            out.push(Piece::File {
                path: spill.path.clone(),
                len: spill.len,
            });
        }
    }

    /// All bytes of the segment.
    pub fn read_all(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.memory);
        if let Some(spill) = self.spill.as_mut() {
            if let Some(w) = spill.writer.as_mut() {
                let _ = w.flush();
            }
            if let Ok(mut f) = File::open(&spill.path) {
                let _ = f.seek(SeekFrom::Start(0));
                let _ = f.take(spill.len).read_to_end(out);
            }
        }
    }
}

/// Total bytes of `segments`.
pub fn segments_len(segments: &[Segment]) -> u64 {
    segments.iter().map(Segment::len).sum()
}

/// Bytes `from..from + n` of `segments` taken as one stream.
pub fn read_segments(segments: &mut [Segment], mut from: u64, mut n: u64, out: &mut Vec<u8>) {
    for s in segments {
        if n == 0 {
            return;
        }
        let len = s.len();
        if from >= len {
            from -= len;
            continue;
        }
        let before = out.len();
        s.read_range(from, n, out);
        n = n.saturating_sub((out.len() - before) as u64);
        from = 0;
    }
}

/// Part of a log to read later (see [`Segment::pieces`]).
#[derive(Debug)]
pub enum Piece {
    Bytes(Vec<u8>),
    File { path: PathBuf, len: u64 },
}

/// Reads pieces of a log in chunks, off the locks that guard the log:
/// spill files are written only by appending and named once, so the first
/// `len` bytes of one stay what they were; a file removed meanwhile (a
/// reset, retention) ends the text with a note.
#[derive(Debug)]
pub struct LogReader {
    pieces: std::collections::VecDeque<Piece>,
    /// The open file of the first piece and where it is.
    file: Option<(File, u64)>,
    done: bool,
}

impl LogReader {
    pub fn new(pieces: Vec<Piece>) -> Self {
        Self {
            pieces: pieces.into(),
            file: None,
            done: false,
        }
    }

    /// The next chunk of at most `max` bytes (blocking file reads), or None
    /// at the end.
    pub fn next_chunk(&mut self, max: usize) -> Option<Vec<u8>> {
        loop {
            if self.done {
                return None;
            }
            match self.pieces.front_mut()? {
                Piece::Bytes(b) => {
                    if b.len() <= max {
                        let chunk = std::mem::take(b);
                        self.pieces.pop_front();
                        if chunk.is_empty() {
                            continue;
                        }
                        return Some(chunk);
                    }
                    let rest = b.split_off(max);
                    return Some(std::mem::replace(b, rest));
                }
                Piece::File { path, len } => {
                    if self.file.is_none() {
                        match File::open(&*path) {
                            Ok(f) => self.file = Some((f, 0)),
                            Err(_) => {
                                self.done = true;
                                return Some(
                                    b"\n[... the rest of this output is no longer kept]\n".to_vec(),
                                );
                            }
                        }
                    }
                    let len = *len;
                    let (f, at) = self.file.as_mut()?;
                    let want = (len - *at).min(max as u64);
                    let mut chunk = Vec::with_capacity(want as usize);
                    let got = f.take(want).read_to_end(&mut chunk).unwrap_or(0) as u64;
                    *at += got;
                    if got == 0 || *at >= len {
                        self.file = None;
                        self.pieces.pop_front();
                    }
                    if got == 0 {
                        continue;
                    }
                    return Some(chunk);
                }
            }
        }
    }
}

/// Where `bytes` can start without cutting a UTF-8 sequence (past at most
/// three continuation bytes).
pub fn utf8_start(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .take(3)
        .take_while(|b| (**b & 0xC0) == 0x80)
        .count()
}

/// The length of `bytes` without a UTF-8 sequence cut at its end (it may
/// complete with bytes still to come).
pub fn utf8_end(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(4) {
        let b = bytes[n - back];
        if (b & 0xC0) == 0x80 {
            continue;
        }
        let need = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if need > back { n - back } else { n };
    }
    n
}

fn open_spill(dir: &Path) -> std::io::Result<Spill> {
    std::fs::create_dir_all(dir)?;
    let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("output-{n}.log"));
    let file = File::create(&path)?;
    Ok(Spill {
        path,
        writer: Some(BufWriter::with_capacity(64 * 1024, file)),
        len: 0,
    })
}

/// The full output of one cell: its segments in order.
#[derive(Debug, Default)]
pub struct CellLog {
    pub cell: u64,
    segments: Vec<Segment>,
}

impl CellLog {
    pub fn new(cell: u64) -> Self {
        Self {
            cell,
            segments: Vec::new(),
        }
    }

    pub fn add_all(&mut self, segments: Vec<Segment>) {
        self.segments.extend(
            segments
                .into_iter()
                .filter(|s| !s.is_empty() || s.dropped() > 0),
        );
    }

    /// Bytes recorded (not counting those dropped).
    pub fn len(&self) -> u64 {
        segments_len(&self.segments)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes `from..from + n` of the log (see [`Segment::read_range`]).
    pub fn read_range(&mut self, from: u64, n: u64, out: &mut Vec<u8>) {
        read_segments(&mut self.segments, from, n, out);
    }

    /// See [`Segment::pieces`].
    pub fn pieces(&mut self, out: &mut Vec<Piece>) {
        for s in &mut self.segments {
            s.pieces(out);
        }
    }

    pub fn bytes(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        for s in &mut self.segments {
            s.read_all(&mut out);
        }
        out
    }

    pub fn dropped(&self) -> u64 {
        self.segments.iter().map(Segment::dropped).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_spill_to_disk_and_read_back_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut seg = Segment::default();
        let mut expected = Vec::new();
        for i in 0..20_000u32 {
            let line = format!("line {i}\n");
            seg.push(line.as_bytes(), u64::MAX, dir.path());
            expected.extend_from_slice(line.as_bytes());
        }
        assert!(seg.spill.is_some(), "large output must spill");
        let mut got = Vec::new();
        seg.read_all(&mut got);
        assert_eq!(got, expected);
        let path = seg.spill.as_ref().map(|s| s.path.clone()).expect("path");
        drop(seg);
        assert!(!path.exists(), "the spill file goes with its segment");
    }

    #[test]
    fn the_budget_bounds_what_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut seg = Segment::default();
        let kept = seg.push(&[b'x'; 1000], 300, dir.path());
        assert_eq!(kept, 300);
        assert_eq!(seg.len(), 300);
        assert_eq!(seg.dropped(), 700);
    }

    #[test]
    fn a_range_of_a_spilled_log_reads_only_its_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = CellLog::new(1);
        let mut expected = Vec::new();
        let mut segments = Vec::new();
        for part in 0..3u32 {
            let mut seg = Segment::default();
            for i in 0..30_000u32 {
                let line = format!("{part}:{i}\n");
                seg.push(line.as_bytes(), u64::MAX, dir.path());
                expected.extend_from_slice(line.as_bytes());
            }
            segments.push(seg);
        }
        log.add_all(segments);
        assert_eq!(log.len(), expected.len() as u64);
        let total = log.len();
        // The end, across the last segment's memory and spill file.
        for (from, n) in [
            (total - 1000, 1000),
            (total - 200_000, 64 * 1024),
            (10, 70_000),
            (total - 10, 100),
            (total + 5, 10),
        ] {
            let mut got = Vec::new();
            log.read_range(from, n, &mut got);
            let start = (from as usize).min(expected.len());
            let end = (start + n as usize).min(expected.len());
            assert_eq!(got, expected[start..end], "{from} {n}");
        }
        // The file's beginning is never read for its end: overwrite it and
        // the tail is still the bytes written last.
        let last = log.segments.last_mut().expect("segment");
        let path = last
            .spill
            .as_ref()
            .map(|s| s.path.clone())
            .expect("spilled");
        if let Some(w) = last.spill.as_mut().and_then(|s| s.writer.as_mut()) {
            w.flush().expect("flush");
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.write_all(&[b'#'; 4096]).expect("overwrite");
        drop(f);
        let mut tail = Vec::new();
        log.read_range(total - 4096, 4096, &mut tail);
        assert_eq!(tail, expected[expected.len() - 4096..]);
        // The length needs no file at all.
        std::fs::remove_file(&path).expect("remove");
        assert_eq!(log.len(), total);
    }

    #[test]
    fn pieces_read_back_the_whole_log_and_say_when_a_file_went() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut seg = Segment::default();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        seg.push(&data[..1000], u64::MAX, dir.path());
        seg.push(&data[1000..], u64::MAX, dir.path());
        let mut log = CellLog::new(1);
        log.add_all(vec![seg]);
        let mut pieces = Vec::new();
        log.pieces(&mut pieces);
        let mut reader = LogReader::new(pieces);
        let mut got = Vec::new();
        while let Some(chunk) = reader.next_chunk(10_000) {
            assert!(chunk.len() <= 10_000);
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, data);
        let mut pieces = Vec::new();
        log.pieces(&mut pieces);
        drop(log);
        let mut reader = LogReader::new(pieces);
        let mut got = Vec::new();
        while let Some(chunk) = reader.next_chunk(1 << 20) {
            got.extend_from_slice(&chunk);
        }
        assert!(got.starts_with(&data[..1000]));
        assert!(got.ends_with(b"no longer kept]\n"), "{}", got.len());
        assert!(got.len() < 1100, "{}", got.len());
    }

    #[test]
    fn utf8_edges_are_not_cut() {
        let s = "aé€😀".as_bytes();
        assert_eq!(utf8_start(&s[2..]), 1);
        assert_eq!(utf8_start(s), 0);
        assert_eq!(utf8_end(&s[..s.len() - 1]), s.len() - 4);
        assert_eq!(utf8_end(s), s.len());
        assert_eq!(utf8_end(&s[..2]), 1);
        assert_eq!(utf8_end(b"ab\xff"), 3);
    }
}
