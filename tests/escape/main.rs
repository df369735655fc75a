//! The escape suite: one module per class of attack a hostile agent can try
//! (it controls the code it runs and every tool argument it sends). Each test
//! performs the attack through the real binary and an MCP client and asserts
//! it fails. Run as root (CI) and as an unprivileged user (scripts/test.sh).

#[path = "../common/mod.rs"]
mod common;

mod args;
mod degraded;
mod files;
mod isolation;
mod privileges;
mod review;
mod robustness;
