//! Ready-made environments (`--preinstall`, `--requirements`,
//! `--preimport`), checked once at start: every package a PEP 508
//! requirement resolved from the index (never a URL, a path or an installer
//! option: the index and its rules are the operator's, as for
//! python_install), a requirements file's lines requirements, comments or
//! blank, and every module a dotted name (they reach code the driver runs).
//! Nothing here installs or imports anything.

use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use super::Flags;

/// Largest requirements file read.
pub const MAX_REQUIREMENTS_BYTES: u64 = 256 * 1024;
/// Most packages preinstalled (flag and file together).
pub const MAX_PREINSTALL: usize = 500;
/// Most modules preimported.
pub const MAX_PREIMPORT: usize = 64;
/// Most characters of a refused requirement quoted back.
const MAX_SHOWN_CHARS: usize = 80;
/// Longest module name preimported.
const MAX_MODULE_CHARS: usize = 200;

/// What every new environment gets before its first cell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadyMade {
    /// Requirements installed once per kept venv, each once, in order.
    pub preinstall: Vec<String>,
    /// Modules imported by every Python interpreter before its first cell.
    pub preimport: Vec<String>,
}

impl ReadyMade {
    /// From the flags; a relative `--requirements` is read from `workdir`
    /// (the project's, whatever directory the client started ferrepl in).
    pub fn from_flags(flags: &Flags, workdir: &Path) -> anyhow::Result<Self> {
        let mut preinstall = Vec::new();
        for spec in flags.preinstall.iter().map(|s| s.trim()) {
            if spec.is_empty() {
                continue;
            }
            preinstall.push(requirement(spec).map_err(|e| {
                anyhow::anyhow!(
                    "--preinstall {e} (commas separate packages here: a version range with a comma goes in --requirements)"
                )
            })?);
        }
        if let Some(file) = &flags.requirements {
            preinstall.extend(read_requirements(&workdir.join(file))?);
        }
        let mut seen = std::collections::HashSet::new();
        preinstall.retain(|s| seen.insert(s.clone()));
        if preinstall.len() > MAX_PREINSTALL {
            anyhow::bail!(
                "--preinstall and --requirements name {} packages, more than {MAX_PREINSTALL}; install the rest with python_install",
                preinstall.len()
            );
        }
        let mut preimport = Vec::new();
        for name in flags.preimport.iter().map(|s| s.trim()) {
            if name.is_empty() {
                continue;
            }
            if !is_module_name(name) {
                anyhow::bail!(
                    "--preimport {name:?} is not a module name: give dotted Python identifiers only (e.g. pandas,numpy.linalg), comma separated"
                );
            }
            if !preimport.iter().any(|m| m == name) {
                preimport.push(name.to_string());
            }
        }
        if preimport.len() > MAX_PREIMPORT {
            anyhow::bail!(
                "--preimport names {} modules, more than {MAX_PREIMPORT}; keep the few every session uses",
                preimport.len()
            );
        }
        Ok(Self {
            preinstall,
            preimport,
        })
    }
}

