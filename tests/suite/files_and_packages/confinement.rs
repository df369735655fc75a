//! Paths outside the workspace refused: through symlinked directories and
//! files, absolute paths and `..`; symlinks listed and deleted, never followed.

use std::path::PathBuf;

use crate::support::{StdioServer, assert_success, assert_tool_error, path_str};
use serde_json::json;

#[tokio::test]
async fn paths_outside_the_workspace_are_refused() {
    let way_out = WayOut::start().await;
    refuse_through_the_symlinked_directory(&way_out).await;
    refuse_through_the_symlinked_file(&way_out).await;
    refuse_absolute_paths(&way_out).await;
    refuse_dot_dot(&way_out).await;
    list_symlinks_without_following_them(&way_out).await;
    delete_symlinks_but_not_their_targets(&way_out).await;
}

/// A files-only server whose workspace has ways out: `out`, a symlink to a
/// directory outside holding only `secret`; `leak`, a symlink to that
/// secret; and `inside.txt`, a file of its own.
struct WayOut {
    server: StdioServer,
    root: PathBuf,
    outside_dir: PathBuf,
    _outside: tempfile::TempDir,
}

impl WayOut {
    async fn start() -> Self {
        let server = StdioServer::start(&["--tools", "files"]).await;
        let root = server
            .workdir
            .path()
            .canonicalize()
            .expect("canonical root");
        let outside = tempfile::tempdir().expect("outside tempdir");
        let outside_dir = outside.path().canonicalize().expect("canonical outside");
        std::fs::write(outside_dir.join("secret"), "TOP-SECRET-CONTENT\n").expect("write secret");
        std::os::unix::fs::symlink(&outside_dir, root.join("out")).expect("symlink out");
        std::os::unix::fs::symlink(outside_dir.join("secret"), root.join("leak"))
            .expect("symlink leak");
        std::fs::write(root.join("inside.txt"), "inside\n").expect("write inside");
        WayOut {
            server,
            root,
            outside_dir,
            _outside: outside,
        }
    }

    /// The names in the directory outside, sorted.
    fn outside_listing(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.outside_dir)
            .expect("read outside")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Panics unless the directory outside holds only the secret, unchanged.
    fn assert_secret_intact(&self) {
        assert_eq!(
            std::fs::read_to_string(self.outside_dir.join("secret")).expect("secret still there"),
            "TOP-SECRET-CONTENT\n"
        );
        assert_eq!(self.outside_listing(), vec!["secret".to_string()]);
    }
}

/// Through the symlinked directory `out`: nothing is read, written, made,
/// listed or deleted outside.
async fn refuse_through_the_symlinked_directory(way_out: &WayOut) {
    let WayOut {
        server,
        outside_dir,
        ..
    } = way_out;
    let read = server
        .call("file_read", json!({ "path": "out/secret" }))
        .await;
    assert_tool_error(&read, "read out/secret");
    assert!(!read.text.contains("TOP-SECRET"), "{read:#?}");
    assert_tool_error(
        &server
            .call("file_write", json!({ "path": "out/new.txt", "text": "x" }))
            .await,
        "write out/new.txt",
    );
    assert!(!outside_dir.join("new.txt").exists());
    assert_tool_error(
        &server
            .call("file_write", json!({ "path": "out/deeper/x", "text": "x" }))
            .await,
        "write out/deeper/x",
    );
    assert!(
        !outside_dir.join("deeper").exists(),
        "no directory may be created outside"
    );
    let list = server.call("file_list", json!({ "path": "out" })).await;
    assert_tool_error(&list, "list out");
    assert!(!list.text.contains("secret"), "{list:#?}");
    assert_tool_error(
        &server
            .call("file_delete", json!({ "path": "out/secret" }))
            .await,
        "delete out/secret",
    );
    way_out.assert_secret_intact();
}

/// Through the symlinked file `leak`: the secret is neither read nor
/// overwritten nor appended to.
async fn refuse_through_the_symlinked_file(way_out: &WayOut) {
    let WayOut { server, .. } = way_out;
    let read = server.call("file_read", json!({ "path": "leak" })).await;
    assert_tool_error(&read, "read leak");
    assert!(!read.text.contains("TOP-SECRET"), "{read:#?}");
    assert_tool_error(
        &server
            .call(
                "file_write",
                json!({ "path": "leak", "text": "overwritten" }),
            )
            .await,
        "write leak",
    );
    assert_tool_error(
        &server
            .call(
                "file_write",
                json!({ "path": "leak", "text": "appended", "append": true }),
            )
            .await,
        "append to leak",
    );
    way_out.assert_secret_intact();
}

