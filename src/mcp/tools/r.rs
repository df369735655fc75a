//! The core R tools: r_exec, r_wait, r_output and r_inspect. They share
//! their bodies with the Python tools; only what differs is here.

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::RequestMetaObject;
use rmcp::{Peer, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::python::{InspectOutput, WaitParams};
use crate::mcp::args::{Parameters, Seconds};
use crate::mcp::error::{ToolError, ToolResult};
use crate::mcp::render::CellOutput;
use crate::mcp::server::FerreplServer;
use crate::mcp::window::{OutputParams, OutputWindow};
use crate::session::CellSource;
use crate::worker::Language;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RExecParams {
    /// R code; visible values print as in the console.
    pub code: String,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

/// python_wait's arguments, described for R.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(default)]
pub struct RWaitParams {
    pub session: Option<String>,
    pub wait_s: Option<Seconds>,
    /// Answers readline().
    pub input: Option<String>,
    pub eof: Option<bool>,
    pub interrupt: Option<bool>,
}

impl From<RWaitParams> for WaitParams {
    fn from(p: RWaitParams) -> Self {
        WaitParams {
            session: p.session,
            wait_s: p.wait_s,
            input: p.input,
            eof: p.eof,
            interrupt: p.interrupt,
        }
    }
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(default)]
pub struct RInspectParams {
    pub session: Option<String>,
    /// e.g. "df$x".
    pub name: Option<String>,
}

#[tool_router(router = r_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(
        description = "Run R code in a persistent session: output, warnings, plots (PNG), errors with their calls. \
Example: {\"code\": \"summary(rnorm(9))\"}",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Run R")
    )]
    async fn r_exec(
        &self,
        Parameters(p): Parameters<RExecParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> ToolResult {
        if p.code.contains('\0') {
            return Err(ToolError::new(
                "code contains a NUL character, which R cannot hold; remove it",
            ));
        }
        let source = CellSource::Code(&p.code);
        self.run_cell(&p.session, Language::R, source, p.wait_s, (meta, peer, ct))
            .await
    }

    #[tool(
        description = "Follow an R cell that returned 'running' or 'waiting_input': wait, answer readline() or interrupt.",
        output_schema = schema_for_output::<CellOutput>(),
        annotations(title = "Wait for an R cell", destructive_hint = false, open_world_hint = false)
    )]
    async fn r_wait(
        &self,
        Parameters(p): Parameters<RWaitParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> ToolResult {
        self.wait_cell(Language::R, p.into(), (meta, peer, ct))
            .await
    }

    #[tool(
        description = "A window of an R cell's full output, or the lines matching grep.",
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
    async fn r_inspect(&self, Parameters(p): Parameters<RInspectParams>) -> ToolResult {
        self.inspect_objects(Language::R, &p.session, p.name.as_deref())
            .await
    }
}
