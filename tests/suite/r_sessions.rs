//! R sessions (`--languages python,r`): the r_* tools, console-like
//! results (printed values, warnings, errors with backtraces), long cells
//! (wait, interrupt, readline), plots as PNG images, help, inspect and
//! completion, truncated output, crashes, the sandbox, r_install from a
//! local source package, Python and R side by side, and one round trip over
//! HTTP.
//!
//! Every server here is started with `--languages python,r` and the full
//! tool surface. Cells that should be quick get a generous `wait_s`
//! (`QUICK_WAIT_S`): a cell that hangs comes back "running", which fails the
//! test instead of hanging it. Long cells are followed through the server's
//! own statuses (running, waiting_input, interrupted), never through sleeps.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::Path;

use crate::support::{
    HttpServer, ImageBlock, StdioServer, ToolOutput, assert_failed, assert_one_png, assert_refused,
    assert_status, assert_succeeded, call, content_kinds, everything, image_blocks, path_str,
    png_size, session_names, tool_names, unique,
};
use serde_json::{Value, json};

/// The flag every R server here starts with.
const R_LANGS: &[&str] = &["--languages", "python,r"];
/// Every R tool of the full surface.
const R_TOOLS: &[&str] = &[
    "r_exec",
    "r_wait",
    "r_output",
    "r_inspect",
    "r_complete",
    "r_install",
];
/// wait_s of cells that should finish quickly (under CALL_TIMEOUT).
const QUICK_WAIT_S: f64 = 30.0;
/// wait_s of cells that load ggplot2 or build packages (under CALL_TIMEOUT).
const SLOW_WAIT_S: f64 = 50.0;

// ------------------------------------------------------------------ helpers

async fn r_server() -> StdioServer {
    StdioServer::start(R_LANGS).await
}

/// r_exec in the default R session ("r").
async fn r_exec(server: &StdioServer, code: &str) -> ToolOutput {
    server
        .call("r_exec", json!({ "code": code, "wait_s": QUICK_WAIT_S }))
        .await
}

/// r_exec in `session` with an explicit wait window.
async fn r_exec_in(server: &StdioServer, session: &str, code: &str, wait_s: f64) -> ToolOutput {
    server
        .call(
            "r_exec",
            json!({ "code": code, "session": session, "wait_s": wait_s }),
        )
        .await
}

/// r_wait on the default R session with `args` (plus a generous wait_s).
async fn r_wait(server: &StdioServer, mut args: Value) -> ToolOutput {
    if args.get("wait_s").is_none() {
        args["wait_s"] = json!(QUICK_WAIT_S);
    }
    server.call("r_wait", args).await
}

/// The last non-empty line of a result's text (the status line).
fn footer(out: &ToolOutput) -> &str {
    out.text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_else(|| panic!("empty text in {out:#?}"))
}

/// Panics unless the result has `status` and its text ends with the status
/// line `-- <status> | cell N | session <session> | ... --`.
fn assert_r_status(out: &ToolOutput, status: &str, session: &str) {
    assert_status(out, status);
    assert_eq!(out.str_field("session"), session, "session of {out:#?}");
    let line = footer(out);
    let head = format!("-- {status} | cell {} | session {session} |", out.cell());
    assert!(
        line.starts_with(&head) && line.trim_end().ends_with("--"),
        "the status line should start with {head:?} and end with '--', got {line:?} in:\n{}",
        out.text
    );
}

/// Panics unless this is a successful cell of the default R session.
fn assert_r_ok(out: &ToolOutput) {
    assert_r_status(out, "ok", "r");
}

/// Panics unless the result's text contains every one of `needles`.
fn assert_text_has(out: &ToolOutput, needles: &[&str]) {
    for needle in needles {
        assert!(
            out.text.contains(needle),
            "the text lacks {needle:?}:\n{}\n{out:#?}",
            out.text
        );
    }
}

/// The python_sessions row of `name`.
async fn session_row(server: &StdioServer, name: &str) -> Value {
    crate::support::session_row(server.peer(), name).await
}

/// The interpreter pid python_sessions gives for `name`.
async fn session_pid(server: &StdioServer, name: &str) -> u32 {
    crate::support::session_pid(server.peer(), name).await
}

/// An R string literal for `s` (JSON strings are valid R literals for the
/// ASCII paths and markers used here).
fn r_str(s: &str) -> String {
    serde_json::to_string(s).expect("encode a string")
}

/// R prelude of the probing cells: `attempt(label, expr)` prints one line
/// `label: OK` or `label: Error <message>` / `label: Warning <message>`,
/// which `support::outcome` reads back.
const R_ATTEMPT: &str = r#"
attempt <- function(label, expr) {
  got <- tryCatch({ force(expr); 'OK' },
    warning = function(w) paste('Warning', conditionMessage(w)),
    error = function(e) paste('Error', conditionMessage(e)))
  cat(label, ': ', gsub('\n', ' ', got), '\n', sep = '')
}
"#;

