//! Workspace file tools (file_list, file_read, file_write, file_delete) and
//! their confinement to the workspace root; python_install into virtual
//! environments (with a wheel built locally, no network) and its refusals;
//! and the --tools groups that hide these tools.
//!
//! One file per subject: `files` (text and binary files), `confinement`
//! (paths outside the workspace), `tool_groups`, `packages` (python_install,
//! with its own helpers).

mod confinement;
mod files;
mod packages;
mod tool_groups;
