//! The workspace tools: session management (create with options, delete,
//! limits, idle expiry), cell history, running script files, completion,
//! inspection with source, namespace edits, server status (python_sessions
//! {action: "status"}) and tool groups.

use std::path::Path;
use std::time::Duration;

use crate::support::{
    HttpServer, START_TIMEOUT, StdioServer, ToolOutput, assert_refused, assert_success, call,
    exec_args, process_alive, py_path, py_repr, server_command_plain, session_host_pid, strip_ansi,
    tool_names, wait_for_file_line, wait_process_gone,
};
use serde_json::{Value, json};

/// How long a bounded poll of some observable state may take.
const POLL_TIMEOUT: Duration = Duration::from_secs(15);

fn sessions_of(structured: &Value) -> &Vec<Value> {
    structured["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions array in {structured}"))
}

fn find_session<'a>(structured: &'a Value, name: &str) -> Option<&'a Value> {
    sessions_of(structured).iter().find(|s| s["name"] == name)
}

async fn list_sessions(server: &StdioServer) -> ToolOutput {
    let out = server.call("python_sessions", json!({})).await;
    assert_success(&out, "python_sessions list");
    assert!(
        out.structured["message"].is_null(),
        "a listing has message null: {out:#?}"
    );
    out
}

/// A repr'd Python string value without its quotes.
fn unquote(value: Option<&str>) -> String {
    let v = value.unwrap_or_else(|| panic!("expected a value"));
    v.trim_matches('\'').to_string()
}

/// Python code that blocks until `gate` exists (bounded), after writing a
/// line to `started`.
fn gated_cell(started: &Path, gate: &Path) -> String {
    format!(
        "import os, time\n\
         with open({started}, 'w') as f:\n\
         \x20   f.write('started\\n')\n\
         deadline = time.monotonic() + 30\n\
         while not os.path.exists({gate}):\n\
         \x20   if time.monotonic() > deadline:\n\
         \x20       raise TimeoutError('the gate file never appeared')\n\
         \x20   time.sleep(0.01)\n\
         'gate passed'",
        started = py_path(started),
        gate = py_path(gate),
    )
}

// ------------------------------------------------------------------ sessions

#[tokio::test]
async fn sessions_list_has_the_documented_fields() {
    let server = StdioServer::start(&[]).await;
    server.exec("x = 1").await.assert_ok();
    let pid = session_host_pid(&server, "default").await;

    let listing = list_sessions(&server).await;
    let row = find_session(&listing.structured, "default")
        .unwrap_or_else(|| panic!("no default session in {listing:#?}"));
    // running_cell is left out when no cell runs (structuredContent omits nulls).
    for key in [
        "name",
        "state",
        "pid",
        "cells",
        "memory_bytes",
        "uptime_s",
        "language",
        "interpreter",
    ] {
        assert!(row.get(key).is_some(), "session row lacks {key}: {row}");
    }
    assert_eq!(row["language"], "python", "{row}");
    assert!(row.get("running_cell").is_none(), "{row}");
    assert_eq!(row["state"], "idle", "{row}");
    assert_eq!(row["pid"].as_u64(), Some(u64::from(pid)), "{row}");
    assert_eq!(row["cells"].as_u64(), Some(2), "{row}");
    assert!(row["running_cell"].is_null(), "{row}");
    assert!(row["uptime_s"].as_f64().is_some(), "{row}");
    assert!(
        listing.text.contains("default"),
        "the text lists the session: {:?}",
        listing.text
    );
}

