//! Workspace file tools (file_list, file_read, file_write, file_delete) and
//! their confinement to the workspace root; python_install into virtual
//! environments (with a wheel built locally, no network) and its refusals;
//! and the --tools groups that hide these tools.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{
    StdioServer, ToolOutput, assert_success, assert_tool_error, b64_decode, b64_encode, path_str,
    real_python3, tool_names,
};
use serde_json::json;

// ------------------------------------------------------------------ helpers

/// Run a command to completion, panicking with its output if it fails.
fn run(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The session's interpreter pid.
async fn session_pid(server: &StdioServer, session: &str) -> u32 {
    let out = server
        .exec_in(session, "import os\nos.getpid()")
        .await
        .assert_ok()
        .clone();
    out.value()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("expected a pid, got {out:#?}"))
}

/// python_install `wheel` into `session` and return the finished job result,
/// and whether the python_install call itself saw the job finish. When the
/// call comes back while the job still runs, the job is collected with
/// shell_wait (bounded).
async fn install(server: &StdioServer, session: &str, wheel: &Path) -> (ToolOutput, bool) {
    let out = server
        .call(
            "python_install",
            json!({ "packages": [path_str(wheel)], "session": session, "wait_s": 300 }),
        )
        .await;
    assert!(
        !out.is_error || out.structured.is_object(),
        "python_install was refused: {out:#?}"
    );
    let job = out.str_field("job").to_string();
    assert!(
        out.str_field("command").contains(path_str(wheel)),
        "the job command should name the wheel: {out:#?}"
    );
    let finished_in_call = out.structured["status"] != "running";
    let mut out = out;
    let mut rounds = 0;
    while out.structured["status"] == "running" {
        rounds += 1;
        assert!(rounds <= 10, "the install job never finished: {out:#?}");
        out = server
            .call("shell_wait", json!({ "job": job, "wait_s": 60 }))
            .await;
    }
    assert_eq!(
        out.structured["status"], "exited",
        "the install job did not exit normally: {out:#?}"
    );
    assert_eq!(
        out.structured["exit_code"], 0,
        "the install failed: {out:#?}"
    );
    assert!(
        !out.is_error,
        "a successful install is not an error: {out:#?}"
    );
    (out, finished_in_call)
}

