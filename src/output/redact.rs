//! The secrets ferrepl hands out (upstream servers' `env` and header
//! values, credentials in URLs, its own bearer tokens and the viewer's),
//! replaced by [`MARKER`] in every text that ferrepl composes from what
//! the holders of those secrets say (an upstream's errors, stderr,
//! results, tool lists, progress) before a session, a tool result or the
//! viewer sees it.
//!
//! Each secret is looked for as it is, percent-encoded (the usual sets,
//! both hex cases), JSON-escaped (minimal and ASCII-only, `\/` or not),
//! and in base64 (standard and URL-safe alphabets) at each of the three
//! alignments a secret can have inside a longer encoded string (`Basic
//! base64(user:password)`): there, only the characters made of the
//! secret's bits alone are stable, so those are matched, and the one
//! character on each side that mixes its bits with its neighbours' goes
//! with them. Values shorter than [`MIN_SECRET_CHARS`] characters are not
//! secrets (they would match ordinary words and say little).
//!
//! Matches may overlap (two secrets sharing characters): every match is
//! found and overlapping ones are replaced as one. Text that arrives in
//! pieces goes through a [`StreamRedactor`], which holds back only what
//! may be the start of a secret, so a secret cut by a chunk boundary is
//! still found. Redact before cutting a text to a size: a cut could leave
//! a secret's start, which no longer matches.
//!
//! This is no filter for a session's own output: that text is the
//! agent's, and redacting it would tell the agent which strings are
//! secrets (an oracle for guesses).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;
use serde_json::Value;

mod forms;

use forms::{Form, forms_of};

/// What a secret is replaced with.
pub const MARKER: &str = "[redacted]";
/// Shorter values are not treated as secrets.
pub const MIN_SECRET_CHARS: usize = 8;
/// What replaces a whole text when the secrets cannot be looked for.
const WITHHELD: &str =
    "[withheld: ferrepl could not look for its secrets in this text; see its log]";
/// The start of a secret this long, where a library may have cut it, goes
/// too ([`Redactor::redact_cut`]).
const PARTIAL_MIN: usize = 6;

/// The forms of a set of secrets, ready to be found in text.
pub struct Redactor {
    secrets: BTreeSet<String>,
    /// The forms looked for (indexed like the automaton's patterns).
    forms: Vec<Form>,
    matcher: Option<AhoCorasick>,
    /// The first [`PARTIAL_MIN`] bytes of the longer forms, and the forms
    /// each one starts.
    starts: Option<(AhoCorasick, Vec<Vec<usize>>)>,
    /// The matcher could not be built: every text is withheld whole
    /// rather than passed on unredacted.
    broken: bool,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets themselves.
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets.len())
            .field("forms", &self.forms.len())
            .finish()
    }
}

impl Default for Redactor {
    fn default() -> Self {
        Self::new(std::iter::empty::<&str>())
    }
}

