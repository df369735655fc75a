//! The languages a session can run, and the names of their tools (errors
//! and hints name the tool that fits the session's language).

use serde::{Deserialize, Serialize};

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    #[default]
    Python,
    R,
}

impl Language {
    pub const ALL: [Language; 2] = [Language::Python, Language::R];

    /// As people write it: "Python", "R".
    pub fn title(self) -> &'static str {
        match self {
            Language::Python => "Python",
            Language::R => "R",
        }
    }

    /// "a Python", "an R".
    pub fn with_article(self) -> &'static str {
        match self {
            Language::Python => "a Python",
            Language::R => "an R",
        }
    }

    /// As metrics label it.
    pub fn metric(self) -> crate::metrics::LanguageLabel {
        match self {
            Language::Python => crate::metrics::LanguageLabel::Python,
            Language::R => crate::metrics::LanguageLabel::R,
        }
    }

    /// As `--languages` and tool names spell it.
    pub fn key(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::R => "r",
        }
    }

    pub fn parse(s: &str) -> Option<Language> {
        Language::ALL.into_iter().find(|l| l.key() == s)
    }

    pub fn exec_tool(self) -> &'static str {
        match self {
            Language::Python => "python_exec",
            Language::R => "r_exec",
        }
    }

    pub fn wait_tool(self) -> &'static str {
        match self {
            Language::Python => "python_wait",
            Language::R => "r_wait",
        }
    }

    pub fn output_tool(self) -> &'static str {
        match self {
            Language::Python => "python_output",
            Language::R => "r_output",
        }
    }

    pub fn inspect_tool(self) -> &'static str {
        match self {
            Language::Python => "python_inspect",
            Language::R => "r_inspect",
        }
    }

    /// What a pending input request is called in this language.
    pub fn input_call(self) -> &'static str {
        match self {
            Language::Python => "input()",
            Language::R => "readline()",
        }
    }
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.title())
    }
}
