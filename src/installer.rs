//! How package installers are run: the index they use and the hosts they may
//! reach, decided once at start from the operator's own environment and
//! user-level configuration (never from files the agent can write), and the
//! command and environment of an install job.

use std::path::{Path, PathBuf};

use crate::egress::host_of_url;

pub const PYPI_INDEX: &str = "https://pypi.org/simple";
const PYPI_HOSTS: &[&str] = &["pypi.org", "files.pythonhosted.org"];
/// The port of the relay inside an installer's network namespace.
pub const RELAY_PORT: u16 = 3128;

/// The operator's installer settings.
#[derive(Debug, Clone)]
pub struct InstallerSettings {
    /// The index URLs installers are given: without credentials.
    pub index_url: String,
    pub extra_index_urls: Vec<String>,
    /// The credentials taken out of them, added by the egress proxy (never
    /// given to an install job; see egress/intercept.rs).
    pub credentials: Vec<crate::egress::IndexCredential>,
    /// What looked like credentials in index URLs that could not be split
    /// (start-up refuses them): secrets all the same.
    pub unusable: Vec<String>,
    /// A CA bundle the operator's pip uses (`cert` in pip.conf, PIP_CERT).
    pub cert: Option<PathBuf>,
    /// Hosts installers may reach through the egress proxy.
    pub allowed_hosts: Vec<String>,
    /// Whether source distributions (and their build scripts) are allowed.
    pub source_builds: bool,
    /// How installers reach the network: through the proxy (`packages`),
    /// directly (`on`), or not at all (`off`).
    pub mode: crate::sandbox::Network,
    /// The CRAN mirror of r_install (--cran).
    pub cran: String,
}

/// `key = value` pairs of an INI or TOML file whose key is one of `keys`
/// (values may continue on indented lines, as pip's multi-line lists do;
/// TOML strings and arrays of strings are unquoted).
fn values(text: &str, keys: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || trimmed.starts_with(';') || trimmed.is_empty() {
            continue;
        }
        let continuation = line.starts_with([' ', '\t']) && !trimmed.contains('=');
        let value = if continuation && current {
            trimmed
        } else if let Some((k, v)) = trimmed.split_once('=') {
            current = keys.contains(&k.trim());
            if !current {
                continue;
            }
            v.trim()
        } else {
            current = false;
            continue;
        };
        for item in value.split([',', ' ', '[', ']']) {
            let item = item.trim().trim_matches(['"', '\'']);
            if !item.is_empty() {
                out.push(item.to_string());
            }
        }
    }
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A variable of the operator's environment, unless empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The operator's pip and uv configuration, as text: every pip.conf pip
/// reads (system, user, PIP_CONFIG_FILE) joined, and the user's uv.toml.
/// A file sessions could have written is left out: it never widens the
/// allow-list.
struct ConfigFiles {
    pip: String,
    uv: String,
}

impl ConfigFiles {
    fn read(writable: &crate::sandbox::paths::Writable) -> Self {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let config_home = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".config")));
        let mut pip_files = vec![PathBuf::from("/etc/pip.conf")];
        if let Some(c) = &config_home {
            pip_files.push(c.join("pip/pip.conf"));
        }
        if let Some(h) = &home {
            pip_files.push(h.join(".pip/pip.conf"));
        }
        if let Some(f) = env("PIP_CONFIG_FILE").filter(|f| f != "/dev/null") {
            pip_files.push(PathBuf::from(f));
        }
        // A file sessions could have written never widens the allow-list.
        let trusted = |f: &Path| !writable.contains(f);
        let pip = pip_files
            .iter()
            .filter(|f| trusted(f))
            .map(|f| read(f) + "\n")
            .collect();
        let uv = config_home
            .as_ref()
            .map(|c| c.join("uv/uv.toml"))
            .filter(|f| trusted(f))
            .map(|f| read(&f))
            .unwrap_or_default();
        ConfigFiles { pip, uv }
    }

    /// The index URL: the environment's first, then pip's, then uv's.
    fn index_url(&self) -> Option<String> {
        let mut index: Option<String> = env("PIP_INDEX_URL")
            .or_else(|| env("UV_DEFAULT_INDEX").map(|u| without_index_name(&u)))
            .or_else(|| env("UV_INDEX_URL"));
        if index.is_none() {
            index = values(&self.pip, &["index-url"]).pop();
        }
        if index.is_none() {
            index = values(&self.uv, &["index-url", "default-index"]).pop();
        }
        index
    }

    /// The extra index URLs of the environment, pip and uv.
    fn extra_index_urls(&self) -> Vec<String> {
        let mut extra: Vec<String> = Vec::new();
        for var in ["PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX"] {
            if let Some(v) = env(var) {
                extra.extend(v.split_whitespace().map(without_index_name));
            }
        }
        extra.extend(values(&self.pip, &["extra-index-url"]));
        extra.extend(values(&self.uv, &["extra-index-url", "url"]));
        extra.retain(|u| u.contains("://"));
        extra.dedup();
        extra
    }

    /// A CA bundle that exists (PIP_CERT, or pip's `cert`).
    fn cert(&self) -> Option<PathBuf> {
        env("PIP_CERT")
            .or_else(|| values(&self.pip, &["cert"]).pop())
            .map(PathBuf::from)
            .filter(|p| p.is_file())
    }
}

