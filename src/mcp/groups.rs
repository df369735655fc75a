//! --tools: which groups of tools the server exposes.

use std::collections::BTreeSet;

/// Every tool and its group. The default groups are what an agent needs when
/// its host already has shell and file tools (Claude Code, Codex, Cursor);
/// `more`, `shell` and `files` are for the rest.
const TOOLS: &[(&str, &str)] = &[
    ("python_exec", "python"),
    ("python_wait", "python"),
    ("python_output", "python"),
    ("python_sessions", "python"),
    ("python_inspect", "python"),
    ("python_install", "packages"),
    ("python_history", "more"),
    ("python_run_file", "more"),
    ("python_complete", "more"),
    ("python_namespace", "more"),
    ("shell_exec", "shell"),
    ("shell_wait", "shell"),
    ("shell_output", "shell"),
    ("file_list", "files"),
    ("file_read", "files"),
    ("file_write", "files"),
    ("file_delete", "files"),
];

/// The groups a user can pick; `all` is every group.
pub const GROUPS: &[&str] = &["python", "packages", "more", "shell", "files"];
const DEFAULT_GROUPS: &[&str] = &["python", "packages"];

#[derive(Debug, Clone)]
pub struct ToolGroups(BTreeSet<&'static str>);

impl ToolGroups {
    pub fn parse(items: &[String]) -> Result<Self, String> {
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
        Ok(Self(set))
    }

    /// Whether `tool` is exposed; a tool missing from the table never is, so
    /// a new tool cannot appear without being placed in a group.
    pub fn exposes(&self, tool: &str) -> bool {
        TOOLS
            .iter()
            .any(|(name, group)| *name == tool && self.0.contains(group))
    }

    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(|g| g.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_filter_tools() {
        let g = ToolGroups::parse(&["python".into()]).expect("parse");
        assert!(g.exposes("python_exec"));
        assert!(!g.exposes("shell_exec"));
        assert!(!g.exposes("python_install"));
        assert!(!g.exposes("no_such_tool"));
        assert!(ToolGroups::parse(&["bogus".into()]).is_err());
        let default = ToolGroups::parse(&[]).expect("parse");
        assert!(default.exposes("python_install"));
        assert!(!default.exposes("file_read"));
        let all = ToolGroups::parse(&["all".into()]).expect("parse");
        assert!(TOOLS.iter().all(|(t, _)| all.exposes(t)));
    }
}
