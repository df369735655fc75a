//! Command-line flags and their FERREPL_* environment variables.

use crate::support::StdioServer;
use std::time::Duration;

async fn assert_debug_logging(server: &StdioServer) {
    server.exec("1").await.assert_ok();
    assert!(
        server
            .wait_stderr_contains("DEBUG", Duration::from_secs(10))
            .await,
        "no DEBUG lines on stderr at log level debug:\n{}",
        server.stderr_log()
    );
}

#[tokio::test]
async fn log_level_flag_sets_the_stderr_log_level() {
    let server = StdioServer::start(&["--log-level", "debug"]).await;
    assert_debug_logging(&server).await;
}

#[tokio::test]
async fn log_level_can_be_set_by_environment() {
    let server = StdioServer::start_with_env(&[], &[("FERREPL_LOG_LEVEL", "debug")]).await;
    assert_debug_logging(&server).await;
}

async fn session_cwd(server: &StdioServer) -> String {
    let out = server
        .exec("import os; os.path.realpath(os.getcwd())")
        .await;
    out.assert_ok();
    out.value()
        .expect("cwd value")
        .trim_matches('\'')
        .to_string()
}

fn canonical(path: &std::path::Path) -> String {
    std::fs::canonicalize(path)
        .expect("canonical path")
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

#[tokio::test]
async fn workdir_can_be_set_by_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = StdioServer::start_without_workdir_flag(
        &[],
        &[("FERREPL_WORKDIR", dir.path().to_str().expect("utf-8"))],
    )
    .await;
    assert_eq!(session_cwd(&server).await, canonical(dir.path()));
}

#[tokio::test]
async fn workdir_flag_wins_over_the_environment() {
    let other = tempfile::tempdir().expect("tempdir");
    let server = StdioServer::start_with_env(
        &[],
        &[("FERREPL_WORKDIR", other.path().to_str().expect("utf-8"))],
    )
    .await;
    assert_eq!(session_cwd(&server).await, canonical(server.workdir.path()));
}

/// `ferrepl ARG`'s standard output, with no FERREPL_* variable of the test's
/// own environment showing in its `[env: X=value]`.
fn help_text(arg: &str) -> String {
    let mut cmd = std::process::Command::new(crate::support::server_binary());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("FERREPL_") {
            cmd.env_remove(key);
        }
    }
    let out = cmd.arg(arg).output().expect("run ferrepl");
    assert!(out.status.success(), "ferrepl {arg} failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The long flags a help text lists, in its order.
fn listed_flags(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|line| {
            let trimmed = line.trim_start();
            let rest = trimmed
                .strip_prefix("--")
                .or_else(|| trimmed.split_once(", --").map(|x| x.1))?;
            Some(
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn short_help_is_one_screen_and_starts_with_the_workspace_and_python() {
    let help = help_text("-h");
    assert!(
        help.lines().count() <= 50,
        "-h is {} lines:\n{help}",
        help.lines().count()
    );
    let flags = listed_flags(&help);
    assert_eq!(
        flags.get(..2),
        Some(&["workdir".to_string(), "python".to_string()][..]),
        "{help}"
    );
    assert!(
        help.contains("--help"),
        "-h does not point to --help:\n{help}"
    );
}

#[test]
fn long_help_lists_every_flag() {
    let help = help_text("--help");
    let listed = listed_flags(&help);
    let command = <ferrepl::config::Flags as clap::CommandFactory>::command();
    let missing: Vec<_> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set())
        .filter_map(|arg| arg.get_long())
        .filter(|long| !listed.iter().any(|l| l == long))
        .collect();
    assert!(missing.is_empty(), "--help misses {missing:?}:\n{help}");
    assert_eq!(
        listed.first().map(String::as_str),
        Some("workdir"),
        "{help}"
    );
}
