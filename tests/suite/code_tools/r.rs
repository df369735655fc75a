//! Code calls tools from R (issue 33): ferrepl_servers(), ferrepl_tools()
//! and ferrepl_call() against real upstream servers, through the server.

use serde_json::json;

use crate::support::result::assert_status;
use crate::support::stdio::StdioServer;
use crate::support::upstreams::{everything_stdio, own_upstream, write_servers_file};

/// A server with R and the given upstreams (the file outside the workspace).
async fn r_server_with(servers: serde_json::Value) -> (StdioServer, tempfile::TempDir) {
    let files = tempfile::tempdir().expect("servers dir");
    let path = write_servers_file(files.path(), servers);
    let server = StdioServer::start(&[
        "--languages",
        "python,r",
        "--mcp-servers",
        path.to_str().expect("utf-8"),
    ])
    .await;
    (server, files)
}

async fn r(server: &StdioServer, code: &str, wait_s: f64) -> crate::support::result::ToolOutput {
    server
        .call("r_exec", json!({"code": code, "wait_s": wait_s}))
        .await
}

#[tokio::test]
async fn an_r_cell_lists_and_calls_real_upstreams() {
    let log_dir = tempfile::tempdir().expect("log dir");
    let log = log_dir.path().join("upstream.log");
    let mut own = own_upstream(&[]);
    own["env"] = json!({"UPSTREAM_LOG": log.to_str().expect("utf-8")});
    let (server, _files) =
        r_server_with(json!({"own": own, "everything": everything_stdio()})).await;

    let out = r(
        &server,
        "cat(ferrepl_servers(), sep = ','); cat('\\n')\n\
         tools <- vapply(ferrepl_tools('own'), function(t) t$name, '')\n\
         cat(all(c('echo', 'add', 'image') %in% tools), '\\n')\n\
         s <- ferrepl_call('own', 'add', a = 2, b = 40)\n\
         cat('sum', s$sum, '\\n')\n\
         cat(ferrepl_call('own', 'echo', text = 'h\\u00e9 \"q\"'), '\\n')\n\
         cat(ferrepl_call('everything', 'echo', message = 'from R'), '\\n')\n\
         img <- ferrepl_call('own', 'image')\n\
         cat(img[[1]]$mime_type, length(img[[1]]$data), identical(img[[1]]$data[1:4], as.raw(c(0x89, 0x50, 0x4e, 0x47))), '\\n')\n\
         e <- tryCatch(ferrepl_call('own', 'fail', message = 'it broke'), ferrepl_tool_error = function(e) conditionMessage(e))\n\
         cat('caught', e, '\\n')\n\
         e <- tryCatch(ferrepl_call('nope', 'x'), ferrepl_refused = function(e) conditionMessage(e))\n\
         cat('refused', e, '\\n')\n\
         ls()",
        120.0,
    )
    .await;
    assert_status(&out, "ok");
    for needle in [
        "everything,own\n",
        "TRUE \n",
        "sum 42 \n",
        "hé \"q\" \n",
        "Echo: from R \n",
        "image/png",
        "caught it broke \n",
        "refused there is no MCP server 'nope' for this session; there are: everything, own",
        "Tool calls: 6, 2 failed",
    ] {
        assert!(out.text.contains(needle), "{needle:?} in:\n{}", out.text);
    }
    assert!(
        out.text.contains(" TRUE \n"),
        "the image's PNG signature: {}",
        out.text
    );
    // The session's global environment holds only the cell's own names.
    assert!(
        out.text
            .contains("[1] \"e\"     \"img\"   \"s\"     \"tools\""),
        "no ferrepl names in the global environment: {}",
        out.text
    );

    // An interrupt during a call cancels it upstream; the session goes on.
    let slow = r(
        &server,
        "kept <- 41; ferrepl_call('own', 'slow', seconds = 60)",
        1.0,
    )
    .await;
    assert_status(&slow, "running");
    let stopped = server
        .call("r_wait", json!({"interrupt": true, "wait_s": 30}))
        .await;
    assert_status(&stopped, "interrupted");
    assert!(
        stopped
            .text
            .contains("ferrepl_call(\"own\", \"slow\", seconds = 60)"),
        "the backtrace ends at the user's call: {}",
        stopped.text
    );
    assert!(
        !stopped.text.contains("poll_line"),
        "no driver frames: {}",
        stopped.text
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("cancelled") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the upstream was never told the call was cancelled:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let after = r(&server, "kept + 1", 30.0).await;
    assert_status(&after, "ok");
    assert!(after.text.contains("[1] 42"), "{}", after.text);
}

#[tokio::test]
async fn r_exec_names_the_servers_only_when_some_are_configured() {
    let (server, _files) = r_server_with(json!({"own": own_upstream(&[])})).await;
    let tools = server.peer().list_all_tools().await.expect("tools/list");
    let r_exec = tools.iter().find(|t| t.name == "r_exec").expect("r_exec");
    let description = r_exec.description.as_deref().unwrap_or("");
    assert!(
        description.contains("Code can call MCP tools of own: ferrepl_tools(server)"),
        "{description}"
    );
    let plain = StdioServer::start(&["--languages", "python,r"]).await;
    let tools = plain.peer().list_all_tools().await.expect("tools/list");
    let r_exec = tools.iter().find(|t| t.name == "r_exec").expect("r_exec");
    assert!(
        !r_exec
            .description
            .as_deref()
            .unwrap_or("")
            .contains("ferrepl_call"),
        "no words about tools without servers"
    );
}
