//! The operator's upstream MCP servers: `--mcp-servers FILE`, a JSON file in
//! the `mcpServers` format most hosts use, with ferrepl's own optional keys
//! per server (`allowTools`, `timeoutSeconds`, `tenants`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// Largest configuration file read (it holds commands and tokens, not data).
const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// At most this many servers in one file.
const MAX_SERVERS: usize = 64;

/// How ferrepl reaches one upstream server.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Exactly the variables it gets beside a minimal base (PATH, HOME, LANG).
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    /// Streamable HTTP.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// One configured server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSpec {
    pub name: String,
    pub transport: Transport,
    /// Glob patterns (`*`, `?`) of the tools code may call; None = all.
    pub allow_tools: Option<Vec<String>>,
    /// Per call; None = the server-wide default.
    pub timeout: Option<Duration>,
    /// Tenants granted; None = every tenant.
    pub tenants: Option<Vec<String>>,
}

impl ServerSpec {
    /// Whether code may call `tool` of this server.
    pub fn allows(&self, tool: &str) -> bool {
        match &self.allow_tools {
            None => true,
            Some(patterns) => patterns.iter().any(|p| glob_match(p, tool)),
        }
    }

    /// Whether `tenant` (its name; "local" for a one-tenant server) may use it.
    pub fn grants(&self, tenant: &str) -> bool {
        match &self.tenants {
            None => true,
            Some(names) => names.iter().any(|n| n == tenant),
        }
    }
}

/// The whole file, servers in name order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamConfig {
    pub servers: Vec<ServerSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileForm {
    #[serde(rename = "mcpServers")]
    mcp_servers: BTreeMap<String, ServerForm>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerForm {
    #[serde(rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(rename = "allowTools")]
    allow_tools: Option<Vec<String>>,
    #[serde(rename = "timeoutSeconds")]
    timeout_seconds: Option<f64>,
    tenants: Option<Vec<String>>,
    /// Hosts' own switch; a disabled server is left out.
    disabled: Option<bool>,
}

impl UpstreamConfig {
    /// Reads and checks `path`; the error says what to fix.
    pub fn read(path: &Path) -> Result<Self, String> {
        use std::io::Read;
        let file = std::fs::File::open(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut text = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(format!(
                "{} is larger than {MAX_FILE_BYTES} bytes: it should hold server settings only",
                path.display()
            ));
        }
        let text = std::str::from_utf8(&text)
            .map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
        Self::parse(text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let form: FileForm = serde_path_to_error::deserialize(de).map_err(|e| {
            format!(
                "{e} (expected {{\"mcpServers\": {{\"NAME\": {{\"command\": ..., \"args\": [...]}} or {{\"url\": ...}}}}}})"
            )
        })?;
        if form.mcp_servers.len() > MAX_SERVERS {
            return Err(format!("more than {MAX_SERVERS} servers"));
        }
        let mut servers = Vec::new();
        for (name, server) in form.mcp_servers {
            if server.disabled == Some(true) {
                continue;
            }
            servers.push(server_spec(&name, server).map_err(|e| format!("server '{name}': {e}"))?);
        }
        Ok(UpstreamConfig { servers })
    }

    pub fn get(&self, name: &str) -> Option<&ServerSpec> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// What the servers are handed that sessions must never read: every
    /// `env` value, every header value (and its words), the credentials of
    /// every URL (redacted from whatever the servers say, see
    /// `output::redact`).
    pub fn secrets(&self) -> Vec<String> {
        use crate::output::redact::{header_secrets, url_credentials};
        let mut out = Vec::new();
        for server in &self.servers {
            match &server.transport {
                Transport::Stdio { env, .. } => {
                    for value in env.values() {
                        // Its words too (`--token KEY`): a cut value's
                        // start is looked for by word (output::redact).
                        out.push(value.clone());
                        out.extend(value.split_whitespace().map(str::to_string));
                    }
                }
                Transport::Http { url, headers } => {
                    out.extend(url_credentials(url));
                    for value in headers.values() {
                        out.extend(header_secrets(value));
                    }
                }
            }
        }
        out
    }
}

fn server_spec(name: &str, form: ServerForm) -> Result<ServerSpec, String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
    {
        return Err("a name is 1 to 64 letters, digits, '_', '-' or '.'".into());
    }
    let transport = match (form.command, form.url) {
        (Some(command), None) => {
            if !matches!(form.kind.as_deref(), None | Some("stdio")) {
                return Err("\"command\" goes with \"type\": \"stdio\"".into());
            }
            if command.trim().is_empty() {
                return Err("\"command\" is empty".into());
            }
            if !form.headers.is_empty() {
                return Err("\"headers\" are for a \"url\" server".into());
            }
            for key in form.env.keys() {
                if key.is_empty() || key.contains('=') || key.contains('\0') {
                    return Err(format!("\"env\" has an invalid variable name {key:?}"));
                }
            }
            Transport::Stdio {
                command,
                args: form.args,
                env: form.env,
                cwd: form.cwd,
            }
        }
        (None, Some(url)) => {
            if !matches!(
                form.kind.as_deref(),
                None | Some("http") | Some("streamable-http") | Some("streamableHttp")
            ) {
                return Err(
                    "only streamable HTTP is supported for a \"url\" server (\"type\": \"http\"); SSE-only servers are not".into(),
                );
            }
            if !form.args.is_empty() || !form.env.is_empty() || form.cwd.is_some() {
                return Err("\"args\", \"env\" and \"cwd\" are for a \"command\" server".into());
            }
            let parsed = url::Url::parse(&url).map_err(|e| format!("\"url\" {url:?}: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!("\"url\" {url:?}: only http and https"));
            }
            for (key, value) in &form.headers {
                if http::HeaderName::from_bytes(key.as_bytes()).is_err()
                    || http::HeaderValue::from_str(value).is_err()
                {
                    return Err(format!("\"headers\" has an invalid header {key:?}"));
                }
            }
            Transport::Http {
                url,
                headers: form.headers,
            }
        }
        (Some(_), Some(_)) => return Err("give \"command\" or \"url\", not both".into()),
        (None, None) => return Err("give \"command\" (stdio) or \"url\" (streamable HTTP)".into()),
    };
    if let Some(patterns) = &form.allow_tools
        && patterns.iter().any(|p| p.is_empty() || p.len() > 128)
    {
        return Err("\"allowTools\" patterns are 1 to 128 characters".into());
    }
    let timeout = match form.timeout_seconds {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => {
            return Err(format!(
                "\"timeoutSeconds\" {s}: give more than 0 and at most 86400"
            ));
        }
    };
    Ok(ServerSpec {
        name: name.to_string(),
        transport,
        allow_tools: form.allow_tools,
        timeout,
        tenants: form.tenants,
    })
}

