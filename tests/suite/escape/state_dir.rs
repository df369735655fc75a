//! Nothing the agent can write steers the server's own files (issue 30 §3):
//! the state directory (`--state-dir`, default `~/.local/state/ferrepl`,
//! where the stores keep every session's code) is opened without following
//! a symbolic link and checked for owner and mode before anything is written
//! in it, and start-up refuses one that sessions could reach (inside the
//! workspace or an `--allow-write` path, under any alias, or a workspace
//! that holds it). A local wheel for `python_install` is read through the
//! workspace's descriptor, never through a link out of it.
//!
//! Each refusal is checked through the real binary: it exits non-zero
//! before serving, its message names the place and the fix, and nothing
//! was written where it was pointed. Run as root (CI) and, by
//! `scripts/escape-unprivileged.sh`, as an unprivileged user.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::support::{
    ATTEMPT, Launch, StdioServer, ToolOutput, assert_failed, assert_refused, path_str, py_path,
    strip_ansi, system_python,
};
use crate::support::{chmod, is_root};

/// Upper bound for a refusing server to exit.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(60);

/// A directory outside every workspace, for state directories and decoys:
/// under the build's scratch directory (not in any session's view, so the
/// stores' own hiding is what keeps sessions out) when the test may write
/// there, else in TMPDIR (the unprivileged run).
fn outside() -> tempfile::TempDir {
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix("ferrepl-state-dir-");
        b
    };
    builder
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .or_else(|_| builder.tempdir())
        .expect("create a directory outside the workspace")
}

/// Every entry under `dir` (links not followed), with its kind, size, mode
/// and modification time: two snapshots differ when anything was created,
/// removed or written.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&p) else {
            continue;
        };
        for e in entries {
            let path = e.expect("a directory entry").path();
            let m = std::fs::symlink_metadata(&path).expect("lstat");
            let rel = path.strip_prefix(dir).expect("under dir").display();
            out.push(format!(
                "{rel} {:o} {} {}.{}",
                m.mode(),
                m.len(),
                m.mtime(),
                m.mtime_nsec()
            ));
            if m.is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The names in `dir` (empty when it cannot be read).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `--workdir ws` and `args`, the full tool surface, `--warm-pool 0`.
fn launch(ws: &Path, args: &[&str]) -> Launch {
    let mut all = vec!["--workdir", path_str(ws), "--warm-pool", "0"];
    all.extend_from_slice(args);
    Launch::new(&all).without_workdir_flag()
}

/// Starts `launch`, which must exit unsuccessfully before it serves; its
/// stderr (colours removed).
async fn refused(launch: Launch) -> String {
    let mut spawned = launch.spawn_stdio();
    let status = tokio::time::timeout(REFUSE_TIMEOUT, spawned.child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the server did not exit within {REFUSE_TIMEOUT:?}: it must refuse to start; stderr:\n{}",
                spawned.stderr.tail(4000)
            )
        })
        .expect("wait for the server");
    spawned.stderr.wait_closed(Duration::from_secs(10)).await;
    let err = strip_ansi(&spawned.stderr.text());
    assert!(!status.success(), "the server must refuse to start: {err}");
    err
}

/// Panics unless `dir` holds a store (`*.sqlite3`).
fn assert_has_store(dir: &Path) {
    let names = names(dir);
    assert!(
        names.iter().any(|n| n.ends_with(".sqlite3")),
        "no store in {}: {names:?}",
        dir.display()
    );
}

// ------------------------------------------------------------------ symlink swap

