//! The files the server itself reads and writes are out of every sandbox's
//! view: the `--auth-token-file` tokens (one inside a bound directory such
//! as `/usr/local/etc` is refused at start: view_hidden.rs), the
//! `--state-dir` stores, and the
//! runtime state directory (other processes' homes, output logs, policies,
//! lock). Probed from a cell, a shell job, an install job (a `.pth` file in
//! the session's venv runs when the installer's interpreter starts), an R
//! session and an r_install job (a package's R code runs as it installs),
//! on an HTTP server with two tenants. Each process may see the way to its
//! own TMPDIR/HOME, never what lies beside it.

use std::path::{Path, PathBuf};

use rmcp::{Peer, RoleClient};
use serde_json::json;

use super::view::{Cleanup, cell, job, r_cell};
use crate::support::{
    HttpServer, Launch, ToolOutput, call, everything, job_python, path_str, py_path, unique,
};
use crate::support::{chmod, is_root, own_uid};

const ALICE: &str = "view-alice-token-0123456789abcdef";
const BOB: &str = "view-bob-token-0123456789abcdef01";
/// Entries of the runtime state directory probed, at most.
const MAX_TARGETS: usize = 400;

/// Python reporting, for each path of a targets file (one a line), what a
/// read gives: `T\t<i>\tDIR a/b`, `T\t<i>\tFILE <bytes>` or
/// `T\t<i>\tERR <type> errno=<n>`; plus `META\ttmpdir|home\t<path>`.
/// Nothing read is printed.
const FILES_PROBE: &str = r#"
import os, sys
def files_report(targets):
    lines = ["META\ttmpdir\t" + os.environ.get("TMPDIR", ""),
             "META\thome\t" + os.environ.get("HOME", "")]
    for i, p in enumerate(targets):
        try:
            if os.path.isdir(p):
                r = "DIR " + "/".join(sorted(os.listdir(p)))
            else:
                fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    r = "FILE %d" % len(os.read(fd, 1 << 20))
                finally:
                    os.close(fd)
        except BaseException as e:
            r = "ERR %s errno=%s" % (type(e).__name__, getattr(e, "errno", None))
        lines.append("T\t%d\t%s" % (i, r))
    return lines

if __name__ == "__main__":
    print("\n".join(files_report(open(sys.argv[1]).read().splitlines())))
"#;

/// The same from R.
fn r_files_probe(targets: &Path) -> String {
    format!(
        r#"local({{
  cat('META\ttmpdir\t', Sys.getenv('TMPDIR'), '\n', sep = '')
  cat('META\thome\t', Sys.getenv('HOME'), '\n', sep = '')
  ts <- readLines({targets})
  for (i in seq_along(ts)) {{
    p <- ts[[i]]
    r <- tryCatch({{
      if (isTRUE(file.info(p)$isdir)) {{
        paste0('DIR ', paste(sort(list.files(p, all.files = TRUE, no.. = TRUE)), collapse = '/'))
      }} else {{
        con <- file(p, 'rb')
        n <- tryCatch(length(readBin(con, 'raw', 1e7)), finally = close(con))
        paste0('FILE ', n)
      }}
    }}, error = function(e) paste0('ERR ', gsub('\n', ' ', conditionMessage(e))),
        warning = function(w) paste0('ERR ', gsub('\n', ' ', conditionMessage(w))))
    cat('T\t', i - 1, '\t', r, '\n', sep = '')
  }}
}})"#,
        targets = py_path(targets),
    )
}

/// A path the probes try, and whether it is a directory on the host.
struct Target {
    path: PathBuf,
    dir: bool,
}

