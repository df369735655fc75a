//! Long-running cells over stdio: wait windows, busy sessions, input(),
//! interrupts and their escalation, time limits, progress, cancellation,
//! crashes, background output, reset of a busy session, and independence of
//! sessions while one is waited on.
//!
//! The scenarios at the end run over both transports: here over stdio, and
//! over streamable HTTP in `http`.

// The scenarios below, over streamable HTTP.
mod http;

use crate::support::{
    EVENT_TIMEOUT, LongRunningServer, assert_refused, assert_status, finish, py_path,
    wait_process_gone,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

#[tokio::test]
async fn exec_returns_running_after_its_window_and_wait_returns_the_rest() {
    let srv = LongRunningServer::stdio(&[]).await;
    scenario_wait_window(&srv).await;
}

#[tokio::test]
async fn exec_on_a_busy_session_is_refused_and_not_queued() {
    let srv = LongRunningServer::stdio(&[]).await;
    let code = format!("{}\n'first'", srv.py_gate("finish"));
    let running = srv.exec("default", &code, Some(0.2)).await;
    assert_status(&running, "running");
    let cell = running.cell();

    let refused = srv.exec("default", "refused_ran = True", Some(5.0)).await;
    assert_refused(
        &refused,
        &[
            "busy",
            &format!("cell {cell}"),
            "python_wait",
            "interrupt: true",
        ],
    );

    srv.open_gate("finish");
    let done = srv.wait("default", 30.0).await;
    assert_status(&done, "ok");
    assert_eq!(done.value(), Some("'first'"));
    assert_eq!(done.cell(), cell);

    // The refused code never ran, not even after the busy cell finished.
    let check = srv
        .exec("default", "'refused_ran' in globals()", None)
        .await;
    check.assert_ok();
    assert_eq!(check.value(), Some("False"), "{check:#?}");
    assert_eq!(
        check.cell(),
        cell + 1,
        "the refused call used no cell number"
    );
}

#[tokio::test]
async fn input_returns_waiting_input_and_python_wait_input_answers_it() {
    let srv = LongRunningServer::stdio(&["--default-wait", "30"]).await;
    scenario_input(&srv).await;
}

#[tokio::test]
async fn input_in_a_loop_is_answered_one_prompt_at_a_time() {
    let srv = LongRunningServer::stdio(&[]).await;
    let code = "answers = []\n\
                for i in range(3):\n\
                \x20   answer = input(f'q{i}? ')\n\
                \x20   print('got', answer)\n\
                \x20   answers.append(answer)\n\
                answers";
    let mut out = srv.exec("default", code, None).await;
    let cell = out.cell();
    for i in 0..3 {
        assert_status(&out, "waiting_input");
        assert_eq!(out.structured["prompt"], format!("q{i}? "), "{out:#?}");
        assert_eq!(out.cell(), cell);
        if i > 0 {
            let previous = format!("got a{}", i - 1);
            assert!(
                out.str_field("stdout").contains(&previous),
                "output before the prompt comes with it: {out:#?}"
            );
        }
        out = srv.input("default", &format!("a{i}")).await;
    }
    assert_status(&out, "ok");
    assert!(out.str_field("stdout").contains("got a2"), "{out:#?}");
    assert_eq!(out.value(), Some("['a0', 'a1', 'a2']"));
    assert_eq!(out.cell(), cell);
}

#[tokio::test]
async fn getpass_is_answered_without_showing_the_secret() {
    let srv = LongRunningServer::stdio(&[]).await;
    let secret = "s3cr3t-9431";
    let code = "import getpass\npin = getpass.getpass('PIN: ')\nprint('pin length', len(pin))";
    let asked = srv.exec("default", code, None).await;
    assert_status(&asked, "waiting_input");
    assert_eq!(asked.structured["prompt"], "PIN: ", "{asked:#?}");

    let answered = srv.input("default", secret).await;
    assert_status(&answered, "ok");
    assert!(
        answered.str_field("stdout").contains("pin length 11"),
        "{answered:#?}"
    );
    for out in [&asked, &answered] {
        assert!(!out.text.contains(secret), "secret echoed: {out:#?}");
        assert!(
            !out.structured.to_string().contains(secret),
            "secret echoed: {out:#?}"
        );
    }
}

#[tokio::test]
async fn stdin_readline_waits_for_input() {
    let srv = LongRunningServer::stdio(&[]).await;
    let code = "import sys\nline = sys.stdin.readline()\nprint('read', repr(line))";
    let asked = srv.exec("default", code, None).await;
    assert_status(&asked, "waiting_input");
    assert!(asked.structured["prompt"].is_string(), "{asked:#?}");

    let answered = srv.input("default", "xyz").await;
    assert_status(&answered, "ok");
    assert!(
        answered.str_field("stdout").contains("read 'xyz\\n'"),
        "{answered:#?}"
    );
}

#[tokio::test]
async fn input_eof_raises_eoferror() {
    let srv = LongRunningServer::stdio(&[]).await;
    let asked = srv.exec("default", "reply = input('more? ')", None).await;
    assert_status(&asked, "waiting_input");

    let closed = srv
        .call("python_wait", json!({ "session": "default", "eof": true }))
        .await;
    closed.assert_raised("EOFError");
    assert_eq!(closed.cell(), asked.cell());
}

#[tokio::test]
async fn python_wait_input_without_a_pending_prompt_is_refused() {
    let srv = LongRunningServer::stdio(&[]).await;
    // Nothing runs.
    srv.exec("default", "1", None).await.assert_ok();
    let idle = srv.input("default", "hello").await;
    assert_refused(&idle, &["not waiting for input"]);

    // A cell runs but has not asked for input.
    let code = format!("{}\n'finished'", srv.py_gate("finish"));
    let running = srv.exec("default", &code, Some(0.2)).await;
    assert_status(&running, "running");
    let busy = srv.input("default", "hello").await;
    assert_refused(&busy, &["not waiting for input"]);

    // The refused text was not fed to the cell later on.
    srv.open_gate("finish");
    let done = srv.wait("default", 30.0).await;
    assert_status(&done, "ok");
    assert_eq!(done.value(), Some("'finished'"));
    assert!(!done.text.contains("hello"), "{done:#?}");
}

#[tokio::test]
async fn interrupt_stops_a_busy_loop_and_keeps_state() {
    let srv = LongRunningServer::stdio(&[]).await;
    scenario_interrupt(&srv, "while True: pass", "looping").await;
}

#[tokio::test]
async fn interrupt_stops_a_sleep_and_keeps_state() {
    let srv = LongRunningServer::stdio(&[]).await;
    scenario_interrupt(&srv, "import time; time.sleep(100)", "sleeping").await;
}

#[tokio::test]
async fn an_ignored_interrupt_escalates_to_a_kill() {
    let mut srv = LongRunningServer::stdio(&["--interrupt-grace", "0.5"]).await;
    srv.exec("other", "untouched = 7", None).await.assert_ok();
    let other_pid = srv.pid("other").await;
    srv.exec("default", "doomed = 1", None).await.assert_ok();
    let pid_before = srv.pid("default").await;

    let code = format!(
        "import time\n{}\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass",
        srv.py_mark("swallowing")
    );
    let running = srv.exec("default", &code, Some(0.2)).await;
    assert_status(&running, "running");
    srv.wait_marker("swallowing").await;

    let stopped = srv.interrupt("default").await;
    assert_status(&stopped, "interrupted");
    assert_eq!(stopped.cell(), running.cell());
    let said = stopped.notes_text();
    assert!(said.contains("killed"), "notes: {said}\n{stopped:#?}");
    assert!(said.contains("lost"), "notes: {said}\n{stopped:#?}");
    assert!(
        stopped.text.contains("killed"),
        "the text says so too: {stopped:#?}"
    );
    srv.assert_alive();
    assert!(
        wait_process_gone(pid_before, EVENT_TIMEOUT).await,
        "the killed interpreter {pid_before} is still alive"
    );

    let fresh = srv.exec("default", "'doomed' in globals()", None).await;
    fresh.assert_ok();
    assert_eq!(fresh.value(), Some("False"), "{fresh:#?}");
    assert!(
        fresh.notes_text().contains("lost") || fresh.text.contains("lost"),
        "the next result says the state was lost: {fresh:#?}"
    );
    assert_ne!(srv.pid("default").await, pid_before);

    let other = srv.exec("other", "untouched", None).await;
    other.assert_ok();
    assert_eq!(other.value(), Some("7"));
    assert_eq!(
        srv.pid("other").await,
        other_pid,
        "other sessions untouched"
    );
}

#[tokio::test]
async fn the_time_limit_interrupts_a_long_cell() {
    let srv = LongRunningServer::stdio(&["--max-cell-seconds", "1"]).await;
    srv.exec("default", "kept = 5", None).await.assert_ok();
    let pid_before = srv.pid("default").await;

    let out = srv
        .exec("default", "import time; time.sleep(30)", Some(20.0))
        .await;
    assert_status(&out, "interrupted");
    assert_eq!(out.error_type(), "KeyboardInterrupt", "{out:#?}");
    assert!(
        out.notes_text().contains("time limit"),
        "a note names the time limit: {out:#?}"
    );

    let after = srv.exec("default", "kept", None).await;
    after.assert_ok();
    assert_eq!(after.value(), Some("5"), "state kept: {after:#?}");
    assert_eq!(srv.pid("default").await, pid_before);
}

#[tokio::test]
async fn progress_notifications_carry_the_latest_output() {
    let srv = LongRunningServer::stdio(&[]).await;
    scenario_progress(&srv).await;
}

#[tokio::test]
async fn cancelling_exec_interrupts_the_cell_and_keeps_state() {
    let srv = LongRunningServer::stdio(&[]).await;
    let code = format!(
        "import time\nx_before = 1\n{}\nwhile True: time.sleep(0.1)",
        srv.py_mark("started")
    );
    let handle = srv
        .start_call(
            "python_exec",
            json!({ "code": code, "session": "default", "wait_s": 60 }),
        )
        .await;
    srv.wait_marker("started").await;
    handle
        .cancel(Some("the test gave up".into()))
        .await
        .expect("send notifications/cancelled");

    // The cancelled call's cell ends: python_wait collects its (interrupted)
    // result, or gives it again if the cancelled call had taken it.
    let waited = srv.wait("default", 20.0).await;
    assert_status(&waited, "interrupted");
    let row = srv.session_row("default").await;
    assert_eq!(row["state"], "idle", "{row:#}");
    assert!(row["running_cell"].is_null(), "{row:#}");

    let kept = srv.exec("default", "x_before", None).await;
    kept.assert_ok();
    assert_eq!(kept.value(), Some("1"), "state kept: {kept:#?}");
}

#[tokio::test]
async fn an_interpreter_killed_between_cells_is_replaced() {
    let srv = LongRunningServer::stdio(&[]).await;
    srv.exec("default", "gone = 1", None).await.assert_ok();
    let pid = srv.pid("default").await;

    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill the interpreter");
    let row = srv.wait_state("default", "dead").await;
    assert!(row["pid"].is_null(), "a dead session shows no pid: {row:#}");

    let fresh = srv.exec("default", "'gone' in globals()", None).await;
    fresh.assert_ok();
    assert_eq!(fresh.value(), Some("False"));
    assert!(
        fresh.notes_text().contains("lost"),
        "the result says the state was lost: {fresh:#?}"
    );
    assert!(fresh.text.contains("lost"), "{fresh:#?}");
    assert_ne!(srv.pid("default").await, pid);
}

#[tokio::test]
async fn an_interpreter_killed_during_a_cell_is_reported_crashed() {
    let mut srv = LongRunningServer::stdio(&[]).await;
    let out = srv
        .exec(
            "default",
            "import os, time\nprint('before', flush=True)\ntime.sleep(0.2)\nos.kill(os.getpid(), 9)",
            None,
        )
        .await;
    assert_status(&out, "crashed");
    assert!(out.str_field("stdout").contains("before"), "{out:#?}");
    let said = out.notes_text();
    assert!(
        said.contains("SIGKILL") || said.contains("signal 9"),
        "notes name the signal: {said}\n{out:#?}"
    );
    srv.assert_alive();

    let next = srv.exec("default", "1 + 1", None).await;
    next.assert_ok();
    assert_eq!(next.value(), Some("2"));
}

#[tokio::test]
async fn output_of_a_background_thread_comes_with_the_next_result() {
    let srv = LongRunningServer::stdio(&[]).await;
    let code = format!(
        "import threading\n\
         def late():\n\
         \x20   {gate}\n\
         \x20   print('late line', flush=True)\n\
         \x20   open({marker}, 'w').write('printed\\n')\n\
         threading.Thread(target=late).start()\n\
         'started'",
        gate = srv.py_gate("print"),
        marker = py_path(&srv.file("printed")),
    );
    let first = srv.exec("default", &code, None).await;
    first.assert_ok();
    assert!(!first.str_field("stdout").contains("late line"));

    // The thread prints only after cell 1 finished, and the marker is written
    // after the line was flushed.
    srv.open_gate("print");
    srv.wait_marker("printed").await;

    let second = srv.exec("default", "'second'", None).await;
    second.assert_ok();
    let background = second.structured["background_output"]
        .as_str()
        .unwrap_or_else(|| panic!("no background_output: {second:#?}"));
    assert!(background.contains("late line"), "{second:#?}");
    assert!(
        !second.str_field("stdout").contains("late line"),
        "background output is not the cell's own: {second:#?}"
    );
    assert!(second.text.contains("late line"), "{second:#?}");
    assert!(
        second.text.contains("background"),
        "the text marks it as background output: {second:#?}"
    );
    assert_eq!(second.value(), Some("'second'"));
}

#[tokio::test]
async fn reset_of_a_busy_session_gives_a_new_interpreter() {
    let srv = LongRunningServer::stdio(&[]).await;
    let code = format!("{}\nwhile True: pass", srv.py_mark("looping"));
    let running = srv.exec("default", &code, Some(0.2)).await;
    assert_status(&running, "running");
    srv.wait_marker("looping").await;
    let old_pid = srv.pid("default").await;

    let reset = srv
        .call(
            "python_sessions",
            json!({ "action": "reset", "session": "default" }),
        )
        .await;
    assert!(!reset.is_error, "{reset:#?}");

    let row = srv.session_row("default").await;
    assert_eq!(row["state"], "idle", "{row:#}");
    let new_pid = row["pid"].as_u64().expect("a pid after reset") as u32;
    assert_ne!(new_pid, old_pid);
    assert!(
        wait_process_gone(old_pid, EVENT_TIMEOUT).await,
        "the old interpreter {old_pid} is still alive"
    );

    let works = srv.exec("default", "21 * 2", None).await;
    works.assert_ok();
    assert_eq!(works.value(), Some("42"));
}

#[tokio::test]
async fn waiting_on_one_session_does_not_delay_another() {
    let srv = LongRunningServer::stdio(&[]).await;
    let code = format!("{}\n'a done'", srv.py_gate("release_a"));
    let running = srv.exec("a", &code, Some(0.2)).await;
    assert_status(&running, "running");

    // The wait on A is sent first and cannot end before the gate opens
    // (its window is far longer than the test).
    let mut wait_a = srv
        .start_call("python_wait", json!({ "session": "a", "wait_s": 60 }))
        .await;

    let on_b = srv.exec("b", "6 * 7", None).await;
    on_b.assert_ok();
    assert_eq!(on_b.value(), Some("42"));
    assert!(
        matches!(
            wait_a.rx.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        ),
        "the wait on session a must still be pending while b answered"
    );

    srv.open_gate("release_a");
    let done_a = finish(wait_a).await;
    assert_status(&done_a, "ok");
    assert_eq!(done_a.value(), Some("'a done'"));
}

// ------------------------------------------------------------------ scenarios
// Each one runs against a fresh server, over either transport (the HTTP runs
// are in `http`).

/// A cell outliving its wait window returns `running` with the output so far;
/// python_wait then returns the rest, and only the rest.
pub(crate) async fn scenario_wait_window(srv: &LongRunningServer) {
    let code = format!(
        "print('start', flush=True)\n{}\nprint('end')\n'done'",
        srv.py_gate("finish")
    );
    let first = srv.exec("default", &code, Some(1.0)).await;
    assert_status(&first, "running");
    assert!(first.str_field("stdout").contains("start"), "{first:#?}");
    assert!(!first.str_field("stdout").contains("end"), "{first:#?}");
    assert!(first.value().is_none(), "{first:#?}");
    assert!(
        first.text.contains("python_wait"),
        "a running result tells how to go on: {first:#?}"
    );

    srv.open_gate("finish");
    let rest = srv.wait("default", 30.0).await;
    assert_status(&rest, "ok");
    assert!(rest.str_field("stdout").contains("end"), "{rest:#?}");
    assert!(
        !rest.str_field("stdout").contains("start"),
        "python_wait must return only new output: {rest:#?}"
    );
    assert_eq!(rest.value(), Some("'done'"));
    assert_eq!(rest.cell(), first.cell(), "same cell: {first:#?} {rest:#?}");
    assert_eq!(rest.str_field("session"), "default");

    // Its result was collected: waiting again gives the same result again,
    // saying so (for a client whose response was lost), and runs nothing.
    let again = srv.wait("default", 1.0).await;
    assert_status(&again, "ok");
    assert_eq!(again.cell(), first.cell(), "same cell: {again:#?}");
    assert_eq!(again.value(), Some("'done'"), "{again:#?}");
    assert!(
        again.notes_text().contains("Sent again"),
        "a repeated result says it was delivered before: {again:#?}"
    );
}

/// input() makes the call return `waiting_input` with the prompt, and
/// python_wait {input} answers it.
pub(crate) async fn scenario_input(srv: &LongRunningServer) {
    // No wait_s: the default window (30 s) is far longer than the test, so a
    // waiting_input status shows the call returned on the prompt itself.
    let asked = srv
        .exec(
            "default",
            "name = input(\"Name: \")\nprint(\"hello\", name)",
            None,
        )
        .await;
    assert_status(&asked, "waiting_input");
    assert_eq!(asked.structured["prompt"], "Name: ", "{asked:#?}");
    assert!(
        asked.text.contains("python_wait {input: ...}"),
        "{asked:#?}"
    );

    let answered = srv.input("default", "Alice").await;
    assert_status(&answered, "ok");
    assert!(
        answered.str_field("stdout").contains("hello Alice"),
        "{answered:#?}"
    );
    assert_eq!(answered.cell(), asked.cell());
    assert!(answered.structured["prompt"].is_null(), "{answered:#?}");

    // The answer stays in the session.
    let kept = srv.exec("default", "name", None).await;
    kept.assert_ok();
    assert_eq!(kept.value(), Some("'Alice'"));
}

/// python_wait {interrupt: true} stops a cell with KeyboardInterrupt and keeps the state
/// and the interpreter.
pub(crate) async fn scenario_interrupt(srv: &LongRunningServer, body: &str, marker: &str) {
    srv.exec("default", "kept = 42", None).await.assert_ok();
    let pid_before = srv.pid("default").await;

    let code = format!("{}\n{body}", srv.py_mark(marker));
    let running = srv.exec("default", &code, Some(0.3)).await;
    assert_status(&running, "running");
    // The interrupt must hit the loop itself, not the start of the cell.
    srv.wait_marker(marker).await;

    let stopped = srv.interrupt("default").await;
    assert_status(&stopped, "interrupted");
    assert_eq!(stopped.error_type(), "KeyboardInterrupt", "{stopped:#?}");
    assert_eq!(stopped.cell(), running.cell());
    let traceback = stopped.structured["error"]["traceback"]
        .as_str()
        .unwrap_or_else(|| panic!("no traceback: {stopped:#?}"));
    assert!(traceback.contains("<cell"), "{traceback}");
    assert!(
        !traceback.contains("ferrepl-driver"),
        "the traceback shows driver frames: {traceback}"
    );

    let after = srv.exec("default", "kept", None).await;
    after.assert_ok();
    assert_eq!(after.value(), Some("42"), "state must survive: {after:#?}");
    assert_eq!(
        srv.pid("default").await,
        pid_before,
        "an interrupt keeps the interpreter"
    );

    // Nothing runs now: interrupting is refused.
    let idle = srv.interrupt("default").await;
    assert_refused(&idle, &["no running cell"]);
}

/// A call carrying a progress token gets notifications/progress with the
/// latest output line while the cell runs.
pub(crate) async fn scenario_progress(srv: &LongRunningServer) {
    // The cell keeps printing steps until the test has seen a progress
    // notification with one of them, so the test does not depend on timing.
    let code = format!(
        "import os, time\n\
         for i in range(1000):\n\
         \x20   print('step', i, flush=True)\n\
         \x20   if os.path.exists({}):\n\
         \x20       break\n\
         \x20   time.sleep(0.2)\n\
         'steps done'",
        py_path(&srv.file("enough"))
    );
    let handle = srv
        .start_call(
            "python_exec",
            json!({ "code": code, "session": "default", "wait_s": 60 }),
        )
        .await;
    let token = handle.progress_token.clone();
    srv.recorder
        .wait_progress(&token, |p| {
            p.message.as_deref().is_some_and(|m| m.contains("step"))
        })
        .await;
    srv.open_gate("enough");

    let result = finish(handle).await;
    assert_status(&result, "ok");
    assert_eq!(result.value(), Some("'steps done'"));

    let seen = srv.recorder.progress_for(&token);
    assert!(!seen.is_empty());
    for pair in seen.windows(2) {
        assert!(
            pair[1].progress > pair[0].progress,
            "progress values must increase: {seen:#?}"
        );
    }
}
