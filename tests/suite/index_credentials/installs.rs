//! Installs through the credentialed index, and what start-up refuses.

use super::*;

// ------------------------------------------------------------ A

/// Attacks the plain path: does the operator's credentialed index work at
/// all, and does anything the agent reads (install result, job log, the
/// status listing the allowed hosts) or ferrepl's log carry the token?
/// Every request that reached the index (after the test's own probe of it)
/// must carry the credentials, and only GETs and HEADs of the two paths
/// this install needs did; pip's log must show it was given the index URL without
/// userinfo (so the credentials on those GETs were ferrepl's doing; test B
/// looks inside the job itself).
#[tokio::test]
async fn installs_from_a_credentialed_index_work_and_the_token_stays_out_of_every_result() {
    let index = TestIndex::start().await;
    index.assert_demands_credentials();
    let from = index.requests().len();

    let server = start_server(&index).await;
    let (first, last) = install(&server, &[PKG]).await;
    assert_installed(&last, &server, &index);

    let imported = imported_value(&server, first.structured["status"] != "running").await;
    imported.assert_ok();
    assert_eq!(
        imported.value(),
        Some(PKG_VALUE.to_string().as_str()),
        "{imported:#?}"
    );

    // What reached the index: the project page and the wheel, each with
    // the credentials ferrepl added (the job had none to add), and nothing
    // else with them.
    let log = index.requests();
    let seen = &log[from..];
    let lines = request_lines(seen);
    let page = format!("GET /simple/{PKG}/ auth=ok");
    let file = format!("GET /files/{WHEEL} auth=ok");
    for needed in [&page, &file] {
        assert!(
            lines.contains(&needed),
            "the index never got {needed:?}: ferrepl did not add the credentials\n{}",
            index.diagnostics()
        );
    }
    let allowed_paths = [format!("/simple/{PKG}/"), format!("/files/{WHEEL}")];
    for line in &lines {
        let mut parts = line.split(' ');
        let (method, path, auth) = (parts.next(), parts.next(), parts.next());
        assert!(
            matches!(method, Some("GET" | "HEAD"))
                && path.is_some_and(|p| allowed_paths.iter().any(|a| a == p))
                && auth == Some("auth=ok"),
            "a request other than the install's GETs reached the index, or one without \
             the credentials: {line:?}\n{}",
            index.diagnostics()
        );
    }

    // Nothing the agent reads holds the token or its base64.
    assert_no_secret(&whole(&first), "the python_install result");
    assert_no_secret(&whole(&last), "the install job's final result");
    let job = first.str_field("job").to_string();
    let output = server.call("python_output", json!({ "job": job })).await;
    assert!(!output.is_error, "python_output of the job: {output:#?}");
    assert_no_secret(&whole(&output), "the install job's full output");

    // pip got the URL without userinfo. It prints the index it looks in,
    // masking a password but not the user (`https://alice:****@...`), so
    // an installer given the credentials shows here even though the
    // token itself is masked.
    for (out, what) in [
        (&first, "the python_install result"),
        (&output, "the job's full output"),
    ] {
        assert!(
            !whole(out).contains(&format!("//{USER}")),
            "{what} shows the index URL with its userinfo: the install job was given \
             the credentials: {out:#?}"
        );
    }
    if output.text.contains("Looking in indexes:") {
        assert!(
            output
                .text
                .contains(&format!("Looking in indexes: {}", index.url())),
            "pip looks in the index without userinfo: {output:#?}"
        );
    }
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "{status:#?}");
    assert!(
        status.text.contains("localhost"),
        "the status lists the index's host: {}",
        status.text
    );
    assert_no_secret(&whole(&status), "python_sessions status");
    // Nor does ferrepl's own log (operators ship logs to places that see
    // less protection than the secret).
    assert_no_secret(&server.stderr_log(), "ferrepl's stderr log");
}

// ------------------------------------------------------------ B

// ------------------------------------------------------------ C

/// Runs ferrepl with `args` and `envs` until it exits: it must refuse to
/// start (non-zero, within REFUSAL_TIMEOUT). Its stderr.
async fn refused(args: &[&str], envs: &[(&str, &str)]) -> String {
    let workdir = tempfile::tempdir().expect("workdir");
    let mut cmd = server_command();
    cmd.arg("--workdir")
        .arg(workdir.path())
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(REFUSAL_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} {envs:?}: ferrepl neither refused nor exited"))
        .expect("run ferrepl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "ferrepl must refuse to start with {args:?}; it exited {}:\n{stderr}",
        out.status
    );
    stderr
}