/// The names directly under `dir` on the way to any of `own`.
fn ways_to(dir: &Path, own: &[PathBuf]) -> Vec<String> {
    own.iter()
        .filter_map(|a| a.strip_prefix(dir).ok())
        .filter_map(|rest| rest.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect()
}

/// What is wrong in one probe's report: a server file read, a directory of
/// the server listed beyond the way to the process's own TMPDIR/HOME (and
/// `extra_own`, paths the process is given on purpose).
fn problems(text: &str, targets: &[Target], extra_own: &[PathBuf]) -> Vec<String> {
    let mut own: Vec<PathBuf> = extra_own.to_vec();
    let mut results = std::collections::BTreeMap::new();
    for line in text.lines().map(|l| l.trim_end_matches('\r')) {
        let parts: Vec<&str> = line.splitn(3, '\t').collect();
        match parts[..] {
            ["META", _, value] if value.starts_with('/') => own.push(PathBuf::from(value)),
            ["T", i, value] => {
                if let Ok(i) = i.parse::<usize>() {
                    results.insert(i, value.to_string());
                }
            }
            _ => {}
        }
    }
    assert!(
        own.len() >= extra_own.len() + 2,
        "no TMPDIR/HOME in the report:\n{text}"
    );
    // Alice's own venv, kept for her workspace in the state dir, is hers
    // to read and write (bound alone into her view); bob's is not.
    own.extend(
        targets
            .iter()
            .map(|t| &t.path)
            .filter(|p| {
                p.parent().and_then(Path::file_name) == Some("venvs".as_ref())
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().ends_with("-alice"))
            })
            .cloned(),
    );
    let mut found = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let path = &target.path;
        if own.iter().any(|o| path.starts_with(o)) {
            continue;
        }
        let Some(got) = results.get(&i) else {
            found.push(format!("no result for {}", path.display()));
            continue;
        };
        if got.starts_with("ERR") {
            continue;
        }
        let allowed = ways_to(path, &own);
        let listed: Vec<&str> = got
            .strip_prefix("DIR")
            .map(|names| names.trim().split('/').filter(|n| !n.is_empty()).collect())
            .unwrap_or_default();
        let ok = target.dir
            && got.starts_with("DIR")
            && listed.iter().all(|n| allowed.iter().any(|a| a == n));
        if !ok {
            found.push(format!(
                "{} gave '{got}' (only an error{}, is acceptable)",
                path.display(),
                if allowed.is_empty() {
                    " or an empty listing".to_string()
                } else {
                    format!(" or a listing within {allowed:?}")
                }
            ));
        }
    }
    found
}

/// Panics unless `report` (the probe's lines) shows no server file and
/// `all` (everything the call returned) no token.
fn assert_no_problems(
    who: &str,
    report: &str,
    all: &str,
    targets: &[Target],
    extra_own: &[PathBuf],
) {
    let text = report;
    let found = problems(text, targets, extra_own);
    assert!(
        found.is_empty(),
        "{who} reached the server's files:\n  {}\nreport:\n{text}",
        found.join("\n  ")
    );
    for token in [ALICE, BOB] {
        assert!(!all.contains(token), "{who} read a token:\n{all}");
    }
}

/// `root` and what lies under it (not following symlinks), at most
/// `MAX_TARGETS` entries.
fn walk(root: &Path, into: &mut Vec<Target>) {
    let mut stack = vec![root.to_path_buf()];
    into.push(Target {
        path: root.to_path_buf(),
        dir: true,
    });
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            if into.len() >= MAX_TARGETS {
                return;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_symlink() {
                continue;
            }
            into.push(Target {
                path: entry.path(),
                dir: kind.is_dir(),
            });
            if kind.is_dir() {
                stack.push(entry.path());
            }
        }
    }
}

/// The server's runtime state directory, as `src/state.rs` places it.
fn runtime_dir(server_pid: u32) -> (PathBuf, PathBuf) {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let root = base.join(format!("ferrepl-{}", own_uid()));
    let dir = root.join(server_pid.to_string());
    (root, dir)
}

/// Where a server's tokens file and store go.
struct Place {
    tokens: PathBuf,
    state: PathBuf,
    _keep: Option<tempfile::TempDir>,
    _cleanup: Cleanup,
}

