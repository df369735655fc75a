//! With the network off the only interface is a private loopback.

use std::collections::BTreeSet;

use serde_json::json;

use crate::support::{StdioServer, json_line, run_cell, run_job};

/// Interface names of a `/proc/net/dev` text.
fn interfaces(text: &str) -> BTreeSet<String> {
    text.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim().to_string())
        .collect()
}

#[tokio::test]
async fn with_the_network_off_the_only_interface_is_loopback() {
    let mut server = StdioServer::start(&[]).await;
    let only_lo: BTreeSet<String> = ["lo".to_string()].into();

    let out = run_cell(
        &server,
        "default",
        "import json\nprint('NETDEV=' + json.dumps(open('/proc/net/dev').read()))",
    )
    .await;
    let text = json_line(&out, "NETDEV");
    let seen = interfaces(text.as_str().expect("a string"));
    assert_eq!(
        seen, only_lo,
        "the session sees network interfaces other than its own lo: {text}"
    );

    let job = run_job(&server, json!({ "command": "cat /proc/net/dev" })).await;
    let seen = interfaces(job.str_field("stdout"));
    assert_eq!(
        seen, only_lo,
        "a shell job sees network interfaces other than its own lo: {job:#?}"
    );

    server.assert_alive();
    server.close_and_wait().await;
}
