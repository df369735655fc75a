//! Symlinks swapped (atomically, again and again) under file_read and
//! file_write between the server's check and its open: no answer may ever
//! hold the decoy secret outside, and nothing outside is ever modified or
//! created. Apart from `mod.rs` for the swapper thread these races need.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use serde_json::json;

use super::{Outside, assert_refused_with, canonical_root, prompt_call};
use crate::support::{StdioServer, assert_tool_error};

/// file_read and file_write calls made while symlinks are swapped
/// underneath them, `RACE_BATCH` at a time.
const RACE_READS: usize = 1000;
const RACE_WRITES: usize = 1000;
const RACE_BATCH: usize = 8;
/// Upper bound of swaps a swapper thread makes (it stops when the calls end).
const MAX_SWAPS: u64 = 5_000_000;

/// A thread exchanging two directory entries atomically (renameat2
/// RENAME_EXCHANGE) again and again until stopped, at most `MAX_SWAPS` times.
/// The entry under `a`'s name is therefore always present, and alternately
/// is what `a` and what `b` was.
struct Swapper {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<u64>>,
}

impl Swapper {
    fn start(a: PathBuf, b: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut swaps = 0;
            while swaps < MAX_SWAPS && !flag.load(Ordering::Relaxed) {
                nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &a,
                    nix::fcntl::AT_FDCWD,
                    &b,
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                )
                .expect("renameat2 RENAME_EXCHANGE");
                swaps += 1;
            }
            swaps
        });
        Swapper {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the thread and returns how many swaps it made (an even count
    /// leaves both entries where they started).
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .map(|h| h.join().expect("the swapper thread panicked"))
            .unwrap_or(0)
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Puts `a` back in its original place if the swapper stopped mid-way.
fn settle(a: &Path, b: &Path, swaps: u64) {
    if swaps % 2 == 1 {
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            a,
            nix::fcntl::AT_FDCWD,
            b,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .expect("swap back");
    }
}

/// `link` alternates (atomically) between a regular file in the workspace
/// and a symlink to a decoy secret outside while file_read reads it: no
/// answer may ever hold the secret.
#[tokio::test(flavor = "multi_thread")]
async fn symlink_swapped_under_file_read_never_leaks() {
    let server = StdioServer::start(&["--tools", "files"]).await;
    let root = canonical_root(&server);
    let outside = Outside::new("race-read");
    std::fs::write(root.join("link"), "harmless inside content\n").expect("write link");
    std::os::unix::fs::symlink(&outside.secret, root.join("alt")).expect("symlink alt");
    // A relative symlink leading out, too: `alt2 -> ../<outside>/secret.txt`.
    let depth = root.components().count() - 1;
    let relative = format!(
        "{}{}",
        "../".repeat(depth),
        outside
            .secret
            .strip_prefix("/")
            .expect("absolute")
            .display()
    );
    std::fs::write(root.join("link2"), "harmless inside content\n").expect("write link2");
    std::os::unix::fs::symlink(&relative, root.join("alt2")).expect("symlink alt2");

    let swapper = Swapper::start(root.join("link"), root.join("alt"));
    let swapper2 = Swapper::start(root.join("link2"), root.join("alt2"));
    // Batches of concurrent reads, so many opens land inside the swaps.
    let mut leaks = Vec::new();
    let (mut refused, mut read) = (0, 0);
    for batch in 0..RACE_READS / RACE_BATCH {
        let calls = (0..RACE_BATCH).map(|j| {
            let path = if j % 2 == 0 { "link" } else { "link2" };
            prompt_call(&server, "file_read", json!({ "path": path }))
        });
        for (j, out) in futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            if outside.leaked(&out) {
                leaks.push(format!("read #{}: {:?}", batch * RACE_BATCH + j, out.text));
            } else if out.is_error {
                refused += 1;
            } else {
                read += 1;
            }
        }
    }
    let swaps = swapper.finish();
    let swaps2 = swapper2.finish();
    settle(&root.join("link"), &root.join("alt"), swaps);
    settle(&root.join("link2"), &root.join("alt2"), swaps2);
    assert!(
        leaks.is_empty(),
        "{} of {RACE_READS} file_read calls returned the decoy secret from outside the \
         workspace ({read} read the inside file, {refused} were refused; {swaps} + {swaps2} \
         swaps): {:?}",
        leaks.len(),
        leaks.iter().take(3).collect::<Vec<_>>()
    );
    outside.assert_intact("after the read race");

    // The tool still reads the regular file once it stays put.
    let out = prompt_call(&server, "file_read", json!({ "path": "link" })).await;
    assert!(!out.is_error, "file_read of a settled file: {out:#?}");
    assert_eq!(out.structured["text"], "harmless inside content\n");
    // And the symlink out is refused when it stays put.
    let out = prompt_call(&server, "file_read", json!({ "path": "alt" })).await;
    assert_refused_with(&out, "outside the workspace", "file_read of alt");
    outside.assert_not_leaked(&out, "file_read of alt");
    let out = prompt_call(&server, "file_read", json!({ "path": "alt2" })).await;
    assert_refused_with(&out, "outside the workspace", "file_read of alt2");
    outside.assert_not_leaked(&out, "file_read of alt2");
}

/// The same swap under file_write (replace and append), a symlink to a file
/// that does not exist yet, and a directory swapped with a symlink to the
/// outside directory under a write that creates parents: nothing outside is
/// ever modified or created.
#[tokio::test(flavor = "multi_thread")]
async fn symlink_swapped_under_file_write_never_writes_outside() {
    let server = StdioServer::start(&["--tools", "files"]).await;
    let root = canonical_root(&server);
    let outside = Outside::new("race-write");

    // A file <-> a symlink to the decoy secret.
    std::fs::write(root.join("link"), "inside\n").expect("write link");
    std::os::unix::fs::symlink(&outside.secret, root.join("alt")).expect("symlink alt");
    // A file <-> a symlink to a file outside that does not exist.
    std::fs::write(root.join("new"), "inside\n").expect("write new");
    std::os::unix::fs::symlink(outside.path.join("created.txt"), root.join("newalt"))
        .expect("symlink newalt");
    // A directory <-> a symlink to the outside directory.
    std::fs::create_dir(root.join("d")).expect("mkdir d");
    std::os::unix::fs::symlink(&outside.path, root.join("dalt")).expect("symlink dalt");

    let swappers = [
        Swapper::start(root.join("link"), root.join("alt")),
        Swapper::start(root.join("new"), root.join("newalt")),
        Swapper::start(root.join("d"), root.join("dalt")),
    ];
    for batch in 0..RACE_WRITES / RACE_BATCH {
        let calls = (0..RACE_BATCH).map(|j| {
            let i = batch * RACE_BATCH + j;
            let args = match i % 5 {
                0 => json!({ "path": "link", "text": "PWNED\n" }),
                1 => json!({ "path": "link", "text": "PWNED\n", "append": true }),
                2 => json!({ "path": "new", "text": "PWNED\n" }),
                3 => json!({ "path": "d/planted.txt", "text": "PWNED\n" }),
                _ => json!({ "path": format!("d/sub{i}/planted.txt"), "text": "PWNED\n" }),
            };
            prompt_call(&server, "file_write", args)
        });
        for out in futures::future::join_all(calls).await {
            outside.assert_not_leaked(&out, "file_write");
        }
        outside.assert_intact(&format!(
            "file_write calls {}..{}",
            batch * RACE_BATCH,
            (batch + 1) * RACE_BATCH
        ));
    }
    let pairs = [("link", "alt"), ("new", "newalt"), ("d", "dalt")];
    for (swapper, (a, b)) in swappers.into_iter().zip(pairs) {
        let swaps = swapper.finish();
        settle(&root.join(a), &root.join(b), swaps);
    }
    outside.assert_intact("after the write race");

    // Settled: writing the regular file works, writing through the symlinks
    // out is refused.
    let out = prompt_call(
        &server,
        "file_write",
        json!({ "path": "link", "text": "fine\n" }),
    )
    .await;
    assert!(!out.is_error, "file_write of a settled file: {out:#?}");
    assert_eq!(
        std::fs::read_to_string(root.join("link")).expect("read link"),
        "fine\n"
    );
    for (path, append) in [("alt", false), ("alt", true), ("newalt", false)] {
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
        "file_write",
        json!({ "path": "dalt/x/y.txt", "text": "PWNED\n" }),
    )
    .await;
    assert_tool_error(&out, "file_write dalt/x/y.txt");
    outside.assert_intact("after the settled writes");
}
