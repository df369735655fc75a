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

use std::path::{Component, Path, PathBuf};

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

/// Links a dangling chain may have before it is taken as it stands (the
/// kernel's own limit on following links).
const MAX_LINKS: usize = 40;

/// `path` with its links resolved as far as it exists, the rest appended.
/// A dangling link is followed too: whoever writes where it points can
/// create its target later, and the kernel will follow it then.
fn reached(path: &Path) -> PathBuf {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match existing_prefix(&path) {
            Step::Done(real) => return real,
            Step::Dangling(next) => path = next,
        }
    }
    path
}

/// One step of `reached`.
enum Step {
    /// Resolved: the existing prefix canonical, the missing rest appended.
    Done(PathBuf),
    /// The path runs through a dangling link: the path with it replaced by
    /// its target.
    Dangling(PathBuf),
}

fn existing_prefix(path: &Path) -> Step {
    let mut missing: Vec<std::ffi::OsString> = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = at.canonicalize() {
            return Step::Done(missing.iter().rev().fold(real, |p, name| p.join(name)));
        }
        // A name that exists but does not resolve is a dangling link (or a
        // loop): go on from where it points.
        if let Ok(target) = std::fs::read_link(at) {
            let base = at.parent().unwrap_or(Path::new("/"));
            let next = normalize(&target, base);
            return Step::Dangling(missing.iter().rev().fold(next, |p, name| p.join(name)));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_os_string());
                at = parent;
            }
            _ => return Step::Done(path.to_path_buf()),
        }
    }
}

impl Resolved {
    /// It lies in `place` (or is it), under any of their names. As named,
    /// only when it goes on inside the place: `w/sub/../x` passes through
    /// `w/sub`, which whoever writes `w` can swap; `w/../x` leaves `w` by
    /// the one name no session can change.
    pub fn within(&self, place: &Resolved) -> bool {
        let inside = |p: &PathBuf, base: &PathBuf| {
            p.strip_prefix(base)
                .is_ok_and(|rest| !matches!(rest.components().next(), Some(Component::ParentDir)))
        };
        [&self.named, &self.given, &self.real]
            .into_iter()
            .any(|p| inside(p, &place.given) || inside(p, &place.real))
    }

    /// It is `place`, under any of their names.
    pub fn is(&self, place: &Resolved) -> bool {
        [&self.given, &self.real]
            .into_iter()
            .any(|p| *p == place.given || *p == place.real)
    }
}

/// What names the places the operator allows by flag (`Place::what`).
pub const ALLOW_WRITE: &str = "--allow-write";
pub const ALLOW_READ: &str = "--allow-read";

/// A place sessions reach, and what named it (a flag, for messages).
#[derive(Debug, Clone)]
pub struct Place {
    pub what: &'static str,
    pub at: Resolved,
    /// Sessions write it now (else they only read it, but may have written
    /// it before: a user's venv).
    pub sessions_write: bool,
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
    /// allow-list (`view.rs`): --allow-read.
    readable: Vec<Place>,
    /// What the view shows read-only beyond the system's allow-list and the
    /// workspace, as start-up found it: the interpreters' installations,
    /// the user's venvs, --allow-python, uv, PATH entries, R, --allow-read.
    shown: Vec<PathBuf>,
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
                sessions_write: true,
            }],
            readable: Vec::new(),
            shown: Vec::new(),
            hidden: Vec::new(),
            own: Vec::new(),
            protected: None,
        }
    }

    fn place(&self, what: &'static str, path: &Path) -> Place {
        Place {
            what,
            at: resolve(path, &self.workspace.given),
            sessions_write: false,
        }
    }

    /// Sessions may write `path` (relative to the workspace).
    pub fn add_writable(&mut self, what: &'static str, path: &Path) {
        let mut place = self.place(what, path);
        place.sessions_write = true;
        self.writable.push(place);
    }

    /// Sessions read `path` but may have written it before (a user's venv):
    /// nothing there is trusted or run, as in a writable place.
    pub fn add_untrusted(&mut self, what: &'static str, path: &Path) {
        let place = self.place(what, path);
        self.writable.push(place);
    }

    /// The view shows `paths` read-only (what start-up found sessions
    /// need); kept sorted, each once.
    pub fn show(&mut self, paths: impl IntoIterator<Item = PathBuf>) {
        self.shown.extend(paths);
        self.shown.sort();
        self.shown.dedup();
    }

    /// What the view binds read-only beyond the system and the workspace.
    pub fn view_read(&self) -> Vec<PathBuf> {
        self.shown.clone()
    }

    /// What the view binds writable beyond the workspace: the places
    /// sessions write now (--allow-write, the kept venvs).
    pub fn view_write(&self) -> Vec<PathBuf> {
        self.writable
            .iter()
            .skip(1)
            .filter(|p| p.sessions_write)
            .map(|p| p.at.given.clone())
            .collect()
    }

    /// The places named for sessions to read, as named.
    pub fn named_read(&self) -> Vec<PathBuf> {
        self.readable.iter().map(|p| p.at.given.clone()).collect()
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

    /// The places the operator allowed by flag (--allow-write,
    /// --allow-read): what a refusal about an allowed path looks at.
    pub fn allowed(&self) -> impl Iterator<Item = &Place> {
        self.writable
            .iter()
            .chain(&self.readable)
            .filter(|p| p.what == ALLOW_WRITE || p.what == ALLOW_READ)
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

    /// Review (attack): a link whose target does not exist yet is
    /// reached where it points once that target is made. An --allow-read
    /// path that is a dangling link into the workspace lies in the
    /// workspace: the agent makes the target (or a link there to any
    /// directory) and the next launch binds it. Both the old rules
    /// (canonicalize or the path itself) and `reached` stop at the
    /// dangling link; FAILS today.
    #[test]
    fn a_dangling_link_into_a_writable_place_lies_in_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let ws = root.join("ws");
        std::fs::create_dir(&ws).expect("mkdir");
        let link = root.join("data");
        std::os::unix::fs::symlink(ws.join("later"), &link).expect("symlink");
        let mut places = Places::new(&ws);
        places.add_readable("--allow-read", &link);
        let read = &places.readable_places()[0];
        assert!(
            read.at.within(&places.workspace),
            "{:?} reaches into the workspace once `later` is made",
            read.at
        );
        assert!(
            places.steered_bind(std::slice::from_ref(&link)).is_some(),
            "a bind through a dangling link into the workspace is steerable"
        );
    }

    /// Review: the named form (nothing folded) only matters where `..`
    /// follows a name sessions could swap; the workspace itself is
    /// canonical and sessions cannot replace it, so `ws/../x` is `x`. The
    /// sandbox binds --allow-read/--allow-write as folded (`normalize`),
    /// so an allowed path `<ws>/../data` (or `../data`, relative to the
    /// workspace) is outside it; the old check_workspace (`normalize(p)
    /// .starts_with(workdir)`) accepted it. FAILS today: refused as
    /// "inside the workspace" with its folded path in the message.
    #[test]
    fn a_path_leaving_the_workspace_root_by_dotdot_is_outside_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let ws = root.join("ws");
        std::fs::create_dir_all(root.join("data")).expect("mkdir");
        std::fs::create_dir(&ws).expect("mkdir");
        let places = Places::new(&ws);
        for named in [ws.join("../data"), PathBuf::from("../data")] {
            let at = resolve(&named, &ws);
            assert_eq!(at.given, root.join("data"));
            assert!(
                !at.within(&places.workspace),
                "{named:?} is {:?}, outside the workspace",
                at.given
            );
        }
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
