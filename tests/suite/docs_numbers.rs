//! The numbers the docs state, checked against the code, so that they
//! cannot drift again:
//!
//! * **Tool counts and sizes.** README.md and docs/tools.md show one table,
//!   between `<!-- tool-surface ... -->` and `<!-- /tool-surface -->`, of
//!   what each profile shows the model: measured here from the server's own
//!   `tools/list` and instructions, counted as `scripts/tool-surface.py` and
//!   `tool_surface` count, with the budgets of `scripts/tool-budgets.json`.
//!   `bash scripts/docs-numbers.sh` (this test with `FERREPL_UPDATE_DOCS=1`)
//!   rewrites the tables; otherwise a table that differs fails the test.
//! * **Flag defaults.** Every row of the README's flags table names a flag
//!   and variable `ferrepl --help` has, and states clap's default where
//!   clap has one (sizes such as `64 MiB` in bytes); a bare number where
//!   clap has none is refused. Every flag of `--help` has a row. In the
//!   prose of README.md and docs/*.md, a flag followed by a number in
//!   parentheses or after a comma (`--max-wait` (50 s), `--session-ttl`
//!   (2 h)) must be clap's default, in the unit it names.
//! * **Codex's timeout.** The `tool_timeout_sec` of the README's Codex
//!   example is what `ferrepl install --client codex` writes, and the
//!   README's "N s above" is what it adds to `--max-wait`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::support::server_binary;
use crate::tool_surface::{Surface, budget};

/// Set to 1 to rewrite the tables instead of checking them.
const UPDATE_ENV: &str = "FERREPL_UPDATE_DOCS";
const BEGIN: &str = "<!-- tool-surface";
const END: &str = "<!-- /tool-surface -->";
/// The files that show the tool-surface table.
const TABLE_FILES: &[&str] = &["README.md", "docs/tools.md"];

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// 12345 -> "12,345".
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A size as the docs give it: to the nearest hundred.
fn about(n: usize) -> String {
    format!("about {}", thousands((n + 50) / 100 * 100))
}

// ------------------------------------------------------------------ tool surface

/// The block between the markers, as the measured surfaces make it.
fn surface_block(default: &Surface, all: &Surface, default_r: &Surface, all_r: &Surface) -> String {
    let r_budget = thousands(budget("r_added_visible"));
    let rows = [
        (
            "default (`--tools python,packages`)",
            default,
            thousands(budget("default_visible")),
        ),
        ("`--tools all`", all, thousands(budget("all_visible"))),
        (
            "default, with R (`--languages python,r`)",
            default_r,
            format!("{} + {r_budget}", thousands(budget("default_visible"))),
        ),
        (
            "`--tools all --languages python,r`",
            all_r,
            format!("{} + {r_budget}", thousands(budget("all_visible"))),
        ),
    ];
    let mut out = String::from(
        "| profile | tools | model-visible characters | budget |\n| -- | -- | -- | -- |\n",
    );
    for (name, surface, limit) in rows {
        out.push_str(&format!(
            "| {name} | {} | {} | {limit} |\n",
            surface.names().len(),
            about(surface.visible())
        ));
    }
    let note = format!(
        "Model-visible: each tool's name, description and input schema as `tools/list` \
         sends them, plus the server's instructions (`scripts/tool-surface.py` prints them \
         per tool). The whole tools array of `--tools all`, annotations included, is {} \
         characters of JSON (budget {}); the response line of a `1+1` cell is at most {}.",
        about(all.tools_json()),
        thousands(budget("all_tools_json")),
        thousands(budget("one_plus_one_line")),
    );
    out.push('\n');
    out.push_str(&wrap(&note, 76));
    out
}

/// `text` as lines of at most `width` characters (words are not split).
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The byte range of the block's body in `text`: after the line that opens
/// it, up to the closing marker.
fn block_range(text: &str) -> Option<std::ops::Range<usize>> {
    let begin = text.find(BEGIN)?;
    let body = begin + text[begin..].find('\n')? + 1;
    let end = body + text[body..].find(END)?;
    Some(body..end)
}

