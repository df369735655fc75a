//! The map of places: for every place the server decides about, whether
//! sessions may read it, write it, or must never see it, and which are the
//! server's own; built once at start (by `startup`, from the operator's
//! settings and what start-up discovers) and asked by every check of a path:
//! start-up's refusals (at start, on SIGHUP and in `doctor`), what the
//! server trusts or runs (`Writable`), the view's binds. Protected places
//! (written only from the host) are `protected.rs`'s list, held here too.
//!
//! One rule resolves a path: [`resolve`], the path as named (made absolute,
//! `.` and `..` folded) and as the kernel would reach it (links followed as
//! far as it exists, the rest appended). A path lies in a place when either
//! form lies under either form of the place: a link in the workspace to a
//! file outside is one a session can replace, and a place reached through
//! a link is the same place.

use std::path::{Path, PathBuf};

use super::paths::{Writable, normalize};
use super::protected::Protected;

/// A path as named and as reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Absolute, nothing folded: `w/sub/../x` lies in `w` as named, since
    /// whoever writes `w` can make `sub` a link that `..` leaves elsewhere.
    pub named: PathBuf,
    /// Absolute, `.` and `..` folded, no link followed (for messages and
    /// places named by the operator).
    pub given: PathBuf,
    /// As the kernel reaches it now: links followed as far as the path
    /// exists, the rest appended.
    pub real: PathBuf,
}

/// The one rule: `path` (relative to `base`) as named and as reached.
pub fn resolve(path: &Path, base: &Path) -> Resolved {
    let named = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    let given = normalize(path, base);
    let real = reached(&named);
    Resolved { named, given, real }
}

