//! python_output: windows and searches over a cell's full output.

use super::args::index;
use crate::mcp::surface::OutputWindow;
use crate::mcp::surface::WindowParams;
use crate::output::text::clean;

/// Default and largest window, in characters (or lines with `lines: true`).
/// Larger limits are clamped to the maximum, offsets past the end give an
/// empty window: no argument value is an error here.
pub const DEFAULT_CHARS: usize = 20_000;
pub const MAX_CHARS: usize = 200_000;
pub const DEFAULT_LINES: usize = 200;
pub const MAX_LINES: usize = 10_000;
/// Most context lines around a grep match.
pub const MAX_CONTEXT: u64 = 20;
const MAX_MATCHES: usize = 500;

pub enum Origin {
    Cell { session: String, cell: u64 },
    Job(String),
}

pub struct Source {
    pub origin: Origin,
    pub running: bool,
    pub bytes: Vec<u8>,
    pub dropped: u64,
}

pub fn window(src: Source, p: &WindowParams) -> Result<OutputWindow, String> {
    let text = clean(&String::from_utf8_lossy(&src.bytes));
    let total_chars = text.chars().count() as u64;
    let line_list: Vec<&str> = text.lines().collect();
    let total_lines = line_list.len() as u64;
    let (session, cell, job) = match src.origin {
        Origin::Cell { session, cell } => (Some(session), Some(cell), None),
        Origin::Job(job) => (None, None, Some(job)),
    };
    let mut out = OutputWindow {
        session,
        cell,
        job,
        running: src.running,
        total_chars,
        total_lines,
        offset: 0,
        text: String::new(),
        next_offset: None,
        matches: None,
        dropped_bytes: src.dropped,
    };
    if let Some(pattern) = p.grep.as_deref().filter(|g| !g.is_empty()) {
        grep(&mut out, &line_list, pattern, p)?;
        return Ok(out);
    }
    if p.lines.unwrap_or(false) {
        let first = p.offset.unwrap_or(1).max(1);
        let count = p.limit.map_or(DEFAULT_LINES, index).clamp(1, MAX_LINES);
        let start = index(first - 1);
        let end = start.saturating_add(count).min(line_list.len());
        if start < line_list.len() {
            for line in &line_list[start..end] {
                out.text.push_str(line);
                out.text.push('\n');
            }
        }
        out.offset = first;
        out.next_offset = (end < line_list.len()).then_some(end as u64 + 1);
        return Ok(out);
    }
    let offset = p.offset.unwrap_or(0);
    let limit = p.limit.map_or(DEFAULT_CHARS, index).clamp(1, MAX_CHARS);
    out.text = text.chars().skip(index(offset)).take(limit).collect();
    out.offset = offset;
    let end = offset.saturating_add(out.text.chars().count() as u64);
    out.next_offset = (end < total_chars).then_some(end);
    Ok(out)
}

/// The lines matching `pattern`, numbered, with `context` lines around
/// (`12: match`, `11- context`, `--` between groups).
fn grep(
    out: &mut OutputWindow,
    line_list: &[&str],
    pattern: &str,
    p: &WindowParams,
) -> Result<(), String> {
    let re =
        regex::Regex::new(pattern).map_err(|e| format!("invalid grep pattern {pattern:?}: {e}"))?;
    let context = index(p.context.unwrap_or(1).min(MAX_CONTEXT));
    let budget = p.limit.map_or(DEFAULT_CHARS, index).min(MAX_CHARS);
    let hits: Vec<usize> = line_list
        .iter()
        .enumerate()
        .filter(|(_, l)| re.is_match(l))
        .map(|(i, _)| i)
        .collect();
    out.matches = Some(hits.len() as u64);
    let mut last_printed: Option<usize> = None;
    for (shown, &hit) in hits.iter().enumerate() {
        if shown >= MAX_MATCHES || out.text.len() >= budget {
            out.text.push_str(&format!(
                "[... {} more matching lines not shown; narrow the pattern or raise limit]\n",
                hits.len() - shown
            ));
            break;
        }
        let from = hit.saturating_sub(context);
        let to = hit
            .saturating_add(context)
            .min(line_list.len().saturating_sub(1));
        if let Some(last) = last_printed
            && from > last + 1
        {
            out.text.push_str("--\n");
        }
        let start = last_printed.map_or(from, |l| from.max(l + 1));
        for (i, line) in line_list.iter().enumerate().take(to + 1).skip(start) {
            let mark = if i == hit || re.is_match(line) {
                ':'
            } else {
                '-'
            };
            out.text.push_str(&format!("{}{mark} {line}\n", i + 1));
        }
        last_printed = Some(to.max(last_printed.unwrap_or(0)));
    }
    Ok(())
}

