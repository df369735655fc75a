//! python_exec semantics over stdio: values, output capture, errors, and the
//! tool catalogue.

use crate::support::{CALL_TIMEOUT, StdioServer};
use serde_json::json;

#[tokio::test]
async fn tools_are_listed_with_description_schemas_and_annotations() {
    let server = StdioServer::start(&[]).await;
    let tools = tokio::time::timeout(CALL_TIMEOUT, server.peer().list_all_tools())
        .await
        .expect("tools/list timed out")
        .expect("tools/list failed");
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    for wanted in [
        "python_exec",
        "python_inspect",
        "python_wait",
        "python_sessions",
    ] {
        assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
    }
    for tool in &tools {
        let name = tool.name.as_ref();
        let description = tool.description.as_deref().unwrap_or("");
        assert!(!description.trim().is_empty(), "{name} has no description");
        assert_eq!(
            tool.input_schema.get("type"),
            Some(&json!("object")),
            "{name} input schema is not an object schema: {:?}",
            tool.input_schema
        );
        // shell_wait returns two shapes (a job, or the job list): no schema.
        if name == "shell_wait" {
            assert!(tool.output_schema.is_none(), "{name}");
            assert!(tool.annotations.is_some(), "{name} has no annotations");
            continue;
        }
        let output = tool
            .output_schema
            .as_ref()
            .unwrap_or_else(|| panic!("{name} has no output schema"));
        assert_eq!(
            output.get("type"),
            Some(&json!("object")),
            "{name} output schema is not an object schema: {output:?}"
        );
        assert!(tool.annotations.is_some(), "{name} has no annotations");
    }
    let exec = tools
        .iter()
        .find(|t| t.name == "python_exec")
        .expect("python_exec listed");
    let props = exec.input_schema["properties"]
        .as_object()
        .expect("python_exec input schema has properties");
    for key in ["code", "session", "wait_s"] {
        assert!(props.contains_key(key), "python_exec input lacks {key}");
    }
    let required = exec.input_schema["required"]
        .as_array()
        .expect("python_exec input schema lists required fields");
    assert!(
        required.contains(&json!("code")),
        "code is not required: {required:?}"
    );
}

#[tokio::test]
async fn variables_persist_and_cells_count_up() {
    let server = StdioServer::start(&[]).await;
    let first = server.exec("x = 41").await;
    first.assert_ok();
    assert_eq!(first.cell(), 1, "first cell number: {first:#?}");
    assert_eq!(first.value(), None, "assignment has no value: {first:#?}");

    let second = server.exec("x + 1").await;
    second.assert_ok();
    assert_eq!(second.value(), Some("42"), "{second:#?}");
    assert_eq!(second.cell(), 2, "second cell number: {second:#?}");
    assert_eq!(second.str_field("session"), "default");
}

#[tokio::test]
async fn exec_result_has_the_documented_shape_and_footer() {
    let server = StdioServer::start(&[]).await;
    let out = server.exec_in("shape-sess", "print('hello')\n6 * 7").await;
    out.assert_ok();
    let obj = out
        .structured
        .as_object()
        .expect("structured_content is an object");
    for key in [
        "status",
        "session",
        "cell",
        "stdout",
        "value",
        "elapsed_ms",
        "output_bytes",
    ] {
        assert!(
            obj.contains_key(key),
            "structured_content lacks {key}: {obj:?}"
        );
    }
    // Empty and null fields are left out.
    for key in [
        "stderr",
        "error",
        "prompt",
        "background_output",
        "notes",
        "display",
        "omitted_bytes",
    ] {
        assert!(
            !obj.contains_key(key),
            "structured_content has an empty {key}: {obj:?}"
        );
    }
    assert_eq!(out.str_field("session"), "shape-sess");
    assert_eq!(out.str_field("stdout"), "hello\n");
    assert_eq!(out.str_field("stderr"), "");
    assert_eq!(out.value(), Some("42"));
    assert_eq!(out.structured["output_bytes"], 6, "{out:#?}");
    assert!(
        out.structured["elapsed_ms"]
            .as_f64()
            .is_some_and(|ms| ms >= 0.0),
        "elapsed_ms is not a non-negative number: {out:#?}"
    );

    // Terminal-like text: output, then value, then a footer line.
    let hello = out.text.find("hello").expect("text shows stdout");
    let value = out.text.find("42").expect("text shows the value");
    assert!(
        hello < value,
        "output must come before the value: {:?}",
        out.text
    );
    let footer = out
        .text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .expect("text has a footer line");
    assert!(footer.contains("ok"), "footer lacks status: {footer:?}");
    assert!(
        footer.contains("cell 1"),
        "footer lacks cell number: {footer:?}"
    );
    assert!(
        footer.contains("shape-sess"),
        "footer lacks session: {footer:?}"
    );
}