/// Attacks the operator's configuration: credentials that would cross the
/// network in clear text (an `http://` index), or land in the job after all
/// (`--network on`: the installer talks to the index itself, no proxy to
/// add them). Both are refused at start, saying why, without echoing the
/// token into the log. An `http://` index without credentials still starts.
#[tokio::test]
async fn a_credentialed_index_over_http_or_with_network_on_is_refused_at_start() {
    // Nothing listens at port 9: a start must not need the index.
    let clear = format!("http://{USER}:{TOKEN}@localhost:9/simple");
    let stderr = refused(&[], &[("PIP_INDEX_URL", &clear)]).await;
    let lower = stderr.to_lowercase();
    assert!(
        lower.contains("credential") && lower.contains("https"),
        "the refusal says credentials are only sent over https:\n{stderr}"
    );
    assert_no_secret(&stderr, "the refusal of an http:// index");

    let tls = format!("https://{USER}:{TOKEN}@localhost:9/simple");
    let stderr = refused(&["--network", "on"], &[("PIP_INDEX_URL", &tls)]).await;
    assert!(
        stderr.contains("--network packages"),
        "the refusal names --network packages:\n{stderr}"
    );
    assert_no_secret(&stderr, "the refusal of --network on");

    // Control: the refusals are about the credentials. Without them an
    // http:// index starts, and so does --network on.
    for (args, url) in [
        (&[][..], "http://localhost:9/simple"),
        (&["--network", "on"][..], "https://localhost:9/simple"),
    ] {
        let mut server = StdioServer::start_with_env(args, &[("PIP_INDEX_URL", url)]).await;
        let status = server
            .call("python_sessions", json!({ "action": "status" }))
            .await;
        assert!(!status.is_error, "{args:?} {url}: {status:#?}");
        server.assert_alive();
    }
}

/// Attacks the parsing of credentials that do not parse: a raw `#` in a
/// password (`https://alice:S3cr#tT0ken@host/simple`) ends the authority
/// for a URL parser (the rest is a fragment), so no credentials were found
/// and the URL went to the install job as written, password and all, in
/// pip's argv and in what pip printed. ferrepl must refuse to start, say
/// how to write it (percent-encoded), and not echo the password pieces;
/// the same for uv's named form and an extra index.
#[tokio::test]
async fn credentials_that_cannot_be_taken_out_of_the_url_are_refused_at_start() {
    // Nothing listens at port 9: a start must not need the index.
    let raw = format!("https://{USER}:S3cr#tT0ken@localhost:9/simple");
    let named = format!("internal={raw}");
    for (var, value) in [
        ("PIP_INDEX_URL", raw.as_str()),
        ("PIP_EXTRA_INDEX_URL", raw.as_str()),
        ("UV_INDEX", named.as_str()),
    ] {
        let stderr = refused(&[], &[(var, value)]).await;
        assert!(
            stderr.to_lowercase().contains("percent-encod"),
            "{var}: the refusal says to percent-encode the credentials:\n{stderr}"
        );
        for piece in ["S3cr#tT0ken", "S3cr", "tT0ken", "//alice"] {
            assert!(
                !stderr.contains(piece),
                "{var}: the refusal echoes {piece:?} of the credentials:\n{stderr}"
            );
        }
    }
}

// ------------------------------------------------------------ D

/// What the agent reads of a finished install from the credentialed index
/// (the call's result, the job's final result, its full output, the
/// status) and ferrepl's log: none holds the token, its base64 or the
/// index URL with its userinfo; pip says it looks in `index_url`. Also the
/// import of the package.
pub(super) async fn assert_clean_install(
    server: &StdioServer,
    index: &TestIndex,
    index_url: &str,
    first: &ToolOutput,
    last: &ToolOutput,
) {
    let job = first.str_field("job").to_string();
    let output = server.call("python_output", json!({ "job": job })).await;
    assert!(!output.is_error, "python_output of the job: {output:#?}");
    let status = server
        .call("python_sessions", json!({ "action": "status" }))
        .await;
    assert!(!status.is_error, "{status:#?}");
    for (out, what) in [
        (first, "the python_install result"),
        (last, "the install job's final result"),
        (&output, "the install job's full output"),
        (&status, "python_sessions status"),
    ] {
        let text = whole(out);
        assert_no_secret(&text, what);
        assert!(
            !text.contains(&format!("//{USER}")),
            "{what} shows the index URL with its userinfo: {out:#?}"
        );
    }
    assert_no_secret(&server.stderr_log(), "ferrepl's stderr log");
    if output.text.contains("Looking in indexes:") {
        assert!(
            output.text.contains(index_url),
            "pip looks in {index_url} (no userinfo, no name): {output:#?}"
        );
    }
    assert_installed(last, server, index);
    let imported = imported_value(server, first.structured["status"] != "running").await;
    imported.assert_ok();
    assert_eq!(
        imported.value(),
        Some(PKG_VALUE.to_string().as_str()),
        "{imported:#?}"
    );
}

