use super::*;

#[test]
fn escapes_are_refused() {
    let outside = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("tempdir");
    let ws = Workspace::new(root.path()).expect("workspace");
    std::fs::write(outside.path().join("secret"), "s").expect("write");
    std::os::unix::fs::symlink(outside.path(), root.path().join("link")).expect("symlink");
    assert!(matches!(
        ws.read("/etc/passwd", 1024),
        Err(FileError::Absolute(_))
    ));
    assert!(matches!(
        ws.read("a/../../x", 1024),
        Err(FileError::ParentDir(_))
    ));
    assert!(matches!(
        ws.read("link/secret", 1024),
        Err(FileError::Escapes(_))
    ));
    assert!(matches!(
        ws.write("link/new", b"x", false),
        Err(FileError::Escapes(_))
    ));
    assert!(matches!(
        ws.write("link/deeper/new", b"x", false),
        Err(FileError::Escapes(_))
    ));
    assert!(matches!(
        ws.delete("link/secret", false),
        Err(FileError::Escapes(_))
    ));
    assert!(matches!(ws.list("link", 2, 10), Err(FileError::Escapes(_))));
    assert!(!outside.path().join("deeper").exists());
    assert!(!outside.path().join("new").exists());
    assert!(outside.path().join("secret").exists());
    let shown = ws.write("sub/dir/file.txt", b"hi", false).expect("inside");
    assert_eq!(shown, "sub/dir/file.txt");
    assert!(root.path().join("sub/dir/file.txt").is_file());
    assert!(matches!(ws.delete(".", true), Err(FileError::Root(_))));
}

#[cfg(target_os = "linux")]
#[test]
fn special_files_and_deep_trees() {
    let outside = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("tempdir");
    let ws = Workspace::new(root.path()).expect("workspace");
    nix::unistd::mkfifo(
        &root.path().join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .expect("mkfifo");
    // Neither blocks: nobody opens the other end.
    assert!(matches!(
        ws.read("pipe", 100),
        Err(FileError::NotRegular { kind: "a FIFO", .. })
    ));
    assert!(matches!(
        ws.write("pipe", b"x", true),
        Err(FileError::NotRegular { kind: "a FIFO", .. })
    ));
    // A recursive delete removes a symlink to a directory, not its
    // contents.
    std::fs::write(outside.path().join("keep"), "k").expect("write");
    std::fs::create_dir(root.path().join("d")).expect("mkdir");
    std::os::unix::fs::symlink(outside.path(), root.path().join("d/out")).expect("symlink");
    ws.delete("d", true).expect("delete d");
    assert!(outside.path().join("keep").exists());
    // Too deep a tree is refused, not overflowing anything.
    let mut deep = root.path().join("deep");
    for _ in 0..MAX_WALK_DEPTH + 2 {
        deep.push("d");
    }
    std::fs::create_dir_all(&deep).expect("deep tree");
    let err = ws.delete("deep", true).expect_err("too deep");
    assert!(err.to_string().contains("nested more than"), "{err}");
}

#[test]
fn reads_stop_at_the_limit() {
    let root = tempfile::tempdir().expect("tempdir");
    let ws = Workspace::new(root.path()).expect("workspace");
    std::fs::write(root.path().join("big"), vec![b'a'; 100]).expect("write");
    assert!(matches!(
        ws.read("big", 99),
        Err(FileError::TooLarge { size: 100, .. })
    ));
    let data = ws.read("./big", 100).expect("read");
    assert_eq!(data.data.len(), 100);
    assert_eq!(data.shown, "big");
}

#[test]
fn write_append_symlink_inside_and_delete() {
    let root = tempfile::tempdir().expect("tempdir");
    let ws = Workspace::new(root.path()).expect("workspace");
    ws.write("a/b.txt", b"one\n", false).expect("write");
    ws.write("a/b.txt", b"two\n", true).expect("append");
    assert_eq!(
        std::fs::read_to_string(root.path().join("a/b.txt")).expect("read"),
        "one\ntwo\n"
    );
    // A relative symlink staying inside is followed for reads and writes.
    std::os::unix::fs::symlink("../a/b.txt", root.path().join("a/l")).expect("symlink");
    ws.write("a/l", b"three\n", false).expect("write through");
    assert_eq!(ws.read("a/l", 100).expect("read").data, b"three\n");
    // A dangling symlink is not created through.
    std::os::unix::fs::symlink("nothing", root.path().join("dangling")).expect("symlink");
    assert!(matches!(
        ws.write("dangling", b"x", false),
        Err(FileError::DanglingSymlink(_))
    ));
    assert!(!root.path().join("nothing").exists());
    // Writing over a directory is refused.
    assert!(matches!(
        ws.write("a", b"x", false),
        Err(FileError::IsDir { .. })
    ));
    let listing = ws.list(".", 8, 100).expect("list");
    let paths: Vec<_> = listing.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, vec!["a", "a/b.txt", "a/l", "dangling"]);
    assert!(matches!(ws.delete("a", false), Err(FileError::NotEmpty(_))));
    ws.delete("a", true).expect("delete recursively");
    assert!(!root.path().join("a").exists());
    assert!(matches!(ws.delete("a", true), Err(FileError::NotFound(_))));
}

