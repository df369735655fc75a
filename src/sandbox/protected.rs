//! Protected places: entries inside the places sessions share with the host
//! (the workspace, `--allow-write` paths) that a host program runs by itself
//! when the user works there: git's hooks and config, agent clients' and
//! editors' settings, R's start-up files, the user's venv. No sandboxed
//! process may create, change, rename, remove or link over one, existing or
//! not (the launcher's supervisor enforces it: `sandbox::supervisor`), and
//! no write the server makes for the agent (`file_write`, `file_delete`,
//! `python_export`, install targets) may touch one.
//!
//! One rule for every check: a path is protected when, below one of the
//! shared roots, one of its components is a protected name (or a protected
//! sequence of names such as `renv/activate.R`), or when it lies in a
//! protected absolute place. Paths are checked after resolution (a link
//! `g -> .git` is checked as `.git`); the callers resolve.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The built-in protected names, each with the host program that runs what
/// it holds (docs/security.md lists the same; a test keeps them equal).
pub const BUILT_IN: &[(&str, &str)] = &[
    (
        ".git",
        "git runs its hooks and its config's commands (core.fsmonitor, core.pager, core.sshCommand, filters) on commit, status, log, fetch; shell prompts run git status on every cd",
    ),
    (".gitmodules", "git reads submodule URLs and paths from it"),
    (
        "HEAD",
        "git takes a directory holding HEAD, objects/ and refs/ for a bare repository and runs its config's commands (core.pager, core.fsmonitor) when a user works in it",
    ),
    (".hg", "Mercurial runs the hooks in .hg/hgrc"),
    (
        ".pre-commit-config.yaml",
        "pre-commit, once installed as a git hook, runs its local hooks on commit",
    ),
    (".husky", "husky points git's hooks (core.hooksPath) here"),
    (
        ".mcp.json",
        "Claude Code starts the MCP servers it names (ferrepl install --scope project writes it)",
    ),
    (
        ".claude",
        "Claude Code runs the hooks and commands of its settings",
    ),
    (
        ".codex",
        "Codex starts the MCP servers of its config.toml (ferrepl install --scope project writes it)",
    ),
    (
        ".gemini",
        "Gemini CLI starts the MCP servers of its settings",
    ),
    (".cursor", "Cursor starts the MCP servers of its mcp.json"),
    (
        ".vscode",
        "VS Code runs tasks and starts the MCP servers of its settings",
    ),
    (".idea", "JetBrains IDEs run configured tools and tasks"),
    (
        ".zed",
        "Zed starts the language and context servers of its settings",
    ),
    (
        ".agents",
        "agent clients read their skills and instructions here",
    ),
    (".envrc", "direnv runs it on every cd"),
    (".Rprofile", "R runs it at start"),
    (
        ".Renviron",
        "R reads its variables at start (R_PROFILE_USER and others)",
    ),
    (".RData", "R loads it at start"),
    ("renv/activate.R", "R runs it at start through .Rprofile"),
    (
        ".venv",
        "the user's interpreter runs every .pth in its site-packages at start, and its bin/ scripts run as commands",
    ),
];

/// What the operator's flags make of the built-in list.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtectError {
    #[error(
        "--allow-write-protected {0}: not a protected name; the names are {names}, or 'all'",
        names = built_in_names().join(", ")
    )]
    UnknownName(String),
    #[error(
        "--protect {0}: give a name (protected at any depth), a path relative to the workspace, or an absolute path"
    )]
    BadPath(String),
}

fn built_in_names() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(n, _)| *n).collect()
}

