//! The viewer's Host and Origin rules, its own (the MCP listener's
//! `--allow-host` names and its any-port loopback Origins are not the
//! viewer's). Browsers send a cookie to every port of a host, so a login
//! cookie set on 127.0.0.1 would reach an agent's own web server on another
//! loopback port: a loopback viewer is reached as `ferrepl-viewer.localhost`
//! (browsers resolve `*.localhost` to loopback themselves), and only that
//! name (or a `--viewer-allow-host` one) gets a cookie. A request must name
//! one of the viewer's own hosts with its port; an Origin must be that same
//! host's.

use std::net::SocketAddr;

use axum::http::{HeaderMap, header};

/// A loopback viewer's own host name.
pub const NAMED_HOST: &str = "ferrepl-viewer.localhost";

struct Allowed {
    name: String,
    /// None: any port (a `--viewer-allow-host` name without one).
    port: Option<u16>,
    https: bool,
    /// Whether a login cookie may be set for it (not a loopback literal,
    /// whose cookies every loopback port would get).
    cookie: bool,
}

pub struct Rules {
    hosts: Vec<Allowed>,
    /// Where a login on a host that gets no cookie is sent: the first
    /// `https://` name, else a loopback viewer's
    /// `http://ferrepl-viewer.localhost:PORT`.
    named: Option<String>,
    url: String,
}

/// What a request's Host matched.
pub struct Matched {
    /// The browser reaches it over TLS: cookies are Secure.
    pub https: bool,
    pub cookie: bool,
}

/// "name[:port]" (a bracketed IPv6 address keeps its colons), lowercased.
fn split_host(host: &str) -> Option<(String, Option<u16>)> {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let end = rest.find(']')?;
        let after = &rest[end + 1..];
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (&host[..end + 2], port)
    } else {
        match host.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'[' | b']' | b':'));
    ok.then(|| (name.to_ascii_lowercase(), port))
}

impl Rules {
    /// The names of a viewer bound to `local`, and `allow`
    /// (`--viewer-allow-host`: `[https://]NAME[:PORT]`).
    pub fn new(local: SocketAddr, allow: &[String]) -> Result<Self, String> {
        let port = local.port();
        let mut hosts = Vec::new();
        for given in allow {
            let (https, rest) = match given.trim() {
                g if g.starts_with("https://") => (true, &g[8..]),
                g if g.starts_with("http://") => (false, &g[7..]),
                g => (false, g),
            };
            let (name, port) = split_host(rest.trim_end_matches('/'))
                .ok_or_else(|| format!("{given:?}: expected [https://]NAME[:PORT]"))?;
            hosts.push(Allowed {
                name,
                port,
                https,
                cookie: true,
            });
        }
        let url = match hosts.first() {
            Some(a) => format!(
                "{}://{}{}/",
                if a.https { "https" } else { "http" },
                a.name,
                a.port.map(|p| format!(":{p}")).unwrap_or_default()
            ),
            None if local.ip().is_loopback() || local.ip().is_unspecified() => {
                format!("http://{NAMED_HOST}:{port}/")
            }
            None => format!("http://{local}/"),
        };
        // With a name behind TLS only such names get a cookie: the
        // viewer's own address shares its host with whatever else listens
        // there (an agent's server with --network on), the proxy's does not.
        let tls = hosts.iter().find(|a| a.https).map(|a| {
            format!(
                "https://{}{}",
                a.name,
                a.port.map(|p| format!(":{p}")).unwrap_or_default()
            )
        });
        let own = |name: &str, cookie: bool| Allowed {
            name: name.to_string(),
            port: Some(port),
            https: false,
            cookie: cookie && tls.is_none(),
        };
        if tls.is_some() {
            for a in hosts.iter_mut().filter(|a| !a.https) {
                a.cookie = false;
            }
        }
        let mut named = tls.clone();
        if local.ip().is_loopback() || local.ip().is_unspecified() {
            hosts.push(own(NAMED_HOST, true));
            for literal in ["127.0.0.1", "localhost", "[::1]"] {
                hosts.push(own(literal, false));
            }
            named = named.or_else(|| Some(format!("http://{NAMED_HOST}:{port}")));
        } else {
            let ip = match local.ip() {
                std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                ip => ip.to_string(),
            };
            hosts.push(own(&ip, true));
        }
        Ok(Self { hosts, named, url })
    }

