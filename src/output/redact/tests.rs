use super::*;

const SECRET: &str = "s3cr/t+k=y\"\\ é";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn redacted(r: &Redactor, text: &str) -> String {
    r.redact(text).into_owned()
}

#[test]
fn short_values_are_not_secrets() {
    let r = Redactor::new(["1234567", "", "abcdefgh"]);
    assert_eq!(r.len(), 1);
    assert_eq!(redacted(&r, "1234567 abcdefgh"), "1234567 [redacted]");
    // Characters, not bytes: seven accented letters are 14 bytes.
    assert!(Redactor::new(["ééééééé"]).is_empty());
}

#[test]
fn every_plain_encoding_is_found() {
    let r = Redactor::new([SECRET]);
    let json = serde_json::to_string(SECRET).expect("json");
    let json = &json[1..json.len() - 1];
    let ascii_json = "s3cr\\/t+k=y\\\"\\\\ \\u00e9";
    let percent = "s3cr%2Ft%2Bk%3Dy%22%5C%20%C3%A9";
    let form: String = url::form_urlencoded::byte_serialize(SECRET.as_bytes()).collect();
    for text in [
        SECRET.to_string(),
        json.to_string(),
        ascii_json.to_string(),
        percent.to_string(),
        percent.to_ascii_lowercase(),
        form,
    ] {
        let line = format!("before {text} after");
        assert_eq!(
            redacted(&r, &line),
            "before [redacted] after",
            "{text:?} was not redacted"
        );
    }
}

#[test]
fn base64_at_every_alignment_and_in_basic_auth() {
    let r = Redactor::new(["password-0123"]);
    for prefix in ["", "a", "ab", "abc", "user:", "u:"] {
        for suffix in ["", "x", "xy", "xyz"] {
            let encoded = b64(format!("{prefix}password-0123{suffix}").as_bytes());
            let text = format!("Authorization: Basic {encoded} end");
            let out = redacted(&r, &text);
            assert!(out.contains(MARKER), "{prefix:?}+{suffix:?}: {out}");
            assert!(
                !out.contains(&b64(b"password-0123")[..8]),
                "{prefix:?}+{suffix:?}: {out}"
            );
            // At most the characters made of the neighbours' bits are left.
            let kept = out
                .trim_start_matches("Authorization: Basic ")
                .trim_end_matches(" end")
                .replace(MARKER, "")
                .trim_end_matches('=')
                .len();
            let neighbours = (prefix.len() * 8).div_ceil(6) + (suffix.len() * 8).div_ceil(6);
            assert!(
                kept <= neighbours,
                "{prefix:?}+{suffix:?}: {kept} characters kept of {out}"
            );
        }
    }
    // URL-safe base64 too.
    let url_safe = base64::engine::general_purpose::URL_SAFE.encode(b"?password-0123>");
    assert!(redacted(&r, &url_safe).contains(MARKER), "{url_safe}");
}

#[test]
fn overlapping_secrets_are_replaced_as_one() {
    let r = Redactor::new(["abcdefghij", "ghijklmnop", "mnopqrstuv"]);
    assert_eq!(redacted(&r, "<abcdefghijklmnopqrstuv>"), "<[redacted]>");
    // One inside another.
    let r = Redactor::new(["0123456789", "2345678"]);
    assert_eq!(redacted(&r, "x0123456789y"), "x[redacted]y");
    // Touching ones.
    let r = Redactor::new(["aaaaaaaa", "bbbbbbbb"]);
    assert_eq!(redacted(&r, "aaaaaaaabbbbbbbb"), "[redacted]");
    assert_eq!(redacted(&r, "aaaaaaaa bbbbbbbb"), "[redacted] [redacted]");
}

#[test]
fn json_values_keys_included() {
    let r = Redactor::new(["topsecret-1"]);
    let mut v = serde_json::json!({
        "a": ["x topsecret-1 y", 1, null],
        "topsecret-1": {"k": "dG9wc2VjcmV0LTE="},
    });
    r.redact_json(&mut v);
    assert_eq!(
        v,
        serde_json::json!({"a": ["x [redacted] y", 1, null], "[redacted]": {"k": "[redacted]="}})
    );
}