/// The state directory swapped for a symbolic link to another directory:
/// a session cannot do it (the directory is not in its view); swapped from
/// outside while the server runs, the server keeps writing the directory
/// it opened (through its descriptor) and nothing lands in the link's
/// target; after a restart the server refuses the link, naming it and the
/// fix, and still writes nothing there.
#[tokio::test]
async fn a_state_directory_swapped_for_a_symlink_is_refused_and_never_written_through() {
    let ws = tempfile::tempdir().expect("workspace");
    let place = outside();
    let state = place.path().join("state");
    let decoy = place.path().join("decoy");
    let moved = place.path().join("state-real");
    std::fs::create_dir(&state).expect("mkdir state");
    chmod(&state, 0o700);
    std::fs::create_dir(&decoy).expect("mkdir decoy");

    let first = StdioServer::launch(launch(ws.path(), &["--state-dir", path_str(&state)])).await;
    first.exec_in("kept", "x = 41").await.assert_ok();
    assert_has_store(&state);

    // A cell of the session tries to read the store and swap the
    // directory itself: it is not in the session's view (at most an empty
    // cover of its name shows, which can be neither read nor replaced).
    let store = names(&state)
        .into_iter()
        .find(|n| n.ends_with(".sqlite3"))
        .expect("a store");
    let s = py_path(&state);
    let d = py_path(&decoy);
    let f = py_path(&state.join(&store));
    let probe = format!(
        "{ATTEMPT}\nimport os, shutil\n\
         attempt('list', lambda: os.listdir({s}))\n\
         attempt('read', lambda: open({f}, 'rb').read(16))\n\
         attempt('rename', lambda: os.rename({s}, {s} + '.gone'))\n\
         attempt('rmtree', lambda: shutil.rmtree({s}))\n\
         attempt('symlink', lambda: os.symlink({d}, {s}))\n\
         attempt('replace', lambda: (os.symlink({d}, 'link'), os.replace('link', {s})))\n"
    );
    let out = first.exec_in("kept", &probe).await;
    out.assert_ok();
    for label in ["list", "read", "rename", "rmtree", "symlink", "replace"] {
        assert_failed(
            &out,
            label,
            "the state directory is out of the session's view",
        );
    }
    assert!(
        std::fs::symlink_metadata(&state).is_ok_and(|m| m.is_dir()),
        "the state directory is gone or replaced"
    );
    assert_has_store(&state);

    // Swapped from outside while the server runs: the next cell is still
    // kept, in the directory the server opened.
    std::fs::rename(&state, &moved).expect("move the state directory aside");
    std::os::unix::fs::symlink(&decoy, &state).expect("symlink state -> decoy");
    first.exec_in("kept", "x += 1").await.assert_ok();
    first.stop().await;
    assert_eq!(
        tree(&decoy),
        Vec::<String>::new(),
        "the running server wrote through the swapped link"
    );

    // Restarted on the link: refused, and nothing is written through it.
    let err = refused(launch(ws.path(), &["--state-dir", path_str(&state)])).await;
    assert!(
        err.contains(path_str(&state)) && err.contains("symbolic link"),
        "the refusal names the state directory and why: {err}"
    );
    assert!(
        err.contains("--state-dir"),
        "the refusal says what to do: {err}"
    );
    assert_eq!(
        tree(&decoy),
        Vec::<String>::new(),
        "the refused server wrote through the link"
    );
    assert!(
        std::fs::symlink_metadata(&state).is_ok_and(|m| m.file_type().is_symlink()),
        "the link itself is left as it was"
    );

    // The directory the server opened has both cells.
    let again = StdioServer::launch(launch(ws.path(), &["--state-dir", path_str(&moved)])).await;
    let rows = again.sessions().await;
    let kept = rows
        .iter()
        .find(|r| r["name"] == "kept")
        .unwrap_or_else(|| panic!("no stored session 'kept': {rows:#?}"));
    assert_eq!(kept["state"], "dormant", "{kept:#?}");
    let rebuilt = again
        .call(
            "python_sessions",
            json!({"action": "rebuild", "session": "kept", "confirm": true}),
        )
        .await;
    assert!(
        !rebuilt.is_error && rebuilt.text.contains("was rebuilt by re-running cells "),
        "{rebuilt:#?}"
    );
    let out = again.exec_in("kept", "x").await;
    out.assert_ok();
    assert_eq!(
        out.value(),
        Some("42"),
        "the cell run after the swap was kept: {out:#?}"
    );
    again.stop().await;
    assert_eq!(
        tree(&decoy),
        Vec::<String>::new(),
        "a server on the real directory wrote in the decoy"
    );
}

// ------------------------------------------------------------------ owner and mode

