//! The entries `ferrepl install --scope project` writes into protected
//! places (`.mcp.json`, `.codex/config.toml`) stay byte for byte whatever a
//! cell or a shell job does to them (rewritten in place, atomically, with
//! sed).

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::escape::view::cell;
use crate::support::{job_python, path_str, server_binary};

use super::attacks::*;
use super::*;

/// `ferrepl install --client claude-code,codex --scope project` for `ws`,
/// with a home of its own. install refuses to name a binary in a temporary
/// directory (scripts/escape-unprivileged.sh runs a copy in /tmp): then a
/// copy outside one is installed instead.
fn project_install(ws: &Path, home: &Path) {
    let run = |binary: &Path| {
        let mut tries = 0;
        loop {
            let out = Command::new(binary)
                .args([
                    "install",
                    "--client",
                    "claude-code,codex",
                    "--scope",
                    "project",
                ])
                .arg("--workdir")
                .arg(ws)
                .env("HOME", home)
                .env_remove("XDG_CONFIG_HOME")
                .env_remove("CODEX_HOME")
                .env_remove("UV")
                .current_dir(home)
                .output();
            match out {
                // Just written (the copy): another test thread may hold it
                // open for a moment.
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other.expect("run ferrepl install"),
            }
        }
    };
    let said = |out: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let mut out = run(server_binary());
    let _copy;
    if !out.status.success() && said(&out).contains("in the temporary directory") {
        let dir = crate::support::visible_outside_dir();
        let copy = dir.path().join("ferrepl");
        std::fs::hard_link(server_binary(), &copy)
            .or_else(|_| std::fs::copy(server_binary(), &copy).map(drop))
            .expect("copy ferrepl outside the temporary directory");
        out = run(&copy);
        _copy = dir;
    }
    assert!(
        out.status.success(),
        "ferrepl install failed: {}",
        said(&out)
    );
}

#[tokio::test]
async fn a_project_install_stays_byte_for_byte() {
    let place = Place::new();
    let ws = &place.ws;
    let home = place.beside("home");
    project_install(ws, &home);
    let files = [".mcp.json", ".codex/config.toml"];
    for f in files {
        let text = std::fs::read_to_string(ws.join(f)).unwrap_or_default();
        assert!(
            text.contains("--workdir") && text.contains(path_str(ws)),
            "install wrote no entry for this workspace in {f}: {text}"
        );
    }
    let before = tree(ws);
    let server = serve(ws, &[]).await;

    // A cell that rewrites the entries the way a program would: parsed,
    // changed and written back (in place, or atomically through a temporary
    // file), besides every attack on the files and on .codex.
    let rewrite = r#"
def _edit_json():
    cfg = json.load(open(".mcp.json"))
    cfg["mcpServers"]["ferrepl"]["command"] = "/bin/sh"
    with open(".mcp.json", "w") as f:
        json.dump(cfg, f)
def _edit_json_atomically():
    cfg = json.load(open(".mcp.json"))
    cfg["mcpServers"]["evil"] = {"command": "/bin/sh", "args": ["-c", "id"]}
    tmp = _scratch("mcp")
    with open(tmp, "w") as f:
        json.dump(cfg, f)
    os.replace(tmp, ".mcp.json")
def _edit_toml():
    text = open(".codex/config.toml").read().replace("ferrepl", "evil")
    with open(".codex/config.toml", "w") as f:
        f.write(text)
attempt("edit-json", _edit_json)
attempt("edit-json-atomically", _edit_json_atomically)
attempt("edit-toml", _edit_toml)
"#;
    let out = cell(
        server.peer(),
        "default",
        &attack_cell(rewrite, &files, &[".codex"], &[]),
    )
    .await;
    let mut labels = attack_labels(&files, &[".codex"], &[]);
    labels.extend(
        ["edit-json", "edit-json-atomically", "edit-toml"]
            .iter()
            .map(|s| s.to_string()),
    );
    assert_all_refused(
        &out,
        &labels,
        ".mcp.json",
        "rewriting the installed entries",
    );

    let py = job_python();
    let attempts: Vec<(&str, String)> = vec![
        ("sed-i-mcp", "sed -i s/ferrepl/evil/ .mcp.json".into()),
        (
            "sed-i-codex",
            "sed -i s/ferrepl/evil/ .codex/config.toml".into(),
        ),
        ("cat-over", "echo '{}' > .mcp.json".into()),
        (
            "python-rewrite",
            format!(
                "{py} -c \"import json; c = json.load(open('.mcp.json')); json.dump(c, open('.mcp.json', 'w'))\""
            ),
        ),
        ("mv-codex", "mv .codex \"$S/codex\"".into()),
    ];
    for pty in [false, true] {
        let script = shell_script(if pty { "scratch/pty" } else { "scratch/pipes" }, &attempts);
        let out = shell(&server, &script, pty).await;
        assert_shell_refused(&out, &attempts, "rewriting the entries in a job");
    }

    let after = tree(ws);
    for f in files {
        assert_eq!(
            before.get(f),
            after.get(f),
            "{f} changed (byte for byte or its mode)"
        );
    }
    assert_eq!(before.get(".codex"), after.get(".codex"), ".codex changed");
}