#[test]
fn credentials_of_urls_and_headers() {
    let creds = url_credentials("https://deploy-user:p%40ss%2Fword@idx.example/simple");
    for want in [
        "deploy-user",
        "p%40ss%2Fword",
        "p@ss/word",
        "deploy-user:p@ss/word",
    ] {
        assert!(creds.iter().any(|c| c == want), "{want} in {creds:?}");
    }
    assert!(url_credentials("https://idx.example/simple").is_empty());
    let basic = b64(b"alice:wonderland-9");
    let h = header_secrets(&format!("Basic {basic}"));
    assert!(h.contains(&basic) && h.contains(&"wonderland-9".to_string()));
    let h = header_secrets("Bearer tok-123456789");
    assert!(h.contains(&"tok-123456789".to_string()));
    let r = Redactor::new(h);
    assert_eq!(redacted(&r, "got Bearer tok-123456789"), "got [redacted]");
    assert_eq!(
        redacted(&r, "bad token tok-123456789."),
        "bad token [redacted]."
    );
}

/// Every way of cutting `text` into two or three pieces gives what one
/// call gives.
#[test]
fn streams_find_secrets_across_chunk_boundaries() {
    let secrets = Secrets::of(["abcdefghij", "ghijklmnop", "password-0123"]);
    let whole = Redactor::new(["abcdefghij", "ghijklmnop", "password-0123"]);
    let basic = b64(b"user:password-0123");
    let text = format!("1 abcdefghijklmnop 2 abcdefghi 3 Basic {basic} 4 password-012 5");
    let want = whole.redact(&text).into_owned();
    assert!(
        !want.contains("ghijklmnop") && want.contains("abcdefghi 3"),
        "{want}"
    );
    let bytes = text.as_bytes();
    for i in 0..=bytes.len() {
        for j in i..=bytes.len() {
            let mut s = StreamRedactor::new(secrets.clone());
            let mut out = s.push(&bytes[..i]);
            out.extend(s.push(&bytes[i..j]));
            out.extend(s.push(&bytes[j..]));
            out.extend(s.finish());
            assert_eq!(String::from_utf8_lossy(&out), want, "cut at {i}, {j}");
        }
    }
    // Byte by byte, and only what may start a secret is held back.
    let mut s = StreamRedactor::new(secrets.clone());
    let mut out = Vec::new();
    for b in bytes {
        out.extend(s.push(std::slice::from_ref(b)));
    }
    out.extend(s.finish());
    assert_eq!(String::from_utf8_lossy(&out), want);
    let mut s = StreamRedactor::new(secrets);
    assert_eq!(s.push(b"plain line\n"), b"plain line\n");
    assert_eq!(s.push(b"key abcde"), b"key ");
    assert_eq!(s.push(b"fghij!"), b"[redacted]!");
}

#[test]
fn starts_cut_by_a_library_go_too() {
    let r = Redactor::new(["0123456789abcdef"]);
    // Cut after 6 or more characters: gone, with what followed the cut.
    assert_eq!(
        r.redact_cut("preview: 0123456789, when sending")
            .into_owned(),
        "preview: [redacted], when sending"
    );
    assert_eq!(r.redact_cut("…012345").into_owned(), "…[redacted]");
    // Shorter starts say little and stay, as does the plain redact.
    assert_eq!(r.redact_cut("01234 x").into_owned(), "01234 x");
    assert_eq!(r.redact("0123456789").into_owned(), "0123456789");
    // Whole ones as always.
    assert_eq!(
        r.redact_cut("a 0123456789abcdef b").into_owned(),
        "a [redacted] b"
    );
    // The start of a base64 form too.
    let b = b64(b"0123456789abcdef");
    assert_eq!(
        r.redact_cut(&format!("Basic {}", &b[..9])).into_owned(),
        "Basic [redacted]"
    );
    // A value of several words: its token's start goes, not its
    // scheme's common word.
    let r = Redactor::new(header_secrets("Bearer 0123456789abcdef"));
    assert_eq!(
        r.redact_cut("WWW-Authenticate: Bearer realm, got Bearer 0123456789")
            .into_owned(),
        "WWW-Authenticate: Bearer realm, got Bearer [redacted]"
    );
}

#[test]
fn secrets_are_added_and_kept() {
    let secrets = Secrets::new();
    assert_eq!(
        secrets.redact("old-token-1 new-token-2".into()),
        "old-token-1 new-token-2"
    );
    secrets.add(["old-token-1"]);
    secrets.add(["new-token-2"]);
    assert_eq!(
        secrets.redact("old-token-1 new-token-2".into()),
        "[redacted] [redacted]"
    );
    assert!(!format!("{secrets:?}").contains("token"));
}
