//! What a kernel's messages carry, made into what a driver sends: a
//! bundle's text, values capped, tracebacks without colours, a PNG's size.

use jupyter_protocol::{ErrorOutput, Media, MediaType};

use crate::worker::protocol::PyError;

/// The most characters of one text a cell event carries (a value, an
/// error's message, its traceback), whatever --max-value-chars says: JSON
/// writes a character in at most 6 bytes, so a done event's texts stay
/// well under the 16 MiB a worker reads of one event line (a longer line
/// is dropped, and its cell would never end).
pub(super) const MAX_EVENT_TEXT_CHARS: usize = 600_000;
/// The largest image a display event carries, whatever --max-image-bytes
/// says: its base64 (4 bytes for 3) stays under the 16 MiB event line.
pub(super) const MAX_EVENT_IMAGE_BYTES: u64 = 11 << 20;
/// The most characters of an error's type name.
const MAX_ERROR_KIND_CHARS: usize = 200;
/// The most characters of an input prompt (the prompt event and its echo).
pub(super) const MAX_PROMPT_CHARS: usize = 4000;

/// A bundle's text: plain, else markdown, else HTML, else LaTeX.
pub(super) fn text_of(data: &Media) -> Option<&str> {
    let find = |want: fn(&MediaType) -> Option<&String>| data.content.iter().find_map(want);
    find(|m| match m {
        MediaType::Plain(t) => Some(t),
        _ => None,
    })
    .or_else(|| {
        find(|m| match m {
            MediaType::Markdown(t) => Some(t),
            _ => None,
        })
    })
    .or_else(|| {
        find(|m| match m {
            MediaType::Html(t) => Some(t),
            _ => None,
        })
    })
    .or_else(|| {
        find(|m| match m {
            MediaType::Latex(t) => Some(t),
            _ => None,
        })
    })
    .map(String::as_str)
}

/// At most `max` characters, saying how many more there were.
pub(super) fn cap(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!(
            "{}... [{} more characters]",
            &text[..cut],
            text[cut..].chars().count()
        ),
        None => text.to_string(),
    }
}

/// A kernel's error as the driver reports one, each text capped at `max`
/// characters (and `MAX_EVENT_TEXT_CHARS`): the agent's code chooses how
/// long an error's value and traceback are.
pub(super) fn error_of(e: &ErrorOutput, max: usize) -> PyError {
    let max = max.min(MAX_EVENT_TEXT_CHARS);
    PyError {
        kind: cap(&e.ename, MAX_ERROR_KIND_CHARS),
        // IRkernel ends its evalue with a newline.
        message: cap(e.evalue.trim_end(), max),
        traceback: cap(&traceback_of(e), max),
    }
}

/// An error's traceback as the cell shows it: the kernel's lines without
/// colours, or, when it sent none (bash_kernel sends only the exit status
/// as the value), its type and value, so that the result says what failed.
fn traceback_of(e: &jupyter_protocol::ErrorOutput) -> String {
    if e.traceback.is_empty() {
        return match e.ename.as_str() {
            "" => format!("the kernel reported an error: {}\n", e.evalue),
            kind => format!("{kind}: {}\n", e.evalue),
        };
    }
    let lines: Vec<String> = e.traceback.iter().map(|l| strip_ansi(l)).collect();
    format!("{}\n", lines.join("\n"))
}

/// `text` without ANSI escape sequences (IPython colours its tracebacks):
/// CSI sequences up to their final byte, other escapes with their one
/// following character.
pub(super) fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

/// A PNG's width and height, from its header.
pub(super) fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    if bytes.len() < 24 || !bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return None;
    }
    let be =
        |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    Some((be(16), be(20)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracebacks_lose_their_colours_and_values_their_excess() {
        assert_eq!(
            strip_ansi("\u{1b}[0;31mZeroDivisionError\u{1b}[0m: x"),
            "ZeroDivisionError: x"
        );
        assert_eq!(cap("abcdef", 3), "abc... [3 more characters]");
        assert_eq!(cap("abc", 3), "abc");
    }

    #[test]
    fn an_error_is_capped_field_by_field() {
        let e = ErrorOutput {
            ename: "K".repeat(1000),
            evalue: "E".repeat(5_000_000),
            traceback: vec!["T".repeat(5_000_000)],
        };
        let error = error_of(&e, usize::MAX);
        assert!(error.kind.starts_with(&"K".repeat(MAX_ERROR_KIND_CHARS)));
        assert!(error.kind.ends_with("... [800 more characters]"));
        assert!(error.message.len() < MAX_EVENT_TEXT_CHARS + 100);
        assert!(error.traceback.len() < MAX_EVENT_TEXT_CHARS + 100);
        assert_eq!(
            error_of(&e, 10).message,
            "EEEEEEEEEE... [4999990 more characters]"
        );
    }

    #[test]
    fn a_png_says_its_size() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&[0, 0, 0, 7, 0, 0, 0, 9]);
        assert_eq!(png_size(&png), Some((7, 9)));
        assert_eq!(png_size(b"GIF89a"), None);
    }
}