/// `import <module>; <module>.VALUE` in `session`. When the install finished
/// via shell_wait rather than within python_install, the session's import
/// refresh happens in the background, so the import is retried a few times
/// (bounded). Returns the last result.
async fn import_value(
    server: &StdioServer,
    session: &str,
    module: &str,
    finished_in_call: bool,
) -> ToolOutput {
    let code = format!("import {module}\n{module}.VALUE");
    let mut last = server.exec_in(session, &code).await;
    let retries = if finished_in_call { 0 } else { 40 };
    for _ in 0..retries {
        if !last.is_error {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = server.exec_in(session, &code).await;
    }
    last
}

/// Create a virtual environment at `dir` with the real python3.
fn make_venv(dir: &Path) {
    run(Command::new(real_python3()).args(["-m", "venv"]).arg(dir));
    assert!(dir.join("bin/python").exists(), "no bin/python in the venv");
}

// ------------------------------------------------------------------ files

#[tokio::test]
async fn text_files_write_read_ranges_list_and_delete() {
    let server = StdioServer::start(&["--tools", "files"]).await;
    let root = server
        .workdir
        .path()
        .canonicalize()
        .expect("canonical root");
    let body = "line 1\nline 2\nline 3\nline 4\nline 5\n";

    write_then_read_whole_and_in_ranges(&server, &root, body).await;
    append_and_overwrite(&server, &root, body).await;
    list_at_each_depth(&server, &root, body).await;
    refuse_reads_and_writes_that_cannot_work(&server, &root).await;
    delete_files_and_directories_but_not_the_root(&server, &root).await;
}

/// file_write of `body` to notes/deep/a.txt (parents made), then file_read of
/// the whole file, of a range, and of a range past the end.
async fn write_then_read_whole_and_in_ranges(server: &StdioServer, root: &Path, body: &str) {
    let wrote = server
        .call(
            "file_write",
            json!({ "path": "notes/deep/a.txt", "text": body }),
        )
        .await;
    assert_success(&wrote, "file_write");
    assert_eq!(wrote.structured["bytes"], body.len(), "{wrote:#?}");
    assert_eq!(wrote.str_field("path"), "notes/deep/a.txt");
    assert!(!wrote.str_field("message").is_empty());
    assert_eq!(
        std::fs::read_to_string(root.join("notes/deep/a.txt")).expect("written file"),
        body,
        "file_write creates parents and writes the text"
    );

    // The whole file.
    let all = server
        .call("file_read", json!({ "path": "notes/deep/a.txt" }))
        .await;
    assert_success(&all, "file_read");
    let s = &all.structured;
    assert_eq!(s["binary"], false, "{all:#?}");
    assert_eq!(s["text"], body, "{all:#?}");
    assert_eq!(s["bytes"], body.len(), "{all:#?}");
    assert_eq!(s["total_lines"], 5, "{all:#?}");
    assert_eq!(s["start_line"], 1, "{all:#?}");
    assert_eq!(s["end_line"], 5, "{all:#?}");
    assert_eq!(s["path"], "notes/deep/a.txt", "{all:#?}");
    assert!(s["mime_type"].is_string(), "{all:#?}");
    assert!(all.text.contains("line 5"), "{all:#?}");

    // A range: exactly those lines.
    let range = server
        .call(
            "file_read",
            json!({ "path": "notes/deep/a.txt", "start_line": 2, "line_count": 3 }),
        )
        .await;
    assert_success(&range, "file_read range");
    assert_eq!(
        range.structured["text"], "line 2\nline 3\nline 4\n",
        "{range:#?}"
    );
    assert_eq!(range.structured["start_line"], 2, "{range:#?}");
    assert_eq!(range.structured["end_line"], 4, "{range:#?}");
    assert_eq!(range.structured["total_lines"], 5, "{range:#?}");
    assert!(range.text.contains("line 3"), "{range:#?}");
    assert!(!range.text.contains("line 1"), "{range:#?}");
    assert!(!range.text.contains("line 5"), "{range:#?}");

    // A range running past the end stops at the last line.
    let tail = server
        .call(
            "file_read",
            json!({ "path": "notes/deep/a.txt", "start_line": 5, "line_count": 10 }),
        )
        .await;
    assert_success(&tail, "file_read tail");
    assert_eq!(tail.structured["text"], "line 5\n", "{tail:#?}");
    assert_eq!(tail.structured["end_line"], 5, "{tail:#?}");
}

/// Appending to notes/deep/a.txt, and overwriting top.txt.
async fn append_and_overwrite(server: &StdioServer, root: &Path, body: &str) {
    let appended = server
        .call(
            "file_write",
            json!({ "path": "notes/deep/a.txt", "text": "line 6\n", "append": true }),
        )
        .await;
    assert_success(&appended, "file_write append");
    assert_eq!(appended.structured["bytes"], 7, "{appended:#?}");
    assert_eq!(
        std::fs::read_to_string(root.join("notes/deep/a.txt")).expect("appended file"),
        format!("{body}line 6\n")
    );
    // Overwrite.
    assert_success(
        &server
            .call("file_write", json!({ "path": "top.txt", "text": "first" }))
            .await,
        "file_write top",
    );
    assert_success(
        &server
            .call("file_write", json!({ "path": "top.txt", "text": "second" }))
            .await,
        "file_write overwrite",
    );
    assert_eq!(
        std::fs::read_to_string(root.join("top.txt")).expect("top.txt"),
        "second"
    );
}

/// file_list of the root (default depth 2), of a subdirectory deeper, and
/// of the top level only.
async fn list_at_each_depth(server: &StdioServer, root: &Path, body: &str) {
    let listing = server.call("file_list", json!({})).await;
    assert_success(&listing, "file_list");
    assert_eq!(
        listing.str_field("root"),
        path_str(root),
        "root is the workspace root: {listing:#?}"
    );
    assert_eq!(listing.structured["truncated"], false, "{listing:#?}");
    let entries = listing.structured["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries array: {listing:#?}"));
    let find = |p: &str| entries.iter().find(|e| e["path"] == p).cloned();
    let notes = find("notes").unwrap_or_else(|| panic!("notes missing: {listing:#?}"));
    assert_eq!(notes["kind"], "dir");
    let top = find("top.txt").unwrap_or_else(|| panic!("top.txt missing: {listing:#?}"));
    assert_eq!(top["kind"], "file");
    assert_eq!(top["size"], 6);
    assert!(
        find("notes/deep").is_some(),
        "depth 2 by default: {listing:#?}"
    );
    assert!(
        find("notes/deep/a.txt").is_none(),
        "the default depth is 2: {listing:#?}"
    );
    assert!(listing.text.contains("top.txt"), "{listing:#?}");
    assert!(listing.text.contains("notes"), "{listing:#?}");

    let deeper = server
        .call("file_list", json!({ "path": "notes", "depth": 3 }))
        .await;
    assert_success(&deeper, "file_list notes");
    let entries = deeper.structured["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries array: {deeper:#?}"));
    let a = entries
        .iter()
        .find(|e| e["path"] == "notes/deep/a.txt")
        .unwrap_or_else(|| panic!("notes/deep/a.txt missing: {deeper:#?}"));
    assert_eq!(a["kind"], "file");
    assert_eq!(a["size"], body.len() + 7);
    assert!(
        entries.iter().all(|e| e["path"] != "top.txt"),
        "listing a subdirectory shows only it: {deeper:#?}"
    );
    assert!(deeper.text.contains("a.txt"), "{deeper:#?}");

    let shallow = server
        .call("file_list", json!({ "path": ".", "depth": 1 }))
        .await;
    assert_success(&shallow, "file_list depth 1");
    let entries = shallow.structured["entries"].as_array().expect("entries");
    assert!(
        entries
            .iter()
            .all(|e| !e["path"].as_str().unwrap_or_default().contains('/')),
        "depth 1 lists only the top level: {shallow:#?}"
    );
}

