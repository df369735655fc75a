//! Installs go to a venv ferrepl keeps for the workspace in its state
//! directory, outside the workspace. With a plain interpreter it works on
//! first use: made inside the sandbox, it sees the interpreter's own
//! packages, is shared by shell jobs, survives a restart. Over the user's
//! venv (a workspace `.venv`, `--venv`), which sessions only read: the
//! user's packages import, what is installed lands in the kept layer and
//! wins, the user's venv stays byte for byte the same, and the host's own
//! interpreter never runs what the sandbox planted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::{Launch, StdioServer, ToolOutput, path_str, real_python3};

struct Place {
    workspace: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Place {
    fn new() -> Self {
        Place {
            workspace: tempfile::tempdir().expect("workspace"),
            state: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state dir"),
        }
    }

    async fn server(&self, extra: &[&str]) -> StdioServer {
        let python = real_python3();
        let mut args = vec![
            "--workdir",
            path_str(self.workspace.path()),
            "--state-dir",
            path_str(self.state.path()),
            "--python",
            path_str(&python),
        ];
        args.extend_from_slice(extra);
        let launch = Launch::new(&args).without_workdir_flag();
        StdioServer::launch(launch).await
    }

    fn workspace(&self) -> PathBuf {
        self.workspace
            .path()
            .canonicalize()
            .expect("canonical workspace")
    }
}

fn value(out: &ToolOutput) -> String {
    out.value()
        .unwrap_or_else(|| panic!("no value in {out:#?}"))
        .trim_matches(['\'', '"'])
        .to_string()
}

#[tokio::test]
async fn a_plain_interpreter_installs_on_first_use_into_a_venv_kept_outside_the_workspace() {
    let place = Place::new();
    let server = place.server(&[]).await;
    // The first call installs: the venv is made for it if no interpreter
    // started yet.
    let file = wheel(&place.workspace(), "kept_pkg");
    let out = server
        .call(
            "python_install",
            json!({ "packages": [file], "wait_s": 120 }),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert_eq!(out.structured["exit_code"], 0, "{out:#?}");
    // A short result: what was installed; the log is one call away.
    assert!(out.text.contains("Installed kept-pkg 1.0 in "), "{out:#?}");
    assert!(!out.text.contains("Processing"), "{out:#?}");
    let job = out.str_field("job").to_string();
    let log = server.call("python_output", json!({ "job": job })).await;
    assert!(
        !log.is_error && log.text.contains("Successfully installed kept-pkg-1.0"),
        "{log:#?}"
    );

    let out = server.exec("import sys\nsys.prefix").await;
    out.assert_ok();
    let prefix = PathBuf::from(value(&out));
    let state = place.state.path().canonicalize().expect("state dir");
    assert!(
        prefix.starts_with(state.join("venvs")),
        "the session runs the kept venv, not {prefix:?}"
    );
    assert!(!prefix.starts_with(place.workspace()), "{prefix:?}");
    assert!(prefix.join("pyvenv.cfg").is_file(), "{prefix:?}");
    // The interpreter's own packages stay importable (pip is one).
    server.exec("import pip").await.assert_ok();

    let out = server.exec("import kept_pkg\nkept_pkg.VALUE").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("7"));
    // Shell jobs run the same venv.
    let out = server
        .call(
            "shell_exec",
            json!({ "command": "python -c 'import kept_pkg, sys; print(kept_pkg.VALUE, sys.prefix)'", "wait_s": 60 }),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert!(
        out.text.contains(&format!("7 {}", prefix.display())),
        "{out:#?}"
    );
    server.close_and_wait().await;

    // After a restart the stored session comes back on the same venv, with
    // what was installed.
    let server = place.server(&[]).await;
    let out = server
        .exec("import kept_pkg, sys\n(kept_pkg.VALUE, sys.prefix)")
        .await;
    out.assert_ok();
    let shown = out.value().expect("a value").to_string();
    assert!(
        shown.contains('7') && shown.contains(path_str(&prefix)),
        "{out:#?}"
    );
}

#[tokio::test]
async fn without_a_state_dir_an_install_into_a_plain_interpreter_fails_as_an_error() {
    // Sessions not kept (--resume off): no venv either; an install into the
    // plain interpreter is refused, as an error that says what to do.
    let other = Place::new();
    let server = other.server(&["--resume", "off"]).await;
    let file = wheel(&other.workspace(), "lost_pkg");
    let out = server
        .call(
            "python_install",
            json!({ "packages": [file], "wait_s": 120 }),
        )
        .await;
    assert!(out.is_error, "{out:#?}");
    assert!(out.text.contains("without --resume off"), "{out:#?}");
}

// ------------------------------------------------------ the user's venv

/// The user's venv as the host sees it: made with the real interpreter
/// (with pip), holding a package of the user's (`user_pkg`, VALUE 'user'),
/// `dual_pkg` 1.0 (VALUE 1, with its dist-info, as an installer leaves it)
/// and an editable install's `.pth` naming a source directory.
struct UserVenv {
    dir: PathBuf,
    site: PathBuf,
}

impl UserVenv {
    fn make(dir: &Path, editable_src: &Path) -> Self {
        let status = std::process::Command::new(real_python3())
            .args(["-m", "venv"])
            .arg(dir)
            .status()
            .expect("make a venv");
        assert!(status.success(), "python3 -m venv {}", dir.display());
        let out = std::process::Command::new(dir.join("bin/python"))
            .args([
                "-I",
                "-B",
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ])
            .output()
            .expect("the venv's site-packages");
        let site = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(site.is_dir(), "{site:?}");
        let write = |rel: &str, text: &str| {
            let path = site.join(rel);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(&path, text).expect("write into the user's venv");
        };
        write("user_pkg/__init__.py", "VALUE = 'user'\n");
        write("dual_pkg/__init__.py", "VALUE = 1\n");
        write(
            "dual_pkg-1.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: dual_pkg\nVersion: 1.0\n",
        );
        write("dual_pkg-1.0.dist-info/INSTALLER", "pip\n");
        write(
            "dual_pkg-1.0.dist-info/RECORD",
            "dual_pkg/__init__.py,,\ndual_pkg-1.0.dist-info/METADATA,,\n",
        );
        std::fs::create_dir_all(editable_src).expect("editable source");
        std::fs::write(
            editable_src.join("user_editable.py"),
            "VALUE = 'editable'\n",
        )
        .expect("editable module");
        write(
            "__editable__.user_editable-0.1.pth",
            &format!("{}\n", editable_src.display()),
        );
        UserVenv {
            dir: dir.to_path_buf(),
            site,
        }
    }

    /// Every entry beneath the venv: its kind, mode, and contents or
    /// link target.
    fn snapshot(&self) -> BTreeMap<PathBuf, (String, u32, Vec<u8>)> {
        use std::os::unix::fs::PermissionsExt;
        let mut out = BTreeMap::new();
        let mut todo = vec![self.dir.clone()];
        while let Some(dir) = todo.pop() {
            for entry in std::fs::read_dir(&dir).expect("list the user's venv") {
                let path = entry.expect("an entry").path();
                let meta = std::fs::symlink_metadata(&path).expect("metadata");
                let mode = meta.permissions().mode();
                let (kind, body) = if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(&path).expect("link");
                    ("link", target.into_os_string().into_encoded_bytes())
                } else if meta.is_dir() {
                    todo.push(path.clone());
                    ("dir", Vec::new())
                } else {
                    ("file", std::fs::read(&path).expect("read"))
                };
                out.insert(path, (kind.to_string(), mode, body));
            }
        }
        out
    }

    /// The host's own interpreter of the venv, unsandboxed, started as the
    /// user or an editor would; whether a `.pth` planted in the kept venv
    /// ran (it writes the marker file it is told of).
    fn host_runs_planted_pth(&self, marker: &Path) -> bool {
        let status = std::process::Command::new(self.dir.join("bin/python"))
            .args(["-c", "pass"])
            .env("FERREPL_TEST_PTH_MARKER", marker)
            .status()
            .expect("the host's python");
        assert!(status.success());
        marker.exists()
    }
}

/// A `.pth` that writes "ran" to the file FERREPL_TEST_PTH_MARKER names,
/// whenever an interpreter whose site-packages holds it starts.
const PLANTED_PTH: &str =
    "import os; p = os.environ.get('FERREPL_TEST_PTH_MARKER'); p and open(p, 'a').write('ran')\n";

/// The kept venv's directory a session shows (`sys.prefix`), checked to
/// lie in the state directory.
async fn kept_prefix(server: &StdioServer, place: &Place) -> PathBuf {
    let out = server.exec("import sys\nsys.prefix").await;
    out.assert_ok();
    let prefix = PathBuf::from(value(&out));
    let state = place.state.path().canonicalize().expect("state dir");
    assert!(
        prefix.starts_with(state.join("venvs")),
        "the session runs the kept venv, not {prefix:?}"
    );
    prefix
}

/// What a cell gets writing a `.pth` into the user's site-packages: the
/// errno's name, or "written".
async fn plant_in(server: &StdioServer, site: &Path) -> String {
    let code = format!(
        "import errno\ntry:\n    open({:?}, 'w').write('import os\\n')\n    r = 'written'\nexcept OSError as e:\n    r = errno.errorcode[e.errno]\nr",
        path_str(&site.join("evil.pth"))
    );
    let out = server.exec(&code).await;
    out.assert_ok();
    value(&out)
}

/// python_install of `file` (in the workspace), finished.
async fn install(server: &StdioServer, file: &str) -> ToolOutput {
    let out = server
        .call(
            "python_install",
            json!({ "packages": [file], "wait_s": 240 }),
        )
        .await;
    assert!(!out.is_error, "{out:#?}");
    assert_eq!(out.structured["exit_code"], 0, "{out:#?}");
    out
}

/// A shell job's combined output, finished.
async fn shell(server: &StdioServer, command: &str) -> String {
    let out = server
        .call("shell_exec", json!({ "command": command, "wait_s": 60 }))
        .await;
    assert!(!out.is_error, "{command}: {out:#?}");
    out.text
}

#[tokio::test]
async fn a_workspace_venv_is_read_only_and_installs_go_to_a_kept_venv_layered_over_it() {
    let place = Place::new();
    let workspace = place.workspace();
    let user = UserVenv::make(&workspace.join(".venv"), &workspace.join("src"));
    let before = user.snapshot();
    // A workspace .venv is found only without --python naming another.
    let args = [
        "--workdir",
        path_str(&workspace),
        "--state-dir",
        path_str(place.state.path()),
    ];
    let server = StdioServer::launch(Launch::new(&args).without_workdir_flag()).await;

    // (a) Sessions run a kept venv, and the user's packages (the editable
    // one too) import there.
    let prefix = kept_prefix(&server, &place).await;
    let out = server
        .exec("import sys, user_pkg, user_editable\n(user_pkg.VALUE, user_editable.VALUE, sys.base_prefix != sys.prefix)")
        .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("('user', 'editable', True)"), "{out:#?}");
    // Before any install the user's dual_pkg is the one seen.
    assert!(
        shell(
            &server,
            "python -c 'import dual_pkg; print(\"dual\", dual_pkg.VALUE)'"
        )
        .await
        .contains("dual 1"),
    );

