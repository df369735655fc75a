//! Protected places (issue 40): the workspace is shared with the user's
//! git, editors and agent clients, which run what they find in some places
//! by themselves (git's hooks and config, `.mcp.json`, `.claude/`, `.envrc`,
//! `.Rprofile`, a `.pth` in `.venv`...). Nothing sandboxed may create,
//! change, rename, remove or link over one of them, existing or not; a
//! refusal is EROFS with one line naming the place.
//!
//! Every test makes a workspace of its own (existing places made on the
//! host before the server starts), attacks it through the real binary (a
//! cell, a shell job on pipes and on a terminal, an R session), and then
//! looks on the HOST: the bytes, modes and listings of the places are what
//! they were, and the host's real git runs nothing a session planted. Each
//! attack that must fail is also run on ordinary paths, where it must work
//! (`ordinary_paths_stay_free`): a refusal is the protection's, not a
//! broken attack's.
//!
//! The tests after "found open" each show a way the protection was found
//! to let through when they were written (a directory holding a protected
//! sequence of names or a `--protect` path, moved or linked in; hooks
//! under `core.hooksPath`; a refusal naming a flag that does not free its
//! place); they fail until it is closed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::json;

use super::view::{cell, job, r_cell};
use crate::support::{
    ATTEMPT, Launch, Reaper, START_TIMEOUT, StdioServer, ToolOutput, chmod, descendants, errno_of,
    job_python, json_list, path_str, py, server_binary, sh_quote, unique, wait_for_file_line,
    wait_process_gone,
};

/// The errno of every refusal.
const EROFS: i32 = 30;
/// What the first refusal per place and process says.
const PROTECTED_LINE: &str = "is protected: host programs run what it holds";
/// Bounds for processes to go and files to appear (never waited out when
/// things work).
const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// The built-in protected names (`BUILT_IN` in src/sandbox/protected.rs).
const BUILT_IN: &[&str] = &[
    ".git",
    ".gitmodules",
    "HEAD",
    ".hg",
    ".pre-commit-config.yaml",
    ".husky",
    ".mcp.json",
    ".claude",
    ".codex",
    ".gemini",
    ".cursor",
    ".vscode",
    ".idea",
    ".zed",
    ".agents",
    ".envrc",
    ".Rprofile",
    ".Renviron",
    ".RData",
    "renv/activate.R",
    ".venv",
];

// ------------------------------------------------------------------ attacks

/// Python attacks: each takes one path and raises unless it changed,
/// created, moved, removed or linked something there. `FILE_ATTACKS` are
/// run on existing files, `DIR_ATTACKS` on existing directories,
/// `CREATE_ATTACKS` on absent names (their directory exists). Helpers make
/// their decoys and replacements under `scratch/`.
const ATTACKS_PY: &str = r##"
import ctypes, itertools, json, socket, subprocess, sys
_libc = ctypes.CDLL(None, use_errno=True)
_n = itertools.count()

def _scratch(kind):
    os.makedirs("scratch", exist_ok=True)
    return os.path.join("scratch", "%s%d" % (kind, next(_n)))

def _write(p, mode="w"):
    with open(p, mode) as f:
        f.write("EVIL\n")

def _decoy():
    p = _scratch("decoy")
    _write(p)
    return p

def _evil_dir():
    p = _scratch("evil")
    os.makedirs(os.path.join(p, "hooks"))
    _write(os.path.join(p, "hooks", "pre-commit"))
    _write(os.path.join(p, "config"))
    return p

def _raise_errno():
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e))

def _exchange(a, b):
    # renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE): swaps even
    # non-empty directories.
    if _libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) != 0:
        _raise_errno()

def _bind(p):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(p)
    finally:
        s.close()

def _via_opath(p):
    fd = os.open(p, os.O_PATH)
    try:
        _write("/proc/self/fd/%d" % fd, "a")
    finally:
        os.close(fd)

def _via_dev_fd(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        _write("/dev/fd/%d" % fd, "a")
    finally:
        os.close(fd)

def _fchmod(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fchmod(fd, 0o777)
    finally:
        os.close(fd)

_CHILD = (
    "import os, sys\n"
    "try:\n"
    "    os.close(os.open(sys.argv[1], int(sys.argv[2]), 0o755))\n"
    "except OSError as e:\n"
    "    sys.exit(e.errno)\n"
)

def _child(p, flags):
    # A process the cell starts: the filter and its supervisor are inherited.
    r = subprocess.run([sys.executable, "-c", _CHILD, p, str(flags)])
    if r.returncode:
        raise OSError(r.returncode, "in a child process")

def _symlink_swap(p):
    link = _scratch("link")
    os.symlink(os.path.abspath(_decoy()), link)
    os.replace(link, p)

def _at_dirfd(d):
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.close(os.open("new-at", os.O_WRONLY | os.O_CREAT, 0o755, dir_fd=fd))
    finally:
        os.close(fd)

def _in_cwd(d):
    old = os.getcwd()
    os.chdir(d)
    try:
        _write("new-in-cwd")
    finally:
        os.chdir(old)

def _tmpfile_in(d):
    os.close(os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o755))

def _dangling(p):
    link = _scratch("dangling")
    os.symlink(os.path.abspath(p), link)
    _write(link)

FILE_ATTACKS = {
    "open-w": lambda p: _write(p, "w"),
    "open-a": lambda p: _write(p, "a"),
    "open-r+": lambda p: _write(p, "r+"),
    "open-trunc": lambda p: os.close(os.open(p, os.O_WRONLY | os.O_TRUNC)),
    "truncate": lambda p: os.truncate(p, 0),
    "chmod": lambda p: os.chmod(p, 0o777),
    "fchmod": _fchmod,
    "remove": os.remove,
    "rename-away": lambda p: os.rename(p, _scratch("stolen")),
    "replace-over": lambda p: os.replace(_decoy(), p),
    "symlink-swap": _symlink_swap,
    "hardlink-out": lambda p: os.link(p, _scratch("hard")),
    "proc-fd": _via_opath,
    "dev-fd": _via_dev_fd,
    "child": lambda p: _child(p, os.O_WRONLY | os.O_APPEND),
}

DIR_ATTACKS = {
    "mkdir-in": lambda d: os.mkdir(os.path.join(d, "newdir")),
    "create-in": lambda d: _write(os.path.join(d, "new-file")),
    "symlink-in": lambda d: os.symlink("/bin/sh", os.path.join(d, "new-link")),
    "hardlink-in": lambda d: os.link(_decoy(), os.path.join(d, "new-hard")),
    "mkfifo-in": lambda d: os.mkfifo(os.path.join(d, "new-fifo")),
    "bind-in": lambda d: _bind(os.path.join(d, "new-sock")),
    "at-dirfd": _at_dirfd,
    "in-cwd": _in_cwd,
    "tmpfile-in": _tmpfile_in,
    "move-in": lambda d: os.rename(_decoy(), os.path.join(d, "moved-in")),
    "rename-away": lambda d: os.rename(d, _scratch("moved")),
    "replace-with": lambda d: os.replace(_evil_dir(), d),
    "exchange-with": lambda d: _exchange(_evil_dir(), d),
    "rmdir": os.rmdir,
    "chmod": lambda d: os.chmod(d, 0o777),
    "child-in": lambda d: _child(os.path.join(d, "new-child"), os.O_WRONLY | os.O_CREAT),
}

CREATE_ATTACKS = {
    "open-w": lambda p: _write(p, "w"),
    "open-a": lambda p: _write(p, "a"),
    "open-excl": lambda p: os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)),
    "mkdir": os.mkdir,
    "makedirs": lambda p: os.makedirs(os.path.join(p, "hooks")),
    "symlink": lambda p: os.symlink(os.path.abspath(_evil_dir()), p),
    "hardlink": lambda p: os.link(_decoy(), p),
    "rename-file-in": lambda p: os.rename(_decoy(), p),
    "rename-dir-in": lambda p: os.rename(_evil_dir(), p),
    "mkfifo": os.mkfifo,
    "bind": _bind,
    "dangling-link": _dangling,
    "child": lambda p: _child(p, os.O_WRONLY | os.O_CREAT),
}

