//! Credentials of the operator's package indexes, taken out of their URLs
//! at start so that install jobs never hold them (issue 42 §2): a job is
//! given the URL without them, and the egress proxy adds them on the way
//! out (see `intercept.rs`).

use std::fmt;

use base64::Engine;

use super::{Host, normalize_host};

/// `user:password@` of one index URL, and where it applies: requests to
/// the same scheme, host and port, under the index's root (its path
/// without a last `simple` or `+simple`, where indexes keep their files).
#[derive(Clone)]
pub struct IndexCredential {
    pub https: bool,
    pub(crate) host: Host,
    pub port: u16,
    /// The index's root, ending in `/`: requests under it get the
    /// credentials (the longest root of several on one host); others none.
    pub path: String,
    /// `Basic base64(user:password)`.
    authorization: String,
    /// The URL as the operator wrote it, credentials included: given to an
    /// installer only when nothing is sandboxed.
    pub(crate) url: String,
    /// The secrets: user, password and `user:password` (as written and
    /// decoded), and the `Authorization` value and its base64.
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

    /// Where the credentials apply (Linux only).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn host(&self) -> &Host {
        &self.host
    }

    /// The `Authorization` value the proxy sends (Linux only).
    pub fn authorization(&self) -> &str {
        &self.authorization
    }
}

/// What looks like `userinfo@` in `url`: the text between `://` and the
/// last `@` before the path or query (a `#` in a password does not end it).
fn raw_userinfo(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    authority.rsplit_once('@').map(|(userinfo, _)| userinfo)
}

/// Splits `url` into the URL without credentials and, when it had some,
/// where they apply. Fails closed: text that looks like credentials but
/// cannot be split cleanly is an error carrying the secrets to redact
/// (start-up refuses it; it never reaches an installer).
pub fn split_credentials(url: &str) -> Result<(String, Option<IndexCredential>), Vec<String>> {
    let text = url.trim();
    let Some(raw) = raw_userinfo(text) else {
        return Ok((url.to_string(), None));
    };
    let unusable = || {
        let mut secrets = vec![raw.to_string(), decode(raw)];
        secrets.extend(raw.split(':').flat_map(|p| [p.to_string(), decode(p)]));
        secrets.retain(|s| !s.is_empty());
        secrets
    };
    let Ok(mut parsed) = url::Url::parse(text) else {
        return Err(unusable());
    };
    let https = parsed.scheme().eq_ignore_ascii_case("https");
    let written_user = parsed.username().to_string();
    let written_password = parsed.password().unwrap_or("").to_string();
    let user = decode(&written_user);
    let password = decode(&written_password);
    let (Some(host), Some(port)) = (
        parsed.host_str().and_then(normalize_host),
        parsed.port_or_known_default(),
    ) else {
        return Err(unusable());
    };
    if user.is_empty() && password.is_empty() {
        return Err(unusable());
    }
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    let bare = parsed.to_string();
    if raw_userinfo(&bare).is_some() {
        return Err(unusable());
    }
    let pair = format!("{user}:{password}");
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair.as_bytes());
    let authorization = format!("Basic {encoded}");
    let mut secrets = vec![
        user,
        password,
        pair,
        written_user,
        written_password,
        authorization.clone(),
        encoded,
    ];
    secrets.retain(|s| !s.is_empty());
    secrets.dedup();
    let credential = IndexCredential {
        https,
        host,
        port,
        path: index_root(parsed.path()),
        authorization,
        url: url.to_string(),
        secrets,
    };
    Ok((bare, Some(credential)))
}

/// Where an index keeps its pages and files: its path without a last
/// `simple` or `+simple` segment, ending in `/` (`/team/simple/` ->
/// `/team/`; devpi's `/root/pypi/+simple/` -> `/root/pypi/`).
fn index_root(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    let root = match trimmed.rsplit_once('/') {
        Some((parent, last)) if last == "simple" || last == "+simple" => parent,
        _ => trimmed,
    };
    format!("{root}/")
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

/// Whether an index with credentials is on `host:port` (its tunnels are
/// ended by the proxy).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn on_host(credentials: &[IndexCredential], host: &Host, port: u16) -> bool {
    credentials
        .iter()
        .any(|c| c.https && c.host == *host && c.port == port)
}

/// Of `credentials`, the one for a request to `host:port` at `path` (which
/// the proxy has checked has no dot segments or encoded separators): the
/// longest index root it lies under; none outside every root.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn choose<'a>(
    credentials: &'a [IndexCredential],
    host: &Host,
    port: u16,
    path: &str,
) -> Option<&'a IndexCredential> {
    credentials
        .iter()
        .filter(|c| c.https && c.host == *host && c.port == port)
        .filter(|c| path.starts_with(&c.path))
        .max_by_key(|c| c.path.len())
}

