//! `ferrepl doctor`: one screen telling a user, before an agent connects,
//! whether sessions can start here and how well they are confined. It
//! looks and changes nothing: the interpreters sessions would use (found
//! the way the server finds them, run the way sessions run: in the
//! sandbox), which protections this kernel gives (the server's own start-up
//! probe), whether the package indexes answer, which agent clients have
//! ferrepl configured (and whether a project's entry weakens the sandbox),
//! and whether git runs bare repositories it finds (`doctor_host.rs`).
//! Only what stops sessions from starting (no working Python, a server
//! that would refuse to start) fails it with exit code 1; the rest are
//! warnings. `--version`'s text (`long_version`) lives here too.
//!
//! Test hook (debug builds, `test_hooks.rs`): doctor can report a kernel
//! without Landlock, so that what a user of such a machine reads is tested
//! anywhere; it changes what doctor reports, never the server's sandbox.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use crate::config::commands::DoctorInputs;
use crate::config::settings::Settings;
use crate::config::tokens::TokenTable;
use crate::sandbox::SandboxConfig;
use crate::setup::doctor_clients::configured_clients;
use crate::setup::doctor_sandbox::sandbox_items;
use crate::setup::probe;
use crate::startup::Prepared;
use crate::state::RuntimeDir;
use crate::worker::python::PythonSource;
use Status::{Good, Missing, Warn};

/// How long Python may take to print its version.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(5);
/// R's front end is a shell script starting R: slower on a cold cache.
const R_TIMEOUT: Duration = Duration::from_secs(10);
/// Name resolution and TCP connect to a package index, together.
const REACH_TIMEOUT: Duration = Duration::from_secs(3);
/// The oldest Python the driver supports.
const MIN_PYTHON: (u32, u32) = (3, 9);
const NO_R: &str = "not found (optional: apt-get install r-base-core / brew install r)";

/// The version text clap prints after the program's name: `0.1.0 (git
/// 67c198b1, linux: landlock seccomp namespaces cgroups)`: which build, and
/// which confinement it can apply at all (the kernel decides the rest,
/// which `doctor` reports).
pub fn long_version() -> String {
    let mut parts = Vec::new();
    if let Some(rev) = option_env!("FERREPL_GIT_REV") {
        parts.push(format!("git {rev}"));
    }
    parts.push(if cfg!(target_os = "linux") {
        "linux: landlock seccomp namespaces cgroups".to_string()
    } else {
        format!("{}: no sandbox", std::env::consts::OS)
    });
    format!("{} ({})", env!("CARGO_PKG_VERSION"), parts.join(", "))
}