def run_attacks(names, files, dirs, creates):
    # The Rust side checks one outcome per (attack, path): same names here.
    assert [list(FILE_ATTACKS), list(DIR_ATTACKS), list(CREATE_ATTACKS)] == names, names
    for p in files:
        for name, fn in FILE_ATTACKS.items():
            attempt("%s %s" % (name, p), lambda: fn(p))
    for d in dirs:
        for name, fn in DIR_ATTACKS.items():
            attempt("%s %s" % (name, d), lambda: fn(d))
    for p in creates:
        for name, fn in CREATE_ATTACKS.items():
            attempt("%s %s" % (name, p), lambda: fn(p))
"##;

const FILE_ATTACKS: &[&str] = &[
    "open-w",
    "open-a",
    "open-r+",
    "open-trunc",
    "truncate",
    "chmod",
    "fchmod",
    "remove",
    "rename-away",
    "replace-over",
    "symlink-swap",
    "hardlink-out",
    "proc-fd",
    "dev-fd",
    "child",
];
const DIR_ATTACKS: &[&str] = &[
    "mkdir-in",
    "create-in",
    "symlink-in",
    "hardlink-in",
    "mkfifo-in",
    "bind-in",
    "at-dirfd",
    "in-cwd",
    "tmpfile-in",
    "move-in",
    "rename-away",
    "replace-with",
    "exchange-with",
    "rmdir",
    "chmod",
    "child-in",
];
const CREATE_ATTACKS: &[&str] = &[
    "open-w",
    "open-a",
    "open-excl",
    "mkdir",
    "makedirs",
    "symlink",
    "hardlink",
    "rename-file-in",
    "rename-dir-in",
    "mkfifo",
    "bind",
    "dangling-link",
    "child",
];

/// A cell running every attack on `files`, `dirs` and `creates` (paths
/// relative to the workspace), after `setup` (Python run first).
fn attack_cell(setup: &str, files: &[&str], dirs: &[&str], creates: &[&str]) -> String {
    format!(
        "{ATTEMPT}\n{ATTACKS_PY}\n{setup}\nrun_attacks([{fa}, {da}, {ca}], {files}, {dirs}, {creates})\n",
        fa = json_list(FILE_ATTACKS),
        da = json_list(DIR_ATTACKS),
        ca = json_list(CREATE_ATTACKS),
        files = json_list(files),
        dirs = json_list(dirs),
        creates = json_list(creates),
    )
}

/// Every `label: outcome` line of a cell's or job's stdout (a terminal's
/// "\r" dropped).
fn outcomes(out: &ToolOutput) -> BTreeMap<String, String> {
    out.str_field("stdout")
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The labels of every attack `attack_cell` runs on these paths.
fn attack_labels(files: &[&str], dirs: &[&str], creates: &[&str]) -> Vec<String> {
    let mut labels = Vec::new();
    for (attacks, paths) in [
        (FILE_ATTACKS, files),
        (DIR_ATTACKS, dirs),
        (CREATE_ATTACKS, creates),
    ] {
        for p in paths {
            labels.extend(attacks.iter().map(|a| format!("{a} {p}")));
        }
    }
    labels
}

/// Panics unless every one of `labels` was refused with EROFS, and the
/// output names the protection and the flag freeing `name`.
fn assert_all_refused(out: &ToolOutput, labels: &[String], name: &str, what: &str) {
    assert_all_erofs(out, labels, what);
    assert_names_protection(out, name, what);
}

/// Panics unless every one of `labels` was refused with EROFS.
fn assert_all_erofs(out: &ToolOutput, labels: &[String], what: &str) {
    let got = outcomes(out);
    let wrong: Vec<String> = labels
        .iter()
        .filter_map(|label| match got.get(label) {
            Some(o) if errno_of(o) == Some(EROFS) => None,
            Some(o) => Some(format!("{label}: {o}")),
            None => Some(format!("{label}: (no outcome)")),
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: {} of {} attacks were not refused with EROFS:\n  {}\nresult: {out:#?}",
        wrong.len(),
        labels.len(),
        wrong.join("\n  ")
    );
}

/// Panics unless the result's output has the refusal line for a place
/// freed by `--allow-write-protected {name}`.
fn assert_names_protection(out: &ToolOutput, name: &str, what: &str) {
    let text = format!("{}\n{}", out.str_field("stdout"), out.str_field("stderr"));
    assert!(
        text.contains(PROTECTED_LINE) && text.contains(&format!("--allow-write-protected {name}")),
        "{what}: the output does not name the protection of {name}: {out:#?}"
    );
}

// ------------------------------------------------------------------ the host

/// One entry of a tree as the host sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir(u32),
    File(u32, Vec<u8>),
    Link(PathBuf),
    /// A FIFO, socket or device: its whole mode.
    Other(u32),
}

/// Every entry under a root (links not followed), by relative path.
type Tree = BTreeMap<String, Node>;

fn tree(root: &Path) -> Tree {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Tree::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("a directory entry");
            let rel = rel.join(entry.file_name());
            let path = root.join(&rel);
            let meta = std::fs::symlink_metadata(&path)
                .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
            let mode = meta.permissions().mode();
            let kind = meta.file_type();
            let node = if kind.is_symlink() {
                Node::Link(std::fs::read_link(&path).expect("readlink"))
            } else if kind.is_dir() {
                stack.push(rel.clone());
                Node::Dir(mode & 0o7777)
            } else if kind.is_file() {
                let bytes =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                Node::File(mode & 0o7777, bytes)
            } else {
                Node::Other(mode)
            };
            out.insert(path_str(&rel).to_string(), node);
        }
    }
    out
}

/// `tree` without what lies under `scratch/` (where attacks put decoys).
fn tree_outside_scratch(root: &Path) -> Tree {
    tree(root)
        .into_iter()
        .filter(|(k, _)| k != "scratch" && !k.starts_with("scratch/"))
        .collect()
}

/// Panics (naming each difference) unless the trees are equal.
fn assert_same_tree(before: &Tree, after: &Tree, what: &str) {
    if before == after {
        return;
    }
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| {
            let show = |n: Option<&Node>| match n {
                None => "absent".to_string(),
                Some(Node::File(m, b)) => {
                    format!("file {m:o} {:?}", String::from_utf8_lossy(b))
                }
                Some(other) => format!("{other:?}"),
            };
            format!("{k}: {} -> {}", show(before.get(k)), show(after.get(k)))
        })
        .collect();
    panic!(
        "{what}: the workspace changed on the host:\n  {}",
        diffs.join("\n  ")
    );
}

/// The paths under `root` that are, or lie in, a built-in protected place.
fn protected_entries(root: &Path) -> Vec<String> {
    tree(root)
        .into_keys()
        .filter(|rel| {
            let parts: Vec<&str> = rel.split('/').collect();
            parts.iter().enumerate().any(|(i, part)| {
                BUILT_IN.contains(part)
                    || (*part == "renv" && parts.get(i + 1) == Some(&"activate.R"))
            })
        })
        .collect()
}

