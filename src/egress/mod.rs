//! Allow-listed egress for package installers (issue 11), and with
//! `--network domains` for cells and shell jobs (issue 46 §2).
//!
//! Under `--network packages` a package installer (`python_install`'s pip or
//! uv) runs in an empty network namespace. A relay inside that namespace
//! forwards the installer's TCP connections to `127.0.0.1:PORT` onto a Unix
//! socket where [`serve`] listens. This module is that listener: a small
//! forward proxy that admits only the host names the operator allowed at
//! start and nothing else. Under `--network domains` a second instance, on
//! a socket of its own, serves every other sandboxed process the same way,
//! admitting the `--allow-domain` patterns ([`DomainPattern`], each with its
//! ports) instead of the indexes, and bounding each client's (each relay's)
//! share of its connections.
//!
//! What it accepts, one request per client connection:
//!
//! * `CONNECT host:port HTTP/1.1` (HTTPS): answered `200 Connection
//!   established`, then bytes are copied both ways;
//! * absolute-form plain HTTP (`GET http://host[:port]/path HTTP/1.1`, any
//!   method): the request is forwarded in origin-form with `Host` set from
//!   the URL, hop-by-hop and proxy headers removed and `Connection: close`
//!   added; a `Content-Length` body is forwarded, nothing after it.
//!
//! What it refuses, at once, with a short HTTP response whose reason phrase
//! and one-line body say why (pip shows the reason phrase of a failed
//! `CONNECT`), each refusal logged with `tracing::warn!`:
//!
//! | status | when |
//! | -- | -- |
//! | 400 | malformed head, origin-form or `https://` absolute-form target, bad `Content-Length` |
//! | 403 | host not allowed, port not allowed, or the name resolves to a private or loopback address |
//! | 408 | the head did not arrive within `head_timeout` |
//! | 431 | the head exceeds `max_head_bytes` (or has more than 100 header lines) |
//! | 501 | a `Transfer-Encoding` request body on plain HTTP |
//! | 502 | the name does not resolve or the connection fails (with the reason) |
//! | 503 | `max_connections` connections are already open, or the client's or the tenant's share (`max_per_client`, `max_per_principal`) |
//!
//! Host names match case-insensitively and without a trailing dot; an entry
//! `*.example.com` admits every subdomain of `example.com` (not the name
//! itself). An IP literal is admitted only by an entry that is exactly that
//! IP. Every address a name resolves to is checked, and the proxy connects
//! only to the addresses it checked, so a name that rebinds between the check
//! and the connection gains nothing; any loopback, private, link-local,
//! unique-local, CGNAT, multicast, broadcast or unspecified address (IPv4
//! embedded in IPv6 included) makes the whole name refused, so an allowed
//! name cannot be pointed at ferrepl's own HTTP port or the LAN.
//!
//! Limits: connections at once, head size and time, connect time, and an
//! idle timeout on every tunnel (closed when neither direction moved a byte
//! for `idle_timeout`). Nothing a client sends can make the proxy panic or
//! hang.
//!
//! What it does not do: it does not look inside TLS. A client allowed to
//! reach a host can ask that host, inside the tunnel, for another name it
//! serves (domain fronting through a shared CDN). The allow-list bounds
//! which front ends are reachable, not which tenants behind them.

mod credentials;
mod domains;
#[cfg(target_os = "linux")]
mod intercept;
mod proxy;

pub use credentials::{IndexCredential, split_credentials};
pub use domains::DomainPattern;
#[cfg(target_os = "linux")]
pub use intercept::Interceptor;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use crate::metrics::EgressAudience;

#[allow(unused_imports)] // wired in by the installer work (issue 11)
pub use proxy::{SharedProxy, serve, serve_tcp};

