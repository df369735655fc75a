//! The words of results the docs quote, checked against the code, so that
//! a reworded result cannot leave the docs quoting what no result says.
//!
//! In README.md and docs/*.md, a quoted phrase right after the marker
//! `<!--result-->` ("phrase" or `phrase`) is what a result, note or error
//! of ferrepl says. Each must be found in a string of ferrepl's sources
//! (src/: Rust, and the Python and R the sessions run): its words in order,
//! with an ALL-CAPS word (HOST, N) or `…` standing for a value, which in the
//! source is a `{}` placeholder or an R `paste`'s part. Line breaks and
//! runs of spaces in the docs count as one space.

use std::path::{Path, PathBuf};

const MARKER: &str = "<!--result-->";

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The docs that may quote results: README.md and docs/*.md.
fn docs() -> Vec<PathBuf> {
    let mut files = vec![repo("README.md")];
    let dir = std::fs::read_dir(repo("docs")).expect("read docs/");
    for entry in dir.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// Every marked phrase of `text`, its whitespace collapsed.
fn marked_phrases(text: &str) -> Vec<String> {
    let mut phrases = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(MARKER) {
        rest = &rest[at + MARKER.len()..];
        let Some(quote) = rest.chars().next().filter(|c| *c == '"' || *c == '`') else {
            panic!(
                "{MARKER} must be followed by a quote: {:?}",
                first_line(rest)
            );
        };
        let body = &rest[1..];
        let Some(end) = body.find(quote) else {
            panic!("{MARKER}: the quote is not closed: {:?}", first_line(rest));
        };
        phrases.push(body[..end].split_whitespace().collect::<Vec<_>>().join(" "));
        rest = &body[end + 1..];
    }
    phrases
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// A value's stand-in in a quoted phrase.
fn is_placeholder(word: &str) -> bool {
    let word = word.trim_matches(|c: char| c.is_ascii_punctuation());
    word == "…" || (!word.is_empty() && word.chars().all(|c| c.is_ascii_uppercase()))
}

/// The phrase as a pattern over source text: its words in order, spaces
/// matching any whitespace, each placeholder any short run of characters
/// on one line.
fn pattern(phrase: &str) -> regex::Regex {
    let parts: Vec<String> = phrase
        .split(' ')
        .map(|word| {
            if !is_placeholder(word) {
                return regex::escape(word);
            }
            // The punctuation around a stand-in is literal ("N," "HOST;").
            let lead: String = word
                .chars()
                .take_while(|c| c.is_ascii_punctuation())
                .collect();
            let trail: String = word
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_punctuation())
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            format!(
                "{}[^\\n]{{1,40}}?{}",
                regex::escape(&lead),
                regex::escape(&trail)
            )
        })
        .collect();
    regex::Regex::new(&parts.join(r"\s+")).expect("a phrase's pattern")
}

/// Each source file's text under src/, with Rust's `\` line continuations
/// joined (so that a string split over lines reads as one).
fn sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, continuation: &regex::Regex, out: &mut Vec<(PathBuf, String)>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {dir:?}: {e}"));
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            // Tests may quote a phrase no result says.
            if name == "tests" || name == "tests.rs" {
                continue;
            }
            if path.is_dir() {
                walk(&path, continuation, out);
            } else if path
                .extension()
                .is_some_and(|e| e == "rs" || e == "py" || e == "R")
            {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let joined = continuation.replace_all(&text, "");
                out.push((path, joined.into_owned()));
            }
        }
    }
    let continuation = regex::Regex::new(r"\\\n\s*").expect("continuation");
    let mut out = Vec::new();
    walk(&repo("src"), &continuation, &mut out);
    out
}

#[test]
fn quoted_result_words_are_what_the_code_says() {
    let sources = sources();
    let mut checked = 0;
    let mut missing = Vec::new();
    for doc in docs() {
        let text = std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("read {doc:?}: {e}"));
        for phrase in marked_phrases(&text) {
            checked += 1;
            let pattern = pattern(&phrase);
            if !sources.iter().any(|(_, src)| pattern.is_match(src)) {
                missing.push(format!(
                    "{}: {phrase:?}",
                    doc.strip_prefix(repo("")).unwrap_or(&doc).display()
                ));
            }
        }
    }
    assert!(
        checked >= 5,
        "only {checked} marked result phrases found: is {MARKER} still used?"
    );
    assert!(
        missing.is_empty(),
        "quoted as results, said by no result in src/:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_phrase_reader_takes_markers_placeholders_and_line_breaks() {
    let text = "a <!--result-->\"Sent\n  again\", b <!--result-->`egress to HOST is not allowed`";
    let phrases = marked_phrases(text);
    assert_eq!(phrases, ["Sent again", "egress to HOST is not allowed"]);
    let p = pattern(&phrases[1]);
    assert!(p.is_match("\"ferrepl: egress to {host} is not allowed; ...\""));
    assert!(!p.is_match("egress to {host} is allowed"));
    assert!(pattern("Tool calls: N, X s").is_match("Tool calls: {}{failed}, {:.2} s waiting"));
}
