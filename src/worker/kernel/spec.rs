//! The installed Jupyter kernels the operator named (--kernels): found once
//! at start in the Jupyter data directories, each one's kernel.json read
//! and checked against the map of places. Nothing sessions can write is
//! read or run: a kernelspec or a kernel program in such a place is refused.
//! Never runs anything (jupyter-zmq-client's own directory helpers may ask
//! `jupyter --paths`, a program found on PATH).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::sandbox::places::Places;
use crate::worker::Language;

/// kernel.json is a few hundred bytes; anything past this is not one.
const MAX_KERNEL_JSON_BYTES: u64 = 64 * 1024;

/// One installed kernel sessions may be created on.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelSpec {
    /// Its directory's name, the name sessions are created with.
    pub name: String,
    pub display_name: String,
    pub language: Language,
    /// The kernel's own language when it is neither Python nor R (bash,
    /// julia, ...): its sessions run cells through kernel_exec and are
    /// followed by the Python tools, so `language` is Python for routing.
    pub other_language: Option<String>,
    /// The command line, argv[0] resolved to an absolute path;
    /// `{connection_file}` is replaced at each launch.
    pub argv: Vec<String>,
    /// The kernelspec directory (kernel.json's).
    pub dir: PathBuf,
    /// Variables kernel.json sets for the kernel.
    pub env: Vec<(String, String)>,
    /// Its kernel.json says `interrupt_mode: message`: a cell is
    /// interrupted by an `interrupt_request` on the control socket, not
    /// by SIGINT (a kernel that cannot take signals, or wants them its way).
    pub interrupt_by_message: bool,
}

impl KernelSpec {
    /// The kernel's program (argv[0], resolved).
    pub fn program(&self) -> &Path {
        Path::new(self.argv.first().map(String::as_str).unwrap_or_default())
    }
}

#[derive(Deserialize)]
struct KernelJson {
    argv: Vec<String>,
    #[serde(default)]
    display_name: String,
    #[serde(default)]
    language: String,
    #[serde(default)]
    interrupt_mode: Option<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
}

/// The Jupyter data directories, in Jupyter's order: JUPYTER_PATH's
/// entries, the user's, the environment of `python` (`{sys.prefix}/share/
/// jupyter`, its own prefix and its real one's), then the system's.
pub fn data_dirs(jupyter_path: Option<&std::ffi::OsStr>, python: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = jupyter_path
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(data).join("jupyter"));
    } else if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        dirs.push(PathBuf::from(home).join(".local/share/jupyter"));
    }
    let prefix = |p: &Path| p.parent().and_then(Path::parent).map(Path::to_path_buf);
    dirs.extend(prefix(python).map(|p| p.join("share/jupyter")));
    if let Ok(real) = python.canonicalize() {
        dirs.extend(prefix(&real).map(|p| p.join("share/jupyter")));
    }
    dirs.push(PathBuf::from("/usr/local/share/jupyter"));
    dirs.push(PathBuf::from("/usr/share/jupyter"));
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let fresh = d.is_absolute() && !seen.contains(d);
        seen.push(d.clone());
        fresh
    });
    dirs
}

/// The kernels named by `names`, each the first found in `data_dirs`;
/// refused when one is missing (with those found), lies where sessions
/// can write, runs a program from there, names no language, or has an
/// `interrupt_mode` Jupyter does not know.
pub fn discover(
    names: &[String],
    data_dirs: &[PathBuf],
    places: &Places,
) -> anyhow::Result<Vec<KernelSpec>> {
    let mut out = Vec::new();
    for name in names {
        let Some(dir) = data_dirs
            .iter()
            .map(|d| d.join("kernels").join(name))
            .find(|d| d.join("kernel.json").is_file())
        else {
            anyhow::bail!(
                "--kernels: no kernel '{name}' is installed; found: {}. Install one (e.g. `python -m ipykernel install --prefix PREFIX`) or set JUPYTER_PATH to a directory holding kernels/{name}",
                found_names(data_dirs).join(", ")
            );
        };
        out.push(read(name, &dir, places)?);
    }
    Ok(out)
}