/// The operator's egress policy, fixed at start.
#[derive(Debug, Clone)]
#[allow(dead_code)] // wired in by the installer work (issue 11)
pub struct EgressConfig {
    /// Host names that may be reached (exact, lowercase; a leading "*." allows subdomains).
    pub allowed_hosts: Vec<String>,
    /// Ports that may be reached (default [443, 80]).
    pub ports: Vec<u16>,
    /// Time to resolve a name and connect to it (default 10 s).
    pub connect_timeout: Duration,
    /// A tunnel idle this long is closed (default 60 s).
    pub idle_timeout: Duration,
    /// Time the client has to send the whole request head (default 10 s).
    pub head_timeout: Duration,
    /// Largest request head accepted (default 16 KiB).
    pub max_head_bytes: usize,
    /// Connections served at once (default 64); more are answered 503 at once.
    pub max_connections: usize,
    /// Allow destinations that resolve to loopback/private addresses
    /// (--egress-allow-private; proxy tests).
    pub allow_private: bool,
    /// Ends tunnels to indexes with credentials and adds them (Linux).
    #[cfg(target_os = "linux")]
    pub intercept: Option<std::sync::Arc<Interceptor>>,
    /// The cells' proxy (`--network domains`): these patterns, each with
    /// its ports, decide instead of `allowed_hosts` and `ports`.
    pub domains: Option<Vec<DomainPattern>>,
    /// Connections one client (one sandboxed process tree's relay) may
    /// hold at once, so that one session cannot take all of
    /// `max_connections` (None: no share).
    pub max_per_client: Option<usize>,
    /// Connections one principal (a tenant: the listener it came in on)
    /// may hold at once (None: no share).
    pub max_per_principal: Option<usize>,
}

#[allow(dead_code)] // wired in by the installer work (issue 11)
impl EgressConfig {
    /// The defaults, allowing `allowed_hosts` (normalized: trimmed,
    /// lowercase, no trailing dot, empty entries and duplicates dropped).
    pub fn new(allowed_hosts: Vec<String>) -> Self {
        let mut hosts: Vec<String> = Vec::with_capacity(allowed_hosts.len());
        for h in allowed_hosts {
            let h = h.trim().trim_end_matches('.').to_ascii_lowercase();
            if !h.is_empty() && !hosts.contains(&h) {
                hosts.push(h);
            }
        }
        EgressConfig {
            allowed_hosts: hosts,
            ports: vec![443, 80],
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            head_timeout: Duration::from_secs(10),
            max_head_bytes: 16 * 1024,
            max_connections: 64,
            allow_private: false,
            #[cfg(target_os = "linux")]
            intercept: None,
            domains: None,
            max_per_client: None,
            max_per_principal: None,
        }
    }

    /// The cells' proxy: `patterns` decide, with room for more
    /// connections than the installers' and a share per client.
    pub fn for_cells(patterns: Vec<DomainPattern>) -> Self {
        let mut config = EgressConfig::new(Vec::new());
        config.ports = Vec::new();
        config.domains = Some(patterns);
        config.max_connections = CELL_CONNECTIONS;
        config.max_per_client = Some(CELL_CONNECTIONS_PER_CLIENT);
        config.max_per_principal = Some(CELL_CONNECTIONS_PER_TENANT);
        config
    }

    /// Whom it serves (the metrics label of its refusals).
    pub fn audience(&self) -> EgressAudience {
        match self.domains {
            Some(_) => EgressAudience::Cells,
            None => EgressAudience::Installers,
        }
    }

    /// One line for logs and `server_status`:
    /// `pypi.org, files.pythonhosted.org (ports 443, 80)`.
    pub fn describe(&self) -> String {
        if let Some(domains) = &self.domains {
            return describe_domains(domains);
        }
        format!("{} (ports {})", self.hosts_list(), self.ports_list())
    }

    /// Whether `host` (a name or an IP literal, IPv6 with or without
    /// brackets) is on the allow-list.
    pub fn allows_host(&self, host: &str) -> bool {
        normalize_host(host).is_some_and(|h| self.allows(&h))
    }

    /// Whether `port` may be reached.
    pub fn allows_port(&self, port: u16) -> bool {
        self.ports.contains(&port)
    }

    pub(crate) fn allows(&self, host: &Host) -> bool {
        if let Some(domains) = &self.domains {
            return domains.iter().any(|d| d.admits_host(host));
        }
        self.allowed_hosts
            .iter()
            .any(|entry| entry_matches(entry, host))
    }

    pub(crate) fn hosts_list(&self) -> String {
        if self.allowed_hosts.is_empty() {
            "none".to_string()
        } else {
            self.allowed_hosts.join(", ")
        }
    }

    pub(crate) fn ports_list(&self) -> String {
        if self.ports.is_empty() {
            return "none".to_string();
        }
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        ports.join(", ")
    }
}

/// Connections the cells' proxy serves at once, for all sessions.
pub const CELL_CONNECTIONS: usize = 256;
/// Connections one sandboxed process (a session's worker, a shell job) may
/// hold through the cells' proxy at once.
pub const CELL_CONNECTIONS_PER_CLIENT: usize = 32;
/// Connections one tenant's sessions and jobs may hold through the cells'
/// proxy at once: half, as with the tenants' other shares.
pub const CELL_CONNECTIONS_PER_TENANT: usize = CELL_CONNECTIONS / 2;