/// `path` with its links resolved as far as it exists, the rest appended.
fn reached(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = at.canonicalize() {
            return missing.iter().rev().fold(real, |p, name| p.join(name));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_os_string());
                at = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

impl Resolved {
    /// It lies in `place` (or is it), under any of their names.
    pub fn within(&self, place: &Resolved) -> bool {
        [&self.named, &self.given, &self.real]
            .into_iter()
            .any(|p| p.starts_with(&place.given) || p.starts_with(&place.real))
    }

    /// It is `place`, under any of their names.
    pub fn is(&self, place: &Resolved) -> bool {
        [&self.given, &self.real]
            .into_iter()
            .any(|p| *p == place.given || *p == place.real)
    }
}

/// A place sessions reach, and what named it (a flag, for messages).
#[derive(Debug, Clone)]
pub struct Place {
    pub what: &'static str,
    pub at: Resolved,
}

/// The map. Built by `startup` from the settings (`named`, before anything
/// starts) and extended with what start-up discovers (venvs, the
/// interpreter's directories); read by every check.
#[derive(Debug, Clone)]
pub struct Places {
    pub workspace: Resolved,
    /// What sessions may write: the workspace first, then --allow-write,
    /// venvs they may write, the kept venvs. Nothing there is trusted or
    /// run by the server outside the sandbox.
    writable: Vec<Place>,
    /// What the operator names for sessions to read beyond the system's
    /// allow-list (`view.rs`): --allow-read, the user's venv.
    readable: Vec<Place>,
    /// Places no session may see and no workspace or allowed path may
    /// hold: homes, the host's temporary and runtime directories, container
    /// engines' state, ferrepl's runtime directories, the stores.
    hidden: Vec<Resolved>,
    /// ferrepl's own files and directories: never inside anything sessions
    /// read or write.
    own: Vec<Place>,
    /// Written only from the host (`protected.rs`), once start-up has them.
    pub protected: Option<Protected>,
}

impl Places {
    /// The map with the workspace alone.
    pub fn new(workspace: &Path) -> Self {
        Self {
            workspace: resolve(workspace, workspace),
            writable: vec![Place {
                what: "the workspace (--workdir)",
                at: resolve(workspace, workspace),
            }],
            readable: Vec::new(),
            hidden: Vec::new(),
            own: Vec::new(),
            protected: None,
        }
    }

    fn place(&self, what: &'static str, path: &Path) -> Place {
        Place {
            what,
            at: resolve(path, &self.workspace.given),
        }
    }

    /// Sessions may write `path` (relative to the workspace).
    pub fn add_writable(&mut self, what: &'static str, path: &Path) {
        let place = self.place(what, path);
        self.writable.push(place);
    }

    /// Sessions may read `path`.
    pub fn add_readable(&mut self, what: &'static str, path: &Path) {
        let place = self.place(what, path);
        self.readable.push(place);
    }

    /// No session may see `path`, nor may anything they reach hold it.
    pub fn add_hidden(&mut self, path: &Path) {
        let at = resolve(path, &self.workspace.given);
        if !self.hidden.contains(&at) {
            self.hidden.push(at);
        }
    }

    /// `path` is one of ferrepl's own files or directories.
    pub fn add_own(&mut self, what: &'static str, path: &Path) {
        let place = self.place(what, path);
        self.own.push(place);
    }

    /// The writable place holding `path` (or a link on its way), if any. A
    /// relative path counts as writable: it would be resolved against a
    /// directory sessions may change.
    pub fn writable_holding(&self, path: &Path) -> Option<&Place> {
        let at = resolve(path, &self.workspace.given);
        self.writable.iter().find(|w| at.within(&w.at))
    }

    /// The place sessions reach (write, or read by name) that holds `path`.
    pub fn reachable_holding(&self, path: &Path) -> Option<&Place> {
        let at = resolve(path, &self.workspace.given);
        self.writable
            .iter()
            .chain(&self.readable)
            .find(|p| at.within(&p.at))
    }

    /// The places sessions may write, as the checks that run or trust
    /// nothing from there take them.
    pub fn writable(&self) -> Writable {
        Writable(self.writable.iter().map(|p| p.at.given.clone()).collect())
    }

    /// The places sessions may write, with what named each.
    pub fn writable_places(&self) -> &[Place] {
        &self.writable
    }

    /// The places named for sessions to read.
    pub fn readable_places(&self) -> &[Place] {
        &self.readable
    }

    /// The private places, as reached.
    pub fn hidden(&self) -> Vec<PathBuf> {
        self.hidden.iter().map(|h| h.real.clone()).collect()
    }

    /// ferrepl's own files.
    pub fn own(&self) -> &[Place] {
        &self.own
    }

    /// A private place `path` holds (or is), if any.
    pub fn hidden_held_by(&self, path: &Path) -> Option<&Resolved> {
        let at = resolve(path, &self.workspace.given);
        self.hidden.iter().find(|h| h.within(&at))
    }

    /// A private place inside the workspace (not the workspace itself).
    pub fn hidden_in_workspace(&self) -> Option<&Resolved> {
        self.hidden
            .iter()
            .find(|h| h.within(&self.workspace) && !h.is(&self.workspace))
    }

    /// The first of ferrepl's own files that lies in a place sessions
    /// write or read by name, with that place.
    pub fn own_file_reached(&self) -> Option<(&Place, &Place)> {
        self.own.iter().find_map(|file| {
            self.writable
                .iter()
                .chain(&self.readable)
                .find(|p| file.at.within(&p.at))
                .map(|p| (file, p))
        })
    }

    /// The first of ferrepl's own files inside one of `binds` (the view's
    /// read-only and writable binds), with that bind.
    pub fn own_file_bound(&self, binds: &[PathBuf]) -> Option<(&Place, PathBuf)> {
        self.own.iter().find_map(|file| {
            binds
                .iter()
                .find(|b| file.at.within(&resolve(b, b)))
                .map(|b| (file, b.clone()))
        })
    }

    /// A bind sessions could steer: one that lies in, or is reached
    /// through a directory that resolves into, another place they can write
    /// (they could swap it, or a link on its way, before the next launch);
    /// with that place. A bind may be a writable place itself (a venv).
    pub fn steered_bind(&self, binds: &[PathBuf]) -> Option<(PathBuf, &Place)> {
        binds.iter().find_map(|bind| {
            bind.ancestors().find_map(|a| {
                let at = resolve(a, a);
                self.writable
                    .iter()
                    .find(|w| at.within(&w.at) && !(a == bind && at.is(&w.at)))
                    .map(|w| (bind.clone(), w))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_to_a_place_is_the_place_and_a_missing_tail_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let at = resolve(&link.join("not/yet"), dir.path());
        assert_eq!(at.given, link.join("not/yet"));
        let real_root = real.canonicalize().expect("canonical");
        assert_eq!(at.real, real_root.join("not/yet"));
        assert!(at.within(&resolve(&real, dir.path())));
        assert!(resolve(&real, dir.path()).is(&resolve(&link, dir.path())));
        // Relative paths start at the base; `..` folds for the named form,
        // but what passes through a place before `..` lies in it.
        let at = resolve(Path::new("a/../b"), Path::new("/w"));
        assert_eq!(at.given, Path::new("/w/b"));
        let up = resolve(&real.join("sub/../../elsewhere"), dir.path());
        assert!(up.within(&resolve(&real, dir.path())));
    }

    #[test]
    fn the_map_answers_for_every_kind_of_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let ws = root.join("ws");
        let shared = root.join("shared");
        let secret = root.join("etc/tokens");
        for d in [&ws, &shared] {
            std::fs::create_dir(d).expect("mkdir");
        }
        let mut places = Places::new(&ws);
        places.add_writable("--allow-write", &shared);
        places.add_own("--auth-token-file", &secret);
        places.add_hidden(&ws.join("home"));
        // A link in the workspace to the outside is writable (it can be
        // swapped); the outside itself is not.
        std::os::unix::fs::symlink(&secret, ws.join("tokens")).expect("symlink");
        assert_eq!(
            places.writable_holding(&ws.join("tokens")).map(|p| p.what),
            Some("the workspace (--workdir)")
        );
        assert!(places.writable_holding(&secret).is_none());
        assert!(places.own_file_reached().is_none());
        assert!(places.hidden_in_workspace().is_some());
        // An own file under a writable place is reached, naming both.
        places.add_own("--mcp-servers", &shared.join("servers.json"));
        let (file, place) = places.own_file_reached().expect("reached");
        assert_eq!((file.what, place.what), ("--mcp-servers", "--allow-write"));
        // A bind reached through a writable place is steerable; a writable
        // place bound as itself is not.
        let inside = shared.join("lib");
        assert!(places.steered_bind(std::slice::from_ref(&inside)).is_some());
        assert!(places.steered_bind(std::slice::from_ref(&shared)).is_none());
    }
}
