//! The file system a session, a shell job, an install job and an R session
//! see is built from an allow-list: a fresh root holding the system
//! directories (`/usr`, `/bin`, `/lib*`...), the operator's interpreters,
//! a named list of `/etc` entries, two `/sys` subtrees, the workspace and
//! the process's own temporary directory, and nothing else. These tests look
//! at that view from inside (what `/`, `/var`, `/sys`, `/etc` list; that the
//! directories made only to reach a bound path hold nothing but the way to
//! it, and that every entry of the host beside that way is absent). Files
//! only root can read, host sockets and the refusals at start are in
//! `view_hidden.rs`; the server's own files (tokens, store, runtime state)
//! in `view_state.rs`; the tools that need a believable system (user
//! names, git, make, certificates...) in `view_compat.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rmcp::{Peer, RoleClient};
use serde_json::json;

use crate::support::{StdioServer, ToolOutput, call, job_python, json_list, path_str, py, py_path};

/// Names `/` may hold whatever the anchors are.
const TOP_ALLOWED: &[&str] = &[
    "bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sys", "tmp",
    "var", "nix",
];
/// Top-level directories bound (or built) as a whole: their listings are
/// checked on their own terms, not as the way to an anchor.
const SYSTEM_TOP: &[&str] = &[
    "bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sys", "var",
    "nix",
];
/// Paths a fresh root must not hold unless an anchor lies inside them.
pub(super) const ABSENT: &[&str] = &[
    "/opt",
    "/srv",
    "/mnt",
    "/media",
    "/boot",
    "/home",
    "/run",
    "/var/lib",
    "/var/log",
    "/var/tmp",
    "/var/run",
    "/var/spool",
    "/var/mail",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/ssh",
    "/etc/sudoers",
    "/etc/ssl/private",
    "/root/.bashrc",
    "/root/.ssh",
];
/// `/etc` entries no sandbox may see.
const ETC_FORBIDDEN: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "ssh",
    "sudoers",
    "sudoers.d",
];
/// Directories every probe lists.
const LISTED: &[&str] = &[
    "/",
    "/var",
    "/var/cache",
    "/sys",
    "/sys/devices",
    "/sys/devices/system",
    "/etc",
    "/etc/ssl",
    "/root",
    "/home",
    "/tmp",
];

// ------------------------------------------------------------------ probes

/// Python that reports the view: `META\tkey\tvalue`, `LIST\tdir\tOK a/b` or
/// `LIST\tdir\tERR ...`, `LINK\tdir\ttarget`, `EXISTS\tpath\tTrue|False`
/// lines, for the directories in `LISTED`, every ancestor of the workspace,
/// TMPDIR, HOME, the interpreter's prefixes and the PATH entries.
const VIEW_PROBE: &str = r#"
import os, sys
def view_report(workspace, listed, absent):
    lines = []
    def meta(k, v):
        lines.append("META\t%s\t%s" % (k, v))
    tmpdir, home = os.environ.get("TMPDIR", ""), os.environ.get("HOME", "")
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    meta("tmpdir", tmpdir)
    meta("home", home)
    meta("cwd", os.getcwd())
    meta("path", os.environ.get("PATH", ""))
    meta("prefix", sys.prefix)
    meta("base_prefix", sys.base_prefix)
    meta("exe_dir", exe_dir)
    cands = [workspace, tmpdir, home, sys.prefix, sys.base_prefix, exe_dir]
    cands += os.environ.get("PATH", "").split(":")
    dirs = list(listed)
    for c in cands:
        if not c.startswith("/"):
            continue
        d = os.path.dirname(os.path.normpath(c))
        while d != "/":
            dirs.append(d)
            d = os.path.dirname(d)
    seen = set()
    for d in dirs:
        if d in seen:
            continue
        seen.add(d)
        if os.path.islink(d):
            lines.append("LINK\t%s\t%s" % (d, os.readlink(d)))
            continue
        try:
            lines.append("LIST\t%s\tOK %s" % (d, "/".join(sorted(os.listdir(d)))))
        except OSError as e:
            lines.append("LIST\t%s\tERR %s errno=%s" % (d, type(e).__name__, e.errno))
    for p in absent:
        lines.append("EXISTS\t%s\t%s" % (p, os.path.lexists(p)))
    return lines

