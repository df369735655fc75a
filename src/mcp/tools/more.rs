//! The `more` group: python_history, python_run_file, python_complete and
//! python_namespace.

use rmcp::handler::server::common::schema_for_output;
use rmcp::{tool, tool_router};
use serde_json::Value;

use crate::mcp::args::Parameters;
use crate::mcp::call::Call;
use crate::mcp::error::{ToolError, ToolResult};
use crate::mcp::render;
use crate::mcp::server::FerreplServer;
use crate::mcp::surface::{
    CellOutput, CompleteOutput, ExportOutput, HistoryOutput, NamespaceOutput,
};
use crate::mcp::surface::{
    CompleteParams, ExportParams, HistoryParams, NamespaceAction, NamespaceParams, RunFileParams,
};
use crate::session::CellSource;
use crate::worker::Language;

#[tool_router(router = more_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(output_schema = schema_for_output::<HistoryOutput>())]
    async fn python_history(&self, Parameters(p): Parameters<HistoryParams>) -> ToolResult {
        let session = self.session_name(&p.session);
        let cells = self.manager.history(&session, p.last)?;
        let running = self.manager.running_cell(&session);
        let mut text = String::new();
        if cells.is_empty() && running.is_none() {
            text.push_str(&format!("session {session}: no cells yet\n"));
        }
        if cells.iter().any(|c| !c.current && c.by.is_none()) {
            let current: Vec<u64> = cells.iter().filter(|c| c.current).map(|c| c.cell).collect();
            text.push_str(&format!(
                "current branch: {}\n",
                if current.is_empty() {
                    "none of these (a fresh interpreter)".to_string()
                } else {
                    crate::session::id_ranges(&current)
                }
            ));
        }
        for c in &cells {
            let head = match &c.by {
                // Not one of the session's cells: no number, no branch.
                Some(by) => format!("[run by {by} | {}]", c.status.as_str()),
                None => {
                    let after = match c.parent {
                        Some(p) if p + 1 != c.cell => format!(" | after {p}"),
                        None if c.cell > 1 => " | fresh".to_string(),
                        _ => String::new(),
                    };
                    format!(
                        "[cell {}{after} | {} | {:.0} ms]",
                        c.cell,
                        c.status.as_str(),
                        c.elapsed_ms
                    )
                }
            };
            text.push_str(&format!("{head}\n{}\n", c.code.trim_end()));
            if !c.output_preview.trim().is_empty() {
                text.push_str(&format!(
                    "  => {}\n",
                    c.output_preview.trim_end().replace('\n', "\n     ")
                ));
            }
        }
        if let Some((cell, code, secs)) = &running {
            text.push_str(&format!(
                "[cell {cell} | running | {secs:.1} s]\n{}\n",
                code.trim_end()
            ));
        }
        let out = HistoryOutput {
            session,
            cells,
            running: running.map(|(cell, code, secs)| serde_json::json!({"cell": cell, "code": code, "elapsed_s": secs})),
        };
        Ok(render::structured(text, &out))
    }

    #[tool(output_schema = schema_for_output::<ExportOutput>())]
    async fn python_export(
        &self,
        Parameters(p): Parameters<ExportParams>,
        call: Call,
    ) -> ToolResult {
        let session = self.session_name(&p.session);
        let files = self.client_files(&call)?;
        let export = self.manager.export(&session, p.cell, p.format)?;
        let path = p.path.as_str().to_string();
        let bytes = export.text.into_bytes();
        // Never onto a protected place, never left executable.
        let shown = tokio::task::spawn_blocking(move || files.export(&path, &bytes))
            .await
            .map_err(|e| ToolError::new(format!("python_export failed: {e}")))??;
        let mut message = format!(
            "wrote cells {} of session '{session}' to {shown}",
            crate::session::id_ranges(&export.cells)
        );
        if export.cells.is_empty() {
            message = format!(
                "wrote no cell of session '{session}' (its branch has none that ran ok) to {shown}"
            );
        }
        if !export.skipped.is_empty() {
            message.push_str(&format!(
                "; left out cells {} (they failed or were interrupted)",
                crate::session::id_ranges(&export.skipped)
            ));
        }
        let out = ExportOutput {
            path: shown,
            cells: export.cells,
            skipped: export.skipped,
        };
        Ok(render::structured(message, &out))
    }

    #[tool(output_schema = schema_for_output::<CellOutput>())]
    async fn python_run_file(&self, args: Parameters<RunFileParams>, call: Call) -> ToolResult {
        let p = args.0;
        let args = p.args.unwrap_or_default();
        let source = CellSource::File {
            path: p.path.as_str(),
            args: &args,
        };
        self.run_cell(&p.session, (source, None), p.wait_s, call)
            .await
    }

    #[tool(output_schema = schema_for_output::<CompleteOutput>())]
    async fn python_complete(&self, args: Parameters<CompleteParams>, call: Call) -> ToolResult {
        self.complete_code(call.language(), args.0).await
    }

    #[tool(output_schema = schema_for_output::<NamespaceOutput>())]
    async fn python_namespace(&self, Parameters(p): Parameters<NamespaceParams>) -> ToolResult {
        let session = self.session_in(&p.session, Language::Python)?;
        let mut args = serde_json::Map::new();
        let action = match p.action {
            NamespaceAction::Set => {
                let Some(name) = p.name else {
                    return Err(ToolError::new("set needs 'name' (and 'value')"));
                };
                args.insert("name".into(), Value::from(name));
                args.insert("value".into(), p.value.unwrap_or(Value::Null));
                "set"
            }
            NamespaceAction::Delete => {
                let names = p.names.unwrap_or_default();
                if names.is_empty() {
                    return Err(ToolError::new(
                        "delete needs 'names', a list of variable names",
                    ));
                }
                args.insert("names".into(), Value::from(names));
                "delete"
            }
            NamespaceAction::Clear => "clear",
        };
        args.insert("action".into(), Value::from(action));
        let reply = self.manager.edit_namespace(&session, args).await?;
        let changed: Vec<String> = reply
            .get("changed")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let text = match action {
            "set" => format!("set {} in session {session}", changed.join(", ")),
            "delete" => format!("deleted {} from session {session}", changed.join(", ")),
            _ => format!("cleared {} variables from session {session}", changed.len()),
        };
        Ok(render::structured(
            text,
            &NamespaceOutput { session, changed },
        ))
    }
}

impl FerreplServer {
    /// python_complete and r_complete.
    async fn complete_code(&self, lang: Language, p: CompleteParams) -> ToolResult {
        let session = self.session_in(&p.session, lang)?;
        let reply = self.manager.complete(&session, &p.code, p.cursor).await?;
        let completions = reply
            .get("completions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = completions
            .iter()
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .collect();
        let out = CompleteOutput {
            session,
            engine: reply
                .get("engine")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            token: reply
                .get("token")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            completions: completions.clone(),
        };
        let text = if names.is_empty() {
            format!("no completions for {:?}", out.token)
        } else {
            names.join("\n")
        };
        Ok(render::structured(text, &out))
    }
}
