//! Code calls tools, attacked through what the operator configures: the
//! servers file's place, what an upstream runs, the flags that let
//! sessions around the upstreams, and the gaps a review found.

use super::*;

// ------------------------------------------------------------------ the file's place

/// `--workdir ws --mcp-servers file --warm-pool 0 extra...`, the workspace
/// named by the flag.
fn launch_in(ws: &Path, file: &Path, extra: &[&str]) -> Launch {
    let mut args = vec![
        "--workdir",
        path_str(ws),
        "--mcp-servers",
        path_str(file),
        "--warm-pool",
        "0",
    ];
    args.extend_from_slice(extra);
    Launch::new(&args).without_workdir_flag()
}

/// A servers file whose only upstream, once started, leaves `marker`.
fn servers_with_marker(at: &Path, marker: &Path) {
    let script = format!(
        "echo started > {}; exec sleep 60",
        crate::support::sh_quote(path_str(marker))
    );
    write_servers_file(
        at,
        json!({ "m": { "command": "sh", "args": ["-c", script] } }),
    );
}

/// Start is refused (naming "lies inside" and the flag) when the servers
/// file lies where sessions read: the workspace, an --allow-read
/// directory, reached through a symlink (to the file or to a directory)
/// that points into the workspace, a system directory. Nothing ran.
#[tokio::test]
async fn a_servers_file_sessions_could_read_is_refused_at_start() {
    let root = outside();
    let ws = root.path().join("ws");
    let shown = root.path().join("shown");
    let away = root.path().join("away");
    for d in [&ws, &shown, &away] {
        std::fs::create_dir(d).expect("mkdir");
    }
    let marker = root.path().join("started");
    servers_with_marker(&ws, &marker);
    servers_with_marker(&shown, &marker);
    let in_ws = ws.join("mcp-servers.json");
    let file_link = away.join("file-link.json");
    std::os::unix::fs::symlink(&in_ws, &file_link).expect("symlink to the file");
    let dir_link = away.join("dir-link");
    std::os::unix::fs::symlink(&ws, &dir_link).expect("symlink to the workspace");
    let via_dir_link = dir_link.join("mcp-servers.json");
    let in_shown = shown.join("mcp-servers.json");
    let system = PathBuf::from("/usr/share/ferrepl-no-such-dir/mcp-servers.json");

    let cases: Vec<(&str, &Path, Vec<&str>)> = vec![
        ("in the workspace", &in_ws, vec![]),
        (
            "in an --allow-read directory",
            &in_shown,
            vec!["--allow-read", path_str(&shown)],
        ),
        ("a symlink to a file in the workspace", &file_link, vec![]),
        ("through a symlink to the workspace", &via_dir_link, vec![]),
        ("in a system directory", &system, vec![]),
    ];
    for (what, file, extra) in cases {
        let err = refused(launch_in(&ws, file, &extra)).await;
        assert!(
            err.contains("lies inside") && err.contains("--mcp-servers"),
            "a servers file {what}: the refusal should say it lies inside a place sessions read: {err}"
        );
    }
    assert!(
        !marker.exists(),
        "an upstream was started by a refused server"
    );
}

// ------------------------------------------------------------------ warnings

/// `--network on` with an upstream on loopback warns that sessions can
/// reach it around allowTools and its headers; `--sandbox off` with
/// servers warns that sessions can read them.
#[tokio::test]
async fn flags_that_let_sessions_around_the_upstreams_are_warned_of() {
    let dir = outside();
    let file = write_servers_file(
        dir.path(),
        json!({ "h": { "url": "http://127.0.0.1:9/mcp", "headers": { "Authorization": "Bearer x" } } }),
    );
    let network = StdioServer::launch(with_servers(&file, &["--network", "on"])).await;
    assert!(
        network
            .wait_stderr_contains(
                "can reach the HTTP upstream MCP servers directly",
                Duration::from_secs(10)
            )
            .await,
        "--network on with a loopback upstream: no warning in\n{}",
        network.stderr_log()
    );
    drop(network);

    let off = StdioServer::launch(with_servers(&file, &["--sandbox", "off"])).await;
    assert!(
        off.wait_stderr_contains(
            "--sandbox off: sessions run as this user, unconfined, and can read --mcp-servers",
            Duration::from_secs(10)
        )
        .await,
        "--sandbox off with servers: no warning in\n{}",
        off.stderr_log()
    );
    drop(off);

    // Neither warning without those flags.
    let quiet = StdioServer::launch(with_servers(&file, &[])).await;
    quiet.exec("1").await.assert_ok();
    let log = quiet.stderr_log();
    assert!(
        !log.contains("can reach the HTTP upstream MCP servers directly")
            && !log.contains("can read --mcp-servers"),
        "a warning without --network on or --sandbox off:\n{log}"
    );
}