/// Errors that are not escapes: missing files, a directory read as a file
/// and a file listed as a directory, writes with no content or with two.
async fn refuse_reads_and_writes_that_cannot_work(server: &StdioServer, root: &Path) {
    assert_tool_error(
        &server
            .call("file_read", json!({ "path": "missing.txt" }))
            .await,
        "read a missing file",
    );
    assert_tool_error(
        &server.call("file_read", json!({ "path": "notes" })).await,
        "read a directory",
    );
    assert_tool_error(
        &server.call("file_list", json!({ "path": "top.txt" })).await,
        "list a file",
    );
    assert_tool_error(
        &server.call("file_write", json!({ "path": "x.txt" })).await,
        "write with neither text nor base64",
    );
    assert_tool_error(
        &server
            .call(
                "file_write",
                json!({ "path": "x.txt", "text": "a", "base64": "YQ==" }),
            )
            .await,
        "write with both text and base64",
    );
    assert!(
        !root.join("x.txt").exists(),
        "a refused write wrote nothing"
    );
}

/// file_delete of a file, of an empty and of a full directory; never of
/// the root.
async fn delete_files_and_directories_but_not_the_root(server: &StdioServer, root: &Path) {
    let deleted = server
        .call("file_delete", json!({ "path": "top.txt" }))
        .await;
    assert_success(&deleted, "delete a file");
    assert!(!root.join("top.txt").exists());
    assert_tool_error(
        &server
            .call("file_delete", json!({ "path": "top.txt" }))
            .await,
        "delete a missing file",
    );
    assert_tool_error(
        &server.call("file_delete", json!({ "path": "notes" })).await,
        "delete a non-empty directory without recursive",
    );
    assert!(root.join("notes/deep/a.txt").is_file());
    std::fs::create_dir(root.join("empty")).expect("mkdir empty");
    assert_success(
        &server.call("file_delete", json!({ "path": "empty" })).await,
        "delete an empty directory",
    );
    assert!(!root.join("empty").exists());
    assert_success(
        &server
            .call("file_delete", json!({ "path": "notes", "recursive": true }))
            .await,
        "delete a directory recursively",
    );
    assert!(!root.join("notes").exists());

    // The root itself is refused, recursive or not.
    for path in [".", "", "./"] {
        assert_tool_error(
            &server
                .call("file_delete", json!({ "path": path, "recursive": true }))
                .await,
            &format!("delete the root as {path:?}"),
        );
    }
    assert!(root.is_dir(), "the workspace root survives");
}

