//! What frees a place and what adds one: ordinary paths stay free (every
//! attack works there), `--allow-write-protected .git` frees `.git` alone,
//! the flag a refusal names frees its place, `--protect` adds a name at any
//! depth, and two servers share one workspace.

use crate::escape::view::{cell, job};
use crate::support::{ATTEMPT, START_TIMEOUT, errno_of, py};

use super::attacks::*;
use super::git::*;
use super::*;

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
