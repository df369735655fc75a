use super::*;

fn ws() -> Protected {
    Protected::new(vec![PathBuf::from("/ws"), PathBuf::from("/data")], &[], &[]).expect("built-in")
}

#[test]
fn built_in_names_are_protected_at_any_depth_below_a_root() {
    let p = ws();
    assert_eq!(p.find(Path::new("/ws/.git")), Some("/ws/.git".into()));
    assert_eq!(
        p.find(Path::new("/ws/.git/hooks/pre-commit")),
        Some("/ws/.git".into())
    );
    assert_eq!(
        p.find(Path::new("/ws/a/b/.git/config")),
        Some("/ws/a/b/.git".into())
    );
    assert_eq!(
        p.find(Path::new("/data/.mcp.json")),
        Some("/data/.mcp.json".into())
    );
    assert_eq!(
        p.find(Path::new("/ws/x/renv/activate.R")),
        Some("/ws/x/renv/activate.R".into())
    );
    assert_eq!(
        p.find(Path::new("/ws/.venv/lib/x.pth")),
        Some("/ws/.venv".into())
    );
    // Controls: other names, look-alikes, outside the roots.
    for free in [
        "/ws/src/main.py",
        "/ws/.gitignore",
        "/ws/git",
        "/ws/renv/library/x",
        "/ws/activate.R",
        "/tmp/x/.git/config",
        "/ws",
    ] {
        assert_eq!(p.find(Path::new(free)), None, "{free}");
    }
}

#[test]
fn the_operator_adds_and_frees_names() {
    let p = Protected::new(
        vec![PathBuf::from("/ws")],
        &["Makefile".into(), "conf/run.sh".into(), "/ws/abs".into()],
        &[".git".into()],
    )
    .expect("flags");
    assert_eq!(p.find(Path::new("/ws/.git/config")), None);
    assert!(p.find(Path::new("/ws/sub/Makefile")).is_some());
    assert_eq!(
        p.find(Path::new("/ws/conf/run.sh")),
        Some("/ws/conf/run.sh".into())
    );
    assert_eq!(p.find(Path::new("/ws/x/conf/run.sh")), None);
    assert!(p.find(Path::new("/ws/abs/deep")).is_some());
    assert_eq!(
        p.holds(Path::new("/ws/conf")),
        Some("/ws/conf/run.sh".into())
    );
    assert!(p.find(Path::new("/ws/.mcp.json")).is_some());
    let tenant = p.with_workspace(Path::new("/ws/alice"));
    assert_eq!(
        tenant.find(Path::new("/ws/alice/conf/run.sh")),
        Some("/ws/alice/conf/run.sh".into())
    );
    assert!(tenant.find(Path::new("/ws/alice/sub/Makefile")).is_some());
    let all = Protected::new(vec![PathBuf::from("/ws")], &[], &["all".into()]).expect("all");
    assert!(all.is_empty());
    assert_eq!(
        Protected::new(vec![], &[], &["src".into()]),
        Err(ProtectError::UnknownName("src".into()))
    );
    assert!(Protected::new(vec![], &["../up".into()], &[]).is_err());
}

#[test]
fn docs_security_lists_exactly_the_built_in_places() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/security.md");
    let text = std::fs::read_to_string(&path).expect("read docs/security.md");
    let (_, rest) = text
        .split_once("<!-- protected-places -->")
        .expect("the table's start marker");
    let (table, _) = rest
        .split_once("<!-- /protected-places -->")
        .expect("the table's end marker");
    let rows: Vec<(String, String)> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| {
            let (name, rest) = l.split_once("` | ")?;
            Some((name.to_string(), rest.trim_end_matches(" |").to_string()))
        })
        .collect();
    let built_in: Vec<(String, String)> = BUILT_IN
        .iter()
        .map(|(n, why)| (n.to_string(), why.to_string()))
        .collect();
    assert_eq!(
        rows, built_in,
        "docs/security.md's table of protected places"
    );
}

#[test]
fn a_root_git_file_protects_the_directory_it_points_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical");
    std::fs::create_dir_all(root.join("store/gd")).expect("gitdir");
    std::fs::write(root.join(".git"), "gitdir: store/gd\n").expect(".git file");
    let p = Protected::new(vec![root.clone()], &[], &[]).expect("built-in");
    assert_eq!(
        p.find(&root.join("store/gd/hooks/pre-commit")),
        Some(root.join("store/gd"))
    );
    assert_eq!(p.holds(&root.join("store")), Some(root.join("store/gd")));
    assert!(
        p.refusal(&root.join("store/gd"))
            .contains("--allow-write-protected .git")
    );
    let freed = Protected::new(vec![root.clone()], &[], &[".git".into()]).expect("freed");
    assert_eq!(freed.find(&root.join("store/gd/hooks/x")), None);
    assert_eq!(
        freed.find(&root.join("x/HEAD")),
        None,
        "HEAD goes with .git"
    );
    // What a repository's config points git to is protected too.
    let repo = root.join("app");
    std::fs::create_dir_all(repo.join(".git")).expect("repo");
    std::fs::write(
        repo.join(".git/config"),
        "[core]\n\thooksPath = .githooks ; husky\n[include]\n\tpath = \"../shared.cfg\"\n[includeIf \"gitdir:x\"]\n\tpath = ../../up.cfg\n",
    )
    .expect("config");
    let p = Protected::new(vec![repo.clone()], &[], &[]).expect("built-in");
    assert_eq!(
        p.find(&repo.join(".githooks/pre-commit")),
        Some(repo.join(".githooks"))
    );
    assert_eq!(
        p.find(&repo.join("shared.cfg")),
        Some(repo.join("shared.cfg"))
    );
    assert_eq!(p.find(&root.join("up.cfg")), None, "outside the root");
    let msg = p.refusal(&root.join(".git"));
    assert!(msg.contains("--allow-write-protected .git"), "{msg}");
}
