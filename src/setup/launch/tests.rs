//! Unit tests of launch.rs: the command written for each way ferrepl can
//! run, on fake layouts (uv's cache, cargo's target, temporary directories).
use super::*;

struct Layout {
    root: tempfile::TempDir,
}

impl Layout {
    fn new() -> Self {
        Layout {
            root: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// The canonical path of `rel`, made (empty) with its parents.
    fn file(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.root.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
        p.canonicalize().expect("canonical")
    }

    fn dir(&self, rel: &str) -> PathBuf {
        let p = self.root.path().join(rel);
        std::fs::create_dir_all(&p).expect("mkdir");
        p.canonicalize().expect("canonical")
    }

    /// ferrepl in an environment of a fake uv cache, recorded as installed
    /// from `direct_url` (none: from the index); uv and uvx in `uvbin/`.
    fn uv_env(&self, direct_url: Option<&str>) -> Context {
        self.file(
            "cache/CACHEDIR.TAG",
            "Signature: 8a477f597d28d172789f06886806bc55",
        );
        let env = "cache/archive-v0/Ab12/";
        let exe = self.file(&format!("{env}bin/ferrepl"), "");
        let dist = format!("{env}lib/python3.11/site-packages/ferrepl-0.1.0.dist-info/");
        self.file(&format!("{dist}RECORD"), "");
        if let Some(url) = direct_url {
            self.file(&format!("{dist}direct_url.json"), url);
        }
        self.file("uvbin/uvx", "");
        Context {
            exe,
            temp_dirs: vec![self.dir("tmp")],
            uv: Some(self.file("uvbin/uv", "")),
            path: None,
        }
    }

    fn uvx(&self) -> String {
        self.root
            .path()
            .join("uvbin/uvx")
            .canonicalize()
            .expect("uvx")
            .display()
            .to_string()
    }
}

fn file_url(path: &Path) -> String {
    let url = url::Url::from_file_path(path).expect("file URL");
    format!(r#"{{"url": "{url}", "archive_info": {{}}}}"#)
}

#[test]
fn uvx_from_the_index_writes_uvx_ferrepl_by_absolute_path() {
    let l = Layout::new();
    let got = decide(&l.uv_env(None)).expect("launch");
    assert_eq!((got.command, got.args), (l.uvx(), vec!["ferrepl".into()]));
    assert!(got.note.is_some_and(|n| n.contains("package index")));
}

#[test]
fn uvx_from_a_wheel_that_stays_writes_uvx_from_that_wheel() {
    let l = Layout::new();
    let wheel = l.file("dist/ferrepl-0.1.0-py3-none-any.whl", "wheel");
    let cx = l.uv_env(Some(&file_url(&wheel)));
    let got = decide(&cx).expect("launch");
    assert_eq!(got.command, l.uvx());
    assert_eq!(
        got.args,
        vec![
            "--from".to_string(),
            wheel.display().to_string(),
            "ferrepl".into()
        ]
    );
    // A wheel in cargo's target directory (scripts/wheel.sh) stays too.
    let built = l.file("target/wheels/ferrepl.whl", "wheel");
    l.file(
        "target/CACHEDIR.TAG",
        "# This file is a cache directory tag created by cargo.",
    );
    let cx = l.uv_env(Some(&file_url(&built)));
    assert_eq!(
        decide(&cx).expect("launch").args[1],
        built.display().to_string()
    );
}

#[test]
fn uvx_from_a_wheel_that_goes_away_is_refused_with_the_fix() {
    let l = Layout::new();
    let temp = l.file("tmp/x/ferrepl-0.1.0-py3-none-any.whl", "wheel");
    let cached = l.file("cache/wheels-v5/ferrepl.whl", "wheel");
    let gone = l.root.path().join("dist/gone.whl");
    for (wheel, why) in [
        (temp, "temporary directory"),
        (cached, "cache directory"),
        (gone, "no longer exists"),
    ] {
        let err = decide(&l.uv_env(Some(&file_url(&wheel)))).expect_err("refused");
        assert!(
            err.contains(why) && err.contains("uv tool install"),
            "{err}"
        );
    }
}

#[test]
fn uvx_from_a_url_or_a_repository_writes_it() {
    let l = Layout::new();
    let url = "https://example.com/ferrepl-0.1.0-py3-none-any.whl";
    let got = decide(&l.uv_env(Some(&format!(
        r#"{{"url": "{url}", "archive_info": {{}}}}"#
    ))))
    .expect("launch");
    assert_eq!(got.args, vec!["--from", url, "ferrepl"]);
    let vcs = r#"{"url": "https://example.com/ferrepl.git", "vcs_info": {"vcs": "git", "commit_id": "abc123"}}"#;
    let got = decide(&l.uv_env(Some(vcs))).expect("launch");
    assert_eq!(
        got.args,
        vec![
            "--from",
            "git+https://example.com/ferrepl.git@abc123",
            "ferrepl"
        ]
    );
}

#[test]
fn uvx_is_found_beside_uv_then_on_path() {
    let l = Layout::new();
    let mut cx = l.uv_env(None);
    // No uvx beside uv: uv's own `tool run`.
    std::fs::remove_file(l.root.path().join("uvbin/uvx")).expect("rm");
    let got = decide(&cx).expect("launch");
    let uv = cx.uv.clone().expect("uv");
    assert_eq!(got.command, uv.display().to_string());
    assert_eq!(got.args, vec!["tool", "run", "ferrepl"]);
    // Not started by uv: uvx on PATH.
    let on_path = l.file("elsewhere/uvx", "");
    cx.uv = None;
    cx.path = Some(std::env::join_paths([l.dir("empty"), l.dir("elsewhere")]).expect("PATH"));
    assert_eq!(
        decide(&cx).expect("launch").command,
        on_path.display().to_string()
    );
}

#[test]
fn a_record_without_the_package_is_refused() {
    let l = Layout::new();
    let cx = l.uv_env(None);
    std::fs::remove_dir_all(l.root.path().join("cache/archive-v0/Ab12/lib")).expect("rm");
    let err = decide(&cx).expect_err("refused");
    assert!(err.contains("package record was not found"), "{err}");
}

#[test]
fn an_installed_binary_is_written_by_its_path() {
    let l = Layout::new();
    let temp_dirs = vec![l.dir("tmp")];
    let cx = |exe: PathBuf| Context {
        exe,
        temp_dirs: temp_dirs.clone(),
        uv: None,
        path: None,
    };
    // A venv's or any stable bin directory: the path, nothing to say.
    let venv = l.file("venv/bin/ferrepl", "");
    let got = decide(&cx(venv.clone())).expect("launch");
    assert_eq!(
        got,
        Launch {
            command: venv.display().to_string(),
            args: Vec::new(),
            note: None
        }
    );
    // A directory named like a cache bucket, but in no tagged cache.
    let lookalike = l.file("tools-v1/env/bin/ferrepl", "");
    assert_eq!(
        decide(&cx(lookalike.clone())).expect("launch").command,
        lookalike.display().to_string()
    );
    // cargo's build output, even under a temporary directory: written, with
    // a note on what removes it.
    l.file("tmp/clone/target/.rustc_info.json", "{}");
    let built = l.file("tmp/clone/target/debug/ferrepl", "");
    let got = decide(&cx(built.clone())).expect("launch");
    assert_eq!(got.command, built.display().to_string());
    assert!(got.note.is_some_and(|n| n.contains("cargo clean")));
    // Anything else in a temporary or cache directory: refused.
    for exe in [
        l.file("tmp/dl/ferrepl", ""),
        l.file("home/.cache/pipx/x/bin/ferrepl", ""),
    ] {
        let err = decide(&cx(exe)).expect_err("refused");
        assert!(err.contains("cargo install --path ."), "{err}");
    }
}