/// A request path the proxy sends credentials with: no `.` or `..`
/// segments, no encoded dot, slash or backslash, no `\` or `;` (servers
/// that normalize them would serve a path outside the index's root).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn plain_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    path.starts_with('/')
        && !path.contains(['\\', ';'])
        && !["%2e", "%2f", "%5c", "%00"]
            .iter()
            .any(|e| lower.contains(e))
        && !path.split('/').any(|seg| seg == "." || seg == "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, Option<IndexCredential>) {
        split_credentials(url).expect("splits")
    }

    #[test]
    fn credentials_come_out_of_the_url() {
        let (url, cred) = split("https://alice:p%40ss%3Aw0rd@Index.Example:8443/simple/");
        assert_eq!(url, "https://index.example:8443/simple/");
        let cred = cred.expect("credentials");
        assert!(cred.https);
        assert_eq!(cred.port, 8443);
        assert_eq!(cred.path, "/", "the index's root");
        let encoded = base64::engine::general_purpose::STANDARD.encode("alice:p@ss:w0rd");
        for s in [
            "alice",
            "p@ss:w0rd",
            "alice:p@ss:w0rd",
            "p%40ss%3Aw0rd",
            encoded.as_str(),
        ] {
            assert!(cred.secrets().iter().any(|x| x == s), "{s} is a secret");
        }
        assert_eq!(cred.authorization(), format!("Basic {encoded}"));
        let shown = format!("{cred:?} {cred}");
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
        let (url, cred) = split("https://__token__@pkgs.example/team/simple");
        assert_eq!(url, "https://pkgs.example/team/simple");
        let cred = cred.expect("credentials");
        assert_eq!(cred.port, 443);
        assert_eq!(cred.path, "/team/");
        assert!(cred.secrets().iter().any(|s| s == "__token__"));
    }

    #[test]
    fn urls_without_credentials_are_unchanged() {
        for url in [
            "https://pypi.org/simple",
            "not a url",
            "file:///srv/wheels",
            "https://pkgs.example/simple/?who=a@b",
        ] {
            let (out, cred) = split(url);
            assert_eq!(out, url);
            assert!(cred.is_none());
        }
    }

    /// What looks like credentials but cannot be split cleanly is refused,
    /// never passed on as written (an installer would print it).
    #[test]
    fn credentials_that_cannot_be_split_fail_closed() {
        for (url, secret) in [
            ("internal=https://alice:tok3n@pkgs.example/simple", "tok3n"),
            ("https://alice:to#k3n@pkgs.example/simple", "to#k3n"),
            ("https://alice:tok3n@pkgs~x.example/simple", "tok3n"),
            ("https://@pkgs.example/simple", ""),
        ] {
            let secrets = split_credentials(url).expect_err(url);
            assert!(
                secret.is_empty() || secrets.iter().any(|s| s.contains(secret)),
                "{url}: {secrets:?}"
            );
        }
    }

    #[test]
    fn roots_are_the_index_without_simple() {
        assert_eq!(index_root("/simple"), "/");
        assert_eq!(index_root("/simple/"), "/");
        assert_eq!(index_root("/root/pypi/+simple/"), "/root/pypi/");
        assert_eq!(
            index_root("/artifactory/api/pypi/repo/simple"),
            "/artifactory/api/pypi/repo/"
        );
        assert_eq!(index_root("/mirror"), "/mirror/");
    }

    #[test]
    fn credentials_go_under_their_index_root_only() {
        let a = split("https://a:one@h.example/team-a/simple").1.expect("a");
        let b = split("https://b:two@h.example/team-b/simple").1.expect("b");
        let all = [a, b];
        let host = normalize_host("h.example").expect("host");
        let pick = |path: &str| choose(&all, &host, 443, path).map(|c| c.secrets()[0].clone());
        assert_eq!(pick("/team-b/simple/six/").as_deref(), Some("b"));
        assert_eq!(pick("/team-a/files/six.whl").as_deref(), Some("a"));
        assert_eq!(
            pick("/team-bx/simple/").as_deref(),
            None,
            "segment boundaries"
        );
        assert_eq!(pick("/api/npm/auth").as_deref(), None, "outside every root");
        assert!(on_host(&all, &host, 443));
        assert!(
            choose(&all, &host, 8443, "/team-a/").is_none(),
            "another port"
        );
        let other = normalize_host("other.example").expect("host");
        assert!(
            choose(&all, &other, 443, "/team-a/").is_none(),
            "another host"
        );
    }

    #[test]
    fn only_plain_paths_carry_credentials() {
        for ok in ["/team/simple/six/", "/files/six-1.0.whl#sha256=x", "/"] {
            assert!(plain_path(ok), "{ok}");
        }
        for bad in [
            "/team/simple/../../echo",
            "/team/./x",
            "/team/%2e%2e/echo",
            "/team/%2E%2e/echo",
            "/team%2fx",
            "/team/..;/echo",
            "/team\\..\\echo",
            "relative",
            "/x%00",
        ] {
            assert!(!plain_path(bad), "{bad}");
        }
    }
}
