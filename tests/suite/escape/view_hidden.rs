//! Files only root can read outside the allow-list (`/var/lib`, `/opt`,
//! `/srv`, `/etc/ssl/private`) and a host socket in `/var/lib` are out of
//! reach of cells and shell jobs; without namespaces Landlock still refuses
//! the reads (not the socket: Landlock does not cover connecting to one).
//! And ferrepl refuses to start where its tokens file would lie in a place
//! sessions read: the workspace, an `--allow-read`/`--allow-write` path, or
//! (without namespaces, where nothing can be carved out) a system directory.
//!
//! Decoys are made only where the current user can: as root. Unprivileged,
//! the checks rest on what the view must not hold at all and on readable
//! files the host already has.

use std::path::{Path, PathBuf};

use super::view::{ABSENT, Cleanup, cell, job};
use crate::support::{
    ATTEMPT, HttpServer, START_TIMEOUT, StdioServer, ToolOutput, assert_failed, errno_of,
    everything, job_python, outcome, path_str, py, py_path, server_command, strip_ansi,
    test_state_home, unique,
};
use crate::support::{chmod, is_root};

// ------------------------------------------------------------------ root's files

/// Root-only decoys outside every allowed place: a secret in each of
/// `/var/lib`, `/opt`, `/srv` and `/etc/ssl/private`, and a listening
/// socket in `/var/lib`. Made only as root (nobody else can write there);
/// removed on drop.
struct RootDecoys {
    secret: String,
    files: Vec<PathBuf>,
    socket: PathBuf,
    listener: std::os::unix::net::UnixListener,
    _cleanup: Cleanup,
}

impl RootDecoys {
    fn make() -> Self {
        let name = unique("ferrepl-test-");
        let secret = unique("ROOT-ONLY-SECRET-");
        let mut cleanup = Vec::new();
        let mut files = Vec::new();
        for base in ["/var/lib", "/opt", "/srv"] {
            let dir = Path::new(base).join(&name);
            std::fs::create_dir_all(&dir).expect("make a decoy directory");
            cleanup.push(dir.clone());
            chmod(&dir, 0o700);
            files.push(dir.join("secret"));
        }
        let private = Path::new("/etc/ssl/private");
        if !private.is_dir() {
            std::fs::create_dir_all(private).expect("make /etc/ssl/private");
            chmod(private, 0o700);
            cleanup.insert(0, private.to_path_buf());
        }
        files.push(private.join(format!("{name}.key")));
        for file in &files {
            std::fs::write(file, format!("{secret}\n")).expect("write a decoy");
            chmod(file, 0o600);
            cleanup.push(file.clone());
        }
        let socket = Path::new("/var/lib").join(&name).join("sock");
        let listener =
            std::os::unix::net::UnixListener::bind(&socket).expect("bind the decoy socket");
        listener.set_nonblocking(true).expect("non-blocking socket");
        RootDecoys {
            secret,
            files,
            socket,
            listener,
            _cleanup: Cleanup(cleanup),
        }
    }

    /// Whether anything connected to the socket.
    fn reached(&self) -> bool {
        self.listener.accept().is_ok()
    }
}

/// Probing code: reads of `files`, listings of their directories, and a
/// connect to `socket` (when given).
fn decoy_probe(files: &[PathBuf], socket: Option<&Path>) -> String {
    let mut code = format!("{ATTEMPT}\nimport socket\n");
    code.push_str(
        "def read(p):\n    with open(p, 'rb') as f:\n        return len(f.read())\n\
         def connect(p):\n    s = socket.socket(socket.AF_UNIX)\n    s.settimeout(5)\n    \
         s.connect(p)\n    s.close()\n    return 'connected'\n",
    );
    for (i, file) in files.iter().enumerate() {
        let dir = file.parent().expect("a parent");
        code.push_str(&format!(
            "attempt('read{i}', lambda: read({f}))\nattempt('list{i}', lambda: os.listdir({d}))\n",
            f = py_path(file),
            d = py_path(dir),
        ));
    }
    if let Some(socket) = socket {
        code.push_str(&format!(
            "attempt('connect', lambda: connect({}))\n",
            py_path(socket)
        ));
    }
    code
}

/// Runs `code` in a cell and, from a file in the workspace, in a shell job.
async fn cell_and_job(server: &StdioServer, code: &str) -> Vec<(&'static str, ToolOutput)> {
    let ws = server.workdir.path();
    let script = ws.join(format!("{}.py", unique("probe-")));
    std::fs::write(&script, code).expect("write the probe");
    let from_cell = cell(server.peer(), "default", code).await;
    let from_job = job(
        server.peer(),
        &format!("{} {}", job_python(), script.display()),
    )
    .await;
    vec![("a cell", from_cell), ("a shell job", from_job)]
}