#[tokio::test]
async fn binary_files_round_trip_as_base64_resources() {
    let server = StdioServer::start(&["--tools", "files"]).await;
    let root = server
        .workdir
        .path()
        .canonicalize()
        .expect("canonical root");

    // A PNG signature, NUL bytes and every byte value.
    let mut data: Vec<u8> = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    data.extend(0..=255u8);
    let wrote = server
        .call(
            "file_write",
            json!({ "path": "img/pic.png", "base64": b64_encode(&data) }),
        )
        .await;
    assert_success(&wrote, "file_write base64");
    assert_eq!(wrote.structured["bytes"], data.len(), "{wrote:#?}");
    assert_eq!(
        std::fs::read(root.join("img/pic.png")).expect("written png"),
        data
    );

    let read = server
        .call("file_read", json!({ "path": "img/pic.png" }))
        .await;
    assert_success(&read, "file_read binary");
    assert_eq!(read.structured["binary"], true, "{read:#?}");
    assert_eq!(read.structured["mime_type"], "image/png", "{read:#?}");
    assert_eq!(read.structured["bytes"], data.len(), "{read:#?}");
    let block = read
        .raw
        .content
        .get(1)
        .unwrap_or_else(|| panic!("no second content block: {read:#?}"));
    let block = serde_json::to_value(block).expect("content block as JSON");
    assert_eq!(block["type"], "resource", "an embedded resource: {block}");
    let resource = &block["resource"];
    assert_eq!(resource["mimeType"], "image/png", "{block}");
    let blob = resource["blob"]
        .as_str()
        .unwrap_or_else(|| panic!("no blob in the resource: {block}"));
    assert_eq!(
        b64_decode(blob).as_deref(),
        Ok(&data[..]),
        "the blob holds the written bytes"
    );

    // Invalid UTF-8 without NUL bytes is binary too.
    let latin1 = b"caf\xe9 cr\xe8me\n".to_vec();
    std::fs::write(root.join("latin1.txt"), &latin1).expect("write latin1");
    let read = server
        .call("file_read", json!({ "path": "latin1.txt" }))
        .await;
    assert_success(&read, "file_read invalid utf-8");
    assert_eq!(read.structured["binary"], true, "{read:#?}");
    let block = serde_json::to_value(read.raw.content.get(1).expect("resource block"))
        .expect("content block as JSON");
    assert_eq!(
        b64_decode(block["resource"]["blob"].as_str().expect("blob")).as_deref(),
        Ok(&latin1[..])
    );

    // Appending base64.
    let more = [0u8, 1, 2, 255];
    assert_success(
        &server
            .call(
                "file_write",
                json!({ "path": "img/pic.png", "base64": b64_encode(&more), "append": true }),
            )
            .await,
        "file_write base64 append",
    );
    let mut expected = data.clone();
    expected.extend_from_slice(&more);
    assert_eq!(
        std::fs::read(root.join("img/pic.png")).expect("appended png"),
        expected
    );

    // Invalid base64 is refused and writes nothing.
    assert_tool_error(
        &server
            .call(
                "file_write",
                json!({ "path": "bad.bin", "base64": "not base64 at all!!" }),
            )
            .await,
        "invalid base64",
    );
    assert!(!root.join("bad.bin").exists());
}

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