impl Redactor {
    /// The redactor of `secrets` (values under [`MIN_SECRET_CHARS`]
    /// characters are left out).
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let secrets: BTreeSet<String> = secrets
            .into_iter()
            .map(|s| s.as_ref().to_string())
            .filter(|s| is_secret(s))
            .collect();
        let mut seen: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut forms = Vec::new();
        for secret in &secrets {
            for form in forms_of(secret) {
                if form.bytes.is_empty() || !seen.insert(form.bytes.clone()) {
                    continue;
                }
                forms.push(form);
            }
        }
        let mut broken = false;
        let matcher = if forms.is_empty() {
            None
        } else {
            // Standard semantics: overlapping matches are all reported.
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(forms.iter().map(|f| f.bytes.as_slice()))
                .map_err(|e| {
                    broken = true;
                    tracing::error!(
                        "the matcher of the secrets to redact could not be built ({e}): what upstream servers say is withheld whole; give them shorter secrets"
                    )
                })
                .ok()
        };
        let starts = starts_of(&forms);
        Redactor {
            secrets,
            forms,
            matcher,
            starts,
            broken,
        }
    }

    /// These secrets and `more`'s.
    pub fn with(&self, more: &Redactor) -> Redactor {
        Redactor::new(self.secrets.iter().chain(more.secrets.iter()))
    }

    /// Whether it holds no secret.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// How many secrets it holds.
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    /// `text` with every secret replaced by [`MARKER`].
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.redact_bytes(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            // Forms are whole UTF-8 sequences and extensions ASCII, so the
            // cuts fall on character boundaries.
            Cow::Owned(bytes) => Cow::Owned(match String::from_utf8(bytes) {
                Ok(s) => s,
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            }),
        }
    }

    /// `text` redacted, and also every start of a secret of at least
    /// [`PARTIAL_MIN`] characters in it: for text a library may have cut
    /// anywhere before ferrepl saw it (an HTTP client's error quoting the
    /// first bytes of a body), where a secret cut in two no longer matches.
    /// Never for a session's own text: it would tell which starts are a
    /// secret's.
    pub fn redact_cut<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let full = self.redact(text);
        let Some((matcher, groups)) = &self.starts else {
            return full;
        };
        let bytes = full.as_bytes();
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for m in matcher.find_overlapping_iter(bytes) {
            let rest = &bytes[m.start()..];
            let mut end = m.end();
            for &i in &groups[m.pattern().as_usize()] {
                let form = &self.forms[i].bytes;
                let same = form.iter().zip(rest).take_while(|(a, b)| a == b).count();
                end = end.max(m.start() + same);
            }
            ranges.push((m.start(), end));
        }
        if ranges.is_empty() {
            return full;
        }
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.0 <= last.1 => last.1 = last.1.max(r.1),
                _ => merged.push(r),
            }
        }
        let out = replace(bytes, &merged, bytes.len());
        Cow::Owned(match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// `text` redacted, as an owned string.
    pub fn redact_string(&self, text: String) -> String {
        match self.redact(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(s) => s,
        }
    }

    /// `bytes` with every secret replaced by [`MARKER`].
    pub fn redact_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        if self.broken && !bytes.is_empty() {
            return Cow::Owned(WITHHELD.as_bytes().to_vec());
        }
        let ranges = self.ranges(bytes);
        if ranges.is_empty() {
            return Cow::Borrowed(bytes);
        }
        Cow::Owned(replace(bytes, &ranges, bytes.len()))
    }

    /// Every string of `value` (object keys too) redacted in place.
    pub fn redact_json(&self, value: &mut Value) {
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(r) = self.redact(s) {
                    *s = r;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_json(v)),
            Value::Object(map) => {
                let changed = map.keys().any(|k| matches!(self.redact(k), Cow::Owned(_)));
                if changed {
                    let old = std::mem::take(map);
                    for (k, v) in old {
                        let k = self.redact_string(k);
                        // Two keys redacted alike: the later wins, as in
                        // any object with a repeated key.
                        map.insert(k, v);
                    }
                }
                map.values_mut().for_each(|v| self.redact_json(v));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// The byte ranges to replace in `bytes`, each with the characters
    /// that go with its match, sorted, overlapping ones merged.
    fn ranges(&self, bytes: &[u8]) -> Vec<(usize, usize)> {
        self.ranges_with_ends(bytes)
            .into_iter()
            .map(|r| (r.start, r.end))
            .collect()
    }

    /// As [`Self::ranges`], also telling how far each range's matches
    /// needed the text (the character after a base64 match is looked at).
    fn ranges_with_ends(&self, bytes: &[u8]) -> Vec<Range> {
        let Some(matcher) = &self.matcher else {
            return Vec::new();
        };
        let mut found: Vec<Range> = matcher
            .find_overlapping_iter(bytes)
            .map(|m| {
                let form = &self.forms[m.pattern().as_usize()];
                let mut start = m.start();
                if form.left > 0 && start > 0 && is_base64_char(bytes[start - 1]) {
                    start -= 1;
                }
                let mut end = m.end();
                let needs = end + form.right;
                if form.right > 0 && end < bytes.len() && is_base64_char(bytes[end]) {
                    end += 1;
                }
                Range { start, end, needs }
            })
            .collect();
        found.sort_by_key(|r| (r.start, r.end));
        let mut merged: Vec<Range> = Vec::with_capacity(found.len());
        for r in found {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => {
                    last.end = last.end.max(r.end);
                    last.needs = last.needs.max(r.needs);
                }
                _ => merged.push(r),
            }
        }
        merged
    }

    /// The length of the longest end of `bytes` that is the start of some
    /// form (it may become a match when more text comes), plus the one
    /// base64 character that would go with it.
    fn pending(&self, bytes: &[u8]) -> usize {
        let mut longest = 0;
        for form in &self.forms {
            let most = (form.bytes.len() - 1).min(bytes.len());
            for k in (1..=most).rev() {
                if k + form.left <= longest {
                    break;
                }
                if bytes.ends_with(&form.bytes[..k]) {
                    longest = k + form.left;
                    break;
                }
            }
        }
        longest.min(bytes.len())
    }
}

/// A range to replace; `needs`: the text up to there decides it.
struct Range {
    start: usize,
    end: usize,
    needs: usize,
}

/// `bytes[..upto]` with `ranges` (sorted, within it) replaced by the marker.
fn replace(bytes: &[u8], ranges: &[(usize, usize)], upto: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(upto);
    let mut at = 0;
    for &(start, end) in ranges {
        out.extend_from_slice(&bytes[at..start]);
        out.extend_from_slice(MARKER.as_bytes());
        at = end;
    }
    out.extend_from_slice(&bytes[at..upto]);
    out
}

