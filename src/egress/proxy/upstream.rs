//! The policy checks on a destination and the connection to it.

use std::net::SocketAddr;

use tokio::net::TcpStream;
use tokio::time::timeout_at;

use super::deadline_after;
use super::refusal::Refusal;
use crate::egress::{DomainPattern, EgressConfig, Host, describe_domains, forbidden_ip};
use crate::metrics::EgressRefusal;

pub(super) fn authorize(rules: &EgressConfig, host: &Host, port: u16) -> Result<(), Refusal> {
    if let Some(domains) = &rules.domains {
        return authorize_cell(domains, host, port);
    }
    let (kind, message) = if !rules.allows(host) {
        let allowed = rules.hosts_list();
        (
            EgressRefusal::Host,
            format!(
                "ferrepl: egress to {host} is not allowed; allowed: {allowed}; the operator can add hosts with --allow-host-egress"
            ),
        )
    } else if !rules.allows_port(port) {
        let allowed = rules.ports_list();
        (
            EgressRefusal::Port,
            format!(
                "ferrepl: egress to {host} port {port} is not allowed; allowed ports: {allowed}"
            ),
        )
    } else {
        return Ok(());
    };
    Err(Refusal::forbidden(kind, message))
}

/// The cells' proxy: one of the `--allow-domain` patterns must admit the
/// host and the port. The refusal names the flag: the agent cannot change
/// it, the person who started ferrepl can.
fn authorize_cell(domains: &[DomainPattern], host: &Host, port: u16) -> Result<(), Refusal> {
    if domains.iter().any(|d| d.admits(host, port)) {
        return Ok(());
    }
    let allowed = describe_domains(domains);
    let (kind, message) = if domains.iter().any(|d| d.admits_host(host)) {
        (
            EgressRefusal::Port,
            format!(
                "ferrepl: {host} port {port} is not in --allow-domain ({allowed}; no port means 80 and 443); the operator can add it as {host}:{port}"
            ),
        )
    } else {
        (
            EgressRefusal::Host,
            format!(
                "ferrepl: {host} is not in --allow-domain ({allowed}); the operator can add it"
            ),
        )
    };
    Err(Refusal::forbidden(kind, message))
}

/// Resolves `host`, refuses it if any address is private (unless the
/// config allows that), and connects to the checked addresses in order
/// within `connect_timeout` overall.
pub(super) async fn connect(
    rules: &EgressConfig,
    host: &Host,
    port: u16,
) -> Result<TcpStream, Refusal> {
    let deadline = deadline_after(rules.connect_timeout);
    let addrs: Vec<SocketAddr> = match host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(name) => {
            match timeout_at(deadline, tokio::net::lookup_host((name.as_str(), port))).await {
                Err(_) => {
                    return Err(Refusal::new(
                        502,
                        format!("ferrepl: cannot resolve {host}: timed out"),
                    ));
                }
                Ok(Err(e)) => {
                    return Err(Refusal::new(
                        502,
                        format!("ferrepl: cannot resolve {host}: {e}"),
                    ));
                }
                Ok(Ok(addrs)) => addrs.collect(),
            }
        }
    };
    if addrs.is_empty() {
        return Err(Refusal::new(
            502,
            format!("ferrepl: cannot resolve {host}: no addresses"),
        ));
    }
    if !rules.allow_private
        && let Some(bad) = addrs.iter().find(|a| forbidden_ip(a.ip()))
    {
        return Err(Refusal::forbidden(
            EgressRefusal::PrivateAddress,
            format!(
                "ferrepl: egress to {host} is not allowed: it resolves to a private or loopback address ({}); the operator can allow such addresses with --egress-allow-private",
                bad.ip()
            ),
        ));
    }
    let mut last_error = String::from("no address tried");
    for addr in &addrs {
        match timeout_at(deadline, TcpStream::connect(addr)).await {
            Err(_) => {
                last_error = format!("{addr}: timed out");
                break;
            }
            Ok(Err(e)) => last_error = format!("{addr}: {e}"),
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
        }
    }
    Err(Refusal::new(
        502,
        format!("ferrepl: cannot connect to {host} port {port}: {last_error}"),
    ))
}