#[tokio::test]
async fn root_only_files_and_host_sockets_are_unreachable() {
    let decoys = is_root().then(RootDecoys::make);
    let server = StdioServer::start(&[]).await;
    let files: Vec<PathBuf> = decoys.iter().flat_map(|d| d.files.clone()).collect();
    let socket = decoys.as_ref().map(|d| d.socket.as_path());
    let mut code = decoy_probe(&files, socket);
    // The venv ferrepl keeps in its state directory is bound at its own
    // path, so the directories on the way there exist (the test servers'
    // state lies in the checkout's target/, which may be under /home).
    let absent: Vec<&str> = ABSENT
        .iter()
        .copied()
        .filter(|p| !test_state_home().starts_with(p))
        .collect();
    for (i, path) in absent.iter().enumerate() {
        code.push_str(&format!(
            "attempt('exists{i}', lambda: os.path.lexists({}) or 1/0)\n",
            py(path)
        ));
    }
    for (who, out) in cell_and_job(&server, &code).await {
        for i in 0..files.len() {
            assert_failed(
                &out,
                &format!("read{i}"),
                &format!("{who}: a root-only file"),
            );
            assert_failed(
                &out,
                &format!("list{i}"),
                &format!("{who}: a root-only dir"),
            );
        }
        if socket.is_some() {
            assert_failed(
                &out,
                "connect",
                &format!("{who}: a host socket in /var/lib"),
            );
        }
        for (i, path) in absent.iter().enumerate() {
            assert_failed(
                &out,
                &format!("exists{i}"),
                &format!("{who}: {path} is not in the allow-list"),
            );
        }
        if let Some(d) = &decoys {
            assert!(
                !everything(&out).contains(&d.secret),
                "{who} read a decoy: {out:#?}"
            );
        }
    }
    if let Some(d) = &decoys {
        assert!(!d.reached(), "a sandbox connected to the host socket");
    }
}