#[tokio::test]
async fn stdout_and_stderr_are_captured_separately() {
    let server = StdioServer::start(&[]).await;
    let out = server.exec("print(\"hi\")").await;
    out.assert_ok();
    assert_eq!(out.str_field("stdout"), "hi\n");
    assert_eq!(out.str_field("stderr"), "");

    let err = server
        .exec("import sys; print(\"e-marker\", file=sys.stderr)")
        .await;
    err.assert_ok();
    assert!(
        err.str_field("stderr").contains("e-marker"),
        "stderr not captured: {err:#?}"
    );
    assert!(
        !err.str_field("stdout").contains("e-marker"),
        "stderr leaked into stdout: {err:#?}"
    );
}

#[tokio::test]
async fn fd_level_output_is_captured_and_kept_off_the_protocol() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .exec("import os; os.system(\"echo from-shell\"); os.write(1, b\"raw\\n\")")
        .await;
    out.assert_ok();
    let stdout = out.str_field("stdout");
    assert!(
        stdout.contains("from-shell"),
        "subprocess output lost: {out:#?}"
    );
    assert!(stdout.contains("raw"), "os.write(1) output lost: {out:#?}");
    assert!(
        !stdout.contains('\0') && !stdout.contains("FERREPL"),
        "internal markers leaked into stdout: {stdout:?}"
    );
    // The next cell does not inherit this cell's output.
    let next = server.exec("1").await;
    next.assert_ok();
    assert_eq!(next.str_field("stdout"), "", "{next:#?}");
    server.assert_clean_stdout();
}

#[tokio::test]
async fn interleaved_streams_keep_their_order_in_the_text() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .exec(
            "print(\"AAA-first\"); import sys; sys.stderr.write(\"BBB-second\\n\"); \
             sys.stderr.flush(); print(\"CCC-third\")",
        )
        .await;
    out.assert_ok();
    let a = out.text.find("AAA-first").expect("text has the first line");
    let b = out
        .text
        .find("BBB-second")
        .expect("text has the stderr line");
    let c = out.text.find("CCC-third").expect("text has the third line");
    assert!(a < b && b < c, "order lost in text: {:?}", out.text);
}

#[tokio::test]
async fn many_interleaved_writes_keep_their_order_in_the_text() {
    // Alternating flushed writes to stdout and stderr: a terminal would show
    // them strictly alternating, and so must the text.
    let server = StdioServer::start(&[]).await;
    let out = server
        .exec(
            "import sys\n\
             for i in range(20):\n\
             \x20   print(f'out-{i:02}')\n\
             \x20   sys.stderr.write(f'err-{i:02}\\n'); sys.stderr.flush()",
        )
        .await;
    out.assert_ok();
    let seen: Vec<&str> = out
        .text
        .lines()
        .filter(|l| l.starts_with("out-") || l.starts_with("err-"))
        .collect();
    let expected: Vec<String> = (0..20)
        .flat_map(|i| [format!("out-{i:02}"), format!("err-{i:02}")])
        .collect();
    assert_eq!(seen, expected, "interleaving lost in text: {:?}", out.text);
    assert_eq!(
        out.str_field("stdout"),
        (0..20).map(|i| format!("out-{i:02}\n")).collect::<String>()
    );
}

#[tokio::test]
async fn values_are_reprs_and_none_is_null() {
    let server = StdioServer::start(&[]).await;
    let assign = server.exec("x = 1").await;
    assign.assert_ok();
    assert_eq!(assign.value(), None, "{assign:#?}");

    let none = server.exec("None").await;
    none.assert_ok();
    assert_eq!(none.value(), None, "{none:#?}");

    let s = server.exec("\"s\"").await;
    s.assert_ok();
    assert_eq!(s.value(), Some("'s'"), "{s:#?}");

    let main = server.exec("__name__").await;
    main.assert_ok();
    assert_eq!(main.value(), Some("'__main__'"), "{main:#?}");
}

#[tokio::test]
async fn last_value_is_kept_in_underscore() {
    let server = StdioServer::start(&[]).await;
    server.exec("40 + 2").await.assert_ok();
    let out = server.exec("_ + 1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("43"), "{out:#?}");
}

#[tokio::test]
async fn top_level_await_works() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .exec("import asyncio\nawait asyncio.sleep(0)\n7")
        .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("7"), "{out:#?}");
}

