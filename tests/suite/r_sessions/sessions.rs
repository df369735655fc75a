//! R's tools and sessions: which tools are listed, R sessions beside Python
//! ones (listing, reset, delete, each language's tools refusing the other's
//! sessions, state kept side by side), and a round trip over HTTP.

use super::{
    QUICK_WAIT_S, R_LANGS, R_TOOLS, assert_r_ok, assert_r_status, assert_text_has, r_exec,
    r_exec_in, r_server, r_str, session_pid, session_row,
};
use crate::support::{
    HttpServer, StdioServer, assert_refused, call, path_str, session_names, tool_names,
};
use serde_json::json;

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
