//! The client's sandbox policy (`--sandbox inherit`): what Codex says,
//! per tool call, its commands may do, and the narrowed configuration a
//! session then runs under.
//!
//! Codex sends the policy in `_meta["codex/sandbox-state-meta"]` once the
//! server advertises the experimental capability of that name. Two shapes
//! exist (read from Codex's source and from traces of the real CLI,
//! 0.171.0, kept in this module's tests):
//!
//! * current: `permissionProfile`, tagged by `type`: `managed` with a
//!   `file_system` (`restricted` with `entries` of `{path, access}`, or
//!   `unrestricted`) and a `network` (`restricted` or `enabled`);
//!   `disabled` (Codex's danger-full-access); `external` (sandboxed by
//!   something outside Codex) with a `network`. `sandboxCwd` is a
//!   `file://` URL;
//! * older builds: `sandboxPolicy`, tagged by a kebab-case `type`:
//!   `read-only`, `workspace-write` (`writable_roots`, `network_access`),
//!   `danger-full-access`, `external-sandbox`; `sandboxCwd` a plain path.
//!
//! The operator's configuration is the ceiling: a policy only narrows it.
//! "Full access" (disabled, external, danger-full-access, an unrestricted
//! file system, a writable root of `/`) means the operator's own setting,
//! never less confinement. Reads are not narrowed: the view is already an
//! allow-list of the operator's.

use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use super::{SandboxConfig, SandboxMode};

/// The `_meta` key Codex puts its policy under, and the capability that
/// asks for it.
pub const META_KEY: &str = "codex/sandbox-state-meta";

/// What a client's policy lets a path be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    /// Neither read nor written (`deny`, `none`): for writing, as read.
    Deny,
}

/// The file-system half of a client's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Files {
    /// The operator's own setting.
    Full,
    /// Writable only where an entry says write (most specific entry wins);
    /// special places already resolved to paths.
    Entries(Vec<(PathBuf, Access)>),
}

/// A client's sandbox policy, as one tool call gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientPolicy {
    pub files: Files,
    /// The client lets its commands reach the network.
    pub network: bool,
    /// The client's working directory (`sandboxCwd`).
    pub cwd: PathBuf,
}

/// Why a call's metadata is refused (the agent's client sent no policy or
/// one ferrepl cannot read).
pub fn missing() -> String {
    format!(
        "this server runs with --sandbox inherit and takes each call's sandbox from the client, but the call carried no _meta[\"{META_KEY}\"] (Codex sends it); use Codex, or start ferrepl with an explicit --sandbox (read-only, workspace-write)"
    )
}

fn malformed(why: &str) -> String {
    format!(
        "the call's _meta[\"{META_KEY}\"] cannot be read ({why}); nothing ran. Update the client, or start ferrepl with an explicit --sandbox"
    )
}

impl ClientPolicy {
    /// Reads a call's `_meta` object. None when it holds no policy.
    pub fn from_meta(meta: &serde_json::Map<String, Value>) -> Option<Result<Self, String>> {
        let state = meta.get(META_KEY)?;
        Some(Self::parse(state).map_err(|e| malformed(&e)))
    }

    fn parse(state: &Value) -> Result<Self, String> {
        let state = state.as_object().ok_or("not an object")?;
        let cwd = match state.get("sandboxCwd") {
            Some(Value::String(s)) => cwd_of(s)?,
            Some(_) => return Err("sandboxCwd is not a string".into()),
            None => return Err("no sandboxCwd".into()),
        };
        // The current shape first: a build that sends both means it.
        if let Some(profile) = state.get("permissionProfile") {
            return from_profile(profile, cwd);
        }
        if let Some(policy) = state.get("sandboxPolicy") {
            return from_legacy(policy, cwd);
        }
        Err("neither permissionProfile nor sandboxPolicy".into())
    }

    /// What `path` (absolute, resolved) may be, by the most specific entry
    /// holding it; on a tie, deny over write over read.
    pub fn access(&self, path: &Path) -> Access {
        let entries = match &self.files {
            Files::Full => return Access::Write,
            Files::Entries(e) => e,
        };
        let mut best: Option<(usize, Access)> = None;
        for (place, access) in entries {
            if !path.starts_with(place) {
                continue;
            }
            let depth = place.components().count();
            let rank = |a: Access| match a {
                Access::Read => 0,
                Access::Write => 1,
                Access::Deny => 2,
            };
            best = match best {
                Some((d, a)) if d > depth || (d == depth && rank(a) >= rank(*access)) => best,
                _ => Some((depth, *access)),
            };
        }
        best.map_or(Access::Read, |(_, a)| a)
    }