/// A state directory others can write (`o+w`, with or without the sticky
/// bit) is refused at start with the fix, and nothing is created in it; a
/// group-writable one (a Kubernetes fsGroup volume) is used.
#[tokio::test]
async fn a_world_writable_state_directory_is_refused_and_a_group_writable_one_used() {
    let ws = tempfile::tempdir().expect("workspace");
    let place = outside();
    for mode in [0o777, 0o1777, 0o703] {
        let state = place.path().join(format!("state-{mode:o}"));
        std::fs::create_dir(&state).expect("mkdir state");
        chmod(&state, mode);
        let err = refused(launch(ws.path(), &["--state-dir", path_str(&state)])).await;
        assert!(
            err.contains(path_str(&state)) && err.contains("writable by others"),
            "mode {mode:o}: the refusal names the state directory and why: {err}"
        );
        assert!(
            err.contains("chmod o-w"),
            "mode {mode:o}: the refusal says what to do: {err}"
        );
        assert_eq!(
            tree(&state),
            Vec::<String>::new(),
            "mode {mode:o}: something was created in the refused state directory"
        );
        assert_eq!(
            std::fs::metadata(&state).expect("stat").mode() & 0o7777,
            mode,
            "mode {mode:o}: the refused directory's mode was changed"
        );
    }

    let state = place.path().join("state-770");
    std::fs::create_dir(&state).expect("mkdir state");
    chmod(&state, 0o770);
    let server = StdioServer::launch(launch(ws.path(), &["--state-dir", path_str(&state)])).await;
    server.exec_in("kept", "x = 1").await.assert_ok();
    server.stop().await;
    assert_has_store(&state);
    for name in names(&state) {
        let path = state.join(&name);
        let m = std::fs::symlink_metadata(&path).expect("lstat");
        if m.is_file() {
            assert_eq!(
                m.mode() & 0o077,
                0,
                "{name} in a group-writable state directory is open to others: {:o}",
                m.mode()
            );
        }
    }
}

/// A root-owned directory that is not writable by others, for the
/// unprivileged run: another user's, as this user sees it.
fn a_root_directory() -> PathBuf {
    ["/var/lib", "/srv", "/mnt", "/var/cache", "/opt"]
        .iter()
        .map(PathBuf::from)
        .find(|p| {
            std::fs::symlink_metadata(p)
                .is_ok_and(|m| m.is_dir() && m.uid() == 0 && m.mode() & 0o002 == 0)
        })
        .expect("no root-owned directory that others cannot write among /var/lib, /srv, /mnt, /var/cache, /opt")
}

/// A state directory owned by another user is refused at start with the
/// fix and nothing is created in it. As root: a directory of uid 65534
/// (mode 0700, which root could still write); unprivileged: a root-owned
/// system directory.
#[tokio::test]
async fn a_state_directory_of_another_user_is_refused() {
    let ws = tempfile::tempdir().expect("workspace");
    let place = outside();
    let (state, uid) = if is_root() {
        let state = place.path().join("state");
        std::fs::create_dir(&state).expect("mkdir state");
        chmod(&state, 0o700);
        std::os::unix::fs::lchown(&state, Some(65534), Some(65534)).expect("chown state");
        (state, 65534)
    } else {
        (a_root_directory(), 0)
    };
    let before = tree(&state);
    let err = refused(launch(ws.path(), &["--state-dir", path_str(&state)])).await;
    assert!(
        err.contains(path_str(&state)) && err.contains(&format!("owned by uid {uid}")),
        "the refusal names the state directory and its owner: {err}"
    );
    assert!(
        err.contains("a directory of your own"),
        "the refusal says what to do: {err}"
    );
    assert_eq!(
        tree(&state),
        before,
        "something changed in another user's directory"
    );
}

// ------------------------------------------------------------------ where it lies