/// The install through an index named the uv way in `var`
/// (`internal=https://alice:TOKEN@localhost:PORT/simple`), no
/// PIP_INDEX_URL: works, with the credentials ferrepl added, and the token
/// stays out of every result.
async fn install_through_a_uv_named_index(var: &str) {
    let index = TestIndex::start().await;
    let entry = format!("internal={}", index.url_with_credentials());
    let server = start_server_with(&index, &[(var, &entry)]).await;
    // Pinned: as an extra index (UV_INDEX) it is looked in besides PyPI.
    let (first, last) = install(&server, &[&format!("{PKG}==1.0")]).await;
    assert_clean_install(&server, &index, &index.url(), &first, &last).await;
    let lines = index.requests();
    for needed in [
        format!("GET /simple/{PKG}/ auth=ok"),
        format!("GET /files/{WHEEL} auth=ok"),
    ] {
        assert!(
            lines.contains(&needed),
            "the index never got {needed:?}: ferrepl did not add the credentials of {var}\n{}",
            index.diagnostics()
        );
    }
}

/// Attacks the parsing of uv's named indexes: in
/// `UV_INDEX=internal=https://alice:TOKEN@host/simple` the index is named
/// `internal`. Taken whole as a URL, `internal=https://...` has no
/// userinfo a URL parser finds, so the credentials stayed in it and pip
/// got the entry verbatim, token included, and printed it (`Looking in
/// indexes: ..., internal=https://alice:TOKEN@...`: pip masks passwords
/// only in what it parses as a URL). The name must be split off and the
/// credentials taken out as PIP_INDEX_URL's are. (PyPI stays the main
/// index here: the install looks there too.)
#[tokio::test]
async fn uv_index_named_form_keeps_the_token_out_of_the_install_job() {
    install_through_a_uv_named_index("UV_INDEX").await;
}

/// The same attack through `UV_DEFAULT_INDEX=internal=https://alice:TOKEN@...`,
/// which replaces PyPI (pip's `--index-url`).
#[tokio::test]
async fn uv_default_index_named_form_keeps_the_token_out_of_the_install_job() {
    install_through_a_uv_named_index("UV_DEFAULT_INDEX").await;
}

// ------------------------------------------------------------ E

/// An install from an index whose connections end as `connections` says
/// works, with the credentials ferrepl added.
async fn install_through_closing_index(connections: Connections) {
    let index = TestIndex::start_with(connections).await;
    index.assert_demands_credentials();
    let server = start_server(&index).await;
    let (first, last) = install(&server, &[PKG]).await;
    assert_clean_install(&server, &index, &index.url(), &first, &last).await;
    let lines = index.requests();
    for needed in [
        format!("GET /simple/{PKG}/ auth=ok"),
        format!("GET /files/{WHEEL} auth=ok"),
    ] {
        assert!(
            lines.contains(&needed),
            "the index never got {needed:?}\n{}",
            index.diagnostics()
        );
    }
}

/// Attacks availability: an index (or the balancer in front of it) that
/// closes the connection after every answer (`Connection: close`).
/// ferrepl ends the installer's tunnel and keeps a connection to the index
/// for it; the close was not passed on, so the installer kept its tunnel,
/// and its second request on it (the wheel, after the project page) got
/// 502 from ferrepl, the connection to the index being gone: the install
/// failed. Now the close reaches the installer, which opens a new tunnel.
#[tokio::test]
async fn an_index_that_closes_every_connection_still_serves_installs() {
    install_through_closing_index(Connections::Close).await;
}

/// The same with an index that closes after every answer without saying
/// so (an idle timeout between the installer's requests): the installer
/// keeps its tunnel and sends its next request on it, so ferrepl must
/// connect to the index again (before: 502, the install failed).
#[tokio::test]
async fn an_index_that_drops_every_connection_silently_still_serves_installs() {
    install_through_closing_index(Connections::Drop).await;
}
