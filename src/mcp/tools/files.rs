//! Workspace file tools (mainly for HTTP clients without a file system of
//! their own): file_list, file_read, file_write, file_delete.

use std::path::Path;

use base64::Engine;
use rmcp::handler::server::common::schema_for_output;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use rmcp::{tool, tool_router};

use crate::files::{FileData, Listing, Workspace, mime_for};
use crate::mcp::args::Parameters;
use crate::mcp::call::Call;
use crate::mcp::error::{ToolError, ToolResult};
use crate::mcp::render;
use crate::mcp::server::FerreplServer;
use crate::mcp::surface::{ChangeOutput, Entry, ListOutput, ReadOutput};
use crate::mcp::surface::{DeleteParams, ListParams, ReadParams, WriteParams};

const MAX_ENTRIES: usize = 2000;
const MAX_READ_BYTES: u64 = 16 * 1024 * 1024;
const DEFAULT_LINES: usize = 2000;

/// Runs a file operation on the blocking pool, so a slow file system never
/// stalls the async threads (and with them other tools).
async fn blocking(what: &str, op: impl FnOnce() -> ToolResult + Send + 'static) -> ToolResult {
    match tokio::task::spawn_blocking(op).await {
        Ok(result) => result,
        Err(e) => Err(ToolError::new(format!("{what} failed: {e}"))),
    }
}

#[tool_router(router = file_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(output_schema = schema_for_output::<ListOutput>())]
    async fn file_list(&self, Parameters(p): Parameters<ListParams>) -> ToolResult {
        let rel = p.path.unwrap_or_else(|| ".".into());
        let depth = p.depth.unwrap_or(2).clamp(1, 8);
        let files = self.files.clone();
        blocking("file_list", move || list_result(&files, &rel, depth)).await
    }

    #[tool(output_schema = schema_for_output::<ReadOutput>())]
    async fn file_read(&self, Parameters(p): Parameters<ReadParams>) -> ToolResult {
        let files = self.files.clone();
        blocking("file_read", move || read_result(&files, &p)).await
    }

    #[tool(output_schema = schema_for_output::<ChangeOutput>())]
    async fn file_write(&self, Parameters(p): Parameters<WriteParams>, call: Call) -> ToolResult {
        let data = match (&p.text, &p.base64) {
            (Some(t), None) => t.clone().into_bytes(),
            (None, Some(b)) => match base64::engine::general_purpose::STANDARD.decode(b.trim()) {
                Ok(d) => d,
                Err(e) => return Err(ToolError::new(format!("base64 is not valid: {e}"))),
            },
            _ => return Err(ToolError::new("give exactly one of 'text' or 'base64'")),
        };
        let append = p.append.unwrap_or(false);
        let files = self.client_files(&call)?;
        blocking("file_write", move || {
            let shown = files.write(&p.path, &data, append)?;
            let message = format!(
                "{} {} bytes to {shown}",
                if append { "appended" } else { "wrote" },
                data.len()
            );
            let out = ChangeOutput {
                path: shown,
                bytes: data.len() as u64,
                message: message.clone(),
            };
            Ok(render::structured(message, &out))
        })
        .await
    }

    #[tool(output_schema = schema_for_output::<ChangeOutput>())]
    async fn file_delete(&self, Parameters(p): Parameters<DeleteParams>, call: Call) -> ToolResult {
        // A symlink is removed itself, never what it points to.
        let files = self.client_files(&call)?;
        blocking("file_delete", move || {
            let recursive = p.recursive.unwrap_or(false);
            let shown = files.delete(&p.path, recursive)?;
            let message = format!("deleted {shown}");
            let out = ChangeOutput {
                path: shown,
                bytes: 0,
                message: message.clone(),
            };
            Ok(render::structured(message, &out))
        })
        .await
    }
}

/// file_list's result (on the blocking pool).
fn list_result(files: &Workspace, rel: &str, depth: usize) -> ToolResult {
    let Listing {
        shown,
        entries,
        truncated,
        ..
    } = files.list(rel, depth, MAX_ENTRIES)?;
    let entries: Vec<Entry> = entries
        .into_iter()
        .map(|e| Entry {
            path: e.path,
            kind: e.kind.as_str().to_string(),
            size: e.size,
        })
        .collect();
    let mut text = format!("{shown}/\n");
    for e in &entries {
        let indent = e.path.matches('/').count();
        let name = e.path.rsplit('/').next().unwrap_or(&e.path);
        let suffix = match (e.kind.as_str(), e.size) {
            ("dir", _) => "/".to_string(),
            ("symlink", _) => " -> (symlink)".to_string(),
            (_, Some(s)) => format!("  {}", crate::units::human_bytes(s)),
            _ => String::new(),
        };
        text.push_str(&format!("{}{name}{suffix}\n", "  ".repeat(indent + 1)));
    }
    if truncated {
        text.push_str(&format!(
            "[listing stopped at {MAX_ENTRIES} entries; list a subdirectory or lower depth]\n"
        ));
    }
    let out = ListOutput {
        root: files.root().display().to_string(),
        entries,
        truncated,
    };
    Ok(render::structured(text, &out))
}

/// file_read's result (on the blocking pool): at most MAX_READ_BYTES are
/// read, then the line window is cut from them.
fn read_result(files: &Workspace, p: &ReadParams) -> ToolResult {
    let FileData { shown, data } = files.read(&p.path, MAX_READ_BYTES)?;
    let size = data.len() as u64;
    let sniff = &data[..data.len().min(8192)];
    let text = if sniff.contains(&0) {
        None
    } else {
        std::str::from_utf8(&data).ok()
    };
    let Some(text) = text else {
        let mime = mime_for(Path::new(&shown)).to_string();
        let blob = base64::engine::general_purpose::STANDARD.encode(&data);
        let uri = format!("file:///{shown}");
        let out = ReadOutput {
            path: shown.clone(),
            bytes: size,
            binary: true,
            mime_type: mime.clone(),
            total_lines: None,
            start_line: None,
            end_line: None,
            text: None,
        };
        let mut result = CallToolResult::success(vec![
            ContentBlock::text(format!(
                "{shown}: binary, {mime}, {size} bytes (attached as a resource)"
            )),
            ContentBlock::resource(ResourceContents::BlobResourceContents {
                uri,
                mime_type: Some(mime),
                blob,
                meta: None,
            }),
        ]);
        result.structured_content = serde_json::to_value(out).ok();
        return Ok(result);
    };
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let start = p.start_line.unwrap_or(1).max(1);
    let count = p.line_count.unwrap_or(DEFAULT_LINES).max(1);
    let from = (start - 1).min(lines.len());
    let to = from.saturating_add(count).min(lines.len());
    let body: String = lines[from..to].concat();
    let header = format!(
        "[{shown}: lines {}-{} of {}{}]\n",
        from + 1,
        to,
        lines.len(),
        if to < lines.len() {
            format!("; more with start_line={}", to + 1)
        } else {
            String::new()
        }
    );
    let out = ReadOutput {
        path: shown,
        bytes: size,
        binary: false,
        mime_type: "text/plain".into(),
        total_lines: Some(lines.len() as u64),
        start_line: Some(from as u64 + 1),
        end_line: Some(to as u64),
        text: Some(body.clone()),
    };
    Ok(render::structured(header + &body, &out))
}
