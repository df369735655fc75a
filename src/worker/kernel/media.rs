//! What a kernel's messages carry, made into what a driver sends: a
//! bundle's text, values capped, tracebacks without colours, a PNG's size.

use jupyter_protocol::{Media, MediaType};

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

/// An error's traceback as the cell shows it: the kernel's lines without
/// colours, or, when it sent none (bash_kernel sends only the exit status
/// as the value), its type and value, so that the result says what failed.
pub(super) fn traceback_of(e: &jupyter_protocol::ErrorOutput) -> String {
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
    fn a_png_says_its_size() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&[0, 0, 0, 7, 0, 0, 0, 9]);
        assert_eq!(png_size(&png), Some((7, 9)));
        assert_eq!(png_size(b"GIF89a"), None);
    }
}
