//! Git's places: the host's real git runs nothing a session planted (hooks,
//! config, through every command the user would run), the gitdir a root
//! `.git` file names is protected as `.git` is, and so are hooks under
//! `core.hooksPath`.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::escape::view::cell;
use crate::support::{ATTEMPT, chmod, path_str, py, sh_quote};

use super::attacks::*;
use super::*;

/// The host's git in `dir` with no system or global configuration of the
/// user's (so what runs is what the repository holds), a test identity and
/// no terminal prompts.
pub(super) fn git_command(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("PAGER", "cat")
        .stdin(Stdio::null());
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_PAGER",
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_CEILING_DIRECTORIES",
        "GIT_EDITOR",
    ] {
        cmd.env_remove(var);
    }
    cmd.args([
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "-c",
        "init.defaultBranch=main",
    ]);
    cmd
}

pub(super) fn host_git(dir: &Path, args: &[&str]) -> Output {
    git_command(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run git {args:?}: {e}"))
}

pub(super) fn host_git_ok(dir: &Path, args: &[&str]) -> String {
    let out = host_git(dir, args);
    assert!(
        out.status.success(),
        "host git {args:?} in {} failed: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `git args` on a terminal (so git runs a pager), its output drained.
pub(super) fn host_git_on_a_terminal(dir: &Path, args: &[&str]) -> std::process::ExitStatus {
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let mut cmd = git_command(dir);
    cmd.args(args)
        .stdout(Stdio::from(pty.slave))
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn git on a terminal");
    drop(cmd);
    let mut master = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        // EIO once the last holder of the terminal is gone.
        let _ = master.read_to_end(&mut buf);
    });
    let status = child.wait().expect("wait for git");
    reader.join().expect("the terminal's reader");
    status
}

/// Hooks a planted hook would be: each writes a marker named after itself.
pub(super) const HOOKS: &[&str] = &[
    "pre-commit",
    "commit-msg",
    "post-commit",
    "post-index-change",
];

/// What host git runs from a repository's config: `(key, marker, what the
/// command does after writing its marker)` (a pager and a clean filter
/// pass their input on).
pub(super) const CONFIG_COMMANDS: &[(&str, &str, &str)] = &[
    ("core.fsmonitor", "fsmonitor", "false"),
    ("core.pager", "pager", "cat"),
    ("core.sshCommand", "ssh", "false"),
    ("filter.evil.clean", "filter", "cat"),
];

pub(super) fn marker_command(markers: &Path, name: &str, then: &str) -> String {
    format!("touch {}; {then}", sh_quote(path_str(&markers.join(name))))
}

pub(super) fn hook_text(markers: &Path, name: &str) -> String {
    format!(
        "#!/bin/sh\ntouch {}\n",
        sh_quote(path_str(&markers.join(name)))
    )
}

/// The names in `markers`: what host git ran.
pub(super) fn markers_in(markers: &Path) -> BTreeSet<String> {
    std::fs::read_dir(markers)
        .expect("list the markers")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// What a user does next in the workspace with the host's git: status,
/// log (on a terminal, so a pager runs, and with `-c core.pager=cat`), add,
/// commit, and a fetch over ssh (to nowhere). The names in `markers`
/// afterwards: what git ran.
pub(super) fn host_git_session(repo: &Path, markers: &Path) -> BTreeSet<String> {
    host_git_ok(repo, &["status"]);
    let status = host_git_on_a_terminal(repo, &["log", "-1"]);
    assert!(status.success(), "git log on a terminal: {status}");
    host_git_ok(repo, &["-c", "core.pager=cat", "log"]);
    write(&repo.join("README.md"), "# changed by the user\n");
    host_git_ok(repo, &["add", "-u"]);
    host_git_ok(repo, &["commit", "-q", "-m", "the user's commit"]);
    // Nothing listens on port 1: ssh fails at once; only a planted
    // sshCommand would run instead.
    let _ = host_git(repo, &["ls-remote", "ssh://127.0.0.1:1/x"]);
    markers_in(markers)
}

/// Python for the plants: `_write_text` and `_plant_hook`.
pub(super) const PLANT_PY: &str = r#"
def _write_text(p, mode, text):
    with open(p, mode) as f:
        f.write(text)

def _plant_hook(p, text):
    _write_text(p, "w", text)
    os.chmod(p, 0o755)
"#;

#[tokio::test]
async fn host_git_runs_nothing_a_session_planted() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    let markers = place.beside("markers");

    // The control: the same plants made on the host are all run by this
    // sequence, so the assertion below would see a plant that got through.
    let control = place.beside("control");
    write(&control.join("README.md"), "# control\n");
    host_git_ok(&control, &["init", "-q"]);
    host_git_ok(&control, &["add", "-A"]);
    host_git_ok(&control, &["commit", "-q", "-m", "first"]);
    let control_markers = place.beside("control-markers");
    for hook in HOOKS {
        let p = control.join(".git/hooks").join(hook);
        write(&p, &hook_text(&control_markers, hook));
        chmod(&p, 0o755);
    }
    for (key, name, then) in CONFIG_COMMANDS {
        host_git_ok(
            &control,
            &["config", key, &marker_command(&control_markers, name, then)],
        );
    }
    write(&control.join(".gitattributes"), "* filter=evil\n");
    let ran = host_git_session(&control, &control_markers);
    let expected: BTreeSet<String> = HOOKS
        .iter()
        .chain(CONFIG_COMMANDS.iter().map(|(_, n, _)| n))
        .map(|s| s.to_string())
        .collect();
    assert!(
        expected.is_subset(&ran),
        "the control: host git ran {ran:?} of the plants {expected:?}; the test would see nothing"
    );

    // The session's plants: hooks, the config's commands (appended, or
    // the whole file replaced), an include of a file the session owns,
    // and attributes.
    let git_before = tree(&ws.join(".git"));
    let server = serve(ws, &[]).await;
    let mut config = String::new();
    for (key, name, then) in CONFIG_COMMANDS {
        let (section, key) = key.rsplit_once('.').expect("section.key");
        let section = match section.split_once('.') {
            Some((s, sub)) => format!("{s} \"{sub}\""),
            None => section.to_string(),
        };
        config.push_str(&format!(
            "[{section}]\n\t{key} = \"{}\"\n",
            marker_command(&markers, name, then)
        ));
    }
    let mut code = format!("{ATTEMPT}\n{ATTACKS_PY}\n{PLANT_PY}\n");
    for hook in HOOKS {
        code.push_str(&format!(
            "attempt('hook {hook}', lambda: _plant_hook('.git/hooks/{hook}', {text}))\n",
            text = py(hook_text(&markers, hook)),
        ));
    }
    code.push_str(&format!(
        "attempt('config-append', lambda: _write_text('.git/config', 'a', {c}))\n\
         attempt('config-replace', lambda: (_write_text('scratch/config', 'w', open('.git/config').read() + {c}), os.replace('scratch/config', '.git/config')))\n\
         attempt('include', lambda: _write_text('.git/config', 'a', '[include]\\n\\tpath = ../scratch/evil.config\\n'))\n\
         attempt('info-attributes', lambda: _write_text('.git/info/attributes', 'w', '* filter=evil\\n'))\n\
         attempt('gitattributes', lambda: _write_text('.gitattributes', 'w', '* filter=evil\\n'))\n\
         attempt('evil-include', lambda: _write_text('scratch/evil.config', 'w', {c}))\n",
        c = py(&config),
    ));
    let out = cell(server.peer(), "default", &code).await;
    let mut labels: Vec<String> = HOOKS.iter().map(|h| format!("hook {h}")).collect();
    labels.extend(
        [
            "config-append",
            "config-replace",
            "include",
            "info-attributes",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    assert_all_refused(&out, &labels, ".git", "planting hooks and config");
    // The ordinary files of the plan are the session's to write.
    let got = outcomes(&out);
    for free in ["gitattributes", "evil-include"] {
        assert!(
            got.get(free).is_some_and(|o| o.starts_with("OK")),
            "{free} should have worked: {out:#?}"
        );
    }

    // And through git itself, in a job.
    let mut attempts: Vec<(&str, String)> = CONFIG_COMMANDS
        .iter()
        .map(|(key, name, then)| {
            (
                *key,
                format!(
                    "git config {key} {}",
                    sh_quote(&marker_command(&markers, name, then))
                ),
            )
        })
        .collect();
    attempts.push((
        "hooksPath",
        "mkdir -p scratch/hooks && git config core.hooksPath scratch/hooks".into(),
    ));
    attempts.push((
        "include",
        "git config include.path ../scratch/evil.config".into(),
    ));
    let out = shell(&server, &shell_script("scratch/job", &attempts), false).await;
    assert_shell_refused(&out, &attempts, "git config in a job");
    drop(server);

    assert_same_tree(
        &git_before,
        &tree(&ws.join(".git")),
        ".git after the plants",
    );
    let ran = host_git_session(ws, &markers);
    assert!(
        ran.is_empty(),
        "host git ran what a session planted: {ran:?}"
    );
    let log = host_git_ok(ws, &["log", "--format=%s"]);
    assert!(
        log.contains("the user's commit"),
        "the user's commit did not happen: {log}"
    );
}

#[tokio::test]
async fn a_root_git_file_protects_the_directory_it_names() {
    let place = Place::new();
    let ws = &place.ws;
    write(&ws.join("README.md"), "# separate git dir\n");
    std::fs::create_dir_all(ws.join("store")).expect("mkdir store");
    host_git_ok(ws, &["init", "-q", "--separate-git-dir", "store/gd"]);
    // As a user (or a tool) writes it: relative.
    write(&ws.join(".git"), "gitdir: store/gd\n");
    host_git_ok(ws, &["add", "README.md"]);
    host_git_ok(ws, &["commit", "-q", "-m", "first"]);
    std::fs::create_dir_all(ws.join("scratch")).expect("mkdir scratch");
    let markers = place.beside("markers");
    let before = tree_outside_scratch(ws);
    let server = serve(ws, &[]).await;

    let files = ["store/gd/config", "store/gd/HEAD", ".git"];
    let dirs = ["store/gd", "store/gd/hooks", "store"];
    let out = cell(
        server.peer(),
        "default",
        &attack_cell("", &files, &dirs[..2], &[]),
    )
    .await;
    assert_all_refused(
        &out,
        &attack_labels(&files, &dirs[..2], &[]),
        ".git",
        "attacks on a gitdir a .git file names",
    );
    // The directory holding the gitdir cannot move either (a new one could
    // then be made in its stead).
    let hook = hook_text(&markers, "pre-commit");
    let out = cell(
        server.peer(),
        "default",
        &format!(
            "attempt('rename store', lambda: os.rename('store', 'scratch/store'))\n\
             attempt('exchange store', lambda: _exchange(_evil_dir(), 'store'))\n\
             attempt('rmtree store', lambda: __import__('shutil').rmtree('store'))\n\
             attempt('hook', lambda: (open('store/gd/hooks/pre-commit', 'w').write({hook}), os.chmod('store/gd/hooks/pre-commit', 0o755)))\n",
            hook = py(&hook)
        ),
    )
    .await;
    let labels: Vec<String> = ["rename store", "exchange store", "rmtree store", "hook"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_all_erofs(&out, &labels, "moving the gitdir's directory");
    drop(server);
    assert_same_tree(&before, &tree_outside_scratch(ws), "the gitdir");
    write(&ws.join("README.md"), "# changed\n");
    host_git_ok(ws, &["commit", "-q", "-am", "the user's commit"]);
    assert!(
        !markers.join("pre-commit").exists(),
        "host git ran a hook planted in the gitdir"
    );
}

/// A repository whose hooks live elsewhere (`core.hooksPath`, which many
/// projects point at a tracked `.githooks/`): git runs those on commit just
/// as it runs `.git/hooks`.
#[tokio::test]
async fn hooks_under_core_hooks_path_are_protected() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    write(&ws.join(".githooks/pre-commit"), "#!/bin/sh\nexit 0\n");
    chmod(&ws.join(".githooks/pre-commit"), 0o755);
    host_git_ok(ws, &["config", "core.hooksPath", ".githooks"]);
    let markers = place.beside("markers");
    let server = serve(ws, &[]).await;
    let out = cell(
        server.peer(),
        "default",
        &format!(
            "{ATTEMPT}\n{PLANT_PY}\n\
             attempt('rewrite', lambda: _write_text('.githooks/pre-commit', 'w', {hook}))\n\
             attempt('new', lambda: _plant_hook('.githooks/commit-msg', {msg}))\n",
            hook = py(hook_text(&markers, "pre-commit")),
            msg = py(hook_text(&markers, "commit-msg")),
        ),
    )
    .await;
    drop(server);
    write(&ws.join("README.md"), "# changed\n");
    host_git_ok(ws, &["commit", "-q", "-am", "the user's commit"]);
    let ran = markers_in(&markers);
    assert!(
        ran.is_empty(),
        "host git ran hooks a session wrote under core.hooksPath: {ran:?}\n{out:#?}"
    );
}