/// The text block: a header that says where the window is, then the window.
/// A window over `src` as a tool result: its text and its structured form.
pub fn reply(src: Source, p: &WindowParams) -> super::error::ToolResult {
    let w = window(src, p)?;
    let text = render(&w, p.lines.unwrap_or(false));
    Ok(super::render::structured(text, &w))
}

pub fn render(w: &OutputWindow, lines: bool) -> String {
    let state = if w.running { "running" } else { "finished" };
    let what = match (&w.job, w.cell) {
        (Some(job), _) => format!("job {job}"),
        (None, Some(cell)) => format!("cell {cell}"),
        _ => "output".to_string(),
    };
    let mut head = format!(
        "[{what} ({state}) output: {} characters, {} lines",
        w.total_chars, w.total_lines
    );
    if let Some(n) = w.matches {
        head.push_str(&format!("; {n} matching lines"));
    } else if lines {
        head.push_str(&format!("; lines from {}", w.offset));
    } else {
        head.push_str(&format!("; characters from {}", w.offset));
    }
    if let Some(next) = w.next_offset {
        head.push_str(&format!("; more: python_output with offset={next}"));
    }
    if w.dropped_bytes > 0 {
        head.push_str(&format!(
            "; {} bytes past the per-cell limit were not kept",
            w.dropped_bytes
        ));
    }
    head.push_str("]\n");
    head + &w.text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(text: &str) -> Source {
        Source {
            origin: Origin::Cell {
                session: "s".into(),
                cell: 1,
            },
            running: false,
            bytes: text.as_bytes().to_vec(),
            dropped: 0,
        }
    }

    fn params() -> WindowParams {
        WindowParams::default()
    }

    #[test]
    fn character_windows_are_exact_and_chain() {
        let text: String = (0..1000).map(|i| format!("{i}\n")).collect();
        let mut p = params();
        p.limit = Some(100);
        let w1 = window(src(&text), &p).expect("window");
        assert_eq!(w1.text, text[..100]);
        p.offset = w1.next_offset;
        let w2 = window(src(&text), &p).expect("window");
        assert_eq!(w2.text, text[100..200]);
    }

    #[test]
    fn line_windows_count_from_one() {
        let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        let mut p = params();
        p.lines = Some(true);
        p.offset = Some(3);
        p.limit = Some(2);
        let w = window(src(&text), &p).expect("window");
        assert_eq!(w.text, "line 3\nline 4\n");
        assert_eq!(w.next_offset, Some(5));
    }

    #[test]
    fn grep_numbers_matches_and_context() {
        let text = "a\nb\nERROR one\nc\nd\ne\nERROR two\n";
        let mut p = params();
        p.grep = Some("ERROR".into());
        let w = window(src(text), &p).expect("window");
        assert_eq!(w.matches, Some(2));
        assert_eq!(w.text, "2- b\n3: ERROR one\n4- c\n--\n6- e\n7: ERROR two\n");
    }

    #[test]
    fn huge_offsets_and_limits_are_clamped() {
        let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        for lines in [false, true] {
            for (offset, limit) in [(u64::MAX, u64::MAX), (u64::MAX - 1, 1), (0, u64::MAX)] {
                let mut p = params();
                p.lines = Some(lines);
                p.offset = Some(offset);
                p.limit = Some(limit);
                let w = window(src(&text), &p).expect("window");
                assert_eq!(w.offset, if lines { offset.max(1) } else { offset });
                if offset == 0 {
                    assert_eq!(w.text, text);
                } else {
                    assert!(w.text.is_empty());
                }
            }
        }
        let mut p = params();
        p.grep = Some("line 5".into());
        p.context = Some(u64::MAX);
        p.limit = Some(u64::MAX);
        let w = window(src(&text), &p).expect("window");
        assert_eq!(w.matches, Some(1));
        assert_eq!(w.text.lines().count(), 10);
    }

    #[test]
    fn a_bad_pattern_is_an_error() {
        let mut p = params();
        p.grep = Some("(".into());
        assert!(window(src("x"), &p).is_err());
    }
}