/// A few files readable by this user outside the allow-list, for the
/// degraded mode: the decoys as root, else whatever world-readable file
/// the host has under `/var/lib`, `/opt`, `/srv` or `/var/log`.
fn readable_outside(decoys: Option<&RootDecoys>) -> Vec<PathBuf> {
    if let Some(d) = decoys {
        return d.files.clone();
    }
    let mut found = Vec::new();
    let mut stack: Vec<PathBuf> = ["/var/lib", "/opt", "/srv", "/var/log"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let mut visited = 0;
    while let Some(dir) = stack.pop() {
        visited += 1;
        if visited > 500 || found.len() >= 3 {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() && std::fs::File::open(&path).is_ok() {
                found.push(path);
                break;
            }
        }
    }
    found
}

#[tokio::test]
async fn without_namespaces_root_only_files_stay_unreadable() {
    let decoys = is_root().then(RootDecoys::make);
    let files = readable_outside(decoys.as_ref());
    assert!(
        !files.is_empty(),
        "no file readable by this user under /var/lib, /opt, /srv or /var/log"
    );
    let server = StdioServer::start(&["--no-namespaces"]).await;
    // The host socket is not covered by Landlock there: not probed.
    let code = decoy_probe(&files, None);
    for (who, out) in cell_and_job(&server, &code).await {
        for (i, file) in files.iter().enumerate() {
            let got = outcome(&out, &format!("read{i}"));
            assert_eq!(
                errno_of(&got),
                Some(libc::EACCES),
                "{who}: reading {} outside the allow-list must fail with \
                 PermissionError (Landlock), got '{got}': {out:#?}",
                file.display()
            );
        }
        if let Some(d) = &decoys {
            assert!(
                !everything(&out).contains(&d.secret),
                "{who} read a decoy: {out:#?}"
            );
        }
    }
}

// ------------------------------------------------------------------ refused at start

/// Runs ferrepl with `args` (stdin open) and returns its stderr; panics
/// unless it exits, unsuccessfully, before serving.
async fn refused_start(args: &[&str]) -> String {
    let mut cmd = server_command();
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(START_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("ferrepl {args:?} did not exit: it started serving"))
        .expect("run ferrepl");
    let stderr = strip_ansi(&String::from_utf8_lossy(&output.stderr));
    assert!(
        !output.status.success(),
        "ferrepl {args:?} exited successfully; stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("listening on"),
        "ferrepl {args:?} served before refusing:\n{stderr}"
    );
    stderr
}

fn assert_names_the_tokens_file(stderr: &str, what: &str) {
    assert!(
        stderr.contains("--auth-token-file") && stderr.contains("which sessions can read"),
        "{what}: the refusal should name --auth-token-file and say sessions could \
         read it:\n{stderr}"
    );
}

const BARE_TOKEN: &str = "view-test-token-0123456789abcdef";

#[tokio::test]
async fn operator_files_inside_the_workspace_are_refused_at_start() {
    let ws = tempfile::tempdir().expect("workspace");
    let outside = tempfile::tempdir().expect("a directory outside the workspace");
    let wsp = path_str(ws.path()).to_string();

    // In the workspace: a bare token, and tenants in a subdirectory.
    let bare = ws.path().join("tokens");
    std::fs::write(&bare, format!("{BARE_TOKEN}\n")).expect("write tokens");
    let sub = ws.path().join("conf");
    std::fs::create_dir(&sub).expect("mkdir conf");
    let tenants = sub.join("tokens");
    std::fs::write(&tenants, format!("{BARE_TOKEN} alice\n")).expect("write tokens");
    for tokens in [&bare, &tenants] {
        let stderr = refused_start(&[
            "--http",
            "127.0.0.1:0",
            "--workdir",
            &wsp,
            "--auth-token-file",
            path_str(tokens),
        ])
        .await;
        assert_names_the_tokens_file(&stderr, &format!("{} in --workdir", tokens.display()));
    }

    // In an --allow-read or --allow-write directory.
    let shared = outside.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir shared");
    let in_shared = shared.join("tokens");
    std::fs::write(&in_shared, format!("{BARE_TOKEN}\n")).expect("write tokens");
    for flag in ["--allow-read", "--allow-write"] {
        let stderr = refused_start(&[
            "--http",
            "127.0.0.1:0",
            "--workdir",
            &wsp,
            flag,
            path_str(&shared),
            "--auth-token-file",
            path_str(&in_shared),
        ])
        .await;
        assert_names_the_tokens_file(&stderr, &format!("the tokens file in {flag}"));
    }

    // The same flags with the tokens file elsewhere start: the refusal was
    // the file's place.
    let elsewhere = outside.path().join("tokens");
    std::fs::write(&elsewhere, format!("{BARE_TOKEN}\n")).expect("write tokens");
    let server = HttpServer::start(
        &[
            "--allow-read",
            path_str(&shared),
            "--auth-token-file",
            path_str(&elsewhere),
        ],
        &[],
    )
    .await;
    drop(server);

    // Nor is a directory the view binds (/usr), with or without namespaces:
    // a cover over one name would not survive the file's rotation (only
    // root can put a file there).
    if is_root() {
        let dir = Path::new("/usr/local/etc").join(unique("ferrepl-test-"));
        std::fs::create_dir_all(&dir).expect("mkdir under /usr/local/etc");
        let _cleanup = Cleanup(vec![dir.clone()]);
        chmod(&dir, 0o700);
        let tokens = dir.join("tokens");
        std::fs::write(&tokens, format!("{BARE_TOKEN}\n")).expect("write tokens");
        chmod(&tokens, 0o600);
        for namespaces in [true, false] {
            let mut args = vec!["--http", "127.0.0.1:0", "--workdir", &wsp];
            if !namespaces {
                args.push("--no-namespaces");
            }
            args.extend(["--auth-token-file", path_str(&tokens)]);
            let stderr = refused_start(&args).await;
            assert_names_the_tokens_file(
                &stderr,
                &format!("a tokens file under /usr (namespaces: {namespaces})"),
            );
        }
    }
}

/// Review (attack): an --allow-read or --allow-write path that is a link
/// whose target, in the workspace, does not exist yet. Start-up resolves
/// it only as far as it exists (the link itself), so it is neither "inside
/// the workspace" nor a bind sessions could steer, and the server starts;
/// then a job makes the target a link to any directory (`ln -s /srv/x
/// later`) and every later launch binds that directory at the allowed
/// path (open_tree and Landlock follow links): read as the sessions' uid,
/// or written with --allow-write. Must be refused at start like a link
/// whose target exists. FAILS today (and failed before the map of places:
/// both rules canonicalized or kept the path as given).
#[tokio::test]
async fn an_allowed_path_that_is_a_dangling_link_into_the_workspace_is_refused() {
    let ws = tempfile::tempdir().expect("workspace");
    let outside = tempfile::tempdir().expect("outside");
    let wsp = path_str(ws.path()).to_string();
    let link = outside.path().join("data");
    std::os::unix::fs::symlink(ws.path().join("later"), &link).expect("symlink");
    for flag in ["--allow-read", "--allow-write"] {
        let stderr = refused_start(&[
            "--http",
            "127.0.0.1:0",
            "--workdir",
            &wsp,
            flag,
            path_str(&link),
        ])
        .await;
        assert!(
            stderr.contains("workspace") && stderr.contains(path_str(&link)),
            "{flag} through a dangling link into the workspace: {stderr}"
        );
    }
}
