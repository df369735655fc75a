//! Kernel sessions of two tenants of one server: each kernel runs as its
//! tenant's uid (a root server's; an unprivileged one's are all its own) in
//! its tenant's workspace, and one tenant's kernel reaches nothing of the
//! other's (connection file, sockets, workspace, index entry). `ferrepl
//! attach` refuses to guess between them, and finds each by `--tenant`, by
//! `--workdir` or from inside its workspace; a `--tenant` that names no
//! tenant (a path, another server's) finds nothing.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};

use super::{assert_attacks_failed, attack_code, jupyter_path};
use crate::support::{
    HttpServer, Launch, ToolOutput, call, host_pid_in_namespace, is_root, own_uid, path_str,
    server_binary,
};

const ALPHA: &str = "kernels-alpha-token-0123456789abcdef";
const BETA: &str = "kernels-beta-token-0123456789abcdef0";

/// What a tenant's kernel says of itself.
struct Seen {
    uid: u32,
    host_pid: u32,
    cwd: String,
    home: String,
}

/// Creates session `k` on python3 for `peer`'s tenant, and asks its kernel
/// who and where it is.
async fn kernel_of(peer: &Peer<RoleClient>) -> Seen {
    let created = call(
        peer,
        "python_sessions",
        json!({"action": "create", "session": "k", "kernel": "python3"}),
    )
    .await;
    assert!(!created.is_error, "{created:#?}");
    let out = cell(
        peer,
        "import json, os\n\
         print('SEEN', json.dumps([os.getuid(), os.readlink('/proc/self/ns/pid'), os.getpid(), os.getcwd(), os.environ['HOME']]))",
    )
    .await;
    out.assert_ok();
    let line = out
        .str_field("stdout")
        .lines()
        .find_map(|l| l.strip_prefix("SEEN "))
        .unwrap_or_else(|| panic!("no SEEN line: {out:#?}"))
        .to_string();
    let v: Vec<Value> = serde_json::from_str(&line).expect("the SEEN line is JSON");
    let text = |i: usize| v[i].as_str().expect("a string").to_string();
    Seen {
        uid: v[0].as_u64().expect("a uid") as u32,
        host_pid: host_pid_in_namespace(&text(1), v[2].as_u64().expect("a pid") as u32),
        cwd: text(3),
        home: text(4),
    }
}

async fn cell(peer: &Peer<RoleClient>, code: &str) -> ToolOutput {
    call(
        peer,
        "python_exec",
        json!({"session": "k", "code": code, "wait_s": 60}),
    )
    .await
}

/// The real uid of host process `pid`.
fn host_uid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no Uid line in /proc/{pid}/status:\n{status}"))
}

/// `ferrepl attach ARGS` run in `cwd` with the servers' runtime directory.
fn attach(runtime: &Path, cwd: &Path, args: &[&str]) -> Output {
    std::process::Command::new(server_binary())
        .arg("attach")
        .args(args)
        .current_dir(cwd)
        .env("XDG_RUNTIME_DIR", runtime)
        .output()
        .expect("run ferrepl attach")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The connection file `attach --print` found, and where its kernel's
/// sockets are (`ip`, `<home>/k`).
fn found(out: &Output) -> (PathBuf, String) {
    assert!(out.status.success(), "{}", text(out));
    let file = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("read the connection file"))
            .expect("a connection file");
    (file, info["ip"].as_str().unwrap_or_default().to_string())
}

