//! What an image's bytes are, from their signature (never from the MIME
//! type the agent's code declared): only PNG and JPEG are shown or
//! exported, so no SVG or HTML an agent wrote is ever served or written
//! as an image.

use base64::Engine;

/// "image/png" or "image/jpeg" when `bytes` start as one.
pub fn image_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else {
        None
    }
}

/// [`image_type`] of base64 text, from its first bytes only.
pub fn base64_image_type(data: &str) -> Option<&'static str> {
    // 12 characters are 9 bytes: more than either signature.
    let head = data.get(..12)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(head)
        .ok()?;
    image_type(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_png_and_jpeg_signatures_are_images() {
        assert_eq!(image_type(b"\x89PNG\r\n\x1a\nrest"), Some("image/png"));
        assert_eq!(image_type(&[0xFF, 0xD8, 0xFF, 0xE0]), Some("image/jpeg"));
        assert_eq!(image_type(b"<svg onload=alert(1)>"), None);
        assert_eq!(image_type(b"GIF89a"), None);
        assert_eq!(image_type(b""), None);
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        assert_eq!(
            base64_image_type(&b64(b"\x89PNG\r\n\x1a\n0123456789")),
            Some("image/png")
        );
        assert_eq!(base64_image_type(&b64(b"<script>alert(1)</script>")), None);
        assert_eq!(base64_image_type("not base64 at all!"), None);
        assert_eq!(base64_image_type("iVBO"), None, "too short to tell");
    }
}
