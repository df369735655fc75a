//! Code calls tools (issue 33): an upstream tool's progress is relayed as
//! the cell's progress (notifications/progress of the python_exec call).

use serde_json::json;

use crate::support::long_running::{LongRunningServer, finish};
use crate::support::result::assert_status;
use crate::support::upstreams::{everything_stdio, write_servers_file};

#[tokio::test]
async fn an_upstream_tools_progress_is_the_cells_progress() {
    let files = tempfile::tempdir().expect("servers dir");
    let path = write_servers_file(files.path(), json!({"everything": everything_stdio()}));
    let srv = LongRunningServer::stdio(&["--mcp-servers", path.to_str().expect("utf-8")]).await;
    // The reference server reports each of its steps while the call runs.
    let code = "import ferrepl\n\
                ferrepl.call('everything', 'trigger-long-running-operation', duration=8, steps=4)";
    let handle = srv
        .start_call("python_exec", json!({"code": code, "wait_s": 45}))
        .await;
    let token = handle.progress_token.clone();
    srv.recorder
        .wait_progress(&token, |p| {
            p.message.as_deref().is_some_and(|m| {
                m.contains("everything.trigger-long-running-operation: ") && m.contains("/4")
            })
        })
        .await;
    let result = finish(handle).await;
    assert_status(&result, "ok");
    assert!(result.text.contains("Tool calls: 1"), "{}", result.text);
}
