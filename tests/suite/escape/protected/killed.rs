//! A server SIGKILLed while a session attacks, or a sandboxed process that
//! kills its supervisor, leaves only what the session made: never a write
//! to a protected place.

use std::collections::BTreeSet;

use serde_json::json;

use crate::escape::view::cell;
use crate::support::{
    ATTEMPT, Reaper, descendants, errno_of, job_python, unique, wait_for_file_line,
    wait_process_gone,
};

use super::attacks::*;
use super::*;

#[tokio::test]
async fn a_killed_server_leaves_only_what_the_session_made() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    std::fs::remove_dir(ws.join("scratch")).expect("rmdir scratch");
    let before = tree(ws);
    let marker = unique("ferrepl-protected-kill-");
    let _reaper = Reaper::of_marker(&marker);
    let server = serve(ws, &[]).await;

    // Refused attempts beside legitimate work, in a cell and in a job.
    let out = cell(
        server.peer(),
        "default",
        &format!(
            "{ATTEMPT}\nos.makedirs('made/b')\nopen('made/a.txt', 'w').write('a')\nopen('made/b/c.txt', 'w').write('c')\n\
             attempt('config', lambda: open('.git/config', 'a'))\n\
             attempt('mcp', lambda: open('.mcp.json', 'w'))\n\
             attempt('nested', lambda: os.makedirs('made/b/.git/hooks'))\n\
             attempt('envrc', lambda: open('made/.envrc', 'w'))\n"
        ),
    )
    .await;
    for label in ["config", "mcp", "nested", "envrc"] {
        assert_eq!(
            errno_of(&outcomes(&out)[label]),
            Some(EROFS),
            "{label}: {out:#?}"
        );
    }
    // A job left running after its own refused writes.
    let job_out = server
        .call(
            "shell_exec",
            json!({
                "command": format!(
                    "mkdir -p made/job && echo x > made/job/x; echo EVIL > .git/config; mkdir .claude; \
                     echo started > made/job/started; exec {py} -c 'import time; time.sleep(1000)' {marker}",
                    py = job_python(),
                ),
                "wait_s": 0.5,
            }),
        )
        .await;
    assert!(!job_out.is_error, "the job: {job_out:#?}");
    // A cell caught in the middle of a supervised call: opening a FIFO for
    // writing waits for a reader, on a thread of the supervisor's.
    let fifo_cell = server
        .call(
            "python_exec",
            json!({
                "code": "os.mkfifo('made/fifo')\nopen('made/before-open', 'w').write('1\\n')\nopen('made/fifo', 'w')\n",
                "wait_s": 0.5,
            }),
        )
        .await;
    assert_eq!(
        fifo_cell.status(),
        "running",
        "the FIFO cell: {fifo_cell:#?}"
    );
    wait_for_file_line(&ws.join("made/before-open"), EVENT_TIMEOUT).await;
    wait_for_file_line(&ws.join("made/job/started"), EVENT_TIMEOUT).await;

    let pids = descendants(server.pid());
    assert!(!pids.is_empty(), "the server has no sandboxed processes");
    server.sigkill_and_reap(EVENT_TIMEOUT).await;
    for pid in pids {
        assert!(
            wait_process_gone(pid, EVENT_TIMEOUT).await,
            "process {pid} of the killed server is still there"
        );
    }

    // Exactly the user's files and what the session made.
    let after = tree(ws);
    let made: BTreeSet<&str> = [
        "made",
        "made/a.txt",
        "made/b",
        "made/b/c.txt",
        "made/job",
        "made/job/x",
        "made/job/started",
        "made/fifo",
        "made/before-open",
    ]
    .into_iter()
    .collect();
    let listed: BTreeSet<&str> = after.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = before
        .keys()
        .map(String::as_str)
        .chain(made.iter().copied())
        .collect();
    assert_eq!(
        listed,
        expected,
        "the workspace holds other entries than the user's and the session's: extra {:?}, missing {:?}",
        listed.difference(&expected).collect::<Vec<_>>(),
        expected.difference(&listed).collect::<Vec<_>>()
    );
    let user_files: Tree = after
        .into_iter()
        .filter(|(k, _)| !made.contains(k.as_str()))
        .collect();
    assert_same_tree(&before, &user_files, "after the SIGKILL");
}

#[tokio::test]
async fn a_process_that_kills_its_supervisor_writes_nothing() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    let before = tree_outside_scratch(ws);
    let server = serve(ws, &[]).await;

    // Kill every launcher process the cell sees (the supervisor is one: its
    // parent), then write: ENOSYS, or the cell dies with it.
    let code = format!(
        "{ATTEMPT}\nimport signal\n\
         for p in os.listdir('/proc'):\n\
         \x20   if p.isdigit() and int(p) != os.getpid():\n\
         \x20       try:\n\
         \x20           if b'__ferrepl-launch' in open('/proc/%s/cmdline' % p, 'rb').read():\n\
         \x20               os.kill(int(p), signal.SIGKILL)\n\
         \x20       except OSError:\n\
         \x20           pass\n\
         attempt('config', lambda: open('.git/config', 'a').write('EVIL'))\n\
         attempt('hook', lambda: open('.git/hooks/pre-commit', 'w').write('EVIL'))\n\
         attempt('mcp', lambda: open('.mcp.json', 'w'))\n\
         attempt('ordinary', lambda: open('scratch/after-kill', 'w'))\n"
    );
    let out = server
        .call("python_exec", json!({ "code": code, "wait_s": 30 }))
        .await;
    if out.structured["status"] == "ok" {
        let got = outcomes(&out);
        for label in ["config", "hook", "mcp", "ordinary"] {
            assert!(
                got.get(label).is_some_and(|o| !o.starts_with("OK")),
                "{label} worked without a supervisor: {out:#?}"
            );
        }
    }
    assert_same_tree(&before, &tree_outside_scratch(ws), "without a supervisor");

    // The shell job that does the same dies, changing nothing.
    let out = server
        .call(
            "shell_exec",
            json!({
                "command": "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in *__ferrepl-launch*) kill -9 ${p#/proc/} ;; esac; done; echo EVIL > .git/config; echo EVIL > .mcp.json",
                "wait_s": 30,
            }),
        )
        .await;
    assert_eq!(out.structured["status"], "exited", "{out:#?}");
    assert_ne!(out.structured["exit_code"], 0, "{out:#?}");
    assert_same_tree(
        &before,
        &tree_outside_scratch(ws),
        "a job without a supervisor",
    );

    // A new session has a supervisor again.
    let out = server
        .call(
            "python_exec",
            json!({
                "code": format!("{ATTEMPT}\nattempt('config', lambda: open('.git/config', 'a'))\nattempt('own', lambda: open('scratch/own', 'w'))\n"),
                "session": "fresh",
                "wait_s": 30,
            }),
        )
        .await;
    out.assert_ok();
    assert_eq!(errno_of(&outcomes(&out)["config"]), Some(EROFS), "{out:#?}");
    assert!(outcomes(&out)["own"].starts_with("OK"), "{out:#?}");
}
