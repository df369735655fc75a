//! Turns reports into MCP tool results: a terminal-like text block for the
//! model to read, and structuredContent matching each tool's output schema.

use rmcp::model::{CallToolResult, ContentBlock as Content};
use serde::Serialize;

use crate::mcp::surface::CellOutput;
use crate::output::text::clean;
use crate::session::report::{CellReport, CellStatus};

fn format_elapsed(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

fn push_block(text: &mut String, block: &str) {
    if block.is_empty() {
        return;
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(block);
}

/// The text block of a cell result.
pub fn cell_text(r: &CellReport) -> String {
    let mut text = String::new();
    for note in &r.notes {
        push_block(&mut text, &format!("[ferrepl] {note}\n"));
    }
    if let Some(bg) = &r.background {
        push_block(
            &mut text,
            &format!(
                "[ferrepl] output produced in the background after cell {} finished:\n{}",
                bg.after_cell,
                clean(&bg.output.combined)
            ),
        );
        push_block(&mut text, "[ferrepl] end of background output\n");
    }
    push_block(&mut text, &clean(&r.output.combined));
    if let Some(v) = &r.value {
        push_block(&mut text, v);
    }
    if let Some(e) = &r.error {
        if !e.traceback.is_empty() {
            push_block(&mut text, &e.traceback);
        } else if r.status != CellStatus::Crashed {
            push_block(&mut text, &format!("{}: {}", e.kind, e.message));
        }
    }
    match r.status {
        CellStatus::Running => push_block(
            &mut text,
            &format!(
                "[ferrepl] still running; call {} to keep waiting (interrupt: true stops it).",
                r.language.wait_tool()
            ),
        ),
        CellStatus::WaitingInput => push_block(
            &mut text,
            &format!(
                "[ferrepl] waiting for input, prompt {:?}; answer with {} {{input: ...}}.",
                r.prompt.as_deref().unwrap_or(""),
                r.language.wait_tool()
            ),
        ),
        _ => {}
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "-- {} | cell {} | session {} | {} --",
        r.status.as_str(),
        r.cell,
        r.session,
        format_elapsed(r.elapsed_ms)
    ));
    text
}

pub fn cell_result(r: &CellReport) -> CallToolResult {
    let structured = CellOutput {
        status: r.status,
        session: r.session.clone(),
        cell: r.cell,
        stdout: clean(&r.output.stdout),
        stderr: clean(&r.output.stderr),
        value: r.value.clone(),
        error: r.error.clone(),
        prompt: r.prompt.clone(),
        elapsed_ms: r.elapsed_ms,
        output_bytes: r.output.total_bytes,
        omitted_bytes: r.output.omitted_bytes,
        background_output: r.background.as_ref().map(|b| b.output.combined.clone()),
        notes: r.notes.clone(),
        display: r.images.info.clone(),
    };
    let mut content = vec![Content::text(cell_text(r))];
    for image in &r.images.shown {
        content.push(Content::image(image.base64.clone(), image.mime.clone()));
    }
    let mut result = if r.status.is_error() {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = serde_json::to_value(structured).ok();
    result
}

/// A successful non-cell result with both forms.
pub fn structured<T: Serialize>(text: String, value: &T) -> CallToolResult {
    let mut result = CallToolResult::success(vec![Content::text(text)]);
    result.structured_content = serde_json::to_value(value).ok();
    result
}
