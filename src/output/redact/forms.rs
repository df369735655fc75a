//! The forms a secret is looked for in: as it is, JSON-escaped,
//! percent-encoded, and in base64 at each alignment (with the mixed
//! characters at its edges). Apart from `redact.rs`, which finds and
//! replaces them, because working out the encodings is a concern of its own.

use base64::Engine;

/// One form of a secret.
pub(super) struct Form {
    pub(super) bytes: Vec<u8>,
    /// Base64 characters just before and after a match that mix the
    /// secret's bits with its neighbours' (0 or 1 each).
    pub(super) left: usize,
    pub(super) right: usize,
    /// Its start is looked for too ([`Redactor::redact_cut`]): not for a
    /// value of several words (`Bearer TOKEN`), whose first word may be
    /// common and whose long words are secrets of their own.
    pub(super) starts: bool,
}

/// Every form `secret` is looked for in.
pub(super) fn forms_of(secret: &str) -> Vec<Form> {
    let starts = !secret.contains(char::is_whitespace);
    let plain = |s: String| Form {
        bytes: s.into_bytes(),
        left: 0,
        right: 0,
        starts,
    };
    let mut texts: Vec<String> = vec![secret.to_string()];
    texts.extend(json_escaped(secret));
    texts.extend(percent_encoded(secret));
    let mut forms: Vec<Form> = texts.into_iter().map(plain).collect();
    for engine in [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::URL_SAFE,
    ] {
        forms.extend(
            base64_forms(secret.as_bytes(), engine)
                .into_iter()
                .map(|f| Form { starts, ..f }),
        );
    }
    forms
}

/// The JSON string forms of `s` (without the quotes): minimal escapes as
/// serde_json and Python write them, ASCII-only (`\uXXXX`), and each with
/// `/` written `\/`.
fn json_escaped(s: &str) -> Vec<String> {
    let minimal = serde_json::to_string(s)
        .map(|q| q[1..q.len() - 1].to_string())
        .unwrap_or_default();
    let mut ascii = String::with_capacity(minimal.len());
    for c in minimal.chars() {
        if c.is_ascii() {
            ascii.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                ascii.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    let mut out = vec![minimal, ascii];
    let slashed: Vec<String> = out
        .iter()
        .filter(|t| t.contains('/'))
        .map(|t| t.replace('/', "\\/"))
        .collect();
    out.extend(slashed);
    out
}

/// `s` percent-encoded as URLs and forms carry it: every byte but the
/// unreserved ones (both hex cases), and the sets of a URL's user info,
/// path segment and form fields.
fn percent_encoded(s: &str) -> Vec<String> {
    let mut upper = String::new();
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            upper.push(b as char);
        } else {
            upper.push_str(&format!("%{b:02X}"));
        }
    }
    let lower = lower_hex_escapes(&upper);
    let mut out = vec![upper, lower];
    out.push(url::form_urlencoded::byte_serialize(s.as_bytes()).collect());
    if let Ok(mut u) = url::Url::parse("http://h/") {
        if u.set_password(Some(s)).is_ok()
            && let Some(p) = u.password()
        {
            out.push(p.to_string());
        }
        if u.set_username(s).is_ok() {
            out.push(u.username().to_string());
        }
        if let Ok(mut segments) = u.path_segments_mut() {
            segments.clear().push(s);
        }
        out.push(u.path().trim_start_matches('/').to_string());
    }
    let with_lower: Vec<String> = out.iter().map(|t| lower_hex_escapes(t)).collect();
    out.extend(with_lower);
    out
}

/// `%2F` → `%2f` (the rest as it is).
fn lower_hex_escapes(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(b'%');
            out.push(b[i + 1].to_ascii_lowercase());
            out.push(b[i + 2].to_ascii_lowercase());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// The stable inner part of `secret`'s base64 at each alignment (0, 1 or
/// 2 bytes of something else before it in its group of three): the
/// characters whose six bits are all the secret's.
fn base64_forms(secret: &[u8], engine: &base64::engine::GeneralPurpose) -> Vec<Form> {
    let mut out = Vec::new();
    for align in 0..3usize {
        let mut buf = vec![0u8; align];
        buf.extend_from_slice(secret);
        buf.extend_from_slice(&[0, 0]);
        let encoded = engine.encode(&buf);
        let bits_before = 8 * align;
        let bits_to_end = 8 * (align + secret.len());
        let start = bits_before.div_ceil(6);
        let end = bits_to_end / 6;
        if end <= start || end > encoded.len() {
            continue;
        }
        out.push(Form {
            bytes: encoded.as_bytes()[start..end].to_vec(),
            left: usize::from(!bits_before.is_multiple_of(6)),
            right: usize::from(!bits_to_end.is_multiple_of(6)),
            starts: true,
        });
    }
    out
}
