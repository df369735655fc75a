//! `SessionError`: what a session call refuses or fails with, as the agent
//! reads it.

use super::gate::Refusal;
use super::{DEFAULT_SESSION, default_for};
use crate::worker::{Language, WorkerError};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(
        "session '{session}' is busy running cell {cell} ({secs:.1} s){waiting}; call {wait} to collect it, or {wait} with interrupt: true to stop it",
        wait = .lang.wait_tool()
    )]
    Busy {
        lang: Language,
        session: String,
        cell: u64,
        secs: f64,
        waiting: String,
    },
    #[error(
        "no session named '{name}'; existing sessions: {existing}. python_exec or r_exec creates a session on first use"
    )]
    NotFound { name: String, existing: String },
    #[error(
        "session '{session}' is {has} session; {wanted} tools cannot use it. Pass another session name (omit it for {wanted}'s default, '{default}')",
        has = .has.with_article(),
        default = default_for(*.wanted, DEFAULT_SESSION)
    )]
    WrongLanguage {
        session: String,
        has: Language,
        wanted: Language,
    },
    #[error(
        "{0} sessions are not enabled on this server; the operator can add them with --languages python,r"
    )]
    LanguageOff(Language),
    #[error("invalid session name '{0}': use 1-64 letters, digits, '_', '-' or '.'")]
    BadName(String),
    #[error(
        "cannot create session '{name}': {whose} {limit} sessions, {limit_name}; reuse, reset or delete a session (python_sessions list), or retry later",
        whose = if *.share { "this tenant holds" } else { "this server holds" },
        limit_name = if *.share { "its share of the instance (--tenant-max-sessions)" } else { "its limit (--max-sessions)" }
    )]
    TooMany {
        name: String,
        limit: usize,
        share: bool,
    },
    #[error("session '{session}': {source}")]
    Worker {
        session: String,
        #[source]
        source: WorkerError,
    },
    #[error(
        "session '{1}' has no running cell and no result waiting; run code with {exec}",
        exec = .0.exec_tool()
    )]
    Idle(Language, String),
    #[error(
        "session '{session}' is not waiting for input{detail}; {wait}'s input only answers a pending {call} (status waiting_input)",
        wait = .lang.wait_tool(),
        call = .lang.input_call()
    )]
    NotWaitingInput {
        lang: Language,
        session: String,
        detail: String,
    },
    #[error("{0}")]
    Inspect(String),
    /// A rebuild runs: what it re-runs and how to follow or stop it.
    #[error("{0}")]
    Rebuilding(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Env(#[from] crate::sandbox::env::EnvError),
    #[error(
        "session '{session}': {detail}; run a cell with {exec} first, or pass another cell number",
        exec = .lang.exec_tool()
    )]
    NoOutput {
        lang: Language,
        session: String,
        detail: String,
    },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Refused(#[from] Refusal),
}
