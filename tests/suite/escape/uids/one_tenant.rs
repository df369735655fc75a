//! A root server alone: its session and jobs run as a uid of their own (or
//! the workspace owner's), and leave no set-id program behind.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use serde_json::json;

use crate::support::{StdioServer, descendants, is_root, own_uid, unique, wait_for_file_line};

use super::*;

/// Claim: a root server alone, in a root-owned workspace, runs the session's
/// interpreter and a shell job as a uid of --tenant-uids (kept under "*"),
/// never root, with the workspace shown as theirs: a root 0600 file there
/// is readable, and what they create belongs to root on the host. The
/// attack this closes: code in a session acting as root on host files
/// (anything a namespace or view leaves reachable). Unprivileged: the
/// server's own uid, not called degraded.
#[tokio::test]
async fn a_root_servers_session_and_job_run_as_a_uid_of_their_own() {
    let range = "3100000-3100009";
    let place = Place::new();
    let secret = unique("root-0600-");
    let secret_file = place.ws().join("root-secret.txt");
    std::fs::write(&secret_file, &secret).expect("write");
    std::fs::set_permissions(&secret_file, PermissionsExt::from_mode(0o600)).expect("chmod");
    let server = StdioServer::launch(place.launch(range, &[])).await;

    let (seen, out) = seen_in(
        server.peer(),
        "default",
        "open('made-by-session.txt', 'w').write('x')\nprint('SECRET', open('root-secret.txt').read())",
    )
    .await;
    assert!(
        out.str_field("stdout")
            .contains(&format!("SECRET {secret}")),
        "the session reads the workspace's 0600 file: {out:#?}"
    );
    assert!(
        descendants(server.pid()).contains(&seen.host_pid),
        "the interpreter {} is the server's",
        seen.host_pid
    );
    assert_runs_as(seen.host_pid, seen.uid, "the session's interpreter");
    assert_eq!(seen.gid, gid_of(seen.uid));

    // A shell job: its shell's pid (of its namespace) in a file, then the
    // shell becomes `sleep`.
    let job = server
        .call(
            "shell_exec",
            json!({ "command": "echo $$ > job.pid; exec sleep 30", "wait_s": 1 }),
        )
        .await;
    assert_eq!(job.structured["status"], "running", "{job:#?}");
    let job_pid = u32::try_from(job.structured["pid"].as_u64().expect("pid")).expect("u32");
    let inner: u32 = wait_for_file_line(&place.ws().join("job.pid"), Duration::from_secs(20))
        .await
        .trim()
        .parse()
        .expect("a pid");
    let sleeper = job_process(server.pid(), job_pid, inner).await;
    assert_runs_as(sleeper, seen.uid, "the shell job");
    let killed = server
        .call(
            "shell_wait",
            json!({ "job": job.str_field("job"), "signal": "KILL" }),
        )
        .await;
    assert_eq!(killed.structured["status"], "exited", "{killed:#?}");

    let sandbox = sandbox_line(server.peer()).await;
    let made = owner(&place.ws().join("made-by-session.txt"));
    if is_root() {
        assert_ne!(seen.uid, 0, "a root server's session must not run as root");
        assert_in_range(seen.uid, range);
        assert_eq!(
            place.uid_table().get("*"),
            Some(&json!(seen.uid)),
            "the sole tenant's uid is kept under \"*\""
        );
        assert_eq!(
            made, 0,
            "through the idmapped workspace, root's on the host"
        );
        assert_eq!(owner(&place.ws().join("job.pid")), 0);
        let part = format!(
            "sessions run as uid {}, the workspace shown as theirs through an idmapped mount",
            seen.uid
        );
        assert!(sandbox.contains(&part), "{sandbox}");
    } else {
        assert_eq!(seen.uid, own_uid(), "unprivileged: the server's uid");
        assert_eq!(made, own_uid());
        let part = format!("sessions run as the server's uid {}", own_uid());
        assert!(sandbox.contains(&part), "{sandbox}");
    }
    assert!(!sandbox.contains("DEGRADED"), "{sandbox}");
}