// ------------------------------------------------------------------ tool surface

#[tokio::test]
async fn r_tools_are_listed_only_when_r_is_enabled() {
    let python_only = StdioServer::start(&[]).await;
    let names = tool_names(python_only.peer()).await;
    for tool in R_TOOLS {
        assert!(
            !names.iter().any(|n| n == tool),
            "{tool} is listed without --languages r: {names:?}"
        );
    }
    assert!(names.iter().any(|n| n == "python_exec"), "{names:?}");
    match python_only
        .try_call("r_exec", json!({ "code": "1 + 1" }))
        .await
    {
        Err(_) => {}
        Ok(result) => assert_eq!(
            result.is_error,
            Some(true),
            "r_exec on a server without R must fail: {result:#?}"
        ),
    }
    // The Python tools work as before.
    let py = python_only.exec("6 * 7").await;
    py.assert_ok();
    assert_eq!(py.value(), Some("42"));
    let listing = python_only.call("python_sessions", json!({})).await;
    assert!(!listing.is_error, "{listing:#?}");
    for row in listing.structured["sessions"].as_array().expect("sessions") {
        assert_eq!(row["language"], "python", "{row:#}");
    }

    let with_r = r_server().await;
    let names = tool_names(with_r.peer()).await;
    for tool in R_TOOLS.iter().chain(&["python_exec", "python_sessions"]) {
        assert!(
            names.iter().any(|n| n == tool),
            "{tool} missing with --languages python,r: {names:?}"
        );
    }
}

#[tokio::test]
async fn the_default_tool_groups_hold_the_core_r_tools() {
    let server = StdioServer::start_plain(R_LANGS).await;
    let names = tool_names(server.peer()).await;
    for tool in ["r_exec", "r_wait", "r_output", "r_inspect", "r_install"] {
        assert!(names.iter().any(|n| n == tool), "{tool} missing: {names:?}");
    }
    assert!(
        !names.iter().any(|n| n == "r_complete"),
        "r_complete is in the 'more' group, not a default one: {names:?}"
    );
    let out = server.call("r_exec", json!({ "code": "1 + 1" })).await;
    assert!(!out.is_error, "{out:#?}");
    assert!(out.text.contains("[1] 2"), "{out:#?}");
}

// ------------------------------------------------------------------ results

#[tokio::test]
async fn visible_values_print_as_in_the_console_and_variables_persist() {
    let server = r_server().await;
    let two = r_exec(&server, "1+1").await;
    assert_r_ok(&two);
    assert_text_has(&two, &["[1] 2"]);
    assert_eq!(two.str_field("stdout"), "[1] 2\n", "{two:#?}");

    let assigned = r_exec(&server, "x <- 5").await;
    assert_r_ok(&assigned);
    assert_eq!(assigned.str_field("stdout"), "", "{assigned:#?}");
    assert_eq!(assigned.cell(), two.cell() + 1, "{assigned:#?}");

    let hidden = r_exec(&server, "invisible(3)").await;
    assert_r_ok(&hidden);
    assert!(!hidden.text.contains("[1] 3"), "{hidden:#?}");
    assert_eq!(hidden.str_field("stdout"), "", "{hidden:#?}");

    let kept = r_exec(&server, "x").await;
    assert_r_ok(&kept);
    assert_text_has(&kept, &["[1] 5"]);

    // A print method's leading blank lines are dropped (summary.lm starts
    // with "\nCall:"); what a cell cat()s is kept as written.
    let summary = r_exec(&server, "summary(lm(mpg ~ wt, mtcars))").await;
    assert_r_ok(&summary);
    assert!(
        summary.str_field("stdout").starts_with("Call:\n"),
        "{summary:#?}"
    );
    let written = r_exec(&server, "cat('\\nhi\\n')").await;
    assert_eq!(written.str_field("stdout"), "\nhi\n", "{written:#?}");

    let string = r_exec(&server, "paste('a', x)\nx * 2").await;
    assert_r_ok(&string);
    let text = &string.text;
    let (first, second) = (text.find("[1] \"a 5\""), text.find("[1] 10"));
    assert!(
        first.is_some() && second.is_some() && first < second,
        "both top-level values print, in order:\n{text}"
    );
}

#[tokio::test]
async fn stdout_stderr_and_subprocess_output_are_captured() {
    let server = r_server().await;
    let out = r_exec(&server, "cat('a\\n'); message('b')").await;
    assert_r_ok(&out);
    assert_eq!(out.str_field("stdout"), "a\n", "{out:#?}");
    assert_eq!(out.str_field("stderr"), "b\n", "{out:#?}");
    assert_text_has(&out, &["a\n", "b\n"]);

    let shell = r_exec(&server, "system('echo hi-from-sh')").await;
    assert_r_ok(&shell);
    assert!(
        shell.str_field("stdout").contains("hi-from-sh"),
        "{shell:#?}"
    );
}

