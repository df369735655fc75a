//! `ferrepl attach SESSION` and cells run by another client (issue 47):
//! the connection file the command finds drives the session's real kernel
//! from a real `jupyter_client` (the `kernels` venv's), and the agent's
//! next result and python_history say someone else ran a cell (in its
//! place among the agent's cells, a background one too). Sessions
//! attach cannot serve, and a Jupyter program that is not there, are
//! refused with what to do.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::kernels::{
    self, another_client_runs, attach, kernels_venv, output_text as text,
};
use crate::support::{Launch, StdioServer};

/// A server with its own runtime directory (so only its sessions are
/// found), offering the python3 kernel, with a kernel session `k`.
async fn kernel_server(runtime: &Path) -> StdioServer {
    let launch = Launch::new(&["--kernels", "python3"])
        .env("JUPYTER_PATH", kernels_venv().join("share/jupyter"))
        .env("XDG_RUNTIME_DIR", runtime);
    let server = kernels::with_kernel_session(launch, "k", "python3").await;
    server
        .call(
            "python_exec",
            json!({"session": "k", "code": "x = 1", "wait_s": 60}),
        )
        .await
        .assert_ok();
    server
}

#[tokio::test]
async fn an_attached_client_runs_a_cell_the_agent_is_told_of() {
    let runtime = tempfile::tempdir().expect("tempdir");
    let server = kernel_server(runtime.path()).await;
    let out = attach(runtime.path(), server.workdir.path(), &["k", "--print"]);
    assert!(out.status.success(), "{}", text(&out));
    let file = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(Path::new(&file).is_file(), "{file}");

    // A real Jupyter client on that file runs a cell in the agent's kernel.
    another_client_runs(Path::new(&file), "y = 41 + 1\nprint('from the operator')");

    let out = server
        .call(
            "python_exec",
            json!({"session": "k", "code": "y", "wait_s": 60}),
        )
        .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("42"), "{out:#?}");
    assert!(
        out.text.contains("Someone else") && out.text.contains("ran 1 cell in this kernel"),
        "no note of the other client's cell: {out:#?}"
    );
    // Told once: the next result has no such note.
    let again = server
        .call(
            "python_exec",
            json!({"session": "k", "code": "y + 1", "wait_s": 60}),
        )
        .await;
    assert!(!again.text.contains("Someone else"), "{again:#?}");

    let history = server.call("python_history", json!({"session": "k"})).await;
    let cells = history.structured["cells"].as_array().expect("cells");
    let foreign: Vec<_> = cells
        .iter()
        .filter(|c| c["by"] == "another client")
        .collect();
    assert_eq!(foreign.len(), 1, "{history:#?}");
    assert!(
        foreign[0]["code"]
            .as_str()
            .is_some_and(|c| c.contains("y = 41 + 1")),
        "{history:#?}"
    );
    assert!(
        foreign[0]["output_preview"]
            .as_str()
            .is_some_and(|o| o.contains("from the operator")),
        "{history:#?}"
    );
    assert!(
        history.text.contains("[run by another client | ok]"),
        "{history:#?}"
    );
    // The agent's own cells are not marked.
    assert!(
        cells
            .iter()
            .any(|c| c["code"] == "y" && c.get("by").is_none()),
        "{history:#?}"
    );
}

#[tokio::test]
async fn a_cell_another_client_ran_after_a_background_cell_follows_it_in_the_history() {
    let runtime = tempfile::tempdir().expect("tempdir");
    let server = kernel_server(runtime.path()).await;
    let file = kernels::connection_file(runtime.path(), server.workdir.path(), "k");
    // The agent's cell 2 still runs when its call returns...
    let out = server
        .call(
            "python_exec",
            json!({"session": "k", "code": "import time\ntime.sleep(3)\nz = 2", "wait_s": 0.5}),
        )
        .await;
    assert!(out.text.contains("running"), "{out:#?}");
    // ...and the kernel runs the other client's cell after it (one at a
    // time: it needs the agent's `z`); no call looks before both ended.
    another_client_runs(&file, "w = z + 1");

    let history = server.call("python_history", json!({"session": "k"})).await;
    let rows = history.structured["cells"].as_array().expect("cells");
    let agents = rows
        .iter()
        .position(|c| c["code"].as_str().is_some_and(|c| c.contains("z = 2")));
    let theirs = rows.iter().position(|c| c["by"] == "another client");
    assert!(
        agents.is_some() && theirs.is_some() && agents < theirs,
        "{history:#?}"
    );
}

