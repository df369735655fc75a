//! The file tools on text files (write, read in ranges, list, delete, the
//! refusals of what cannot work) and binary files (base64 resources).

use std::path::Path;

use crate::support::{
    StdioServer, assert_success, assert_tool_error, b64_decode, b64_encode, path_str,
};
use serde_json::json;

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