/// The names of every kernel installed in `data_dirs` ("none" if none).
fn found_names(data_dirs: &[PathBuf]) -> Vec<String> {
    let mut names: Vec<String> = data_dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d.join("kernels")).ok())
        .flatten()
        .flatten()
        .filter(|e| e.path().join("kernel.json").is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .take(100)
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        names.push("none".into());
    }
    names
}

fn read(name: &str, dir: &Path, places: &Places) -> anyhow::Result<KernelSpec> {
    let file = dir.join("kernel.json");
    if let Some(place) = places.writable_holding(&file) {
        anyhow::bail!(
            "--kernels: the kernelspec of '{name}' ({}) lies in {}, which sessions can write: they could change the program the server starts. Install the kernel outside the workspace and the --allow-write paths, or point JUPYTER_PATH elsewhere",
            dir.display(),
            place.at.given.display()
        );
    }
    let json: KernelJson = std::fs::File::open(&file)
        .and_then(|f| {
            use std::io::Read;
            let mut text = Vec::new();
            f.take(MAX_KERNEL_JSON_BYTES).read_to_end(&mut text)?;
            serde_json::from_slice(&text).map_err(std::io::Error::other)
        })
        .map_err(|e| anyhow::anyhow!("--kernels: cannot read {}: {e}", file.display()))?;
    let (language, other_language) = match json.language.to_ascii_lowercase().as_str() {
        "python" => (Language::Python, None),
        // IRkernel says "R"; its sessions answer through the r_ tools.
        "r" => (Language::R, None),
        "" => anyhow::bail!(
            "--kernels: kernel '{name}' names no language in its kernel.json; add \"language\" there"
        ),
        other => (Language::Python, Some(other.chars().take(32).collect())),
    };
    // Caseless, as jupyter_client reads it.
    let mode = json.interrupt_mode.as_deref().map(str::to_ascii_lowercase);
    let interrupt_by_message = match mode.as_deref() {
        None | Some("signal") => false,
        Some("message") => true,
        Some(other) => anyhow::bail!(
            "--kernels: kernel '{name}' has interrupt_mode '{}' in its kernel.json; Jupyter knows \"signal\" and \"message\" only: fix its kernel.json",
            other.chars().take(32).collect::<String>()
        ),
    };
    let mut argv = json.argv;
    let Some(first) = argv.first_mut() else {
        anyhow::bail!("--kernels: {} has an empty argv", file.display());
    };
    let program = resolve_program(first, dir, places).ok_or_else(|| {
        anyhow::anyhow!(
            "--kernels: the program '{first}' of kernel '{name}' was not found, or lies where sessions can write; install the kernel with an interpreter outside the workspace"
        )
    })?;
    *first = program.display().to_string();
    Ok(KernelSpec {
        name: name.to_string(),
        display_name: json.display_name,
        language,
        other_language,
        argv,
        dir: dir.to_path_buf(),
        env: json.env.into_iter().collect(),
        interrupt_by_message,
    })
}

