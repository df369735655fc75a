//! A session's and a tenant's share of the cells' proxy's connections,
//! held through real relays.

use serde_json::json;

use super::{TestSites, tool};
use crate::support::{StdioServer, ToolOutput, path_str, system_python};

/// A cell that opens `n` CONNECT tunnels to `target` through the relay and
/// keeps them open (in `held`); the status line of each answer, one a line.
fn tunnels_cell(n: usize, target: &str) -> String {
    format!(
        r#"
import socket
held = globals().setdefault("held", [])
lines = []
for _ in range({n}):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    held.append(s)
    lines.append(head.decode(errors="replace").split("\r\n")[0])
print("\n".join(lines))
"#
    )
}

/// The status lines a [`tunnels_cell`] printed.
fn status_lines(out: &ToolOutput) -> Vec<String> {
    assert!(!out.is_error, "the tunnels cell ran: {out:#?}");
    out.text
        .lines()
        .filter(|l| l.starts_with("HTTP/1.1 "))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn one_session_cannot_take_every_connection_of_the_cells_proxy() {
    let share = ferrepl::egress::CELL_CONNECTIONS_PER_CLIENT;
    let sites = TestSites::start().await;
    let python = system_python();
    let allow = sites.allow_localhost();
    let server = StdioServer::start(&[
        "--python",
        path_str(&python),
        "--network",
        "domains",
        "--allow-domain",
        &allow,
        "--egress-allow-private",
    ])
    .await;
    // The plain site: a tunnel to it needs no TLS handshake to stay open.
    let target = format!("localhost:{}", sites.http);
    let greedy = status_lines(
        &server
            .exec_in("greedy", &tunnels_cell(share + 1, &target))
            .await,
    );
    assert_eq!(greedy.len(), share + 1, "{greedy:#?}");
    assert!(
        greedy[..share]
            .iter()
            .all(|l| l.starts_with("HTTP/1.1 200")),
        "a session's first {share} tunnels open: {greedy:#?}"
    );
    assert!(
        greedy[share].starts_with("HTTP/1.1 503")
            && greedy[share].contains(&format!("already holds {share} egress connections")),
        "its next one is refused, saying why: {greedy:#?}"
    );
    // Another session, meanwhile, still gets its own.
    let other = status_lines(&server.exec_in("other", &tunnels_cell(2, &target)).await);
    assert!(
        other.len() == 2 && other.iter().all(|l| l.starts_with("HTTP/1.1 200")),
        "another session is not starved: {other:#?}"
    );
}

/// With tenants each has a listener of its own on the cells' proxy, by
/// which the proxy counts the tenant's share: one tenant's sessions holding
/// all of theirs leave the other tenant room.
#[tokio::test]
async fn one_tenant_cannot_take_every_connection_of_the_cells_proxy() {
    let per_session = ferrepl::egress::CELL_CONNECTIONS_PER_CLIENT;
    let per_tenant = ferrepl::egress::CELL_CONNECTIONS_PER_TENANT;
    let sessions = per_tenant / per_session;
    let sites = TestSites::start().await;
    let python = system_python();
    let allow = sites.allow_localhost();
    let max_sessions = (2 * (sessions + 2)).to_string();
    let (_dir, _server, alpha, beta) = crate::tenants::two_tenants(&[
        "--python",
        path_str(&python),
        "--network",
        "domains",
        "--allow-domain",
        &allow,
        "--egress-allow-private",
        "--max-sessions",
        &max_sessions,
    ])
    .await;
    let target = format!("localhost:{}", sites.http);
    for i in 0..sessions {
        let out = tool(
            &alpha,
            "python_exec",
            json!({ "code": tunnels_cell(per_session, &target), "session": format!("s{i}") }),
        )
        .await;
        let lines = status_lines(&out);
        assert!(
            lines.len() == per_session && lines.iter().all(|l| l.starts_with("HTTP/1.1 200")),
            "alpha's session s{i} opens its share: {lines:#?}"
        );
    }
    let over = tool(
        &alpha,
        "python_exec",
        json!({ "code": tunnels_cell(1, &target), "session": "over" }),
    )
    .await;
    let over = status_lines(&over);
    assert!(
        over.len() == 1
            && over[0].starts_with("HTTP/1.1 503")
            && over[0].contains(&format!(
                "this tenant's sessions and jobs already hold {per_tenant}"
            )),
        "alpha is at its share: {over:#?}"
    );
    let other = tool(
        &beta,
        "python_exec",
        json!({ "code": tunnels_cell(2, &target) }),
    )
    .await;
    let other = status_lines(&other);
    assert!(
        other.len() == 2 && other.iter().all(|l| l.starts_with("HTTP/1.1 200")),
        "beta still connects: {other:#?}"
    );
}