/// The protected places of one server, fixed at start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Protected {
    /// The places shared with the host where names are protected at any
    /// depth (the workspace, `--allow-write` paths).
    pub roots: Vec<PathBuf>,
    /// Names and sequences of names (`renv/activate.R`) protected at any
    /// depth below a root.
    pub names: Vec<String>,
    /// Places protected with everything beneath them (absolute `--protect`
    /// paths, the directory a root's `.git` file points to).
    pub paths: Vec<PathBuf>,
    /// Relative `--protect` paths, at that place of the workspace (`roots[0]`).
    #[serde(default)]
    pub relative: Vec<PathBuf>,
    /// Places git uses for a root's repository under other names (a `.git`
    /// file's gitdir, `core.hooksPath`, included config): freed with `.git`.
    #[serde(default)]
    pub git: Vec<PathBuf>,
    /// The user's venv where it lies in a root under another name than
    /// `.venv` (`--venv env`): freed with `.venv`.
    #[serde(default)]
    pub venvs: Vec<PathBuf>,
    /// What one process writes besides the roots (its temporary directory,
    /// /dev/shm): set in its policy. A link from a root into one is refused.
    #[serde(default)]
    pub unshared: Vec<PathBuf>,
}

impl Protected {
    /// The built-in names plus `--protect` entries (a bare name at any
    /// depth, a relative path at that place of the workspace, an absolute
    /// path), minus `--allow-write-protected` names (`all` frees every
    /// built-in one). `roots[0]` is the workspace.
    pub fn new(
        roots: Vec<PathBuf>,
        protect: &[String],
        freed: &[String],
    ) -> Result<Self, ProtectError> {
        let builtin = built_in_names();
        for name in freed {
            if name != "all" && !builtin.contains(&name.as_str()) && !protect.contains(name) {
                return Err(ProtectError::UnknownName(name.clone()));
            }
        }
        let free_all = freed.iter().any(|n| n == "all");
        // An agent that may make repositories may make their HEAD.
        let free_git = free_all || freed.iter().any(|n| n == ".git");
        let mut names: Vec<String> = if free_all {
            Vec::new()
        } else {
            builtin
                .iter()
                .filter(|n| !freed.iter().any(|f| f == *n))
                .filter(|n| !(free_git && **n == "HEAD"))
                .map(|n| n.to_string())
                .collect()
        };
        let mut paths = Vec::new();
        let mut relative = Vec::new();
        // An entry both added and freed is freed: the operator said so last
        // in neither order, and freeing is the narrower reading of intent
        // for a name they chose to name twice.
        for entry in protect.iter().filter(|e| !freed.contains(e)) {
            let path = Path::new(entry);
            let normal = path
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::RootDir));
            if entry.is_empty() || !normal {
                return Err(ProtectError::BadPath(entry.clone()));
            }
            if path.is_absolute() {
                paths.push(path.to_path_buf());
                if let Ok(real) = path.canonicalize() {
                    paths.push(real);
                }
            } else if path.components().count() == 1 {
                names.push(entry.clone());
            } else {
                relative.push(path.to_path_buf());
            }
        }
        let mut protected = Protected {
            roots,
            names,
            paths,
            relative,
            git: Vec::new(),
            venvs: Vec::new(),
            unshared: Vec::new(),
        };
        if !free_git {
            protected.git = protected.git_places();
        }
        protected.names.sort();
        protected.names.dedup();
        protected.paths.sort();
        protected.paths.dedup();
        Ok(protected)
    }

    /// Nothing is protected (every entry freed).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
            && self.paths.is_empty()
            && self.relative.is_empty()
            && self.git.is_empty()
            && self.venvs.is_empty()
    }

    /// The same places for another workspace (a tenant's, inside the
    /// server's): relative entries and the `.git` file's directory follow it.
    pub fn with_workspace(&self, workspace: &Path) -> Protected {
        let mut out = self.clone();
        match out.roots.first_mut() {
            Some(first) => *first = workspace.to_path_buf(),
            None => out.roots.push(workspace.to_path_buf()),
        }
        if self.names.iter().any(|n| n == ".git") {
            out.git = out.git_places();
        }
        out
    }

    /// Places in a root that git uses for a root's repository without
    /// their being named `.git`: the directory a `.git` *file* points to
    /// (`gitdir: DIR`), and what the repository's config points git to
    /// (`core.hooksPath`, `include.path`, `includeIf.*.path`). The
    /// repository is the one git finds for the root: its own, or the
    /// nearest above it.
    fn git_places(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for root in &self.roots {
            let Some((top, gitdir)) = repository_of(root) else {
                continue;
            };
            out.push(gitdir.clone());
            out.extend(config_targets(&top, &gitdir));
        }
        out.retain(|p| self.in_root(p) && !self.roots.contains(p));
        out
    }

    /// The protected place `path` (absolute, resolved) is or lies in, if any:
    /// the place itself, for messages (`/ws/.git` for `/ws/.git/hooks/x`).
    pub fn find(&self, path: &Path) -> Option<PathBuf> {
        if let Some(p) = self
            .paths
            .iter()
            .chain(&self.git)
            .chain(&self.venvs)
            .find(|p| path.starts_with(p))
        {
            return Some(p.clone());
        }
        if let Some(workspace) = self.roots.first()
            && let Some(p) = self
                .relative
                .iter()
                .map(|r| workspace.join(r))
                .find(|p| path.starts_with(p))
        {
            return Some(p);
        }
        let root = self
            .roots
            .iter()
            .filter(|r| path.starts_with(r))
            .max_by_key(|r| r.as_os_str().len())?;
        let rel = path.strip_prefix(root).ok()?;
        let parts: Vec<&std::ffi::OsStr> = rel
            .components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s),
                _ => None,
            })
            .collect();
        // Case-blind: a case-folding directory (ext4's casefold, macOS)
        // makes `.GIT` the same entry as `.git`.
        let same =
            |p: &std::ffi::OsStr, s: &str| p.as_encoded_bytes().eq_ignore_ascii_case(s.as_bytes());
        // No allocation unless a name matches: every filtered call of a
        // session is checked here.
        for i in 0..parts.len() {
            for name in &self.names {
                let count = name.split('/').count();
                let matches = i + count <= parts.len()
                    && name.split('/').zip(&parts[i..]).all(|(s, p)| same(p, s));
                if matches {
                    let mut whole = root.clone();
                    whole.extend(&parts[..i + count]);
                    return Some(whole);
                }
            }
        }
        None
    }

    /// Whether `path` holds a protected absolute place beneath it (renaming
    /// or removing it would move the place away, and a new one could be
    /// made in its stead).
    pub fn holds(&self, path: &Path) -> Option<PathBuf> {
        let workspace = self.roots.first();
        self.paths
            .iter()
            .chain(&self.git)
            .chain(&self.venvs)
            .cloned()
            .chain(
                self.relative
                    .iter()
                    .filter_map(|r| workspace.map(|w| w.join(r))),
            )
            .find(|p| p.starts_with(path) && p.as_path() != path)
    }

    /// The protected place a change of `path` would touch: `path` lies in
    /// one, or (for renames and removals) holds one, or is the first part
    /// of a protected sequence (renaming a directory to or from `renv`
    /// would make or unmake `renv/activate.R` without writing it).
    pub fn touched(&self, path: &Path) -> Option<PathBuf> {
        self.find(path)
            .or_else(|| self.holds(path))
            .or_else(|| self.leads(path))
    }

    /// `path/rest` where `path` is named as the first part of a protected
    /// sequence `first/rest` and lies below a root.
    fn leads(&self, path: &Path) -> Option<PathBuf> {
        let name = path.file_name()?;
        if !self.in_root(path) || self.roots.iter().any(|r| r == path) {
            return None;
        }
        self.names.iter().find_map(|n| {
            let (first, rest) = n.split_once('/')?;
            name.as_encoded_bytes()
                .eq_ignore_ascii_case(first.as_bytes())
                .then(|| path.join(rest))
        })
    }

    /// Whether `path` lies in a shared root (where names are protected).
    pub fn in_root(&self, path: &Path) -> bool {
        self.roots.iter().any(|r| path.starts_with(r))
    }

    /// The name an operator frees a place with: the protected name in the
    /// place's last components, `.git` for what git's repository points to;
    /// None for the operator's own --protect paths.
    pub fn flag_name(&self, place: &Path) -> Option<String> {
        let lower = place.to_string_lossy().to_ascii_lowercase();
        if let Some(name) = self
            .names
            .iter()
            .find(|n| lower.ends_with(&format!("/{}", n.to_ascii_lowercase())))
        {
            return Some(name.clone());
        }
        if self.git.iter().any(|g| place.starts_with(g)) {
            return Some(".git".to_string());
        }
        if self.venvs.iter().any(|v| place.starts_with(v)) {
            return Some(".venv".to_string());
        }
        // The operator's own --protect entries, as they gave them.
        if let Some(workspace) = self.roots.first()
            && let Some(rel) = self.relative.iter().find(|r| workspace.join(r) == place)
        {
            return Some(rel.display().to_string());
        }
        self.paths
            .iter()
            .any(|p| p == place)
            .then(|| place.display().to_string())
    }

    /// What an agent reads when a write is refused.
    pub fn refusal(&self, place: &Path) -> String {
        let how = match self.flag_name(place) {
            Some(name) => format!("the operator can free it with --allow-write-protected {name}"),
            None => "the operator protected it with --protect".to_string(),
        };
        format!(
            "{} is protected: host programs run what it holds (see docs/security.md), so nothing in the sandbox may create, change, rename or remove it; {how}",
            place.display()
        )
    }
}

