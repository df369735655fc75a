//! Sessions on Jupyter kernels (--kernels) under attack: the kernel (Python,
//! bash, R), whatever it runs, writes only the workspace, reaches no
//! network, holds no capability, and sees neither another session's kernel
//! files (its connection file with the key, its sockets) nor the server's
//! index `ferrepl attach` reads. `tenants.rs`: the same across tenants, each
//! kernel as its tenant's uid in its tenant's workspace, and attach picking
//! the tenant. Run as root and, by `scripts/escape-unprivileged.sh`, as an
//! ordinary user, with the test environment's `kernels` venv (the script
//! gives that user a copy it can reach).

mod tenants;

use std::path::PathBuf;

use serde_json::json;

use super::privileges::privilege_problems;
use crate::support::{Launch, StdioServer, ToolOutput, kernels};

/// The `kernels` venv's Jupyter data directory (python3, bash, ir).
fn jupyter_path() -> PathBuf {
    kernels::jupyter_path("kernels", "python3")
}

/// A server offering the `kernels` venv's kernels (`args` name them), with
/// a session `k` on `kernel`.
async fn kernel_server(args: &[&str], kernel: &str) -> StdioServer {
    let launch = Launch::new(args).env("JUPYTER_PATH", jupyter_path());
    kernels::with_kernel_session(launch, "k", kernel).await
}

/// Python code that tries, from a kernel, what a session must not do, and
/// prints `FOUND [...]` (what succeeded), its own and an exec'd program's
/// capability lines (`kernel Cap...`, `exec Cap...`) and `HOME [...]`
/// (what its own home holds). `other_home` is another kernel's home.
pub(super) fn attack_code(other_home: &str) -> String {
    format!(
        "import os, socket, subprocess\n\
        found = []\n\
        try:\n    open('/etc/owned', 'w'); found.append('wrote /etc')\nexcept OSError: pass\n\
        try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); found.append('network')\nexcept OSError: pass\n\
        try:\n    open({other_home:?} + '/connection.json').read(); found.append('read the key')\nexcept OSError: pass\n\
        try:\n    found.append(('listed its home', os.listdir({other_home:?})))\nexcept OSError: pass\n\
        s = socket.socket(socket.AF_UNIX)\n\
        try:\n    s.connect({other_home:?} + '/k-1'); found.append('reached its shell')\nexcept OSError: pass\n\
        index = os.path.join(os.path.dirname(os.environ['HOME']), 'attach')\n\
        try:\n    found.append(('listed the index', os.listdir(index)))\nexcept OSError: pass\n\
        try:\n    os.makedirs(index, exist_ok=True); open(index + '/planted.json', 'w').write('{{}}'); found.append('planted an entry')\nexcept OSError: pass\n\
        for family, kind, proto in [(socket.AF_NETLINK, socket.SOCK_RAW, 9), (socket.AF_PACKET, socket.SOCK_RAW, 0)]:\n    try:\n        socket.socket(family, kind, proto); found.append('made a %d socket' % family)\n    except OSError: pass\n\
        caps = lambda text: [l for l in text.splitlines() if l.startswith(('Cap', 'NoNewPrivs'))]\n\
        for l in caps(open('/proc/self/status').read()): print('kernel', l)\n\
        for l in caps(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout): print('exec', l)\n\
        print('FOUND', found)\n\
        print('HOME', sorted(os.listdir(os.environ['HOME'])))"
    )
}

/// Panics unless `out` (of `attack_code`) says every attempt failed and
/// the kernel held no capability; `planted` is where the index entry it
/// tried to plant would be on the host.
pub(super) fn assert_attacks_failed(out: &ToolOutput, planted: &std::path::Path) {
    out.assert_ok();
    let stdout = out.str_field("stdout");
    assert!(stdout.contains("FOUND []"), "{out:#?}");
    assert!(
        stdout.contains("HOME [") && stdout.contains("connection.json"),
        "its own connection file: {out:#?}"
    );
    let mut problems = privilege_problems(stdout, "kernel");
    problems.extend(privilege_problems(stdout, "exec"));
    assert!(problems.is_empty(), "{problems:#?}\n{stdout}");
    assert!(!planted.exists(), "{} was planted", planted.display());
}