#[tokio::test]
async fn the_tool_surface_tables_are_measured_from_the_server() {
    let (default, all, default_r, all_r) = tokio::join!(
        Surface::of(&[]),
        Surface::of(&["--tools", "all"]),
        Surface::of(&["--languages", "python,r"]),
        Surface::of(&["--tools", "all", "--languages", "python,r"]),
    );
    let block = surface_block(&default, &all, &default_r, &all_r);
    let update = std::env::var(UPDATE_ENV).is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for rel in TABLE_FILES {
        let text = read(rel);
        let range = block_range(&text).unwrap_or_else(|| {
            panic!("{rel} has no `{BEGIN} ... -->` ... `{END}` block for the tool-surface table")
        });
        if text[range.clone()] == block {
            continue;
        }
        if update {
            let mut new = text.clone();
            new.replace_range(range, &block);
            std::fs::write(repo(rel), new).unwrap_or_else(|e| panic!("write {rel}: {e}"));
            println!("rewrote the tool-surface table of {rel}");
        } else {
            stale.push(format!("{rel} says:\n{}", &text[range]));
        }
    }
    assert!(
        stale.is_empty(),
        "the tool-surface tables differ from the server's tools/list; \
         run `bash scripts/docs-numbers.sh` to rewrite them.\nMeasured:\n{block}\n{}",
        stale.join("\n")
    );
}

/// docs/tools.md's group table lists exactly what `--tools GROUP` exposes.
#[tokio::test]
async fn the_group_table_lists_what_each_group_exposes() {
    let text = read("docs/tools.md");
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(group), Some(tools)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let group = group.split('`').nth(1).unwrap_or_default().to_string();
        let listed: std::collections::BTreeSet<String> = tools
            .split(',')
            .map(|t| t.trim().trim_matches('`').to_string())
            .filter(|t| !t.is_empty())
            .collect();
        if ["python", "packages", "more", "shell", "files"].contains(&group.as_str()) {
            rows.push((group, listed));
        }
    }
    assert_eq!(rows.len(), 5, "docs/tools.md's group table: {rows:?}");
    for (group, listed) in rows {
        let exposed: std::collections::BTreeSet<String> = Surface::of(&["--tools", &group])
            .await
            .names()
            .into_iter()
            .collect();
        assert_eq!(
            listed, exposed,
            "docs/tools.md lists these tools for group `{group}`; `--tools {group}` exposes the others"
        );
    }
}

#[test]
fn the_table_block_is_found_and_sizes_are_rounded() {
    assert_eq!(about(3513), "about 3,500");
    assert_eq!(about(3550), "about 3,600");
    assert_eq!(about(12025), "about 12,000");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1234567), "1,234,567");
    assert_eq!(wrap("aa bb cc", 5), "aa bb\ncc\n");
    let text = "a\n<!-- tool-surface: x -->\n| t |\n<!-- /tool-surface -->\nb\n";
    let range = block_range(text).expect("a block");
    assert_eq!(&text[range], "| t |\n");
    assert!(block_range("<!-- tool-surface -->\nno end\n").is_none());
}

// ------------------------------------------------------------------ flag defaults

/// A flag as `ferrepl --help` shows it.
#[derive(Debug, Default)]
struct HelpFlag {
    env: Option<String>,
    default: Option<String>,
}

fn help_flags() -> BTreeMap<String, HelpFlag> {
    let mut cmd = std::process::Command::new(server_binary());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("FERREPL_") {
            cmd.env_remove(key);
        }
    }
    let out = cmd.arg("--help").output().expect("run ferrepl --help");
    assert!(out.status.success(), "ferrepl --help failed: {out:?}");
    parse_help(&String::from_utf8_lossy(&out.stdout))
}