impl Place {
    /// Under `base/ferrepl-test-<unique>/` (as root), mode 0700.
    fn under(base: &str) -> Self {
        let dir = Path::new(base).join(unique("ferrepl-test-"));
        std::fs::create_dir_all(&dir).expect("make the operator's directory");
        chmod(&dir, 0o700);
        Place::in_dir(&dir, None, Cleanup(vec![dir.clone()]))
    }

    /// In a private directory of this user.
    fn private() -> Self {
        let keep = tempfile::tempdir().expect("a private directory");
        let dir = keep.path().to_path_buf();
        chmod(&dir, 0o700);
        Place::in_dir(&dir, Some(keep), Cleanup(Vec::new()))
    }

    fn in_dir(dir: &Path, keep: Option<tempfile::TempDir>, cleanup: Cleanup) -> Self {
        let tokens = dir.join("tokens");
        std::fs::write(&tokens, format!("{ALICE} alice\n{BOB} bob\n")).expect("write tokens");
        chmod(&tokens, 0o600);
        let state = dir.join("store");
        Place {
            tokens,
            state,
            _keep: keep,
            _cleanup: cleanup,
        }
    }
}

/// The value of a cell as a plain string (its repr's quotes dropped).
fn value_str(out: &ToolOutput) -> String {
    out.value()
        .unwrap_or_else(|| panic!("no value: {out:#?}"))
        .trim_matches(['\'', '"'])
        .to_string()
}

/// Follows python_install until its job ends (bounded); the install itself
/// may fail (the venv has no pip): only its interpreter starting matters.
async fn install_job(peer: &Peer<RoleClient>, session: &str, wheel: &str) -> ToolOutput {
    let mut out = call(
        peer,
        "python_install",
        json!({ "packages": [wheel], "session": session, "wait_s": 50 }),
    )
    .await;
    assert!(
        out.structured.is_object(),
        "python_install was refused: {out:#?}"
    );
    let job = out.str_field("job").to_string();
    for _ in 0..10 {
        if out.structured["status"] != "running" {
            break;
        }
        out = call(peer, "shell_wait", json!({ "job": job, "wait_s": 50 })).await;
    }
    assert_ne!(out.structured["status"], "running", "{out:#?}");
    out
}

/// Builds a tiny wheel in the workspace from a cell; returns its path.
async fn wheel_in_workspace(peer: &Peer<RoleClient>) -> String {
    let out = cell(
        peer,
        "default",
        "import zipfile, os\n\
         p = os.path.abspath('viewprobe-1.0-py3-none-any.whl')\n\
         with zipfile.ZipFile(p, 'w') as z:\n    \
             z.writestr('viewprobe/__init__.py', 'X = 1\\n')\n    \
             z.writestr('viewprobe-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: viewprobe\\nVersion: 1.0\\n')\n    \
             z.writestr('viewprobe-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n    \
             z.writestr('viewprobe-1.0.dist-info/RECORD', '')\n\
         p",
    )
    .await;
    value_str(&out)
}