/// The repository git finds for `root` (the first `.git` at or above it):
/// its working tree's top and its git directory.
fn repository_of(root: &Path) -> Option<(PathBuf, PathBuf)> {
    for top in root.ancestors() {
        let dot_git = top.join(".git");
        let Ok(meta) = std::fs::symlink_metadata(&dot_git) else {
            continue;
        };
        if meta.is_dir() {
            return Some((top.to_path_buf(), dot_git));
        }
        if !meta.is_file() || meta.len() > 4096 {
            return None;
        }
        let text = std::fs::read_to_string(&dot_git).ok()?;
        let dir = text.lines().find_map(|l| l.strip_prefix("gitdir:"))?;
        let dir = super::paths::normalize(Path::new(dir.trim()), top);
        return Some((top.to_path_buf(), dir.canonicalize().unwrap_or(dir)));
    }
    None
}

/// The places a repository's config (and what it includes) sends git to.
fn config_targets(top: &Path, gitdir: &Path) -> Vec<PathBuf> {
    let mut files = vec![gitdir.join("config"), gitdir.join("config.worktree")];
    if let Ok(common) = std::fs::read_to_string(gitdir.join("commondir")) {
        files.push(super::paths::normalize(Path::new(common.trim()), gitdir).join("config"));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let resolve = |value: &str, base: &Path| -> Option<PathBuf> {
        let path = match value.strip_prefix("~/") {
            Some(rest) => home.as_ref()?.join(rest),
            None => super::paths::normalize(Path::new(value), base),
        };
        Some(path.canonicalize().unwrap_or(path))
    };
    let mut out = Vec::new();
    let mut read = std::collections::HashSet::new();
    while let Some(file) = files.pop() {
        if read.len() >= 16 || !read.insert(file.clone()) {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&file) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        if meta.len() > 1 << 20 {
            continue;
        }
        let base = file.parent().unwrap_or(gitdir).to_path_buf();
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim();
            if let Some(head) = line.strip_prefix('[') {
                let head = head.split(']').next().unwrap_or_default();
                section = head
                    .split(|c: char| c.is_whitespace() || c == '"')
                    .next()
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = config_value(value);
            let key = key.trim().to_ascii_lowercase();
            if section == "core" && key == "hookspath" {
                out.extend(resolve(&value, top));
            } else if (section == "include" || section == "includeif")
                && key == "path"
                && let Some(p) = resolve(&value, &base)
            {
                out.push(p.clone());
                files.push(p);
            }
        }
    }
    out
}

/// A git config value: quoted, or up to a comment.
fn config_value(raw: &str) -> String {
    let raw = raw.trim();
    if let Some(rest) = raw.strip_prefix('"') {
        return rest.split('"').next().unwrap_or_default().to_string();
    }
    raw.split([';', '#'])
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests;
