//! Long R cells: running on past the wait window, interrupts that keep the
//! state, readline/readLines/menu answered through r_wait, browser() refused.

use super::{
    assert_r_ok, assert_r_status, assert_text_has, r_exec, r_exec_in, r_server, r_wait, session_pid,
};
use crate::support::{StdioServer, ToolOutput, assert_refused};
use serde_json::json;

/// Starts `code` in the default R session with a 1 s window: it must come
/// back "running" (the code runs much longer). Returns that result.
async fn start_long_cell(server: &StdioServer, code: &str) -> ToolOutput {
    let running = r_exec_in(server, "r", code, 1.0).await;
    assert_r_status(&running, "running", "r");
    assert!(
        running.text.contains("r_wait") && !running.text.contains("python_wait"),
        "a running R cell points to r_wait: {running:#?}"
    );
    running
}

/// Interrupts the running cell of session "r" and checks that `keep`
/// (set before) survived.
async fn interrupt_and_check_state(server: &StdioServer, running: &ToolOutput) -> ToolOutput {
    let stopped = r_wait(server, json!({ "interrupt": true })).await;
    assert_r_status(&stopped, "interrupted", "r");
    assert_eq!(stopped.cell(), running.cell(), "{stopped:#?}");

    let kept = r_exec(server, "keep").await;
    assert_r_ok(&kept);
    assert_text_has(&kept, &["[1] 42"]);
    assert_eq!(kept.cell(), running.cell() + 1, "{kept:#?}");
    stopped
}

#[tokio::test]
async fn a_sleeping_cell_runs_on_and_an_interrupt_keeps_the_state() {
    let server = r_server().await;
    assert_r_ok(&r_exec(&server, "keep <- 42").await);
    let pid = session_pid(&server, "r").await;
    let running = start_long_cell(&server, "cat('started\\n'); Sys.sleep(30)").await;
    let cell = running.cell();

    // Between cells only: inspect says the session is busy.
    let busy = server.call("r_inspect", json!({})).await;
    assert_refused(&busy, &["busy", &format!("cell {cell}"), "r_wait"]);
    let refused = r_exec(&server, "keep <- 0").await;
    assert_refused(&refused, &["busy", &format!("cell {cell}"), "r_wait"]);

    let stopped = interrupt_and_check_state(&server, &running).await;
    assert!(
        format!("{}{}", running.text, stopped.text).contains("started"),
        "the output printed before the sleep is returned:\n{}\n{}",
        running.text,
        stopped.text
    );
    assert_eq!(
        session_pid(&server, "r").await,
        pid,
        "an interrupt keeps the interpreter"
    );
}

#[tokio::test]
async fn a_busy_loop_is_interrupted_the_same_way() {
    let server = r_server().await;
    assert_r_ok(&r_exec(&server, "keep <- 42").await);
    let pid = session_pid(&server, "r").await;
    let running = start_long_cell(&server, "cat('looping\\n'); repeat {}").await;
    interrupt_and_check_state(&server, &running).await;
    assert_eq!(session_pid(&server, "r").await, pid);
}

#[tokio::test]
async fn readline_waits_for_input_and_r_wait_answers_it() {
    let server = r_server().await;
    let asked = r_exec(&server, "x <- readline('name? '); cat('hello', x, '\\n')").await;
    assert_r_status(&asked, "waiting_input", "r");
    assert_eq!(asked.structured["prompt"], "name? ", "{asked:#?}");
    assert!(
        asked.text.contains("r_wait") && !asked.text.contains("python_wait"),
        "{asked:#?}"
    );

    let answered = r_wait(&server, json!({ "input": "Ada" })).await;
    assert_r_ok(&answered);
    assert_eq!(answered.cell(), asked.cell());
    assert!(
        answered.str_field("stdout").contains("hello Ada"),
        "{answered:#?}"
    );
    let kept = r_exec(&server, "x").await;
    assert_text_has(&kept, &["[1] \"Ada\""]);
}

#[tokio::test]
async fn readlines_on_stdin_and_menu_are_answered_too() {
    let server = r_server().await;
    let asked = r_exec(
        &server,
        "l <- readLines('stdin', n = 1); cat('got', l, '\\n')",
    )
    .await;
    assert_r_status(&asked, "waiting_input", "r");
    let answered = r_wait(&server, json!({ "input": "zz-top" })).await;
    assert_r_ok(&answered);
    assert!(
        answered.str_field("stdout").contains("got zz-top"),
        "{answered:#?}"
    );

    let menu = r_exec(&server, "menu(c('a', 'b'))").await;
    assert_r_status(&menu, "waiting_input", "r");
    assert_eq!(menu.structured["prompt"], "Selection: ", "{menu:#?}");
    let chosen = r_wait(&server, json!({ "input": "2" })).await;
    assert_r_ok(&chosen);
    assert_text_has(&chosen, &["[1] 2"]);
}

#[tokio::test]
async fn browser_is_an_error_not_a_hang() {
    let server = r_server().await;
    let out = r_exec(&server, "f <- function() { browser(); 1 }; f()").await;
    assert_r_status(&out, "error", "r");
    let message = out.structured["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("browser()") && message.contains("interactive"),
        "the error should say browser() needs an interactive console: {out:#?}"
    );
    assert_r_ok(&r_exec(&server, "1").await);
}