async fn server_files_probe(place: Place) {
    let args = [
        "--auth-token-file",
        path_str(&place.tokens),
        "--state-dir",
        path_str(&place.state),
        "--languages",
        "python,r",
        "--warm-pool",
        "0",
        // The R probe is a local source package: its code runs as it builds.
        "--allow-source-builds",
    ];
    let server = HttpServer::launch(Launch::new(&args)).await;
    let alice = server.connect_at("/mcp", ALICE).await;
    let bob = server.connect_at("/mcp", BOB).await;
    let (alice, bob) = (alice.peer(), bob.peer());

    // Bob's session and store exist while alice probes.
    cell(bob, "default", "x = 1").await;
    let ws = PathBuf::from(value_str(
        &cell(alice, "default", "import os\nos.getcwd()").await,
    ));
    r_cell(alice, "1 + 1").await;
    let site = value_str(
        &cell(
            alice,
            "default",
            "import subprocess, sys, glob, os\n\
             subprocess.run([sys.executable, '-m', 'venv', '--without-pip', 'venv'], check=True)\n\
             os.path.abspath(glob.glob('venv/lib/python*/site-packages')[0])",
        )
        .await,
    );
    let created = call(
        alice,
        "python_sessions",
        json!({ "action": "create", "session": "v", "venv": path_str(&ws.join("venv")) }),
    )
    .await;
    assert!(!created.is_error, "{created:#?}");
    cell(alice, "v", "1").await;
    let wheel = wheel_in_workspace(alice).await;

    // What the server holds now: the tokens, the stores, the runtime state.
    let server_pid = server.child.id().expect("the server's pid");
    let (runtime_root, runtime) = runtime_dir(server_pid);
    assert!(
        runtime.is_dir(),
        "the server's runtime state is not at {}",
        runtime.display()
    );
    let mut targets = vec![
        Target {
            path: place.tokens.clone(),
            dir: false,
        },
        Target {
            path: runtime_root.clone(),
            dir: true,
        },
    ];
    let before = targets.len();
    walk(&place.state, &mut targets);
    let stores = targets[before..].iter().filter(|t| !t.dir).count();
    assert!(
        stores > 0,
        "no store file in --state-dir {}",
        place.state.display()
    );
    assert!(
        targets.iter().any(|t| t.dir
            && t.path.parent().and_then(Path::file_name) == Some("venvs".as_ref())
            && t.path.to_string_lossy().ends_with("-bob")),
        "bob's kept venv is among the targets alice must not reach"
    );
    walk(&runtime, &mut targets);
    let list: String = targets
        .iter()
        .map(|t| format!("{}\n", t.path.display()))
        .collect();
    let targets_file = ws.join("view-targets.txt");
    std::fs::write(&targets_file, list).expect("write the targets");
    let script = ws.join("files_probe.py");
    std::fs::write(&script, FILES_PROBE).expect("write the probe");

    // A cell.
    let out = cell(
        alice,
        "default",
        &format!(
            "_ns = {{'__name__': 'probe'}}\nexec(open({s}).read(), _ns)\n\
             print('\\n'.join(_ns['files_report'](open({t}).read().splitlines())))",
            s = py_path(&script),
            t = py_path(&targets_file),
        ),
    )
    .await;
    let stdout = out.str_field("stdout");
    assert_no_problems("a cell", stdout, &everything(&out), &targets, &[]);

    // A shell job.
    let out = job(
        alice,
        &format!(
            "{} {} {}; cat {} 2>&1; true",
            job_python(),
            script.display(),
            targets_file.display(),
            place.tokens.display()
        ),
    )
    .await;
    let stdout = out.str_field("stdout");
    assert_no_problems("a shell job", stdout, &everything(&out), &targets, &[]);

    // An R session.
    let out = r_cell(alice, &r_files_probe(&targets_file)).await;
    let stdout = out.str_field("stdout");
    assert_no_problems("an R session", stdout, &everything(&out), &targets, &[]);

    // An install job: the venv's .pth runs the probe in the installer's
    // interpreter, which writes its report into the workspace.
    let module = format!(
        "{FILES_PROBE}\ntry:\n    _out = os.path.join({ws}, 'install-probe-%d-%s.txt' % (os.getpid(), os.urandom(4).hex()))\n    \
         with open(_out, 'w') as _f:\n        \
         _f.write('\\n'.join(files_report(open({t}).read().splitlines())) + '\\nEND\\n')\n\
         except BaseException:\n    pass\n",
        ws = py_path(&ws),
        t = py_path(&targets_file),
    );
    std::fs::write(Path::new(&site).join("_ferrepl_view_probe.py"), module)
        .expect("write the probe module");
    std::fs::write(
        Path::new(&site).join("zz_ferrepl_view_probe.pth"),
        "import _ferrepl_view_probe\n",
    )
    .expect("write the .pth");
    let installed = install_job(alice, "v", &wheel).await;
    let reports: Vec<PathBuf> = std::fs::read_dir(&ws)
        .expect("list the workspace")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("install-probe-"))
        })
        .collect();
    assert!(
        !reports.is_empty(),
        "the installer's interpreter left no report (did it run the venv's .pth?): {installed:#?}"
    );
    // The installer is given the egress relay's socket.
    let egress = runtime.join("egress.sock");
    for report in &reports {
        let text = std::fs::read_to_string(report).expect("read an install report");
        assert!(text.ends_with("END\n"), "an unfinished report:\n{text}");
        assert_no_problems(
            "an install job",
            &text,
            &text,
            &targets,
            std::slice::from_ref(&egress),
        );
    }
    assert!(
        !everything(&installed).contains(ALICE),
        "the install job showed a token: {installed:#?}"
    );

    // An r_install job: a source package's R code runs while it installs.
    let report = ws.join("r-install-probe.txt");
    let tarball = r_probe_package(&ws, &targets_file, &report);
    let installed = r_install_job(alice, &tarball).await;
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "the R install job left no report at {} ({e}): {installed:#?}",
            report.display()
        )
    });
    assert!(text.ends_with("END\n"), "an unfinished report:\n{text}");
    assert_no_problems(
        "an r_install job",
        &text,
        &everything(&installed),
        &targets,
        std::slice::from_ref(&egress),
    );
    drop(server);
}