/// --mcp-max-in-flight bounds the calls a session has running upstream,
/// also when its code sends them by hand with one id for all (the server
/// keys calls in flight by the session's ids): past the limit, calls wait
/// in ferrepl (distinct ids) or are refused (an id in flight already),
/// never reaching the upstream. Each session calls its own server, so
/// one's waiting calls never run beside the other's.
#[tokio::test]
async fn calls_sent_by_hand_under_one_id_stay_within_the_in_flight_limit() {
    let dir = outside();
    let file = write_servers_file(
        dir.path(),
        json!({
            "m1": minimal_upstream_with_children(dir.path()),
            "m2": minimal_upstream_with_children(dir.path()),
        }),
    );
    let server = StdioServer::launch(with_servers(&file, &["--mcp-max-in-flight", "2"])).await;
    let code = format!(
        "{RAW_CHANNEL}{}",
        r#"
me = ferrepl.call("@M@", "pid")
for i in range(12):
    ev(id=@ID@, op="call", server="@M@", tool="slow", arguments={"seconds": 8})
time.sleep(2)
print(json.dumps(me))
"#
    );
    let mut running = Vec::new();
    for (session, server_name, id) in [("distinct", "m1", "1000 + i"), ("same", "m2", "77")] {
        let cell = code.replace("@ID@", id).replace("@M@", server_name);
        let me = cell_json(&server, session, &cell).await;
        let upstream = upstream_host_pids(me.as_str().expect("text"))[0];
        let status = std::fs::read_to_string(format!("/proc/{upstream}/status")).expect("status");
        let threads: usize = status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("Threads:");
        running.push((session, threads - 1));
    }
    // The main thread, one per call in flight (at most 2).
    assert!(
        running.iter().all(|(_, n)| *n <= 2),
        "calls running at once in the upstream for a session held to --mcp-max-in-flight 2 \
         (12 sent with distinct ids, then 12 with one id): {running:?}"
    );
}

// ------------------------------------------------------------------ gaps found, now closed

/// The servers file named through a symlink that lies in the workspace
/// (its target outside): the session swaps the link for a file of its own,
/// and the next SIGHUP loads the session's servers.
#[tokio::test]
async fn a_servers_file_named_through_a_link_in_the_workspace_is_refused() {
    // Accepted, the session could replace the link with a file of its own
    // and have it loaded at the next SIGHUP: refused at start, nothing run.
    let root = outside();
    let ws = root.path().join("ws");
    let real = root.path().join("etc");
    std::fs::create_dir(&ws).expect("mkdir ws");
    std::fs::create_dir(&real).expect("mkdir etc");
    write_servers_file(&real, json!({ "m": minimal_upstream(root.path()) }));
    let link = ws.join("mcp-servers.json");
    std::os::unix::fs::symlink(real.join("mcp-servers.json"), &link).expect("symlink");
    let err = refused(launch_in(&ws, &link, &[])).await;
    assert!(
        err.contains("--mcp-servers") && err.contains("lies inside"),
        "a servers file named through a link in the workspace must be refused: {err}"
    );
}

/// The servers file in a directory the view binds because of PATH (a
/// `bin` entry's prefix).
#[tokio::test]
async fn a_servers_file_in_a_bound_path_entry_is_refused() {
    let root = crate::support::visible_outside_dir();
    let bin = root.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    let secret = unique("pathsecret");
    let dir = outside();
    let mut m = minimal_upstream(dir.path());
    m["env"] = json!({ "UPSTREAM_SECRET": secret });
    let file = write_servers_file(root.path(), json!({ "m": m }));
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!(
        "{}:{}",
        path_str(&bin),
        std::env::var("PATH").unwrap_or_default()
    );
    let launch = with_servers(&file, &[]).env("PATH", path);
    let mut spawned = launch.clone().spawn_stdio();
    let exited = tokio::time::timeout(Duration::from_secs(20), spawned.child.wait()).await;
    if exited.is_ok() {
        return; // refused
    }
    drop(spawned);
    let server = StdioServer::launch(launch).await;
    let control = plant_control(server.workdir.path());
    let scan = cell_json(&server, "default", &scan_code(&control, &[&secret], &file)).await;
    assert_scan_clean(&scan, "servers file in a PATH entry's prefix");
}