if __name__ == "__main__":
    import json
    absent = open(sys.argv[3]).read().splitlines()
    print("\n".join(view_report(sys.argv[1], json.loads(sys.argv[2]), absent)))
"#;

/// The same report from R (no interpreter prefixes; `rhome` instead).
fn r_view_probe(listed: &[&str], absent: &Path) -> String {
    let vec = |items: &[&str]| {
        let quoted: Vec<String> = items.iter().map(py).collect();
        format!("c({})", quoted.join(", "))
    };
    format!(
        r#"local({{
  meta <- function(k, v) cat('META\t', k, '\t', v, '\n', sep = '')
  ws <- normalizePath(getwd())
  rhome <- normalizePath(R.home())
  meta('tmpdir', Sys.getenv('TMPDIR')); meta('home', Sys.getenv('HOME'))
  meta('cwd', ws); meta('path', Sys.getenv('PATH')); meta('rhome', rhome)
  cands <- c(ws, Sys.getenv('TMPDIR'), Sys.getenv('HOME'), rhome, R.home())
  cands <- cands[startsWith(cands, '/')]
  dirs <- {listed}
  for (p in cands) {{
    d <- dirname(p)
    while (d != '/') {{ dirs <- c(dirs, d); d <- dirname(d) }}
  }}
  for (d in unique(dirs)) {{
    l <- Sys.readlink(d)
    if (!is.na(l) && nzchar(l)) {{ cat('LINK\t', d, '\t', l, '\n', sep = ''); next }}
    if (!dir.exists(d)) {{ cat('LIST\t', d, '\tERR absent\n', sep = ''); next }}
    cat('LIST\t', d, '\tOK ', paste(sort(list.files(d, all.files = TRUE, no.. = TRUE)), collapse = '/'), '\n', sep = '')
  }}
  for (p in readLines({absent})) cat('EXISTS\t', p, '\t', if (file.exists(p)) 'True' else 'False', '\n', sep = '')
}})"#,
        listed = vec(listed),
        absent = py_path(absent),
    )
}

/// One probe's report, parsed.
#[derive(Debug, Default)]
pub(super) struct Report {
    pub who: String,
    pub meta: BTreeMap<String, String>,
    pub lists: BTreeMap<String, Result<BTreeSet<String>, String>>,
    pub links: BTreeMap<String, String>,
    pub exists: BTreeMap<String, bool>,
    pub raw: String,
}

impl Report {
    pub fn parse(who: &str, text: &str) -> Self {
        let mut report = Report {
            who: who.to_string(),
            raw: text.to_string(),
            ..Report::default()
        };
        for line in text.lines().map(|l| l.trim_end_matches('\r')) {
            let mut parts = line.splitn(3, '\t');
            let (Some(kind), Some(key), Some(value)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let key = key.to_string();
            match kind {
                "META" => {
                    report.meta.insert(key, value.to_string());
                }
                "LINK" => {
                    report.links.insert(key, value.to_string());
                }
                "EXISTS" => {
                    report.exists.insert(key, value == "True");
                }
                "LIST" => {
                    let listed = match value.strip_prefix("OK") {
                        Some(names) => Ok(names
                            .trim()
                            .split('/')
                            .filter(|n| !n.is_empty())
                            .map(str::to_string)
                            .collect()),
                        None => Err(value.to_string()),
                    };
                    report.lists.insert(key, listed);
                }
                _ => {}
            }
        }
        assert!(
            report.meta.contains_key("tmpdir") && report.lists.contains_key("/"),
            "{who}: no view report in its output:\n{text}"
        );
        report
    }

    pub fn meta(&self, key: &str) -> &str {
        self.meta
            .get(key)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("{}: no META {key} in:\n{}", self.who, self.raw))
    }

    /// A listing that must have worked.
    fn listing(&self, dir: &str) -> &BTreeSet<String> {
        match self.lists.get(dir) {
            Some(Ok(names)) => names,
            other => panic!(
                "{}: listing {dir} should work, got {other:?}; report:\n{}",
                self.who, self.raw
            ),
        }
    }