    pub fn may_write(&self, path: &Path) -> bool {
        self.access(path) == Access::Write
    }

    fn writes_nothing(&self) -> bool {
        match &self.files {
            Files::Full => false,
            Files::Entries(e) => !e.iter().any(|(_, a)| *a == Access::Write),
        }
    }

    /// Refused when the client's working directory lies outside the
    /// workspace: its writable roots would name another project.
    pub fn check_cwd(&self, workspace: &Path) -> Result<(), String> {
        let real = self.cwd.canonicalize().unwrap_or_else(|_| self.cwd.clone());
        let ws = workspace
            .canonicalize()
            .unwrap_or_else(|_| workspace.to_path_buf());
        if real.starts_with(&ws) {
            return Ok(());
        }
        Err(format!(
            "the client's working directory {} lies outside this server's workspace {}; nothing ran. Start the client in the workspace, or the server with --workdir set to the client's project",
            self.cwd.display(),
            workspace.display()
        ))
    }
}

/// `sandboxCwd`: a `file://` URL (current) or an absolute path (older).
fn cwd_of(s: &str) -> Result<PathBuf, String> {
    let path = match s.strip_prefix("file://") {
        Some(rest) => {
            if !rest.starts_with('/') {
                return Err("sandboxCwd names a host (file://HOST/...); only local paths".into());
            }
            percent_decode(rest)?
        }
        None => s.to_string(),
    };
    let cwd = absolute(&path).ok_or_else(|| format!("sandboxCwd {s:?} is not an absolute path"))?;
    // Compared with the places as the kernel reaches them.
    Ok(cwd.canonicalize().unwrap_or(cwd))
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("sandboxCwd has a bad %-escape")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "sandboxCwd is not UTF-8".to_string())
}

/// An absolute path without NUL, `.` or `..` (a policy names places, it
/// does not walk to them).
fn absolute(s: &str) -> Option<PathBuf> {
    let path = Path::new(s);
    let plain = path
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    (path.is_absolute() && plain && !s.contains('\0')).then(|| path.to_path_buf())
}

fn network_of(v: Option<&Value>) -> Result<bool, String> {
    match v.and_then(Value::as_str) {
        Some("enabled") => Ok(true),
        Some("restricted") => Ok(false),
        _ => Err("network is neither restricted nor enabled".into()),
    }
}

fn from_profile(profile: &Value, cwd: PathBuf) -> Result<ClientPolicy, String> {
    let kind = profile.get("type").and_then(Value::as_str);
    let (files, network) = match kind {
        Some("disabled") => (Files::Full, true),
        Some("external") => (Files::Full, network_of(profile.get("network"))?),
        Some("managed") => {
            let fs = profile.get("file_system").ok_or("no file_system")?;
            let files = match fs.get("type").and_then(Value::as_str) {
                Some("unrestricted") => Files::Full,
                Some("restricted") => {
                    let entries = fs
                        .get("entries")
                        .and_then(Value::as_array)
                        .ok_or("no entries")?;
                    // Bounded: a policy is a handful of entries.
                    if entries.len() > 256 {
                        return Err("more than 256 file-system entries".into());
                    }
                    let mut out = Vec::new();
                    for e in entries {
                        out.extend(entry(e, &cwd)?);
                    }
                    if out
                        .iter()
                        .any(|(p, a)| *a == Access::Write && p == Path::new("/"))
                    {
                        Files::Full
                    } else {
                        Files::Entries(out)
                    }
                }
                _ => return Err("file_system is neither restricted nor unrestricted".into()),
            };
            (files, network_of(profile.get("network"))?)
        }
        _ => return Err("permissionProfile type is not managed, disabled or external".into()),
    };
    Ok(ClientPolicy {
        files,
        network,
        cwd,
    })
}

