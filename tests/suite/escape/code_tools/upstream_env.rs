//! An upstream's configured `env` reaches it and nothing the session can read.

use serde_json::json;

use crate::support::upstreams::{minimal_upstream, write_servers_file};
use crate::support::{StdioServer, everything, run_job, unique};

use super::*;

/// The upstream's configured `env` reaches the upstream (its `env` tool
/// answers it) and nothing else: not the session's environment, not any
/// /proc/*/environ or cmdline a cell can open, not a file it can read
/// under /tmp, HOME, TMPDIR or the workspace, not a shell job's view; the
/// servers file cannot be opened. And ferrepl's own environment (a
/// FERREPL_* variable or any other) never reaches the upstream.
#[tokio::test]
async fn an_upstreams_env_reaches_it_and_nothing_the_session_can_read() {
    let dir = outside();
    let secret = unique("upstreamsecret");
    let ferrepl_probe = unique("ferreplprobe");
    let operator_probe = unique("operatorprobe");
    let mut m = minimal_upstream(dir.path());
    m["env"] = json!({ "UPSTREAM_SECRET": secret });
    let file = write_servers_file(dir.path(), json!({ "m": m }));
    let server = StdioServer::launch(with_servers(&file, &[]).envs(&[
        ("FERREPL_SECRET_PROBE", &ferrepl_probe),
        ("OPERATOR_SECRET_PROBE", &operator_probe),
    ]))
    .await;
    let needles = [secret.as_str(), &ferrepl_probe, &operator_probe];
    let control = plant_control(server.workdir.path());

    // The upstream runs (started on first use) while the session looks.
    let scan = cell_json(
        &server,
        "probe",
        &format!(
            "import ferrepl\nassert ferrepl.call('m', 'echo', text='up') == 'up'\n{}",
            scan_code(&control, &needles, &file)
        ),
    )
    .await;
    assert_scan_clean(&scan, "a cell");

    let job = run_job(&server, dump_job(&file)).await;
    let seen = everything(&job);
    for needle in needles {
        assert!(
            !seen.contains(needle),
            "a shell job saw {needle:?}: {}",
            crate::support::tail(&seen, 4000)
        );
    }
    assert!(
        !seen.contains("SERVERS-FILE-READ"),
        "a job read the servers file"
    );

    // The upstream got its own variable (whole: the result is exactly the
    // marker it is redacted to, issue 42) and none of ferrepl's.
    let got = cell_json(
        &server,
        "probe",
        "import ferrepl, json\nprint(json.dumps([ferrepl.call('m', 'env', name=n) for n in \
         ('UPSTREAM_SECRET', 'FERREPL_SECRET_PROBE', 'OPERATOR_SECRET_PROBE')]))",
    )
    .await;
    assert_eq!(
        got,
        json!(["[redacted]", "", ""]),
        "the upstream has exactly its configured env over PATH/HOME/LANG"
    );
}
