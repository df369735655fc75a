//! R sessions: which R runs, how the driver is started, and how requests
//! are written for it (R expressions, since base R has no JSON reader).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::executables::find_on_path_where;

/// One line of R, run with `R -e`: reads the driver from fd 3 and starts it.
pub const BOOT: &str = include_str!("r/boot.R");
/// The driver (base R only), sent on fd 3 after a line with its line count:
/// its parts in order, one text evaluated in one environment.
pub const DRIVER: &str = concat!(
    include_str!("r/channel.R"),
    include_str!("r/cells.R"),
    include_str!("r/console.R"),
    include_str!("r/tools.R"),
    include_str!("r/main.R"),
);

/// R's command line before the boot expression.
pub const ARGS: [&str; 5] = ["--vanilla", "--quiet", "--no-echo", "--no-save", "-e"];

/// The workspace's R package library (r_install writes it; sessions see it
/// as R_LIBS_USER, first in `.libPaths()`).
pub const LIBRARY: &str = ".ferrepl/r-library";

/// The boot expression: R drops a missing R_LIBS_USER from its library
/// path, so the library is made (inside the sandbox) and put first before
/// the driver starts. One line, single quotes only.
pub fn boot_expression() -> String {
    format!("{LIBRARY_FIRST}; {}", BOOT.trim_end())
}

/// Makes the workspace's library and puts it first (an R kernel runs it
/// silently before its first cell, so r_install reaches it too).
pub const LIBRARY_FIRST: &str = "local({l <- Sys.getenv('R_LIBS_USER'); if (nzchar(l)) {dir.create(l, recursive = TRUE, showWarnings = FALSE); .libPaths(c(l, .libPaths()))}})";

/// An R string literal of `s` (ASCII, escaped), for code ferrepl writes.
pub fn quote(s: &str) -> String {
    let mut out = String::new();
    string(s, &mut out);
    out
}

/// What the driver reads first: its own source, as a line count and lines.
pub fn driver_message() -> Vec<u8> {
    let body = DRIVER.strip_suffix('\n').unwrap_or(DRIVER);
    format!("{}\n{body}\n", body.lines().count()).into_bytes()
}

/// `--r` / `FERREPL_R` first, then `$R_HOME/bin/R`, then `R` on PATH.
pub fn resolve(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(home) = std::env::var_os("R_HOME").filter(|h| !h.is_empty()) {
        let r = Path::new(&home).join("bin").join("R");
        if crate::executables::is_executable(&r) {
            return Some(r);
        }
    }
    find_on_path_where("R", |_| true)
}

/// How to get an R when none is found.
pub const INSTALL_HINT: &str = "install R (Debian/Ubuntu: apt-get install r-base-core; macOS: brew install r) or pass --r PATH";

/// A request as one line of R: a named `list(...)` of literals.
pub fn encode(request: &serde_json::Map<String, Value>) -> Vec<u8> {
    let mut line = String::from("list(");
    for (i, (key, value)) in request.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        // Keys are ours (op, cell, code, ...): plain identifiers.
        line.push_str(key);
        line.push('=');
        literal(value, &mut line);
    }
    line.push_str(")\n");
    line.into_bytes()
}

fn literal(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("NULL"),
        Value::Bool(true) => out.push_str("TRUE"),
        Value::Bool(false) => out.push_str("FALSE"),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.is_finite() => {
                let _ = write!(out, "{n}");
            }
            _ => out.push_str("NA"),
        },
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push_str("list(");
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                literal(v, out);
            }
            out.push(')');
        }
        Value::Object(map) => {
            out.push_str("list(");
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(k, out);
                out.push('=');
                literal(v, out);
            }
            out.push(')');
        }
    }
}

/// An R string literal: ASCII only, so the driver reads it the same in any
/// locale. NUL cannot be in an R string: callers refuse it first.
fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => {}
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_ascii() => out.push(c),
            c if (c as u32) <= 0xffff => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{{{:08x}}}", c as u32);
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_become_r_lists_of_ascii_literals() {
        let Value::Object(map) = json!({"op": "exec", "cell": 3, "code": "cat(\"é\\n\")\n\t\u{1F600}\u{7}", "eof": false, "name": null})
        else {
            panic!()
        };
        let line = String::from_utf8(encode(&map)).expect("utf8");
        assert!(line.is_ascii());
        assert!(line.ends_with(")\n") && line.matches('\n').count() == 1);
        assert!(
            line.contains(r#"code="cat(\"\u{00e9}\\n\")\n\t\U{0001f600}\x07""#),
            "{line}"
        );
        assert!(
            line.contains("cell=3") && line.contains("eof=FALSE") && line.contains("name=NULL")
        );
    }
}
