//! Each session and each shell job sees its own world: `/proc` shows only
//! its own processes (not the server, not another session, and no other
//! environment), `/dev` is minimal, pty jobs cannot be reached from another
//! session or job, `/dev/shm` is private (and counted against the memory
//! limit), host Unix sockets and the host's temporary directory are out of
//! sight, and with the network off the only interface is a private `lo`.
//!
//! Every attack runs in a real server (default flags plus `--workdir`)
//! through an MCP client, in `python_exec` cells and `shell_exec` jobs, with
//! decoys the test makes itself. Each assertion holds both when the tests
//! run as root and as an ordinary user. Cells print each probe's outcome as
//! `label: OK <repr>` or `label: <ExceptionType> errno=<n>`.
//!
//! `mod.rs` holds the polling and clean-up helpers; one file per part of
//! that world: `proc.rs` (/proc and other sessions' environments), `dev.rs`
//! (/dev and pty jobs), `shm.rs` (/dev/shm), `host_places.rs` (host Unix
//! sockets and temporary directories) and `network.rs` (the network
//! namespace).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::StdioServer;

/// Upper bound for something the test polls for (a process, job output).
const POLL_TIMEOUT: Duration = Duration::from_secs(20);

// ------------------------------------------------------------------ helpers

fn string_set(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a JSON array, got {v}"))
        .iter()
        .map(|x| x.as_str().expect("a string").to_string())
        .collect()
}

/// The full output of a job so far.
async fn job_output(server: &StdioServer, job: &str) -> String {
    let out = server.call("shell_output", json!({ "job": job })).await;
    assert!(!out.is_error, "shell_output failed: {out:#?}");
    out.str_field("text").to_string()
}

/// Polls a job's full output until `done(output)` (bounded); returns it.
async fn wait_job_output(server: &StdioServer, job: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + POLL_TIMEOUT;
    loop {
        let text = job_output(server, job).await;
        if done(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {job}'s output did not reach the expected state within {POLL_TIMEOUT:?}: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Paths removed when the test ends (passing or not).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for path in &self.0 {
            if path.is_dir() {
                let _ = std::fs::remove_dir_all(path);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

mod dev;
mod host_places;
mod network;
mod proc;
mod shm;
