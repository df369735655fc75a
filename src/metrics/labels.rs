//! The label values of the metrics: each a type of its own with a fixed
//! set of `&'static str` values (so the number of series stays bounded
//! whatever agents send), and the sets preset at start. Apart from
//! `mod.rs`, which registers, records and renders.

/// A session's language, as a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LanguageLabel {
    Python,
    R,
}

impl LanguageLabel {
    pub(super) const ALL: [LanguageLabel; 2] = [LanguageLabel::Python, LanguageLabel::R];

    pub fn as_str(self) -> &'static str {
        match self {
            LanguageLabel::Python => "python",
            LanguageLabel::R => "r",
        }
    }
}

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellOutcome {
    Ok,
    Error,
    Interrupted,
    Crashed,
}

impl CellOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            CellOutcome::Ok => "ok",
            CellOutcome::Error => "error",
            CellOutcome::Interrupted => "interrupted",
            CellOutcome::Crashed => "crashed",
        }
    }
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolOutcome {
    Ok,
    /// A result with `isError` (what the agent reads as an error).
    Error,
    /// A JSON-RPC error: unknown tool, arguments that do not parse.
    ProtocolError,
}

impl ToolOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolOutcome::Ok => "ok",
            ToolOutcome::Error => "error",
            ToolOutcome::ProtocolError => "protocol_error",
        }
    }
}

/// A limit ferrepl enforced by stopping a session's processes or its cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// --memory-limit, seen by the watch (resident memory) or the kernel's
    /// memory cgroup.
    Memory,
    /// --max-processes.
    Processes,
    /// --max-cell-seconds (the cell is interrupted, then killed if need be).
    CellTime,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Memory => "memory",
            Limit::Processes => "processes",
            Limit::CellTime => "cell_time",
        }
    }
}

/// A request the server refuses on policy grounds (not a mistake such as a
/// missing file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxRefusal {
    /// A file tool's path that is absolute, climbs with `..` or leads out
    /// of the workspace through a symlink.
    FilePath,
    /// A write or delete in a read-only workspace.
    ReadOnly,
    /// A session's or job's working directory outside the workspace.
    Cwd,
    /// A python/venv outside the workspace the operator did not allow.
    Interpreter,
    /// An environment variable agents may not set (loader paths, FERREPL_*).
    Env,
}

impl SandboxRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxRefusal::FilePath => "file_path",
            SandboxRefusal::ReadOnly => "read_only",
            SandboxRefusal::Cwd => "cwd",
            SandboxRefusal::Interpreter => "interpreter",
            SandboxRefusal::Env => "env",
        }
    }
}

/// Which egress proxy refused: the package installers' or the cells'
/// (`--network domains`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressAudience {
    Installers,
    Cells,
}

impl EgressAudience {
    pub const ALL: [EgressAudience; 2] = [EgressAudience::Installers, EgressAudience::Cells];

    pub fn as_str(self) -> &'static str {
        match self {
            EgressAudience::Installers => "installers",
            EgressAudience::Cells => "cells",
        }
    }
}

/// Why the egress proxy refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressRefusal {
    /// A host not on the allow-list.
    Host,
    /// A port not on the allow-list.
    Port,
    /// An allowed name that resolves to a private or loopback address.
    PrivateAddress,
    /// A request the proxy cannot or will not parse (malformed, too large,
    /// too slow, chunked).
    BadRequest,
    /// The destination could not be resolved or reached.
    Upstream,
    /// Too many connections at once.
    Busy,
    /// A request other than GET or HEAD to an index whose credentials the
    /// proxy adds.
    Method,
}

impl EgressRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            EgressRefusal::Host => "host",
            EgressRefusal::Port => "port",
            EgressRefusal::PrivateAddress => "private_address",
            EgressRefusal::BadRequest => "bad_request",
            EgressRefusal::Upstream => "upstream",
            EgressRefusal::Busy => "busy",
            EgressRefusal::Method => "method",
        }
    }
}

/// What kind of job was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    Shell,
    /// A package install (python_install, r_install).
    Install,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Shell => "shell",
            JobKind::Install => "install",
        }
    }
}

/// The statuses a cell can end with.
pub(super) const FINAL_STATUSES: [CellOutcome; 4] = [
    CellOutcome::Ok,
    CellOutcome::Error,
    CellOutcome::Interrupted,
    CellOutcome::Crashed,
];

pub(super) const SANDBOX_REFUSALS: [SandboxRefusal; 5] = [
    SandboxRefusal::FilePath,
    SandboxRefusal::ReadOnly,
    SandboxRefusal::Cwd,
    SandboxRefusal::Interpreter,
    SandboxRefusal::Env,
];

pub(super) const EGRESS_REFUSALS: [EgressRefusal; 7] = [
    EgressRefusal::Host,
    EgressRefusal::Port,
    EgressRefusal::PrivateAddress,
    EgressRefusal::BadRequest,
    EgressRefusal::Upstream,
    EgressRefusal::Busy,
    EgressRefusal::Method,
];
