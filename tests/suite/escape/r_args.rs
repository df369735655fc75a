//! R's tool arguments and workspace files cannot widen what the operator
//! allowed, nor make ferrepl run anything outside the sandbox:
//!
//! * `r_inspect`'s `name` is a name or an access path, never code;
//! * `r_install`'s `packages` are CRAN names or workspace tarballs, never
//!   installer options or R code;
//! * `session` cannot steer an R tool onto a Python session (or the reverse);
//! * code with a NUL is refused before it reaches R;
//! * `.Rprofile` / `.Renviron` planted in the workspace are not read, and the
//!   server's environment does not reach R sessions.

use serde_json::json;

use crate::support::{StdioServer, ToolOutput, unique};

const R: [&str; 2] = ["--languages", "python,r"];

async fn r_exec(server: &StdioServer, code: &str) -> ToolOutput {
    server
        .call("r_exec", json!({ "code": code, "wait_s": 30 }))
        .await
}

fn assert_refused(out: &ToolOutput, needle: &str, what: &str) {
    assert!(out.is_error, "{what} must be refused: {out:#?}");
    assert!(
        out.text.contains(needle),
        "the refusal of {what} must say '{needle}': {:?}",
        out.text
    );
}

#[tokio::test]
async fn r_inspect_names_are_never_evaluated_as_code() {
    let server = StdioServer::start(&R).await;
    r_exec(&server, "x <- list(a = 1)").await.assert_ok();
    let marker = server.workdir.path().join(unique("inspect-pwned"));
    let file = marker.file_name().and_then(|n| n.to_str()).unwrap_or("m");
    for name in [
        format!("file.create('{file}')"),
        format!("x; file.create('{file}')"),
        format!("x$a + file.create('{file}')"),
        format!("x[[file.create('{file}')]]"),
        format!("`{file}`<-1"),
    ] {
        let out = server.call("r_inspect", json!({ "name": name })).await;
        assert!(out.is_error, "r_inspect {name:?} must be refused: {out:#?}");
        assert!(!marker.exists(), "r_inspect {name:?} ran code: {out:#?}");
    }
    let ok = server.call("r_inspect", json!({ "name": "x$a" })).await;
    assert!(!ok.is_error, "an access path is inspected: {ok:#?}");
}

#[tokio::test]
async fn r_install_refuses_options_and_code_before_any_job() {
    let server = StdioServer::start(&R).await;
    let marker = server.workdir.path().join(unique("install-pwned"));
    let file = marker.file_name().and_then(|n| n.to_str()).unwrap_or("m");
    for bad in [
        "--configure-args=--prefix=/".to_string(),
        format!("x'); file.create('{file}'); ('"),
        format!("x\"); file.create(\"{file}\"); (\""),
        "pkg\nsystem('id')".to_string(),
        "https://example.com/pkg_1.0.tar.gz".to_string(),
        "../../etc/passwd".to_string(),
    ] {
        let out = server
            .call("r_install", json!({ "packages": [bad.clone()] }))
            .await;
        assert_refused(&out, "not an R package", &format!("r_install {bad:?}"));
        assert!(
            out.structured.get("job").is_none(),
            "no job may start for {bad:?}: {out:#?}"
        );
    }
    assert!(!marker.exists(), "an r_install argument ran R code");
}

#[tokio::test]
async fn sessions_keep_their_language() {
    let server = StdioServer::start(&R).await;
    server.exec("p = 1").await.assert_ok();
    let out = server
        .call("r_exec", json!({ "code": "1", "session": "default" }))
        .await;
    assert_refused(&out, "Python session", "r_exec on the Python session");
    r_exec(&server, "r_var <- 2").await.assert_ok();
    for (tool, args) in [
        ("python_exec", json!({ "code": "1", "session": "r" })),
        ("python_inspect", json!({ "session": "r" })),
        ("python_wait", json!({ "session": "r" })),
        (
            "python_install",
            json!({ "packages": ["six"], "session": "r" }),
        ),
    ] {
        let out = server.call(tool, args).await;
        assert_refused(&out, "R session", &format!("{tool} on the R session"));
    }
    let out = server
        .call("r_exec", json!({ "code": "1", "session": "../etc" }))
        .await;
    assert_refused(&out, "invalid session name", "a path as a session name");
}

