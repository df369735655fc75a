//! Running script files as __main__ in a session: output, missing and
//! failing scripts, input().

use crate::support::StdioServer;
use serde_json::json;

#[tokio::test]
async fn run_file_runs_a_script_as_main_in_the_session() {
    let server = StdioServer::start(&[]).await;
    let script = "import sys\n\
                  print('argv:', sys.argv)\n\
                  result = 6 * 7\n\
                  if __name__ == '__main__':\n\
                  \x20   print('main-block-ran')\n";
    std::fs::write(server.workdir.path().join("script.py"), script).expect("write script");

    let out = server
        .call(
            "python_run_file",
            json!({"path": "script.py", "args": ["a", "b"]}),
        )
        .await;
    out.assert_ok();
    let stdout = out.str_field("stdout");
    assert!(
        stdout.contains("argv: ['script.py', 'a', 'b']"),
        "{stdout:?}"
    );
    assert!(stdout.contains("main-block-ran"), "{stdout:?}");

    let result = server.exec("result").await;
    result.assert_ok();
    assert_eq!(result.value(), Some("42"));
    let file = server.exec("'__file__' in globals()").await;
    file.assert_ok();
    assert_eq!(file.value(), Some("False"), "__file__ must not stay behind");
    let argv = server
        .exec("import sys; sys.argv == ['script.py', 'a', 'b']")
        .await;
    argv.assert_ok();
    assert_eq!(
        argv.value(),
        Some("False"),
        "sys.argv is restored after the run"
    );
}

#[tokio::test]
async fn run_file_reports_missing_and_failing_scripts() {
    let server = StdioServer::start(&[]).await;
    let missing = server
        .call("python_run_file", json!({"path": "missing.py"}))
        .await;
    missing.assert_raised("FileNotFoundError");

    let script = "x = 1\n\
                  def explode():\n\
                  \x20   raise RuntimeError('script-boom')\n\
                  explode()\n";
    std::fs::write(server.workdir.path().join("bad_script.py"), script).expect("write script");
    let failed = server
        .call("python_run_file", json!({"path": "bad_script.py"}))
        .await;
    failed.assert_raised("RuntimeError");
    let traceback = failed.structured["error"]["traceback"]
        .as_str()
        .unwrap_or_else(|| panic!("no traceback: {failed:#?}"));
    assert!(traceback.contains("bad_script.py"), "{traceback}");
    assert!(traceback.contains("line 3"), "{traceback}");
    assert!(traceback.contains("script-boom"), "{traceback}");

    // The session still works and kept the script's globals up to the error.
    let x = server.exec("x").await;
    x.assert_ok();
    assert_eq!(x.value(), Some("1"));
}

#[tokio::test]
async fn run_file_can_ask_for_input() {
    let server = StdioServer::start(&[]).await;
    let script = "name = input('your name? ')\nprint('hello', name)\n";
    std::fs::write(server.workdir.path().join("ask.py"), script).expect("write script");

    let asked = server
        .call("python_run_file", json!({"path": "ask.py"}))
        .await;
    assert_eq!(asked.status(), "waiting_input", "{asked:#?}");
    assert_eq!(asked.structured["prompt"], "your name? ", "{asked:#?}");

    let answered = server.call("python_wait", json!({"input": "Bob"})).await;
    answered.assert_ok();
    assert!(
        answered.str_field("stdout").contains("hello Bob"),
        "{answered:#?}"
    );
    let name = server.exec("name").await;
    name.assert_ok();
    assert_eq!(name.value(), Some("'Bob'"));
}
