//! The ferrepl integration suite: one test binary, so that the package's
//! test targets link once (`cargo test` runs it; `cargo test escape::`
//! runs one area).
//!
//! Each module below is one area of behaviour, tested through the real
//! `ferrepl` binary (`CARGO_BIN_EXE_ferrepl`) and an MCP client; test names
//! are `<area>::<test>`. `escape/` is the escape suite (one submodule per
//! class of attack), which `scripts/escape-unprivileged.sh` runs once more
//! as an unprivileged user.
//!
//! `support/` is the harness (see `support/mod.rs`): it starts servers (one
//! spawn path, `Launch`) over stdio and streamable HTTP with the rmcp
//! client, sends raw HTTP requests and hands raw stdio pipes to the tests
//! that speak JSON-RPC by hand (`stdio_protocol`, `tool_surface`), reads
//! tool results, and probes processes and sandboxes.
//!
//! The tests run as threads of this one process (`--test-threads`, default
//! one per core): a test passes settings to the server it starts (flags,
//! `Launch::envs`), never through the test process's own environment or
//! working directory, and every process it leaves is killed on drop.

mod support;

mod architecture;
mod arg_fuzz;
mod branching;
mod cell_egress;
mod checkpoints;
mod cli;
mod client_sandbox;
mod code_tools;
mod codex_client;
mod docs_numbers;
mod docs_words;
mod doctor;
mod durable;
// Attacks on the Linux sandbox (namespaces, Landlock, seccomp, cgroups).
#[cfg(target_os = "linux")]
mod escape;
mod export;
mod files_and_packages;
mod hints;
mod http_sessions;
mod http_transport;
mod index_credentials;
mod install;
mod kept_venv;
mod kernels;
mod kernels_attach;
// Attacks on kernel sessions, which run in the Linux sandbox only.
#[cfg(target_os = "linux")]
mod kernels_attacks;
mod kernels_messages;
mod kernels_other;
mod kernels_parity;
mod kernels_r;
mod kernels_restart;
mod large_output;
mod long_running;
mod packages_egress;
mod per_client;
mod preinstall;
mod r_sessions;
mod r_setup;
mod refusals;
mod resume_window;
mod rich_output;
mod sandbox;
mod saved_states;
mod shell_jobs;
mod stdio_exec;
mod stdio_protocol;
mod stdio_sessions;
mod surface_args;
mod tasks;
mod tenants;
mod terminal;
mod tool_surface;
mod viewer;
mod warm_pool;
mod workspace;