/// The upstream's working directory: ferrepl's, which is the workspace
/// when no --workdir is given; `python3 -m MODULE` then imports the
/// session's MODULE.py first.
#[tokio::test]
async fn an_upstream_never_runs_code_the_session_wrote() {
    let dir = outside();
    let ws = outside();
    minimal_upstream(dir.path());
    let marker = dir.path().join("ran-outside");
    let secret = unique("cwdsecret");
    let file = write_servers_file(
        dir.path(),
        json!({ "t": {
            "command": "python3",
            "args": ["-m", "minimal_upstream"],
            "env": { "PYTHONPATH": path_str(dir.path()), "UPSTREAM_SECRET": secret },
        }}),
    );
    let cwd = std::ffi::CString::new(path_str(ws.path())).expect("path");
    // SAFETY: chdir is async-signal-safe; the path was allocated before fork.
    let launch = unsafe {
        Launch::new(&["--mcp-servers", path_str(&file), "--warm-pool", "0"])
            .without_workdir_flag()
            .pre_exec(move || {
                if libc::chdir(cwd.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
    };
    let server = StdioServer::launch(launch).await;
    let plant = format!(
        "import os, json, ferrepl\n\
         print(os.getcwd())\n\
         open('minimal_upstream.py', 'w').write('import os\\nopen(%r, \"w\").write(os.environ.get(\"UPSTREAM_SECRET\", \"\"))\\n' % {})\n\
         try:\n    r = ferrepl.call('t', 'echo', text='x')\nexcept ferrepl.Error as e:\n    r = '%s: %s' % (type(e).__name__, e)\n\
         print(json.dumps(r))",
        py(path_str(&marker))
    );
    let out = server
        .call("python_exec", json!({ "code": plant, "wait_s": 60 }))
        .await;
    out.assert_ok();
    assert!(
        !marker.exists(),
        "the session's minimal_upstream.py ran outside the sandbox as the upstream (it wrote {}: {:?}); cell: {}",
        marker.display(),
        std::fs::read_to_string(&marker).ok(),
        out.str_field("stdout")
    );
}

/// An upstream URL with a key in it (`?key=...`, common for hosted MCP
/// servers) is configuration the session must not see: not in the error
/// it gets when the server cannot be reached.
#[tokio::test]
async fn a_key_in_an_upstream_url_is_not_shown_to_the_session() {
    let dir = outside();
    let key = unique("urlkey");
    let file = write_servers_file(
        dir.path(),
        json!({ "down": { "url": format!("http://127.0.0.1:9/mcp?key={key}") } }),
    );
    let server = StdioServer::launch(with_servers(&file, &[])).await;
    let out = server
        .call(
            "python_exec",
            json!({ "code": "import ferrepl\nfor f in (lambda: ferrepl.tools('down'), lambda: ferrepl.call('down', 'x')):\n    try:\n        f()\n    except ferrepl.Error as e:\n        print(type(e).__name__, e)", "wait_s": 60 }),
        )
        .await;
    out.assert_ok();
    let seen = everything(&out);
    assert!(
        !seen.contains(&key),
        "the URL's key reached the session: {}",
        out.str_field("stdout")
    );
}

/// With --network on, sessions reach any HTTP upstream around allowTools:
/// the warning comes for every spelling of its address.
#[tokio::test]
async fn network_on_warns_of_every_loopback_form() {
    let dir = outside();
    let mut missed = Vec::new();
    for url in [
        "http://0.0.0.0:9/mcp",
        "http://[::1]:9/mcp",
        "http://localhost:9/mcp",
        "http://127.1:9/mcp",
        "http://[::ffff:127.0.0.1]:9/mcp",
        "http://LOCALHOST:9/mcp",
        "http://foo.localhost:9/mcp",
        "http://[::]:9/mcp",
    ] {
        let file = write_servers_file(dir.path(), json!({ "h": { "url": url } }));
        let network = StdioServer::launch(with_servers(&file, &["--network", "on"])).await;
        network.exec("1").await.assert_ok();
        if !network
            .stderr_log()
            .contains("can reach the HTTP upstream MCP servers directly")
        {
            missed.push(url);
        }
    }
    assert!(missed.is_empty(), "--network on: no warning for {missed:?}");
}
