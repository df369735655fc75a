//! What a call about a cell returns, before it is rendered for MCP.

use serde::Serialize;

use crate::worker::output::RenderedOutput;
use crate::worker::protocol::PyError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    /// The cell finished without an exception.
    Ok,
    /// The cell raised an exception.
    Error,
    /// The cell is still running; collect it with python_wait.
    Running,
    /// The cell is blocked in input(); answer with python_input.
    WaitingInput,
    /// The cell was stopped by python_interrupt (or a time limit).
    Interrupted,
    /// The interpreter process died; its state is lost.
    Crashed,
}

impl CellStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CellStatus::Ok => "ok",
            CellStatus::Error => "error",
            CellStatus::Running => "running",
            CellStatus::WaitingInput => "waiting_input",
            CellStatus::Interrupted => "interrupted",
            CellStatus::Crashed => "crashed",
        }
    }

    pub fn from_driver(s: &str) -> Self {
        match s {
            "ok" => CellStatus::Ok,
            "interrupted" => CellStatus::Interrupted,
            _ => CellStatus::Error,
        }
    }

    pub fn is_error(self) -> bool {
        matches!(
            self,
            CellStatus::Error | CellStatus::Interrupted | CellStatus::Crashed
        )
    }
}

/// Output that arrived after an earlier cell had finished (from threads or
/// subprocesses it started).
#[derive(Debug, Clone)]
pub struct BackgroundOutput {
    pub after_cell: u64,
    pub output: RenderedOutput,
}

#[derive(Debug, Clone)]
pub struct CellReport {
    pub status: CellStatus,
    pub session: String,
    pub cell: u64,
    pub output: RenderedOutput,
    pub background: Option<BackgroundOutput>,
    pub value: Option<String>,
    pub error: Option<PyError>,
    pub prompt: Option<String>,
    pub elapsed_ms: f64,
    /// Things the agent must know: lost state, earlier results, escalations.
    pub notes: Vec<String>,
}