#[tokio::test]
async fn r_code_with_a_nul_is_refused_before_r_sees_it() {
    let server = StdioServer::start(&R).await;
    let out = server
        .call("r_exec", json!({ "code": "x <- 'a\u{0}b'" }))
        .await;
    assert_refused(&out, "NUL", "code with a NUL");
    r_exec(&server, "1 + 1").await.assert_ok();
}

#[tokio::test]
async fn workspace_profiles_and_the_server_environment_do_not_reach_r() {
    let secret = unique("secret");
    let server = StdioServer::start_with_env(&R, &[("FERREPL_TEST_SECRET", &secret)]).await;
    let ws = server.workdir.path();
    let planted = unique("planted");
    std::fs::write(ws.join(".Rprofile"), format!("{planted} <- TRUE\n")).expect("write .Rprofile");
    std::fs::write(ws.join(".Renviron"), format!("PLANTED_ENV={planted}\n"))
        .expect("write .Renviron");
    let out = r_exec(
        &server,
        &format!(
            "cat(exists('{planted}'), Sys.getenv('PLANTED_ENV'), Sys.getenv('FERREPL_TEST_SECRET'), sep = '|')"
        ),
    )
    .await;
    out.assert_ok();
    assert!(
        out.text.starts_with("FALSE||"),
        "the session read a planted profile or the server's environment: {:?}",
        out.text
    );
}

#[tokio::test]
async fn creating_an_r_session_takes_no_interpreter_and_no_way_out() {
    let server = StdioServer::start(&R).await;
    std::fs::create_dir(server.workdir.path().join("sub")).expect("mkdir sub");
    let create = |args: serde_json::Value| {
        let mut all = json!({"action": "create", "session": "st", "language": "r"});
        if let (Some(into), serde_json::Value::Object(from)) = (all.as_object_mut(), args) {
            into.extend(from);
        }
        server.call("python_sessions", all)
    };
    for (args, needle) in [
        (json!({"python": "/bin/sh"}), "apply to Python sessions"),
        (json!({"venv": ".venv"}), "apply to Python sessions"),
        (json!({"env": {"LD_PRELOAD": "/tmp/x.so"}}), "not allowed"),
        (
            json!({"env": {"R_HOME": "x", "FERREPL_NONCE": "y"}}),
            "FERREPL_",
        ),
        (json!({"workdir": "/"}), "workspace"),
    ] {
        let out = create(args.clone()).await;
        assert_refused(&out, needle, &format!("create R session with {args}"));
    }
    let out = create(json!({"workdir": "sub", "env": {"MY_SETTING": "on"}})).await;
    assert!(!out.is_error, "{out:#?}");
    let got = server
        .call(
            "r_exec",
            json!({"session": "st", "code": "cat(basename(getwd()), Sys.getenv('MY_SETTING'))", "wait_s": 30}),
        )
        .await;
    got.assert_ok();
    assert!(got.text.starts_with("sub on"), "{:?}", got.text);
    let py = server
        .call("python_exec", json!({"session": "st", "code": "1"}))
        .await;
    assert_refused(&py, "R session", "python_exec on a created R session");
}

#[tokio::test]
async fn a_python_only_server_refuses_r_sessions_and_hides_the_argument() {
    let server = StdioServer::start(&[]).await;
    let out = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "x", "language": "r"}),
        )
        .await;
    assert_refused(
        &out,
        "--languages python,r",
        "an R session without R enabled",
    );
    let tools = server
        .client
        .peer()
        .list_all_tools()
        .await
        .expect("tools/list");
    let sessions = tools
        .iter()
        .find(|t| t.name == "python_sessions")
        .expect("python_sessions listed");
    let schema = serde_json::to_string(&sessions.input_schema).unwrap_or_default();
    assert!(!schema.contains("language"), "{schema}");
}
