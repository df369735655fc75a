//! Class 6: the workspace file tools (file_list, file_read, file_write,
//! file_delete) run in the server, outside the sandbox, so a hostile agent
//! aims them at the server's own files: symlinks swapped between the check
//! and the open, FIFOs that block an open or a read forever, device nodes that
//! never end, and symlinks (absolute, relative with `..`, to directories)
//! leading out of the workspace. Every secret here is a decoy the test writes
//! itself in a temporary directory outside the workspace. Under `--sandbox
//! read-only` the tools that write or delete are refused.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::planted::start;
use crate::support::{StdioServer, ToolOutput, assert_tool_error, b64_encode, server_binary};

/// How long a file tool may take before the server counts as stalled: far
/// above what any of these calls needs, far below the suite's call timeout.
const PROMPT: Duration = Duration::from_secs(10);
/// Resident memory the server may reach in the device test (it stays near
/// 20 MiB; reading a device without end reaches gigabytes in seconds).
const MAX_SERVER_RSS_KIB: u64 = 256 * 1024;

// 1. races: symlinks swapped under file_read and file_write.
mod races;

// ------------------------------------------------------------------ helpers

fn canonical_root(server: &StdioServer) -> PathBuf {
    server
        .workdir
        .path()
        .canonicalize()
        .expect("canonical workspace root")
}

/// A directory outside the workspace holding one decoy secret file.
struct Outside {
    _dir: tempfile::TempDir,
    path: PathBuf,
    secret: PathBuf,
    content: String,
}

impl Outside {
    fn new(tag: &str) -> Self {
        let dir = tempfile::tempdir().expect("outside tempdir");
        let path = dir.path().canonicalize().expect("canonical outside dir");
        let secret = path.join("secret.txt");
        let content = format!("DECOY-SECRET-{tag}-{}\n", std::process::id());
        std::fs::write(&secret, &content).expect("write the decoy secret");
        Outside {
            _dir: dir,
            path,
            secret,
            content,
        }
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.path)
            .expect("list the outside dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The outside dir holds exactly the secret, unchanged.
    fn assert_intact(&self, what: &str) {
        assert_eq!(
            std::fs::read_to_string(&self.secret).expect("read the decoy secret"),
            self.content,
            "{what}: the decoy secret outside the workspace was modified"
        );
        assert_eq!(
            self.names(),
            vec!["secret.txt".to_string()],
            "{what}: something was created outside the workspace"
        );
    }

    /// Whether any part of the result shows the secret (as text, or
    /// base64-encoded as a binary read would carry it).
    fn leaked(&self, out: &ToolOutput) -> bool {
        let raw = serde_json::to_string(&out.raw).expect("result as JSON");
        raw.contains(self.content.trim()) || raw.contains(&b64_encode(self.content.as_bytes()))
    }

    /// Panics if any part of the result shows the secret.
    fn assert_not_leaked(&self, out: &ToolOutput, what: &str) {
        assert!(
            !self.leaked(out),
            "{what}: the decoy secret leaked: {out:#?}"
        );
    }
}

fn assert_refused_with(out: &ToolOutput, needle: &str, what: &str) {
    assert_tool_error(out, what);
    assert!(
        out.text.contains(needle),
        "{what}: the error should say {needle:?}: {:?}",
        out.text
    );
}

/// One call that must answer within `PROMPT`.
async fn prompt_call(server: &StdioServer, tool: &str, args: Value) -> ToolOutput {
    let shown = format!("{tool} {args}");
    match tokio::time::timeout(PROMPT, server.try_call(tool, args)).await {
        Ok(Ok(raw)) => ToolOutput::from_result(raw),
        Ok(Err(e)) => panic!("{shown} failed at the protocol level: {e}"),
        Err(_) => panic!("{shown} did not answer within {PROMPT:?}: the server stalled"),
    }
}

/// The server's resident memory (VmRSS) and its peak (VmHWM), in KiB.
fn server_rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// One call while the server's memory is watched: the server is killed (and
/// the test fails) as soon as it passes `MAX_SERVER_RSS_KIB`, or if the call
/// does not answer within `PROMPT`.
async fn call_watching_memory(server: &mut StdioServer, tool: &str, args: Value) -> ToolOutput {
    let pid = server.child.id().expect("the server's pid");
    let shown = format!("{tool} {args}");
    let watch = async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            let (rss, _) = server_rss_kib(pid);
            if rss > MAX_SERVER_RSS_KIB {
                return rss;
            }
        }
    };
    let outcome = tokio::select! {
        result = tokio::time::timeout(PROMPT, server.try_call(tool, args)) => Ok(result),
        rss = watch => Err(rss),
    };
    match outcome {
        Ok(Ok(Ok(raw))) => ToolOutput::from_result(raw),
        Ok(Ok(Err(e))) => panic!("{shown} failed at the protocol level: {e}"),
        Ok(Err(_)) => {
            let _ = server.child.start_kill();
            panic!("{shown} did not answer within {PROMPT:?}: the server stalled")
        }
        Err(rss) => {
            let _ = server.child.start_kill();
            panic!("{shown}: the server grew to {rss} KiB of resident memory; killed it")
        }
    }
}