#[tokio::test]
async fn attach_refuses_unknown_and_built_in_sessions_and_a_missing_console() {
    let runtime = tempfile::tempdir().expect("tempdir");
    // No server at all in this runtime directory.
    let out = attach(runtime.path(), runtime.path(), &["k", "--print"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("no ferrepl server of this user is running"),
        "{}",
        text(&out)
    );

    let server = kernel_server(runtime.path()).await;
    server
        .call(
            "python_exec",
            json!({"session": "builtin", "code": "1", "wait_s": 60}),
        )
        .await
        .assert_ok();
    for name in ["nope", "builtin"] {
        let out = attach(runtime.path(), server.workdir.path(), &[name, "--print"]);
        assert!(!out.status.success(), "{}", text(&out));
        let said = text(&out);
        assert!(
            said.contains(&format!("no running kernel session named '{name}'"))
                && said.contains("kernel sessions there: k")
                && said.contains("kernel sessions only"),
            "{said}"
        );
    }
    // A workspace no server serves.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let out = attach(
        runtime.path(),
        server.workdir.path(),
        &[
            "k",
            "--print",
            "--workdir",
            &elsewhere.path().display().to_string(),
        ],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("no running kernel session named 'k' in the server serving"),
        "{}",
        text(&out)
    );

    // Without --print, a console program that is not there is named, with what to install.
    let out = attach(
        runtime.path(),
        server.workdir.path(),
        &["k", "--jupyter", "/nonexistent/jupyter"],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("pip install jupyter-console"),
        "{}",
        text(&out)
    );
}

#[tokio::test]
async fn two_servers_with_the_session_are_told_apart_by_workdir() {
    let runtime = tempfile::tempdir().expect("tempdir");
    let first = kernel_server(runtime.path()).await;
    let second = kernel_server(runtime.path()).await;
    let nowhere = tempfile::tempdir().expect("tempdir");
    let out = attach(runtime.path(), nowhere.path(), &["k", "--print"]);
    assert!(!out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("several servers") && said.contains("--workdir"),
        "{said}"
    );
    for server in [&first, &second] {
        let dir = std::fs::canonicalize(server.workdir.path()).expect("canonical");
        assert!(said.contains(&dir.display().to_string()), "{said}");
    }
    // From inside a server's workspace, or naming it, that server's session.
    let from_inside = attach(runtime.path(), second.workdir.path(), &["k", "--print"]);
    let named = attach(
        runtime.path(),
        nowhere.path(),
        &[
            "k",
            "--print",
            "--workdir",
            &second.workdir.path().display().to_string(),
        ],
    );
    for out in [&from_inside, &named] {
        assert!(out.status.success(), "{}", text(out));
    }
    assert_eq!(from_inside.stdout, named.stdout);
    let first_file = attach(runtime.path(), first.workdir.path(), &["k", "--print"]);
    assert!(first_file.status.success(), "{}", text(&first_file));
    assert_ne!(first_file.stdout, named.stdout);
}

#[tokio::test]
async fn attach_trusts_only_entries_its_user_wrote_and_live_kernels() {
    use std::os::unix::fs::symlink;
    let runtime = tempfile::tempdir().expect("tempdir");
    let server = kernel_server(runtime.path()).await;
    let out = attach(runtime.path(), server.workdir.path(), &["k", "--print"]);
    assert!(out.status.success(), "{}", text(&out));
    let file = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let index = file.parent().expect("the index directory");
    let workdir = std::fs::canonicalize(server.workdir.path()).expect("canonical");

    // Entries planted beside the server's: a symlink to a connection file
    // in the workspace, and (when the test may give files away) one owned
    // by another user; neither is followed.
    // Their "kernel" looks alive: its shell socket's path exists.
    let socket = server.workdir.path().join("s");
    std::fs::write(server.workdir.path().join("s-1"), "").expect("write");
    let planted = server.workdir.path().join("planted.json");
    let fake = json!({"transport": "ipc", "ip": socket, "shell_port": 1,
        "key": "k", "ferrepl_session": "planted", "ferrepl_workdir": workdir});
    std::fs::write(&planted, fake.to_string()).expect("write");
    symlink(&planted, index.join("planted.json")).expect("symlink");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let given = index.join("given.json");
        let mut other = fake.clone();
        other["ferrepl_session"] = json!("given");
        std::fs::write(&given, other.to_string()).expect("write");
        std::os::unix::fs::chown(&given, Some(65534), Some(65534)).expect("chown");
        let out = attach(runtime.path(), server.workdir.path(), &["given", "--print"]);
        assert!(!out.status.success(), "{}", text(&out));
    }
    for name in ["planted", "../../planted", "k/../planted"] {
        let out = attach(runtime.path(), server.workdir.path(), &[name, "--print"]);
        assert!(!out.status.success(), "{name}: {}", text(&out));
        assert!(
            text(&out).contains("kernel sessions there: k)"),
            "{}",
            text(&out)
        );
    }

    // A deleted session's kernel is not offered.
    let out = server
        .call(
            "python_sessions",
            json!({"action": "delete", "session": "k"}),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert!(!file.exists(), "the entry of a deleted session stays");
    let out = attach(runtime.path(), server.workdir.path(), &["k", "--print"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("no running kernel session named 'k'"),
        "{}",
        text(&out)
    );
}
