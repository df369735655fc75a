//! --tools: which groups of tools the server exposes.

use std::collections::BTreeSet;

/// The groups a user can pick; `all` is every group.
pub const GROUPS: &[&str] = &["python", "shell", "packages", "files"];

#[derive(Debug, Clone)]
pub struct ToolGroups(BTreeSet<String>);

impl ToolGroups {
    pub fn parse(items: &[String]) -> Result<Self, String> {
        let mut set = BTreeSet::new();
        for item in items.iter().flat_map(|s| s.split(',')).map(str::trim) {
            match item {
                "" => {}
                "all" => set.extend(GROUPS.iter().map(|g| g.to_string())),
                g if GROUPS.contains(&g) => {
                    set.insert(g.to_string());
                }
                other => {
                    return Err(format!(
                        "unknown tool group '{other}'; choose from {}, all",
                        GROUPS.join(", ")
                    ));
                }
            }
        }
        if set.is_empty() {
            set.extend(GROUPS.iter().map(|g| g.to_string()));
        }
        Ok(Self(set))
    }

    /// The group a tool belongs to (server_status is always exposed).
    fn group_of(tool: &str) -> Option<&'static str> {
        match tool {
            "server_status" => None,
            "python_install" => Some("packages"),
            t if t.starts_with("python_") => Some("python"),
            t if t.starts_with("shell_") => Some("shell"),
            t if t.starts_with("file_") => Some("files"),
            _ => None,
        }
    }

    pub fn exposes(&self, tool: &str) -> bool {
        Self::group_of(tool).is_none_or(|g| self.0.contains(g))
    }

    pub fn names(&self) -> Vec<String> {
        self.0.iter().cloned().collect()
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
        assert!(g.exposes("server_status"));
        assert!(ToolGroups::parse(&["bogus".into()]).is_err());
        assert!(ToolGroups::parse(&[]).expect("parse").exposes("file_read"));
    }
}