/// `--workdir` the home that holds the default state directory
/// (`$HOME/.local/state/ferrepl`, with another workspace's store in it):
/// refused at start, naming the stores and the fix; nothing in the home
/// changes. A home with no state directory yet is refused too, and nothing
/// is made in it.
#[tokio::test]
async fn a_workspace_holding_the_default_state_directory_is_refused() {
    let home = tempfile::tempdir().expect("home");
    let home_str = path_str(home.path());
    let stores = home.path().join(".local/state/ferrepl");

    // A home with no state directory yet.
    let err = refused(
        launch(home.path(), &[])
            .env("HOME", home_str)
            .env_remove("XDG_STATE_HOME"),
    )
    .await;
    assert!(
        err.contains("the stores") && err.contains(path_str(&stores)),
        "the refusal names the stores and where they are: {err}"
    );
    assert_eq!(
        tree(home.path()),
        Vec::<String>::new(),
        "the refused server wrote in the home it was given as workspace"
    );

    // The stores of another project, kept there by an earlier server.
    let project = tempfile::tempdir().expect("project");
    let earlier = StdioServer::launch(
        launch(project.path(), &[])
            .env("HOME", home_str)
            .env_remove("XDG_STATE_HOME"),
    )
    .await;
    earlier
        .exec_in("kept", "secret = 'project code'")
        .await
        .assert_ok();
    earlier.stop().await;
    assert_has_store(&stores);
    let before = tree(home.path());

    for xdg in [None, Some(home.path().join(".local/state"))] {
        let mut l = launch(home.path(), &[]).env("HOME", home_str);
        l = match &xdg {
            Some(x) => l.env("XDG_STATE_HOME", x),
            None => l.env_remove("XDG_STATE_HOME"),
        };
        let err = refused(l).await;
        assert!(
            err.contains("the stores") && err.contains(path_str(&stores)),
            "XDG_STATE_HOME {xdg:?}: the refusal names the stores and where they are: {err}"
        );
        assert!(
            err.contains("keep ferrepl's own files outside the workspace"),
            "XDG_STATE_HOME {xdg:?}: the refusal says what to do: {err}"
        );
        assert_eq!(
            tree(home.path()),
            before,
            "XDG_STATE_HOME {xdg:?}: the refused server changed the home"
        );
    }
}

/// A state directory inside the workspace, inside an `--allow-write` path,
/// or reached through a link outside that resolves into the workspace: each
/// refused at start, naming it, where it lies and the fix; nothing is
/// written in it.
#[tokio::test]
async fn a_state_directory_sessions_can_write_is_refused() {
    let ws = tempfile::tempdir().expect("workspace");
    let place = outside();
    let writable = tempfile::tempdir().expect("an --allow-write directory");

    let in_ws = ws.path().join("state");
    let in_writable = writable.path().join("state");
    let alias = place.path().join("alias");
    std::os::unix::fs::symlink(ws.path(), &alias).expect("symlink alias -> workspace");
    let through_alias = alias.join("state2");
    for dir in [&in_ws, &in_writable, &ws.path().join("state2")] {
        std::fs::create_dir(dir).expect("mkdir");
        chmod(dir, 0o700);
    }

    let cases: [(&Path, Vec<&str>, &Path); 3] = [
        (&in_ws, vec![], ws.path()),
        (
            &in_writable,
            vec!["--allow-write", path_str(writable.path())],
            writable.path(),
        ),
        (&through_alias, vec![], ws.path()),
    ];
    for (state, extra, holder) in cases {
        let before = tree(ws.path());
        let before_writable = tree(writable.path());
        let mut args = vec!["--state-dir", path_str(state)];
        args.extend(extra);
        let err = refused(launch(ws.path(), &args)).await;
        assert!(
            err.contains("--state-dir") && err.contains(path_str(state)),
            "{}: the refusal names the state directory: {err}",
            state.display()
        );
        assert!(
            err.contains(path_str(holder)),
            "{}: the refusal names where it lies ({}): {err}",
            state.display(),
            holder.display()
        );
        assert!(
            err.contains("keep ferrepl's own files outside"),
            "{}: the refusal says what to do: {err}",
            state.display()
        );
        assert_eq!(
            tree(ws.path()),
            before,
            "{}: the refused server wrote in the workspace",
            state.display()
        );
        assert_eq!(
            tree(writable.path()),
            before_writable,
            "{}: the refused server wrote in the --allow-write directory",
            state.display()
        );
    }
}

// ------------------------------------------------------------------ local wheels

