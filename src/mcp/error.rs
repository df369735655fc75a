//! The one error a tool returns: a sentence for the agent saying what
//! happened and what to do next, shown as an `isError` result (never a
//! JSON-RPC error, which clients hide from the model).

use rmcp::model::{ContentBlock as Content, IntoContents};

#[derive(Debug)]
pub struct ToolError(String);

impl ToolError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// Any error with a message a person can read (session, job, file and
/// worker errors all say what to do next) becomes a tool error; `?` works.
impl<E: std::fmt::Display> From<E> for ToolError {
    fn from(error: E) -> Self {
        Self(error.to_string())
    }
}

impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<Content> {
        vec![Content::text(format!("error: {}", self.0))]
    }
}

/// The result type of every tool.
pub type ToolResult = Result<rmcp::model::CallToolResult, ToolError>;
