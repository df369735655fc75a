//! Long-running cells over streamable HTTP: the wait window and python_wait,
//! input(), interrupts and progress notifications, with the same scenarios
//! as over stdio (the scenarios of `long_running/mod.rs`).

use super::{scenario_input, scenario_interrupt, scenario_progress, scenario_wait_window};
use crate::support::LongRunningServer;

#[tokio::test]
async fn http_exec_returns_running_after_its_window_and_wait_returns_the_rest() {
    let srv = LongRunningServer::http(&[]).await;
    scenario_wait_window(&srv).await;
}

#[tokio::test]
async fn http_input_returns_waiting_input_and_python_wait_input_answers_it() {
    let srv = LongRunningServer::http(&["--default-wait", "30"]).await;
    scenario_input(&srv).await;
}

#[tokio::test]
async fn http_interrupt_stops_a_busy_loop_and_keeps_state() {
    let srv = LongRunningServer::http(&[]).await;
    scenario_interrupt(&srv, "while True: pass", "looping").await;
}

#[tokio::test]
async fn http_progress_notifications_carry_the_latest_output() {
    let srv = LongRunningServer::http(&[]).await;
    scenario_progress(&srv).await;
}