/// `--flag` -> its `[env: X=]` and `[default: V]`, from clap's long help.
fn parse_help(help: &str) -> BTreeMap<String, HelpFlag> {
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let option = trimmed.strip_prefix("--").or_else(|| {
            trimmed
                .strip_prefix("-")
                .and_then(|t| t.split_once(", --").map(|x| x.1))
        });
        if (2..=8).contains(&indent)
            && let Some(rest) = option
        {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            flags.insert(name.clone(), HelpFlag::default());
            current = Some(name);
            continue;
        }
        let Some(flag) = current.as_ref().and_then(|c| flags.get_mut(c)) else {
            continue;
        };
        if let Some(env) = trimmed.strip_prefix("[env: ") {
            let name: String = env
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            flag.env = Some(name);
        } else if let Some(default) = trimmed.strip_prefix("[default: ") {
            flag.default = default.strip_suffix(']').map(str::to_string);
        }
    }
    flags
}

/// A number with an optional unit, in the flag's own unit: seconds for a
/// flag of seconds (`2 h` is 7200), bytes for sizes (`64 MiB`, `10 KB`,
/// `4G`, whose K/M/G are binary in ferrepl), milliseconds for `-ms` flags.
fn value_of(number: &str, unit: &str, flag: &str) -> Option<f64> {
    let n: f64 = number.replace(',', "").parse().ok()?;
    let factor = match unit {
        "" => 1.0,
        "ms" if flag.ends_with("-ms") => 1.0,
        "ms" => 0.001,
        "s" if flag.ends_with("-ms") => 1000.0,
        "s" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "K" | "KiB" => 1024.0,
        "M" | "MiB" => 1024.0 * 1024.0,
        "G" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(n * factor)
}

/// clap's default as a number, when it is one (`4G` included).
fn default_value(default: &str, flag: &str) -> Option<f64> {
    let split = default
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(default.len());
    if split == 0 {
        return None;
    }
    value_of(&default[..split], default[split..].trim(), flag)
}

/// A default as the README's table states it: backticks and a trailing
/// parenthesis dropped (`0 (off)` is 0).
fn stated_default(cell: &str) -> String {
    let cell = cell.replace('`', "");
    let cell = match cell.find(" (") {
        Some(i) if cell.ends_with(')') => cell[..i].to_string(),
        _ => cell,
    };
    cell.trim().to_string()
}

/// `64 MiB`, `30`, `4G` as a number in the flag's unit; None for words.
fn stated_number(stated: &str, flag: &str) -> Option<f64> {
    let (number, unit) = stated.split_once(' ').unwrap_or((stated, ""));
    if number.chars().next().is_some_and(|c| c.is_ascii_digit()) {
        let split = number
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
            .unwrap_or(number.len());
        let unit = if split < number.len() {
            &number[split..]
        } else {
            unit
        };
        value_of(&number[..split], unit, flag)
    } else {
        None
    }
}

/// The flags table's rows: flag -> (variable, default) as written.
fn readme_flags(readme: &str) -> Vec<(String, String, String)> {
    let mut rows = Vec::new();
    for line in readme.lines().filter(|l| l.starts_with("| `--")) {
        // Cells split on `|` that is not escaped (`on\|off`).
        let mut cells = Vec::new();
        let mut cell = String::new();
        let mut prev = ' ';
        for c in line.chars() {
            if c == '|' && prev != '\\' {
                cells.push(std::mem::take(&mut cell));
            } else {
                cell.push(c);
            }
            prev = c;
        }
        let cells: Vec<&str> = cells.iter().map(|c| c.trim()).collect();
        let Some(first) = cells.get(1) else { continue };
        let name: String = first
            .trim_start_matches("`--")
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let env = cells.get(2).map(|c| c.replace('`', "")).unwrap_or_default();
        // Rows of other tables (the tool-surface one) start with a flag too.
        if !env.starts_with("FERREPL_") {
            continue;
        }
        let default = cells.get(3).map(|c| c.to_string()).unwrap_or_default();
        rows.push((name, env, default));
    }
    rows
}

#[test]
fn the_readme_flags_table_agrees_with_ferrepl_help() {
    let help = help_flags();
    assert!(
        help.contains_key("max-wait") && help["max-wait"].default.as_deref() == Some("50"),
        "the --help parser found no --max-wait 50: {help:#?}"
    );
    let readme = read("README.md");
    let rows = readme_flags(&readme);
    let mut problems = Vec::new();
    for (flag, env, default) in &rows {
        let Some(h) = help.get(flag) else {
            problems.push(format!(
                "--{flag}: in the README's table, not in ferrepl --help"
            ));
            continue;
        };
        if h.env.as_deref() != Some(env.as_str()) {
            problems.push(format!(
                "--{flag}: the README's variable is {env}, --help says {:?}",
                h.env
            ));
        }
        let stated = stated_default(default);
        match &h.default {
            Some(clap) => {
                let agree = match (stated_number(&stated, flag), default_value(clap, flag)) {
                    (Some(a), Some(b)) => (a - b).abs() < 1e-9,
                    _ => stated == *clap,
                };
                if !agree {
                    problems.push(format!(
                        "--{flag}: the README's default is {default:?}, clap's is {clap:?}"
                    ));
                }
            }
            None if stated_number(&stated, flag).is_some() => problems.push(format!(
                "--{flag}: the README states a default of {default:?}; clap has none"
            )),
            None => {}
        }
    }
    for flag in help.keys() {
        if !["help", "version"].contains(&flag.as_str()) && !rows.iter().any(|r| &r.0 == flag) {
            problems.push(format!(
                "--{flag}: in ferrepl --help, missing from the README's table"
            ));
        }
    }
    assert!(
        rows.len() > 40 && problems.is_empty(),
        "{} rows; the README's flags table disagrees with ferrepl --help:\n  {}",
        rows.len(),
        problems.join("\n  ")
    );
}

/// Every "`--flag` (N unit" or "`--flag`, N unit" in `text` (whitespace
/// folded): (flag, number, unit, the words around it).
fn prose_mentions(text: &str) -> Vec<(String, String, String, String)> {
    let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut found = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("`--") {
        let after = &rest[i + 3..];
        rest = after;
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let Some(tail) = after[name.len()..].strip_prefix('`') else {
            continue;
        };
        let Some(tail) = tail.strip_prefix(" (").or_else(|| tail.strip_prefix(", ")) else {
            continue;
        };
        let tail = tail.strip_prefix("default ").unwrap_or(tail);
        let number: String = tail
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '.')
            .collect();
        let number = number.trim_end_matches([',', '.']).to_string();
        if number.is_empty() {
            continue;
        }
        let after_number = tail[number.len()..].trim_start();
        // "64 × cores" is arithmetic, not a default.
        if after_number.starts_with('×') {
            continue;
        }
        let unit: String = after_number
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect();
        let unit = match unit.as_str() {
            "ms" | "s" | "min" | "h" | "KB" | "MB" | "KiB" | "MiB" | "GiB" | "K" | "M" | "G" => {
                unit
            }
            _ => String::new(),
        };
        let context: String = tail.chars().take(40).collect();
        found.push((name, number, unit, context));
    }
    found
}