/// The host's git in `dir` with no system or global configuration of the
/// user's (so what runs is what the repository holds), a test identity and
/// no terminal prompts.
fn git_command(dir: &Path) -> Command {
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

fn host_git(dir: &Path, args: &[&str]) -> Output {
    git_command(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run git {args:?}: {e}"))
}

fn host_git_ok(dir: &Path, args: &[&str]) -> String {
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
fn host_git_on_a_terminal(dir: &Path, args: &[&str]) -> std::process::ExitStatus {
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

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir -p");
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A directory holding the workspace `ws` and, beside it, what the sandbox
/// must not reach (markers, a home).
struct Place {
    root: tempfile::TempDir,
    ws: PathBuf,
}

impl Place {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("a temporary directory");
        let ws = root.path().join("ws");
        std::fs::create_dir(&ws).expect("mkdir ws");
        let ws = ws.canonicalize().expect("canonical ws");
        Place { root, ws }
    }

    fn beside(&self, name: &str) -> PathBuf {
        let p = self.root.path().join(name);
        std::fs::create_dir_all(&p).expect("mkdir");
        p.canonicalize().expect("canonical")
    }
}

/// A user's project with every built-in place in it, made on the host: a
/// git repository with a commit (hooks, config, index, objects), a nested
/// repository `sub`, agent clients' and editors' settings, R's start-up
/// files, a venv's site-packages, Mercurial, hook managers.
fn existing_project(ws: &Path) {
    write(&ws.join("README.md"), "# project\n");
    write(&ws.join("src/main.py"), "print('hi')\n");
    host_git_ok(ws, &["init", "-q"]);
    host_git_ok(ws, &["add", "README.md", "src/main.py"]);
    host_git_ok(ws, &["commit", "-q", "-m", "first"]);
    std::fs::create_dir_all(ws.join("sub")).expect("mkdir sub");
    host_git_ok(&ws.join("sub"), &["init", "-q"]);
    let files: &[(&str, &str)] = &[
        (
            ".gitmodules",
            "[submodule \"lib\"]\n\tpath = lib\n\turl = ../lib\n",
        ),
        (
            ".pre-commit-config.yaml",
            "repos:\n  - repo: local\n    hooks: []\n",
        ),
        (".husky/pre-commit", "npm test\n"),
        (
            ".mcp.json",
            "{\"mcpServers\": {\"mine\": {\"command\": \"my-server\"}}}\n",
        ),
        (".claude/settings.json", "{\"hooks\": {}}\n"),
        (".codex/config.toml", "model = \"o4\"\n"),
        (".gemini/settings.json", "{}\n"),
        (".cursor/mcp.json", "{\"mcpServers\": {}}\n"),
        (".vscode/settings.json", "{\"editor.tabSize\": 4}\n"),
        (".idea/workspace.xml", "<project/>\n"),
        (".zed/settings.json", "{}\n"),
        (".agents/skills/review.md", "review carefully\n"),
        (".envrc", "export A=1\n"),
        (".Rprofile", "options(digits = 4)\n"),
        (".Renviron", "R_LIBS_USER=renv/library\n"),
        (".RData", "RDX3\n"),
        ("renv/activate.R", "local({ version <- '1.0' })\n"),
        (".venv/pyvenv.cfg", "home = /usr/bin\n"),
        (
            ".venv/lib/python3.11/site-packages/distutils-precedence.pth",
            "import os\n",
        ),
        (".hg/hgrc", "[ui]\nusername = u\n"),
        ("lib/deep/.envrc", "export B=2\n"),
    ];
    for (rel, text) in files {
        write(&ws.join(rel), text);
    }
    chmod(&ws.join(".husky/pre-commit"), 0o755);
    std::fs::create_dir_all(ws.join("scratch")).expect("mkdir scratch");
}

/// Existing protected files of `existing_project`.
const EXISTING_FILES: &[&str] = &[
    ".git/config",
    ".git/HEAD",
    ".git/index",
    ".git/info/exclude",
    ".git/hooks/pre-commit.sample",
    "sub/.git/config",
    ".gitmodules",
    ".pre-commit-config.yaml",
    ".husky/pre-commit",
    ".mcp.json",
    ".claude/settings.json",
    ".codex/config.toml",
    ".gemini/settings.json",
    ".cursor/mcp.json",
    ".vscode/settings.json",
    ".idea/workspace.xml",
    ".zed/settings.json",
    ".agents/skills/review.md",
    ".envrc",
    ".Rprofile",
    ".Renviron",
    ".RData",
    "renv/activate.R",
    ".venv/pyvenv.cfg",
    ".venv/lib/python3.11/site-packages/distutils-precedence.pth",
    ".hg/hgrc",
    "lib/deep/.envrc",
];
/// Existing protected directories of `existing_project`.
const EXISTING_DIRS: &[&str] = &[
    ".git",
    ".git/hooks",
    ".git/objects",
    ".git/refs/heads",
    "sub/.git",
    ".husky",
    ".claude",
    ".codex",
    ".gemini",
    ".cursor",
    ".vscode",
    ".idea",
    ".zed",
    ".agents",
    ".venv",
    ".venv/lib/python3.11/site-packages",
    ".hg",
];
/// Absent protected names (their directories exist or the cell makes them
/// first: `sub2`, `a/b`, `deep/x`, `renv`).
const ABSENT_NAMES: &[&str] = &[
    ".git",
    ".gitmodules",
    "HEAD",
    "sub2/HEAD",
    ".hg",
    ".pre-commit-config.yaml",
    ".husky",
    ".mcp.json",
    ".claude",
    ".codex",
    ".gemini",
    ".cursor",
    ".vscode",
    ".idea",
    ".zed",
    ".agents",
    ".envrc",
    ".Rprofile",
    ".Renviron",
    ".RData",
    "renv/activate.R",
    ".venv",
    "sub2/.git",
    "a/b/.claude",
    "deep/x/.venv",
    "src/.vscode",
];

/// A server on `ws` with every tool group, room for long outputs, and
/// `args`.
async fn serve(ws: &Path, args: &[&str]) -> StdioServer {
    StdioServer::launch(launch(ws, args)).await
}

fn launch(ws: &Path, args: &[&str]) -> Launch {
    let mut all = vec![
        "--workdir",
        path_str(ws),
        "--tools",
        "all",
        "--output-head-bytes",
        "400000",
    ];
    all.extend_from_slice(args);
    Launch::new(&all).without_workdir_flag()
}

/// A shell job (`pty`: on a terminal) that must exit within its window.
async fn shell(server: &StdioServer, command: &str, pty: bool) -> ToolOutput {
    let out = server
        .call(
            "shell_exec",
            json!({ "command": command, "wait_s": 50, "pty": pty }),
        )
        .await;
    assert_eq!(
        out.structured["status"], "exited",
        "the job should have exited: {out:#?}"
    );
    assert_eq!(out.structured["pty"], pty, "on a terminal or not: {out:#?}");
    out
}

/// A /bin/sh script running each `(label, command)` in a subshell and
/// printing `label: rc=N`; `$S` is a scratch directory of its own.
fn shell_script(scratch: &str, attempts: &[(&str, String)]) -> String {
    let mut script = format!("S={}; mkdir -p \"$S\"\n", sh_quote(scratch));
    for (label, command) in attempts {
        script.push_str(&format!(
            "( {command} ) </dev/null >/dev/null; echo \"{label}: rc=$?\"\n"
        ));
    }
    script
}

/// Panics unless every attempt of a `shell_script` failed, and the job's
/// output names the protection and EROFS.
fn assert_shell_refused(out: &ToolOutput, attempts: &[(&str, String)], what: &str) {
    let got = outcomes(out);
    let wrong: Vec<String> = attempts
        .iter()
        .filter_map(
            |(label, command)| match got.get(*label).map(String::as_str) {
                Some(rc) if rc.starts_with("rc=") && rc != "rc=0" => None,
                other => Some(format!("{label} ({command}): {other:?}")),
            },
        )
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: these commands worked:\n  {}\nresult: {out:#?}",
        wrong.join("\n  ")
    );
    let text = format!("{}\n{}", out.str_field("stdout"), out.str_field("stderr"));
    assert!(
        text.contains(PROTECTED_LINE) && text.contains("Read-only file system"),
        "{what}: the output names neither the protection nor EROFS: {out:#?}"
    );
}

// ------------------------------------------------------------------ 1. cells

#[tokio::test]
async fn a_cell_changes_no_existing_place() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    let before = tree_outside_scratch(ws);
    let server = serve(ws, &[]).await;

    let out = cell(
        server.peer(),
        "default",
        &attack_cell("", EXISTING_FILES, EXISTING_DIRS, &[]),
    )
    .await;
    assert_all_refused(
        &out,
        &attack_labels(EXISTING_FILES, EXISTING_DIRS, &[]),
        ".git",
        "attacks on existing places",
    );

    // Ways to the same places: through a link to .git made in the cell, odd
    // spellings, the process's own /proc names, a nested repository, a
    // dangling link into .git/hooks.
    let named = r#"
os.symlink(os.path.abspath(".git"), "scratch/g")
attempt("through-dir-link", lambda: _write("scratch/g/config", "a"))
attempt("through-dir-link-hook", lambda: _write("scratch/g/hooks/pre-commit"))
attempt("dotdot", lambda: _write("src/../.git/config", "a"))
attempt("slashes", lambda: _write(".//.git///config", "a"))
attempt("absolute", lambda: _write(os.path.abspath(".git/config"), "a"))
attempt("proc-self-cwd", lambda: _write("/proc/self/cwd/.git/config", "a"))
attempt("nested-hook", lambda: _write("sub/.git/hooks/pre-commit"))
os.symlink(os.path.abspath(".git/hooks/post-checkout"), "scratch/d")
attempt("dangling-hook", lambda: _write("scratch/d"))
os.symlink("d", "scratch/d2")
attempt("dangling-chain", lambda: _write("scratch/d2"))
attempt("swap-hooks", lambda: os.replace(_evil_dir() + "/hooks", ".git/hooks"))
attempt("swap-git", lambda: _exchange(_evil_dir(), ".git"))
attempt("git-over-file", lambda: os.replace(_decoy(), ".git"))
attempt("shutil-rmtree", lambda: __import__("shutil").rmtree(".claude"))
"#;
    let out = cell(server.peer(), "default", named).await;
    let labels: Vec<String> = [
        "through-dir-link",
        "through-dir-link-hook",
        "dotdot",
        "slashes",
        "absolute",
        "proc-self-cwd",
        "nested-hook",
        "dangling-hook",
        "dangling-chain",
        "swap-hooks",
        "swap-git",
        "git-over-file",
        "shutil-rmtree",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // (Each place's line was printed once by this process already.)
    assert_all_erofs(&out, &labels, "other ways to existing places");

    assert_same_tree(&before, &tree_outside_scratch(ws), "after the cells");
    assert!(
        !ws.join(".git/hooks/post-checkout").exists() && !ws.join(".git/hooks/pre-commit").exists(),
        "a hook was created"
    );
}

#[tokio::test]
async fn a_cell_creates_no_absent_place() {
    let place = Place::new();
    let ws = &place.ws;
    write(&ws.join("README.md"), "# no repository here\n");
    std::fs::create_dir_all(ws.join("src")).expect("mkdir src");
    let server = serve(ws, &[]).await;

    let setup = r#"
for d in ("sub2", "a/b", "deep/x", "renv", "scratch"):
    os.makedirs(d, exist_ok=True)
"#;
    let out = cell(
        server.peer(),
        "default",
        &attack_cell(setup, &[], &[], ABSENT_NAMES),
    )
    .await;
    assert_all_refused(
        &out,
        &attack_labels(&[], &[], ABSENT_NAMES),
        ".git",
        "creating absent places",
    );

    // A `.git` file pointing at a git directory the cell made, and a whole
    // repository made by git in the cell's temporary directory then moved in.
    let named = r#"
evil = _evil_dir()
attempt("git-file", lambda: open(".git", "w").write("gitdir: %s\n" % evil))
attempt("git-file-nested", lambda: open("sub2/.git", "w").write("gitdir: ../%s\n" % evil))
subprocess.run(["git", "init", "-q", os.path.join(os.environ["TMPDIR"], "repo")], check=True)
attempt("move-repo-in", lambda: os.rename(os.path.join(os.environ["TMPDIR"], "repo", ".git"), ".git"))
attempt("copytree-repo-in", lambda: __import__("shutil").copytree(os.path.join(os.environ["TMPDIR"], "repo"), "cloned"))
"#;
    let out = cell(server.peer(), "default", named).await;
    let got = outcomes(&out);
    for label in ["git-file", "git-file-nested"] {
        assert_eq!(
            got.get(label).and_then(|o| errno_of(o)),
            Some(EROFS),
            "{label}: {out:#?}"
        );
    }
    // Across file systems a rename fails anyway (EXDEV): what matters is
    // that it failed and nothing is left.
    for label in ["move-repo-in", "copytree-repo-in"] {
        let o = got.get(label).cloned().unwrap_or_default();
        assert!(
            !o.is_empty() && !o.starts_with("OK"),
            "{label} worked: {out:#?}"
        );
    }

    let left = protected_entries(ws);
    assert!(
        left.is_empty(),
        "protected places were created in the workspace: {left:?}"
    );
}

// ------------------------------------------------------------------ 1. shell jobs

/// Shell attacks on `existing_project`.
fn shell_attacks_on_existing() -> Vec<(&'static str, String)> {
    let py = job_python();
    let v: Vec<(&str, String)> = vec![
        ("redirect-config", "echo EVIL > .git/config".into()),
        (
            "append-hook",
            "echo EVIL >> .git/hooks/pre-commit.sample".into(),
        ),
        (
            "new-hook",
            "printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > .git/hooks/pre-commit".into(),
        ),
        ("touch-new-hook", "touch .git/hooks/post-checkout".into()),
        ("mv-away", "mv .git/config \"$S/stolen\"".into()),
        (
            "mv-over",
            "echo EVIL > \"$S/decoy\" && mv -f \"$S/decoy\" .git/config".into(),
        ),
        (
            "cp-over",
            "echo EVIL > \"$S/decoy2\" && cp \"$S/decoy2\" .git/config".into(),
        ),
        ("ln-s-hook", "ln -s /bin/true .git/hooks/pre-commit".into()),
        ("ln-hard-out", "ln .git/config \"$S/hard\"".into()),
        ("ln-sf-mcp", "ln -sf \"$S/decoy\" .mcp.json".into()),
        ("rm-mcp", "rm -f .mcp.json".into()),
        ("rm-rf-claude", "rm -rf .claude".into()),
        ("rm-rf-git", "rm -rf .git".into()),
        ("chmod-hook", "chmod +x .git/hooks/pre-commit.sample".into()),
        ("truncate", "truncate -s 0 .git/config".into()),
        ("sed-i", "sed -i s/bare/BARE/ .git/config".into()),
        (
            "tee-settings",
            "echo '{}' | tee .claude/settings.json".into(),
        ),
        ("mkdir-claude", "mkdir -p .claude/commands".into()),
        ("envrc", "echo 'touch /tmp/pwned' > .envrc".into()),
        ("rprofile", "echo 'system(\"id\")' >> .Rprofile".into()),
        ("renv", "echo EVIL > renv/activate.R".into()),
        (
            "pth",
            "echo 'import os' > .venv/lib/python3.11/site-packages/evil.pth".into(),
        ),
        ("mv-venv", "mv .venv \"$S/venv\"".into()),
        ("mv-git", "mv .git \"$S/git\"".into()),
        ("cd-git", "cd .git && echo EVIL > config".into()),
        (
            "via-link",
            "ln -s \"$PWD/.git\" \"$S/g\" && echo EVIL > \"$S/g/config\"".into(),
        ),
        ("mkfifo", "mkfifo .git/hooks/fifo".into()),
        ("git-init", "git init -q".into()),
        ("git-init-sub", "git init -q sub".into()),
        (
            "git-fsmonitor",
            "git config core.fsmonitor 'touch /tmp/pwned'".into(),
        ),
        ("git-hookspath", "git config core.hooksPath \"$S\"".into()),
        (
            "git-sub-fsmonitor",
            "git -C sub config core.fsmonitor 'touch /tmp/pwned'".into(),
        ),
        (
            "git-add",
            "echo y > \"$S/new\" && git add -f \"$S/new\"".into(),
        ),
        (
            "git-commit",
            "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m evil".into(),
        ),
        ("git-tag", "git tag evil".into()),
        (
            "python",
            format!("{py} -c \"open('.mcp.json', 'a').write('x')\""),
        ),
    ];
    v
}

#[tokio::test]
async fn shell_jobs_change_no_existing_place() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    let before = tree_outside_scratch(ws);
    let server = serve(ws, &[]).await;
    let attempts = shell_attacks_on_existing();

    for pty in [false, true] {
        let what = if pty {
            "a job on a terminal"
        } else {
            "a job on pipes"
        };
        let script = shell_script(if pty { "scratch/pty" } else { "scratch/pipes" }, &attempts);
        let out = shell(&server, &script, pty).await;
        assert_shell_refused(&out, &attempts, what);
        assert_same_tree(&before, &tree_outside_scratch(ws), what);
    }
}

#[tokio::test]
async fn shell_jobs_create_no_absent_place() {
    let place = Place::new();
    let ws = &place.ws;
    write(&ws.join("README.md"), "# no repository here\n");
    let server = serve(ws, &[]).await;
    let py = job_python();
    let attempts: Vec<(&str, String)> = vec![
        ("git-init", "git init -q".into()),
        ("git-init-sub", "mkdir -p sub && git init -q sub".into()),
        (
            "git-clone",
            "git init -q \"$TMPDIR/origin$$\" && git clone -q \"$TMPDIR/origin$$\" cloned".into(),
        ),
        ("mkdir-git", "mkdir .git".into()),
        ("git-file", "echo 'gitdir: scratch' > .git".into()),
        (
            "cp-r-git",
            "mkdir -p \"$S/g/hooks\" && cp -r \"$S/g\" .git".into(),
        ),
        (
            "mv-git",
            "mkdir -p \"$S/g2/hooks\" && mv \"$S/g2\" .git".into(),
        ),
        ("ln-git", "ln -s \"$PWD/$S\" .git".into()),
        ("mcp", "echo '{}' > .mcp.json".into()),
        ("claude", "mkdir -p .claude".into()),
        (
            "claude-deep",
            "mkdir -p a/.claude && echo '{}' > a/.claude/settings.json".into(),
        ),
        ("envrc-link", "ln -s \"$PWD/$S/decoy\" .envrc".into()),
        ("venv", format!("{py} -m venv --without-pip .venv")),
        ("rprofile", "echo x > .Rprofile".into()),
        ("renv", "mkdir -p renv && echo x > renv/activate.R".into()),
        ("vscode-deep", "mkdir -p deep/er/.vscode".into()),
        ("tee-codex", "mkdir -p q && echo x | tee q/.codex".into()),
    ];
    for pty in [false, true] {
        let what = if pty {
            "a job on a terminal"
        } else {
            "a job on pipes"
        };
        let script = shell_script(if pty { "scratch/pty" } else { "scratch/pipes" }, &attempts);
        let out = shell(&server, &script, pty).await;
        assert_shell_refused(&out, &attempts, what);
        let left = protected_entries(ws);
        assert!(
            left.is_empty(),
            "{what} created protected places: {left:?}\n{out:#?}"
        );
    }
}

// ------------------------------------------------------------------ 1. R

#[tokio::test]
async fn an_r_session_changes_and_creates_no_place() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    // Absent: a nested directory without .git, and no .envrc in it.
    std::fs::create_dir_all(ws.join("fresh")).expect("mkdir fresh");
    let before = tree_outside_scratch(ws);
    let server = serve(ws, &["--languages", "python,r"]).await;

    // Each attempt evaluates to TRUE only if it worked; warnings and errors
    // are printed as such.
    let attempts: &[(&str, &str)] = &[
        (
            "writeLines-rprofile",
            "{ writeLines('system(\"id\")', '.Rprofile'); TRUE }",
        ),
        (
            "cat-append-renviron",
            "{ cat('R_PROFILE_USER=x\\n', file = '.Renviron', append = TRUE); TRUE }",
        ),
        ("cat-renv", "{ cat('x', file = 'renv/activate.R'); TRUE }"),
        ("save-rdata", "{ x <- 1; save(x, file = '.RData'); TRUE }"),
        ("dir-create-git", "dir.create('fresh/.git')"),
        ("dir-create-hooks", "dir.create('.git/hooks/new')"),
        ("file-create-mcp", "file.create('.mcp.json')"),
        ("file-create-envrc", "file.create('fresh/.envrc')"),
        ("file-rename-git", "file.rename('.git', 'scratch/git')"),
        (
            "file-rename-over",
            "{ writeLines('x', 'scratch/decoy'); file.rename('scratch/decoy', '.git/config') }",
        ),
        (
            "file-copy-over",
            "{ writeLines('x', 'scratch/decoy2'); file.copy('scratch/decoy2', '.git/config', overwrite = TRUE) }",
        ),
        (
            "unlink-claude",
            "unlink('.claude', recursive = TRUE) == 0 && !dir.exists('.claude')",
        ),
        ("file-remove-mcp", "file.remove('.mcp.json')"),
        (
            "chmod-hook",
            "Sys.chmod('.git/hooks/pre-commit.sample', '777')",
        ),
        (
            "file-symlink-hook",
            "file.symlink('/bin/sh', '.git/hooks/pre-commit')",
        ),
        ("file-link-out", "file.link('.git/config', 'scratch/hard')"),
        ("system-config", "system('echo EVIL >> .git/config') == 0"),
        (
            "system2-git-config",
            "system2('git', c('config', 'core.fsmonitor', 'id')) == 0",
        ),
        (
            "pth",
            "{ writeLines('import os', '.venv/lib/python3.11/site-packages/evil.pth'); TRUE }",
        ),
    ];
    let mut code = String::from(
        "dir.create('scratch', showWarnings = FALSE)\n\
         attempt <- function(label, expr) {\n\
           r <- tryCatch(withCallingHandlers(isTRUE(all(expr)), warning = function(w) {\n\
             cat(label, ': WARN ', conditionMessage(w), '\\n', sep = ''); invokeRestart('muffleWarning')\n\
           }), error = function(e) { cat(label, ': ERR ', conditionMessage(e), '\\n', sep = ''); NA })\n\
           cat(label, ': VALUE ', r, '\\n', sep = '')\n\
         }\n",
    );
    for (label, expr) in attempts {
        code.push_str(&format!("attempt('{label}', {expr})\n"));
    }
    let out = r_cell(server.peer(), &code).await;
    let stdout = out.str_field("stdout");
    for (label, _) in attempts {
        let value = format!("{label}: VALUE ");
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(&value))
            .unwrap_or_else(|| panic!("no value for {label}: {out:#?}"));
        assert_ne!(line, "TRUE", "{label} worked in R: {out:#?}");
    }
    let text = format!("{stdout}\n{}", out.str_field("stderr"));
    assert!(
        text.contains("Read-only file system"),
        "R's messages do not name EROFS: {out:#?}"
    );
    // R sessions keep their library in the workspace (`.ferrepl/r-library`).
    let after: Tree = tree_outside_scratch(ws)
        .into_iter()
        .filter(|(k, _)| k != ".ferrepl" && !k.starts_with(".ferrepl/"))
        .collect();
    assert_same_tree(&before, &after, "after the R cell");

    assert!(
        protected_entries(&ws.join("fresh")).is_empty(),
        "R created a protected place in fresh/"
    );
}