/// uv names indexes in its variables: `internal=https://...` is the URL
/// after the `=` (a URL's scheme comes before any `=` it holds).
fn without_index_name(entry: &str) -> String {
    match entry.split_once('=') {
        Some((name, url))
            if !name.contains("://")
                && !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) =>
        {
            url.to_string()
        }
        _ => entry.to_string(),
    }
}

/// PyPI's hosts, the indexes' hosts and `extra_hosts` (--allow-host-egress),
/// each once.
fn allowed_hosts(index_url: &str, extra: &[String], extra_hosts: &[String]) -> Vec<String> {
    let mut hosts: Vec<String> = PYPI_HOSTS.iter().map(|h| h.to_string()).collect();
    hosts.extend(
        std::iter::once(index_url)
            .chain(extra.iter().map(String::as_str))
            .filter_map(host_of_url),
    );
    hosts.extend(
        extra_hosts
            .iter()
            .map(|h| h.trim().trim_end_matches('.').to_ascii_lowercase())
            .filter(|h| !h.is_empty()),
    );
    let mut seen = std::collections::BTreeSet::new();
    hosts.retain(|h| seen.insert(h.clone()));
    hosts
}

impl InstallerSettings {
    /// Reads the operator's index settings: PIP_INDEX_URL and friends,
    /// uv's variables, the user's and the system's pip.conf and the user's
    /// uv.toml, then adds `extra_hosts` (--allow-host-egress).
    pub fn discover(
        mode: crate::sandbox::Network,
        extra_hosts: &[String],
        source_builds: bool,
        writable: &crate::sandbox::paths::Writable,
    ) -> Self {
        let files = ConfigFiles::read(writable);
        let index = files.index_url();
        let extra = files.extra_index_urls();
        let cert = files.cert();
        let index_url = index.unwrap_or_else(|| PYPI_INDEX.to_string());
        let hosts = allowed_hosts(&index_url, &extra, extra_hosts);
        let mut credentials = Vec::new();
        let mut unusable = Vec::new();
        let mut strip = |url: String| match crate::egress::split_credentials(&url) {
            Ok((url, credential)) => {
                credentials.extend(credential);
                url
            }
            Err(secrets) => {
                // Refused at start (startup::index_credentials); never given
                // to a job, and redacted meanwhile.
                unusable.extend(secrets);
                String::new()
            }
        };
        let index_url = strip(index_url);
        let extra: Vec<String> = extra
            .into_iter()
            .map(&mut strip)
            .filter(|u| !u.is_empty())
            .collect();
        Self {
            index_url,
            extra_index_urls: extra,
            credentials,
            unusable,
            cert,
            allowed_hosts: hosts,
            source_builds,
            mode,
            cran: String::new(),
        }
    }

    /// The ports index URLs name (an internal index on :8443): reached
    /// through the proxy besides 443 and 80.
    pub fn index_ports(&self) -> Vec<u16> {
        std::iter::once(&self.index_url)
            .chain(&self.extra_index_urls)
            .filter_map(|u| crate::egress::port_of_url(u))
            .collect()
    }

    /// Nothing is sandboxed: installers get the URLs with their
    /// credentials, as the operator wrote them (a session could read the
    /// operator's pip.conf itself).
    pub fn embed_credentials(&mut self) {
        for credential in &self.credentials {
            let Ok((bare, _)) = crate::egress::split_credentials(credential.url()) else {
                continue;
            };
            for url in std::iter::once(&mut self.index_url).chain(&mut self.extra_index_urls) {
                if *url == bare {
                    *url = credential.url().to_string();
                }
            }
        }
    }

