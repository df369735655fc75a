//! What a cell, a shell job (on pipes and on a terminal) and an R session
//! may do to the protected places: change no existing one, create no absent
//! one.

use crate::escape::view::{cell, r_cell};
use crate::support::{errno_of, job_python};

use super::attacks::*;
use super::*;

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