#[tokio::test]
async fn messages_and_printed_output_keep_their_order() {
    let server = r_server().await;
    // Without ordering the server would read stdout and stderr as they come.
    let code = "for (i in 1:20) { cat('out', i, '\\n'); message('msg ', i); print(i) }";
    let out = r_exec(&server, code).await;
    assert_r_ok(&out);
    let mut expected = String::new();
    for i in 1..=20 {
        expected.push_str(&format!("out {i} \nmsg {i}\n[1] {i}\n"));
    }
    assert!(
        out.text.starts_with(&expected),
        "stdout and stderr interleaved out of order:\n{}",
        out.text
    );
}

#[tokio::test]
async fn warnings_come_after_the_output() {
    let server = r_server().await;
    let out = r_exec(&server, "f <- function() { warning('careful'); 1 }; f()").await;
    assert_r_ok(&out);
    let text = &out.text;
    let value = text.find("[1] 1").unwrap_or_else(|| panic!("{text}"));
    let warning = text
        .find("Warning message")
        .unwrap_or_else(|| panic!("no 'Warning message' in:\n{text}"));
    let message = text
        .rfind("careful")
        .unwrap_or_else(|| panic!("no 'careful' in:\n{text}"));
    assert!(
        value < warning && warning < message,
        "the warning should follow the value:\n{text}"
    );
}

#[tokio::test]
async fn an_error_names_its_call_and_has_a_backtrace_and_the_session_survives() {
    let server = r_server().await;
    let out = r_exec(
        &server,
        "g <- function(x) stop('boom'); f <- function() g(2); f()",
    )
    .await;
    assert_r_status(&out, "error", "r");
    assert_eq!(out.error_type(), "simpleError", "{out:#?}");
    assert_eq!(out.structured["error"]["message"], "boom", "{out:#?}");
    let text = &out.text;
    assert_text_has(&out, &["Error in g(2) : boom", "Backtrace:"]);
    let trace = &text[text.find("Backtrace:").expect("Backtrace")..];
    let f_at = trace
        .find("f()")
        .unwrap_or_else(|| panic!("no f() in:\n{trace}"));
    let g_at = trace
        .find("g(2)")
        .unwrap_or_else(|| panic!("no g(2) in:\n{trace}"));
    assert!(f_at < g_at, "the backtrace lists f() then g(2):\n{trace}");
    let traceback = out.structured["error"]["traceback"]
        .as_str()
        .unwrap_or_default();
    assert!(traceback.contains("Backtrace:"), "{out:#?}");

    let next = r_exec(&server, "'still here'").await;
    assert_r_ok(&next);
    assert_text_has(&next, &["[1] \"still here\""]);
}

/// install.packages() in a session has no mirror and no network: the
/// error names r_install with the packages asked for (R's own said only
/// "trying to use CRAN without setting a mirror"). A repos of the caller's
/// (NULL: local files) still reaches R's own install.packages.
#[tokio::test]
async fn install_packages_in_a_session_points_to_r_install() {
    let server = r_server().await;
    for code in [
        "install.packages(c('data.table', 'zoo'))",
        "utils::install.packages(c('data.table', 'zoo'))",
    ] {
        let out = r_exec(&server, code).await;
        assert_r_status(&out, "error", "r");
        assert_text_has(
            &out,
            &[
                r#"r_install {"packages": ["data.table", "zoo"]}"#,
                ".ferrepl/r-library",
            ],
        );
        assert!(
            !out.text.contains("without setting a mirror"),
            "{code}: R's own message, not the hint:\n{}",
            out.text
        );
    }
    let local = r_exec(
        &server,
        "install.packages('no-such-package_1.0.tar.gz', repos = NULL, type = 'source')",
    )
    .await;
    assert!(
        !local.text.contains("r_install"),
        "install.packages with repos = NULL is R's own:\n{}",
        local.text
    );
    let next = r_exec(&server, "'still here'").await;
    assert_r_ok(&next);
}

#[tokio::test]
async fn incomplete_input_and_parse_errors_are_typed() {
    let server = r_server().await;
    let incomplete = r_exec(&server, "f <- function(x) {\n  x + 1").await;
    assert_r_status(&incomplete, "error", "r");
    assert_eq!(
        incomplete.error_type(),
        "IncompleteInput",
        "{incomplete:#?}"
    );
    let message = incomplete.structured["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("missing") && message.contains('}'),
        "the message should say a '}}' is missing: {incomplete:#?}"
    );

    let invalid = r_exec(&server, "x <- <- 1").await;
    assert_r_status(&invalid, "error", "r");
    assert_eq!(invalid.error_type(), "ParseError", "{invalid:#?}");

    // Nothing of either cell ran.
    let check = r_exec(&server, "c(exists('f', inherits = FALSE), exists('x'))").await;
    assert_r_ok(&check);
    assert_text_has(&check, &["[1] FALSE FALSE"]);
}

// ------------------------------------------------------------------ sessions