#[tokio::test]
async fn blank_lines_inside_a_function_body_are_fine() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .exec("def g():\n    a = 1\n\n    return a + 1\n\ng()")
        .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("2"), "{out:#?}");
}

#[tokio::test]
async fn exceptions_report_type_and_a_user_only_traceback() {
    let server = StdioServer::start(&[]).await;
    server.exec("pass").await.assert_ok();
    let out = server.exec("def f():\n    return 1/0\nf()").await;
    out.assert_raised("ZeroDivisionError");
    let cell = out.cell();
    assert_eq!(cell, 2, "{out:#?}");
    let error = &out.structured["error"];
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("division")),
        "error.message: {error}"
    );
    let tb = error["traceback"].as_str().expect("error.traceback string");
    assert!(
        tb.contains(&format!("<cell {cell}>")),
        "traceback lacks <cell {cell}>: {tb}"
    );
    assert!(
        tb.contains("return 1/0"),
        "traceback lacks the source line: {tb}"
    );
    assert!(
        tb.contains("ZeroDivisionError"),
        "traceback lacks the type: {tb}"
    );
    assert!(
        !tb.contains("driver"),
        "traceback shows driver frames: {tb}"
    );
    assert!(
        out.text.contains("ZeroDivisionError"),
        "text lacks the traceback: {:?}",
        out.text
    );
    assert!(
        out.text.contains("error"),
        "text lacks the status: {:?}",
        out.text
    );
    assert_eq!(out.value(), None);
}

#[tokio::test]
async fn syntax_errors_are_errors() {
    let server = StdioServer::start(&[]).await;
    let out = server.exec("x = (").await;
    out.assert_raised("SyntaxError");
    assert!(
        !out.structured["error"]["traceback"]
            .as_str()
            .unwrap_or("")
            .contains("driver"),
        "{out:#?}"
    );
    // The session is still usable.
    server.exec("y = 2\ny").await.assert_ok();
}

#[tokio::test]
async fn huge_output_does_not_corrupt_the_protocol() {
    let server = StdioServer::start(&[]).await;
    let out = server.exec("print(\"x\" * 100000)").await;
    out.assert_ok();
    let stdout = out.str_field("stdout");
    assert!(
        stdout.starts_with("xxxx") && stdout.len() >= 1000,
        "stdout of the big print is missing: {} chars",
        stdout.len()
    );
    // Raw writes to the worker's fd 1 and 2 must not reach the server's stdout either.
    let raw = server
        .exec(
            "import os\nos.write(1, b'not-json garbage {\\n' * 50)\n\
             os.write(2, b'y' * 70000)\nprint('done')",
        )
        .await;
    raw.assert_ok();
    assert!(raw.str_field("stdout").contains("done"), "{raw:#?}");
    assert!(
        raw.str_field("stdout").contains("not-json garbage"),
        "raw fd 1 output was not captured: {raw:#?}"
    );
    let after = server.exec("21 * 2").await;
    after.assert_ok();
    assert_eq!(after.value(), Some("42"));
    server.assert_clean_stdout();
}

#[tokio::test]
async fn bad_arguments_and_unknown_tools_do_not_kill_the_server() {
    let mut server = StdioServer::start(&["--tools", "python"]).await;

    for args in [json!({}), json!({ "code": 42 }), json!({ "code": null })] {
        match server.try_call("python_exec", args.clone()).await {
            Ok(result) => assert_eq!(
                result.is_error,
                Some(true),
                "python_exec {args} should be rejected, got {result:#?}"
            ),
            Err(rmcp::ServiceError::McpError(_)) => {}
            Err(other) => panic!("python_exec {args} broke the connection: {other}"),
        }
    }

    // An unknown tool is an invalid-params error naming it and the closest
    // tool; a known tool left out by --tools says which group.
    let refusals = [
        ("pyhton_exec", "did you mean 'python_exec'"),
        ("file_read", "group 'files'"),
    ];
    for (name, says) in refusals {
        match server.try_call(name, json!({})).await {
            Err(rmcp::ServiceError::McpError(e)) => {
                assert_eq!(e.code.0, -32602, "{e:?}");
                assert!(
                    e.message.contains(&format!("'{name}'")) && e.message.contains(says),
                    "{name}: {}",
                    e.message
                );
            }
            Ok(result) => panic!("an unknown tool should be refused, got {result:#?}"),
            Err(other) => panic!("an unknown tool broke the connection: {other}"),
        }
    }

    let out = server.exec("1 + 1").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("2"));
    server.assert_alive();
}
