//! A tenant sees only its servers and has its own upstreams.

use serde_json::{Value, json};

use crate::support::upstreams::{minimal_upstream_with_children, write_servers_file};
use crate::support::{HttpServer, Launch, path_str};

use super::*;

const ALICE: &str = "alice-token-0123456789abcdef0123";
const BOB: &str = "bob-token-0123456789abcdef012345";

/// Each tenant sees the servers granted to it, nothing of the others
/// (bob is told there is no server 'a' and shown only his), and has its
/// own upstream processes.
#[tokio::test]
async fn a_tenant_sees_only_its_servers_and_has_its_own_upstreams() {
    let dir = outside();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{ALICE} alice\n{BOB} bob\n")).expect("write the tokens");
    let mut a = minimal_upstream_with_children(dir.path());
    a["tenants"] = json!(["alice"]);
    let all = minimal_upstream_with_children(dir.path());
    let file = write_servers_file(dir.path(), json!({ "a": a, "all": all }));
    let server = HttpServer::launch(Launch::new(&[
        "--auth-token-file",
        path_str(&tokens),
        "--mcp-servers",
        path_str(&file),
        "--warm-pool",
        "0",
    ]))
    .await;
    let alice = server.connect(Some(ALICE)).await;
    let bob = server.connect(Some(BOB)).await;

    let probe = r#"
import ferrepl, json
out = {"servers": ferrepl.servers()}
for what, f in [("call", lambda: ferrepl.call("a", "pid")), ("tools", lambda: ferrepl.tools("a")),
                ("tool", lambda: ferrepl.tool("a", "pid"))]:
    try:
        r = f()
        out[what] = "OK " + (r if isinstance(r, str) else json.dumps(r, default=str))
    except ferrepl.Error as e:
        out[what] = "%s: %s" % (type(e).__name__, e)
out["all"] = [ferrepl.call("all", "pid"), ferrepl.call("all", "pid")]
print(json.dumps(out))
"#;
    let seen_by_bob = client_cell_json(&bob, probe).await;
    let seen_by_alice = client_cell_json(&alice, probe).await;

    assert_eq!(seen_by_bob["servers"], json!(["all"]), "{seen_by_bob:#}");
    for what in ["call", "tools", "tool"] {
        let got = seen_by_bob[what].as_str().unwrap_or_default();
        assert!(
            got.starts_with(
                "CallRefused: there is no MCP server 'a' for this session; there are: all"
            ),
            "bob's {what} of alice's server 'a': {got:?}"
        );
        assert!(!got.contains("alice"), "bob is told of alice: {got:?}");
    }
    assert_eq!(
        seen_by_alice["servers"],
        json!(["a", "all"]),
        "{seen_by_alice:#}"
    );
    assert!(
        seen_by_alice["call"]
            .as_str()
            .is_some_and(|s| s.starts_with("OK pid:[")),
        "alice calls her server: {seen_by_alice:#}"
    );

    // One upstream "all" per tenant, kept between calls.
    let pids = |seen: &Value| -> Vec<u32> {
        seen["all"]
            .as_array()
            .expect("two answers")
            .iter()
            .map(|a| upstream_host_pids(a.as_str().expect("text"))[0])
            .collect()
    };
    let (of_alice, of_bob) = (pids(&seen_by_alice), pids(&seen_by_bob));
    assert_eq!(of_alice[0], of_alice[1], "alice's calls share her upstream");
    assert_eq!(of_bob[0], of_bob[1], "bob's calls share his upstream");
    assert_ne!(
        of_alice[0], of_bob[0],
        "alice and bob share one upstream process of 'all'"
    );
    let a_pid = upstream_host_pids(
        seen_by_alice["call"]
            .as_str()
            .and_then(|s| s.strip_prefix("OK "))
            .expect("alice's answer"),
    )[0];
    assert!(
        ![of_alice[0], of_bob[0]].contains(&a_pid),
        "server 'a' has a process of its own"
    );
}
