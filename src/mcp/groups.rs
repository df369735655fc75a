//! --tools: which groups of tools the server exposes.

use std::collections::BTreeSet;

use crate::worker::Language;

/// Every tool by group and language (None: every language's). The default
/// groups are what an agent needs when its host already has shell and file
/// tools (Claude Code, Codex, Cursor); `more`, `shell` and `files` are for
/// the rest. The `python` group is the core of each language enabled with
/// --languages.
#[rustfmt::skip]
const TOOLS: &[(&str, Option<Language>, &[&str])] = &[
    ("python", Some(Language::Python), &["python_exec", "python_wait", "python_output", "python_inspect"]),
    ("python", Some(Language::R), &["r_exec", "r_wait", "r_output", "r_inspect"]),
    ("python", None, &["python_sessions"]),
    // Listed only when --kernels names a kernel of another language
    // (server.rs); its cells are followed by the Python tools.
    ("python", Some(Language::Python), &["kernel_exec"]),
    ("packages", Some(Language::Python), &["python_install"]),
    ("packages", Some(Language::R), &["r_install"]),
    ("more", Some(Language::Python), &["python_run_file", "python_complete", "python_namespace"]),
    ("more", Some(Language::R), &["r_complete"]),
    ("more", None, &["python_history", "python_export"]),
    ("shell", None, &["shell_exec", "shell_wait", "shell_output"]),
    ("files", None, &["file_list", "file_read", "file_write", "file_delete"]),
];

/// Every tool as (name, group, language).
fn tools() -> impl Iterator<Item = (&'static str, &'static str, Option<Language>)> {
    TOOLS
        .iter()
        .flat_map(|(group, lang, names)| names.iter().map(move |name| (*name, *group, *lang)))
}

/// Every tool's name, exposed or not (the metrics' fixed set of tool
/// labels).
pub fn tool_names() -> impl Iterator<Item = &'static str> {
    tools().map(|(name, _, _)| name)
}

/// The language a tool's body serves when called by `tool`'s name
/// (Python for the tools of every language).
pub fn language_of(tool: &str) -> Language {
    tools()
        .find(|(name, _, _)| *name == tool)
        .and_then(|(_, _, lang)| lang)
        .unwrap_or(Language::Python)
}

/// Why `name` is not a tool of this server, and what to call instead:
/// `exposed` are the tools it lists.
pub fn unknown_tool<'a>(name: &str, exposed: impl Iterator<Item = &'a str>) -> String {
    let shown: String = name.chars().take(64).collect();
    if let Some((_, group, lang)) = tools().find(|(n, _, _)| *n == name) {
        let why = match lang {
            _ if name == "kernel_exec" => {
                "it exists only when --kernels names a kernel of another language than Python or R (e.g. bash)".to_string()
            }
            Some(Language::R) => format!(
                "R is not enabled here (--languages) or group '{group}' is left out (--tools)"
            ),
            _ => format!("its group '{group}' is left out by this server's --tools"),
        };
        return format!("tool '{shown}' is not enabled: {why}; the operator can enable it");
    }
    let exposed: Vec<&str> = exposed.collect();
    // Only a close name is offered (a third of its length at most, and
    // never more than 4 edits): 'nope_tool' is close to nothing.
    let most = (name.chars().count() / 3).clamp(1, 4);
    let closest = exposed
        .iter()
        .map(|t| (edit_distance(name, t), t))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, t)| format!("; did you mean '{t}'?"))
        .unwrap_or_default();
    format!(
        "no tool named '{shown}'{closest} This server has {} tools (tools/list names them).",
        exposed.len()
    )
}

/// Levenshtein distance over characters (names are short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().take(64).enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

/// The groups a user can pick; `all` is every group.
pub const GROUPS: &[&str] = &["python", "packages", "more", "shell", "files"];
const DEFAULT_GROUPS: &[&str] = &["python", "packages"];

#[derive(Debug, Clone)]
pub struct ToolGroups {
    groups: BTreeSet<&'static str>,
    languages: Vec<Language>,
}

impl ToolGroups {
    pub fn parse(items: &[String], languages: &[Language]) -> Result<Self, String> {
        let mut set = BTreeSet::new();
        for item in items.iter().flat_map(|s| s.split(',')).map(str::trim) {
            match item {
                "" => {}
                "all" => set.extend(GROUPS.iter().copied()),
                g => match GROUPS.iter().find(|known| **known == g) {
                    Some(known) => {
                        set.insert(*known);
                    }
                    None => {
                        return Err(format!(
                            "unknown tool group '{g}'; choose from {}, all",
                            GROUPS.join(", ")
                        ));
                    }
                },
            }
        }
        if set.is_empty() {
            set.extend(DEFAULT_GROUPS.iter().copied());
        }
        Ok(Self {
            groups: set,
            languages: languages.to_vec(),
        })
    }

    /// Whether `tool` is exposed; a tool missing from the table never is, so
    /// a new tool cannot appear without being placed in a group.
    pub fn exposes(&self, tool: &str) -> bool {
        tools().any(|(name, group, lang)| {
            name == tool
                && self.groups.contains(group)
                && lang.is_none_or(|l| self.languages.contains(&l))
        })
    }

    pub fn names(&self) -> Vec<String> {
        self.groups.iter().map(|g| g.to_string()).collect()
    }

    pub fn languages(&self) -> &[Language] {
        &self.languages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_tool_is_named_with_the_closest() {
        let exposed = ["python_exec", "python_wait", "python_sessions"];
        let text = unknown_tool("pyhton_exec", exposed.into_iter());
        assert!(
            text.contains("'pyhton_exec'") && text.contains("did you mean 'python_exec'"),
            "{text}"
        );
        // Nothing close: no guess (it proposed r_install for nope_tool).
        let text = unknown_tool("nope_tool", exposed.into_iter());
        assert!(!text.contains("did you mean"), "{text}");
        let text = unknown_tool("shell_exec", exposed.into_iter());
        assert!(
            text.contains("group 'shell'") && text.contains("--tools"),
            "{text}"
        );
    }

    #[test]
    fn groups_filter_tools() {
        let py = [Language::Python];
        let g = ToolGroups::parse(&["python".into()], &py).expect("parse");
        assert!(g.exposes("python_exec"));
        assert!(!g.exposes("shell_exec"));
        assert!(!g.exposes("python_install"));
        assert!(!g.exposes("no_such_tool"));
        assert!(!g.exposes("r_exec"));
        assert!(ToolGroups::parse(&["bogus".into()], &py).is_err());
        let default = ToolGroups::parse(&[], &py).expect("parse");
        assert!(default.exposes("python_install"));
        assert!(!default.exposes("file_read"));
        let all = ToolGroups::parse(&["all".into()], &Language::ALL).expect("parse");
        assert!(tools().all(|(t, _, _)| all.exposes(t)));
        let r_only = ToolGroups::parse(&[], &[Language::R]).expect("parse");
        assert!(r_only.exposes("r_exec") && r_only.exposes("r_install"));
        assert!(r_only.exposes("python_sessions") && !r_only.exposes("python_exec"));
    }
}
