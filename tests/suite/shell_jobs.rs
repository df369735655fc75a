//! Shell jobs through a real MCP client: shell_exec, shell_wait (which also
//! types input, sends signals and lists jobs) and shell_output over stdio
//! (and a little over streamable HTTP).
//!
//! Synchronisation is done by bounded polling of observable state (files the
//! job writes, /proc, tool results), never by sleeping in the test.

use std::time::Duration;

use crate::support::{
    CALL_TIMEOUT, EXIT_TIMEOUT, HttpServer, Launch, Recorder, StdioServer, ToolOutput,
    assert_tool_error, call, host_pid, path_str, process_alive, sh_quote, start_call,
    wait_for_file_line, wait_process_gone,
};
use rmcp::model::ServerResult;
use serde_json::{Value, json};

/// Upper bound for something the test polls for (a file, a process exit).
const POLL_TIMEOUT: Duration = Duration::from_secs(15);

// ------------------------------------------------------------------ helpers

/// Field accessors for job results (shell_exec / shell_wait).
trait JobFields {
    fn job_id(&self) -> String;
    fn exit_code(&self) -> Option<i64>;
    fn signal(&self) -> Option<String>;
    fn pid(&self) -> u32;
    fn stdout(&self) -> String;
    fn stderr(&self) -> String;
    fn assert_running(&self) -> &Self;
    fn assert_exited(&self) -> &Self;
    fn assert_tool_error(&self) -> &Self;
}

impl JobFields for ToolOutput {
    fn job_id(&self) -> String {
        self.str_field("job").to_string()
    }

    fn exit_code(&self) -> Option<i64> {
        match &self.structured["exit_code"] {
            Value::Null => None,
            v => Some(
                v.as_i64()
                    .unwrap_or_else(|| panic!("exit_code is not an integer in {self:#?}")),
            ),
        }
    }

    fn signal(&self) -> Option<String> {
        match &self.structured["signal"] {
            Value::Null => None,
            v => Some(
                v.as_str()
                    .unwrap_or_else(|| panic!("signal is not a string in {self:#?}"))
                    .to_string(),
            ),
        }
    }