#[test]
fn defaults_named_in_the_docs_prose_are_clap_defaults() {
    let help = help_flags();
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(repo("docs"))
        .expect("read docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut checked = 0;
    let mut problems = Vec::new();
    for rel in &files {
        for (flag, number, unit, context) in prose_mentions(&read(rel)) {
            let Some(h) = help.get(&flag) else {
                problems.push(format!("{rel}: `--{flag}` is not a flag of ferrepl --help"));
                continue;
            };
            let Some(clap) = &h.default else {
                problems.push(format!(
                    "{rel}: `--{flag}` ({context}...) states {number} {unit}, but the flag has no \
                     default in ferrepl --help"
                ));
                continue;
            };
            checked += 1;
            let stated = value_of(&number, &unit, &flag);
            let actual = default_value(clap, &flag);
            if stated.is_none() || actual.is_none() || stated != actual {
                problems.push(format!(
                    "{rel}: `--{flag}` ({context}...) says {number} {unit}; its default is {clap}"
                ));
            }
        }
    }
    assert!(
        checked >= 20 && problems.is_empty(),
        "{checked} defaults checked; the docs disagree with ferrepl --help:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_prose_parser_reads_units_and_skips_arithmetic() {
    let text = "capped by `--max-wait` (default 50 s): and `--session-ttl`\n(2 h) and \
                `--output-tail-bytes` (10 KB each), idle for `--http-session-idle`, 300 s; \
                max(4096, 8 × `--max-processes`, 64 × cores); `--workdir` (a directory)";
    let found = prose_mentions(text);
    let got: Vec<(&str, &str, &str)> = found
        .iter()
        .map(|(f, n, u, _)| (f.as_str(), n.as_str(), u.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("max-wait", "50", "s"),
            ("session-ttl", "2", "h"),
            ("output-tail-bytes", "10", "KB"),
            ("http-session-idle", "300", "s"),
        ]
    );
    assert_eq!(value_of("2", "h", "session-ttl"), Some(7200.0));
    assert_eq!(value_of("64", "MiB", "output-log-bytes"), Some(67108864.0));
    assert_eq!(default_value("4G", "memory-limit"), Some(4294967296.0));
    assert_eq!(
        stated_number("64 MiB", "output-log-bytes"),
        Some(67108864.0)
    );
    assert_eq!(stated_number("off", "http"), None);
    assert_eq!(stated_default("0 (off)"), "0");
    assert_eq!(stated_default("`20000-59999`"), "20000-59999");
}

// ------------------------------------------------------------------ codex

#[test]
fn codex_timeout_in_the_readme_is_what_install_writes() {
    let home = tempfile::tempdir().expect("a home");
    let mut cmd = std::process::Command::new(server_binary());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("FERREPL_") {
            cmd.env_remove(key);
        }
    }
    let out = cmd
        .args(["install", "--client", "codex"])
        .env("HOME", home.path())
        .env_remove("CODEX_HOME")
        .env_remove("XDG_CONFIG_HOME")
        .current_dir(home.path())
        .output()
        .expect("run ferrepl install");
    assert!(
        out.status.success(),
        "ferrepl install --client codex: {out:?}"
    );
    let config = std::fs::read_to_string(home.path().join(".codex/config.toml"))
        .expect("the Codex config install wrote");
    let written = number_after(&config, "tool_timeout_sec = ")
        .unwrap_or_else(|| panic!("no tool_timeout_sec in what install wrote:\n{config}"));
    let max_wait = help_flags()
        .get("max-wait")
        .and_then(|f| f.default.as_deref())
        .and_then(|d| d.parse::<u64>().ok())
        .expect("--max-wait's default");
    assert!(
        written > max_wait,
        "install writes tool_timeout_sec = {written}, not above --max-wait ({max_wait})"
    );

    let readme = read("README.md");
    let example = number_after(&readme, "tool_timeout_sec = ")
        .expect("the README's Codex example has a tool_timeout_sec");
    assert_eq!(
        example, written,
        "the README's Codex example says tool_timeout_sec = {example}; install writes {written}"
    );
    let folded: String = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let margin = number_after(&folded, "`tool_timeout_sec` ")
        .expect("the README says how far above --max-wait Codex's timeout is");
    assert_eq!(
        max_wait + margin,
        written,
        "the README says tool_timeout_sec is {margin} s above --max-wait ({max_wait}); \
         install writes {written}"
    );
}

/// The number right after the first `prefix` in `text`.
fn number_after(text: &str, prefix: &str) -> Option<u64> {
    let at = text.find(prefix)? + prefix.len();
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}