/// `--allow-domain` patterns for logs and the status line:
/// `api.example.com, **.example.org:8443` (no port: 80 and 443).
pub fn describe_domains(domains: &[DomainPattern]) -> String {
    let list: Vec<String> = domains.iter().map(DomainPattern::to_string).collect();
    list.join(", ")
}

/// Host names of index URLs ("https://pypi.org/simple" -> "pypi.org"); None for garbage.
///
/// Only `http` and `https` URLs have a host here. The result is normalized
/// like an allow-list entry: lowercase, no trailing dot, IPv6 in brackets;
/// credentials and the port are dropped.
pub fn host_of_url(url: &str) -> Option<String> {
    let uri: http::Uri = url.trim().parse().ok()?;
    let scheme = uri.scheme_str()?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let host = normalize_host(uri.host()?)?;
    Some(host.to_string())
}

/// The port a URL names explicitly (`http://mirror:8080/` → 8080).
pub fn port_of_url(url: &str) -> Option<u16> {
    url.trim().parse::<http::Uri>().ok()?.port_u16()
}

/// A destination host, normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Host {
    /// A DNS name: lowercase, no trailing dot, letters, digits, `-`, `_`.
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// Parses a host as written in a request target or an allow-list entry.
/// IPv6 may be bracketed or bare; zone ids and anything that is neither an
/// IP nor a plausible DNS name are refused (None).
pub(crate) fn normalize_host(raw: &str) -> Option<Host> {
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner.strip_suffix(']')?;
        return inner
            .parse::<Ipv6Addr>()
            .ok()
            .map(|ip| Host::Ip(IpAddr::V6(ip)));
    }
    let name = raw.strip_suffix('.').unwrap_or(raw);
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Some(Host::Ip(ip));
    }
    if name.is_empty() || name.len() > 253 {
        return None;
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return None;
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return None;
        }
    }
    Some(Host::Name(name.to_ascii_lowercase()))
}

fn entry_matches(entry: &str, host: &Host) -> bool {
    let entry = entry.trim();
    if let Some(suffix) = entry.strip_prefix("*.") {
        // Wildcards admit subdomains of a name, never IP literals.
        let (Host::Name(name), Some(Host::Name(suffix))) = (host, normalize_host(suffix)) else {
            return false;
        };
        return name.len() > suffix.len() + 1
            && name.ends_with(&suffix)
            && name.as_bytes()[name.len() - suffix.len() - 1] == b'.';
    }
    normalize_host(entry).is_some_and(|e| &e == host)
}

