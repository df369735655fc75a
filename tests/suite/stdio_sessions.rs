//! Sessions over stdio: isolation, concurrency, crashes, reset, inspect,
//! listing, and shutdown on stdin EOF (a missing `--python` is refused at
//! start: `refusals`).

use crate::support::{
    EXIT_TIMEOUT, PID_PROBE_LINES, StdioServer, assert_status, host_pid_in_namespace,
    parse_namespaced_pids, pid_probe_code, py_path, session_host_pid, try_call, wait_for_file_line,
    wait_process_gone, worker_with_a_sleeping_child,
};
use serde_json::{Value, json};
use std::time::Duration;

/// Whether `text` has the number 3 as a word, next to some mention of exiting.
fn mentions_exit_code_3(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.contains("exit")
        && lower
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| w == "3")
}

fn find_session<'a>(listing: &'a Value, name: &str) -> Option<&'a Value> {
    listing["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("python_sessions has no sessions array: {listing}"))
        .iter()
        .find(|s| s["name"] == name)
}

#[tokio::test]
async fn sessions_are_independent() {
    let server = StdioServer::start(&[]).await;
    let set = server.exec_in("a", "y = 1").await;
    set.assert_ok();
    assert_eq!(set.str_field("session"), "a");
    assert_eq!(set.cell(), 1);

    let other = server.exec_in("b", "y").await;
    other.assert_raised("NameError");
    assert_eq!(other.str_field("session"), "b");
    assert_eq!(other.cell(), 1, "cell numbers are per session: {other:#?}");

    let same = server.exec_in("a", "y").await;
    same.assert_ok();
    assert_eq!(same.value(), Some("1"));
    assert_eq!(same.cell(), 2);

    server.exec("y").await.assert_raised("NameError");
}

#[tokio::test]
async fn cells_in_two_sessions_run_at_the_same_time() {
    // Each cell announces itself with a file and then waits for the other
    // one's file: both can finish only if the two cells run concurrently.
    let server = StdioServer::start(&[]).await;
    let dir = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");
    let flag = |name: &str| dir.path().join(name);
    let rendezvous = |me: &str, other: &str| {
        format!(
            "import os, time\n\
             time.sleep(0.2)\n\
             open({me}, 'w').close()\n\
             deadline = time.monotonic() + 15\n\
             while not os.path.exists({other}):\n\
             \x20   if time.monotonic() > deadline:\n\
             \x20       raise TimeoutError('the other session never ran at the same time')\n\
             \x20   time.sleep(0.01)\n\
             'met'",
            me = py_path(&flag(me)),
            other = py_path(&flag(other)),
        )
    };
    let code1 = rendezvous("s1.flag", "s2.flag");
    let code2 = rendezvous("s2.flag", "s1.flag");
    let (r1, r2) = tokio::join!(
        server.call(
            "python_exec",
            json!({ "code": code1, "session": "s1", "wait_s": 30 })
        ),
        server.call(
            "python_exec",
            json!({ "code": code2, "session": "s2", "wait_s": 30 })
        ),
    );
    r1.assert_ok();
    r2.assert_ok();
    assert_eq!(r1.value(), Some("'met'"));
    assert_eq!(r2.value(), Some("'met'"));
    assert_eq!(r1.str_field("session"), "s1");
    assert_eq!(r2.str_field("session"), "s2");
}

#[tokio::test]
async fn a_crash_is_reported_and_the_session_comes_back_empty() {
    let mut server = StdioServer::start(&[]).await;
    server.exec("x = 1").await.assert_ok();
    server.exec_in("other", "keep = 9").await.assert_ok();

    let crash = server.exec("import os; os._exit(3)").await;
    assert!(crash.is_error, "a crash must be an error: {crash:#?}");
    assert_eq!(crash.status(), "crashed", "{crash:#?}");
    assert!(
        mentions_exit_code_3(&crash.text),
        "crash text does not mention exit code 3: {:?}",
        crash.text
    );

    let after = server.exec("1 + 1").await;
    after.assert_ok();
    assert_eq!(after.value(), Some("2"));
    assert!(
        after.text.to_lowercase().contains("lost"),
        "the first cell after a crash must say the state was lost: {:?}",
        after.text
    );

    server.exec("x").await.assert_raised("NameError");

    let other = server.exec_in("other", "keep").await;
    other.assert_ok();
    assert_eq!(other.value(), Some("9"), "another session was disturbed");
    server.assert_alive();
    server.assert_clean_stdout();
}