    /// The installer's flags and environment: the index given explicitly,
    /// configuration the agent could write switched off, short retries so
    /// a failure answers in seconds, wheels only unless the operator
    /// allowed builds.
    pub fn pip_flags(&self) -> Vec<String> {
        let mut flags = vec![
            "--disable-pip-version-check".to_string(),
            "--no-input".to_string(),
            "--index-url".to_string(),
            self.index_url.clone(),
        ];
        for u in &self.extra_index_urls {
            flags.extend(["--extra-index-url".to_string(), u.clone()]);
        }
        let (retries, timeout) = match self.mode {
            crate::sandbox::Network::Off => ("0", "5"),
            _ => ("2", "15"),
        };
        flags.extend([
            "--retries".to_string(),
            retries.to_string(),
            "--timeout".to_string(),
            timeout.to_string(),
        ]);
        if let Some(c) = &self.cert {
            flags.extend(["--cert".to_string(), c.display().to_string()]);
        }
        if !self.source_builds {
            flags.extend(["--only-binary".to_string(), ":all:".to_string()]);
        }
        flags
    }

    pub fn uv_flags(&self) -> Vec<String> {
        let mut flags = vec![
            "--no-config".to_string(),
            "--index-url".to_string(),
            self.index_url.clone(),
        ];
        for u in &self.extra_index_urls {
            flags.extend(["--extra-index-url".to_string(), u.clone()]);
        }
        if !self.source_builds {
            // uv's own switch: nothing is built, local projects included.
            // Alone: uv (0.13) refuses it together with --only-binary, and
            // it already means wheels only.
            flags.push("--no-build".to_string());
        }
        flags
    }

    /// Environment of an install job.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("PIP_CONFIG_FILE".to_string(), "/dev/null".to_string()),
            ("UV_NO_CONFIG".to_string(), "1".to_string()),
            ("PIP_DISABLE_PIP_VERSION_CHECK".to_string(), "1".to_string()),
            ("UV_HTTP_TIMEOUT".to_string(), "15".to_string()),
        ];
        if let Some(c) = &self.cert {
            env.push(("SSL_CERT_FILE".to_string(), c.display().to_string()));
        }
        if self.mode == crate::sandbox::Network::Packages {
            let proxy = format!("http://127.0.0.1:{RELAY_PORT}");
            for var in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
                env.push((var.to_string(), proxy.clone()));
            }
            env.push(("NO_PROXY".to_string(), String::new()));
            env.push(("no_proxy".to_string(), String::new()));
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uv_gets_no_build_alone() {
        let settings = InstallerSettings {
            index_url: PYPI_INDEX.to_string(),
            extra_index_urls: Vec::new(),
            credentials: Vec::new(),
            unusable: Vec::new(),
            cert: None,
            allowed_hosts: Vec::new(),
            source_builds: false,
            mode: crate::sandbox::Network::Packages,
            cran: String::new(),
        };
        let flags = settings.uv_flags();
        assert!(flags.contains(&"--no-build".to_string()), "{flags:?}");
        // uv 0.13.9: "the argument '--only-binary <ONLY_BINARY>' cannot be
        // used with '--no-build'": every install failed.
        assert!(!flags.contains(&"--only-binary".to_string()), "{flags:?}");
        let builds = InstallerSettings {
            source_builds: true,
            ..settings
        };
        assert!(!builds.uv_flags().contains(&"--no-build".to_string()));
    }

    #[test]
    fn ini_and_toml_values_are_read() {
        let ini = "[global]\nindex-url = https://a.example/simple\nextra-index-url =\n    https://b.example/s\n    https://c.example/s\ncert = /etc/ca.pem\n";
        assert_eq!(
            values(ini, &["index-url"]),
            vec!["https://a.example/simple"]
        );
        assert_eq!(
            values(ini, &["extra-index-url"]),
            vec!["https://b.example/s", "https://c.example/s"]
        );
        let toml = "index-url = \"https://d.example/simple\"\n[[index]]\nurl = \"https://e.example/simple\"\n";
        assert_eq!(values(toml, &["url"]), vec!["https://e.example/simple"]);
        assert_eq!(
            values(toml, &["index-url"]),
            vec!["https://d.example/simple"]
        );
    }
}