// ------------------------------------------------------------------ 2. host git

/// Hooks a planted hook would be: each writes a marker named after itself.
const HOOKS: &[&str] = &[
    "pre-commit",
    "commit-msg",
    "post-commit",
    "post-index-change",
];

/// What host git runs from a repository's config: `(key, marker, what the
/// command does after writing its marker)` (a pager and a clean filter
/// pass their input on).
const CONFIG_COMMANDS: &[(&str, &str, &str)] = &[
    ("core.fsmonitor", "fsmonitor", "false"),
    ("core.pager", "pager", "cat"),
    ("core.sshCommand", "ssh", "false"),
    ("filter.evil.clean", "filter", "cat"),
];

fn marker_command(markers: &Path, name: &str, then: &str) -> String {
    format!("touch {}; {then}", sh_quote(path_str(&markers.join(name))))
}

fn hook_text(markers: &Path, name: &str) -> String {
    format!(
        "#!/bin/sh\ntouch {}\n",
        sh_quote(path_str(&markers.join(name)))
    )
}

/// The names in `markers`: what host git ran.
fn markers_in(markers: &Path) -> BTreeSet<String> {
    std::fs::read_dir(markers)
        .expect("list the markers")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// What a user does next in the workspace with the host's git: status,
/// log (on a terminal, so a pager runs, and with `-c core.pager=cat`), add,
/// commit, and a fetch over ssh (to nowhere). The names in `markers`
/// afterwards: what git ran.
fn host_git_session(repo: &Path, markers: &Path) -> BTreeSet<String> {
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
const PLANT_PY: &str = r#"
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

// ------------------------------------------------------------------ 3. install

/// `ferrepl install --client claude-code,codex --scope project` for `ws`,
/// with a home of its own. install refuses to name a binary in a temporary
/// directory (scripts/escape-unprivileged.sh runs a copy in /tmp): then a
/// copy outside one is installed instead.
fn project_install(ws: &Path, home: &Path) {
    let run = |binary: &Path| {
        let mut tries = 0;
        loop {
            let out = Command::new(binary)
                .args([
                    "install",
                    "--client",
                    "claude-code,codex",
                    "--scope",
                    "project",
                ])
                .arg("--workdir")
                .arg(ws)
                .env("HOME", home)
                .env_remove("XDG_CONFIG_HOME")
                .env_remove("CODEX_HOME")
                .env_remove("UV")
                .current_dir(home)
                .output();
            match out {
                // Just written (the copy): another test thread may hold it
                // open for a moment.
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other.expect("run ferrepl install"),
            }
        }
    };
    let said = |out: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let mut out = run(server_binary());
    let _copy;
    if !out.status.success() && said(&out).contains("in the temporary directory") {
        let dir = crate::support::visible_outside_dir();
        let copy = dir.path().join("ferrepl");
        std::fs::hard_link(server_binary(), &copy)
            .or_else(|_| std::fs::copy(server_binary(), &copy).map(drop))
            .expect("copy ferrepl outside the temporary directory");
        out = run(&copy);
        _copy = dir;
    }
    assert!(
        out.status.success(),
        "ferrepl install failed: {}",
        said(&out)
    );
}

#[tokio::test]
async fn a_project_install_stays_byte_for_byte() {
    let place = Place::new();
    let ws = &place.ws;
    let home = place.beside("home");
    project_install(ws, &home);
    let files = [".mcp.json", ".codex/config.toml"];
    for f in files {
        let text = std::fs::read_to_string(ws.join(f)).unwrap_or_default();
        assert!(
            text.contains("--workdir") && text.contains(path_str(ws)),
            "install wrote no entry for this workspace in {f}: {text}"
        );
    }
    let before = tree(ws);
    let server = serve(ws, &[]).await;

    // A cell that rewrites the entries the way a program would: parsed,
    // changed and written back (in place, or atomically through a temporary
    // file), besides every attack on the files and on .codex.
    let rewrite = r#"
def _edit_json():
    cfg = json.load(open(".mcp.json"))
    cfg["mcpServers"]["ferrepl"]["command"] = "/bin/sh"
    with open(".mcp.json", "w") as f:
        json.dump(cfg, f)
def _edit_json_atomically():
    cfg = json.load(open(".mcp.json"))
    cfg["mcpServers"]["evil"] = {"command": "/bin/sh", "args": ["-c", "id"]}
    tmp = _scratch("mcp")
    with open(tmp, "w") as f:
        json.dump(cfg, f)
    os.replace(tmp, ".mcp.json")
def _edit_toml():
    text = open(".codex/config.toml").read().replace("ferrepl", "evil")
    with open(".codex/config.toml", "w") as f:
        f.write(text)
attempt("edit-json", _edit_json)
attempt("edit-json-atomically", _edit_json_atomically)
attempt("edit-toml", _edit_toml)
"#;
    let out = cell(
        server.peer(),
        "default",
        &attack_cell(rewrite, &files, &[".codex"], &[]),
    )
    .await;
    let mut labels = attack_labels(&files, &[".codex"], &[]);
    labels.extend(
        ["edit-json", "edit-json-atomically", "edit-toml"]
            .iter()
            .map(|s| s.to_string()),
    );
    assert_all_refused(
        &out,
        &labels,
        ".mcp.json",
        "rewriting the installed entries",
    );

    let py = job_python();
    let attempts: Vec<(&str, String)> = vec![
        ("sed-i-mcp", "sed -i s/ferrepl/evil/ .mcp.json".into()),
        (
            "sed-i-codex",
            "sed -i s/ferrepl/evil/ .codex/config.toml".into(),
        ),
        ("cat-over", "echo '{}' > .mcp.json".into()),
        (
            "python-rewrite",
            format!(
                "{py} -c \"import json; c = json.load(open('.mcp.json')); json.dump(c, open('.mcp.json', 'w'))\""
            ),
        ),
        ("mv-codex", "mv .codex \"$S/codex\"".into()),
    ];
    for pty in [false, true] {
        let script = shell_script(if pty { "scratch/pty" } else { "scratch/pipes" }, &attempts);
        let out = shell(&server, &script, pty).await;
        assert_shell_refused(&out, &attempts, "rewriting the entries in a job");
    }

    let after = tree(ws);
    for f in files {
        assert_eq!(
            before.get(f),
            after.get(f),
            "{f} changed (byte for byte or its mode)"
        );
    }
    assert_eq!(before.get(".codex"), after.get(".codex"), ".codex changed");
}

// ------------------------------------------------------------------ 4. SIGKILL

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

// ------------------------------------------------------------------ 5. controls

#[tokio::test]
async fn ordinary_paths_stay_free() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    let server = serve(ws, &[]).await;

    // Every attack of the suite on fresh ordinary paths, and on names that
    // only look like protected ones: each works.
    let controls = r#"
_fresh = itertools.count()
def _fresh_file():
    p = "ctl/f%d" % next(_fresh)
    _write(p)
    return p
def _fresh_dir():
    p = "ctl/d%d" % next(_fresh)
    os.makedirs(p)
    return p
def _fresh_name():
    return "ctl/n%d" % next(_fresh)
os.makedirs("ctl")
for name, fn in FILE_ATTACKS.items():
    p = _fresh_file()
    attempt("file %s" % name, lambda: fn(p))
for name, fn in DIR_ATTACKS.items():
    d = _fresh_dir()
    attempt("dir %s" % name, lambda: fn(d))
for name, fn in CREATE_ATTACKS.items():
    p = _fresh_name()
    attempt("create %s" % name, lambda: fn(p))
LOOKALIKES = [".gitignore", ".gitattributes", "git", ".git-blame-ignore-revs", ".github/workflows/ci.yml",
              "renv/library/x/DESCRIPTION", "activate.R", "renv.lock", "venv/lib/x.pth", ".venv2/x",
              ".mcp.json.bak", "mcp.json", ".claude-notes", "claude/settings.json", ".envrc.example",
              "Rprofile", "sub/.gitignore", "notes/.git-stuff", "x.git/config"]
for p in LOOKALIKES:
    attempt("lookalike %s" % p, lambda: (os.makedirs(os.path.dirname(p) or ".", exist_ok=True), _write(p)))
attempt("tmp .git", lambda: (os.makedirs(os.path.join(os.environ["TMPDIR"], ".git", "hooks")),
                             _write(os.path.join(os.environ["TMPDIR"], ".git", "hooks", "pre-commit")),
                             _write(os.path.join(os.environ["TMPDIR"], ".mcp.json"))))
attempt("exchange ordinary", lambda: _exchange(_fresh_dir(), _fresh_dir()))
"#;
    let out = cell(
        server.peer(),
        "default",
        &format!("{ATTEMPT}\n{ATTACKS_PY}\n{controls}"),
    )
    .await;
    let got = outcomes(&out);
    let mut labels: Vec<String> = Vec::new();
    labels.extend(FILE_ATTACKS.iter().map(|a| format!("file {a}")));
    labels.extend(DIR_ATTACKS.iter().map(|a| format!("dir {a}")));
    labels.extend(CREATE_ATTACKS.iter().map(|a| format!("create {a}")));
    labels.push("tmp .git".into());
    labels.push("exchange ordinary".into());
    let lookalikes = [
        ".gitignore",
        ".gitattributes",
        "git",
        ".git-blame-ignore-revs",
        ".github/workflows/ci.yml",
        "renv/library/x/DESCRIPTION",
        "activate.R",
        "renv.lock",
        "venv/lib/x.pth",
        ".venv2/x",
        ".mcp.json.bak",
        "mcp.json",
        ".claude-notes",
        "claude/settings.json",
        ".envrc.example",
        "Rprofile",
        "sub/.gitignore",
        "notes/.git-stuff",
        "x.git/config",
    ];
    labels.extend(lookalikes.iter().map(|p| format!("lookalike {p}")));
    let failed: Vec<String> = labels
        .iter()
        .filter(|l| !got.get(*l).is_some_and(|o| o.starts_with("OK")))
        .map(|l| format!("{l}: {:?}", got.get(l)))
        .collect();
    assert!(
        failed.is_empty(),
        "ordinary paths were refused:\n  {}\n{out:#?}",
        failed.join("\n  ")
    );
    assert!(
        !format!("{}{}", out.str_field("stdout"), out.str_field("stderr")).contains(PROTECTED_LINE),
        "a refusal line for ordinary paths: {out:#?}"
    );
    for p in lookalikes {
        assert_eq!(
            std::fs::read_to_string(ws.join(p)).ok().as_deref(),
            Some("EVIL\n"),
            "{p} is not on the host"
        );
    }

    // git reads, in jobs on pipes and on a terminal; git in the job's own
    // temporary directory does everything.
    let attempts: Vec<(&str, String)> = vec![
        ("status", "git status".into()),
        ("log", "git log --oneline".into()),
        ("diff", "echo more >> README.md && git diff --stat".into()),
        ("show", "git show --stat HEAD".into()),
        ("rev-parse", "git rev-parse --show-toplevel".into()),
        ("sub-status", "git -C sub status".into()),
        (
            "tmp-repo",
            "cd \"$TMPDIR\" && git init -q t$$ && cd t$$ && echo x > f && git add f && \
             git -c user.name=t -c user.email=t@t commit -q -m x && git config core.fsmonitor false"
                .into(),
        ),
        ("gitignore", "echo '*.log' >> .gitignore".into()),
    ];
    for pty in [false, true] {
        let mut script = String::new();
        for (label, command) in &attempts {
            script.push_str(&format!(
                "( {command} ) </dev/null >/dev/null; echo \"{label}: rc=$?\"\n"
            ));
        }
        let out = shell(&server, &script, pty).await;
        let got = outcomes(&out);
        for (label, command) in &attempts {
            assert_eq!(
                got.get(*label).map(String::as_str),
                Some("rc=0"),
                "{command} (pty {pty}) failed: {out:#?}"
            );
        }
    }
}

#[tokio::test]
async fn allow_write_protected_git_frees_git_and_only_git() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    let server = serve(ws, &["--allow-write-protected", ".git"]).await;

    let out = cell(
        server.peer(),
        "default",
        &format!(
            "{ATTEMPT}\n\
             attempt('config', lambda: open('.git/config', 'a').write('[ferrepl]\\n\\ttest = 1\\n'))\n\
             attempt('nested', lambda: os.makedirs('fresh/.git/hooks'))\n\
             attempt('mcp', lambda: open('.mcp.json', 'a'))\n\
             attempt('claude', lambda: open('.claude/settings.json', 'w'))\n\
             attempt('envrc', lambda: open('.envrc', 'a'))\n"
        ),
    )
    .await;
    let got = outcomes(&out);
    for free in ["config", "nested"] {
        assert!(
            got.get(free).is_some_and(|o| o.starts_with("OK")),
            "{free} should work with .git freed: {out:#?}"
        );
    }
    for kept in ["mcp", "claude", "envrc"] {
        assert_eq!(
            got.get(kept).and_then(|o| errno_of(o)),
            Some(EROFS),
            "{kept} is still protected: {out:#?}"
        );
    }
    assert_names_protection(&out, ".mcp.json", "freeing .git only");
    assert_eq!(
        host_git_ok(ws, &["config", "--get", "ferrepl.test"]).trim(),
        "1",
        "the cell's config line is not on the host"
    );

    let out = job(
        server.peer(),
        "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m 'by the agent' && git log --format=%s -1",
    )
    .await;
    assert_eq!(
        out.structured["exit_code"], 0,
        "git commit in a job: {out:#?}"
    );
    let log = host_git_ok(ws, &["log", "--format=%s", "-1"]);
    assert_eq!(
        log.trim(),
        "by the agent",
        "the host does not see the commit"
    );
}