/// One file-system entry; None for places ferrepl gives every session
/// anyway (its own temporary directory) or cannot name.
fn entry(e: &Value, cwd: &Path) -> Result<Option<(PathBuf, Access)>, String> {
    let access = match e.get("access").and_then(Value::as_str) {
        Some("read") => Access::Read,
        Some("write") => Access::Write,
        Some("deny" | "none") => Access::Deny,
        _ => return Err("an entry's access is not read, write, deny or none".into()),
    };
    let path = e.get("path").ok_or("an entry has no path")?;
    let place = match path.get("type").and_then(Value::as_str) {
        Some("path") => {
            let p = path
                .get("path")
                .and_then(Value::as_str)
                .ok_or("an entry's path is not a string")?;
            let given = absolute(p).ok_or_else(|| format!("entry path {p:?} is not absolute"))?;
            // Compared with the places as the kernel reaches them.
            Some(given.canonicalize().unwrap_or(given))
        }
        Some("special") => {
            let value = path.get("value").ok_or("a special entry has no value")?;
            match value.get("kind").and_then(Value::as_str) {
                Some("root") => Some(PathBuf::from("/")),
                Some("project_roots") => match value.get("subpath").and_then(Value::as_str) {
                    None => Some(cwd.to_path_buf()),
                    Some(sub) => {
                        let rel = Path::new(sub);
                        let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
                        if !plain {
                            return Err(format!(
                                "project_roots subpath {sub:?} leaves the project"
                            ));
                        }
                        let joined = cwd.join(rel);
                        Some(joined.canonicalize().unwrap_or(joined))
                    }
                },
                // Each session has a temporary directory of its own.
                Some("tmpdir" | "slash_tmp") => None,
                // Places ferrepl cannot name: writing there is not given;
                // a narrower entry is ignored only when it grants nothing.
                _ if access == Access::Write => None,
                _ => None,
            }
        }
        // Globs narrow reads; ferrepl's reads are its own allow-list.
        Some("glob_pattern") if access != Access::Write => None,
        Some("glob_pattern") => return Err("a writable glob pattern cannot be honoured".into()),
        _ => return Err("an entry's path type is not path, special or glob_pattern".into()),
    };
    Ok(place.map(|p| (p, access)))
}

fn from_legacy(policy: &Value, cwd: PathBuf) -> Result<ClientPolicy, String> {
    let kind = policy.get("type").and_then(Value::as_str);
    let (files, network) = match kind {
        Some("danger-full-access") => (Files::Full, true),
        Some("external-sandbox") => {
            let network = matches!(
                policy.get("network_access").and_then(Value::as_str),
                Some("enabled")
            );
            (Files::Full, network)
        }
        Some("read-only") => (Files::Entries(Vec::new()), false),
        Some("workspace-write") => {
            let canon = |p: PathBuf| p.canonicalize().unwrap_or(p);
            let mut entries = vec![(canon(cwd.clone()), Access::Write)];
            if let Some(roots) = policy.get("writable_roots") {
                let roots = roots.as_array().ok_or("writable_roots is not a list")?;
                if roots.len() > 256 {
                    return Err("more than 256 writable roots".into());
                }
                for r in roots {
                    let r = r.as_str().ok_or("a writable root is not a string")?;
                    let p = absolute(r).ok_or_else(|| format!("writable root {r:?} is not absolute"))?;
                    entries.push((canon(p), Access::Write));
                }
            }
            let network = policy
                .get("network_access")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if entries.iter().any(|(p, _)| p == Path::new("/")) {
                (Files::Full, network)
            } else {
                (Files::Entries(entries), network)
            }
        }
        _ => return Err("sandboxPolicy type is not read-only, workspace-write, danger-full-access or external-sandbox".into()),
    };
    Ok(ClientPolicy {
        files,
        network,
        cwd,
    })
}

/// The configuration a session runs under for one client policy, and a
/// key that tells two apart (equal keys: the same confinement).
#[derive(Debug, Clone)]
pub struct Narrowed {
    pub config: SandboxConfig,
    pub key: String,
    /// In a few words, for notes: "read-only", "workspace-write, network off".
    pub summary: String,
}