#[tokio::test]
async fn r_sessions_are_listed_beside_python_ones_with_their_language() {
    let server = r_server().await;
    assert_r_ok(&r_exec(&server, "1").await);
    server.exec("1").await.assert_ok();
    let named = r_exec_in(&server, "stats", "y <- 2", QUICK_WAIT_S).await;
    assert_r_status(&named, "ok", "stats");

    let r = session_row(&server, "r").await;
    assert_eq!(r["language"], "r", "{r:#}");
    let interpreter = r["interpreter"].as_str().unwrap_or_default();
    assert!(
        interpreter.contains('R') && !interpreter.contains("python"),
        "the R session's interpreter: {r:#}"
    );
    assert_eq!(session_row(&server, "stats").await["language"], "r");
    let py = session_row(&server, "default").await;
    assert_eq!(py["language"], "python", "{py:#}");
    assert!(
        py["interpreter"]
            .as_str()
            .is_some_and(|i| i.contains("python")),
        "{py:#}"
    );
}

#[tokio::test]
async fn reset_and_delete_work_on_r_sessions() {
    let server = r_server().await;
    assert_r_ok(&r_exec(&server, "z <- 5").await);
    let other = r_exec_in(&server, "other", "w <- 1", QUICK_WAIT_S).await;
    assert_r_status(&other, "ok", "other");
    let old_pid = session_pid(&server, "r").await;

    let reset = server
        .call(
            "python_sessions",
            json!({ "action": "reset", "session": "r" }),
        )
        .await;
    assert!(!reset.is_error, "reset of an R session: {reset:#?}");
    let gone = r_exec(&server, "exists('z')").await;
    assert_r_ok(&gone);
    assert_text_has(&gone, &["[1] FALSE"]);
    assert_ne!(
        session_pid(&server, "r").await,
        old_pid,
        "a new interpreter"
    );
    assert_eq!(session_row(&server, "r").await["language"], "r");

    let delete = server
        .call(
            "python_sessions",
            json!({ "action": "delete", "session": "other" }),
        )
        .await;
    assert!(!delete.is_error, "delete of an R session: {delete:#?}");
    let names = session_names(server.peer()).await;
    assert!(!names.iter().any(|n| n == "other"), "{names:?}");
    assert!(names.iter().any(|n| n == "r"), "{names:?}");
}

#[tokio::test]
async fn tools_of_one_language_refuse_sessions_of_the_other() {
    let server = r_server().await;
    server.exec("py_x = 1").await.assert_ok();
    assert_r_ok(&r_exec(&server, "r_x <- 1").await);

    let r_on_py = [
        ("r_exec", json!({ "code": "1", "session": "default" })),
        ("r_wait", json!({ "session": "default" })),
        ("r_inspect", json!({ "session": "default" })),
        ("r_output", json!({ "session": "default" })),
        ("r_complete", json!({ "code": "pri", "session": "default" })),
    ];
    for (tool, args) in r_on_py {
        let out = server.call(tool, args).await;
        assert_refused(
            &out,
            &["'default'", "Python session", "R tools cannot use it"],
        );
    }
    let py_on_r = [
        ("python_exec", json!({ "code": "1", "session": "r" })),
        ("python_wait", json!({ "session": "r" })),
        ("python_inspect", json!({ "session": "r" })),
        ("python_output", json!({ "session": "r" })),
    ];
    for (tool, args) in py_on_r {
        let out = server.call(tool, args).await;
        assert_refused(&out, &["'r'", "R session", "Python tools cannot use it"]);
    }
    let install = server
        .call(
            "r_install",
            json!({ "packages": ["ggplot2"], "session": "default" }),
        )
        .await;
    assert_refused(&install, &["Python session", "R tools"]);

    // Both sessions are untouched.
    let py = server.exec("py_x").await;
    py.assert_ok();
    assert_eq!(py.value(), Some("1"));
    assert_text_has(&r_exec(&server, "r_x").await, &["[1] 1"]);
}

// ------------------------------------------------------------------ long cells

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

// ------------------------------------------------------------------ plots

/// Panics unless `image` is a PNG of about 700x500 (7x5 in at 100 dpi).
fn assert_seven_by_five(image: &ImageBlock) {
    assert_eq!(image.mime, "image/png");
    let (width, height) = png_size(&image.data);
    assert!(
        (665..=735).contains(&width) && (475..=525).contains(&height),
        "a plot should be about 700x500 pixels, got {width}x{height}"
    );
}

#[tokio::test]
async fn a_plot_is_one_png_of_seven_by_five_inches() {
    let server = r_server().await;
    let out = r_exec(&server, "plot(1:10)").await;
    assert_r_ok(&out);
    assert_one_png(&out);
    assert_seven_by_five(&image_blocks(&out)[0]);

    // The plot was sent once: the next cell has no image.
    let after = r_exec(&server, "1").await;
    assert_r_ok(&after);
    assert!(image_blocks(&after).is_empty(), "{after:#?}");
}

