//! Hand-made `upstream` events on the control channel neither crash nor hang
//! the server.

use serde_json::json;

use crate::support::StdioServer;
use crate::support::upstreams::{minimal_upstream, write_servers_file};

use super::*;

/// The server reads the session's control channel: hand-made `upstream`
/// events of every wrong shape (huge, non-string or missing names,
/// arguments that are no object or nested 10 000 deep, unknown ops, ids
/// negative, huge or not numbers, duplicate ids, a flood, lines that are
/// no JSON, a line over the 16 MiB limit and one just under it) neither
/// crash nor hang it: a normal call works afterwards, in that session and
/// another, and the server is alive.
#[tokio::test]
async fn hand_made_upstream_events_neither_crash_nor_hang_the_server() {
    let dir = outside();
    let file = write_servers_file(dir.path(), json!({ "m": minimal_upstream(dir.path()) }));
    let mut server = StdioServer::launch(with_servers(&file, &[])).await;
    let fuzz = format!(
        "{RAW_CHANNEL}{}",
        r#"
deep = b"[" * 10000 + b"]" * 10000
raw(b'{"ev":"upstream","id":7,"op":"call","server":"m","tool":"echo","arguments":' + deep + b'}\n')
raw(b'{"ev":"upstream","id":7,"op":"call","server":"m","tool":"echo","arguments":{"a":' + b'{"a":' * 10000 + b'1' + b'}' * 10000 + b'}}\n')
ev(id=1, op="call", server="m" * 5_000_000, tool="echo", arguments={})
ev(id=2, op="call", server=123, tool="echo")
ev(id=3, op="call", tool="echo", arguments={"text": "x"})
ev(id=4, op="call", server="m", tool="echo", arguments=[1, 2])
ev(id=5, op="call", server="m", tool="echo", arguments="x")
ev(id=6, op="call", server="m", tool=None)
ev(id=8, op="frobnicate", server="m")
ev(id=9, op="tools", server=["m"])
ev(id=10, op="call", server="m", tool="x" * 1_000_000, arguments={})
ev(id=11, op="tools", server="\udcff")
ev(id=12, op="call", server="m", tool="echo", arguments={"text": "\u0000\udcff"})
ev(id=-1, op="servers")
ev(id=2**64, op="servers")
ev(id=2**64 - 1, op="servers")
ev(id=1.5, op="servers")
ev(id="x", op="servers")
ev(op="servers")
ev(id=13, op="cancel")
ev(id=14, op=None)
for i in range(3):
    ev(id=15, op="call", server="m", tool="slow", arguments={"seconds": 1})
ev(id=15, op="cancel")
for i in range(2000):
    ev(id=1000 + i, op="servers" if i % 2 else "tools", server="m")
for junk in (b"\n", b"\xff\xfe\x00garbage\n", b"null\n", b"[]\n", b"{\n", b'{"ev":"upstream"}\n',
             b'{"ev":"nonsense","id":1}\n', b'{"ev":"reply","id":1}\n', b'{"ev":"upstream","id":1,"op":"call","server":"m"'):
    raw(junk)
raw(b"\n")
raw(b"x" * (17 << 20) + b"\n")
raw(b'{"ev":"upstream","id":16,"op":"call","server":"m","tool":"echo","arguments":{"text":"' + b"y" * ((16 << 20) - 300) + b'"}}\n')
time.sleep(1)
print(json.dumps(ferrepl.call("m", "echo", text="after the fuzz")))
"#
    );
    let after = cell_json(&server, "fuzz", &fuzz).await;
    assert_eq!(after, json!("after the fuzz"));
    server.assert_alive();
    // The lines reached the server's reader, which skipped what it could
    // not read.
    for logged in [
        "oversized event from worker skipped",
        "unreadable event from worker",
    ] {
        assert!(
            server.stderr_log().contains(logged),
            "the server did not log {logged:?}:\n{}",
            crate::support::tail(&server.stderr_log(), 4000)
        );
    }

    // The same session and another go on; a call too large to send is
    // refused with the reason, and the session keeps working.
    let big = cell_json(
        &server,
        "fuzz",
        r#"
import ferrepl, json
try:
    ferrepl.call("m", "echo", text="x" * 20_000_000)
    r = "no error"
except ferrepl.CallRefused as e:
    r = "CallRefused: %s" % e
print(json.dumps([r, ferrepl.call("m", "echo", text="still")]))
"#,
    )
    .await;
    let refusal = big[0].as_str().unwrap_or_default();
    assert!(
        refusal.starts_with("CallRefused: the arguments are") && refusal.contains("over the"),
        "a 20 MB call: {big:#}"
    );
    assert_eq!(big[1], json!("still"), "{big:#}");
    let other = cell_json(
        &server,
        "other",
        "import ferrepl, json\nprint(json.dumps(ferrepl.call('m', 'echo', text='other')))",
    )
    .await;
    assert_eq!(other, json!("other"));
    server.assert_alive();
    let status = server.close_and_wait().await;
    assert!(status.success(), "the server exited with {status:?}");
}
