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
