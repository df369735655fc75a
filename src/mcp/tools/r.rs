//! The core R tools: r_exec, r_wait, r_output and r_inspect. They take the
//! Python tools' arguments (described for R in `server.rs`) and share their
//! bodies; only what differs is here.

use rmcp::handler::server::common::schema_for_output;
use rmcp::{tool, tool_router};

use crate::mcp::args::Parameters;
use crate::mcp::call::Call;
use crate::mcp::error::{ToolError, ToolResult};
use crate::mcp::params::{ExecParams, InspectParams, OutputParams, WaitParams};
use crate::mcp::results::{CellOutput, InspectOutput, OutputWindow};
use crate::mcp::server::FerreplServer;
use crate::session::CellSource;
use crate::worker::Language;

#[tool_router(router = r_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(
        description = "Run R code in a persistent session: output, warnings, plots (PNG), errors with their calls. \
Example: {\"code\": \"summary(rnorm(9))\"}",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Run R")
    )]
    async fn r_exec(&self, Parameters(p): Parameters<ExecParams>, call: Call) -> ToolResult {
        if p.code.contains('\0') {
            return Err(ToolError::new(
                "code contains a NUL character, which R cannot hold; remove it",
            ));
        }
        let source = CellSource::Code(&p.code);
        self.run_cell(&p.session, Language::R, (source, p.parent), p.wait_s, call)
            .await
    }

    #[tool(
        description = "Follow a 'running' or 'waiting_input' R cell: wait, answer readline(), or interrupt.",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Wait for an R cell", destructive_hint = false, open_world_hint = false)
    )]
    async fn r_wait(&self, Parameters(p): Parameters<WaitParams>, call: Call) -> ToolResult {
        self.wait_cell(Language::R, p, call).await
    }

    #[tool(
        description = "An R cell's full output: a window, or the lines matching grep.",
        output_schema = schema_for_output::<OutputWindow>(),
        annotations(title = "Read R cell output", read_only_hint = true)
    )]
    async fn r_output(&self, Parameters(p): Parameters<OutputParams>) -> ToolResult {
        self.read_output(Language::R, p)
    }

    #[tool(
        description = "The R session's objects (class, size, str), or one in detail. Between cells only.",
        output_schema = schema_for_output::<InspectOutput>(),
        annotations(title = "Inspect R objects", read_only_hint = true)
    )]
    async fn r_inspect(&self, Parameters(p): Parameters<InspectParams>) -> ToolResult {
        self.inspect_objects(Language::R, &p.session, p.name.as_deref())
            .await
    }
}
