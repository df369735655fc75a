//! Rich display: the test interpreter with matplotlib, pandas, pillow and
//! IPython, and the image blocks of a result.

use std::path::PathBuf;

use serde_json::Value;

use super::encoding::b64_decode;
use super::result::ToolOutput;

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
            data: b64_decode(&image.data).unwrap_or_else(|e| {
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
    let display = out.display();
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
