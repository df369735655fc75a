//! A tool's result as the session's code gets it: structured content, or
//! its content blocks (text, images, others as they came), cut to a size.

use base64::Engine;
use serde_json::{Value, json};

/// The driver's form of `result` (see docs/protocol.md), at most about
/// `max_bytes` of payload; Err(message) for an error result. The secrets
/// of `redactor` are replaced first, before anything is cut (a cut could
/// leave the start of one, which would no longer match).
pub fn for_driver(
    result: &rmcp::model::CallToolResult,
    max_bytes: usize,
    redactor: &crate::output::redact::Redactor,
) -> Result<Value, String> {
    let mut raw = serde_json::to_value(result).unwrap_or(Value::Null);
    redactor.redact_json(&mut raw);
    let blocks = raw
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if result.is_error == Some(true) {
        let text = text_of(&blocks);
        let text = if text.is_empty() {
            "the tool reported an error without a message".to_string()
        } else {
            text
        };
        return Err(cut_text(&text, max_bytes.min(64 * 1024)));
    }
    if let Some(structured) = raw.get("structuredContent").filter(|v| !v.is_null()) {
        let size = serde_json::to_string(structured).map_or(0, |s| s.len());
        if size <= max_bytes {
            return Ok(json!({"structured": structured}));
        }
        // Too large to pass whole: its JSON text, cut.
        let text = serde_json::to_string(structured).unwrap_or_default();
        return Ok(json!({"content": [{"type": "text", "text": cut_text(&text, max_bytes)}]}));
    }
    let mut out = Vec::with_capacity(blocks.len());
    let mut left = max_bytes;
    let mut dropped = 0usize;
    for block in blocks {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => {
                let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                if left == 0 {
                    dropped += 1;
                    continue;
                }
                let piece = if text.len() > left {
                    cut_text(text, left)
                } else {
                    text.to_string()
                };
                left = left.saturating_sub(text.len());
                out.push(json!({"type": "text", "text": piece}));
            }
            "image" => {
                let data = block.get("data").and_then(Value::as_str).unwrap_or("");
                let mime = block
                    .get("mimeType")
                    .and_then(Value::as_str)
                    .unwrap_or("application/octet-stream");
                // Only well-formed base64 reaches the session.
                let valid = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .is_ok();
                if !valid || data.len() > left {
                    dropped += 1;
                    continue;
                }
                left -= data.len();
                out.push(json!({"type": "image", "mime": mime, "data": data}));
            }
            _ => {
                let size = serde_json::to_string(&block).map_or(0, |s| s.len());
                if size > left {
                    dropped += 1;
                    continue;
                }
                left -= size;
                out.push(json!({"type": "other", "value": block}));
            }
        }
    }
    if dropped > 0 {
        out.push(json!({"type": "text", "text": format!(
            "[ferrepl: {dropped} more content blocks left out: the result is over {max_bytes} bytes (--mcp-max-result-bytes)]"
        )}));
    }
    Ok(json!({"content": out}))
}

/// The text blocks of a result, joined by newlines.
fn text_of(blocks: &[Value]) -> String {
    blocks
        .iter()
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` cut to at most `max` bytes (on a character boundary), with a marker.
pub fn cut_text(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[ferrepl: result cut at {max} of {} bytes (--mcp-max-result-bytes)]",
        &text[..end],
        text.len()
    )
}

#[cfg(test)]
mod tests {
    use super::{Value, json};
    use crate::output::redact::Redactor;
    use rmcp::model::{CallToolResult, ContentBlock as Content};

    fn for_driver(r: &CallToolResult, max: usize) -> Result<Value, String> {
        super::for_driver(r, max, &Redactor::default())
    }

    /// A secret that straddles the cut is redacted whole, in text, error
    /// and structured results alike.
    #[test]
    fn redacted_before_the_cut() {
        let secret = "0123456789abcdef";
        let r = Redactor::new([secret]);
        let text = format!("{}{secret}", "x".repeat(10));
        let ok = CallToolResult::success(vec![Content::text(text.clone())]);
        let v = super::for_driver(&ok, 14, &r).expect("ok");
        let shown = v["content"][0]["text"].as_str().expect("text");
        assert!(
            shown.starts_with("xxxxxxxxxx[red\n[ferrepl: result cut"),
            "{shown}"
        );
        let err = CallToolResult::error(vec![Content::text(text)]);
        assert_eq!(
            super::for_driver(&err, 1000, &r),
            Err("xxxxxxxxxx[redacted]".to_string())
        );
        let structured = CallToolResult::structured(json!({"key": secret}));
        let v = super::for_driver(&structured, 1000, &r).expect("ok");
        assert_eq!(v, json!({"structured": {"key": "[redacted]"}}));
    }

    #[test]
    fn shapes() {
        let r = CallToolResult::success(vec![Content::text("a"), Content::text("b")]);
        assert_eq!(
            for_driver(&r, 100).expect("ok"),
            json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
        );
        let r = CallToolResult::error(vec![Content::text("bad")]);
        assert_eq!(for_driver(&r, 100), Err("bad".to_string()));
        let r = CallToolResult::success(vec![Content::text("x".repeat(50))]);
        let v = for_driver(&r, 10).expect("ok");
        let text = v["content"][0]["text"].as_str().expect("text");
        assert!(
            text.starts_with("xxxxxxxxxx\n[ferrepl: result cut at 10 of 50 bytes"),
            "{text}"
        );
        let r = CallToolResult::success(vec![Content::image("!!notbase64", "image/png")]);
        let v = for_driver(&r, 100).expect("ok");
        assert!(
            v["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("left out"))
        );
    }
}