/// Whether a resolved address is one the installer must never reach:
/// loopback, unspecified, RFC 1918 private, link-local, unique-local, CGNAT,
/// multicast, broadcast, reserved, or IPv4 embedded in IPv6 (mapped,
/// compatible, NAT64, 6to4) that is one of those. Documentation ranges are
/// allowed (test networks use them for public names).
pub(crate) fn forbidden_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, _, _] = ip.octets();
    a == 0 // "this network", 0.0.0.0 included: reaches the local host on Linux
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || (a == 100 && (b & 0xc0) == 64) // 100.64.0.0/10, carrier-grade NAT
        || a >= 240 // 240.0.0.0/4, reserved
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    let seg = ip.segments();
    let embedded_low = || {
        let [_, _, _, _, _, _, _, _, _, _, _, _, a, b, c, d] = ip.octets();
        Ipv4Addr::new(a, b, c, d)
    };
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (seg[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (seg[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
        || (seg[0] & 0xfe00) == 0xfc00 // unique-local fc00::/7
        || seg[..6].iter().all(|&s| s == 0) // IPv4-compatible ::/96 (deprecated)
        || (seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && forbidden_v4(embedded_low())) // NAT64
        || (seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1) // local-use NAT64 64:ff9b:1::/48
        || (seg[0] == 0x2002 && {
            // 6to4 2002:V4ADDR::/48
            let [a, b] = seg[1].to_be_bytes();
            let [c, d] = seg[2].to_be_bytes();
            forbidden_v4(Ipv4Addr::new(a, b, c, d))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(hosts: &[&str]) -> EgressConfig {
        EgressConfig::new(hosts.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn defaults_and_describe() {
        let c = cfg(&["pypi.org", "Files.PythonHosted.org.", "", "pypi.org"]);
        assert_eq!(c.allowed_hosts, ["pypi.org", "files.pythonhosted.org"]);
        assert_eq!(c.ports, [443, 80]);
        assert_eq!(c.connect_timeout, Duration::from_secs(10));
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.head_timeout, Duration::from_secs(10));
        assert_eq!(c.max_head_bytes, 16 * 1024);
        assert_eq!(c.max_connections, 64);
        assert!(!c.allow_private);
        assert_eq!(
            c.describe(),
            "pypi.org, files.pythonhosted.org (ports 443, 80)"
        );
        assert_eq!(cfg(&[]).describe(), "none (ports 443, 80)");
    }

    #[test]
    fn host_matching() {
        let c = cfg(&[
            "pypi.org",
            "*.example.com",
            "10.1.2.3",
            "[fd00::1]",
            "2001:db8::5",
        ]);
        let allowed = [
            "pypi.org",
            "PyPI.ORG",
            "pypi.org.",
            "a.example.com",
            "a.b.Example.com.",
            "10.1.2.3",
            "[fd00::1]",
            "[FD00:0::1]",
            "[2001:db8::5]",
        ];
        for h in allowed {
            assert!(c.allows_host(h), "{h} must be allowed");
        }
        let refused = [
            "pypi.org..",
            "www.pypi.org",
            "evilpypi.org",
            "pypi.org.evil.com",
            "example.com",
            "aexample.com",
            "10.1.2.4",
            "[::ffff:10.1.2.3]",
            "[fd00::1%eth0]",
            "",
            "pypi.org/",
            "pypi org",
        ];
        for h in refused {
            assert!(!c.allows_host(h), "{h} must be refused");
        }
        // Bare IPs are refused unless listed exactly, even when a name would match.
        assert!(!cfg(&["*.0.0.1"]).allows_host("127.0.0.1"));
        assert!(!cfg(&["pypi.org"]).allows_host("203.0.113.80"));
    }

    #[test]
    fn urls_to_hosts() {
        assert_eq!(
            host_of_url("https://pypi.org/simple").as_deref(),
            Some("pypi.org")
        );
        assert_eq!(
            host_of_url("https://pypi.org/simple/").as_deref(),
            Some("pypi.org")
        );
        assert_eq!(
            host_of_url(" HTTPS://User:Secret@Mirror.Example.COM.:8443/pypi/simple ").as_deref(),
            Some("mirror.example.com")
        );
        assert_eq!(host_of_url("http://10.0.0.5").as_deref(), Some("10.0.0.5"));
        assert_eq!(
            host_of_url("http://[fd00::1]:3141/root").as_deref(),
            Some("[fd00::1]")
        );
        assert_eq!(host_of_url("pypi.org/simple"), None);
        assert_eq!(host_of_url("file:///srv/wheels"), None);
        assert_eq!(host_of_url("ftp://pypi.org/"), None);
        assert_eq!(host_of_url(""), None);
        assert_eq!(host_of_url("https://"), None);
        assert_eq!(host_of_url("not a url"), None);
    }

    #[test]
    fn explicit_ports_are_read_from_urls() {
        assert_eq!(port_of_url("http://127.0.0.1:8123/cran"), Some(8123));
        assert_eq!(port_of_url("https://[::1]:9000/"), Some(9000));
        assert_eq!(port_of_url("https://cloud.r-project.org"), None);
        assert_eq!(port_of_url("https://u:p@host/x"), None);
        assert_eq!(port_of_url("not a url"), None);
    }

    #[test]
    fn forbidden_addresses() {
        let bad = [
            "127.0.0.1",
            "127.8.9.10",
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b:1::1",
            "2002:c0a8:101::1",
            "2002:7f00:1::",
        ];
        let good = [
            "203.0.113.80",
            "198.51.100.1",
            "192.0.2.1",
            "151.101.0.223",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.0.1",
            "2a04:4e42::223",
            "2001:db8::1",
            "::ffff:203.0.113.80",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ];
        for (addresses, forbidden) in [(&bad[..], true), (&good[..], false)] {
            for a in addresses {
                let ip: IpAddr = a.parse().unwrap();
                assert_eq!(
                    forbidden_ip(ip),
                    forbidden,
                    "{a}: forbidden must be {forbidden}"
                );
            }
        }
    }
}