    /// The URL a person opens.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    fn matched(&self, host: &str) -> Option<&Allowed> {
        let (name, port) = split_host(host)?;
        self.hosts.iter().find(|a| {
            a.name == name
                && a.port
                    .is_none_or(|p| p == port.unwrap_or(if a.https { 443 } else { 80 }))
        })
    }

    /// What the request's Host matched; None: not one of ours.
    pub fn host_of(&self, headers: &HeaderMap) -> Option<Matched> {
        let host = headers.get(header::HOST)?.to_str().ok()?;
        self.matched(host).map(|a| Matched {
            https: a.https,
            cookie: a.cookie,
        })
    }

    /// Why a request is refused: its Host is not one of the viewer's, or
    /// it has an Origin other than that host's own.
    pub fn refuse(&self, headers: &HeaderMap) -> Option<&'static str> {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let Some(allowed) = host.and_then(|h| self.matched(h)) else {
            return Some(
                "Host not allowed: open the viewer at the URL it printed at start (--viewer-allow-host adds a name)\n",
            );
        };
        if let Some(origin) = headers.get(header::ORIGIN) {
            let scheme = if allowed.https { "https" } else { "http" };
            let own = format!("{scheme}://{}", host.unwrap_or_default());
            if !origin.to_str().is_ok_and(|o| o.eq_ignore_ascii_case(&own)) {
                return Some("Origin not allowed: only the viewer's own pages may ask it\n");
            }
        }
        None
    }

    /// Where a login that arrived on a host without cookies goes instead:
    /// `path_and_query` on the name that has them.
    pub fn elsewhere(&self, path_and_query: &str) -> Option<String> {
        self.named.as_ref().map(|n| format!("{n}{path_and_query}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(host: &str, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().expect("host"));
        if let Some(o) = origin {
            h.insert(header::ORIGIN, o.parse().expect("origin"));
        }
        h
    }

    #[test]
    fn behind_tls_only_the_tls_names_get_a_cookie() {
        let r = Rules::new(
            "127.0.0.1:8765".parse().expect("addr"),
            &["http://plain.example".into(), "https://view.example".into()],
        )
        .expect("rules");
        let cookie = |host: &str| r.host_of(&headers(host, None)).map(|m| m.cookie);
        assert_eq!(cookie("view.example"), Some(true));
        for none in [
            "plain.example",
            "ferrepl-viewer.localhost:8765",
            "127.0.0.1:8765",
        ] {
            assert_eq!(cookie(none), Some(false), "{none}");
        }
        assert_eq!(
            r.elsewhere("/login?ticket=t").as_deref(),
            Some("https://view.example/login?ticket=t")
        );
        let off = Rules::new(
            "10.1.2.3:8765".parse().expect("addr"),
            &["https://view.example:8443".into()],
        )
        .expect("rules");
        assert_eq!(
            off.host_of(&headers("10.1.2.3:8765", None))
                .map(|m| m.cookie),
            Some(false)
        );
        assert_eq!(
            off.elsewhere("/login").as_deref(),
            Some("https://view.example:8443/login")
        );
    }

    #[test]
    fn a_loopback_viewer_answers_to_its_own_names_on_its_own_port() {
        let r = Rules::new("127.0.0.1:8765".parse().expect("addr"), &[]).expect("rules");
        assert_eq!(r.url(), "http://ferrepl-viewer.localhost:8765/");
        for ok in [
            "ferrepl-viewer.localhost:8765",
            "FERREPL-VIEWER.localhost:8765",
            "127.0.0.1:8765",
            "localhost:8765",
            "[::1]:8765",
        ] {
            assert!(r.refuse(&headers(ok, None)).is_none(), "{ok}");
        }
        for bad in [
            "ferrepl-viewer.localhost:9999",
            "localhost",
            "localhost:9999",
            "evil.example:8765",
            "ferrepl-viewer.localhost.evil:8765",
            "127.0.0.1:8765:1",
        ] {
            assert!(r.refuse(&headers(bad, None)).is_some(), "{bad}");
        }
        assert!(r.refuse(&HeaderMap::new()).is_some(), "no Host");
        let own = "ferrepl-viewer.localhost:8765";
        assert!(
            r.refuse(&headers(own, Some("http://ferrepl-viewer.localhost:8765")))
                .is_none()
        );
        for origin in [
            "http://localhost:9999",
            "http://127.0.0.1:8765",
            "https://ferrepl-viewer.localhost:8765",
            "null",
        ] {
            assert!(r.refuse(&headers(own, Some(origin))).is_some(), "{origin}");
        }
        assert!(r.host_of(&headers(own, None)).is_some_and(|m| m.cookie));
        assert!(
            r.host_of(&headers("127.0.0.1:8765", None))
                .is_some_and(|m| !m.cookie)
        );
        assert_eq!(
            r.elsewhere("/login?ticket=x").as_deref(),
            Some("http://ferrepl-viewer.localhost:8765/login?ticket=x")
        );
    }

    #[test]
    fn off_loopback_the_bound_address_and_the_given_names() {
        let allow = ["https://view.example".to_string(), "pod-0:8000".to_string()];
        let r = Rules::new("10.0.0.5:8000".parse().expect("addr"), &allow).expect("rules");
        assert_eq!(r.url(), "https://view.example/");
        assert!(r.refuse(&headers("10.0.0.5:8000", None)).is_none());
        assert!(r.refuse(&headers("pod-0:8000", None)).is_none());
        assert!(r.refuse(&headers("pod-0:9000", None)).is_some());
        assert!(r.refuse(&headers("localhost:8000", None)).is_some());
        let tls = headers("view.example", Some("https://view.example"));
        assert!(r.refuse(&tls).is_none());
        assert!(r.host_of(&tls).is_some_and(|m| m.https && m.cookie));
        assert!(
            r.refuse(&headers("view.example", Some("http://view.example")))
                .is_some()
        );
        // A login on a name without TLS is sent to the TLS name.
        assert_eq!(
            r.elsewhere("/login").as_deref(),
            Some("https://view.example/login")
        );
        assert!(Rules::new("10.0.0.5:8000".parse().expect("addr"), &["a/b".into()]).is_err());
    }
}
