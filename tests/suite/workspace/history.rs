//! Cell history: the cells run so far and the one still running.

use super::{POLL_TIMEOUT, gated_cell};
use crate::support::{StdioServer, assert_success, wait_for_file_line};
use serde_json::json;

#[tokio::test]
async fn history_lists_cells_and_the_running_one() {
    let server = StdioServer::start(&[]).await;
    let codes = [
        "print('alpha-out' + 'x' * 2000)",
        "20 + 22",
        "raise ValueError('boom-hist')",
    ];
    server.exec(codes[0]).await.assert_ok();
    server.exec(codes[1]).await.assert_ok();
    server.exec(codes[2]).await.assert_raised("ValueError");

    let all = server.call("python_history", json!({"last": 10})).await;
    assert_success(&all, "all");
    assert_eq!(all.structured["session"], "default", "{all:#?}");
    assert!(all.structured["running"].is_null(), "{all:#?}");
    let cells = all.structured["cells"]
        .as_array()
        .unwrap_or_else(|| panic!("no cells array: {all:#?}"));
    assert_eq!(cells.len(), 3, "{all:#?}");
    for (i, (entry, code)) in cells.iter().zip(codes).enumerate() {
        assert_eq!(entry["cell"].as_u64(), Some(i as u64 + 1), "{entry}");
        assert_eq!(entry["code"], code, "{entry}");
        assert!(entry["elapsed_ms"].as_f64().is_some(), "{entry}");
    }
    let statuses: Vec<&str> = cells.iter().filter_map(|c| c["status"].as_str()).collect();
    assert_eq!(statuses, ["ok", "ok", "error"], "{all:#?}");

    let preview = |i: usize| cells[i]["output_preview"].as_str().unwrap_or_default();
    assert!(preview(0).starts_with("alpha-outxxx"), "{:?}", preview(0));
    assert!(
        preview(0).len() < 2000,
        "the preview is only the start of the output: {} chars",
        preview(0).len()
    );
    assert!(preview(1).contains("42"), "{:?}", preview(1));
    assert!(preview(2).contains("boom-hist"), "{:?}", preview(2));
    assert!(all.text.contains("alpha-out"), "{:?}", all.text);

    let last_two = server.call("python_history", json!({"last": 2})).await;
    assert_success(&last_two, "last two");
    let numbers: Vec<u64> = last_two.structured["cells"]
        .as_array()
        .unwrap_or_else(|| panic!("no cells array: {last_two:#?}"))
        .iter()
        .filter_map(|c| c["cell"].as_u64())
        .collect();
    assert_eq!(numbers, [2, 3], "{last_two:#?}");

    // A cell blocked on a gate file shows as running.
    let dir = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");
    let (started, gate) = (dir.path().join("started"), dir.path().join("gate"));
    let gated = gated_cell(&started, &gate);
    let running = server
        .call("python_exec", json!({"code": gated, "wait_s": 0}))
        .await;
    assert_eq!(running.status(), "running", "{running:#?}");
    wait_for_file_line(&started, POLL_TIMEOUT).await;

    let during = server.call("python_history", json!({})).await;
    assert_success(&during, "during");
    let run = &during.structured["running"];
    assert_eq!(run["cell"].as_u64(), Some(4), "{during:#?}");
    assert_eq!(run["code"], gated.as_str(), "{during:#?}");
    assert_eq!(
        during.structured["cells"].as_array().map(Vec::len),
        Some(3),
        "the running cell is not among the finished ones: {during:#?}"
    );

    std::fs::write(&gate, "").expect("open the gate");
    let done = server.call("python_wait", json!({"wait_s": 30})).await;
    done.assert_ok();
    assert_eq!(done.value(), Some("'gate passed'"));
    let after = server.call("python_history", json!({"last": 1})).await;
    assert!(after.structured["running"].is_null(), "{after:#?}");
    assert_eq!(after.structured["cells"][0]["cell"].as_u64(), Some(4));
}
