//! Cleaning output for reading: terminal escape codes removed, and lines
//! rewritten with carriage returns (progress bars) reduced to their final state.

/// Removes ANSI escape sequences and collapses carriage-return overwrites.
pub fn clean(text: &str) -> String {
    collapse_carriage_returns(&strip_ansi(text))
}

fn strip_ansi(text: &str) -> String {
    if !text.contains('\x1b') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        match chars.next() {
            // CSI: parameters and intermediates, then one final byte.
            Some('[') => {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            // OSC (window titles, hyperlinks): up to BEL or ESC \.
            Some(']') => {
                while let Some(c) = chars.next() {
                    if c == '\x07' {
                        break;
                    }
                    if c == '\x1b' {
                        if chars.peek() == Some(&'\\') {
                            chars.next();
                        }
                        break;
                    }
                }
            }
            // Two-character sequences (ESC c, ESC =, ...).
            Some(_) | None => {}
        }
    }
    out
}

fn collapse_carriage_returns(text: &str) -> String {
    if !text.contains('\r') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let line = line.strip_suffix('\r').unwrap_or(line);
        // What a terminal shows: the text after the last non-trailing \r.
        let shown = line.rsplit('\r').find(|s| !s.is_empty()).unwrap_or("");
        out.push_str(shown);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_bars_keep_their_final_state() {
        let raw = "start\n 10%|#   |\r 50%|##  |\r100%|####|\ndone\r\n";
        assert_eq!(clean(raw), "start\n100%|####|\ndone\n");
    }

    #[test]
    fn ansi_sequences_are_removed() {
        let raw = "\x1b[31mred\x1b[0m plain \x1b]0;title\x07end \x1b[2K\x1b[1Gx";
        assert_eq!(clean(raw), "red plain end x");
    }

    #[test]
    fn plain_text_is_unchanged() {
        assert_eq!(clean("a\nb\n"), "a\nb\n");
    }
}