/// The automaton of the forms' first [`PARTIAL_MIN`] bytes (for the forms
/// longer than that), and which forms start with each.
fn starts_of(forms: &[Form]) -> Option<(AhoCorasick, Vec<Vec<usize>>)> {
    let mut index: std::collections::BTreeMap<&[u8], Vec<usize>> = Default::default();
    for (i, form) in forms.iter().enumerate().filter(|(_, f)| f.starts) {
        // Cut on a character boundary: a start is looked for as text.
        let mut n = PARTIAL_MIN;
        while n < form.bytes.len() && (form.bytes[n] & 0xC0) == 0x80 {
            n += 1;
        }
        if form.bytes.len() > n {
            index.entry(&form.bytes[..n]).or_default().push(i);
        }
    }
    if index.is_empty() {
        return None;
    }
    let (starts, groups): (Vec<&[u8]>, Vec<Vec<usize>>) = index.into_iter().unzip();
    AhoCorasick::builder()
        .match_kind(MatchKind::Standard)
        .build(starts)
        .ok()
        .map(|m| (m, groups))
}

/// Whether `value` is long enough to be treated as a secret.
pub fn is_secret(value: &str) -> bool {
    value.chars().count() >= MIN_SECRET_CHARS
}

fn is_base64_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_')
}

/// The secrets of a URL: its user name and password, as written and
/// decoded (a user name alone may be a token: `https://TOKEN@host`).
pub fn url_credentials(url: &str) -> Vec<String> {
    let Ok(u) = url::Url::parse(url) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for part in [u.username(), u.password().unwrap_or("")] {
        if part.is_empty() {
            continue;
        }
        out.push(part.to_string());
        if let Ok(decoded) = percent_decode(part) {
            out.push(decoded);
        }
    }
    if let (user, Some(password)) = (u.username(), u.password())
        && let (Ok(user), Ok(password)) = (percent_decode(user), percent_decode(password))
    {
        out.push(format!("{user}:{password}"));
    }
    out
}

fn percent_decode(s: &str) -> Result<String, std::string::FromUtf8Error> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
}

/// The secrets of an HTTP header's value: the whole value, each of its
/// words (`Bearer TOKEN`'s token) and, for a word that is base64 of
/// `user:password` (`Basic ...`), that text and its parts.
pub fn header_secrets(value: &str) -> Vec<String> {
    let mut out = vec![value.to_string(), value.trim().to_string()];
    for word in value.split_whitespace() {
        out.push(word.to_string());
        if let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(word)
            && let Ok(text) = String::from_utf8(decoded)
            && let Some((user, password)) = text.split_once(':')
        {
            out.extend([user.to_string(), password.to_string()]);
            out.push(text);
        }
    }
    out
}

/// The redactor in force, shared by everything that redacts; secrets are
/// added when their settings are read (at start, on SIGHUP) and never
/// dropped while ferrepl runs (a replaced token may still be valid
/// somewhere).
#[derive(Clone, Default)]
pub struct Secrets(Arc<RwLock<Arc<Redactor>>>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.current().fmt(f)
    }
}

impl Secrets {
    /// No secrets yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A handle holding `secrets`.
    pub fn of<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let s = Self::default();
        s.add(secrets);
        s
    }

    /// The redactor as it is now.
    pub fn current(&self) -> Arc<Redactor> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Adds `secrets` (the ones already held stay).
    pub fn add<I, S>(&self, secrets: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let more = Redactor::new(secrets);
        let mut slot = self.0.write().unwrap_or_else(|e| e.into_inner());
        if more.secrets.iter().all(|s| slot.secrets.contains(s)) {
            return;
        }
        *slot = Arc::new(slot.with(&more));
    }

    /// `text` redacted with the current secrets.
    pub fn redact(&self, text: String) -> String {
        self.current().redact_string(text)
    }
}

/// Redacts text that arrives in pieces: what may be the start of a secret
/// is held back until the next piece (or the end) decides it.
pub struct StreamRedactor {
    secrets: Secrets,
    held: Vec<u8>,
}

impl StreamRedactor {
    pub fn new(secrets: Secrets) -> Self {
        StreamRedactor {
            secrets,
            held: Vec::new(),
        }
    }

    /// The text of `chunk` (with what was held) that is decided, redacted.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(chunk);
        let redactor = self.secrets.current();
        if redactor.is_empty() {
            return std::mem::take(&mut self.held);
        }
        if redactor.broken {
            let held = std::mem::take(&mut self.held);
            return redactor.redact_bytes(&held).into_owned();
        }
        let len = self.held.len();
        let mut cut = len - redactor.pending(&self.held);
        let ranges = redactor.ranges_with_ends(&self.held);
        // A range that reaches the held part, or whose end is not decided
        // yet (the character after it has not come), waits whole.
        for r in ranges.iter().rev() {
            if r.end > cut || r.needs > len {
                cut = cut.min(r.start);
            } else {
                break;
            }
        }
        let done: Vec<(usize, usize)> = ranges
            .iter()
            .filter(|r| r.end <= cut)
            .map(|r| (r.start, r.end))
            .collect();
        let out = replace(&self.held, &done, cut);
        self.held.drain(..cut);
        out
    }

    /// The rest, redacted (the text ended).
    pub fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        self.secrets.current().redact_bytes(&held).into_owned()
    }
}

#[cfg(test)]
mod tests;