#[tokio::test]
async fn create_session_with_workdir_and_env_then_delete_it() {
    let server = StdioServer::start(&[]).await;
    // A session's workdir must be inside the workspace.
    let dir = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");

    let created = server
        .call(
            "python_sessions",
            json!({
                "action": "create",
                "session": "w",
                "workdir": dir.path(),
                "env": {"MYVAR": "hello"},
            }),
        )
        .await;
    assert_success(&created, "created");
    let message = created.structured["message"]
        .as_str()
        .unwrap_or_else(|| panic!("create has a message: {created:#?}"));
    assert!(message.contains("created"), "{message:?}");
    assert!(message.contains('w'), "{message:?}");
    let row = find_session(&created.structured, "w")
        .unwrap_or_else(|| panic!("the created session is listed: {created:#?}"));
    let listed_pid = row["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("a created session has a running interpreter: {row}"));

    let out = server
        .exec_in(
            "w",
            "import os; (os.path.realpath(os.getcwd()), os.environ['MYVAR'])",
        )
        .await;
    out.assert_ok();
    let canonical = std::fs::canonicalize(dir.path()).expect("canonical tempdir");
    let expected = format!("({}, 'hello')", py_repr(&canonical));
    assert_eq!(out.value(), Some(expected.as_str()), "{out:#?}");
    assert_eq!(
        out.cell(),
        1,
        "the created session runs its first cell: {out:#?}"
    );

    // The default session keeps the server's workdir and has no MYVAR.
    let default = server
        .exec("import os; (os.path.realpath(os.getcwd()), os.environ.get('MYVAR'))")
        .await;
    default.assert_ok();
    let server_dir = std::fs::canonicalize(server.workdir.path()).expect("canonical workdir");
    let expected = format!("({}, None)", py_repr(&server_dir));
    assert_eq!(default.value(), Some(expected.as_str()), "{default:#?}");

    let pid = session_host_pid(&server, "w").await;
    assert_eq!(
        u64::from(pid),
        listed_pid,
        "listed pid is the interpreter's"
    );
    assert!(process_alive(pid));

    let deleted = server
        .call(
            "python_sessions",
            json!({"action": "delete", "session": "w"}),
        )
        .await;
    assert_success(&deleted, "deleted");
    let message = deleted.structured["message"]
        .as_str()
        .unwrap_or_else(|| panic!("delete has a message: {deleted:#?}"));
    assert!(message.contains("deleted"), "{message:?}");
    assert!(
        find_session(&deleted.structured, "w").is_none(),
        "a deleted session is no longer listed: {deleted:#?}"
    );
    assert!(
        wait_process_gone(pid, POLL_TIMEOUT).await,
        "the deleted session's interpreter (pid {pid}) is still alive"
    );

    let again = server
        .call(
            "python_sessions",
            json!({"action": "delete", "session": "w"}),
        )
        .await;
    assert_refused(&again, &["'w'", "default"]);
}

#[tokio::test]
async fn create_session_in_a_virtual_environment() {
    let server = StdioServer::start(&[]).await;
    // A venv must be inside the workspace (or allowed with --allow-python).
    let venv = server.workdir.path().join("v");
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .expect("run python3 -m venv");
    assert!(
        made.status.success(),
        "python3 -m venv failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );

    let created = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "venvy", "venv": venv}),
        )
        .await;
    assert_success(&created, "created");

    let out = server
        .exec_in(
            "venvy",
            "import sys; (sys.prefix, sys.prefix != sys.base_prefix)",
        )
        .await;
    out.assert_ok();
    let expected = format!("({}, True)", py_repr(&venv));
    assert_eq!(out.value(), Some(expected.as_str()), "{out:#?}");

    // The default session is not in that environment.
    let default = server.exec("import sys; sys.prefix").await;
    default.assert_ok();
    assert_ne!(
        unquote(default.value()),
        venv.to_str().unwrap(),
        "{default:#?}"
    );
}

#[tokio::test]
async fn create_is_refused_for_bad_options_and_existing_names() {
    let server = StdioServer::start(&[]).await;

    // An interpreter outside the workspace needs the operator's --allow-python.
    let outside_python = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "p", "python": "/nonexistent"}),
        )
        .await;
    assert_refused(&outside_python, &["/nonexistent", "--allow-python"]);

    // One inside the workspace must exist and be executable.
    let missing = server.workdir.path().join("no-such-python");
    let bad_python = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "p", "python": missing}),
        )
        .await;
    assert_refused(&bad_python, &[missing.to_str().expect("utf-8 path")]);
    assert!(
        bad_python.text.contains("not executable") || bad_python.text.contains("does not exist"),
        "{:?}",
        bad_python.text
    );

    let not_a_venv = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");
    let bad_venv = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "p", "venv": not_a_venv.path()}),
        )
        .await;
    assert_refused(&bad_venv, &["virtual environment"]);

    let reserved = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "p", "env": {"FERREPL_SECRET": "x"}}),
        )
        .await;
    assert_refused(&reserved, &["FERREPL_SECRET"]);

    let listing = list_sessions(&server).await;
    assert!(
        find_session(&listing.structured, "p").is_none(),
        "refused creations leave no session behind: {listing:#?}"
    );

    let first = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "dup"}),
        )
        .await;
    assert_success(&first, "first");
    let second = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "dup"}),
        )
        .await;
    assert_refused(&second, &["already exists"]);

    let unknown = server
        .call(
            "python_sessions",
            json!({"action": "delete", "session": "ghost"}),
        )
        .await;
    assert_refused(&unknown, &["ghost", "dup"]);
}