    // (b) An install of a wheel that ships a .pth: into the kept venv.
    let planted = crate::support::wheel_with_files(
        &workspace,
        "planted_pkg",
        "1.0",
        7,
        &[("planted_marker.pth", PLANTED_PTH)],
    );
    install(&server, "planted_pkg-1.0-py3-none-any.whl").await;
    std::fs::remove_file(&planted).expect("remove the wheel");
    let out = server
        .exec("import planted_pkg\n(planted_pkg.VALUE, planted_pkg.__file__)")
        .await;
    out.assert_ok();
    let shown = out.value().expect("a value");
    assert!(
        shown.starts_with("(7, ") && shown.contains(path_str(&prefix)),
        "{out:#?}"
    );
    // The planted .pth is live in the kept venv: a new interpreter in the
    // sandbox runs it...
    let ran = shell(
        &server,
        "FERREPL_TEST_PTH_MARKER=$PWD/pth-ran python -c pass; cat pth-ran",
    )
    .await;
    assert!(ran.contains("ran"), "{ran}");

    // (d) A package in both: the kept layer's version wins.
    pure_wheel_named(&workspace, "dual_pkg", "2.0", 2);
    install(&server, "dual_pkg-2.0-py3-none-any.whl").await;
    let out = server
        .exec("import dual_pkg\n(dual_pkg.VALUE, dual_pkg.__file__)")
        .await;
    out.assert_ok();
    let shown = out.value().expect("a value");
    assert!(
        shown.starts_with("(2, ") && shown.contains(path_str(&prefix)),
        "{out:#?}"
    );

