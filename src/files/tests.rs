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
    assert!(super::linux::gone(Errno::ENOENT) && super::linux::gone(Errno::ENOTDIR));
    // A directory made unreadable must not hide what it holds.
    assert!(!super::linux::gone(Errno::EACCES) && !super::linux::gone(Errno::EMFILE));
}
