//! The environment of sandboxed programs: an allow-list of the server's own
//! variables plus what the operator names, never the rest (API keys, agent
//! sockets), and checks on the variables an agent asks for.

use std::collections::BTreeMap;

/// Server variables every session and job gets: harmless settings a shell
/// or an interpreter needs to behave as the user expects.
const PASSED: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "COLORTERM",
    "NO_COLOR",
    "USER",
    "LOGNAME",
    "SHELL",
];

/// Variables that make the dynamic loader or libc load code or data from a
/// path (glibc's list of variables it ignores for set-uid programs, plus
/// the LD_ family). Refused in agent-given environments.
const LOADER: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TZDIR",
];

/// The variables that send a sandboxed process's HTTP(S) through the relay
/// on `port` of its network namespace (`--network domains`). Loopback
/// names bypass it: in a cell they mean the cell's own namespace, never
/// the server's host.
pub fn proxy_vars(port: u16) -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{port}");
    let mut vars: Vec<(String, String)> =
        ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
            .iter()
            .map(|v| (v.to_string(), proxy.clone()))
            .collect();
    for v in ["NO_PROXY", "no_proxy"] {
        vars.push((v.to_string(), LOOPBACK_NAMES.to_string()));
    }
    vars
}

/// What `NO_PROXY` holds in cells with `--network domains`.
pub const LOOPBACK_NAMES: &str = "localhost,127.0.0.1,::1";

/// The server environment passed on: the allow-list, every `LC_*`, and the
/// names in `extra` (--pass-env).
pub fn inherited(extra: &[String]) -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| {
            PASSED.contains(&k.as_str()) || k.starts_with("LC_") || extra.iter().any(|e| e == k)
        })
        .filter(|(k, _)| !k.starts_with("FERREPL_"))
        .collect()
}

/// Why an agent-given variable is refused.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("environment variable name '{0}' is not valid (empty, or contains '=' or NUL)")]
    BadName(String),
    #[error("environment variable '{0}' is not allowed: FERREPL_* settings belong to the server")]
    Server(String),
    #[error(
        "environment variable '{0}' is not allowed: loader and libc path variables (LD_*, GCONV_PATH, LOCPATH, ...) are refused; set others freely"
    )]
    Loader(String),
    #[error("environment variable '{0}' has a NUL character in its value")]
    NulValue(String),
}

/// Checks an agent-given variable name.
pub fn check_name(name: &str) -> Result<(), EnvError> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(EnvError::BadName(name.to_string()));
    }
    if name.starts_with("FERREPL_") {
        return Err(EnvError::Server(name.to_string()));
    }
    if name.starts_with("LD_") || LOADER.contains(&name) {
        return Err(EnvError::Loader(name.to_string()));
    }
    Ok(())
}

/// Checks an agent-given environment (names and values).
pub fn check(env: &BTreeMap<String, String>) -> Result<(), EnvError> {
    for (k, v) in env {
        check_name(k).inspect_err(|e| {
            if matches!(e, EnvError::Server(_) | EnvError::Loader(_)) {
                crate::metrics::sandbox_refusal(crate::metrics::SandboxRefusal::Env);
            }
        })?;
        if v.contains('\0') {
            return Err(EnvError::NulValue(k.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_variables_are_refused() {
        for bad in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "GCONV_PATH",
            "FERREPL_X",
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert!(check_name("MY_VAR").is_ok());
        assert!(check_name("A=B").is_err());
    }
}
