//! The bearer tokens of an HTTP server and the tenant each one stands for:
//! `--auth-token`, or `--auth-token-file` with one bare token or lines of
//! `TOKEN TENANT` (several tokens may name one tenant, for rotation).

use std::path::Path;

/// Who a request is: the tenant its token stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tenant {
    /// The one-tenant server: the workspace itself, sessions kept as "local".
    Sole,
    Named(String),
}

impl Tenant {
    pub fn name(&self) -> &str {
        match self {
            Tenant::Sole => "local",
            Tenant::Named(n) => n,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct TokenTable {
    entries: Vec<(String, Tenant)>,
}

/// Shorter tenant (and viewer) tokens are refused: they could be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

impl TokenTable {
    /// No token: every request is the sole tenant (loopback only).
    pub fn open() -> Self {
        Self::default()
    }

    /// A single token for the sole tenant.
    pub fn single(token: &str) -> Self {
        Self {
            entries: vec![(token.to_string(), Tenant::Sole)],
        }
    }

    /// The server's tokens: --auth-token-file, else --auth-token, else none.
    pub fn from_flags(flags: &super::Flags) -> anyhow::Result<Self> {
        if let Some(file) = &flags.serving.auth_token_file {
            return Self::read(file).map_err(|e| anyhow::anyhow!("--auth-token-file {e}"));
        }
        Ok(match flags.serving.auth_token.as_deref().map(str::trim) {
            Some(t) if !t.is_empty() => Self::single(t),
            _ => Self::open(),
        })
    }

    pub fn read(path: &Path) -> Result<Self, String> {
        let text =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text =
            String::from_utf8(text).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// One bare token, or `TOKEN TENANT` lines; `#` comments and blank lines skipped.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries: Vec<(String, Tenant)> = Vec::new();
        let mut bare = 0;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (token, tenant, extra) = (words.next(), words.next(), words.next());
            let line_no = n + 1;
            let Some(token) = token else { continue };
            if extra.is_some() {
                return Err(format!(
                    "line {line_no}: expected 'TOKEN TENANT', found more words"
                ));
            }
            // (A bare token keeps the rules it had before tenants.)
            if tenant.is_some() && token.len() < MIN_TOKEN_LEN {
                return Err(format!(
                    "line {line_no}: the token is shorter than {MIN_TOKEN_LEN} characters; use a random one (e.g. openssl rand -hex 32)"
                ));
            }
            if entries.iter().any(|(t, _)| t == token) {
                return Err(format!("line {line_no}: this token is listed twice"));
            }
            let tenant = match tenant {
                None => {
                    bare += 1;
                    Tenant::Sole
                }
                Some(name) => {
                    check_tenant_name(name).map_err(|e| format!("line {line_no}: {e}"))?;
                    Tenant::Named(name.to_string())
                }
            };
            entries.push((token.to_string(), tenant));
        }
        if entries.is_empty() {
            return Err("no token in the file".into());
        }
        if bare > 1 || (bare == 1 && entries.len() > 1) {
            return Err("give one bare token (one tenant), or 'TOKEN TENANT' on every line".into());
        }
        Ok(Self { entries })
    }

    /// The tokens themselves (never to be shown: `output::redact` keeps
    /// them out of what sessions and results carry).
    pub fn secrets(&self) -> Vec<String> {
        self.entries.iter().map(|(t, _)| t.clone()).collect()
    }

    /// Whether the tokens name tenants (each gets its own area).
    pub fn has_tenants(&self) -> bool {
        self.entries
            .iter()
            .any(|(_, t)| matches!(t, Tenant::Named(_)))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tenants the tokens stand for, each once.
    pub fn tenants(&self) -> Vec<Tenant> {
        let mut out: Vec<Tenant> = Vec::new();
        for (_, t) in &self.entries {
            if !out.contains(t) {
                out.push(t.clone());
            }
        }
        out
    }

    /// Whether some token stands for `tenant`.
    pub fn has(&self, tenant: &Tenant) -> bool {
        self.entries.iter().any(|(_, t)| t == tenant)
    }

    /// Refuses a table holding a token shorter than [`MIN_TOKEN_LEN`] (the
    /// viewer's tokens, bare ones too: a browser form invites guessing).
    pub fn check_min_len(&self) -> Result<(), String> {
        if self.entries.iter().any(|(t, _)| t.len() < MIN_TOKEN_LEN) {
            return Err(format!(
                "a token is shorter than {MIN_TOKEN_LEN} characters; use a random one (e.g. openssl rand -hex 32)"
            ));
        }
        Ok(())
    }

    /// Whether a token of `other` is one of ours too.
    pub fn shares_a_token_with(&self, other: &TokenTable) -> bool {
        self.entries
            .iter()
            .any(|(t, _)| other.entries.iter().any(|(o, _)| o == t))
    }

    /// Whether `other` holds exactly our tokens for `tenant` (a viewer
    /// login made with a ticket ends when they change).
    pub fn same_tokens(&self, other: &TokenTable, tenant: &Tenant) -> bool {
        fn of<'a>(table: &'a TokenTable, tenant: &Tenant) -> Vec<&'a str> {
            let mut tokens: Vec<&str> = table
                .entries
                .iter()
                .filter(|(_, t)| t == tenant)
                .map(|(token, _)| token.as_str())
                .collect();
            tokens.sort_unstable();
            tokens
        }
        of(self, tenant) == of(other, tenant)
    }

    /// The tenant of a presented token. Every entry is compared in constant
    /// time, so timing says nothing about which tokens exist.
    pub fn tenant_of(&self, given: &[u8]) -> Option<&Tenant> {
        let mut found = None;
        for (token, tenant) in &self.entries {
            if constant_time_eq(given, token.as_bytes()) {
                found = Some(tenant);
            }
        }
        found
    }
}

/// Tenant names become directory and file names (the store's principal).
pub fn check_tenant_name(name: &str) -> Result<(), String> {
    if crate::store::is_valid_principal(name) {
        Ok(())
    } else {
        Err(format!(
            "tenant {name:?} is not 1-64 of A-Z, a-z, 0-9, '_' and '-'"
        ))
    }
}

/// `bytes` random bytes from the kernel, as hex: ids that are bearer
/// handles (viewer logins and tickets, MCP task ids), never guessable.
pub fn random_id(bytes: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn tenant_lines_map_tokens_to_tenants() {
        let t = TokenTable::parse(&format!("# ours\n{A} alpha\n\n{B} beta\n")).unwrap();
        assert!(t.has_tenants());
        assert_eq!(
            t.tenant_of(A.as_bytes()),
            Some(&Tenant::Named("alpha".into()))
        );
        assert_eq!(
            t.tenant_of(B.as_bytes()),
            Some(&Tenant::Named("beta".into()))
        );
        assert_eq!(t.tenant_of(b"cccccccccccccccccccc"), None);
        assert_eq!(t.tenant_of(&A.as_bytes()[..10]), None);
    }

    #[test]
    fn one_bare_token_is_the_sole_tenant() {
        let t = TokenTable::parse(&format!("{A}\n")).unwrap();
        assert!(!t.has_tenants());
        assert_eq!(t.tenant_of(A.as_bytes()), Some(&Tenant::Sole));
    }

    #[test]
    fn short_bare_tokens_fail_the_length_check_and_shared_tokens_are_seen() {
        let short = TokenTable::parse("short\n").unwrap();
        assert!(
            short
                .check_min_len()
                .unwrap_err()
                .contains("shorter than 16")
        );
        let long = TokenTable::parse(&format!("{A}\n")).unwrap();
        assert!(long.check_min_len().is_ok());
        let both = TokenTable::parse(&format!("{A} alpha\n{B} beta\n")).unwrap();
        assert!(both.shares_a_token_with(&TokenTable::single(B)));
        assert!(!both.shares_a_token_with(&TokenTable::single("cccccccccccccccccccc")));
    }

    #[test]
    fn bad_files_are_refused_with_the_line() {
        let bad = [
            (String::new(), "no token"),
            (format!("{A}\n{B}\n"), "one bare token"),
            (format!("{A} alpha\n{B}\n"), "one bare token"),
            (
                format!("{A} alpha\n{A} beta\n"),
                "line 2: this token is listed twice",
            ),
            (format!("{A} ../etc\n"), "line 1: tenant"),
            (format!("{A} a b\n"), "more words"),
            ("short alpha\n".to_string(), "shorter than 16"),
        ];
        for (text, want) in bad {
            let err = TokenTable::parse(&text).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