#[test]
fn policy_refusals_are_told_from_mistakes() {
    use crate::metrics::SandboxRefusal;
    let refusal = |e: FileError| e.refusal();
    assert_eq!(
        refusal(FileError::ParentDir("../x".into())),
        Some(SandboxRefusal::FilePath)
    );
    assert_eq!(
        refusal(FileError::Escapes("link".into())),
        Some(SandboxRefusal::FilePath)
    );
    assert_eq!(refusal(FileError::ReadOnly), Some(SandboxRefusal::ReadOnly));
    assert_eq!(refusal(FileError::NotFound("x".into())), None);
}

#[cfg(target_os = "linux")]
#[test]
fn disk_usage_counts_only_a_vanished_entry_as_nothing() {
    use nix::errno::Errno;
    assert!(super::linux::dirs::gone(Errno::ENOENT) && super::linux::dirs::gone(Errno::ENOTDIR));
    // A directory made unreadable must not hide what it holds.
    assert!(!super::linux::dirs::gone(Errno::EACCES) && !super::linux::dirs::gone(Errno::EMFILE));
}

/// A workspace whose built-in protected places are refused, and its root.
fn protected_workspace() -> (tempfile::TempDir, PathBuf, Workspace) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical");
    let protected = Protected::new(vec![root.clone()], &[], &[]).expect("built-in");
    let ws = Workspace::new(&root)
        .expect("workspace")
        .protected(Some(Arc::new(protected)));
    (dir, root, ws)
}

fn is_protected(result: Result<String, FileError>, place: &str) -> bool {
    match result {
        Err(FileError::Protected { message, .. }) => {
            message.contains(place) && message.contains("--allow-write-protected")
        }
        _ => false,
    }
}

#[test]
fn writes_never_touch_a_protected_place() {
    let (_dir, root, ws) = protected_workspace();
    std::fs::create_dir_all(root.join(".git/hooks")).expect("git dir");
    std::fs::write(root.join(".git/config"), "[core]\n").expect("config");
    std::os::unix::fs::symlink(".git", root.join("g")).expect("g -> .git");
    std::fs::create_dir(root.join("sub")).expect("sub");
    std::os::unix::fs::symlink("..", root.join("sub/up")).expect("sub/up -> ..");
    std::os::unix::fs::symlink(".git/hooks", root.join("h")).expect("h -> .git/hooks");
    let refused = [
        (".git/config", ".git"),
        (".git/hooks/pre-commit", ".git"),
        ("new/.git/x", "new/.git"),
        (".mcp.json", ".mcp.json"),
        ("g/config", ".git"),
        ("g/hooks/post-checkout", ".git"),
        ("g/new/deeper/x", ".git"),
        ("h/pre-push", ".git"),
        ("sub/up/.git/config", ".git"),
        ("x/renv/activate.R", "renv/activate.R"),
    ];
    for (rel, place) in refused {
        assert!(is_protected(ws.write(rel, b"PWNED", false), place), "{rel}");
        assert!(is_protected(ws.export(rel, b"PWNED"), place), "{rel}");
    }
    assert_eq!(
        std::fs::read_to_string(root.join(".git/config")).expect("config"),
        "[core]\n"
    );
    // Nothing was made on the way: no hook, no directory for new/.git.
    assert!(!root.join(".git/hooks/pre-commit").exists());
    assert!(!root.join("new").exists() && !root.join(".git/new").exists());
    assert!(!root.join(".git/hooks/pre-push").exists());
    assert!(!root.join(".mcp.json").exists());
    // Controls.
    ws.write(".gitignore", b"target\n", false)
        .expect(".gitignore");
    ws.write("sub/ok.txt", b"ok", false).expect("ordinary file");
    ws.write("gitx/config", b"ok", false).expect("look-alike");
}