#[tokio::test]
async fn two_plots_in_one_cell_are_two_images_in_order() {
    let server = r_server().await;
    // A nearly empty plot, then a dense cloud of points (a much bigger PNG).
    let code = "plot(1:2, axes = FALSE, ann = FALSE)\n\
                set.seed(1); plot(runif(3000), runif(3000))";
    let out = r_exec(&server, code).await;
    assert_r_ok(&out);
    let images = image_blocks(&out);
    assert_eq!(
        images.len(),
        2,
        "content kinds {:?}, text:\n{}",
        content_kinds(&out),
        out.text
    );
    for image in &images {
        assert_seven_by_five(image);
    }
    assert!(
        images[0].data.len() < images[1].data.len(),
        "the sparse plot comes first: {} vs {} bytes",
        images[0].data.len(),
        images[1].data.len()
    );
    let display = out.display();
    assert_eq!(display.len(), 2, "{display:#?}");
    let first = out.text.find("[image 1: image/png").expect("placeholder 1");
    let second = out.text.find("[image 2: image/png").expect("placeholder 2");
    assert!(first < second, "{}", out.text);
}

#[tokio::test]
async fn ggplot_objects_are_drawn_when_visible_or_printed() {
    let server = r_server().await;
    let code = "library(ggplot2); ggplot(mtcars, aes(wt, mpg)) + geom_point()";
    let visible = r_exec_in(&server, "r", code, SLOW_WAIT_S).await;
    assert_r_ok(&visible);
    assert_one_png(&visible);
    assert_seven_by_five(&image_blocks(&visible)[0]);

    let code = "p <- ggplot(mtcars, aes(wt, mpg)) + geom_point(); print(p)";
    let printed = r_exec_in(&server, "r", code, SLOW_WAIT_S).await;
    assert_r_ok(&printed);
    assert_one_png(&printed);

    // Assigned and not printed: no image.
    let quiet = r_exec(&server, "q <- ggplot(mtcars, aes(wt, mpg)) + geom_point()").await;
    assert_r_ok(&quiet);
    assert!(image_blocks(&quiet).is_empty(), "{quiet:#?}");
}

// ------------------------------------------------------------------ help, inspect, complete

#[tokio::test]
async fn help_pages_are_plain_text_and_return_at_once() {
    let server = r_server().await;
    let out = r_exec(&server, "?mean").await;
    assert_r_ok(&out);
    assert_text_has(&out, &["Arithmetic Mean"]);
    assert!(
        !out.text.contains('\u{8}'),
        "the help text has backspaces (overstrike):\n{:?}",
        out.text
    );
    let out = r_exec(&server, "help('sum')").await;
    assert_r_ok(&out);
    assert_text_has(&out, &["Sum of Vector Elements"]);
}

#[tokio::test]
async fn inspect_lists_objects_and_details_one() {
    let server = r_server().await;
    let setup = "df <- data.frame(a = 1:3, b = letters[1:3]); v <- c(1.5, 2)";
    assert_r_ok(&r_exec(&server, setup).await);

    let all = server.call("r_inspect", json!({})).await;
    assert!(!all.is_error, "{all:#?}");
    let vars = all.structured["variables"]
        .as_array()
        .unwrap_or_else(|| panic!("no variables array: {all:#?}"));
    let find = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {all:#?}"))
    };
    let df = find("df");
    assert_eq!(df["type"], "data.frame", "{df}");
    assert_eq!(df["shape"], json!([3, 2]), "{df}");
    let v = find("v");
    assert_eq!(v["type"], "numeric", "{v}");
    assert_eq!(v["len"], 2, "{v}");
    assert_text_has(&all, &["df", "v"]);

    let one = server.call("r_inspect", json!({ "name": "df" })).await;
    assert!(!one.is_error, "{one:#?}");
    assert_text_has(&one, &["data.frame"]);
    let header = one
        .text
        .lines()
        .any(|l| l.split_whitespace().rev().take(2).eq(["b", "a"]));
    let columns = one.text.contains("$ a") && one.text.contains("$ b");
    assert!(header || columns, "the columns a and b:\n{}", one.text);

    let unknown = server.call("r_inspect", json!({ "name": "nope" })).await;
    assert!(unknown.is_error, "{unknown:#?}");
    assert_text_has(&unknown, &["nope", "not defined"]);
    assert!(
        !unknown.text.contains("python_"),
        "an R session's hint names R tools: {unknown:#?}"
    );
}