#[tokio::test]
async fn each_tenants_kernel_is_its_own_and_attach_picks_the_tenant() {
    let runtime = tempfile::tempdir().expect("runtime dir");
    let tokens_dir = tempfile::tempdir().expect("tokens dir");
    let tokens = tokens_dir.path().join("tokens");
    std::fs::write(&tokens, format!("{ALPHA} alpha\n{BETA} beta\n")).expect("write tokens");
    // Unprivileged, tenants share the server's uid: accepted here, as the
    // kernels' isolation is what is tested (escape::uids tests that gap).
    let launch = Launch::new(&[
        "--auth-token-file",
        path_str(&tokens),
        "--kernels",
        "python3",
        "--warm-pool",
        "0",
        "--allow-degraded-isolation",
    ])
    .env("JUPYTER_PATH", jupyter_path())
    .env("XDG_RUNTIME_DIR", runtime.path());
    let server = HttpServer::launch(launch).await;
    let root = server.workdir.path().canonicalize().expect("canonical");
    let alpha = server.connect_at("/mcp", ALPHA).await;
    let beta = server.connect_at("/mcp", BETA).await;
    let a = kernel_of(alpha.peer()).await;
    let b = kernel_of(beta.peer()).await;

    // Each in its own workspace, as its own uid.
    assert_eq!(Path::new(&a.cwd), root.join("alpha"));
    assert_eq!(Path::new(&b.cwd), root.join("beta"));
    let (ua, ub) = (host_uid(a.host_pid), host_uid(b.host_pid));
    if is_root() {
        assert!(ua != 0 && ub != 0 && ua != ub, "kernels' uids {ua}, {ub}");
        let owner = |t: &str| std::fs::metadata(root.join(t)).expect("workspace").uid();
        assert_eq!((owner("alpha"), owner("beta")), (ua, ub));
    } else {
        assert_eq!((ua, ub), (own_uid(), own_uid()));
    }
    assert_eq!(a.uid == b.uid, ua == ub, "inside: {} and {}", a.uid, b.uid);

    // Beta's kernel reaches nothing of alpha's: its key, sockets, home,
    // workspace, nor the index of either.
    let planted = Path::new(&a.home)
        .parent()
        .expect("alpha's runtime directory")
        .join("attach/planted.json");
    let out = cell(beta.peer(), &attack_code(&a.home)).await;
    assert_attacks_failed(&out, &planted);
    let beta_planted = Path::new(&b.home)
        .parent()
        .expect("beta's runtime directory")
        .join("attach/planted.json");
    assert!(!beta_planted.exists(), "{}", beta_planted.display());
    let into_alpha = format!(
        "try:\n    open({:?}, 'w').write('beta'); print('WROTE')\nexcept OSError as e: print('REFUSED', e)",
        root.join("alpha/from-beta").display().to_string()
    );
    let out = cell(beta.peer(), &into_alpha).await;
    assert!(out.str_field("stdout").contains("REFUSED"), "{out:#?}");
    assert!(!root.join("alpha/from-beta").exists());

    // Attach: between two tenants' `k` it does not guess.
    let nowhere = tempfile::tempdir().expect("tempdir");
    let out = attach(runtime.path(), nowhere.path(), &["k", "--print"]);
    assert!(!out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("several tenants of one server have a kernel session named 'k'")
            && said.contains("--tenant NAME")
            && said.contains(&format!("{} (tenant alpha", root.join("alpha").display()))
            && said.contains(&format!("{} (tenant beta", root.join("beta").display())),
        "{said}"
    );
    // Each found by its tenant, its workspace, or from inside it.
    let alpha_sockets = format!("{}/k", a.home);
    let beta_sockets = format!("{}/k", b.home);
    let beta_ws = root.join("beta").display().to_string();
    for (args, cwd, sockets, tenant) in [
        (
            vec!["--tenant", "alpha"],
            nowhere.path(),
            &alpha_sockets,
            "alpha",
        ),
        (
            vec!["--tenant", "beta"],
            nowhere.path(),
            &beta_sockets,
            "beta",
        ),
        (
            vec!["--workdir", beta_ws.as_str()],
            nowhere.path(),
            &beta_sockets,
            "beta",
        ),
        (
            vec![],
            root.join("alpha").as_path(),
            &alpha_sockets,
            "alpha",
        ),
    ] {
        let mut all = vec!["k", "--print"];
        all.extend(args.iter().copied());
        let (file, ip) = found(&attach(runtime.path(), cwd, &all));
        assert_eq!(&ip, sockets, "{args:?}");
        assert!(
            file.ends_with(format!("tenants/{tenant}/attach/k.json")),
            "{}",
            file.display()
        );
    }
    // A --tenant that is no tenant's name finds nothing.
    for bad in ["gamma", "../beta", "beta/..", "alpha/../beta", ""] {
        let out = attach(
            runtime.path(),
            nowhere.path(),
            &["k", "--print", "--tenant", bad],
        );
        assert!(!out.status.success(), "{bad}: {}", text(&out));
        assert!(
            text(&out).contains(&format!(
                "no running kernel session named 'k' in tenant '{bad}' of this user's servers"
            )),
            "{bad}: {}",
            text(&out)
        );
    }
}