#[tokio::test]
async fn protect_adds_a_name_at_any_depth() {
    let place = Place::new();
    let ws = &place.ws;
    write(&ws.join("lib/Makefile"), "all:\n\ttrue\n");
    let before = tree(ws);
    let server = serve(ws, &["--protect", "Makefile"]).await;
    let out = cell(
        server.peer(),
        "default",
        &format!(
            "{ATTEMPT}\n\
             attempt('top', lambda: open('Makefile', 'w'))\n\
             attempt('deep', lambda: (os.makedirs('a/b', exist_ok=True), open('a/b/Makefile', 'w')))\n\
             attempt('existing', lambda: open('lib/Makefile', 'a'))\n\
             attempt('rename-in', lambda: (open('m.tmp', 'w').close(), os.rename('m.tmp', 'lib/Makefile')))\n\
             attempt('remove', lambda: os.remove('lib/Makefile'))\n\
             attempt('am', lambda: open('Makefile.am', 'w'))\n\
             attempt('gnu', lambda: open('GNUmakefile', 'w'))\n\
             attempt('git', lambda: os.mkdir('.git'))\n"
        ),
    )
    .await;
    let got = outcomes(&out);
    for refused in ["top", "deep", "existing", "rename-in", "remove", "git"] {
        assert_eq!(
            got.get(refused).and_then(|o| errno_of(o)),
            Some(EROFS),
            "{refused}: {out:#?}"
        );
    }
    for free in ["am", "gnu"] {
        assert!(
            got.get(free).is_some_and(|o| o.starts_with("OK")),
            "{free} should work: {out:#?}"
        );
    }
    assert_names_protection(&out, "Makefile", "--protect Makefile");
    assert!(
        !ws.join("Makefile").exists() && !ws.join("a/b/Makefile").exists(),
        "a protected Makefile was created"
    );
    assert_eq!(
        before.get("lib/Makefile"),
        tree(ws).get("lib/Makefile"),
        "lib/Makefile changed"
    );
}