#[tokio::test]
async fn a_worker_killed_by_sigkill_is_reported_as_crashed() {
    let mut server = StdioServer::start(&[]).await;
    server
        .exec_in("other", "keep = 'still here'")
        .await
        .assert_ok();
    let crash = server
        .exec("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        .await;
    assert!(crash.is_error, "a crash must be an error: {crash:#?}");
    assert_eq!(crash.status(), "crashed", "{crash:#?}");
    assert!(
        crash.text.contains("SIGKILL") || crash.text.to_lowercase().contains("signal 9"),
        "crash text does not name the signal: {:?}",
        crash.text
    );
    let after = server.exec("'back'").await;
    after.assert_ok();
    assert_eq!(after.value(), Some("'back'"));
    let other = server.exec_in("other", "keep").await;
    other.assert_ok();
    assert_eq!(other.value(), Some("'still here'"));
    server.assert_alive();
}

#[tokio::test]
async fn reset_clears_state_in_a_new_interpreter() {
    let server = StdioServer::start(&[]).await;
    server.exec_in("work", "z = 5").await.assert_ok();
    // Host pids: inside its own PID namespace every interpreter is pid 2.
    let old_pid = session_host_pid(&server, "work").await;
    server.exec_in("keep", "k = 1").await.assert_ok();

    let reset = server
        .call(
            "python_sessions",
            json!({ "action": "reset", "session": "work" }),
        )
        .await;
    assert!(!reset.is_error, "reset must not be an error: {reset:#?}");

    server.exec_in("work", "z").await.assert_raised("NameError");
    assert_ne!(
        session_host_pid(&server, "work").await,
        old_pid,
        "reset must start a new interpreter"
    );
    let kept = server.exec_in("keep", "k").await;
    kept.assert_ok();
    assert_eq!(kept.value(), Some("1"), "reset touched another session");
}

#[tokio::test]
async fn reset_of_the_default_session() {
    let server = StdioServer::start(&[]).await;
    server.exec("z = 5").await.assert_ok();
    let reset = server
        .call("python_sessions", json!({ "action": "reset" }))
        .await;
    assert!(!reset.is_error, "reset must not be an error: {reset:#?}");
    server.exec("z").await.assert_raised("NameError");
}

const INSPECT_SETUP: &str = "import os\nimport math\nfrom math import sqrt\nxs = [1,2,3]\n\
def myfn(a, b=2):\n    \"doc here\"\n    return a\n_private = 1";

#[tokio::test]
async fn inspect_lists_user_variables_only() {
    let server = StdioServer::start(&[]).await;
    server.exec(INSPECT_SETUP).await.assert_ok();
    let out = server.call("python_inspect", json!({})).await;
    assert!(!out.is_error, "{out:#?}");
    let vars = out.structured["variables"]
        .as_array()
        .unwrap_or_else(|| panic!("no variables array: {out:#?}"));
    let names: Vec<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
    for hidden in ["os", "math", "sqrt", "_private"] {
        assert!(
            !names.contains(&hidden),
            "{hidden} should not be listed: {names:?}"
        );
    }
    let xs = vars
        .iter()
        .find(|v| v["name"] == "xs")
        .unwrap_or_else(|| panic!("xs not listed: {names:?}"));
    assert_eq!(xs["type"], "list", "{xs}");
    assert_eq!(xs["len"], 3, "{xs}");
    assert!(
        xs["repr"].as_str().is_some_and(|r| r.contains("[1, 2, 3]")),
        "{xs}"
    );
    let myfn = vars
        .iter()
        .find(|v| v["name"] == "myfn")
        .unwrap_or_else(|| panic!("myfn not listed: {names:?}"));
    assert!(
        myfn["type"].is_string() && myfn["repr"].is_string(),
        "{myfn}"
    );
    assert!(out.text.contains("xs"), "text lacks xs: {:?}", out.text);
    assert!(out.text.contains("myfn"), "text lacks myfn: {:?}", out.text);
}

#[tokio::test]
async fn inspect_one_name_shows_signature_and_doc() {
    let server = StdioServer::start(&[]).await;
    server.exec(INSPECT_SETUP).await.assert_ok();
    let out = server
        .call("python_inspect", json!({ "name": "myfn" }))
        .await;
    assert!(!out.is_error, "{out:#?}");
    let everything = format!("{}\n{}", out.text, out.structured);
    assert!(
        everything.contains("(a, b=2)"),
        "signature missing: {everything}"
    );
    assert!(
        everything.contains("doc here"),
        "docstring missing: {everything}"
    );

    let missing = server
        .call("python_inspect", json!({ "name": "nope_not_here" }))
        .await;
    assert!(
        missing.is_error,
        "inspecting an unknown name must fail: {missing:#?}"
    );
    assert!(
        missing.text.contains("nope_not_here"),
        "the error should name the missing variable: {:?}",
        missing.text
    );
}

#[tokio::test]
async fn inspect_is_per_session() {
    let server = StdioServer::start(&[]).await;
    server.exec_in("left", "only_left = 1").await.assert_ok();
    server.exec_in("right", "only_right = 2").await.assert_ok();
    let out = server
        .call("python_inspect", json!({ "session": "right" }))
        .await;
    assert!(!out.is_error, "{out:#?}");
    let names: Vec<&str> = out.structured["variables"]
        .as_array()
        .unwrap_or_else(|| panic!("no variables array: {out:#?}"))
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(names.contains(&"only_right"), "{names:?}");
    assert!(!names.contains(&"only_left"), "{names:?}");
}

#[tokio::test]
async fn sessions_lists_default_and_used_sessions() {
    let server = StdioServer::start(&[]).await;
    let fresh = server.call("python_sessions", json!({})).await;
    assert!(!fresh.is_error, "{fresh:#?}");
    assert!(
        find_session(&fresh.structured, "default").is_some(),
        "the default session must exist from the start: {}",
        fresh.structured
    );

    // The listing gives the interpreter's host pid (the cell sees its pid in
    // the session's own PID namespace).
    let pid_out = server.exec_in("a", &pid_probe_code()).await;
    pid_out.assert_ok();
    let (namespace, inner) = parse_namespaced_pids(pid_out.value());
    let worker_pid = host_pid_in_namespace(&namespace, inner[0]);
    server.exec_in("a", "1").await.assert_ok();

    let listing = server.call("python_sessions", json!({})).await;
    assert!(!listing.is_error, "{listing:#?}");
    let a = find_session(&listing.structured, "a")
        .unwrap_or_else(|| panic!("session a not listed: {}", listing.structured));
    assert_eq!(a["state"], "idle", "{a}");
    assert_eq!(a["pid"].as_u64(), Some(u64::from(worker_pid)), "{a}");
    assert_eq!(a["cells"].as_u64(), Some(2), "{a}");
    assert!(
        a["uptime_s"].as_f64().is_some_and(|s| s >= 0.0),
        "uptime_s: {a}"
    );
    match &a["memory_bytes"] {
        Value::Null => {}
        m => assert!(m.as_u64().is_some_and(|b| b > 0), "memory_bytes: {a}"),
    }
    assert!(
        find_session(&listing.structured, "default").is_some(),
        "default vanished: {}",
        listing.structured
    );
}

/// A process names itself (prctl PR_SET_NAME) and may choose bytes that are
/// not UTF-8, with parentheses: its memory still counts for its session.
#[tokio::test]
async fn memory_of_a_process_with_a_hostile_name_still_counts() {
    let server = StdioServer::start(&[]).await;
    let code = "import subprocess, sys\n\
        child = subprocess.Popen([sys.executable, '-c', \"import ctypes, sys\\n\
        ctypes.CDLL(None).prctl(15, b'\\\\xff(x) \\\\xfe)', 0, 0, 0)\\n\
        hold = bytearray(b'x') * (96 << 20)\\n\
        print('ready', flush=True)\\n\
        sys.stdin.read()\"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n\
        child.stdout.readline().decode().strip()";
    let out = server.exec_in("named", code).await;
    out.assert_ok();
    assert_eq!(out.value(), Some("'ready'"), "{out:#?}");
    let listing = server.call("python_sessions", json!({})).await;
    let row = find_session(&listing.structured, "named")
        .unwrap_or_else(|| panic!("not listed: {}", listing.structured));
    let bytes = row["memory_bytes"].as_u64().unwrap_or(0);
    assert!(
        bytes >= 96 << 20,
        "the 96 MiB child with a non-UTF-8 name was not counted: {row}"
    );
}

#[tokio::test]
async fn stdin_eof_kills_workers_and_their_children() {
    let server = StdioServer::start(&[]).await;
    let (worker_pid, sleep_pid) = worker_with_a_sleeping_child(&server).await;

    let _status = server.close_and_wait().await;
    assert!(
        wait_process_gone(worker_pid, EXIT_TIMEOUT).await,
        "worker {worker_pid} survived the server's shutdown"
    );
    assert!(
        wait_process_gone(sleep_pid, EXIT_TIMEOUT).await,
        "sleep {sleep_pid} started by a cell survived the server's shutdown"
    );
}

#[tokio::test]
async fn stdin_eof_during_a_running_cell_kills_everything() {
    let server = StdioServer::start(&[]).await;
    let pidfile = server.workdir.path().join("busy.pids");
    // The pids are those of the session's PID namespace, written with it.
    let code = format!(
        "import os, subprocess, time\n\
         {PID_PROBE_LINES}\n\
         p = subprocess.Popen(['sleep', '300'])\n\
         with open({path}, 'w') as f:\n\
         \x20   f.write('%s %d %d\\n' % (_pid_ns, os.getpid(), p.pid))\n\
         time.sleep(300)",
        path = py_path(&pidfile)
    );
    let peer = server.peer().clone();
    let running = tokio::spawn(async move {
        let _ = try_call(&peer, "python_exec", json!({ "code": code })).await;
    });
    let line = wait_for_file_line(&pidfile, Duration::from_secs(20)).await;
    let (namespace, inner) = parse_namespaced_pids(Some(line.as_str()));
    assert_eq!(inner.len(), 2, "{line:?}");
    let pids: Vec<u32> = inner
        .iter()
        .map(|p| host_pid_in_namespace(&namespace, *p))
        .collect();

    let _status = server.close_and_wait().await;
    running.abort();
    for pid in pids {
        assert!(
            wait_process_gone(pid, EXIT_TIMEOUT).await,
            "process {pid} of a busy session survived the server's shutdown"
        );
    }
}

/// An answer to a prompt travels beside the cells (the driver's side
/// socket): one held up behind a slow inspect until its cell was
/// interrupted is not taken as the answer to the next cell's prompt.
#[tokio::test]
async fn a_late_answer_to_an_interrupted_prompt_does_not_answer_the_next() {
    let server = StdioServer::start(&[]).await;
    let slow = "import os, time\n\
                class Slow:\n\
                \x20   def __repr__(self):\n\
                \x20       open('inspecting', 'w').write('started\\n')\n\
                \x20       time.sleep(1.5)\n\
                \x20       return 'slow'\n\
                obj = Slow()";
    server.exec_in("k", slow).await.assert_ok();
    let asked = server.exec_in("k", "input('first? ')").await;
    assert_status(&asked, "waiting_input");
    // The driver's control thread is busy in obj's repr...
    let inspect = {
        let peer = server.peer().clone();
        tokio::spawn(async move {
            let args = json!({"session": "k", "name": "obj"});
            crate::support::call(&peer, "python_inspect", args).await
        })
    };
    let flag = server.workdir.path().join("inspecting");
    wait_for_file_line(&flag, Duration::from_secs(30)).await;
    // ...so this answer waits behind it while its cell is interrupted.
    let answer = json!({"session": "k", "input": "stale", "wait_s": 0.1});
    server.call("python_wait", answer).await;
    let stopped = server
        .call("python_wait", json!({"session": "k", "interrupt": true}))
        .await;
    assert_status(&stopped, "interrupted");
    let next = server
        .call(
            "python_exec",
            json!({"session": "k", "code": "input('second? ')", "wait_s": 3}),
        )
        .await;
    assert_status(&next, "waiting_input");
    let inspected = inspect.await.unwrap();
    assert!(inspected.text.contains("repr: slow"), "{inspected:#?}");
    let answered = server
        .call("python_wait", json!({"session": "k", "input": "fresh"}))
        .await;
    assert_eq!(answered.value(), Some("'fresh'"), "{answered:#?}");
}

/// A prompt of a MiB (the cell's code chooses it) is shown capped, in the
/// prompt and in the echo once answered.
#[tokio::test]
async fn a_huge_input_prompt_is_capped() {
    let server = StdioServer::start(&[]).await;
    let asked = server.exec_in("k", "input('Q' * (1 << 20))").await;
    assert_status(&asked, "waiting_input");
    let prompt = asked.structured["prompt"].as_str().unwrap_or_default();
    // MAX_PROMPT_CHARS in ferrepl_driver/stdin.py.
    assert!(
        prompt.starts_with(&"Q".repeat(4000)) && prompt.ends_with("... [1044576 more characters]"),
        "a prompt of {} characters",
        prompt.len()
    );
    assert!(asked.text.len() < 64 * 1024, "{} bytes", asked.text.len());
    let answered = server
        .call("python_wait", json!({"session": "k", "input": "a"}))
        .await;
    assert_eq!(answered.value(), Some("'a'"), "{answered:#?}");
    assert!(
        answered.text.len() < 64 * 1024,
        "{} bytes",
        answered.text.len()
    );
}
