//! ferrepl: persistent Python sessions for AI agents over MCP.
//!
//! The data path, top to bottom: `mcp` (tools, schemas, rendering,
//! transports) → `session` and `jobs` → `worker` (the interpreter process,
//! its control channel and output) → `process` (how every process is
//! started, watched and ended) → `sandbox` (how it is confined); `egress`
//! and `installer` serve package installs, `files` the file tools. `app`
//! assembles them from `config`; `metrics` counts what happens in all of
//! them for Prometheus; `viewer` shows the sessions to a person, read-only.

pub mod app;
pub mod attach;
pub mod config;
pub mod egress;
pub mod executables;
pub mod files;
pub mod installer;
pub mod jobs;
pub mod mcp;
pub mod metrics;
pub mod output;
pub mod process;
pub mod sandbox;
pub mod serve;
pub mod session;
pub mod setup;
pub mod startup;
pub mod state;
pub mod store;
pub mod tenants;
pub mod test_hooks;
pub mod units;
pub mod upstream;
pub mod viewer;
pub mod worker;