/// Attack: in a root-owned workspace shown as the session's own (idmapped),
/// copy a shell and make it set-user-ID and set-group-ID: on the host it
/// would be root's, and run as root for anyone who executes it. Both
/// chmod(2) forms are refused, and the host copy keeps no set-id bit. (As
/// the server's own uid, the same: no set-id program is made anywhere.)
#[tokio::test]
async fn a_session_cannot_leave_a_set_id_program_in_the_workspace() {
    let place = Place::new();
    let server = StdioServer::launch(place.launch("3100080-3100089", &[])).await;
    let code = "import os, shutil\nshutil.copy('/bin/sh', 'sh2')\nfd = os.open('sh2', os.O_RDONLY)\nfor how, call in [('chmod', lambda m: os.chmod('sh2', m)), ('fchmod', lambda m: os.fchmod(fd, m))]:\n    for mode in (0o4755, 0o2755, 0o6755):\n        try:\n            call(mode)\n            print('ALLOWED', how, oct(mode))\n        except PermissionError:\n            print('REFUSED', how, oct(mode))\nos.chmod('sh2', 0o755)\nprint('PLAIN OK')";
    let out = server.call("python_exec", json!({ "code": code })).await;
    let stdout = out.str_field("stdout");
    assert!(!stdout.contains("ALLOWED"), "{out:#?}");
    assert_eq!(stdout.matches("REFUSED").count(), 6, "{out:#?}");
    assert!(
        stdout.contains("PLAIN OK"),
        "an ordinary chmod still works: {out:#?}"
    );
    let mode = std::fs::metadata(place.ws().join("sh2"))
        .expect("sh2")
        .permissions()
        .mode();
    assert_eq!(mode & 0o6000, 0, "no set-id bit on the host: {mode:o}");
    if is_root() {
        assert_eq!(owner(&place.ws().join("sh2")), 0, "root's on the host");
    }
}

/// Claim: a root server alone in a user's workspace runs sessions as that
/// user, whose RLIMIT_NPROC (--max-processes) counts everything the user
/// runs on the host: when half of it is taken at start, the server says so
/// (a session that could not start a thread would otherwise be a puzzle).
#[tokio::test]
async fn a_busy_workspace_owner_is_named_at_start() {
    if !is_root() {
        return; // sessions run as the server's own uid
    }
    let place = Place::new();
    std::os::unix::fs::chown(place.ws(), Some(OWNER), Some(OWNER)).expect("chown");
    // Two processes of the owner's on the host.
    let mut owned = Vec::new();
    for _ in 0..2 {
        let child = std::process::Command::new("sleep")
            .arg("60")
            .uid(OWNER)
            .gid(OWNER)
            .spawn()
            .expect("sleep as the owner");
        owned.push(child);
    }
    let server =
        StdioServer::launch(place.launch("3100130-3100139", &["--max-processes", "4"])).await;
    let log = server.stderr_log();
    for mut child in owned {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        log.contains(&format!("sessions run as uid {OWNER}, the workspace's owner, whose processes on this host already hold"))
            && log.contains("raise --max-processes"),
        "{log}"
    );
}

/// Claim: a root server alone in a workspace owned by a user (uid 4242)
/// runs its sessions as that user, and what the session and the server's
/// own tools (file_write, python_export) create there is that user's, so
/// the project stays the user's own; file_read reads what the session
/// wrote. Unprivileged (no chown possible): all of it as the server's uid.
#[tokio::test]
async fn a_workspace_owned_by_a_user_is_worked_in_as_that_user() {
    let place = Place::new();
    let expected = if is_root() {
        std::os::unix::fs::chown(place.ws(), Some(OWNER), Some(OWNER)).expect("chown");
        OWNER
    } else {
        own_uid()
    };
    let server = StdioServer::launch(place.launch("3100090-3100099", &[])).await;
    let (seen, _) = seen_in(
        server.peer(),
        "default",
        "open('by-session.txt', 'w').write('written by the session\\n')",
    )
    .await;
    assert_eq!(seen.uid, expected, "the session's uid");
    assert_eq!(seen.gid, gid_of(expected), "the session's gid");
    assert_runs_as(seen.host_pid, expected, "the session's interpreter");

    let wrote = server
        .call(
            "file_write",
            json!({ "path": "by-tool/w.txt", "text": "by the tool\n" }),
        )
        .await;
    assert!(!wrote.is_error, "{wrote:#?}");
    let exported = server
        .call(
            "python_export",
            json!({ "path": "nb.ipynb", "format": "ipynb" }),
        )
        .await;
    assert!(!exported.is_error, "{exported:#?}");
    let notebook = std::fs::read_to_string(place.ws().join("nb.ipynb")).expect("the notebook");
    assert!(notebook.contains("by-session.txt"), "{notebook}");
    let read = server
        .call("file_read", json!({ "path": "by-session.txt" }))
        .await;
    assert!(!read.is_error, "{read:#?}");
    assert_eq!(
        read.structured["text"], "written by the session\n",
        "{read:#?}"
    );

    for made in ["by-session.txt", "by-tool", "by-tool/w.txt", "nb.ipynb"] {
        assert_eq!(
            owner(&place.ws().join(made)),
            expected,
            "{made} belongs to the workspace's owner"
        );
    }
    let sandbox = sandbox_line(server.peer()).await;
    let part = if is_root() {
        format!("sessions run as uid {OWNER}, the workspace's owner")
    } else {
        format!("sessions run as the server's uid {}", own_uid())
    };
    assert!(sandbox.contains(&part), "{sandbox}");
    assert!(
        !place.uid_table().contains_key("*"),
        "no uid of the range is taken for an owned workspace: {:?}",
        place.uid_table()
    );
}
