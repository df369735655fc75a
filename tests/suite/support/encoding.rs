//! Base64 as the MCP content blocks carry it (standard alphabet, padded),
//! through the `base64` crate the server uses too.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// Standard base64 with padding.
pub fn b64_encode(data: &[u8]) -> String {
    STANDARD.encode(data)
}

/// Decodes standard, padded base64.
pub fn b64_decode(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    STANDARD.decode(text)
}

#[test]
fn base64_helpers_round_trip() {
    assert_eq!(b64_encode(b"hello"), "aGVsbG8=");
    assert_eq!(b64_encode(b"hi!"), "aGkh");
    assert_eq!(b64_encode(b"h"), "aA==");
    for len in 0..20 {
        let data: Vec<u8> = (0..len).map(|i| (i * 37 + 250) as u8).collect();
        assert_eq!(b64_decode(&b64_encode(&data)).as_deref(), Ok(&data[..]));
    }
}

#[test]
fn base64_decoder_matches_known_vectors() {
    for (encoded, decoded) in [
        ("", ""),
        ("Zg==", "f"),
        ("Zm8=", "fo"),
        ("Zm9v", "foo"),
        ("Zm9vYg==", "foob"),
        ("Zm9vYmE=", "fooba"),
        ("Zm9vYmFy", "foobar"),
    ] {
        assert_eq!(
            b64_decode(encoded).as_deref(),
            Ok(decoded.as_bytes()),
            "{encoded}"
        );
    }
    assert_eq!(b64_decode("+/8=").as_deref(), Ok(&[0xfb, 0xff][..]));
    assert!(b64_decode("Zm9").is_err());
    assert!(b64_decode("Zg==Zm9v").is_err());
    assert!(b64_decode("Zm9*").is_err());
}
