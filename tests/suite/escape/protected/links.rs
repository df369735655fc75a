//! Links and renames: links made on the host lead to no place, a new link
//! does not reach one, and `renv/activate.R` (a protected sequence of
//! names) cannot be swapped in by moving or linking its directory.

use std::process::{Command, Stdio};

use crate::escape::view::cell;
use crate::support::{ATTEMPT, errno_of, path_str, py};

use super::attacks::*;
use super::git::*;
use super::*;

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
