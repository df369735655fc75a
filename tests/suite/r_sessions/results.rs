//! What an R cell returns: console-like values, output streams in order,
//! warnings, errors with backtraces, typed parse errors, truncated output,
//! and a crash's recovery.

use super::{assert_r_ok, assert_r_status, assert_text_has, r_exec, r_server, session_pid};
use crate::support::everything;
use serde_json::json;

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
