//! The core cell tools: python_exec, python_wait, python_output and
//! python_inspect, whose bodies also serve their R twins (tools/r.rs): each
//! learns its language from the name it was called by.

use rmcp::handler::server::common::schema_for_output;
use rmcp::{tool, tool_router};
use serde_json::Value;

use crate::mcp::args::{Parameters, secs};
use crate::mcp::call::Call;
use crate::mcp::error::{ToolError, ToolResult};
use crate::mcp::render;
use crate::mcp::server::FerreplServer;
use crate::mcp::surface::{CellOutput, InspectOutput, OutputWindow};
use crate::mcp::surface::{ExecParams, InspectParams, OutputParams, WaitParams};
use crate::mcp::window;
use crate::worker::Language;

#[tool_router(router = python_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(output_schema = schema_for_output::<CellOutput>())]
    async fn python_exec(&self, Parameters(p): Parameters<ExecParams>, call: Call) -> ToolResult {
        if call.language() == Language::R && p.code.contains('\0') {
            return Err(ToolError::new(
                "code contains a NUL character, which R cannot hold; remove it",
            ));
        }
        let source = crate::session::CellSource::Code(&p.code);
        self.run_cell(&p.session, (source, p.parent), p.wait_s, call)
            .await
    }

    #[tool(output_schema = schema_for_output::<CellOutput>())]
    async fn python_wait(&self, Parameters(p): Parameters<WaitParams>, call: Call) -> ToolResult {
        self.wait_cell(p, call).await
    }

    #[tool(output_schema = schema_for_output::<OutputWindow>())]
    async fn python_output(&self, args: Parameters<OutputParams>, call: Call) -> ToolResult {
        self.read_output(call.language(), args.0)
    }

    #[tool(output_schema = schema_for_output::<InspectOutput>())]
    async fn python_inspect(&self, args: Parameters<InspectParams>, call: Call) -> ToolResult {
        let p = args.0;
        self.inspect_objects(call.language(), &p.session, p.name.as_deref())
            .await
    }
}

/// The bodies of the core tools, shared by every language's tools.
impl FerreplServer {
    pub(crate) async fn wait_cell(&self, p: WaitParams, call: Call) -> ToolResult {
        let wait = self.manager.wait_window(secs(p.wait_s));
        let session = self.session_in(&p.session, call.language())?;
        let interrupt = p.interrupt.unwrap_or(false);
        let eof = p.eof.unwrap_or(false);
        if interrupt && (p.input.is_some() || eof) {
            return Err(ToolError::new(
                "give either input/eof or interrupt, not both",
            ));
        }
        if interrupt {
            return Ok(render::cell_result(
                &self.manager.interrupt(&session).await?,
            ));
        }
        if p.input.is_some() || eof {
            let text = p.input.unwrap_or_default();
            let fut = self.manager.input(&session, &text, eof, wait);
            return self.drive(&session, (call, false), fut).await;
        }
        let fut = self.manager.wait(&session, wait);
        self.drive(&session, (call, false), fut).await
    }

    pub(crate) fn read_output(&self, lang: Language, p: OutputParams) -> ToolResult {
        if let Some(job) = &p.job {
            let (job, bytes, dropped, running) = self.jobs.output(job)?;
            let source = window::Source {
                origin: window::Origin::Job(job.id().to_string()),
                running,
                bytes,
                dropped,
            };
            return window::reply(source, &p.window);
        }
        let session = self.session_in(&p.session, lang)?;
        let (cell, running, bytes, dropped) = self.manager.cell_output(&session, p.cell)?;
        let source = window::Source {
            origin: window::Origin::Cell { session, cell },
            running,
            bytes,
            dropped,
        };
        window::reply(source, &p.window)
    }

    pub(crate) async fn inspect_objects(
        &self,
        lang: Language,
        session: &Option<String>,
        name: Option<&str>,
    ) -> ToolResult {
        let session = self.session_in(session, lang)?;
        let target = name.filter(|n| !n.is_empty());
        let reply = self.manager.inspect(&session, target).await?;
        let out = InspectOutput {
            session,
            variables: reply.get("variables").and_then(Value::as_array).cloned(),
            detail: reply.get("detail").cloned(),
        };
        Ok(render::structured(render_inspect(&out), &out))
    }
}

fn render_inspect(out: &InspectOutput) -> String {
    let mut text = String::new();
    if let Some(vars) = &out.variables {
        if vars.is_empty() {
            text.push_str(&format!("session {}: no user variables\n", out.session));
        }
        for v in vars {
            let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let mut extra = String::new();
            if let Some(n) = v.get("len").and_then(Value::as_u64) {
                extra.push_str(&format!(" len={n}"));
            }
            if let Some(shape) = v.get("shape") {
                extra.push_str(&format!(" shape={shape}"));
            }
            text.push_str(&format!(
                "{}: {}{extra} = {}\n",
                field("name"),
                field("type"),
                field("repr")
            ));
        }
    }
    if let Some(d) = &out.detail {
        let field = |k: &str| d.get(k).and_then(Value::as_str).map(str::to_string);
        text.push_str(&format!(
            "{}:{}\n",
            field("name").unwrap_or_default(),
            field("type").map(|t| format!(" {t}")).unwrap_or_default()
        ));
        // A kernel session's: the kernel's own words, as `name?` shows them.
        if let Some(kernel_text) = field("text") {
            text.push_str(&format!("{kernel_text}\n"));
        }
        if let Some(sig) = field("signature") {
            text.push_str(&format!(
                "signature: {}{sig}\n",
                field("name").unwrap_or_default()
            ));
        }
        if let Some(r) = field("repr") {
            text.push_str(&format!("repr: {r}\n"));
        }
        if let Some(doc) = field("doc") {
            text.push_str(&format!("doc:\n{doc}\n"));
        }
        if let Some(file) = field("file") {
            let line = d.get("line").and_then(Value::as_u64).unwrap_or(1);
            text.push_str(&format!("defined in: {file}:{line}\n"));
        }
        if let Some(source) = field("source") {
            text.push_str(&format!("source:\n{source}"));
        }
    }
    text
}