#[tokio::test]
async fn two_servers_share_a_workspace() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    let git_before = tree(&ws.join(".git"));
    let first = serve(ws, &[]).await;
    let second = serve(ws, &[]).await;

    let attempts = |who: &str| {
        format!(
            "{ATTEMPT}\n\
             attempt('own', lambda: open('from-{who}.txt', 'w').write('{who}'))\n\
             attempt('config', lambda: open('.git/config', 'a'))\n\
             attempt('hook', lambda: open('.git/hooks/pre-commit', 'w'))\n\
             attempt('mcp', lambda: open('.mcp.json', 'w'))\n"
        )
    };
    for (server, who) in [
        (&first, "first"),
        (&second, "second"),
        (&first, "first-again"),
    ] {
        let out = cell(server.peer(), "default", &attempts(who)).await;
        let got = outcomes(&out);
        assert!(
            got.get("own").is_some_and(|o| o.starts_with("OK")),
            "{who}: {out:#?}"
        );
        for refused in ["config", "hook", "mcp"] {
            assert_eq!(
                got.get(refused).and_then(|o| errno_of(o)),
                Some(EROFS),
                "{who} {refused}: {out:#?}"
            );
        }
    }
    // Each sees what the other wrote.
    let out = job(
        second.peer(),
        "cat from-first.txt from-second.txt && echo x > .git/config",
    )
    .await;
    assert_eq!(out.str_field("stdout"), "firstsecond", "{out:#?}");
    assert_ne!(out.structured["exit_code"], 0, "{out:#?}");
    drop(first);
    let out = cell(second.peer(), "default", &attempts("second-alone")).await;
    assert_eq!(
        outcomes(&out).get("config").and_then(|o| errno_of(o)),
        Some(EROFS),
        "{out:#?}"
    );
    assert_same_tree(&git_before, &tree(&ws.join(".git")), "two servers");
}