/// `*` any run of characters, `?` one character; everything else literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // The last `*` seen and where in the text it resumed: linear backtracking.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("get-*", "get-issue"));
        assert!(glob_match("get-*", "get-"));
        assert!(!glob_match("get-*", "set-issue"));
        assert!(glob_match("echo", "echo"));
        assert!(!glob_match("echo", "echo2"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a?c", "abc"));
        assert!(glob_match("*x*y*", "axbyc"));
        assert!(!glob_match("*x*y", "axbyc"));
        assert!(glob_match("[a]", "[a]"));
    }

    #[test]
    fn parses_both_kinds_and_ferrepl_keys() {
        let c = UpstreamConfig::parse(
            r#"{"mcpServers": {
                "gh": {"command": "npx", "args": ["-y", "x"], "env": {"TOKEN": "s"},
                       "allowTools": ["get-*"], "timeoutSeconds": 30, "tenants": ["alice"]},
                "docs": {"type": "http", "url": "https://example.com/mcp", "headers": {"Authorization": "Bearer t"}},
                "off": {"command": "x", "disabled": true}
            }}"#,
        )
        .expect("parses");
        assert_eq!(c.servers.len(), 2);
        let gh = c.get("gh").expect("gh");
        assert!(gh.allows("get-issue") && !gh.allows("delete-repo"));
        assert!(gh.grants("alice") && !gh.grants("bob"));
        assert_eq!(gh.timeout, Some(Duration::from_secs(30)));
        assert!(matches!(
            c.get("docs").map(|s| &s.transport),
            Some(Transport::Http { .. })
        ));
    }

    #[test]
    fn refuses_what_it_cannot_use() {
        for bad in [
            r#"{"mcpServers": {"a": {}}}"#,
            r#"{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}"#,
            r#"{"mcpServers": {"a b": {"command": "x"}}}"#,
            r#"{"mcpServers": {"a": {"url": "file:///etc/passwd"}}}"#,
            r#"{"mcpServers": {"a": {"type": "sse", "url": "http://h/sse"}}}"#,
            r#"{"mcpServers": {"a": {"command": "x", "timeoutSeconds": -1}}}"#,
            r#"{"mcpServers": {"a": {"command": "x", "env": {"A=B": "c"}}}}"#,
            r#"{"mcpServers": {"a": {"url": "http://h", "headers": {"X": "a\nb"}}}}"#,
            r#"{"mcpServers": {"a": {"command": "x", "allowTool": ["y"]}}}"#,
            r#"{"servers": {}}"#,
            "[]",
        ] {
            assert!(UpstreamConfig::parse(bad).is_err(), "{bad}");
        }
    }
}
