//! Long-running cells over streamable HTTP: the wait window and python_wait,
//! input(), interrupts and progress notifications, with the same scenarios
//! as over stdio (`tests/long_running.rs`).

mod common;
mod long_running_support;

use long_running_support::Server;

#[tokio::test]
async fn http_exec_returns_running_after_its_window_and_wait_returns_the_rest() {
    let srv = Server::http(&[]).await;
    long_running_support::scenario_wait_window(&srv).await;
}

#[tokio::test]
async fn http_input_returns_waiting_input_and_python_wait_input_answers_it() {
    let srv = Server::http(&["--default-wait", "30"]).await;
    long_running_support::scenario_input(&srv).await;
}

#[tokio::test]
async fn http_interrupt_stops_a_busy_loop_and_keeps_state() {
    let srv = Server::http(&[]).await;
    long_running_support::scenario_interrupt(&srv, "while True: pass", "looping").await;
}

#[tokio::test]
async fn http_progress_notifications_carry_the_latest_output() {
    let srv = Server::http(&[]).await;
    long_running_support::scenario_progress(&srv).await;
}
