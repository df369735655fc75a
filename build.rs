//! Build script: records the git revision of a checkout for `ferrepl
//! --version` (`FERREPL_GIT_REV`, read with `option_env!` in
//! `src/setup/doctor.rs`), so a report or bug names the exact build.
//!
//! A packaged crate (crates.io, a vendored tarball) has no `.git`: nothing
//! is set and the version says so by omission. The revision is looked up
//! only in this crate's own checkout, never in a repository that merely
//! contains the crate (a vendored copy inside another project).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    // Without any rerun-if-changed line cargo would rerun this script on
    // every change to any file of the package.
    println!("cargo:rerun-if-changed=build.rs");
    let Some(root) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        return;
    };
    if !root.join(".git").exists() {
        return;
    }
    // A linked worktree has its own HEAD but shares the branches (refs) of
    // the main repository's directory.
    if let Some(dirs) = git(&root, &["rev-parse", "--git-dir", "--git-common-dir"]) {
        let mut dirs = dirs.lines().map(|d| root.join(d));
        if let Some(git_dir) = dirs.next() {
            let common = dirs.next().unwrap_or_else(|| git_dir.clone());
            watch_head(&git_dir, &common);
        }
    }
    if let Some(rev) = git(&root, &["rev-parse", "--short=8", "HEAD"]) {
        println!("cargo:rustc-env=FERREPL_GIT_REV={rev}");
    }
}

/// `git args` in `dir`: its trimmed output when it succeeds and says something.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// Rebuilds when HEAD moves: a checkout (HEAD itself) or a commit on the
/// current branch (the ref file HEAD points to, or packed-refs when the
/// branch has no loose ref file), refs being kept in `common`.
fn watch_head(git_dir: &Path, common: &Path) {
    let head = git_dir.join("HEAD");
    println!("cargo:rerun-if-changed={}", head.display());
    let Ok(text) = std::fs::read_to_string(&head) else {
        return;
    };
    let Some(reference) = text.trim().strip_prefix("ref: ") else {
        // A detached HEAD holds the commit itself.
        return;
    };
    let loose = common.join(reference);
    let packed = common.join("packed-refs");
    if loose.is_file() {
        println!("cargo:rerun-if-changed={}", loose.display());
    } else if packed.is_file() {
        println!("cargo:rerun-if-changed={}", packed.display());
    }
}