// ------------------------------------------------------------------ tool groups

#[tokio::test]
async fn tool_groups_hide_files_shell_and_packages() {
    let python_only = StdioServer::start(&["--tools", "python"]).await;
    let names = tool_names(python_only.peer()).await;
    assert!(
        names.iter().any(|n| n == "python_exec"),
        "python tools are listed: {names:?}"
    );
    for hidden in [
        "python_install",
        "file_list",
        "file_read",
        "file_write",
        "file_delete",
        "shell_exec",
        "shell_wait",
    ] {
        assert!(
            !names.iter().any(|n| n == hidden),
            "--tools python must not list {hidden}: {names:?}"
        );
    }
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("file_") || n.starts_with("shell_")),
        "--tools python lists no file or shell tool: {names:?}"
    );
    drop(python_only);

    let with_files = StdioServer::start(&["--tools", "python,files"]).await;
    let names = tool_names(with_files.peer()).await;
    for shown in [
        "python_exec",
        "file_list",
        "file_read",
        "file_write",
        "file_delete",
    ] {
        assert!(
            names.iter().any(|n| n == shown),
            "--tools python,files lists {shown}: {names:?}"
        );
    }
    assert!(
        !names.iter().any(|n| n.starts_with("shell_")),
        "--tools python,files lists no shell tool: {names:?}"
    );
    assert!(
        !names.iter().any(|n| n == "python_install"),
        "--tools python,files does not list python_install: {names:?}"
    );
}

// ------------------------------------------------------------------ packages

#[tokio::test]
async fn install_refuses_a_non_venv_interpreter_and_bad_arguments() {
    let python = real_python3();
    let python = path_str(&python);
    // Sessions not kept: no venv is kept for the workspace either (see
    // kept_venv.rs), so the plain interpreter is what the install meets.
    let server = StdioServer::start(&["--python", python, "--resume", "off"]).await;
    let wheel = build_wheel(server.workdir.path(), "ferrepl_refused_pkg", "1.0", 1);

    // The check runs inside the sandbox (the interpreter may be any file the
    // agent wrote), as the first step of the install job.
    let refused = server
        .call("python_install", json!({ "packages": [path_str(&wheel)] }))
        .await;
    assert!(
        refused.is_error,
        "install with a non-venv interpreter: {refused:#?}"
    );
    assert_eq!(refused.structured["exit_code"], 1, "{refused:#?}");
    assert!(
        refused.text.contains("virtual environment"),
        "the refusal says why: {refused:#?}"
    );
    assert!(
        refused.text.contains("python3 -m venv env") && refused.text.contains("--resume off"),
        "the refusal names the ways out: {refused:#?}"
    );

    for bad in ["-e", "--index-url=http://example.invalid/simple", "-r"] {
        let out = server
            .call("python_install", json!({ "packages": ["tqdm", bad] }))
            .await;
        assert_tool_error(&out, &format!("installer option {bad}"));
    }
    assert_tool_error(
        &server
            .call("python_install", json!({ "packages": [] }))
            .await,
        "empty package list",
    );

    // Nothing was installed: the session still cannot import it.
    server
        .exec("import ferrepl_refused_pkg")
        .await
        .assert_raised("ModuleNotFoundError");
}