pub use crate::config::commands::DoctorOptions;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(super) enum Status {
    #[serde(rename = "ok")]
    Good,
    #[serde(rename = "warn")]
    Warn,
    #[serde(rename = "missing")]
    Missing,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct Item {
    name: &'static str,
    status: Status,
    detail: String,
}

pub(super) fn item(name: &'static str, status: Status, detail: impl Into<String>) -> Item {
    let detail = detail.into();
    Item {
        name,
        status,
        detail,
    }
}

/// What sessions cannot start without: missing, it fails doctor (the
/// sandbox is missing only when the server would refuse to start).
const REQUIRED: [&str; 3] = ["config", "python", "sandbox"];

fn required(item: &Item) -> bool {
    item.status == Missing && REQUIRED.contains(&item.name)
}

#[derive(Debug, Serialize)]
struct Report {
    version: String,
    workdir: Option<PathBuf>,
    /// Whether sessions can start (no required item is missing).
    ready: bool,
    items: Vec<Item>,
    /// The server's own description of its sandbox, when probed.
    sandbox: Option<String>,
}

/// Checks everything, for the server `inputs` describe (the flags and
/// FERREPL_* variables given with `doctor`: `ferrepl --python X doctor`
/// checks X; `config::commands::doctor_inputs`), and prints the report;
/// exit code 1 when sessions could not start.
pub fn run(inputs: DoctorInputs, opts: &DoctorOptions) -> ExitCode {
    let report = check(inputs, opts);
    let text = if opts.json {
        serde_json::to_string_pretty(&report).unwrap_or_default()
    } else {
        // https://no-color.org: a NO_COLOR that is set and not empty.
        let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let colour = std::io::stdout().is_terminal() && !no_colour;
        render(&report, colour)
    };
    // A closed pipe (`ferrepl doctor | head`) is not worth a panic.
    let _ = writeln!(std::io::stdout().lock(), "{text}");
    if report.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The server doctor checks for: its settings, and whether it serves
/// tenants (start-up's tenant checks then apply).
#[derive(Clone, Copy)]
struct Server<'a> {
    settings: &'a Settings,
    tenants: bool,
}

/// Every check, in the order a user reads them.
fn check(inputs: DoctorInputs, opts: &DoctorOptions) -> Report {
    let (version, items) = (long_version(), Vec::new());
    let mut report = Report {
        version,
        workdir: None,
        ready: false,
        items,
        sandbox: None,
    };
    let (settings, tokens) = match inputs {
        Ok(found) => found,
        Err(e) => {
            report.items.push(item("config", Missing, e));
            return report;
        }
    };
    let workdir = settings.workdir.clone();
    report.workdir = Some(workdir.clone());
    // The server's own refusals from the flags (the Python has its item).
    let tenants = tokens.as_ref().is_ok_and(TokenTable::has_tenants);
    let refused = tokens
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(|tokens| {
            crate::startup::preflight::check_serving(&settings, tokens)?;
            crate::startup::preflight::state_dir_place(&settings)
        });
    if let Err(e) = refused {
        let why = format!("the server would refuse to start: {e:#}");
        report.items.push(item("config", Missing, why));
    }
    if let Some(addr) = settings.viewer.addr {
        report
            .items
            .push(viewer_item(&settings, tokens.as_ref().ok(), addr));
    }
    // The indexes are asked first: they answer while the interpreters run.
    let r = crate::worker::r::resolve(settings.interpreters.r.as_deref());
    let mut reaches = vec![(
        "pypi",
        "python_install",
        probe::reach("pypi.org".into(), 443, REACH_TIMEOUT),
    )];
    if r.as_ref().is_some_and(|r| r.is_file())
        && let Some(host) = crate::egress::host_of_url(&settings.interpreters.cran)
    {
        let cran = &settings.interpreters.cran;
        let plain = cran.starts_with("http://").then_some(80);
        let port = crate::egress::port_of_url(cran).or(plain).unwrap_or(443);
        reaches.push(("cran", "r_install", probe::reach(host, port, REACH_TIMEOUT)));
    }
    match tokio::runtime::Runtime::new() {
        Ok(rt) => {
            let server = Server {
                settings: &settings,
                tenants,
            };
            let found = rt.block_on(sessions(opts, server, r, &mut report.items));
            // What sessions can write as start-up settled it (the .venv
            // found upward, the kept venvs), else as the flags name it.
            let places = match found {
                Some((sandbox, places)) => {
                    report.sandbox = Some(sandbox);
                    places
                }
                None => crate::startup::places::named(&settings),
            };
            let writable = places.writable();
            let servers = super::doctor_upstreams::servers_item(&settings, &writable);
            if let Some(servers) = rt.block_on(servers) {
                report.items.push(servers);
            }
        }
        Err(e) => report
            .items
            .push(item("sandbox", Missing, format!("no runtime: {e}"))),
    }
    for (name, tool, answer) in reaches {
        let secs = REACH_TIMEOUT.as_secs();
        let (status, detail) = match answer.recv_timeout(REACH_TIMEOUT + Duration::from_secs(1)) {
            Ok(Ok(to)) => (Good, format!("{to} reachable")),
            Ok(Err(e)) => (Warn, format!("unreachable: {e}; {tool} will fail")),
            Err(_) => (Warn, format!("no answer within {secs} s; {tool} may fail")),
        };
        report.items.push(item(name, status, detail));
    }
    report.items.push(configured_clients(&workdir));
    report
        .items
        .extend(super::doctor_host::project_flags_item(&workdir));
    report.items.push(super::doctor_host::git_item(&workdir));
    report.ready = !report.items.iter().any(required);
    report
}

/// `--viewer`: where the live view is served and who may look.
fn viewer_item(
    settings: &Settings,
    tokens: Option<&TokenTable>,
    addr: std::net::SocketAddr,
) -> Item {
    let Some(tokens) = tokens else {
        return item(
            "viewer",
            Missing,
            "not checked: the tokens are refused (see config)",
        );
    };
    let checked = crate::viewer::check(settings, tokens);
    let port = if addr.port() == 0 {
        " (port 0: the chosen port is printed at start)"
    } else {
        ""
    };
    let url = crate::viewer::url_for(settings, addr);
    match checked {
        Ok(Some(_)) => item(
            "viewer",
            Good,
            format!(
                "{url}{port}; log in with --viewer-tokens or the one-time link printed at start"
            ),
        ),
        Ok(None) => item(
            "viewer",
            Good,
            format!("{url}{port}; loopback, no login (single tenant)"),
        ),
        Err(e) => item(
            "viewer",
            Missing,
            format!("the server would refuse to start: {e:#}"),
        ),
    }
}

/// How a setting was given: its flag, or its variable when that holds it.
fn given_as(flag: &str, var: &str, value: &Path) -> String {
    match std::env::var_os(var) {
        Some(v) if Path::new(&v) == value => var.to_string(),
        _ => flag.to_string(),
    }
}

/// The sandbox probe, then Python and R run as sessions run them; returns
/// the server's description of its sandbox and its map of places.
async fn sessions(
    opts: &DoctorOptions,
    server: Server<'_>,
    r: Option<PathBuf>,
    items: &mut Vec<Item>,
) -> Option<(String, crate::sandbox::places::Places)> {
    let workdir = &server.settings.workdir;
    let named = &server.settings.interpreters.python;
    let (mut found, source) = crate::worker::python::resolve(named.as_deref(), workdir);
    // A bare name (`--python python3.12`, or python3 when PATH has none) is
    // looked up on PATH, never in the current directory.
    if found.components().count() == 1
        && let Some(on_path) = found.to_str().and_then(crate::worker::python::find_on_path)
    {
        found = on_path;
    }
    let exists = found.components().count() > 1 && found.is_file();
    let source_kind = source;
    let source = match (source, named) {
        (PythonSource::Flag, Some(p)) if opts.python.is_none() => {
            given_as("--python", "FERREPL_PYTHON", p)
        }
        (PythonSource::Flag, _) => "--python".to_string(),
        (PythonSource::VenvFlag, _) => "--venv".to_string(),
        (PythonSource::Venv, _) => format!(".venv upward from {}", workdir.display()),
        (PythonSource::Path, _) => "python3 on PATH".to_string(),
    };
    let ready = match RuntimeDir::create() {
        Ok(state) => prepare(server, &state, items).map(|p| (state, p)),
        Err(e) => {
            let why = format!("cannot create ferrepl's state directory: {e:#}");
            items.push(item("sandbox", Missing, why));
            None
        }
    };
    let shown = match &ready {
        Some((_, p)) if p.python != found => {
            format!("{} ({source}: {})", p.python.display(), found.display())
        }
        _ => format!("{} ({source})", found.display()),
    };
    let (a, b) = MIN_PYTHON;
    items.push(match &ready {
        _ if !exists => {
            let hint = format!("install Python {a}.{b}+ or pass --python PATH");
            item("python", Missing, format!("{shown} does not exist; {hint}"))
        }
        // Never run outside the sandbox (sessions may have written it); the
        // sandbox item says why there is none.
        None => item("python", Warn, format!("{shown} not run: no sandbox")),
        Some((state, p)) => {
            let args = ["-I", "-c", "import sys; print(sys.version.split()[0])"];
            match run_confined(&p.sandbox, state, &p.python, &args, PYTHON_TIMEOUT).await {
                Ok(v) => python_item(v.trim(), &shown),
                Err(e) => item("python", Missing, format!("{shown} does not run: {e}")),
            }
        }
    });
    let confined = ready.as_ref().map(|(state, p)| (state, p));
    items.push(if exists {
        super::doctor_install::install_item(server.settings, &found, source_kind, confined).await
    } else {
        item("install", Missing, "no Python to install into (see python)")
    });
    items.extend(super::doctor_install::preinstall_item(
        server.settings,
        ready.as_ref().map(|(_, p)| p),
    ));
    items.push(r_item(r, ready.as_ref().map(|(state, p)| (state, &p.sandbox))).await);
    let (_, prepared) = ready?;
    let sb = &prepared.sandbox;
    if !sb.enabled() {
        items.push(item("sandbox", Warn, sb.active.clone()));
        return Some((prepared.sandbox.active, prepared.places));
    }
    let cgroups = sb.cgroups.as_ref().map(|c| (c.has_memory(), c.has_pids()));
    // The test hook: what a kernel without Landlock reports (module header).
    let abi = match crate::test_hooks::doctor_without_landlock() {
        true => Err(libc::ENOSYS),
        false => probe::landlock_abi(),
    };
    items.extend(sandbox_items(&sb.active, sb.namespaces, cgroups, abi));
    Some((prepared.sandbox.active, prepared.places))
}

/// R: found, and its version when it runs in the sandbox.
async fn r_item(r: Option<PathBuf>, sandbox: Option<(&RuntimeDir, &SandboxConfig)>) -> Item {
    let (status, detail) = match (r, sandbox) {
        (None, _) => (Missing, NO_R.to_string()),
        (Some(r), _) if !r.is_file() => (Missing, format!("{} does not exist", r.display())),
        (Some(r), None) => (Warn, format!("{} not run: no sandbox", r.display())),
        (Some(r), Some((state, sandbox))) => {
            match run_confined(sandbox, state, &r, &["--version"], R_TIMEOUT).await {
                Ok(out) => (
                    Good,
                    format!("{}: {}", out.lines().next().unwrap_or(""), r.display()),
                ),
                Err(e) => (Warn, format!("{} does not run: {e}", r.display())),
            }
        }
    };
    item("r", status, detail)
}

/// The server's start-up decisions (the probe included), made as the server
/// makes them; a failure becomes an item, never a crash.
fn prepare(server: Server<'_>, state: &RuntimeDir, items: &mut Vec<Item>) -> Option<Prepared> {
    let mut settings = server.settings.clone();
    let dir = &server.settings.workdir;
    // Doctor creates nothing: a --venv not made yet is made by the server
    // at start, from the Python checked here instead (`Instance::peek`).
    let absent = |v: &PathBuf| {
        !crate::sandbox::paths::normalize(v, dir)
            .join("bin/python")
            .is_file()
    };
    if let Some(venv) = settings.interpreters.venv.as_ref().filter(|v| absent(v)) {
        let note = format!(
            "{} {}: made at start",
            given_as("--venv", "FERREPL_VENV", venv),
            venv.display()
        );
        items.push(item("venv", Warn, note));
    }
    // The stores' directory as the server would take it, checked without
    // creating it (a missing one is made at start).
    let kept_in = settings.stores.dir().and_then(|d| d.canonicalize().ok());
    let uids = crate::startup::uid_table(&settings, dir, kept_in.as_deref(), true)
        .ok()
        .flatten();
    let tenants = server.tenants;
    let instance = crate::startup::Instance {
        runtime: state,
        stores: kept_in.as_deref(),
        tenants,
        uids: uids.as_ref(),
        peek: true,
    };
    match crate::startup::prepare(&settings, instance) {
        Ok(prepared) => Some(prepared),
        Err(e) => {
            let why = format!("the server would refuse to start: {e:#}");
            items.push(item("sandbox", Missing, why));
            // With --sandbox-require, probed again without it to say what is missing.
            let retry = std::mem::replace(&mut settings.sandbox.require, false);
            retry.then(|| crate::startup::prepare(&settings, instance).ok())?
        }
    }
}

fn python_item(version: &str, shown: &str) -> Item {
    let mut numbers = version.split('.').map(|n| n.parse::<u32>().ok());
    let (a, b) = MIN_PYTHON;
    match (numbers.next().flatten(), numbers.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= MIN_PYTHON => {
            item("python", Good, format!("Python {version}: {shown}"))
        }
        _ => item(
            "python",
            Missing,
            format!("Python {version}: {shown}: need {a}.{b}+"),
        ),
    }
}

/// Runs `program args` through the one spawn path, in the sandbox sessions
/// get; its stdout, or why it failed.
pub(super) async fn run_confined(
    sandbox: &SandboxConfig,
    state: &RuntimeDir,
    program: &Path,
    args: &[&str],
    limit: Duration,
) -> Result<String, String> {
    use tokio::io::AsyncReadExt;
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    let name = program.file_name().unwrap_or_default().to_string_lossy();
    let launch = crate::process::Launch {
        program,
        args: &args,
        cwd: &sandbox.workspace,
        env: &[],
        sandbox: Some(sandbox),
        inherit_env: false,
        home: state.path().join(format!("doctor-{name}")),
        label: "doctor",
        egress: false,
        extra_read: &[],
        files: &[],
        inet_in_netns: false,
        stdio: crate::process::Stdio::Pipes {
            stdin: false,
            control: vec![],
        },
    };
    let spawned = crate::process::spawn(launch).map_err(|e| format!("cannot start it: {e}"))?;
    let (process, mut child) = (spawned.process, spawned.child);
    let finished = tokio::time::timeout(limit, async {
        let reads = spawned.outputs.into_iter().map(|(_, out)| async move {
            let mut buf = Vec::new();
            let _ = out.take(64 * 1024).read_to_end(&mut buf).await;
            String::from_utf8_lossy(&buf).into_owned()
        });
        let texts = futures::future::join_all(reads).await;
        (child.wait().await, texts)
    })
    .await;
    let result = match finished {
        Ok((status, mut texts)) => {
            let exit = crate::process::ExitInfo::now(status);
            texts.resize(2, String::new());
            let last = texts[1]
                .trim()
                .lines()
                .last()
                .map(str::trim)
                .unwrap_or("no message");
            let failed = format!("{} ({last})", exit.describe());
            (exit.code == Some(0))
                .then(|| texts[0].clone())
                .ok_or(failed)
        }
        Err(_) => {
            // Its whole tree: the launcher and whatever the program started.
            process.kill_all();
            let _ = child.wait().await;
            Err(format!("no answer within {} s", limit.as_secs()))
        }
    };
    process.remove_home().await;
    crate::process::release(process.take_cgroup()).await;
    result
}

/// The report as text: one line per item, the status coloured on a terminal.
fn render(report: &Report, colour: bool) -> String {
    let mut out = format!("ferrepl {}\n", report.version);
    if let Some(dir) = &report.workdir {
        out.push_str(&format!("workspace: {}\n", dir.display()));
    }
    out.push('\n');
    for i in &report.items {
        let (word, code) = match i.status {
            Good => ("ok", 32),
            Warn => ("warn", 33),
            Missing => ("missing", 31),
        };
        let word = format!("{word:<7}");
        let word = if colour {
            format!("\x1b[{code}m{word}\x1b[0m")
        } else {
            word
        };
        out.push_str(&format!("{word}  {:<17} {}\n", i.name, i.detail));
    }
    let missing: Vec<&str> = report
        .items
        .iter()
        .filter(|i| required(i))
        .map(|i| i.name)
        .collect();
    if report.ready {
        out.push_str("\nready: sessions can start here");
    } else {
        out.push_str(&format!("\nnot ready: {} missing", missing.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests;
