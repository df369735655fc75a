//! Credentials of the operator's package indexes, taken out of their URLs
//! at start so that install jobs never hold them (issue 42 §2): a job is
//! given the URL without them, and the egress proxy adds them on the way
//! out (see `intercept.rs`).

use std::fmt;

use base64::Engine;

use super::{Host, normalize_host};

/// `user:password@` of one index URL, and where it applies: requests to
/// the same scheme, host and port, as pip and uv send them.
#[derive(Clone)]
pub struct IndexCredential {
    pub https: bool,
    pub(crate) host: Host,
    pub port: u16,
    /// The index's path; of several credentials for one host, the one with
    /// the longest path a request starts with is used.
    pub path: String,
    /// `Basic base64(user:password)`.
    authorization: String,
    /// The URL as the operator wrote it, credentials included: given to an
    /// installer only when nothing is sandboxed.
    pub(crate) url: String,
    /// The secrets, decoded: user, password and `user:password`.
    secrets: Vec<String>,
}

/// Never the secrets: a message or a log line shows where they apply,
/// `https://host:port/path`.
impl fmt::Display for IndexCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}{}", self.host, self.port, self.path)
    }
}

impl fmt::Debug for IndexCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IndexCredential({self})")
    }
}

impl IndexCredential {
    /// The strings to redact wherever a session could read them.
    pub fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// The URL with its credentials, for an unsandboxed installer.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The `Authorization` value the proxy sends (Linux only).
    pub fn authorization(&self) -> &str {
        &self.authorization
    }
}

/// Splits `url` into the URL without credentials and, when it had some,
/// where they apply. A URL that does not parse is returned as it is.
pub fn split_credentials(url: &str) -> (String, Option<IndexCredential>) {
    let Ok(mut parsed) = url::Url::parse(url.trim()) else {
        return (url.to_string(), None);
    };
    if parsed.username().is_empty() && parsed.password().is_none() {
        return (url.to_string(), None);
    }
    let https = parsed.scheme().eq_ignore_ascii_case("https");
    let user = decode(parsed.username());
    let password = decode(parsed.password().unwrap_or(""));
    let (Some(host), Some(port)) = (
        parsed.host_str().and_then(normalize_host),
        parsed.port_or_known_default(),
    ) else {
        return (url.to_string(), None);
    };
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    let pair = format!("{user}:{password}");
    let authorization = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair.as_bytes())
    );
    let mut secrets = vec![user, password, pair];
    secrets.retain(|s| !s.is_empty());
    let credential = IndexCredential {
        https,
        host,
        port,
        path: parsed.path().to_string(),
        authorization,
        url: url.to_string(),
        secrets,
    };
    (parsed.to_string(), Some(credential))
}

/// Percent-decoded userinfo (as installers send it); as written when the
/// result would not be text.
fn decode(part: &str) -> String {
    let b = part.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| part.to_string())
}

/// Of `credentials`, the one for a request to `host:port` at `path`: the
/// longest index path the request starts with, else the host's first (pip
/// sends an index's credentials to every path of its host).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn choose<'a>(
    credentials: &'a [IndexCredential],
    host: &Host,
    port: u16,
    path: &str,
) -> Option<&'a IndexCredential> {
    let on_host = credentials
        .iter()
        .filter(|c| c.https && c.host == *host && c.port == port);
    let first = on_host.clone().next();
    on_host
        .filter(|c| path.starts_with(c.path.trim_end_matches('/')))
        .max_by_key(|c| c.path.len())
        .or(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_out_of_the_url() {
        let (url, cred) =
            split_credentials("https://alice:p%40ss%3Aw0rd@Index.Example:8443/simple/");
        assert_eq!(url, "https://index.example:8443/simple/");
        let cred = cred.expect("credentials");
        assert!(cred.https);
        assert_eq!(cred.port, 8443);
        assert_eq!(cred.path, "/simple/");
        assert_eq!(cred.secrets(), ["alice", "p@ss:w0rd", "alice:p@ss:w0rd"]);
        assert_eq!(
            cred.authorization(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("alice:p@ss:w0rd")
            )
        );
        let shown = format!("{cred:?}");
        assert!(
            !shown.contains("alice") && !shown.contains("p@ss"),
            "{shown}"
        );
        assert_eq!(
            cred.url(),
            "https://alice:p%40ss%3Aw0rd@Index.Example:8443/simple/"
        );
    }

    #[test]
    fn a_token_alone_is_a_credential() {
        let (url, cred) = split_credentials("https://__token__@pkgs.example/simple");
        assert_eq!(url, "https://pkgs.example/simple");
        let cred = cred.expect("credentials");
        assert_eq!(cred.port, 443);
        assert_eq!(cred.secrets(), ["__token__", "__token__:"]);
    }

    #[test]
    fn urls_without_credentials_are_unchanged() {
        for url in ["https://pypi.org/simple", "not a url", "file:///srv/wheels"] {
            let (out, cred) = split_credentials(url);
            assert_eq!(out, url);
            assert!(cred.is_none());
        }
    }

    #[test]
    fn the_longest_index_path_wins() {
        let a = split_credentials("https://a:one@h.example/team-a/simple")
            .1
            .expect("a");
        let b = split_credentials("https://b:two@h.example/team-b/simple")
            .1
            .expect("b");
        let all = [a, b];
        let host = normalize_host("h.example").expect("host");
        let pick = |path: &str| choose(&all, &host, 443, path).map(|c| c.secrets()[0].clone());
        assert_eq!(pick("/team-b/simple/six/").as_deref(), Some("b"));
        assert_eq!(pick("/team-a/simple/six/").as_deref(), Some("a"));
        // Files elsewhere on the host: the host's first, as pip does.
        assert_eq!(pick("/files/six.whl").as_deref(), Some("a"));
        assert!(choose(&all, &host, 8443, "/").is_none(), "another port");
        let other = normalize_host("other.example").expect("host");
        assert!(choose(&all, &other, 443, "/").is_none(), "another host");
    }
}