/// An install's result once its job has ended (followed with shell_wait).
async fn finished(server: &StdioServer, out: ToolOutput) -> ToolOutput {
    let mut out = out;
    let mut rounds = 0;
    while out.structured["status"] == "running" {
        rounds += 1;
        assert!(rounds <= 10, "the install job never finished: {out:#?}");
        let job = out.str_field("job").to_string();
        out = server
            .call("shell_wait", json!({ "job": job, "wait_s": 60 }))
            .await;
    }
    out
}

/// `python_install` of a local wheel that is a link out of the workspace
/// (absolute, relative climbing out, a linked directory, a link to
/// /etc/passwd, by relative or absolute path): refused before any job
/// starts, naming the problem, and the outside file is never installed or
/// shown. The same wheel as a regular file in the workspace installs.
#[tokio::test]
async fn a_local_wheel_linked_out_of_the_workspace_is_never_installed() {
    let python = system_python();
    let server = StdioServer::launch(Launch::new(&[
        "--python",
        path_str(&python),
        "--venv",
        ".venv",
    ]))
    .await;
    let ws = server.workdir.path().to_path_buf();
    let place = outside();
    let outer = build_wheel(place.path(), "ferrepl_outside_pkg");
    let outer_name = outer.file_name().expect("name").to_owned();

    std::os::unix::fs::symlink(&outer, ws.join(&outer_name)).expect("absolute link");
    let rel_dir = ws.join("rel");
    std::fs::create_dir(&rel_dir).expect("mkdir rel");
    // From ws/rel up to / (one ".." per component of ws), then down.
    let climb = std::iter::repeat_n("..", ws.components().count())
        .collect::<PathBuf>()
        .join(place.path().strip_prefix("/").expect("absolute"))
        .join(&outer_name);
    std::os::unix::fs::symlink(&climb, rel_dir.join(&outer_name)).expect("relative link");
    assert!(
        rel_dir.join(&outer_name).is_file(),
        "the relative link {} does not reach the wheel",
        climb.display()
    );
    std::os::unix::fs::symlink(place.path(), ws.join("linked")).expect("directory link");
    std::os::unix::fs::symlink("/etc/passwd", ws.join("passwd-1.0-py3-none-any.whl"))
        .expect("link to /etc/passwd");

    let name = outer_name.to_str().expect("utf-8");
    let specs = [
        name.to_string(),
        format!("./{name}"),
        path_str(&ws.join(name)).to_string(),
        format!("rel/{name}"),
        format!("linked/{name}"),
        path_str(&ws.join("linked").join(name)).to_string(),
        format!("ferrepl_outside_pkg @ file://{}", ws.join(name).display()),
        "passwd-1.0-py3-none-any.whl".to_string(),
    ];
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let first_line = passwd.lines().next().unwrap_or("root:x:0:0");
    for spec in &specs {
        let out = server
            .call(
                "python_install",
                json!({ "packages": [spec], "wait_s": 60 }),
            )
            .await;
        assert_refused(&out, &["leads outside the workspace"]);
        assert!(
            !out.text.contains(first_line),
            "{spec}: the refusal shows the file outside: {out:#?}"
        );
    }

    // The same wheel as a regular file of the workspace installs: the
    // refusals above are the links'.
    let inner = build_wheel(&ws, "ferrepl_inside_pkg");
    let out = server
        .call(
            "python_install",
            json!({ "packages": [inner.file_name().expect("name").to_str().expect("utf-8")], "wait_s": 120 }),
        )
        .await;
    let out = finished(&server, out).await;
    assert_eq!(
        out.structured["exit_code"], 0,
        "the install failed: {out:#?}"
    );
    let check = format!(
        "{ATTEMPT}\nimport importlib\n\
         attempt('inside', lambda: importlib.import_module('ferrepl_inside_pkg').VALUE)\n\
         attempt('outside', lambda: importlib.import_module('ferrepl_outside_pkg').VALUE)\n"
    );
    let out = server.exec(&check).await;
    out.assert_ok();
    crate::support::assert_succeeded(&out, "inside");
    assert_failed(&out, "outside", "the wheel outside was never installed");
}

/// Builds `<dir>/<name>-1.0-py3-none-any.whl` whose module `name` has
/// `VALUE = 1`; returns its path.
fn build_wheel(dir: &Path, name: &str) -> PathBuf {
    crate::support::pure_wheel(dir, name, "1.0", 1)
}