#[tokio::test]
async fn max_sessions_limits_new_sessions() {
    let server = StdioServer::start(&["--max-sessions", "2"]).await;
    server.exec("1").await.assert_ok();
    server.exec_in("second", "2").await.assert_ok();

    let third = server.exec_in("third", "3").await;
    assert_refused(&third, &["limit", "--max-sessions"]);

    let created = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "third"}),
        )
        .await;
    assert_refused(&created, &["--max-sessions"]);

    // Deleting one makes room again.
    let deleted = server
        .call(
            "python_sessions",
            json!({"action": "delete", "session": "second"}),
        )
        .await;
    assert_success(&deleted, "deleted");
    server.exec_in("third", "3").await.assert_ok();
}

#[tokio::test]
async fn idle_sessions_end_after_the_ttl() {
    let server = StdioServer::start(&["--session-ttl", "1"]).await;
    let created = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "idle1"}),
        )
        .await;
    assert_success(&created, "created");
    server.exec_in("idle1", "x = 1").await.assert_ok();
    let pid = session_host_pid(&server, "idle1").await;

    let deadline = tokio::time::Instant::now() + POLL_TIMEOUT;
    loop {
        let listing = list_sessions(&server).await;
        if find_session(&listing.structured, "idle1").is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "session idle1 still exists {POLL_TIMEOUT:?} after its last use with --session-ttl 1: {listing:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        wait_process_gone(pid, POLL_TIMEOUT).await,
        "the expired session's interpreter (pid {pid}) is still alive"
    );
}

// ------------------------------------------------------------------ history

#[tokio::test]
async fn history_lists_cells_and_the_running_one() {
    let server = StdioServer::start(&[]).await;
    let codes = [
        "print('alpha-out' + 'x' * 2000)",
        "20 + 22",
        "raise ValueError('boom-hist')",
    ];
    server.exec(codes[0]).await.assert_ok();
    server.exec(codes[1]).await.assert_ok();
    server.exec(codes[2]).await.assert_raised("ValueError");

    let all = server.call("python_history", json!({"last": 10})).await;
    assert_success(&all, "all");
    assert_eq!(all.structured["session"], "default", "{all:#?}");
    assert!(all.structured["running"].is_null(), "{all:#?}");
    let cells = all.structured["cells"]
        .as_array()
        .unwrap_or_else(|| panic!("no cells array: {all:#?}"));
    assert_eq!(cells.len(), 3, "{all:#?}");
    for (i, (entry, code)) in cells.iter().zip(codes).enumerate() {
        assert_eq!(entry["cell"].as_u64(), Some(i as u64 + 1), "{entry}");
        assert_eq!(entry["code"], code, "{entry}");
        assert!(entry["elapsed_ms"].as_f64().is_some(), "{entry}");
    }
    let statuses: Vec<&str> = cells.iter().filter_map(|c| c["status"].as_str()).collect();
    assert_eq!(statuses, ["ok", "ok", "error"], "{all:#?}");

    let preview = |i: usize| cells[i]["output_preview"].as_str().unwrap_or_default();
    assert!(preview(0).starts_with("alpha-outxxx"), "{:?}", preview(0));
    assert!(
        preview(0).len() < 2000,
        "the preview is only the start of the output: {} chars",
        preview(0).len()
    );
    assert!(preview(1).contains("42"), "{:?}", preview(1));
    assert!(preview(2).contains("boom-hist"), "{:?}", preview(2));
    assert!(all.text.contains("alpha-out"), "{:?}", all.text);

    let last_two = server.call("python_history", json!({"last": 2})).await;
    assert_success(&last_two, "last two");
    let numbers: Vec<u64> = last_two.structured["cells"]
        .as_array()
        .unwrap_or_else(|| panic!("no cells array: {last_two:#?}"))
        .iter()
        .filter_map(|c| c["cell"].as_u64())
        .collect();
    assert_eq!(numbers, [2, 3], "{last_two:#?}");

    // A cell blocked on a gate file shows as running.
    let dir = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");
    let (started, gate) = (dir.path().join("started"), dir.path().join("gate"));
    let gated = gated_cell(&started, &gate);
    let running = server
        .call("python_exec", json!({"code": gated, "wait_s": 0}))
        .await;
    assert_eq!(running.status(), "running", "{running:#?}");
    wait_for_file_line(&started, POLL_TIMEOUT).await;

    let during = server.call("python_history", json!({})).await;
    assert_success(&during, "during");
    let run = &during.structured["running"];
    assert_eq!(run["cell"].as_u64(), Some(4), "{during:#?}");
    assert_eq!(run["code"], gated.as_str(), "{during:#?}");
    assert_eq!(
        during.structured["cells"].as_array().map(Vec::len),
        Some(3),
        "the running cell is not among the finished ones: {during:#?}"
    );

    std::fs::write(&gate, "").expect("open the gate");
    let done = server.call("python_wait", json!({"wait_s": 30})).await;
    done.assert_ok();
    assert_eq!(done.value(), Some("'gate passed'"));
    let after = server.call("python_history", json!({"last": 1})).await;
    assert!(after.structured["running"].is_null(), "{after:#?}");
    assert_eq!(after.structured["cells"][0]["cell"].as_u64(), Some(4));
}

