//! The command `ferrepl install` writes into a client's configuration: one
//! that starts the same ferrepl for as long as the client keeps it, chosen
//! from where this binary runs.
//!
//! The decision, in order:
//!
//! 1. **uv's cache** (a `uvx ferrepl ...` run, or `uvx --from WHEEL`): the
//!    binary lives in a throwaway environment under a cache bucket
//!    (`archive-v0/…`, in a directory tagged `CACHEDIR.TAG`) that `uv cache
//!    clean` removes, so its path is not written. What uvx installed it from
//!    (the environment's `direct_url.json`, PEP 610) decides instead:
//!    - from the package index (no `direct_url.json`): `uvx ferrepl`;
//!    - from a wheel file (or a source tree): `uvx --from FILE ferrepl`, only
//!      when that file still exists outside a temporary or cache directory;
//!      otherwise install refuses, saying how to make it stay;
//!    - from a remote URL or a VCS: `uvx --from URL ferrepl`.
//!
//!    uvx is written by absolute path (beside `$UV`, which uv sets for what
//!    it runs, else found on PATH): GUI clients (Claude Desktop, VS Code
//!    started from a dock) do not get a login shell's PATH.
//! 2. **cargo's build output** (`target/debug`, `target/release`): the path is
//!    written, with a note: `cargo build` replaces it in place (the client
//!    gets the latest build) and `cargo clean` removes it.
//! 3. **a temporary or cache directory** otherwise: refused, since the entry
//!    would break once it is cleaned.
//! 4. anywhere else (a venv's `bin`, `uv tool install`, pipx, `cargo
//!    install`, a copy in `/usr/local/bin`): this binary's absolute path.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// How a client starts ferrepl, before the server arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub command: String,
    pub args: Vec<String>,
    /// Why this command, when it is not plainly this binary (for stderr).
    pub note: Option<String>,
}

/// What the decision looks at, from the process (`Context::current`) or a
/// test.
#[derive(Debug, Clone)]
pub struct Context {
    /// This binary, canonical.
    pub exe: PathBuf,
    /// Temporary directories, canonical.
    pub temp_dirs: Vec<PathBuf>,
    /// `$UV`: the uv that started this process, if one did.
    pub uv: Option<PathBuf>,
    /// `$PATH`.
    pub path: Option<OsString>,
}

impl Context {
    pub fn current() -> Result<Self, String> {
        let exe = std::env::current_exe()
            .and_then(|p| p.canonicalize())
            .map_err(|e| format!("cannot tell where this ferrepl is: {e}"))?;
        let mut temp_dirs = vec![std::env::temp_dir()];
        if cfg!(unix) {
            temp_dirs.extend(["/tmp", "/dev/shm"].map(PathBuf::from));
        }
        let mut temp_dirs: Vec<PathBuf> = temp_dirs
            .into_iter()
            .filter_map(|d| d.canonicalize().ok())
            .collect();
        temp_dirs.dedup();
        Ok(Context {
            exe,
            temp_dirs,
            uv: std::env::var_os("UV")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute()),
            path: std::env::var_os("PATH"),
        })
    }
}

/// The command for `cx` (see the module header), or why there is none.
pub fn decide(cx: &Context) -> Result<Launch, String> {
    let exe = &cx.exe;
    if let Some(env) = uv_cache_env(exe) {
        return from_uv_cache(cx, &env);
    }
    let shown = exe.display().to_string();
    if let Some(target) = cargo_target_dir(exe) {
        return Ok(Launch {
            command: shown,
            args: Vec::new(),
            note: Some(format!(
                "this ferrepl is cargo's build output in {}: `cargo build` replaces it in place and `cargo clean` removes it (then the client cannot start ferrepl); `cargo install --path .` installs a copy that stays",
                target.display()
            )),
        });
    }
    if let Some(why) = ephemeral(exe, &cx.temp_dirs) {
        return Err(format!(
            "this ferrepl runs from {shown}, {why}: a client could not start it once that is cleaned. Install it where it stays (`pip install WHEEL` in a venv, `uv tool install WHEEL`, `cargo install --path .`) and run that ferrepl's `install`"
        ));
    }
    Ok(Launch {
        command: shown,
        args: Vec::new(),
        note: None,
    })
}