#[test]
fn an_export_over_an_executable_does_not_stay_one() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, root, ws) = protected_workspace();
    let script = root.join("run.sh");
    std::fs::write(&script, "#!/bin/sh\n").expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    ws.export("run.sh", b"print(1)\n").expect("export");
    let mode = std::fs::metadata(&script)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0, "{mode:o}");
    assert_eq!(std::fs::read(&script).expect("read"), b"print(1)\n");
    // file_write keeps a script's mode (an edit, not an export).
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    ws.write("run.sh", b"#!/bin/sh\n", false).expect("write");
    let mode = std::fs::metadata(&script)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "{mode:o}");
}

#[test]
fn deletes_never_touch_a_protected_place() {
    let (_dir, root, ws) = protected_workspace();
    std::fs::create_dir_all(root.join(".git/hooks")).expect("git dir");
    std::fs::create_dir_all(root.join("proj/deep/sub/.git")).expect("nested git");
    std::fs::write(root.join("proj/a.txt"), "a").expect("a");
    std::fs::write(root.join("proj/deep/b.txt"), "b").expect("b");
    std::os::unix::fs::symlink(".git", root.join("g")).expect("g -> .git");
    for (rel, recursive) in [
        (".git", true),
        (".git", false),
        (".git/hooks", true),
        ("g/hooks", true),
    ] {
        assert!(is_protected(ws.delete(rel, recursive), ".git"), "{rel}");
    }
    // A tree holding one, at any depth: refused, nothing deleted.
    let err = ws.delete("proj", true).expect_err("holds sub/.git");
    let text = err.to_string();
    assert!(text.contains("proj/deep/sub/.git"), "{text}");
    assert!(text.contains("nothing was deleted"), "{text}");
    assert!(root.join("proj/a.txt").exists() && root.join("proj/deep/b.txt").exists());
    // The link itself is no protected place.
    ws.delete("g", false).expect("delete the link g");
    assert!(root.join(".git/hooks").is_dir());
    // Controls: a tree without one goes.
    std::fs::remove_dir_all(root.join("proj/deep/sub/.git")).expect("rm");
    ws.delete("proj", true).expect("delete proj");
    assert!(!root.join("proj").exists());
}

#[test]
fn portable_writes_and_deletes_refuse_protected_places_too() {
    let (_dir, root, ws) = protected_workspace();
    std::fs::create_dir_all(root.join("tree/x/.hg")).expect("hg");
    std::fs::create_dir_all(root.join(".git")).expect("git");
    std::os::unix::fs::symlink(".git", root.join("g")).expect("g -> .git");
    let guard = ws.guard();
    let write = |rel: &str| {
        let path = lexical(rel).expect("lexical");
        let (parent, name) = path.split_last().expect("a name");
        let w = FileWrite {
            rel,
            path: &path,
            parent: &parent,
            name,
            data: b"PWNED",
            append: false,
            plain: true,
            guard,
        };
        portable::write(&root, &w).map(|()| rel.to_string())
    };
    assert!(is_protected(write("g/config"), ".git"));
    assert!(is_protected(write("g/new/x"), ".git"));
    assert!(!root.join(".git/new").exists() && !root.join(".git/config").exists());
    write("plain.txt").expect("ordinary file");
    let delete = |rel: &str| {
        let path = lexical(rel).expect("lexical");
        let (parent, name) = path.split_last().expect("a name");
        let e = Entry {
            rel,
            parent: &parent,
            name,
            guard,
        };
        portable::delete(&root, &e, true).map(|()| rel.to_string())
    };
    assert!(is_protected(delete("tree"), "tree/x/.hg"));
    assert!(root.join("tree/x/.hg").is_dir());
    assert!(is_protected(delete("g/x"), ".git"));
    delete("plain.txt").expect("ordinary file");
}
