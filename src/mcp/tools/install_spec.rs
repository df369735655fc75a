//! What a python_install spec installs, decided from its parsed form (PEP
//! 508 for requirements, a URL or a path otherwise), never from patterns:
//! a package from the index (a wheel, as the installers are told), a
//! wheel by URL, a local wheel (copied by the server before the install,
//! so it cannot be swapped), or something an installer would build (a
//! project directory, an sdist, a repository), which runs a build backend
//! and is refused unless the operator allowed source builds.

use std::path::{Path, PathBuf};
use std::str::FromStr;

/// What a spec installs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Install {
    /// A requirement resolved from the index.
    Index,
    /// A wheel by http(s) URL.
    RemoteWheel,
    /// A wheel file in the workspace, relative to it.
    LocalWheel(String),
    /// A build would run; why, for the refusal.
    Builds(&'static str),
}

const VCS: [&str; 4] = ["git+", "hg+", "svn+", "bzr+"];

/// Decides what `spec` installs; `workdir` is where the installer runs
/// (a bare name that is also a directory there is a project to pip).
pub fn classify(spec: &str, workdir: &Path) -> Install {
    let spec = spec.trim();
    if std::fs::symlink_metadata(workdir.join(spec)).is_ok() && !spec.is_empty() {
        return local(spec, workdir);
    }
    match pep508_rs::Requirement::<pep508_rs::VerbatimUrl>::from_str(spec) {
        Ok(req) => match req.version_or_url {
            None | Some(pep508_rs::VersionOrUrl::VersionSpecifier(_)) => Install::Index,
            Some(pep508_rs::VersionOrUrl::Url(url)) => by_url(url.raw(), workdir),
        },
        Err(_) => {
            let lower = spec.to_ascii_lowercase();
            if VCS.iter().any(|v| lower.starts_with(v)) {
                return Install::Builds("a version-control URL");
            }
            if lower.contains("://") || lower.starts_with("file:") {
                return match url::Url::parse(spec) {
                    Ok(url) => by_url(&url, workdir),
                    Err(_) => Install::Builds("a URL that cannot be parsed"),
                };
            }
            local(spec, workdir)
        }
    }
}

/// A direct reference: a wheel over http(s), a local path, or a build.
fn by_url(url: &url::Url, workdir: &Path) -> Install {
    match url.scheme() {
        "http" | "https" if is_wheel_name(url.path()) => Install::RemoteWheel,
        "http" | "https" => Install::Builds("an archive URL that is not a wheel (an sdist)"),
        "file" => match url.to_file_path() {
            Ok(path) => local(&path.display().to_string(), workdir),
            Err(()) => Install::Builds("a file: URL that names no local path"),
        },
        _ => Install::Builds("a version-control or other non-wheel URL"),
    }
}

/// A local path: a wheel file inside the workspace, or a build.
fn local(given: &str, workdir: &Path) -> Install {
    let path = Path::new(given);
    let rel: PathBuf = if path.is_absolute() {
        match path.strip_prefix(workdir) {
            Ok(r) => r.to_path_buf(),
            Err(_) => return Install::Builds("a local path outside the workspace"),
        }
    } else {
        path.to_path_buf()
    };
    if !is_wheel_name(&rel.to_string_lossy()) {
        return Install::Builds("a local project directory or source archive");
    }
    // A directory named like a wheel is a project pip would build; the
    // copy made later checks again that it is a regular file.
    match std::fs::symlink_metadata(workdir.join(&rel)) {
        Ok(m) if m.is_dir() => Install::Builds("a directory named like a wheel"),
        _ => Install::LocalWheel(rel.display().to_string()),
    }
}

fn is_wheel_name(path: &str) -> bool {
    path.to_ascii_lowercase().ends_with(".whl")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_of_spec_is_decided_from_its_parse() {
        let ws = tempfile::tempdir().expect("tempdir");
        let dir = ws.path();
        std::fs::create_dir(dir.join("proj1")).expect("mkdir");
        std::fs::create_dir(dir.join("six")).expect("mkdir");
        std::fs::create_dir(dir.join("dir.whl")).expect("mkdir");
        std::fs::write(dir.join("x-1.0-py3-none-any.whl"), b"PK").expect("write");
        let abs_wheel = format!("{}/x-1.0-py3-none-any.whl", dir.display());
        let file_url = format!("file://{}/proj1", dir.display());
        let named_file = format!("proj @ file://{}/proj1", dir.display());
        let builds = [
            "file:proj1",
            file_url.as_str(),
            named_file.as_str(),
            "./proj1",
            "proj1",
            "six",
            "./dir.whl",
            "dir.whl",
            "/abs/proj",
            "/elsewhere/x-1.0-py3-none-any.whl",
            "dist/x-1.0.tar.gz",
            "https://example.com/x-1.0.tar.gz",
            "docopt @ https://files.example/docopt-0.6.2.tar.gz",
            "git+https://github.com/a/b",
            "b @ git+https://github.com/a/b",
            "svn+https://example.com/repo",
            "ssh://git@example.com/repo",
        ];
        for spec in builds {
            assert!(
                matches!(classify(spec, dir), Install::Builds(_)),
                "{spec}: {:?}",
                classify(spec, dir)
            );
        }
        for spec in [
            "numpy",
            "numpy>=2",
            "pandas[excel]==2.2",
            "x ; python_version > '3'",
        ] {
            assert_eq!(classify(spec, dir), Install::Index, "{spec}");
        }
        for spec in [
            "https://files.example/x-1.0-py3-none-any.whl#sha256=ab",
            "x @ https://files.example/x-1.0-py3-none-any.WHL",
        ] {
            assert_eq!(classify(spec, dir), Install::RemoteWheel, "{spec}");
        }
        for spec in [
            "./x-1.0-py3-none-any.whl",
            "x-1.0-py3-none-any.whl",
            abs_wheel.as_str(),
        ] {
            assert!(
                matches!(classify(spec, dir), Install::LocalWheel(_)),
                "{spec}: {:?}",
                classify(spec, dir)
            );
        }
    }
}