/// Writes the source package `viewprobepkg` into `ws`, whose R code writes
/// the files report into `report` when it is installed (lazy loading runs
/// it), and packs it with tar (R CMD build could run it on the host);
/// returns the tarball's name.
fn r_probe_package(ws: &Path, targets: &Path, report: &Path) -> String {
    let pkg = ws.join("viewprobepkg");
    std::fs::create_dir_all(pkg.join("R")).expect("mkdir the package");
    std::fs::write(
        pkg.join("DESCRIPTION"),
        "Package: viewprobepkg\nVersion: 0.1\nTitle: View Probe\n\
         Description: Probes the view of an install job.\nLicense: MIT\n\
         Author: Ferrepl Tests\nMaintainer: Ferrepl Tests <tests@example.com>\n",
    )
    .expect("DESCRIPTION");
    std::fs::write(pkg.join("NAMESPACE"), "\n").expect("NAMESPACE");
    std::fs::write(
        pkg.join("R/probe.R"),
        format!(
            "local({{\n  zz <- file({out}, 'w')\n  sink(zz)\n{probe}\n  cat('END\\n')\n  sink()\n  close(zz)\n}})\n",
            out = py_path(report),
            probe = r_files_probe(targets),
        ),
    )
    .expect("probe.R");
    let tarball = "viewprobepkg_0.1.tar.gz";
    let packed = std::process::Command::new("tar")
        .args(["czf", tarball, "viewprobepkg"])
        .current_dir(ws)
        .output()
        .expect("run tar");
    assert!(packed.status.success(), "tar failed: {packed:?}");
    tarball.to_string()
}

/// r_install of `tarball`, called again while it answers "running".
async fn r_install_job(peer: &Peer<RoleClient>, tarball: &str) -> ToolOutput {
    let args = json!({ "packages": [tarball], "wait_s": 50 });
    let mut out = call(peer, "r_install", args.clone()).await;
    for _ in 0..10 {
        if out.structured["status"] != "running" {
            break;
        }
        out = call(peer, "r_install", args.clone()).await;
    }
    assert_eq!(
        out.structured["status"], "exited",
        "the R install job did not finish: {out:#?}"
    );
    out
}

#[tokio::test]
async fn server_files_are_out_of_reach() {
    if is_root() {
        // A place no sandbox's /etc holds (one inside a bound path, /usr,
        // is refused at start: escape::view_hidden).
        server_files_probe(Place::under("/etc")).await;
    } else {
        server_files_probe(Place::private()).await;
    }
}