#[tokio::test]
async fn complete_offers_objects_of_attached_packages() {
    let server = r_server().await;
    assert_r_ok(&r_exec(&server, "my_variable_42 <- 1").await);
    let texts = |out: &ToolOutput| -> Vec<String> {
        assert!(!out.is_error, "r_complete failed: {out:#?}");
        out.structured["completions"]
            .as_array()
            .unwrap_or_else(|| panic!("no completions array: {out:#?}"))
            .iter()
            .filter_map(|c| c["text"].as_str().map(str::to_string))
            .collect()
    };
    let out = server.call("r_complete", json!({ "code": "mtca" })).await;
    let got = texts(&out);
    assert!(got.iter().any(|t| t == "mtcars"), "{got:?} in {out:#?}");

    let out = server
        .call("r_complete", json!({ "code": "x <- my_vari" }))
        .await;
    let got = texts(&out);
    assert!(
        got.iter().any(|t| t == "my_variable_42"),
        "{got:?} in {out:#?}"
    );
}

// ------------------------------------------------------------------ output, crash

#[tokio::test]
async fn a_long_output_is_truncated_and_r_output_greps_it() {
    let server = r_server().await;
    let out = r_exec(&server, "for (i in 1:5000) cat('line', i, '\\n')").await;
    assert_r_ok(&out);
    let omitted = out.structured["omitted_bytes"].as_u64().unwrap_or(0);
    assert!(omitted > 0, "the output should be cut: {}", out.structured);
    assert_text_has(&out, &["line 1 \n", "line 5000 \n"]);
    assert!(!out.text.contains("line 2500 \n"), "the middle was not cut");
    let marker = out
        .text
        .lines()
        .find(|l| l.contains("omitted"))
        .unwrap_or_else(|| panic!("no omission marker in:\n{}", out.text));
    assert!(
        marker.contains("r_output"),
        "the marker points to r_output: {marker:?}"
    );

    let grep = server
        .call("r_output", json!({ "grep": "line 4321 ", "context": 0 }))
        .await;
    assert!(!grep.is_error, "{grep:#?}");
    assert_eq!(grep.structured["matches"], 1, "{grep:#?}");
    assert_eq!(grep.structured["cell"], out.cell(), "{grep:#?}");
    assert_eq!(grep.structured["total_lines"], 5000, "{grep:#?}");
    assert!(
        grep.str_field("text").contains("4321: line 4321"),
        "{grep:#?}"
    );
}

#[tokio::test]
async fn quit_is_a_crash_and_the_next_cell_starts_afresh() {
    let server = r_server().await;
    assert_r_ok(&r_exec(&server, "lost_variable <- 1").await);
    let pid = session_pid(&server, "r").await;

    let crashed = r_exec(&server, "quit(save = 'no', status = 3)").await;
    assert_r_status(&crashed, "crashed", "r");
    assert!(
        crashed.text.contains("exit code 3") || crashed.text.contains("status 3"),
        "the text gives the exit status 3: {crashed:#?}"
    );

    let fresh = r_exec(&server, "exists('lost_variable')").await;
    assert_r_ok(&fresh);
    assert_text_has(&fresh, &["[1] FALSE"]);
    assert!(
        fresh.notes_text().contains("lost"),
        "the next result says the variables were lost: {fresh:#?}"
    );
    assert_ne!(session_pid(&server, "r").await, pid);
    let again = r_exec(&server, "1 + 1").await;
    assert!(
        again.notes().is_empty(),
        "the note is given once: {again:#?}"
    );
    // The crash report names R, not Python.
    assert!(
        !everything(&crashed).contains("Python"),
        "the crash of an R session is reported as a Python process: {crashed:#?}"
    );
}

// ------------------------------------------------------------------ sandbox

/// A probing cell (R_ATTEMPT and `body`) that must run to completion.
async fn r_probe(server: &StdioServer, body: &str) -> ToolOutput {
    let out = r_exec(server, &format!("{R_ATTEMPT}\n{body}")).await;
    assert_r_ok(&out);
    out
}

#[tokio::test]
async fn r_cannot_read_the_home_directory_or_etc_shadow() {
    let secret = unique("SECRET-");
    let home = crate::support::visible_outside_dir();
    let ssh = home.path().join(".ssh");
    std::fs::create_dir(&ssh).expect("mkdir .ssh");
    let key = ssh.join("id_rsa");
    std::fs::write(&key, format!("{secret}\n")).expect("write the fake key");
    let home_str = path_str(home.path()).to_string();
    let server = StdioServer::start_with_env(R_LANGS, &[("HOME", home_str.as_str())]).await;

    let body = format!(
        "attempt('key', readLines({key}))\n\
         attempt('listing', stopifnot(length(dir({home})) > 0))\n\
         attempt('shadow', system('cat /etc/shadow', intern = TRUE))\n\
         cat('HOME=', Sys.getenv('HOME'), '\\n', sep = '')",
        key = r_str(path_str(&key)),
        home = r_str(&home_str),
    );
    let out = r_probe(&server, &body).await;
    assert_failed(&out, "key", "the server's HOME is hidden");
    assert_failed(&out, "listing", "the server's HOME is hidden");
    assert_failed(&out, "shadow", "/etc/shadow is not readable");
    let all = everything(&out);
    assert!(!all.contains(&secret), "the secret leaked: {all}");
    assert!(!all.contains("root:"), "/etc/shadow leaked: {all}");
    if let Ok(shadow) = std::fs::read_to_string("/etc/shadow")
        && let Some(first) = shadow.lines().next().filter(|l| !l.is_empty())
    {
        assert!(!all.contains(first), "/etc/shadow leaked: {all}");
    }
    let session_home = outcome_line(&out, "HOME=");
    assert!(
        !Path::new(&session_home).starts_with(home.path()),
        "the session's HOME ({session_home}) is the server's"
    );
}