/// Absolute paths, even ones inside the workspace.
async fn refuse_absolute_paths(way_out: &WayOut) {
    let WayOut {
        server,
        root,
        outside_dir,
        ..
    } = way_out;
    let inside_abs = root.join("inside.txt");
    let outside_abs = outside_dir.join("secret");
    for path in [path_str(&inside_abs), path_str(&outside_abs), "/etc/passwd"] {
        assert_tool_error(
            &server.call("file_read", json!({ "path": path })).await,
            &format!("read {path}"),
        );
    }
    let abs_new = outside_dir.join("abs-new.txt");
    assert_tool_error(
        &server
            .call(
                "file_write",
                json!({ "path": path_str(&abs_new), "text": "x" }),
            )
            .await,
        "write an absolute path",
    );
    assert_tool_error(
        &server
            .call("file_delete", json!({ "path": path_str(&outside_abs) }))
            .await,
        "delete an absolute path",
    );
    assert_tool_error(
        &server
            .call("file_list", json!({ "path": path_str(outside_dir) }))
            .await,
        "list an absolute path",
    );
}

/// `..`, even when it would land back inside.
async fn refuse_dot_dot(way_out: &WayOut) {
    let WayOut {
        server,
        root,
        outside_dir,
        ..
    } = way_out;
    let outside_name = outside_dir
        .file_name()
        .expect("outside dir name")
        .to_string_lossy()
        .into_owned();
    let parent_rel = format!("../{outside_name}/secret");
    let parent_new = format!("../{outside_name}/dotdot.txt");
    let parent_dir = format!("sub/../../{outside_name}/made");
    let back_in = format!(
        "../{}/inside.txt",
        root.file_name().expect("root name").to_string_lossy()
    );
    for path in [parent_rel.as_str(), back_in.as_str(), "a/../inside.txt"] {
        let out = server.call("file_read", json!({ "path": path })).await;
        assert_tool_error(&out, &format!("read {path}"));
        assert!(!out.text.contains("TOP-SECRET"), "{out:#?}");
    }
    assert_tool_error(
        &server
            .call("file_write", json!({ "path": parent_new, "text": "x" }))
            .await,
        "write through ..",
    );
    assert_tool_error(
        &server
            .call(
                "file_write",
                json!({ "path": format!("{parent_dir}/f"), "text": "x" }),
            )
            .await,
        "write a new directory through ..",
    );
    assert!(
        !root.join("sub").exists(),
        "a refused write creates no parent"
    );
    assert_tool_error(
        &server
            .call(
                "file_delete",
                json!({ "path": parent_rel, "recursive": true }),
            )
            .await,
        "delete through ..",
    );
    assert_tool_error(
        &server.call("file_list", json!({ "path": ".." })).await,
        "list ..",
    );
    way_out.assert_secret_intact();
}

/// The symlinks are listed as symlinks and not followed.
async fn list_symlinks_without_following_them(way_out: &WayOut) {
    let WayOut { server, .. } = way_out;
    let listing = server.call("file_list", json!({ "depth": 8 })).await;
    assert_success(&listing, "file_list root");
    let entries = listing.structured["entries"].as_array().expect("entries");
    for name in ["out", "leak"] {
        let e = entries
            .iter()
            .find(|e| e["path"] == name)
            .unwrap_or_else(|| panic!("{name} missing: {listing:#?}"));
        assert_eq!(e["kind"], "symlink", "{listing:#?}");
    }
    assert!(
        entries.iter().all(|e| e["path"] != "out/secret"),
        "a symlinked directory is not followed: {listing:#?}"
    );
    assert!(!listing.text.contains("TOP-SECRET"), "{listing:#?}");
}

/// Deleting a symlink removes the link, not its target.
async fn delete_symlinks_but_not_their_targets(way_out: &WayOut) {
    let WayOut { server, root, .. } = way_out;
    assert_success(
        &server
            .call("file_delete", json!({ "path": "out", "recursive": true }))
            .await,
        "delete the out symlink",
    );
    assert!(std::fs::symlink_metadata(root.join("out")).is_err());
    assert_success(
        &server.call("file_delete", json!({ "path": "leak" })).await,
        "delete the leak symlink",
    );
    assert!(std::fs::symlink_metadata(root.join("leak")).is_err());
    way_out.assert_secret_intact();
    assert!(root.join("inside.txt").is_file());
}