// ------------------------------------------------------------------ 2. FIFOs

/// A FIFO in the workspace: file_read and file_write answer at once with an
/// error (nobody ever opens its other end) and the server keeps answering.
#[tokio::test(flavor = "multi_thread")]
async fn fifo_does_not_stall_the_server() {
    let server = StdioServer::start(&[]).await;
    let root = canonical_root(&server);
    nix::unistd::mkfifo(
        &root.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .expect("mkfifo");

    let out = prompt_call(&server, "file_read", json!({ "path": "pipe" })).await;
    assert_refused_with(&out, "not a regular file", "file_read of a FIFO");
    assert!(out.text.contains("FIFO"), "{:?}", out.text);

    let out = prompt_call(
        &server,
        "file_write",
        json!({ "path": "pipe", "text": "x" }),
    )
    .await;
    assert_refused_with(&out, "not a regular file", "file_write to a FIFO");
    let out = prompt_call(
        &server,
        "file_write",
        json!({ "path": "pipe", "text": "x", "append": true }),
    )
    .await;
    assert_refused_with(&out, "not a regular file", "file_write append to a FIFO");

    // Other tools answer right after.
    let listing = prompt_call(&server, "file_list", json!({})).await;
    assert!(!listing.is_error, "file_list after the FIFO: {listing:#?}");
    assert!(listing.text.contains("pipe"), "{listing:#?}");
    let exec = server.exec("1+1").await;
    exec.assert_ok();
    assert_eq!(exec.value(), Some("2"));

    // Deleting the FIFO works (unlink, never an open).
    let out = prompt_call(&server, "file_delete", json!({ "path": "pipe" })).await;
    assert!(!out.is_error, "file_delete of a FIFO: {out:#?}");
    assert!(std::fs::symlink_metadata(root.join("pipe")).is_err());
}

// ------------------------------------------------------------------ 3. devices

/// A character device in the workspace with /dev/zero's numbers (made with
/// mknod as root): file_read refuses it as not a regular file and the
/// server's memory stays small. Where mknod is not allowed, a symlink to
/// /dev/zero is refused as leading outside.
#[tokio::test(flavor = "multi_thread")]
async fn character_device_is_refused_without_reading_it() {
    let mut server = StdioServer::start(&["--tools", "files"]).await;
    let root = canonical_root(&server);
    let made = nix::sys::stat::mknod(
        &root.join("zero"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        libc::makedev(1, 5),
    );
    let expected = match made {
        Ok(()) => "not a regular file",
        Err(e) => {
            eprintln!("mknod refused ({e}); testing a symlink to /dev/zero instead");
            std::os::unix::fs::symlink("/dev/zero", root.join("zero")).expect("symlink zero");
            "outside the workspace"
        }
    };

    let out = call_watching_memory(&mut server, "file_read", json!({ "path": "zero" })).await;
    assert_refused_with(&out, expected, "file_read of a character device");
    let out = call_watching_memory(
        &mut server,
        "file_read",
        json!({ "path": "zero", "start_line": 1, "line_count": 1 }),
    )
    .await;
    assert_refused_with(&out, expected, "file_read of a line of a character device");
    let out = call_watching_memory(
        &mut server,
        "file_write",
        json!({ "path": "zero", "text": "x" }),
    )
    .await;
    assert_refused_with(&out, expected, "file_write to a character device");

    let pid = server.child.id().expect("the server's pid");
    let (rss, peak) = server_rss_kib(pid);
    assert!(
        peak <= MAX_SERVER_RSS_KIB && rss <= MAX_SERVER_RSS_KIB,
        "the server's memory grew: {rss} KiB resident, {peak} KiB peak"
    );
    server.assert_alive();
    let listing = prompt_call(&server, "file_list", json!({})).await;
    assert!(
        !listing.is_error,
        "file_list after the device: {listing:#?}"
    );
}

// ------------------------------------------------------------------ 4. symlinks out

/// Absolute symlinks, relative symlinks climbing out with `..`, and
/// symlinked directories (absolute or relative) leading out: every file tool
/// through them is refused and nothing outside changes. A relative symlink
/// that stays inside still works.
#[tokio::test(flavor = "multi_thread")]
async fn symlinks_leading_out_are_refused_by_every_tool() {
    let server = StdioServer::start(&["--tools", "files"]).await;
    let root = canonical_root(&server);
    let outside = Outside::new("symlinks");
    let up = "../".repeat(root.components().count() - 1);
    let outside_rel = format!(
        "{up}{}",
        outside.path.strip_prefix("/").expect("absolute").display()
    );
    let link = |target: &str, name: &str| {
        std::os::unix::fs::symlink(target, root.join(name)).expect("symlink");
    };
    std::fs::create_dir(root.join("sub")).expect("mkdir sub");
    std::fs::write(root.join("inside.txt"), "inside\n").expect("write inside");
    link(&outside.secret.display().to_string(), "abs");
    link(&format!("{outside_rel}/secret.txt"), "rel");
    link(&outside.path.display().to_string(), "absdir");
    link(&outside_rel, "reldir");
    link(&format!("../{outside_rel}"), "sub/reldir");
    link("..", "sub/up");
    link(&format!("../{up}"), "sub/top");
    link("/proc/self/root", "magic");

    // The links to the secret itself: read and write are refused (deleting
    // them would remove the links, which is allowed, at the end).
    for path in ["abs", "rel"] {
        let out = prompt_call(&server, "file_read", json!({ "path": path })).await;
        assert_refused_with(&out, "outside the workspace", &format!("file_read {path}"));
        outside.assert_not_leaked(&out, &format!("file_read {path}"));
        for append in [false, true] {
            let out = prompt_call(
                &server,
                "file_write",
                json!({ "path": path, "text": "PWNED\n", "append": append }),
            )
            .await;
            assert_tool_error(&out, &format!("file_write {path} append={append}"));
        }
        outside.assert_intact(&format!("tools on {path}"));
    }
    // Paths through links to the outside directory.
    let files = [
        "absdir/secret.txt".to_string(),
        "reldir/secret.txt".to_string(),
        "sub/reldir/secret.txt".to_string(),
        format!(
            "sub/top/{}",
            outside.secret.strip_prefix("/").expect("abs").display()
        ),
        format!(
            "magic/{}",
            outside.secret.strip_prefix("/").expect("abs").display()
        ),
    ];
    for path in &files {
        let out = prompt_call(&server, "file_read", json!({ "path": path })).await;
        assert_tool_error(&out, &format!("file_read {path}"));
        outside.assert_not_leaked(&out, &format!("file_read {path}"));
        for append in [false, true] {
            let out = prompt_call(
                &server,
                "file_write",
                json!({ "path": path, "text": "PWNED\n", "append": append }),
            )
            .await;
            assert_tool_error(&out, &format!("file_write {path} append={append}"));
        }
        let out = prompt_call(
            &server,
            "file_delete",
            json!({ "path": path, "recursive": true }),
        )
        .await;
        assert_tool_error(&out, &format!("file_delete {path}"));
        outside.assert_intact(&format!("tools on {path}"));
    }
    for dir in ["absdir", "reldir", "sub/reldir", "sub/top", "magic"] {
        for new in ["planted.txt", "newdir/planted.txt"] {
            let path = format!("{dir}/{new}");
            let out = prompt_call(
                &server,
                "file_write",
                json!({ "path": path, "text": "PWNED\n" }),
            )
            .await;
            assert_tool_error(&out, &format!("file_write {path}"));
        }
        let out = prompt_call(&server, "file_list", json!({ "path": dir, "depth": 8 })).await;
        assert_tool_error(&out, &format!("file_list {dir}"));
        assert!(
            !out.text.contains("secret.txt"),
            "file_list {dir}: {out:#?}"
        );
        outside.assert_intact(&format!("tools in {dir}"));
    }

    // The root listing shows the links as symlinks and does not follow them.
    let listing = prompt_call(&server, "file_list", json!({ "depth": 8 })).await;
    assert!(!listing.is_error, "file_list of the root: {listing:#?}");
    let entries = listing.structured["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries: {listing:#?}"));
    for name in [
        "abs",
        "rel",
        "absdir",
        "reldir",
        "sub/reldir",
        "sub/up",
        "magic",
    ] {
        let e = entries
            .iter()
            .find(|e| e["path"] == name)
            .unwrap_or_else(|| panic!("{name} missing: {listing:#?}"));
        assert_eq!(e["kind"], "symlink", "{name}: {listing:#?}");
    }
    assert!(
        !listing.text.contains("secret.txt"),
        "a symlinked directory is not followed: {listing:#?}"
    );

    // A relative symlink staying inside the workspace still works.
    let out = prompt_call(&server, "file_read", json!({ "path": "sub/up/inside.txt" })).await;
    assert!(!out.is_error, "file_read sub/up/inside.txt: {out:#?}");
    assert_eq!(out.structured["text"], "inside\n");

    // Deleting the links removes the links only.
    for name in [
        "abs",
        "rel",
        "absdir",
        "reldir",
        "sub/reldir",
        "sub/top",
        "magic",
    ] {
        let out = prompt_call(
            &server,
            "file_delete",
            json!({ "path": name, "recursive": true }),
        )
        .await;
        assert!(!out.is_error, "file_delete of the link {name}: {out:#?}");
        assert!(std::fs::symlink_metadata(root.join(name)).is_err());
    }
    let out = prompt_call(
        &server,
        "file_delete",
        json!({ "path": "sub", "recursive": true }),
    )
    .await;
    assert!(!out.is_error, "file_delete sub: {out:#?}");
    assert!(root.join("inside.txt").is_file(), "sub/up was not followed");
    outside.assert_intact("at the end");
}

#[tokio::test]
async fn read_only_mode_covers_the_file_tools() {
    let ws = tempfile::tempdir().expect("workspace");
    let server = start(server_binary(), ws.path(), &["--sandbox", "read-only"], &[]).await;
    std::fs::write(ws.path().join("keep.txt"), "keep").expect("write");
    let write = server
        .call("file_write", json!({ "path": "new.txt", "text": "x" }))
        .await;
    assert!(
        write.is_error && write.text.contains("read-only"),
        "{write:#?}"
    );
    let delete = server
        .call("file_delete", json!({ "path": "keep.txt" }))
        .await;
    assert!(delete.is_error, "{delete:#?}");
    assert!(!ws.path().join("new.txt").exists());
    assert!(ws.path().join("keep.txt").exists());
    drop(server.child);
}