/// The rest of the stdout line starting with `prefix`.
fn outcome_line(out: &ToolOutput, prefix: &str) -> String {
    out.str_field("stdout")
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line in {out:#?}"))
        .to_string()
}

#[tokio::test]
async fn r_writes_only_inside_the_workspace() {
    let visible = crate::support::visible_outside_dir();
    let visible_target = visible.path().join("escaped.txt");
    let system_target = format!("/usr/local/{}", unique("ferrepl-test-"));
    let server = r_server().await;
    let inside = server.workdir.path().join("inside.txt");

    let body = format!(
        "attempt('system', writeLines('x', {system}))\n\
         attempt('visible', writeLines('x', {visible}))\n\
         attempt('inside', writeLines('kept', {inside}))\n\
         attempt('relative', writeLines('here', 'relative.txt'))",
        system = r_str(&system_target),
        visible = r_str(path_str(&visible_target)),
        inside = r_str(path_str(&inside)),
    );
    let out = r_probe(&server, &body).await;
    assert_failed(&out, "system", "outside the workspace");
    assert_failed(&out, "visible", "outside the workspace");
    for path in [Path::new(&system_target), visible_target.as_path()] {
        assert!(!path.exists(), "{} was created", path.display());
    }
    assert_succeeded(&out, "inside");
    assert_succeeded(&out, "relative");
    let read = |p: &Path| std::fs::read_to_string(p).expect("read a file the cell wrote");
    assert_eq!(read(&inside), "kept\n");
    assert_eq!(read(&server.workdir.path().join("relative.txt")), "here\n");
}

#[tokio::test]
async fn r_has_no_network() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a TCP listener");
    listener.set_nonblocking(true).expect("non-blocking");
    let port = listener.local_addr().expect("addr").port();
    let server = r_server().await;
    let body = format!(
        "options(timeout = 10)\n\
         attempt('local_socket', socketConnection('127.0.0.1', {port}, blocking = TRUE, timeout = 10))\n\
         attempt('local_url', readLines(url('http://127.0.0.1:{port}/')))\n\
         attempt('remote_socket', socketConnection('example.com', 80, blocking = TRUE, timeout = 10))\n\
         attempt('remote_url', readLines(url('http://example.com')))"
    );
    let out = r_probe(&server, &body).await;
    for label in ["local_socket", "local_url", "remote_socket", "remote_url"] {
        assert_failed(&out, label, "the network is off");
    }
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("the R cell reached the test's listener from {peer}"),
        Err(e) => panic!("accept on the test's listener failed: {e}"),
    }
}

// ------------------------------------------------------------------ r_install

#[tokio::test]
async fn r_install_refuses_bad_arguments_at_once() {
    let server = r_server().await;
    for bad in [
        "--configure-args=x",
        "pkg; system('id')",
        "https://x/y.tar.gz",
    ] {
        let out = server.call("r_install", json!({ "packages": [bad] })).await;
        assert_refused(&out, &[bad, "not an R package"]);
    }
    let out = server.call("r_install", json!({ "packages": [] })).await;
    assert_refused(&out, &["empty"]);
    assert!(
        !server.workdir.path().join(".ferrepl/r-library").exists()
            || std::fs::read_dir(server.workdir.path().join(".ferrepl/r-library"))
                .expect("read the library")
                .next()
                .is_none(),
        "nothing was installed"
    );
}

/// Writes the source of package `ferrepltestpkg` into `workdir` and builds
/// it with `R CMD build` there; returns the tarball's name.
pub(crate) async fn build_test_package(workdir: &Path) -> &'static str {
    let pkg = workdir.join("ferrepltestpkg");
    std::fs::create_dir_all(pkg.join("R")).expect("mkdir the package");
    let description = "Package: ferrepltestpkg\nVersion: 0.1\nTitle: A Test Package\n\
Description: A package the ferrepl tests install.\nLicense: MIT\n\
Author: Ferrepl Tests\nMaintainer: Ferrepl Tests <tests@example.com>\n";
    std::fs::write(pkg.join("DESCRIPTION"), description).expect("DESCRIPTION");
    std::fs::write(pkg.join("NAMESPACE"), "export(hello)\n").expect("NAMESPACE");
    std::fs::write(pkg.join("R/hello.R"), "hello <- function() 'hi from pkg'\n").expect("hello.R");
    let built = tokio::process::Command::new("R")
        .args(["CMD", "build", "--no-manual", "ferrepltestpkg"])
        .current_dir(workdir)
        .output()
        .await
        .expect("run R CMD build");
    let tarball = "ferrepltestpkg_0.1.tar.gz";
    assert!(
        built.status.success() && workdir.join(tarball).is_file(),
        "R CMD build failed ({}):\n{}\n{}",
        built.status,
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    tarball
}