// ------------------------------------------------------------------ run_file

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

// ------------------------------------------------------------------ complete

fn completion_texts(out: &ToolOutput) -> Vec<String> {
    out.structured["completions"]
        .as_array()
        .unwrap_or_else(|| panic!("no completions array: {out:#?}"))
        .iter()
        .map(|c| {
            assert!(c["kind"].is_string(), "a completion has a kind: {c}");
            c["text"]
                .as_str()
                .unwrap_or_else(|| panic!("a completion has a text: {c}"))
                .to_string()
        })
        .collect()
}

/// Whether `texts` offers `name` (as the bare name, or as a dotted path to it).
fn offers(texts: &[String], name: &str) -> bool {
    texts
        .iter()
        .any(|t| t == name || t.ends_with(&format!(".{name}")))
}

#[tokio::test]
async fn complete_uses_the_live_namespace() {
    let server = StdioServer::start(&[]).await;
    server
        .exec(
            "import collections\n\
             class K:\n\
             \x20   def meth(self):\n\
             \x20       return 1\n\
             k = K()",
        )
        .await
        .assert_ok();

    let out = server
        .call("python_complete", json!({"code": "k.me"}))
        .await;
    assert_success(&out, "out");
    assert_eq!(out.structured["session"], "default", "{out:#?}");
    let engine = out.str_field("engine");
    assert!(
        engine == "jedi" || engine == "rlcompleter",
        "engine: {engine:?}"
    );
    assert!(out.str_field("token").ends_with("me"), "{out:#?}");
    let texts = completion_texts(&out);
    assert!(offers(&texts, "meth"), "{texts:?}");
    assert!(out.text.contains("meth"), "{:?}", out.text);

    let module = server
        .call("python_complete", json!({"code": "collections.Ord"}))
        .await;
    assert_success(&module, "module");
    let texts = completion_texts(&module);
    assert!(offers(&texts, "OrderedDict"), "{texts:?}");

    // A session where k does not exist has no such completion.
    server.exec_in("other", "pass").await.assert_ok();
    let elsewhere = server
        .call(
            "python_complete",
            json!({"code": "k.me", "session": "other"}),
        )
        .await;
    assert_success(&elsewhere, "elsewhere");
    assert_eq!(elsewhere.structured["session"], "other");
    assert!(
        !offers(&completion_texts(&elsewhere), "meth"),
        "{elsewhere:#?}"
    );
}