/// What uvx installed the environment from.
#[derive(Debug, PartialEq)]
enum Source {
    Index,
    File(PathBuf),
    Url(String),
}

fn from_uv_cache(cx: &Context, env: &Path) -> Result<Launch, String> {
    let (uvx, mut args) = uvx_command(cx);
    let source = installed_from(env)?;
    let note = match &source {
        Source::Index => {
            args.push("ferrepl".into());
            "ferrepl runs from uv's cache, installed from the package index: clients start it with uvx".to_string()
        }
        Source::File(file) => {
            let refused = |why: &str| {
                Err(format!(
                    "this ferrepl runs from uv's cache, installed by uvx from {}, {why}: an entry `uvx --from {}` would stop working. Put the wheel where it stays and run `uvx --from /that/path/{} ferrepl install ...` again, or install it (`uv tool install WHEEL`, or `pip install WHEEL` in a venv) and run that ferrepl's `install`",
                    file.display(),
                    file.display(),
                    file.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                ))
            };
            let Ok(canonical) = file.canonicalize() else {
                return refused("which no longer exists");
            };
            if let Some(why) = ephemeral(&canonical, &cx.temp_dirs) {
                return refused(&why);
            }
            args.extend(["--from".into(), canonical.display().to_string()]);
            args.push("ferrepl".into());
            format!(
                "ferrepl runs from uv's cache, installed from {}: clients start it with uvx from that file (keep it there)",
                canonical.display()
            )
        }
        Source::Url(url) => {
            args.extend(["--from".into(), url.clone(), "ferrepl".into()]);
            format!(
                "ferrepl runs from uv's cache, installed from {url}: clients start it with uvx from there"
            )
        }
    };
    Ok(Launch {
        command: uvx,
        args,
        note: Some(note),
    })
}

/// uvx by absolute path: beside `$UV` (else `uv tool run`), else on PATH,
/// else the bare name.
fn uvx_command(cx: &Context) -> (String, Vec<String>) {
    let name = if cfg!(windows) { "uvx.exe" } else { "uvx" };
    if let Some(uv) = &cx.uv {
        let sibling = uv.with_file_name(name);
        if sibling.is_file() {
            return (sibling.display().to_string(), Vec::new());
        }
        if uv.is_file() {
            return (uv.display().to_string(), vec!["tool".into(), "run".into()]);
        }
    }
    let on_path = cx.path.as_ref().and_then(|path| {
        std::env::split_paths(path)
            .filter(|dir| dir.is_absolute())
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    match on_path {
        Some(p) => (p.display().to_string(), Vec::new()),
        None => ("uvx".into(), Vec::new()),
    }
}

/// The environment (the directory above `bin/`) when `exe` runs from one in
/// uv's cache: below a bucket named `NAME-vN` whose parent is tagged with
/// `CACHEDIR.TAG` (uv's cache root, wherever `UV_CACHE_DIR` puts it).
fn uv_cache_env(exe: &Path) -> Option<PathBuf> {
    let in_bucket = exe.ancestors().skip(1).any(|dir| {
        let bucket = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.rsplit_once("-v"))
            .is_some_and(|(name, n)| {
                !name.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
            });
        bucket
            && dir
                .parent()
                .is_some_and(|p| p.join("CACHEDIR.TAG").is_file())
    });
    if !in_bucket {
        return None;
    }
    exe.parent()?.parent().map(Path::to_path_buf)
}

/// PEP 610: a `direct_url.json` in ferrepl's `.dist-info` names the file,
/// directory, URL or repository it came from; none means an index.
fn installed_from(env: &Path) -> Result<Source, String> {
    let dist_info = site_packages(env)
        .into_iter()
        .filter_map(|sp| std::fs::read_dir(sp).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .map(str::to_ascii_lowercase)
                .is_some_and(|n| n.starts_with("ferrepl-") && n.ends_with(".dist-info"))
        })
        .ok_or_else(|| {
            format!(
                "this ferrepl runs from uv's cache ({}) and its package record was not found there, so what uvx installed it from is unknown; install it (`uv tool install ...`, or `pip install ...` in a venv) and run that ferrepl's `install`",
                env.display()
            )
        })?;
    let record = dist_info.join("direct_url.json");
    let text = match std::fs::read_to_string(&record) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Source::Index),
        Err(e) => return Err(format!("cannot read {}: {e}", record.display())),
    };
    let unreadable = |why: &str| format!("{}: {why}", record.display());
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| unreadable(&e.to_string()))?;
    let url = value
        .get("url")
        .and_then(|u| u.as_str())
        .ok_or_else(|| unreadable("no \"url\""))?;
    if let Some(vcs) = value.get("vcs_info") {
        let kind = vcs.get("vcs").and_then(|v| v.as_str()).unwrap_or("git");
        let at = vcs
            .get("commit_id")
            .and_then(|c| c.as_str())
            .map(|c| format!("@{c}"))
            .unwrap_or_default();
        return Ok(Source::Url(format!("{kind}+{url}{at}")));
    }
    match url::Url::parse(url) {
        Ok(parsed) if parsed.scheme() == "file" => parsed
            .to_file_path()
            .map(Source::File)
            .map_err(|()| unreadable("a file URL that is not a path here")),
        Ok(_) => Ok(Source::Url(url.to_string())),
        Err(e) => Err(unreadable(&e.to_string())),
    }
}