/// r_install `packages`, called again while it answers "running"; returns
/// the finished job's result, which must be a clean exit.
async fn install_until_done(server: &StdioServer, packages: &[&str]) -> ToolOutput {
    let args = json!({ "packages": packages, "wait_s": SLOW_WAIT_S });
    let mut out = server.call("r_install", args.clone()).await;
    let mut rounds = 0;
    while out.structured["status"] == "running" {
        rounds += 1;
        assert!(rounds <= 10, "the install never finished: {out:#?}");
        out = server.call("r_install", args.clone()).await;
    }
    assert_eq!(out.structured["status"], "exited", "{out:#?}");
    assert_eq!(
        out.structured["exit_code"], 0,
        "the install failed: {out:#?}"
    );
    assert!(!out.is_error, "{out:#?}");
    out
}

#[tokio::test]
async fn r_install_of_a_local_source_package_is_loadable_at_once() {
    // A local source package builds: the operator has to allow it.
    let mut args = R_LANGS.to_vec();
    args.push("--allow-source-builds");
    let server = StdioServer::start(&args).await;
    let tarball = build_test_package(server.workdir.path()).await;
    assert_r_ok(&r_exec(&server, "before_install <- 7").await);
    let pid = session_pid(&server, "r").await;

    let done = install_until_done(&server, &[tarball]).await;
    assert!(done.text.contains(".ferrepl/r-library"), "{done:#?}");
    let installed = server
        .workdir
        .path()
        .join(".ferrepl/r-library/ferrepltestpkg/DESCRIPTION");
    assert!(installed.is_file(), "{} is missing", installed.display());

    let out = r_exec(&server, "library(ferrepltestpkg); hello()").await;
    assert_r_ok(&out);
    assert_text_has(&out, &["[1] \"hi from pkg\""]);
    let kept = r_exec(&server, "before_install").await;
    assert_text_has(&kept, &["[1] 7"]);
    assert_eq!(
        session_pid(&server, "r").await,
        pid,
        "the session was not restarted"
    );
}

// ------------------------------------------------------------------ Python and R, HTTP

#[tokio::test]
async fn python_and_r_sessions_keep_their_state_side_by_side() {
    let server = r_server().await;
    server.exec("py_state = 'snake'").await.assert_ok();
    assert_r_ok(&r_exec(&server, "r_state <- 'lion'").await);
    let py = server.exec("py_state").await;
    py.assert_ok();
    assert_eq!(py.value(), Some("'snake'"));
    assert_text_has(&r_exec(&server, "r_state").await, &["[1] \"lion\""]);

    // Both at once: each cell waits for a file the other one writes.
    let dir = server.workdir.path().join("rendezvous");
    std::fs::create_dir(&dir).expect("mkdir rendezvous");
    let (py_flag, r_flag) = (dir.join("py-flag"), dir.join("r-flag"));
    let py_code = format!(
        "import pathlib, time\nopen({mine}, 'w').close()\ndeadline = time.time() + 30\n\
         while not pathlib.Path({other}).exists() and time.time() < deadline: time.sleep(0.02)\n\
         pathlib.Path({other}).exists()",
        mine = r_str(path_str(&py_flag)),
        other = r_str(path_str(&r_flag)),
    );
    let r_code = format!(
        "file.create({mine}); deadline <- Sys.time() + 30\n\
         while (!file.exists({other}) && Sys.time() < deadline) Sys.sleep(0.02)\n\
         file.exists({other})",
        mine = r_str(path_str(&r_flag)),
        other = r_str(path_str(&py_flag)),
    );
    let (py, r) = tokio::join!(
        server.call("python_exec", json!({ "code": py_code, "wait_s": 40 })),
        server.call("r_exec", json!({ "code": r_code, "wait_s": 40 })),
    );
    py.assert_ok();
    assert_eq!(
        py.value(),
        Some("True"),
        "Python did not see R's file: {py:#?}"
    );
    assert_r_ok(&r);
    assert_text_has(&r, &["[1] TRUE"]);
}

#[tokio::test]
async fn an_r_cell_round_trips_over_http() {
    let server = HttpServer::start(R_LANGS, &[]).await;
    let client = server.connect(None).await;
    let args = json!({ "code": "x <- 6\nx * 7", "wait_s": QUICK_WAIT_S });
    let out = call(client.peer(), "r_exec", args).await;
    assert_r_ok(&out);
    assert_text_has(&out, &["[1] 42"]);
    let again = call(client.peer(), "r_exec", json!({ "code": "x" })).await;
    assert_r_ok(&again);
    assert_text_has(&again, &["[1] 6"]);
}