// ------------------------------------------------------------------ inspect / help

#[tokio::test]
async fn inspect_shows_signature_doc_and_source_of_a_cell_function() {
    let server = StdioServer::start(&[]).await;
    server.exec("y = 1").await.assert_ok();
    let defined = server
        .exec(
            "unit = 'm'\n\
             def area(r, pi=3.14):\n\
             \x20   \"\"\"Area of a circle of radius r.\"\"\"\n\
             \x20   return pi * r * r\n",
        )
        .await;
    defined.assert_ok();
    let cell = defined.cell();

    let out = server.call("python_inspect", json!({"name": "area"})).await;
    assert_success(&out, "out");
    let detail = &out.structured["detail"];
    assert_eq!(detail["signature"], "(r, pi=3.14)", "{detail}");
    assert_eq!(detail["doc"], "Area of a circle of radius r.", "{detail}");
    let file = format!("<cell {cell}>");
    assert_eq!(detail["file"], file.as_str(), "{detail}");
    assert_eq!(detail["line"].as_u64(), Some(2), "{detail}");
    let source = detail["source"]
        .as_str()
        .unwrap_or_else(|| panic!("no source: {detail}"));
    assert!(source.starts_with("def area(r, pi=3.14):"), "{source:?}");
    assert!(source.contains("return pi * r * r"), "{source:?}");
    assert!(out.text.contains("defined in"), "{:?}", out.text);
    assert!(out.text.contains(&file), "{:?}", out.text);
    assert!(out.text.contains("def area"), "{:?}", out.text);
}

#[tokio::test]
async fn help_prints_plain_text_without_a_pager() {
    let server = StdioServer::start(&[]).await;
    let out = server.exec("help(len)").await;
    out.assert_ok();
    let stdout = out.str_field("stdout");
    assert!(
        stdout.contains("Help on built-in function len"),
        "{stdout:?}"
    );
    // The session is not stuck in a pager afterwards.
    let next = server.exec("'after help'").await;
    next.assert_ok();
    assert_eq!(next.value(), Some("'after help'"));
}

// ------------------------------------------------------------------ namespace