    /// The process's own paths: workspace, TMPDIR, HOME.
    fn own_anchors(&self) -> Vec<String> {
        ["cwd", "tmpdir", "home"]
            .iter()
            .filter_map(|k| self.meta.get(*k))
            .filter(|p| p.starts_with('/'))
            .cloned()
            .collect()
    }

    /// The interpreter's installation and the PATH entries outside the
    /// hidden places: bound for every process of the server.
    fn shared_anchors(&self) -> Vec<String> {
        let mut out: Vec<String> = ["prefix", "base_prefix", "exe_dir", "rhome"]
            .iter()
            .filter_map(|k| self.meta.get(*k))
            .filter(|p| p.starts_with('/'))
            .cloned()
            .collect();
        if let Some(path) = self.meta.get("path") {
            out.extend(
                path.split(':')
                    .filter(|p| p.starts_with('/') && !in_hidden_place(Path::new(p)))
                    .map(str::to_string),
            );
        }
        out
    }
}

/// Whether `p` lies in a place no sandbox sees (homes, temporary and
/// runtime directories): a PATH entry there is not bound.
fn in_hidden_place(p: &Path) -> bool {
    let mut hidden: Vec<PathBuf> = ["/home", "/root", "/tmp", "/var/tmp", "/run", "/var/run"]
        .iter()
        .map(PathBuf::from)
        .collect();
    hidden.push(std::env::temp_dir());
    for var in ["HOME", "XDG_RUNTIME_DIR"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            hidden.push(PathBuf::from(v));
        }
    }
    hidden.iter().any(|h| p.starts_with(h))
}

