//! The viewer (`--viewer`) over plain HTTP, through the real binary (the
//! browser's side is tests/viewer/browser_check.py): `pages` is what it
//! serves and refuses to serve, `access` who may reach it (logins, cookies,
//! tokens, throttling), `foreign` the cells another client ran in a
//! kernel session. The viewer's shared helpers live in `pages`, where
//! they were first written, and are re-exported here for `access`.

mod access;
mod foreign;
mod pages;

pub(crate) use pages::{
    NAMED, get, head_of, host, stdio_viewer, tenants_with_their_mcp_tokens, viewer_port,
};