/// The HOME of session `session`'s kernel.
pub(super) fn home_of(out: &ToolOutput) -> String {
    out.value().expect("HOME").trim_matches('\'').to_string()
}

#[tokio::test]
async fn a_python_kernel_stays_in_its_sandbox_and_out_of_other_kernels() {
    let server = kernel_server(&["--kernels", "python3"], "python3").await;
    let other = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "k2", "kernel": "python3"}),
        )
        .await;
    assert!(!other.is_error, "{other:#?}");
    let other_home = home_of(
        &kernels::kernel_cell(
            &server,
            "python_exec",
            "k2",
            "import os; os.environ['HOME']",
        )
        .await,
    );
    let own_home = home_of(
        &kernels::kernel_cell(&server, "python_exec", "k", "import os; os.environ['HOME']").await,
    );
    let planted = PathBuf::from(&own_home)
        .parent()
        .expect("the runtime directory")
        .join("attach/planted.json");
    let out = kernels::kernel_cell(&server, "python_exec", "k", &attack_code(&other_home)).await;
    assert_attacks_failed(&out, &planted);
    // It writes its workspace.
    let out = kernels::kernel_cell(
        &server,
        "python_exec",
        "k",
        "open('inside', 'w').write('x')",
    )
    .await;
    out.assert_ok();
    assert!(server.workdir.path().join("inside").is_file());
}

#[tokio::test]
async fn the_bash_kernel_writes_only_the_workspace_and_reaches_no_network() {
    let server = kernel_server(&["--kernels", "bash", "--tools", "all"], "bash").await;
    let bash = |code: &'static str| kernels::kernel_cell(&server, "kernel_exec", "k", code);
    let out = bash("echo kept > in-workspace.txt && cat in-workspace.txt").await;
    out.assert_ok();
    assert!(out.str_field("stdout").contains("kept"), "{out:#?}");
    // Outside the workspace it writes nothing, and it reaches no network
    // (bash's own /dev/tcp: no program needed); it holds no capability.
    let out = bash(
        "touch /etc/owned 2>/dev/null && echo wrote-etc; \
         (exec 3<>/dev/tcp/1.1.1.1/53) 2>/dev/null && echo reached-network; \
         grep -E '^(Cap|NoNewPrivs)' /proc/$$/status | sed 's/^/shell /'; \
         echo checked",
    )
    .await;
    out.assert_ok();
    let stdout = out.str_field("stdout");
    assert!(stdout.contains("checked"), "{out:#?}");
    assert!(
        !stdout.contains("wrote-etc") && !stdout.contains("reached-network"),
        "{out:#?}"
    );
    let problems = privilege_problems(stdout, "shell");
    assert!(problems.is_empty(), "{problems:#?}\n{stdout}");
}

#[tokio::test]
async fn the_r_kernel_writes_only_the_workspace_and_reaches_no_network() {
    let server = kernel_server(&["--kernels", "ir", "--languages", "python,r"], "ir").await;
    let code = "wrote <- suppressWarnings(file.create('/etc/owned'))\n\
        reached <- tryCatch({close(socketConnection('1.1.1.1', 53, timeout = 2)); TRUE},\n\
        error = function(e) FALSE, warning = function(w) FALSE)\n\
        cat(wrote, reached, file.create('inside'))";
    let out = kernels::kernel_cell(&server, "r_exec", "k", code).await;
    out.assert_ok();
    assert_eq!(out.str_field("stdout"), "FALSE FALSE TRUE", "{out:#?}");
    assert!(server.workdir.path().join("inside").is_file());
}
