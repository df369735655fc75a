//! One line where agents stumble, only when it happens: a package manager
//! run from a cell, and a cell that failed to reach the network when cells
//! have none by design (issue 45 §3). R's install.packages() says the same
//! itself (worker/r/console.R).

use super::report::{CellReport, CellStatus};
use crate::worker::Language;

/// Words of a package manager run from code: `pip install`, `python -m pip
/// install`, `uv pip install`, `conda install`, `mamba install`.
fn runs_a_package_manager(code: &str) -> bool {
    let lower = code.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    words.windows(2).any(|w| {
        matches!(
            w[0],
            "pip" | "pip3" | "conda" | "mamba" | "micromamba" | "poetry" | "uv"
        ) && matches!(w[1], "install" | "add")
    }) || words
        .windows(3)
        .any(|w| w[0] == "uv" && w[1] == "pip" && w[2] == "install")
}

/// What a failed network access leaves in a traceback or in output.
const NETWORK_FAILURES: &[&str] = &[
    "temporary failure in name resolution",
    "name or service not known",
    "nodename nor servname provided",
    "failed to resolve",
    "network is unreachable",
    "no route to host",
    "newconnectionerror",
    "max retries exceeded with url",
    "urlopen error",
    "could not resolve host",
    "gaierror",
];

fn looks_offline(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    NETWORK_FAILURES.iter().any(|w| lower.contains(w))
}

/// What the agent should hear, if anything: the result's error and output
/// after `code` ran, with `offline` when cells have no network.
pub(super) fn for_cell(code: &str, report: &CellReport, offline: bool) -> Option<String> {
    if report.language != Language::Python {
        return None;
    }
    // Cheap first: most cells name no package manager and raise nothing.
    if runs_a_package_manager(code)
        && (report.status == CellStatus::Error || looks_failed(&report.output.combined))
    {
        return Some(
            "Packages go in with python_install {\"packages\": [...]}, not from a cell: it installs into this session's venv through the allowed indexes, and they import at once.".to_string(),
        );
    }
    let error = report.error.as_ref()?;
    if offline
        && (looks_offline(&error.message)
            || looks_offline(&error.traceback)
            || looks_offline(&report.output.combined))
    {
        return Some(
            "Cells have no network by design; the operator can give them some hosts (--network domains with --allow-domain) or every host (--network on). Packages come in with python_install.".to_string(),
        );
    }
    None
}

/// A package manager that failed says so in its output even when the cell
/// itself ended ok (os.system, subprocess.run without check).
fn looks_failed(output: &str) -> bool {
    let lower = output.to_ascii_lowercase();
    [
        "externally-managed-environment",
        "error: could not install",
        "no matching distribution",
        "read-only file system",
        "permission denied",
        "network is unreachable",
        "temporary failure in name resolution",
        "could not find a version",
    ]
    .iter()
    .any(|w| lower.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_managers_are_recognised() {
        for code in [
            "!pip install pandas",
            "import os; os.system('pip install requests')",
            "subprocess.run(['python', '-m', 'pip', 'install', 'x'])",
            "subprocess.run('uv pip install x', shell=True)",
            "os.system('conda install numpy')",
        ] {
            assert!(runs_a_package_manager(code), "{code}");
        }
        for code in ["print('pipeline')", "import pip_tools", "x = 'install'"] {
            assert!(!runs_a_package_manager(code), "{code}");
        }
    }

    #[test]
    fn network_failures_are_recognised() {
        assert!(looks_offline(
            "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>"
        ));
        assert!(looks_offline(
            "socket.gaierror: [Errno -2] Name or service not known"
        ));
        assert!(!looks_offline("ValueError: invalid literal"));
    }
}