/// The names directly under `dir` on the way to any anchor below it.
fn ways_to(dir: &str, anchors: &[String]) -> BTreeSet<String> {
    let dir = Path::new(dir);
    anchors
        .iter()
        .filter_map(|a| Path::new(a).strip_prefix(dir).ok())
        .filter_map(|rest| rest.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect()
}

fn first_component(p: &str) -> Option<&str> {
    p.trim_start_matches('/')
        .split('/')
        .next()
        .filter(|s| !s.is_empty())
}

/// Every way `report` shows more than the allow-list, given the anchors all
/// processes of the server share (`shared`) besides the report's own.
pub(super) fn view_problems(report: &Report, shared: &[String]) -> Vec<String> {
    let mut anchors: Vec<String> = shared.to_vec();
    anchors.extend(report.own_anchors());
    let mut problems = Vec::new();
    let subset = |what: &str, names: &BTreeSet<String>, allowed: &BTreeSet<String>| {
        let extra: Vec<&String> = names.difference(allowed).collect();
        (!extra.is_empty()).then(|| format!("{what} holds {extra:?} (allowed: {allowed:?})"))
    };
    let set =
        |items: &[&str]| -> BTreeSet<String> { items.iter().map(|s| s.to_string()).collect() };

    let mut top = set(TOP_ALLOWED);
    top.extend(ways_to("/", &anchors));
    problems.extend(subset("/", report.listing("/"), &top));
    problems.extend(subset("/var", report.listing("/var"), &set(&["cache"])));
    if let Some(Ok(names)) = report.lists.get("/var/cache") {
        problems.extend(subset("/var/cache", names, &set(&["fontconfig"])));
    }
    problems.extend(subset("/sys", report.listing("/sys"), &set(&["devices"])));
    problems.extend(subset(
        "/sys/devices",
        report.listing("/sys/devices"),
        &set(&["system"]),
    ));
    problems.extend(subset(
        "/sys/devices/system",
        report.listing("/sys/devices/system"),
        &set(&["cpu", "node"]),
    ));

    let etc = report.listing("/etc");
    for needed in ["passwd", "group"] {
        if !etc.contains(needed) {
            problems.push(format!("/etc lacks {needed}: {etc:?}"));
        }
    }
    for forbidden in ETC_FORBIDDEN {
        if etc.contains(*forbidden) {
            problems.push(format!("/etc shows {forbidden}"));
        }
    }
    if let Some(Ok(ssl)) = report.lists.get("/etc/ssl")
        && ssl.contains("private")
    {
        problems.push("/etc/ssl shows private".to_string());
    }

    for (path, exists) in &report.exists {
        let needed = anchors
            .iter()
            .any(|a| Path::new(a).starts_with(path) || Path::new(path).starts_with(a));
        if *exists && !needed {
            problems.push(format!("{path} exists"));
        }
    }

    // /tmp is the process's TMPDIR, or a directory holding only the way
    // to what lies under it.
    match report.links.get("/tmp") {
        Some(target) => {
            let tmpdir = report.meta("tmpdir");
            if Path::new(target) != Path::new(tmpdir) {
                problems.push(format!(
                    "/tmp links to {target}, not to the TMPDIR {tmpdir}"
                ));
            }
        }
        // (A directory made on the way to a bound path may be unlistable.)
        None if !matches!(report.lists.get("/tmp"), Some(Ok(_)))
            && !report.lists["/tmp"]
                .as_ref()
                .is_err_and(|e| e.contains("PermissionError")) =>
        {
            problems.push(format!("/tmp is missing: {:?}", report.lists.get("/tmp")));
        }
        None => {
            if ways_to("/tmp", &anchors).is_empty() {
                problems.push(
                    "/tmp is a directory although nothing the process needs lies under it"
                        .to_string(),
                );
            }
        }
    }

    // Directories made only to reach a bound path hold nothing else.
    for (dir, listed) in &report.lists {
        let Ok(names) = listed else { continue };
        let top = first_component(dir);
        if dir == "/" || top.is_none_or(|t| SYSTEM_TOP.contains(&t)) {
            continue;
        }
        if report.links.contains_key(dir) || anchors.iter().any(|a| Path::new(dir).starts_with(a)) {
            continue;
        }
        problems.extend(subset(dir, names, &ways_to(dir, &anchors)));
    }
    problems
}

/// Panics with every problem of `report` (and the report itself).
pub(super) fn assert_view(report: &Report, shared: &[String]) {
    let problems = view_problems(report, shared);
    assert!(
        problems.is_empty(),
        "{} sees more than the allow-list:\n  {}\nreport:\n{}",
        report.who,
        problems.join("\n  "),
        report.raw
    );
}

// ------------------------------------------------------------------ calls

/// A python_exec cell that must succeed.
pub(super) async fn cell(peer: &Peer<RoleClient>, session: &str, code: &str) -> ToolOutput {
    let out = call(
        peer,
        "python_exec",
        json!({ "code": code, "session": session, "wait_s": 50 }),
    )
    .await;
    out.assert_ok();
    out
}

/// An r_exec cell of the default R session that must succeed.
pub(super) async fn r_cell(peer: &Peer<RoleClient>, code: &str) -> ToolOutput {
    let out = call(peer, "r_exec", json!({ "code": code, "wait_s": 50 })).await;
    out.assert_ok();
    out
}

/// A shell job that must exit within its wait window.
pub(super) async fn job(peer: &Peer<RoleClient>, command: &str) -> ToolOutput {
    let out = call(
        peer,
        "shell_exec",
        json!({ "command": command, "wait_s": 50 }),
    )
    .await;
    assert_eq!(
        out.structured["status"], "exited",
        "the job should have exited: {out:#?}"
    );
    out
}

/// Paths (files or whole directories) removed when the test ends.
pub(super) struct Cleanup(pub Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for path in self.0.iter().rev() {
            if path.is_dir() {
                let _ = std::fs::remove_dir_all(path);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

// ------------------------------------------------------------------ 1. the root

/// Entries of the host beside the way to the anchors: under `/` those
/// not allowed at the top, and under every directory on the way to an
/// anchor (outside the system directories) what is not on the way to, or
/// inside, a `shared` anchor. The processes' own TMPDIR/HOME (in `own`)
/// are listed too: each process may see its own only.
fn host_siblings(shared: &[String], own: &[String]) -> Vec<String> {
    let mut out = BTreeSet::new();
    let entries = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    for entry in entries(Path::new("/")) {
        let name = entry.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !TOP_ALLOWED.contains(&name) {
            out.insert(path_str(&entry).to_string());
        }
    }
    let on_the_way = |p: &Path| {
        shared
            .iter()
            .any(|a| Path::new(a).starts_with(p) || p.starts_with(a))
    };
    for anchor in shared.iter().chain(own) {
        let mut dir = Path::new(anchor).parent();
        while let Some(d) = dir {
            let skip = d == Path::new("/")
                || first_component(path_str(d)).is_none_or(|t| SYSTEM_TOP.contains(&t))
                || shared.iter().any(|a| d.starts_with(a));
            if !skip {
                out.extend(
                    entries(d)
                        .iter()
                        .filter(|p| !on_the_way(p))
                        .take(1000)
                        .map(|p| path_str(p).to_string()),
                );
            }
            dir = d.parent();
        }
    }
    out.into_iter().collect()
}

/// The view reports of a cell, a shell job (plus its `ls -a /`) and an R
/// session, each checking that the paths in `absent` are not there.
async fn view_reports(server: &StdioServer, absent: &[String]) -> (Vec<Report>, BTreeSet<String>) {
    let ws = server.workdir.path().canonicalize().expect("canonical ws");
    let peer = server.peer();
    let script = ws.join("view_probe.py");
    std::fs::write(&script, VIEW_PROBE).expect("write the probe");
    let absent_file = ws.join("view_absent.txt");
    std::fs::write(&absent_file, absent.join("\n")).expect("write the absent list");

    let from_cell = cell(
        peer,
        "default",
        &format!(
            "_ns = {{'__name__': 'probe'}}\nexec(open({s}).read(), _ns)\n\
             print('\\n'.join(_ns['view_report']({ws}, {listed}, open({a}).read().splitlines())))",
            s = py_path(&script),
            ws = py_path(&ws),
            listed = json_list(LISTED),
            a = py_path(&absent_file),
        ),
    )
    .await;
    let cell_report = Report::parse("a cell", from_cell.str_field("stdout"));

    let from_job = job(
        peer,
        &format!(
            "{py} {script} {ws} '{listed}' {absent}; echo LS-ROOT; ls -a /",
            py = job_python(),
            script = script.display(),
            ws = ws.display(),
            listed = json_list(LISTED),
            absent = absent_file.display(),
        ),
    )
    .await;
    let job_stdout = from_job.str_field("stdout");
    let (job_text, ls_root) = job_stdout
        .split_once("LS-ROOT")
        .unwrap_or_else(|| panic!("no LS-ROOT in the job's output: {from_job:#?}"));
    let job_report = Report::parse("a shell job", job_text);
    let ls_root: BTreeSet<String> = ls_root
        .split_whitespace()
        .filter(|n| *n != "." && *n != "..")
        .map(str::to_string)
        .collect();

    let from_r = r_cell(peer, &r_view_probe(LISTED, &absent_file)).await;
    let r_report = Report::parse("an R session", from_r.str_field("stdout"));
    (vec![cell_report, job_report, r_report], ls_root)
}

#[tokio::test]
async fn the_root_holds_only_the_allow_list() {
    let server = StdioServer::start(&["--languages", "python,r"]).await;
    let ws = server.workdir.path().canonicalize().expect("canonical ws");
    let absent: Vec<String> = ABSENT.iter().map(|s| s.to_string()).collect();

    // What each process reports tells where its interpreter, TMPDIR and
    // HOME are; then every entry of the host beside the way to them is
    // probed again (the directories on the way may not be listable).
    let (first, _) = view_reports(&server, &absent).await;
    let mut shared = vec![path_str(&ws).to_string()];
    let mut own = Vec::new();
    for report in &first {
        shared.extend(report.shared_anchors());
        own.extend(report.own_anchors());
    }
    let mut absent = absent;
    absent.extend(host_siblings(&shared, &own));
    let (reports, ls_root) = view_reports(&server, &absent).await;
    for report in &reports {
        shared.extend(report.shared_anchors());
    }
    for report in &reports {
        assert_view(report, &shared);
    }
    // `ls -a /` in the job agrees with the job's own listing of /.
    assert_eq!(
        &ls_root,
        reports[1].listing("/"),
        "ls -a / and os.listdir('/') differ in the job:\n{}",
        reports[1].raw
    );
}