    // (e) Shell jobs run the kept venv, the user's bin next, and see both
    // layers.
    let text = shell(
        &server,
        "command -v python; python -c 'import sys, user_pkg, dual_pkg; print(sys.prefix, user_pkg.VALUE, dual_pkg.VALUE)'; echo \"venv=$VIRTUAL_ENV\"; echo \"path=$PATH\"",
    )
    .await;
    let bin = prefix.join("bin");
    assert!(
        text.contains(&format!("{}\n", bin.join("python").display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} user 2", prefix.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("venv={}\n", prefix.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "path={}:{}:",
            bin.display(),
            user.dir.join("bin").display()
        )),
        "{text}"
    );

    // (c) A cell cannot write into the user's venv.
    assert_eq!(plant_in(&server, &user.site).await, "EROFS");
    server.close_and_wait().await;

    // The user's venv is byte for byte what it was, and the host's own
    // interpreter runs nothing the sandbox planted.
    assert!(before == user.snapshot(), "the user's venv changed");
    assert!(!user.site.join("evil.pth").exists());
    let marker = place.state.path().join("host-marker");
    assert!(
        !user.host_runs_planted_pth(&marker),
        "the host's interpreter ran the planted .pth"
    );
    // Control: the kept venv's interpreter runs it (the marker works).
    let status = std::process::Command::new(prefix.join("bin/python"))
        .args(["-c", "pass"])
        .env("FERREPL_TEST_PTH_MARKER", &marker)
        .status()
        .expect("the kept venv's python");
    assert!(status.success() && marker.exists());
}

