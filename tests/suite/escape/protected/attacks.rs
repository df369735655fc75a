//! The sandbox's side of the protected-places harness: the attacks a cell
//! or a shell job runs on every place (create, write, rename over, remove,
//! link...), the outcomes they print and the assertions on them.

use std::collections::BTreeMap;

use serde_json::json;

use crate::support::{ATTEMPT, StdioServer, ToolOutput, errno_of, json_list, sh_quote};

use super::*;

/// Python attacks: each takes one path and raises unless it changed,
/// created, moved, removed or linked something there. `FILE_ATTACKS` are
/// run on existing files, `DIR_ATTACKS` on existing directories,
/// `CREATE_ATTACKS` on absent names (their directory exists). Helpers make
/// their decoys and replacements under `scratch/`.
pub(super) const ATTACKS_PY: &str = r##"
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

pub(super) const FILE_ATTACKS: &[&str] = &[
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
pub(super) const DIR_ATTACKS: &[&str] = &[
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
pub(super) const CREATE_ATTACKS: &[&str] = &[
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
pub(super) fn attack_cell(setup: &str, files: &[&str], dirs: &[&str], creates: &[&str]) -> String {
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
pub(super) fn outcomes(out: &ToolOutput) -> BTreeMap<String, String> {
    out.str_field("stdout")
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The labels of every attack `attack_cell` runs on these paths.
pub(super) fn attack_labels(files: &[&str], dirs: &[&str], creates: &[&str]) -> Vec<String> {
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
pub(super) fn assert_all_refused(out: &ToolOutput, labels: &[String], name: &str, what: &str) {
    assert_all_erofs(out, labels, what);
    assert_names_protection(out, name, what);
}

/// Panics unless every one of `labels` was refused with EROFS.
pub(super) fn assert_all_erofs(out: &ToolOutput, labels: &[String], what: &str) {
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
pub(super) fn assert_names_protection(out: &ToolOutput, name: &str, what: &str) {
    let text = format!("{}\n{}", out.str_field("stdout"), out.str_field("stderr"));
    assert!(
        text.contains(PROTECTED_LINE) && text.contains(&format!("--allow-write-protected {name}")),
        "{what}: the output does not name the protection of {name}: {out:#?}"
    );
}

/// A shell job (`pty`: on a terminal) that must exit within its window.
pub(super) async fn shell(server: &StdioServer, command: &str, pty: bool) -> ToolOutput {
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
pub(super) fn shell_script(scratch: &str, attempts: &[(&str, String)]) -> String {
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
pub(super) fn assert_shell_refused(out: &ToolOutput, attempts: &[(&str, String)], what: &str) {
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