#[tokio::test]
async fn venv_flag_creates_the_venv_and_install_imports_without_restart() {
    let venv_parent = tempfile::tempdir().expect("venv tempdir");
    let venv = venv_parent
        .path()
        .canonicalize()
        .expect("canonical venv parent")
        .join("env");
    assert!(!venv.exists());
    let python = real_python3();
    let python = path_str(&python);
    let server = StdioServer::start(&["--python", python, "--venv", path_str(&venv)]).await;
    assert!(
        venv.join("bin/python").exists() && venv.join("pyvenv.cfg").is_file(),
        "--venv creates the environment at startup"
    );

    // Sessions run the venv ferrepl keeps over it (the user's venv is
    // read-only to them: kept_venv.rs), outside the workspace.
    let prefix = server.exec("import sys\nsys.prefix").await;
    prefix.assert_ok();
    let shown = prefix.value().expect("sys.prefix value");
    let shown = Path::new(shown.trim_matches(['\'', '"']));
    assert!(
        shown != venv && !shown.starts_with(server.workdir.path()),
        "the session runs the kept venv: {prefix:#?}"
    );

    let wheel = build_wheel(server.workdir.path(), "ferrepl_probe_pkg", "0.1", 4242);
    server
        .exec("import ferrepl_probe_pkg")
        .await
        .assert_raised("ModuleNotFoundError");
    let pid_before = session_pid(&server, "default").await;

    let (_, finished_in_call) = install(&server, "default", &wheel).await;

    let value = import_value(&server, "default", "ferrepl_probe_pkg", finished_in_call).await;
    value.assert_ok();
    assert_eq!(value.value(), Some("4242"), "{value:#?}");
    let pid_after = session_pid(&server, "default").await;
    assert_eq!(
        pid_before, pid_after,
        "the install must not restart the session"
    );
    let in_site = |prefix: &Path| {
        std::fs::read_dir(prefix.join("lib"))
            .expect("venv lib")
            .filter_map(Result::ok)
            .any(|py| {
                py.path()
                    .join("site-packages/ferrepl_probe_pkg/__init__.py")
                    .is_file()
            })
    };
    assert!(in_site(shown), "the package went into the kept venv");
    assert!(!in_site(&venv), "nothing went into --venv");
}

#[tokio::test]
async fn install_into_a_session_created_with_a_venv() {
    let python = real_python3();
    let python = path_str(&python);
    let server = StdioServer::start(&["--python", python]).await;
    // A venv the agent makes inside the workspace may be named freely.
    let venv = server
        .workdir
        .path()
        .canonicalize()
        .expect("canonical workspace")
        .join("v-env");
    make_venv(&venv);

    let created = server
        .call(
            "python_sessions",
            json!({ "action": "create", "session": "v", "venv": path_str(&venv) }),
        )
        .await;
    assert_success(&created, "python_sessions create with venv");

    let prefix = server.exec_in("v", "import sys\nsys.prefix").await;
    prefix.assert_ok();
    let shown = prefix.value().expect("sys.prefix value");
    assert_eq!(
        Path::new(shown.trim_matches(['\'', '"']))
            .canonicalize()
            .expect("canonical sys.prefix"),
        venv,
        "session v runs the venv: {prefix:#?}"
    );

    let wheel = build_wheel(server.workdir.path(), "ferrepl_session_pkg", "2.0", 777);
    server
        .exec_in("v", "import ferrepl_session_pkg")
        .await
        .assert_raised("ModuleNotFoundError");
    let pid_before = session_pid(&server, "v").await;

    let (_, finished_in_call) = install(&server, "v", &wheel).await;

    let value = import_value(&server, "v", "ferrepl_session_pkg", finished_in_call).await;
    value.assert_ok();
    assert_eq!(value.value(), Some("777"), "{value:#?}");
    assert_eq!(
        session_pid(&server, "v").await,
        pid_before,
        "the install must not restart session v"
    );

    // The default session did not get it: it runs the venv ferrepl keeps
    // for the workspace (--python is not a venv), apart from session v's.
    server
        .exec("import ferrepl_session_pkg")
        .await
        .assert_raised("ModuleNotFoundError");
}

/// Build `<dir>/<name>-<version>-py3-none-any.whl` whose package has
/// `VALUE = <value>`; returns its path.
fn build_wheel(dir: &Path, name: &str, version: &str, value: i64) -> PathBuf {
    crate::support::pure_wheel(dir, name, version, value)
}
