//! Helpers shared by `rich_output.rs` and `large_output.rs`: the rich test
//! interpreter, image blocks of a result, and a few small utilities.
//!
//! Declared after `mod common;` in each test crate, so it can use it.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::common::ToolOutput;

/// The interpreter with matplotlib, pandas, pillow and IPython made by
/// `scripts/test-env.sh`. A missing interpreter fails the test: the rich
/// tests are part of the suite and must not be skipped silently.
pub fn rich_python() -> PathBuf {
    let env_dir = match std::env::var_os("FERREPL_TEST_ENV") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-env"),
    };
    let python = env_dir.join("rich/bin/python");
    assert!(
        python.is_file(),
        "the rich-display test interpreter {} is missing: run `bash scripts/test-env.sh` \
         (it installs matplotlib, pandas, pillow and IPython into target/test-env/rich)",
        python.display()
    );
    python
}

/// `rich_python()` as a string, for `--python`.
pub fn rich_python_arg() -> String {
    rich_python()
        .to_str()
        .expect("the rich interpreter path is UTF-8")
        .to_string()
}

pub const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// One image content block of a result, decoded.
#[derive(Debug, Clone)]
pub struct ImageBlock {
    pub mime: String,
    pub data: Vec<u8>,
}

/// The image blocks of a result, in order, with their base64 decoded.
pub fn image_blocks(out: &ToolOutput) -> Vec<ImageBlock> {
    out.raw
        .content
        .iter()
        .filter_map(|block| block.as_image())
        .map(|image| ImageBlock {
            mime: image.mime_type.clone(),
            data: base64_decode(&image.data).unwrap_or_else(|e| {
                panic!("an image block's data is not valid base64 ({e}) in {out:#?}")
            }),
        })
        .collect()
}

/// Kinds of the content blocks of a result ("text", "image", ...).
pub fn content_kinds(out: &ToolOutput) -> Vec<&'static str> {
    out.raw
        .content
        .iter()
        .map(|block| {
            if block.as_text().is_some() {
                "text"
            } else if block.as_image().is_some() {
                "image"
            } else if block.as_audio().is_some() {
                "audio"
            } else {
                "other"
            }
        })
        .collect()
}

/// `structured_content.display` of a cell result.
pub fn display_items(out: &ToolOutput) -> Vec<Value> {
    // A result that displayed nothing leaves `display` out.
    out.display()
}

/// Width and height from a PNG's IHDR chunk.
pub fn png_size(data: &[u8]) -> (u32, u32) {
    assert!(
        data.starts_with(PNG_SIGNATURE),
        "not a PNG: starts with {:?}",
        &data[..data.len().min(8)]
    );
    assert!(data.len() >= 24, "PNG too short for an IHDR chunk");
    assert_eq!(&data[12..16], b"IHDR", "first PNG chunk is not IHDR");
    let width = u32::from_be_bytes(data[16..20].try_into().expect("4 bytes"));
    let height = u32::from_be_bytes(data[20..24].try_into().expect("4 bytes"));
    (width, height)
}

/// Checks that a result carries exactly one PNG image and that the display
/// list describes it; returns the PNG's size.
pub fn assert_one_png(out: &ToolOutput) -> (u32, u32) {
    let images = image_blocks(out);
    assert_eq!(
        images.len(),
        1,
        "expected exactly one image block, content kinds {:?}, text:\n{}",
        content_kinds(out),
        out.text
    );
    assert_eq!(images[0].mime, "image/png", "mime type of the image block");
    let (width, height) = png_size(&images[0].data);
    assert!(width > 0 && height > 0, "empty PNG {width}x{height}");
    let display = display_items(out);
    let shown: Vec<&Value> = display.iter().filter(|d| d["shown"] == true).collect();
    assert_eq!(shown.len(), 1, "display items shown: {display:#?}");
    let item = shown[0];
    assert_eq!(item["mime"], "image/png", "display item {item}");
    assert_eq!(
        item["bytes"].as_u64(),
        Some(images[0].data.len() as u64),
        "display item bytes vs. the image block's size: {item}"
    );
    assert_eq!(item["width"].as_u64(), Some(u64::from(width)), "{item}");
    assert_eq!(item["height"].as_u64(), Some(u64::from(height)), "{item}");
    assert!(
        out.text.contains("[image 1: image/png"),
        "no image placeholder line in the text:\n{}",
        out.text
    );
    (width, height)
}

/// Standard base64 (RFC 4648, with padding; whitespace ignored).
pub fn base64_decode(input: &str) -> Result<Vec<u8>, String> {
    fn value(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let clean: Vec<u8> = input.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    if !clean.len().is_multiple_of(4) {
        return Err(format!("length {} is not a multiple of 4", clean.len()));
    }
    let mut out = Vec::with_capacity(clean.len() / 4 * 3);
    let quads = clean.len() / 4;
    for (q, quad) in clean.chunks(4).enumerate() {
        let last = q + 1 == quads;
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return Err(format!("misplaced padding in quad {q}"));
        }
        let mut acc = 0u32;
        for &c in &quad[..4 - pad] {
            let v = value(c).ok_or_else(|| format!("invalid base64 byte {c:#04x}"))?;
            acc = (acc << 6) | v;
        }
        acc <<= 6 * pad as u32;
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..4 - pad]);
    }
    Ok(out)
}

/// Resident set size of a process, in KiB, from /proc/<pid>/status.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS line in /proc/{pid}/status:\n{status}"))
}

/// `python_exec` arguments with an explicit `wait_s`.
pub fn exec_wait_args(code: &str, wait_s: f64) -> Value {
    json!({ "code": code, "wait_s": wait_s })
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
            base64_decode(encoded).as_deref(),
            Ok(decoded.as_bytes()),
            "{encoded}"
        );
    }
    assert_eq!(base64_decode("+/8=").as_deref(), Ok(&[0xfb, 0xff][..]));
    assert!(base64_decode("Zm9").is_err());
    assert!(base64_decode("Zg==Zm9v").is_err());
    assert!(base64_decode("Zm9*").is_err());
}