#[tokio::test]
async fn a_venv_flag_is_read_only_and_installs_go_to_a_kept_venv_layered_over_it() {
    let place = Place::new();
    let outside = tempfile::tempdir().expect("a place for --venv");
    let outside = outside.path().canonicalize().expect("canonical");
    // The editable install's source is the project's, in the workspace
    // (one outside every path sessions see would not import there).
    let user = UserVenv::make(&outside.join("env"), &place.workspace().join("src"));
    let before = user.snapshot();
    let server = place.server(&["--venv", path_str(&user.dir)]).await;

    let prefix = kept_prefix(&server, &place).await;
    let out = server
        .exec("import user_pkg, user_editable\n(user_pkg.VALUE, user_editable.VALUE)")
        .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("('user', 'editable')"), "{out:#?}");
    // (dual_pkg in a new interpreter: one imported here would stay.)
    assert!(
        shell(
            &server,
            "python -c 'import dual_pkg; print(\"dual\", dual_pkg.VALUE)'"
        )
        .await
        .contains("dual 1"),
    );

    crate::support::wheel_with_files(
        &place.workspace(),
        "planted_pkg",
        "1.0",
        7,
        &[("planted_marker.pth", PLANTED_PTH)],
    );
    install(&server, "planted_pkg-1.0-py3-none-any.whl").await;
    pure_wheel_named(&place.workspace(), "dual_pkg", "2.0", 2);
    install(&server, "dual_pkg-2.0-py3-none-any.whl").await;
    let out = server
        .exec("import planted_pkg, dual_pkg\n(planted_pkg.VALUE, dual_pkg.VALUE)")
        .await;
    out.assert_ok();
    assert_eq!(out.value(), Some("(7, 2)"), "{out:#?}");

    let text = shell(
        &server,
        "command -v python; python -c 'import sys, user_pkg; print(sys.prefix, user_pkg.VALUE)'",
    )
    .await;
    assert!(
        text.contains(&format!("{}\n", prefix.join("bin/python").display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} user", prefix.display())),
        "{text}"
    );
    // Outside the workspace, the user's venv is in the view read-only.
    assert_eq!(plant_in(&server, &user.site).await, "EROFS");
    server.close_and_wait().await;

    assert!(before == user.snapshot(), "the user's venv changed");
    let marker = place.state.path().join("host-marker");
    assert!(
        !user.host_runs_planted_pth(&marker),
        "the host's interpreter ran the planted .pth"
    );
}