/// The ceiling `ceiling` narrowed by `policy`: the workspace and each
/// operator-named writable place stay writable only where the policy says
/// write (the whole place); a read-only entry inside a writable place is
/// protected (existing or not, like git's hooks); the network is the
/// operator's, off when the policy says restricted. `own` are ferrepl's
/// own places for the session (the venv it keeps for the workspace, where
/// python_install puts packages): like the session's temporary directory,
/// they stay writable, being no file of the user's.
pub fn narrow(ceiling: &SandboxConfig, policy: &ClientPolicy, own: &[PathBuf]) -> Narrowed {
    let mut config = ceiling.clone();
    if !policy.network {
        config.network = false;
        // Nor the --allow-domain hosts through the cells' proxy.
        config.cell_egress = None;
    }
    let mut protect = Vec::new();
    if policy.writes_nothing() {
        config.mode = SandboxMode::ReadOnly;
        config.write.retain(|p| own.contains(p));
        config.protected = None;
        // Still readable, as with an explicit --sandbox read-only.
        config
            .read
            .extend(ceiling.write.iter().filter(|p| !own.contains(p)).cloned());
    } else if let Files::Entries(entries) = &policy.files {
        let mut places: Vec<PathBuf> = Vec::new();
        if ceiling.mode == SandboxMode::WorkspaceWrite {
            places.push(ceiling.workspace.clone());
        }
        places.extend(ceiling.write.iter().cloned());
        let real = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        let mut kept: Vec<PathBuf> = own.to_vec();
        for place in places.iter().filter(|p| !own.contains(p)) {
            let shown = real(place);
            if policy.may_write(&shown) {
                kept.push(place.clone());
                for (inner, access) in entries {
                    let inside = inner.starts_with(&shown) && *inner != shown;
                    let already = ceiling
                        .protected
                        .as_ref()
                        .is_some_and(|p| p.find(inner).is_some());
                    if inside && *access != Access::Write && !already {
                        protect.push(inner.clone());
                    }
                }
            }
            // A writable entry strictly inside a place left read-only is
            // not bound on its own: the agent could have made that path a
            // link to anywhere by the time the view is built. The place
            // stays read-only (narrower than asked, never wider).
        }
        let workspace_kept = kept.contains(&ceiling.workspace);
        if !workspace_kept && ceiling.mode == SandboxMode::WorkspaceWrite {
            config.mode = SandboxMode::ReadOnly;
        }
        config.write = ceiling
            .write
            .iter()
            .filter(|p| kept.contains(p))
            .cloned()
            .collect();
        config
            .read
            .extend(ceiling.write.iter().filter(|p| !kept.contains(p)).cloned());
        if !protect.is_empty() {
            // The operator may have freed every protected name; the
            // client's read-only places are protected all the same.
            let p = config
                .protected
                .get_or_insert_with(|| super::protected::Protected {
                    roots: std::iter::once(ceiling.workspace.clone())
                        .chain(config.write.iter().cloned())
                        .collect(),
                    ..Default::default()
                });
            p.paths.extend(protect.iter().cloned());
            p.paths.sort();
            p.paths.dedup();
        }
    }
    let beyond: Vec<String> = config
        .write
        .iter()
        .filter(|p| !own.contains(p))
        .map(|p| p.display().to_string())
        .collect();
    let mut summary = match (config.mode, &policy.files) {
        (SandboxMode::ReadOnly, _) if beyond.is_empty() => "read-only".to_string(),
        (SandboxMode::ReadOnly, _) => format!("read-only but {}", beyond.join(", ")),
        (_, Files::Full) => "the server's own setting".to_string(),
        _ => "workspace-write".to_string(),
    };
    let reaches = |c: &SandboxConfig| c.network || c.cell_egress.is_some();
    summary.push_str(if reaches(&config) && reaches(ceiling) {
        ", network on"
    } else if reaches(ceiling) {
        ", network off"
    } else {
        ""
    });
    let key = key_of(&config);
    Narrowed {
        config,
        key,
        summary,
    }
}

/// What tells two configurations' confinement apart, as far as a client's
/// policy changes it.
pub fn key_of(config: &SandboxConfig) -> String {
    format!(
        "{:?}|{:?}|{}|{}|{:?}",
        config.mode,
        config.write,
        config.network,
        config.cell_egress.is_some(),
        config.protected.as_ref().map(|p| &p.paths)
    )
}

#[cfg(test)]
mod tests;