/// argv[0] as an absolute path: as given when absolute; a bare name first
/// beside the kernelspec's own installation (`{prefix}/bin`, as
/// `ipykernel install --prefix` means `python`), then on PATH. None when
/// missing or writable by sessions.
fn resolve_program(first: &str, dir: &Path, places: &Places) -> Option<PathBuf> {
    let given = Path::new(first);
    let writable = places.writable();
    let found = if given.is_absolute() {
        Some(given.to_path_buf())
    } else if given.components().count() == 1 {
        // <prefix>/share/jupyter/kernels/<name>
        let beside = dir
            .ancestors()
            .nth(4)
            .map(|prefix| prefix.join("bin").join(given));
        beside
            .filter(|p| crate::executables::is_executable(p))
            .or_else(|| writable.find_on_path(first))
    } else {
        None
    };
    found.filter(|p| crate::executables::is_executable(p) && places.writable_holding(p).is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn install(data: &Path, name: &str, json: &str) {
        let dir = data.join("kernels").join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("kernel.json"), json).expect("write");
    }

    #[test]
    fn kernels_are_found_in_order_and_refused_where_sessions_write() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = root.path().canonicalize().expect("canonical");
        let (ws, first, second) = (base.join("ws"), base.join("a"), base.join("b"));
        std::fs::create_dir_all(&ws).expect("mkdir");
        let sh = "/bin/sh";
        install(
            &first,
            "py",
            &format!(r#"{{"argv":["{sh}","{{connection_file}}"],"language":"python"}}"#),
        );
        install(
            &second,
            "py",
            r#"{"argv":["/nonexistent"],"language":"python"}"#,
        );
        install(
            &second,
            "ir",
            &format!(r#"{{"argv":["{sh}"],"language":"R"}}"#),
        );
        install(
            &second,
            "bash",
            &format!(r#"{{"argv":["{sh}"],"language":"bash"}}"#),
        );
        let places = Places::new(&ws);
        let dirs = vec![first.clone(), second.clone()];
        let found = discover(&["py".into()], &dirs, &places).expect("found");
        assert_eq!(found[0].dir, first.join("kernels/py"));
        assert_eq!(found[0].argv, [sh, "{connection_file}"]);

        let err = discover(&["nope".into()], &dirs, &places).expect_err("missing");
        assert!(err.to_string().contains("found: bash, ir, py"), "{err}");
        let found = discover(&["ir".into()], &dirs, &places).expect("R");
        assert_eq!(found[0].language, Language::R);
        install(
            &second,
            "sh",
            &format!(r#"{{"argv":["{sh}"],"language":"Bash"}}"#),
        );
        let found = discover(&["sh".into()], &dirs, &places).expect("bash");
        assert_eq!(found[0].other_language.as_deref(), Some("bash"));
        assert!(!found[0].interrupt_by_message);
        install(
            &second,
            "msg",
            &format!(r#"{{"argv":["{sh}"],"language":"python","interrupt_mode":"Message"}}"#),
        );
        let found = discover(&["msg".into()], &dirs, &places).expect("by message");
        assert!(found[0].interrupt_by_message);
        install(
            &second,
            "odd",
            &format!(
                r#"{{"argv":["{sh}"],"language":"python","interrupt_mode":"carrier pigeon"}}"#
            ),
        );
        let err = discover(&["odd".into()], &dirs, &places).expect_err("unknown mode");
        assert!(
            err.to_string().contains("\"signal\" and \"message\" only"),
            "{err}"
        );

        install(
            &ws,
            "py",
            &format!(r#"{{"argv":["{sh}"],"language":"python"}}"#),
        );
        let inside = vec![ws.clone(), first];
        let err = discover(&["py".into()], &inside, &places).expect_err("in the workspace");
        assert!(
            err.to_string().contains("which sessions can write"),
            "{err}"
        );
    }

    #[test]
    fn a_bare_program_is_the_one_beside_the_kernelspec() {
        let root = tempfile::tempdir().expect("tempdir");
        let prefix = root.path().canonicalize().expect("canonical");
        let data = prefix.join("share/jupyter");
        install(
            &data,
            "py",
            r#"{"argv":["python","-m","k"],"language":"python"}"#,
        );
        std::fs::create_dir_all(prefix.join("bin")).expect("mkdir");
        std::os::unix::fs::symlink("/bin/sh", prefix.join("bin/python")).expect("ln");
        let places = Places::new(&prefix.join("ws"));
        let found = discover(&["py".into()], &[data], &places).expect("found");
        assert_eq!(found[0].program(), prefix.join("bin/python"));
    }
}
