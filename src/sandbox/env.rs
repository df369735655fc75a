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

/// Checks an agent-given variable name; the error says why it is refused.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(format!(
            "environment variable name '{name}' is not valid (empty, or contains '=' or NUL)"
        ));
    }
    if name.starts_with("FERREPL_") {
        return Err(format!(
            "environment variable '{name}' is not allowed: FERREPL_* settings belong to the server"
        ));
    }
    if name.starts_with("LD_") || LOADER.contains(&name) {
        return Err(format!(
            "environment variable '{name}' is not allowed: loader and libc path variables (LD_*, GCONV_PATH, LOCPATH, ...) are refused; set others freely"
        ));
    }
    Ok(())
}

/// Checks an agent-given environment (names and values).
pub fn check(env: &BTreeMap<String, String>) -> Result<(), String> {
    for (k, v) in env {
        check_name(k)?;
        if v.contains('\0') {
            return Err(format!(
                "environment variable '{k}' has a NUL character in its value"
            ));
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