    fn pid(&self) -> u32 {
        let pid = self.structured["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("pid is not an integer in {self:#?}"));
        u32::try_from(pid).expect("pid fits in u32")
    }

    fn stdout(&self) -> String {
        self.str_field("stdout").to_string()
    }

    fn stderr(&self) -> String {
        self.str_field("stderr").to_string()
    }

    fn assert_running(&self) -> &Self {
        assert!(!self.is_error, "a running job is not an error: {self:#?}");
        assert_eq!(self.status(), "running", "status of {self:#?}");
        self
    }

    fn assert_exited(&self) -> &Self {
        assert_eq!(self.status(), "exited", "status of {self:#?}");
        self
    }

    fn assert_tool_error(&self) -> &Self {
        assert_tool_error(self, "a refused shell tool call")
    }
}

/// shell_exec of `command` with extra arguments merged in.
async fn exec(srv: &StdioServer, command: &str, extra: Value) -> ToolOutput {
    let mut args = json!({ "command": command });
    if let (Value::Object(a), Value::Object(e)) = (&mut args, extra) {
        a.extend(e);
    }
    srv.call("shell_exec", args).await
}

/// Calls shell_wait until the job has exited (bounded), returning every
/// result in order (the last one is the exited one).
async fn wait_until_exited(srv: &StdioServer, job: &str) -> Vec<ToolOutput> {
    let mut results = Vec::new();
    for _ in 0..20 {
        let r = srv
            .call("shell_wait", json!({ "job": job, "wait_s": 10 }))
            .await;
        let exited = r.status() == "exited";
        results.push(r);
        if exited {
            return results;
        }
    }
    panic!("job {job} did not exit after 20 shell_wait calls: {results:#?}");
}

/// Polls shell_output until the job's full output contains `needle`.
async fn wait_output_contains(srv: &StdioServer, job: &str, needle: &str) {
    let deadline = tokio::time::Instant::now() + POLL_TIMEOUT;
    loop {
        let out = srv.call("shell_output", json!({ "job": job })).await;
        assert!(!out.is_error, "shell_output failed: {out:#?}");
        if out.str_field("text").contains(needle) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {job} did not print {needle:?} within {POLL_TIMEOUT:?}: {out:#?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Asserts that `pid` is gone (or a zombie) within the poll bound.
async fn assert_gone(pid: u32, what: &str) {
    assert!(
        wait_process_gone(pid, POLL_TIMEOUT).await,
        "{what} (pid {pid}) is still alive"
    );
}

/// The host pid of the background child whose pid a job wrote (`$!`, a pid
/// of the job's own PID namespace) to `pid_file`; `job_pid` is the job's
/// pid as the server reports it (a host pid, the job's root process).
async fn background_child(job_pid: u32, pid_file: &std::path::Path) -> u32 {
    let inner: u32 = wait_for_file_line(pid_file, POLL_TIMEOUT)
        .await
        .trim()
        .parse()
        .expect("the pid file holds a pid");
    host_pid(job_pid, inner)
}

// ------------------------------------------------------------------ 1. exit codes and streams

#[tokio::test]
async fn exit_code_stdout_and_stderr_are_reported() {
    let srv = StdioServer::start(&[]).await;

    let r = exec(&srv, "echo hi; echo err >&2; exit 3", json!({})).await;
    r.assert_exited();
    assert!(r.is_error, "a non-zero exit is an error: {r:#?}");
    assert_eq!(r.exit_code(), Some(3), "{r:#?}");
    assert_eq!(r.signal(), None, "{r:#?}");
    assert_eq!(r.stdout(), "hi\n", "{r:#?}");
    assert_eq!(r.stderr(), "err\n", "{r:#?}");
    assert_eq!(r.job_id(), "j1");
    assert_eq!(r.str_field("command"), "echo hi; echo err >&2; exit 3");
    assert_eq!(r.structured["pty"], json!(false), "{r:#?}");
    assert!(r.text.contains("hi"), "{r:#?}");
    let footer = format!("-- exit 3 | job j1 | pid {} |", r.pid());
    assert!(
        r.text.lines().last().unwrap_or("").starts_with(&footer),
        "the text ends with a footer starting {footer:?}: {r:#?}"
    );
    assert!(r.text.ends_with(" s --"), "{r:#?}");

    let ok = exec(&srv, "true", json!({})).await;
    ok.assert_exited();
    assert!(!ok.is_error, "exit 0 is not an error: {ok:#?}");
    assert_eq!(ok.exit_code(), Some(0), "{ok:#?}");
    assert_eq!(ok.job_id(), "j2");

    srv.assert_clean_stdout();
    srv.close_and_wait().await;
}

// ------------------------------------------------------------------ 2. stdin

#[tokio::test]
async fn shell_wait_input_feeds_a_running_job() {
    let srv = StdioServer::start(&[]).await;

    let first = exec(
        &srv,
        "read a; echo got $a; read b; echo got2 $b",
        json!({ "wait_s": 0.5 }),
    )
    .await;
    first.assert_running();
    let job = first.job_id();

    let in1 = srv
        .call("shell_wait", json!({ "job": job, "input": "first" }))
        .await;
    assert!(!in1.is_error, "{in1:#?}");
    let in2 = srv
        .call(
            "shell_wait",
            json!({ "job": job, "input": "second", "wait_s": 10 }),
        )
        .await;
    in2.assert_exited();
    assert!(!in2.is_error, "{in2:#?}");
    assert_eq!(in2.exit_code(), Some(0), "{in2:#?}");

    let all = format!("{}{}{}", first.stdout(), in1.stdout(), in2.stdout());
    assert!(all.contains("got first"), "outputs together: {all:?}");
    assert!(all.contains("got2 second"), "outputs together: {all:?}");

    // Input to a finished job is a tool error.
    let late = srv
        .call("shell_wait", json!({ "job": job, "input": "third" }))
        .await;
    late.assert_tool_error();

    srv.close_and_wait().await;
}

#[tokio::test]
async fn stdin_parameter_and_eof() {
    let srv = StdioServer::start(&[]).await;

    let wc = exec(&srv, "wc -l", json!({ "stdin": "a\nb\nc\n" })).await;
    wc.assert_exited();
    assert_eq!(wc.exit_code(), Some(0), "{wc:#?}");
    assert_eq!(wc.stdout().trim(), "3", "{wc:#?}");

    let cat = exec(&srv, "cat", json!({ "wait_s": 0.2 })).await;
    cat.assert_running();
    let job = cat.job_id();
    let done = srv
        .call(
            "shell_wait",
            json!({ "job": job, "input": "hello cat", "eof": true, "wait_s": 10 }),
        )
        .await;
    done.assert_exited();
    assert!(!done.is_error, "{done:#?}");
    assert_eq!(done.exit_code(), Some(0), "{done:#?}");
    let all = format!("{}{}", cat.stdout(), done.stdout());
    assert_eq!(all, "hello cat\n", "cat's output: {done:#?}");

    srv.close_and_wait().await;
}

// ------------------------------------------------------------------ 3. pty

#[tokio::test]
async fn pty_jobs_see_a_terminal_and_pipe_jobs_do_not() {
    let srv = StdioServer::start(&[]).await;
    let command = "tty; python3 -c 'import sys; print(sys.stdin.isatty())'";

    let on_pty = exec(&srv, command, json!({ "pty": true })).await;
    on_pty.assert_exited();
    assert_eq!(on_pty.structured["pty"], json!(true), "{on_pty:#?}");
    let out = on_pty.stdout();
    assert!(out.contains("/dev/pts"), "tty on a pty: {on_pty:#?}");
    assert!(out.contains("True"), "isatty on a pty: {on_pty:#?}");

    let piped = exec(&srv, command, json!({})).await;
    piped.assert_exited();
    assert_eq!(piped.structured["pty"], json!(false), "{piped:#?}");
    let out = piped.stdout();
    assert!(out.contains("not a tty"), "tty on pipes: {piped:#?}");
    assert!(out.contains("False"), "isatty on pipes: {piped:#?}");
    assert!(!out.contains("/dev/pts"), "{piped:#?}");

    srv.close_and_wait().await;
}

// ------------------------------------------------------------------ 4. kill

#[tokio::test]
async fn kill_stops_the_whole_process_group() {
    let srv = StdioServer::start(&[]).await;
    let pid_file = srv.workdir.path().join("child.pid");
    let command = format!(
        "sleep 300 & echo $! > {}; sleep 300",
        sh_quote(path_str(&pid_file))
    );

    let started = exec(&srv, &command, json!({ "wait_s": 1 })).await;
    started.assert_running();
    let job = started.job_id();
    let job_pid = started.pid();
    let child = background_child(job_pid, &pid_file).await;
    assert!(
        process_alive(child),
        "the background child runs before the kill"
    );

    let killed = srv
        .call("shell_wait", json!({ "job": job, "signal": "TERM" }))
        .await;
    killed.assert_exited();
    assert!(
        killed.is_error,
        "a job killed by a signal is an error: {killed:#?}"
    );
    let signal = killed.signal();
    assert!(
        matches!(signal.as_deref(), Some("SIGTERM" | "SIGKILL")),
        "signal of {killed:#?}"
    );
    assert_eq!(killed.exit_code(), None, "{killed:#?}");
    assert!(
        killed
            .text
            .contains(&format!("killed by {}", signal.unwrap())),
        "footer of {killed:#?}"
    );

    assert_gone(child, "the job's background child").await;
    assert_gone(job_pid, "the job's shell").await;

    let listed = srv.call("shell_wait", json!({})).await;
    assert_eq!(
        listed.structured["jobs"][0]["status"], "exited",
        "{listed:#?}"
    );

    srv.close_and_wait().await;
}

/// Default configuration (the sandbox launcher sits between the server and
/// /bin/sh).
#[tokio::test]
async fn kill_escalates_to_sigkill_when_term_is_ignored() {
    term_ignoring_job_is_killed(&[]).await;
}

/// The same without the sandbox launcher.
#[tokio::test]
async fn kill_escalates_to_sigkill_when_term_is_ignored_without_sandbox() {
    term_ignoring_job_is_killed(&["--sandbox", "off"]).await;
}

async fn term_ignoring_job_is_killed(server_args: &[&str]) {
    let srv = StdioServer::start(server_args).await;

    let started = exec(
        &srv,
        "trap '' TERM; echo ready; sleep 300",
        json!({ "wait_s": 0.2 }),
    )
    .await;
    started.assert_running();
    let job = started.job_id();
    let pid = started.pid();
    // The trap is in place once "ready" is printed.
    wait_output_contains(&srv, &job, "ready").await;

    let killed = srv
        .call("shell_wait", json!({ "job": job, "signal": "TERM" }))
        .await;
    killed.assert_exited();
    assert!(killed.is_error, "{killed:#?}");
    assert_eq!(killed.signal().as_deref(), Some("SIGKILL"), "{killed:#?}");
    let notes = killed.structured["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("notes is not an array in {killed:#?}"));
    assert!(
        notes
            .iter()
            .filter_map(Value::as_str)
            .any(|n| n.contains("SIGKILL") && n.contains("SIGTERM")),
        "a note tells about the escalation: {killed:#?}"
    );
    assert!(killed.text.contains("SIGKILL"), "{killed:#?}");
    assert_gone(pid, "the job ignoring TERM").await;

    srv.close_and_wait().await;
}

#[tokio::test]
async fn kill_with_a_chosen_signal_and_a_bad_one() {
    let srv = StdioServer::start(&[]).await;

    let started = exec(&srv, "sleep 300", json!({ "wait_s": 0.2 })).await;
    started.assert_running();
    let job = started.job_id();

    let bogus = srv
        .call("shell_wait", json!({ "job": job, "signal": "BOGUS" }))
        .await;
    bogus.assert_tool_error();
    assert!(bogus.text.contains("BOGUS"), "{bogus:#?}");

    // The bad signal left the job alone.
    let still = srv
        .call("shell_wait", json!({ "job": job, "wait_s": 0 }))
        .await;
    still.assert_running();

    let killed = srv
        .call("shell_wait", json!({ "job": job, "signal": "INT" }))
        .await;
    killed.assert_exited();
    assert!(killed.is_error, "{killed:#?}");
    assert!(
        killed.signal().as_deref() == Some("SIGINT") || killed.exit_code() == Some(130),
        "the job ended through SIGINT: {killed:#?}"
    );
    assert_gone(started.pid(), "the job sent SIGINT").await;

    let unknown = srv
        .call("shell_wait", json!({ "job": "j77", "signal": "TERM" }))
        .await;
    unknown.assert_tool_error();

    srv.close_and_wait().await;
}

// ------------------------------------------------------------------ 5. wait

#[tokio::test]
async fn shell_wait_returns_only_new_output() {
    let srv = StdioServer::start(&[]).await;

    let first = exec(
        &srv,
        "for i in 1 2 3; do echo line$i; sleep 0.3; done",
        json!({ "wait_s": 0.1 }),
    )
    .await;
    let mut all = first.stdout();
    if first.status() == "running" {
        for r in wait_until_exited(&srv, &first.job_id()).await {
            all.push_str(&r.stdout());
            if r.status() == "exited" {
                assert_eq!(r.exit_code(), Some(0), "{r:#?}");
                assert!(!r.is_error, "{r:#?}");
            }
        }
    }
    assert_eq!(all, "line1\nline2\nline3\n");

    // Once everything was returned, another wait brings nothing new.
    let again = srv
        .call("shell_wait", json!({ "job": first.job_id(), "wait_s": 1 }))
        .await;
    again.assert_exited();
    assert_eq!(again.stdout(), "", "{again:#?}");

    srv.close_and_wait().await;
}

// ------------------------------------------------------------------ 6. large output

#[tokio::test]
async fn large_output_is_counted_and_readable_with_shell_output() {
    let srv = StdioServer::start(&[]).await;
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();

    let r = exec(&srv, "seq 1 200000", json!({})).await;
    r.assert_exited();
    assert_eq!(r.exit_code(), Some(0), "{}", r.text);
    assert_eq!(
        r.structured["output_bytes"].as_u64(),
        Some(expected.len() as u64),
        "output_bytes of {:#?}",
        r.structured
    );
    let omitted = r.structured["omitted_bytes"].as_u64().unwrap_or(0);
    assert!(omitted > 0, "the middle is omitted: {:#?}", r.structured);
    let marker = r
        .text
        .lines()
        .find(|l| l.contains("omitted here"))
        .unwrap_or_else(|| panic!("no omission marker in {}", r.text));
    assert!(
        marker.contains("shell_output") && !marker.contains("python_output"),
        "a job's marker points to shell_output: {marker}"
    );
    let stdout = r.stdout();
    assert!(stdout.starts_with("1\n2\n3\n"), "the head is kept");
    assert!(stdout.ends_with("199999\n200000\n"), "the tail is kept");
    let job = r.job_id();

    let grep = srv
        .call(
            "shell_output",
            json!({ "job": job, "grep": "^19999[0-9]$", "context": 0 }),
        )
        .await;
    assert!(!grep.is_error, "{grep:#?}");
    assert_eq!(grep.structured["matches"], json!(10), "{grep:#?}");
    assert_eq!(grep.str_field("job"), job);
    for n in 199_990..=199_999 {
        assert!(grep.str_field("text").contains(&n.to_string()), "{grep:#?}");
    }

    // Windows chained through next_offset give back the whole output.
    let mut offset = 0u64;
    let mut joined = String::new();
    let mut windows = 0;
    loop {
        windows += 1;
        assert!(windows <= 50, "too many windows");
        let w = srv
            .call(
                "shell_output",
                json!({ "job": job, "offset": offset, "limit": 200000 }),
            )
            .await;
        assert!(!w.is_error, "{}", w.text);
        assert_eq!(
            w.structured["total_chars"].as_u64(),
            Some(expected.len() as u64)
        );
        assert_eq!(w.structured["total_lines"].as_u64(), Some(200_000));
        joined.push_str(w.str_field("text"));
        match w.structured["next_offset"].as_u64() {
            Some(next) => {
                assert!(next > offset, "next_offset moves forward");
                offset = next;
            }
            None => break,
        }
    }
    assert!(windows > 1, "the output spans several windows");
    assert!(joined == expected, "the windows join to the whole output");

    srv.close_and_wait().await;
}

// ------------------------------------------------------------------ 7. listing and limits

#[tokio::test]
async fn shell_wait_without_a_job_lists_jobs_and_unknown_ids_are_errors() {
    let srv = StdioServer::start(&[]).await;

    let empty = srv.call("shell_wait", json!({})).await;
    assert!(!empty.is_error, "{empty:#?}");
    assert_eq!(empty.structured["jobs"], json!([]), "{empty:#?}");

    exec(&srv, "true", json!({})).await.assert_exited();
    exec(&srv, "exit 4", json!({})).await.assert_exited();
    let sleeper = exec(&srv, "sleep 300", json!({ "wait_s": 0.2 })).await;
    sleeper.assert_running();

    let listed = srv.call("shell_wait", json!({})).await;
    assert!(!listed.is_error, "{listed:#?}");
    let jobs = listed.structured["jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("jobs is not an array: {listed:#?}"));
    assert_eq!(jobs.len(), 3, "{listed:#?}");
    let row = |id: &str| {
        jobs.iter()
            .find(|j| j["job"] == id)
            .unwrap_or_else(|| panic!("no row for {id} in {listed:#?}"))
    };
    assert_eq!(row("j1")["status"], "exited");
    assert_eq!(row("j1")["exit_code"], 0);
    assert_eq!(row("j1")["command"], "true");
    assert_eq!(row("j2")["status"], "exited");
    assert_eq!(row("j2")["exit_code"], 4);
    assert_eq!(row("j3")["status"], "running");
    assert_eq!(row("j3")["exit_code"], Value::Null);
    assert_eq!(row("j3")["pid"], json!(sleeper.pid()));
    assert_eq!(row("j3")["pty"], json!(false));
    assert!(row("j3")["age_s"].as_f64().is_some(), "{listed:#?}");
    assert!(listed.text.contains("j3"), "{listed:#?}");

    for (tool, args) in [
        ("shell_wait", json!({ "job": "j99", "wait_s": 0 })),
        ("shell_wait", json!({ "job": "j99", "input": "x" })),
        ("shell_wait", json!({ "job": "j99", "signal": "TERM" })),
        ("shell_output", json!({ "job": "j99" })),
        ("shell_wait", json!({ "job": "nonsense" })),
    ] {
        let r = srv.call(tool, args).await;
        r.assert_tool_error();
        assert!(r.text.contains("no job"), "{tool}: {r:#?}");
        assert!(
            r.text.contains("shell_wait {} lists the jobs"),
            "the error says how to list the jobs: {tool}: {r:#?}"
        );
    }

    srv.call("shell_wait", json!({ "job": "j3", "signal": "KILL" }))
        .await
        .assert_exited();
    srv.close_and_wait().await;
}

#[tokio::test]
async fn max_jobs_limits_running_jobs() {
    let srv = StdioServer::start(&["--max-jobs", "1"]).await;

    let first = exec(&srv, "sleep 300", json!({ "wait_s": 0.2 })).await;
    first.assert_running();

    let refused = exec(&srv, "echo second", json!({})).await;
    refused.assert_tool_error();
    assert!(
        refused.text.contains("limit") && refused.text.contains("--max-jobs"),
        "the error names the limit: {refused:#?}"
    );

    let killed = srv
        .call(
            "shell_wait",
            json!({ "job": first.job_id(), "signal": "TERM" }),
        )
        .await;
    killed.assert_exited();

    let again = exec(&srv, "echo again", json!({})).await;
    again.assert_exited();
    assert!(!again.is_error, "{again:#?}");
    assert_eq!(again.stdout(), "again\n");

    srv.close_and_wait().await;
}

// ------------------------------------------------------------------ 8. cwd and environment

#[tokio::test]
async fn cwd_and_env_are_applied() {
    let srv = StdioServer::start(&[]).await;
    let sub = srv.workdir.path().join("sub").join("dir");
    std::fs::create_dir_all(&sub).expect("create the subdirectory");

    let r = exec(
        &srv,
        "pwd; echo $FOO",
        json!({ "cwd": "sub/dir", "env": { "FOO": "bar" } }),
    )
    .await;
    r.assert_exited();
    assert!(!r.is_error, "{r:#?}");
    let stdout = r.stdout();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{r:#?}");
    assert_eq!(
        std::fs::canonicalize(lines[0]).expect("pwd names a directory"),
        std::fs::canonicalize(&sub).expect("canonical subdirectory"),
        "{r:#?}"
    );
    assert_eq!(lines[1], "bar", "{r:#?}");

    let missing = exec(&srv, "pwd", json!({ "cwd": "no/such/dir" })).await;
    missing.assert_tool_error();

    srv.close_and_wait().await;
}

#[tokio::test]
async fn server_variables_are_hidden_from_jobs() {
    let srv = StdioServer::start_with_env(&[], &[("FERREPL_AUTH_TOKEN", "secret123")]).await;

    let r = exec(&srv, "env", json!({})).await;
    r.assert_exited();
    assert_eq!(r.exit_code(), Some(0), "{r:#?}");
    assert!(
        r.stdout().contains("PATH="),
        "env printed something: {r:#?}"
    );
    assert!(!r.stdout().contains("secret123"), "{r:#?}");
    assert!(!r.text.contains("secret123"), "{r:#?}");
    assert!(
        !r.stdout().lines().any(|l| l.starts_with("FERREPL_")),
        "{r:#?}"
    );

    srv.close_and_wait().await;
}

// ------------------------------------------------------------------ 9. progress

#[tokio::test]
async fn shell_exec_sends_progress_notifications() {
    // The full tool surface (the shell group), and a client that keeps the
    // progress notifications.
    let recorder = Recorder::default();
    let server = StdioServer::launch_with(Launch::new(&[]), recorder.clone()).await;

    let gate = server.workdir.path().join("gate");
    let command = format!(
        "i=0; while [ ! -e {} ]; do i=$((i+1)); echo tick$i; sleep 0.05; done; echo gate-seen",
        sh_quote(path_str(&gate))
    );
    let handle = start_call(
        server.peer(),
        "shell_exec",
        json!({ "command": command, "wait_s": 60 }),
    )
    .await;
    let token = handle.progress_token.clone();
    let response = tokio::spawn(handle.await_response());

    // The first job of a fresh server is j1; wait for two notifications that
    // name it, then open the gate.
    let deadline = tokio::time::Instant::now() + POLL_TIMEOUT;
    loop {
        let about_job = recorder
            .progress_for(&token)
            .iter()
            .filter(|p| p.message.as_deref().is_some_and(|m| m.contains("j1")))
            .count();
        if about_job >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress notifications naming j1 within {POLL_TIMEOUT:?}: {:#?}",
            recorder.progress_for(&token)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    std::fs::write(&gate, b"open").expect("create the gate file");

    let result = tokio::time::timeout(CALL_TIMEOUT, response)
        .await
        .expect("shell_exec answered in time")
        .expect("the response task")
        .expect("shell_exec succeeded at the protocol level");
    let ServerResult::CallToolResult(result) = result else {
        panic!("not a tool result: {result:?}");
    };
    let out = ToolOutput::from_result(result);
    out.assert_exited();
    assert_eq!(out.job_id(), "j1");
    assert_eq!(out.exit_code(), Some(0), "{}", out.text);
    assert!(out.stdout().contains("gate-seen"), "{}", out.text);

    let seen = recorder.progress_for(&token);
    assert!(seen.len() >= 2, "{seen:#?}");
    for pair in seen.windows(2) {
        assert!(
            pair[1].progress > pair[0].progress,
            "progress values increase: {seen:#?}"
        );
    }
    assert!(
        seen.iter()
            .any(|p| p.message.as_deref().is_some_and(|m| m.contains("tick"))),
        "a message carries the latest output line: {seen:#?}"
    );

    let mut child = server.child;
    let _ = server.client.cancel().await;
    let _ = tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await;
}

// ------------------------------------------------------------------ 10. shutdown

#[tokio::test]
async fn closing_stdin_ends_running_jobs() {
    let srv = StdioServer::start(&[]).await;
    let pid_file = srv.workdir.path().join("bg.pid");
    let command = format!(
        "sleep 300 & echo $! > {}; sleep 300",
        sh_quote(path_str(&pid_file))
    );

    let started = exec(&srv, &command, json!({ "wait_s": 0.2 })).await;
    started.assert_running();
    let job_pid = started.pid();
    let child = background_child(job_pid, &pid_file).await;
    assert!(process_alive(job_pid) && process_alive(child));

    srv.close_and_wait().await;

    assert_gone(job_pid, "the job's shell after the server exited").await;
    assert_gone(child, "the job's child after the server exited").await;
}

// ------------------------------------------------------------------ 11. HTTP

#[tokio::test]
async fn shell_jobs_over_http() {
    let mut srv = HttpServer::start(&[], &[]).await;
    let client = srv.connect(None).await;
    let peer = client.peer();

    let r = call(
        peer,
        "shell_exec",
        json!({ "command": "echo over-http; exit 2" }),
    )
    .await;
    r.assert_exited();
    assert!(r.is_error, "{r:#?}");
    assert_eq!(r.exit_code(), Some(2), "{r:#?}");
    assert_eq!(r.stdout(), "over-http\n", "{r:#?}");

    let sleeper = call(
        peer,
        "shell_exec",
        json!({ "command": "sleep 300", "wait_s": 0.2 }),
    )
    .await;
    sleeper.assert_running();
    let killed = call(
        peer,
        "shell_wait",
        json!({ "job": sleeper.job_id(), "signal": "TERM" }),
    )
    .await;
    killed.assert_exited();
    assert!(
        matches!(killed.signal().as_deref(), Some("SIGTERM" | "SIGKILL")),
        "{killed:#?}"
    );
    assert_gone(sleeper.pid(), "the killed job over HTTP").await;

    srv.assert_alive();
    let _ = client.cancel().await;
}

/// shell_wait's signal TERM goes to the job's process group; the sandbox
/// launcher in that group must not pass it on a second time.
#[tokio::test]
async fn sigterm_reaches_a_sandboxed_job_exactly_once() {
    let srv = StdioServer::start(&[]).await;
    let script = "import signal, time\n\
n = [0]\n\
def on_term(*_):\n    n[0] += 1\n\
signal.signal(signal.SIGTERM, on_term)\n\
print('ready', flush=True)\n\
while n[0] == 0:\n    time.sleep(0.02)\n\
time.sleep(0.3)\n\
print('terms', n[0], flush=True)\n";
    let path = srv.workdir.path().join("count_terms.py");
    std::fs::write(&path, script).expect("write the script");
    let started = exec(
        &srv,
        &format!("exec python3 {}", sh_quote(path_str(&path))),
        json!({ "wait_s": 0.2 }),
    )
    .await;
    started.assert_running();
    let job = started.job_id();
    wait_output_contains(&srv, &job, "ready").await;
    let killed = srv
        .call("shell_wait", json!({ "job": job, "signal": "TERM" }))
        .await;
    killed.assert_exited();
    let out = srv.call("shell_output", json!({ "job": job })).await;
    let all = out.str_field("text").to_string();
    assert!(
        all.contains("terms 1"),
        "the job must see SIGTERM exactly once: {all:?} / {killed:#?}"
    );
    srv.close_and_wait().await;
}
