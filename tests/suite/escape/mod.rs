//! The escape suite: one module per class of attack a hostile agent can try
//! (it controls the code it runs and every tool argument it sends). Each test
//! performs the attack through the real binary and an MCP client and asserts
//! it fails. Run as root (CI) and, by `scripts/escape-unprivileged.sh`, once
//! more as an unprivileged user (the `escape::` tests of this binary).

mod args;
mod code_tools;
mod degraded;
mod files;
mod front_door;
mod front_door_shares;
mod host_reach;
mod install_specs;
mod isolation;
mod kernels;
mod planted;
mod privileges;
mod protected;
mod r_args;
mod robustness;
mod server_writes;
mod state_dir;
mod tenants;
mod uids;
mod view;
mod view_compat;
mod view_hidden;
mod view_state;