#[tokio::test]
async fn without_a_state_dir_an_install_into_the_users_venv_is_refused() {
    let place = Place::new();
    let workspace = place.workspace();
    let user = UserVenv::make(&workspace.join(".venv"), &workspace.join("src"));
    let before = user.snapshot();
    let args = ["--workdir", path_str(&workspace), "--resume", "off"];
    let server = StdioServer::launch(Launch::new(&args).without_workdir_flag()).await;
    // Sessions run the user's venv itself, read-only.
    let out = server
        .exec("import sys, user_pkg\n(sys.prefix, user_pkg.VALUE)")
        .await;
    out.assert_ok();
    assert_eq!(
        out.value().map(str::to_string),
        Some(format!("('{}', 'user')", user.dir.display())),
        "{out:#?}"
    );
    let file = wheel(&workspace, "refused_pkg");
    let out = server
        .call(
            "python_install",
            json!({ "packages": [file], "wait_s": 120 }),
        )
        .await;
    assert!(out.is_error, "{out:#?}");
    assert!(
        out.text.contains("is read-only to sessions") && out.text.contains("--resume off"),
        "{out:#?}"
    );
    server.close_and_wait().await;
    assert!(before == user.snapshot(), "the user's venv changed");
}

#[tokio::test]
async fn a_venv_flag_in_the_workspace_under_another_name_is_protected_like_dot_venv() {
    let place = Place::new();
    // Made by the server at start (the operator's act), inside the
    // workspace, not named .venv.
    let server = place.server(&["--venv", "env"]).await;
    let env = place.workspace().join("env");
    let out = std::process::Command::new(env.join("bin/python"))
        .args([
            "-I",
            "-B",
            "-c",
            "import sysconfig; print(sysconfig.get_path('purelib'))",
        ])
        .output()
        .expect("the venv's site-packages");
    let site = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(site.starts_with(&env), "{site:?}");
    kept_prefix(&server, &place).await;
    assert_eq!(plant_in(&server, &site).await, "EROFS");
    // A shell job neither (the refusal names the place).
    let text = shell(&server, "touch env/bin/evil; echo rc=$?").await;
    assert!(
        text.contains("rc=1") && text.contains(&format!("{} is protected", env.display())),
        "{text}"
    );
    server.close_and_wait().await;
    assert!(!site.join("evil.pth").exists() && !env.join("bin/evil").exists());
}

/// A plain wheel `name` (VALUE = `value`) in `dir`.
fn pure_wheel_named(dir: &Path, name: &str, version: &str, value: i64) {
    crate::support::pure_wheel(dir, name, version, value);
}

/// A wheel of package `name` (VALUE = 7) in `dir`; its file name.
fn wheel(dir: &Path, name: &str) -> String {
    let built = crate::support::pure_wheel(dir, name, "1.0", 7);
    built
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .expect("a file name")
}
