//! The --tools groups that hide the file, shell and package tools.

use crate::support::{StdioServer, tool_names};

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