#[tokio::test]
async fn namespace_set_delete_and_clear() {
    let server = StdioServer::start(&[]).await;
    let set = server
        .call(
            "python_namespace",
            json!({"action": "set", "name": "cfg", "value": {"lr": 0.1, "layers": [1, 2]}}),
        )
        .await;
    assert_success(&set, "set");
    assert_eq!(set.structured["changed"], json!(["cfg"]), "{set:#?}");
    let read = server.exec("cfg['layers'][1]").await;
    read.assert_ok();
    assert_eq!(read.value(), Some("2"));
    let lr = server.exec("cfg['lr']").await;
    lr.assert_ok();
    assert_eq!(lr.value(), Some("0.1"));

    let deleted = server
        .call(
            "python_namespace",
            json!({"action": "delete", "names": ["cfg"]}),
        )
        .await;
    assert_success(&deleted, "deleted");
    assert_eq!(
        deleted.structured["changed"],
        json!(["cfg"]),
        "{deleted:#?}"
    );
    server.exec("cfg").await.assert_raised("NameError");

    let missing = server
        .call(
            "python_namespace",
            json!({"action": "delete", "names": ["never_defined"]}),
        )
        .await;
    assert_refused(&missing, &["never_defined"]);

    let pid = session_host_pid(&server, "default").await;
    server
        .exec("import json\nkeep_me = json.dumps([1])\nother = 5")
        .await
        .assert_ok();
    let cleared = server
        .call("python_namespace", json!({"action": "clear"}))
        .await;
    assert_success(&cleared, "cleared");
    let changed: Vec<&str> = cleared.structured["changed"]
        .as_array()
        .unwrap_or_else(|| panic!("no changed array: {cleared:#?}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in ["json", "keep_me", "other"] {
        assert!(changed.contains(&name), "{name} not cleared: {changed:?}");
    }
    server.exec("keep_me").await.assert_raised("NameError");
    server.exec("other").await.assert_raised("NameError");
    server.exec("json").await.assert_raised("NameError");
    let modules = server.exec("import sys\n'json' in sys.modules").await;
    modules.assert_ok();
    assert_eq!(
        modules.value(),
        Some("True"),
        "imported modules stay loaded after clear"
    );
    assert_eq!(
        session_host_pid(&server, "default").await,
        pid,
        "clear keeps the same interpreter"
    );
}

#[tokio::test]
async fn namespace_edits_are_refused_while_a_cell_runs() {
    let server = StdioServer::start(&[]).await;
    let dir = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");
    let (started, gate) = (dir.path().join("started"), dir.path().join("gate"));
    let running = server
        .call(
            "python_exec",
            json!({"code": gated_cell(&started, &gate), "wait_s": 0}),
        )
        .await;
    assert_eq!(running.status(), "running", "{running:#?}");
    wait_for_file_line(&started, POLL_TIMEOUT).await;

    let refused = server
        .call(
            "python_namespace",
            json!({"action": "set", "name": "z", "value": 1}),
        )
        .await;
    assert_refused(&refused, &["busy"]);

    std::fs::write(&gate, "").expect("open the gate");
    server
        .call("python_wait", json!({"wait_s": 30}))
        .await
        .assert_ok();
    server.exec("z").await.assert_raised("NameError");
    let set = server
        .call(
            "python_namespace",
            json!({"action": "set", "name": "z", "value": null}),
        )
        .await;
    assert_success(&set, "set");
    let z = server.exec("z is None").await;
    z.assert_ok();
    assert_eq!(z.value(), Some("True"));
}

// ------------------------------------------------------------------ status and tool groups

fn assert_status_shape(out: &ToolOutput, workdir: &Path) {
    assert_success(out, "status");
    assert!(out.structured["sessions"].is_array(), "{out:#?}");
    let s = &out.structured["server"];
    for key in [
        "version",
        "uptime_s",
        "python",
        "workdir",
        "jobs",
        "tool_groups",
        "limits",
        "sandbox",
    ] {
        assert!(s.get(key).is_some(), "the status lacks {key}: {s}");
    }
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"), "{s}");
    assert!(s["uptime_s"].as_f64().is_some(), "{s}");
    let canonical = std::fs::canonicalize(workdir).expect("canonical workdir");
    assert_eq!(s["workdir"], canonical.to_str().expect("utf-8"), "{s}");
    assert!(!s["python"].as_str().unwrap_or_default().is_empty(), "{s}");
    assert!(!s["sandbox"].as_str().unwrap_or_default().is_empty(), "{s}");
    assert!(s["limits"].get("max-sessions").is_some(), "{s}");
}

fn tool_groups(out: &ToolOutput) -> Vec<&str> {
    out.structured["server"]["tool_groups"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_groups array: {out:#?}"))
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

#[tokio::test]
async fn sessions_status_reports_version_limits_groups_and_sessions() {
    let server = StdioServer::start(&["--max-sessions", "7"]).await;
    server.exec_in("stat", "1").await.assert_ok();
    let out = server
        .call("python_sessions", json!({"action": "status"}))
        .await;
    assert_status_shape(&out, server.workdir.path());
    assert_eq!(
        out.structured["server"]["limits"]["max-sessions"], 7,
        "{out:#?}"
    );
    let mut groups = tool_groups(&out);
    groups.sort_unstable();
    assert_eq!(
        groups,
        ["files", "more", "packages", "python", "shell"],
        "{out:#?}"
    );
    assert!(
        find_session(&out.structured, "stat").is_some(),
        "the status lists the sessions: {out:#?}"
    );
    assert!(out.text.contains("max-sessions"), "{:?}", out.text);
    assert!(
        !out.text.contains("viewer"),
        "no viewer runs: {:?}",
        out.text
    );
}

/// With --viewer, the status names its address for the agent to pass on,
/// and nothing that logs in (the token, the one-time links).
#[tokio::test]
async fn sessions_status_names_the_viewer_and_nothing_that_logs_in() {
    let secrets = tempfile::tempdir().expect("a directory for the token");
    let token = "status-viewer-token-0123456789abcdef";
    let file = secrets.path().join("viewer-tokens");
    std::fs::write(&file, format!("{token}\n")).expect("the viewer token");
    let server = StdioServer::start(&[
        "--viewer",
        "127.0.0.1:0",
        "--viewer-tokens",
        file.to_str().expect("utf-8"),
    ])
    .await;
    assert!(
        server
            .wait_stderr_contains("login?ticket=", Duration::from_secs(20))
            .await,
        "{}",
        server.stderr_log()
    );
    let log = server.stderr_log();
    let url = log
        .split("ferrepl viewer: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the viewer's address on stderr");
    let ticket = log
        .split("login?ticket=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("a one-time link on stderr");
    let out = server
        .call("python_sessions", json!({"action": "status"}))
        .await;
    assert!(
        out.text.contains(&format!("viewer: {url} ")),
        "{url}: {:?}",
        out.text
    );
    let everything = format!("{}{}", out.text, out.structured);
    assert!(
        !everything.contains(token)
            && !everything.contains(ticket)
            && !everything.contains("ticket"),
        "{everything}"
    );
}

#[tokio::test]
async fn tools_flag_exposes_only_the_chosen_groups() {
    let server = StdioServer::start(&["--tools", "python"]).await;
    let names = tool_names(server.peer()).await;
    assert_eq!(
        names,
        [
            "python_exec",
            "python_inspect",
            "python_output",
            "python_sessions",
            "python_wait",
        ],
        "exactly the python group"
    );
    for (tool, group) in [
        ("python_install", "packages"),
        ("python_history", "more"),
        ("python_run_file", "more"),
        ("python_complete", "more"),
        ("python_namespace", "more"),
    ] {
        assert!(
            !names.iter().any(|n| n == tool),
            "{tool} belongs to the {group} group: {names:?}"
        );
    }

    let status = server
        .call("python_sessions", json!({"action": "status"}))
        .await;
    assert_success(&status, "status");
    assert_eq!(tool_groups(&status), ["python"], "{status:#?}");
}

#[tokio::test]
async fn tools_flag_with_an_unknown_group_refuses_to_start() {
    let workdir = tempfile::tempdir().expect("tempdir");
    let mut cmd = server_command_plain();
    cmd.arg("--workdir")
        .arg(workdir.path())
        .args(["--tools", "bogus"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().expect("spawn ferrepl");
    let output = tokio::time::timeout(START_TIMEOUT, child.wait_with_output())
        .await
        .expect("ferrepl --tools bogus did not exit")
        .expect("wait for ferrepl");
    let stderr = strip_ansi(&String::from_utf8_lossy(&output.stderr));
    assert!(
        !output.status.success(),
        "ferrepl --tools bogus exited successfully; stderr:\n{stderr}"
    );
    assert!(stderr.contains("bogus"), "{stderr}");
    for group in ["python", "packages", "more", "shell", "files"] {
        assert!(
            stderr.contains(group),
            "stderr should name {group}: {stderr}"
        );
    }
}

// ------------------------------------------------------------------ HTTP

#[tokio::test]
async fn http_sessions_and_status() {
    let mut server = HttpServer::start(&["--max-sessions", "3"], &[]).await;
    let client = server.connect(None).await;
    let peer = client.peer();

    let status = call(peer, "python_sessions", json!({"action": "status"})).await;
    assert_status_shape(&status, server.workdir.path());
    assert_eq!(status.structured["server"]["limits"]["max-sessions"], 3);

    let dir = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");
    let created = call(
        peer,
        "python_sessions",
        json!({"action": "create", "session": "remote", "workdir": dir.path(), "env": {"MYVAR": "over-http"}}),
    )
    .await;
    assert_success(&created, "created");
    let out = call(
        peer,
        "python_exec",
        exec_args("remote", "import os; os.environ['MYVAR']"),
    )
    .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("'over-http'"));

    let history = call(peer, "python_history", json!({"session": "remote"})).await;
    assert_success(&history, "history");
    assert_eq!(
        history.structured["cells"][0]["code"],
        "import os; os.environ['MYVAR']"
    );

    let deleted = call(
        peer,
        "python_sessions",
        json!({"action": "delete", "session": "remote"}),
    )
    .await;
    assert_success(&deleted, "deleted");
    assert!(find_session(&deleted.structured, "remote").is_none());

    server.assert_alive();
    let _ = client.cancel().await;
}