/// A dotted name of ASCII identifiers (`pkg.sub`): nothing a driver could
/// run as code.
pub fn is_module_name(name: &str) -> bool {
    name.len() <= MAX_MODULE_CHARS
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// `spec` checked: a PEP 508 requirement from the index (its canonical
/// text), or why not.
fn requirement(spec: &str) -> Result<String, String> {
    // Quoted in refusals: a line of a file that is no requirements file
    // (a wrong path) is shown only in part.
    let shown: String = spec.chars().take(MAX_SHOWN_CHARS).collect();
    let shown = if shown.len() < spec.len() {
        format!("{shown}...")
    } else {
        shown
    };
    if spec.starts_with('-') {
        return Err(format!(
            "{shown:?} is an installer option; name packages only (the index comes from the operator's pip or uv configuration)"
        ));
    }
    let req = pep508_rs::Requirement::<pep508_rs::VerbatimUrl>::from_str(spec).map_err(|e| {
        // The parser's first line says why; the next ones echo the input.
        let why: String = e
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .take(MAX_SHOWN_CHARS * 2)
            .collect();
        format!("{shown:?} is not a requirement ({why}); write name[extras]>=version")
    })?;
    if let Some(pep508_rs::VersionOrUrl::Url(_)) = req.version_or_url {
        return Err(format!(
            "{shown:?} names a URL; preinstalls come from the index by name (install a wheel by URL or path with python_install)"
        ));
    }
    Ok(spec.to_string())
}

/// The requirements of `file`: a regular file of at most
/// [`MAX_REQUIREMENTS_BYTES`], whose lines are requirements, comments or
/// blank (a `\` at a line's end continues it); anything else is refused
/// with its line number.
fn read_requirements(file: &Path) -> anyhow::Result<Vec<String>> {
    let shown = file.display();
    let text = read_bounded(file).map_err(|e| anyhow::anyhow!("--requirements {shown}: {e}"))?;
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut first_line = 0;
    for (index, raw) in text.lines().enumerate() {
        if pending.is_empty() {
            first_line = index + 1;
        }
        let line = strip_comment(raw);
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let whole = std::mem::take(&mut pending);
        let whole = whole.trim();
        if whole.is_empty() {
            continue;
        }
        if whole.starts_with('-') || whole.contains(" --") {
            let option = whole
                .split_whitespace()
                .find(|w| w.starts_with('-'))
                .unwrap_or(whole);
            anyhow::bail!(
                "--requirements {shown}, line {first_line}: {option} is an installer option, and only requirement lines are read; \
the index and its rules come from the operator's pip or uv configuration (PIP_INDEX_URL, pip.conf), -r/-c files are not followed and -e/paths are not built: \
list the packages themselves, one per line"
            );
        }
        out.push(
            requirement(whole)
                .map_err(|e| anyhow::anyhow!("--requirements {shown}, line {first_line}: {e}"))?,
        );
    }
    if !pending.trim().is_empty() {
        anyhow::bail!(
            "--requirements {shown}, line {first_line}: the file ends inside a continued line (a trailing \\); finish the requirement"
        );
    }
    Ok(out)
}

/// A line without its comment (`#` at its start or after a space, as pip
/// reads it: `pkg @ https://h/x#egg` keeps its fragment).
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

/// The file's text: opened without blocking (a FIFO never stalls the
/// start), a regular file only, at most [`MAX_REQUIREMENTS_BYTES`].
fn read_bounded(file: &Path) -> Result<String, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(file)
        .map_err(|e| format!("cannot open it ({e}); give the path of a requirements file"))?;
    let meta = opened.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file; give the path of a requirements file".into());
    }
    if meta.len() > MAX_REQUIREMENTS_BYTES {
        return Err(format!(
            "{} bytes, more than {MAX_REQUIREMENTS_BYTES}; list fewer packages",
            meta.len()
        ));
    }
    let mut text = String::new();
    opened
        .take(MAX_REQUIREMENTS_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read it as text ({e})"))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(f.path(), text).expect("write");
        f
    }

    #[test]
    fn requirement_lines_comments_and_blanks_are_read() {
        let f = file(
            "# tools\nsix>=1.0  # inline\n\nrequests[socks] ; python_version >= \"3.8\"\nnumpy==2.*\\\n  \n",
        );
        let specs = read_requirements(f.path()).expect("read");
        assert_eq!(
            specs,
            vec![
                "six>=1.0",
                "requests[socks] ; python_version >= \"3.8\"",
                "numpy==2.*"
            ]
        );
    }

    #[test]
    fn option_lines_are_refused_with_their_line() {
        for (text, line, option) in [
            (
                "six\n--index-url https://evil.example/simple\n",
                2,
                "--index-url",
            ),
            ("-e .\n", 1, "-e"),
            ("six\n\n-r other.txt\n", 3, "-r"),
            ("-c constraints.txt\n", 1, "-c"),
            (
                "six\n--extra-index-url https://x.example\n",
                2,
                "--extra-index-url",
            ),
            ("-f /tmp/wheels\n", 1, "-f"),
            ("six --hash=sha256:00\n", 1, "--hash=sha256:00"),
        ] {
            let err = read_requirements(file(text).path())
                .expect_err(text)
                .to_string();
            assert!(
                err.contains(&format!("line {line}: {option} is an installer option")),
                "{text:?}: {err}"
            );
        }
    }

    #[test]
    fn urls_paths_and_nonsense_are_refused() {
        for bad in [
            "pkg @ https://example.com/pkg-1.0-py3-none-any.whl",
            "pkg @ file:///tmp/x",
            "./local",
            "six; import os",
            "-U",
        ] {
            assert!(requirement(bad).is_err(), "{bad} should be refused");
        }
        assert!(requirement("six>=1,<2").is_ok());
        let long = format!("root:{}:x", "$6$".repeat(100));
        let refused = requirement(&long).expect_err("not a requirement");
        assert!(refused.len() < 400 && refused.contains("..."), "{refused}");
    }

    #[test]
    fn a_fifo_a_directory_and_a_huge_file_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert!(read_requirements(&fifo).is_err());
        assert!(read_requirements(dir.path()).is_err());
        let big = file(&"six\n".repeat(MAX_REQUIREMENTS_BYTES as usize));
        let err = read_requirements(big.path())
            .expect_err("too big")
            .to_string();
        assert!(err.contains("more than"), "{err}");
    }

    #[test]
    fn the_bound_docs_state_is_the_codes() {
        let security = include_str!("../../docs/security.md");
        assert_eq!(MAX_REQUIREMENTS_BYTES, 256 * 1024);
        let prose = security.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(prose.contains("a regular file of at most 256 KiB"));
    }

    #[test]
    fn module_names_are_dotted_identifiers() {
        for good in ["pandas", "numpy.linalg", "_private", "a1.b_2"] {
            assert!(is_module_name(good), "{good}");
        }
        for bad in [
            "os;import x",
            "",
            "a..b",
            "1abc",
            "a b",
            "a.",
            "é",
            "os\nimport x",
        ] {
            assert!(!is_module_name(bad), "{bad:?}");
        }
    }
}