// ------------------------------------------------------------------ 6. links

#[tokio::test]
async fn links_made_on_the_host_lead_to_no_place() {
    let place = Place::new();
    let ws = &place.ws;
    existing_project(ws);
    use std::os::unix::fs::symlink;
    symlink(".git", ws.join("g")).expect("g -> .git");
    symlink(".git/hooks/post-checkout", ws.join("d")).expect("d -> post-checkout");
    symlink(ws.join(".git/config"), ws.join("abs")).expect("abs -> /ws/.git/config");
    symlink("d", ws.join("d2")).expect("d2 -> d");
    symlink(".mcp.json", ws.join("m")).expect("m -> .mcp.json");
    let before = tree_outside_scratch(ws);
    let server = serve(ws, &[]).await;

    let out = cell(
        server.peer(),
        "default",
        &format!(
            "{ATTEMPT}\n{ATTACKS_PY}\n\
             attempt('g/config', lambda: _write('g/config', 'a'))\n\
             attempt('g/hooks/pre-commit', lambda: _write('g/hooks/pre-commit'))\n\
             attempt('g/hooks chmod', lambda: os.chmod('g/hooks/pre-commit.sample', 0o755))\n\
             attempt('g truncate', lambda: os.truncate('g/config', 0))\n\
             attempt('d', lambda: _write('d'))\n\
             attempt('d2', lambda: _write('d2'))\n\
             attempt('d excl', lambda: os.close(os.open('d', os.O_WRONLY | os.O_CREAT | os.O_EXCL)))\n\
             attempt('abs', lambda: _write('abs'))\n\
             attempt('m', lambda: _write('m'))\n\
             attempt('m chmod', lambda: os.chmod('m', 0o777))\n"
        ),
    )
    .await;
    let labels: Vec<String> = [
        "g/config",
        "g/hooks/pre-commit",
        "g/hooks chmod",
        "g truncate",
        "d",
        "d2",
        "abs",
        "m",
        "m chmod",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_all_refused(&out, &labels, ".git", "writes through the host's links");
    // O_EXCL on a dangling link fails whatever it points to; nothing made.
    assert!(!outcomes(&out)["d excl"].starts_with("OK"), "{out:#?}");

    let attempts: Vec<(&str, String)> = vec![
        ("d", "echo EVIL > d".into()),
        ("d2", "echo EVIL > d2".into()),
        ("g", "echo EVIL > g/config".into()),
        ("abs", "echo EVIL >> abs".into()),
    ];
    for pty in [false, true] {
        let out = shell(&server, &shell_script("scratch/j", &attempts), pty).await;
        assert_shell_refused(&out, &attempts, "writes through links in a job");
    }
    assert_same_tree(
        &before,
        &tree_outside_scratch(ws),
        "after writes through links",
    );
    assert!(
        std::fs::symlink_metadata(ws.join(".git/hooks/post-checkout")).is_err(),
        "post-checkout was created through the dangling link"
    );
}

// ------------------------------------------------------------------ the gitdir a .git file names

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

// ------------------------------------------------------------------ the supervisor

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

// ------------------------------------------------------------------ found open

/// `renv/activate.R` is a protected sequence of names: R runs it at start
/// through the project's `.Rprofile` (`source("renv/activate.R")`, as renv
/// writes it). A session must not get its own activate.R there by moving,
/// swapping or linking the directory `renv`, existing or not; host R run
/// in each project afterwards runs nothing of the session's.
#[tokio::test]
async fn renv_activate_r_cannot_be_swapped_in_through_its_directory() {
    let place = Place::new();
    let ws = &place.ws;
    let markers = place.beside("markers");
    // Four projects: two with renv/activate.R, two whose renv/ is not there
    // yet; all with renv's .Rprofile.
    for proj in ["a", "b", "c", "d"] {
        write(
            &ws.join(proj).join(".Rprofile"),
            "source(\"renv/activate.R\")\n",
        );
    }
    for proj in ["a", "b"] {
        write(&ws.join(proj).join("renv/activate.R"), "invisible(NULL)\n");
    }
    // The control: host R runs a project's activate.R (this one the user's).
    write(&ws.join("ctl/.Rprofile"), "source(\"renv/activate.R\")\n");
    write(
        &ws.join("ctl/renv/activate.R"),
        &format!("file.create({})\n", py(path_str(&markers.join("ctl")))),
    );
    std::fs::create_dir_all(ws.join("scratch")).expect("mkdir scratch");
    let before = tree_outside_scratch(ws);
    let server = serve(ws, &[]).await;
    let out = cell(
        server.peer(),
        "default",
        &format!(
            "{ATTEMPT}\n{ATTACKS_PY}\n\
             def _filled(proj):\n\
             \x20   d = _scratch('renv')\n\
             \x20   os.makedirs(d)\n\
             \x20   open(os.path.join(d, 'activate.R'), 'w').write('file.create(%r)\\n' % os.path.join({markers}, proj))\n\
             \x20   return d\n\
             attempt('exchange', lambda: _exchange(_filled('a'), 'a/renv'))\n\
             attempt('rename away', lambda: os.rename('b/renv', 'scratch/renv-old'))\n\
             attempt('rename in', lambda: os.rename(_filled('c'), 'c/renv'))\n\
             attempt('link', lambda: os.symlink(os.path.abspath(_filled('d')), 'd/renv'))\n",
            markers = py(path_str(&markers)),
        ),
    )
    .await;
    drop(server);
    let labels = ["exchange", "rename away", "rename in", "link"];
    let got = outcomes(&out);
    let through: Vec<String> = labels
        .iter()
        .filter(|l| got.get(**l).is_none_or(|o| o.starts_with("OK")))
        .map(|l| format!("{l}: {:?}", got.get(*l)))
        .collect();
    // What host R does in each project now.
    for proj in ["ctl", "a", "b", "c", "d"] {
        let r = Command::new("Rscript")
            .args(["-e", "invisible(0)"])
            .current_dir(ws.join(proj))
            .env("HOME", place.beside("r-home"))
            .env_remove("R_PROFILE_USER")
            .env_remove("R_ENVIRON_USER")
            .stdin(Stdio::null())
            .output()
            .expect("run Rscript on the host");
        let _ = r;
    }
    let mut ran = markers_in(&markers);
    assert!(
        ran.remove("ctl"),
        "the control: host R did not run ctl/renv/activate.R; the test would see nothing"
    );
    assert!(
        through.is_empty() && ran.is_empty(),
        "these got through: {through:?}; host R then ran the session's activate.R in {ran:?}\n{out:#?}"
    );
    assert_all_refused(
        &out,
        &labels.map(String::from),
        "renv/activate.R",
        "swapping renv in",
    );
    assert_same_tree(&before, &tree_outside_scratch(ws), "renv after the swaps");
}

/// A `--protect` path (`conf/run.sh`) may not be reached through a link a
/// session makes at its directory's name (moving a directory there is
/// refused already).
#[tokio::test]
async fn a_protected_path_cannot_be_reached_through_a_new_link() {
    let place = Place::new();
    let ws = &place.ws;
    std::fs::create_dir_all(ws.join("scratch")).expect("mkdir scratch");
    let server = serve(ws, &["--protect", "conf/run.sh"]).await;
    let out = cell(
        server.peer(),
        "default",
        &format!(
            "{ATTEMPT}\n{ATTACKS_PY}\n\
             os.makedirs('scratch/c')\n\
             _write('scratch/c/run.sh')\n\
             attempt('rename dir in', lambda: os.rename('scratch/c', 'conf'))\n\
             attempt('link dir', lambda: os.symlink(os.path.abspath('scratch/c'), 'conf'))\n"
        ),
    )
    .await;
    let reached = std::fs::read_to_string(ws.join("conf/run.sh")).ok();
    assert_eq!(
        reached,
        None,
        "conf/run.sh is the session's file on the host (conf -> {:?}): {out:#?}",
        std::fs::read_link(ws.join("conf")).ok()
    );
    let got = outcomes(&out);
    for label in ["rename dir in", "link dir"] {
        assert_eq!(
            got.get(label).and_then(|o| errno_of(o)),
            Some(EROFS),
            "{label}: {out:#?}"
        );
    }
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

/// Each refusal line names the flag that frees its place: a server started
/// with that flag starts, and lets the write through.
#[tokio::test]
async fn the_flag_a_refusal_names_frees_the_place() {
    let place = Place::new();
    let ws = &place.ws;
    write(&ws.join("README.md"), "# separate git dir\n");
    std::fs::create_dir_all(ws.join("store")).expect("mkdir store");
    host_git_ok(ws, &["init", "-q", "--separate-git-dir", "store/gd"]);
    write(&ws.join(".git"), "gitdir: store/gd\n");
    let cases: &[(&[&str], &str)] = &[
        (&[], "store/gd/config"),
        (&["--protect", "conf/run.sh"], "conf/run.sh"),
        (&["--protect", "Makefile"], "Makefile"),
    ];
    let code = |path: &str| {
        format!(
            "{ATTEMPT}\nattempt('w', lambda: (os.makedirs(os.path.dirname({p}) or '.', exist_ok=True), open({p}, 'a').close()))\n",
            p = py(path)
        )
    };
    let mut problems = Vec::new();
    for (flags, path) in cases {
        let server = serve(ws, flags).await;
        let out = cell(server.peer(), "default", &code(path)).await;
        assert_eq!(
            outcomes(&out).get("w").and_then(|o| errno_of(o)),
            Some(EROFS),
            "{path}: {out:#?}"
        );
        drop(server);
        let stderr = out.str_field("stderr");
        let flag = stderr
            .lines()
            .find_map(|l| {
                l.split_once("--allow-write-protected ")
                    .map(|(_, f)| f.trim())
            })
            .unwrap_or_else(|| panic!("{path}: no flag named in {out:#?}"))
            .to_string();
        let mut freed: Vec<&str> = flags.to_vec();
        freed.extend(["--allow-write-protected", &flag]);
        // Started (it logs its tenant) or refused (it exits), whichever
        // comes first.
        let mut spawned = launch(ws, &freed).spawn_stdio();
        let log = spawned.stderr.clone();
        let refused = tokio::select! {
            status = spawned.child.wait() => {
                log.wait_closed(EVENT_TIMEOUT).await;
                Some(format!("{status:?}: {}", log.tail(600)))
            }
            started = log.wait_contains("tenant started", START_TIMEOUT) => {
                assert!(started, "{path}: the server neither started nor exited: {}", log.tail(2000));
                None
            }
        };
        drop(spawned);
        if let Some(why) = refused {
            problems.push(format!(
                "{path}: the refusal names '--allow-write-protected {flag}', with which the server does not start ({why})"
            ));
            continue;
        }
        let server = serve(ws, &freed).await;
        let out = cell(server.peer(), "default", &code(path)).await;
        let got = outcomes(&out).get("w").cloned().unwrap_or_default();
        if !got.starts_with("OK") {
            problems.push(format!(
                "{path}: the refusal names '--allow-write-protected {flag}', with which the write is still refused ({got})"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
