//! Namespace edits (set, delete, clear), refused while a cell runs.

use super::{POLL_TIMEOUT, gated_cell};
use crate::support::{
    StdioServer, assert_refused, assert_success, session_host_pid, wait_for_file_line,
};
use serde_json::{Value, json};

#[tokio::test]
async fn namespace_set_delete_and_clear() {
    let server = StdioServer::start(&[]).await;
    let set = server
        .call(
            "python_namespace",
            json!({"action": "set", "name": "cfg", "value": {"lr": 0.1, "layers": [1, 2]}}),
        )
        .await;
    assert_success(&set, "set");
    assert_eq!(set.structured["changed"], json!(["cfg"]), "{set:#?}");
    let read = server.exec("cfg['layers'][1]").await;
    read.assert_ok();
    assert_eq!(read.value(), Some("2"));
    let lr = server.exec("cfg['lr']").await;
    lr.assert_ok();
    assert_eq!(lr.value(), Some("0.1"));

    let deleted = server
        .call(
            "python_namespace",
            json!({"action": "delete", "names": ["cfg"]}),
        )
        .await;
    assert_success(&deleted, "deleted");
    assert_eq!(
        deleted.structured["changed"],
        json!(["cfg"]),
        "{deleted:#?}"
    );
    server.exec("cfg").await.assert_raised("NameError");

    let missing = server
        .call(
            "python_namespace",
            json!({"action": "delete", "names": ["never_defined"]}),
        )
        .await;
    assert_refused(&missing, &["never_defined"]);

    let pid = session_host_pid(&server, "default").await;
    server
        .exec("import json\nkeep_me = json.dumps([1])\nother = 5")
        .await
        .assert_ok();
    let cleared = server
        .call("python_namespace", json!({"action": "clear"}))
        .await;
    assert_success(&cleared, "cleared");
    let changed: Vec<&str> = cleared.structured["changed"]
        .as_array()
        .unwrap_or_else(|| panic!("no changed array: {cleared:#?}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in ["json", "keep_me", "other"] {
        assert!(changed.contains(&name), "{name} not cleared: {changed:?}");
    }
    server.exec("keep_me").await.assert_raised("NameError");
    server.exec("other").await.assert_raised("NameError");
    server.exec("json").await.assert_raised("NameError");
    let modules = server.exec("import sys\n'json' in sys.modules").await;
    modules.assert_ok();
    assert_eq!(
        modules.value(),
        Some("True"),
        "imported modules stay loaded after clear"
    );
    assert_eq!(
        session_host_pid(&server, "default").await,
        pid,
        "clear keeps the same interpreter"
    );
}

#[tokio::test]
async fn namespace_edits_are_refused_while_a_cell_runs() {
    let server = StdioServer::start(&[]).await;
    let dir = tempfile::tempdir_in(server.workdir.path()).expect("tempdir");
    let (started, gate) = (dir.path().join("started"), dir.path().join("gate"));
    let running = server
        .call(
            "python_exec",
            json!({"code": gated_cell(&started, &gate), "wait_s": 0}),
        )
        .await;
    assert_eq!(running.status(), "running", "{running:#?}");
    wait_for_file_line(&started, POLL_TIMEOUT).await;

    let refused = server
        .call(
            "python_namespace",
            json!({"action": "set", "name": "z", "value": 1}),
        )
        .await;
    assert_refused(&refused, &["busy"]);

    std::fs::write(&gate, "").expect("open the gate");
    server
        .call("python_wait", json!({"wait_s": 30}))
        .await
        .assert_ok();
    server.exec("z").await.assert_raised("NameError");
    let set = server
        .call(
            "python_namespace",
            json!({"action": "set", "name": "z", "value": null}),
        )
        .await;
    assert_success(&set, "set");
    let z = server.exec("z is None").await;
    z.assert_ok();
    assert_eq!(z.value(), Some("True"));
}