/// The environment's site-packages directories (POSIX and Windows layouts).
fn site_packages(env: &Path) -> Vec<PathBuf> {
    let mut out = vec![env.join("Lib").join("site-packages")];
    for lib in ["lib", "lib64"] {
        if let Ok(entries) = std::fs::read_dir(env.join(lib)) {
            out.extend(entries.flatten().map(|e| e.path().join("site-packages")));
        }
    }
    out.retain(|p| p.is_dir());
    out
}

/// cargo's target directory when `exe` is its build output,
/// `TARGET/PROFILE/ferrepl` or `TARGET/TRIPLE/PROFILE/ferrepl` (cargo leaves
/// `.rustc_info.json` or `CACHEDIR.TAG` at the top).
fn cargo_target_dir(exe: &Path) -> Option<PathBuf> {
    exe.ancestors()
        .skip(2)
        .take(2)
        .find(|dir| {
            dir.join(".rustc_info.json").is_file()
                || std::fs::read_to_string(dir.join("CACHEDIR.TAG"))
                    .is_ok_and(|t| t.contains("cargo"))
        })
        .map(Path::to_path_buf)
}

/// Why `path` (canonical) will not stay: inside a temporary directory, or
/// a cache (`.cache`, macOS's `Caches`, or a directory tagged
/// `CACHEDIR.TAG` by anything but cargo: a wheel in `target/wheels` stays
/// until `cargo clean`, like the build itself).
fn ephemeral(path: &Path, temp_dirs: &[PathBuf]) -> Option<String> {
    if let Some(dir) = temp_dirs.iter().find(|d| path.starts_with(d)) {
        return Some(format!("in the temporary directory {}", dir.display()));
    }
    path.ancestors()
        .skip(1)
        .find(|dir| {
            matches!(
                dir.file_name().and_then(|n| n.to_str()),
                Some(".cache" | "Caches")
            ) || std::fs::read_to_string(dir.join("CACHEDIR.TAG"))
                .is_ok_and(|t| !t.contains("cargo"))
        })
        .map(|dir| format!("in the cache directory {}", dir.display()))
}

#[cfg(test)]
mod tests;
