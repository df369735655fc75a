//! The cells' allow-list (`--allow-domain`, issue 46 §2): patterns of host
//! names with an optional port, parsed once at start and matched by the
//! cells' egress proxy. It never resolves names and never decides on
//! addresses: the proxy's refusal of private addresses applies after a
//! pattern admitted the name.
//!
//! | pattern | admits |
//! | -- | -- |
//! | `example.com` | that name only |
//! | `*.example.com` | its subdomains, not `example.com` itself |
//! | `**.example.com` | `example.com` and its subdomains |
//! | `10.0.0.5`, `[fd00::1]` | that IP literal only (no wildcard over IPs) |
//!
//! Each may end in `:PORT`; without one, ports 80 and 443.

use std::fmt;

use super::{Host, normalize_host};

/// The ports a pattern without `:PORT` admits.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Which names under a pattern's host it admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Exact,
    /// `*.`: subdomains only.
    Subdomains,
    /// `**.`: the name and its subdomains.
    ApexAndSubdomains,
}

/// One `--allow-domain` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainPattern {
    host: Host,
    scope: Scope,
    /// None: [`DEFAULT_PORTS`].
    port: Option<u16>,
}

impl DomainPattern {
    /// Parses one entry; the error says what is wrong with it (the caller
    /// names the flag).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let entry = raw.trim();
        if entry.is_empty() {
            return Err("an empty pattern".to_string());
        }
        let (host_part, port) = split_port(entry)?;
        if host_part.chars().all(|c| c == '*' || c == '.') {
            return Err(
                "a wildcard alone would admit every host; name a domain, e.g. *.example.com"
                    .to_string(),
            );
        }
        let (scope, name) = if let Some(rest) = host_part.strip_prefix("**.") {
            (Scope::ApexAndSubdomains, rest)
        } else if let Some(rest) = host_part.strip_prefix("*.") {
            (Scope::Subdomains, rest)
        } else {
            (Scope::Exact, host_part)
        };
        if name.contains('*') {
            return Err(
                "a wildcard may only open the pattern, as *. (subdomains) or **. (the name and its subdomains)"
                    .to_string(),
            );
        }
        let host =
            normalize_host(name).ok_or_else(|| format!("{name:?} is not a host name or IP"))?;
        if scope != Scope::Exact {
            match &host {
                Host::Ip(_) => {
                    return Err("an IP address cannot take a wildcard; name it exactly".to_string());
                }
                Host::Name(n) if !n.contains('.') => {
                    return Err(format!(
                        "a wildcard over the whole top-level domain {n:?} admits too much; name a domain under it"
                    ));
                }
                Host::Name(_) => {}
            }
        }
        Ok(DomainPattern { host, scope, port })
    }

    /// Whether it admits `host` on some port.
    pub(crate) fn admits_host(&self, host: &Host) -> bool {
        match (self.scope, &self.host, host) {
            (Scope::Exact, _, _) => &self.host == host,
            (_, Host::Name(suffix), Host::Name(name)) => {
                let below = name.len() > suffix.len() + 1
                    && name.ends_with(suffix.as_str())
                    && name.as_bytes()[name.len() - suffix.len() - 1] == b'.';
                below || (self.scope == Scope::ApexAndSubdomains && name == suffix)
            }
            _ => false,
        }
    }

    /// Whether it admits `host` on `port`.
    pub(crate) fn admits(&self, host: &Host, port: u16) -> bool {
        self.admits_host(host) && self.ports().contains(&port)
    }

    fn ports(&self) -> &[u16] {
        match &self.port {
            Some(p) => std::slice::from_ref(p),
            None => &DEFAULT_PORTS,
        }
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = match self.scope {
            Scope::Exact => "",
            Scope::Subdomains => "*.",
            Scope::ApexAndSubdomains => "**.",
        };
        write!(f, "{prefix}{}", self.host)?;
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// `host[:PORT]`, `[v6][:PORT]` or a bare IPv6 (no port): the host part and
/// the port.
fn split_port(entry: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if entry.starts_with('[') {
        match entry.find(']') {
            Some(end) if end + 1 == entry.len() => (entry, None),
            Some(end) => match entry[end + 1..].strip_prefix(':') {
                Some(port) => (&entry[..=end], Some(port)),
                None => return Err("text after the ] of an IPv6 address".to_string()),
            },
            None => return Err("an IPv6 address without its closing ]".to_string()),
        }
    } else if entry.matches(':').count() > 1 {
        // A bare IPv6 address: its port, if any, needs brackets.
        (entry, None)
    } else {
        match entry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(n),
            _ => return Err(format!("{p:?} is not a port (1-65535)")),
        },
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests;
