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
}
