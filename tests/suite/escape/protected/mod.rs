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
//! (`controls::ordinary_paths_stay_free`): a refusal is the protection's,
//! not a broken attack's.
//!
//! This module is the host's side of the harness (the places, a project
//! holding every existing one, the trees compared before and after, the
//! server); `attacks` is the sandbox's side (the attacks a cell or a shell
//! job runs and how their refusals read). The tests, by what they test:
//!
//! - `sessions`: a cell, a shell job and an R session change and create
//!   no place.
//! - `git`: the host's git runs nothing a session planted, the gitdir a
//!   `.git` file names and hooks under `core.hooksPath` are protected.
//! - `install`: the entries a project install writes stay byte for byte.
//! - `killed`: a SIGKILLed server or supervisor leaves nothing behind.
//! - `controls`: ordinary paths stay free; the flags that free a place
//!   (`--allow-write-protected`, the one a refusal names) and add one
//!   (`--protect`); two servers on one workspace.
//! - `links`: links made on the host, new links, and directories moved or
//!   linked in lead to no place.
//!
//! Some tests each show a way the protection was found to let through when
//! they were written (a directory holding a protected sequence of names or
//! a `--protect` path, moved or linked in; hooks under `core.hooksPath`; a
//! refusal naming a flag that does not free its place).

mod attacks;
mod controls;
mod git;
mod install;
mod killed;
mod links;
mod sessions;

use git::host_git_ok;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{Launch, StdioServer, chmod, path_str};

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
