//! What a sandbox's file system holds: an allow-list, decided once at start.
//!
//! A session's root is an empty tmpfs into which the launcher binds only
//! what programs need (docs/security.md gives the reason for each entry):
//! the system's program and library directories, a named list of `/etc`
//! entries, the CPU topology of `/sys`, the font cache. The operator's
//! interpreters, uv, R, PATH entries and `--allow-read` paths are added by
//! start-up (`SandboxConfig::read`). Nothing else exists in the view: a
//! secret nobody listed stays out of reach. Without private namespaces the
//! same list is the whole of Landlock's read rules.

use std::path::{Path, PathBuf};

/// The system's program and library directories (kept as symlinks where
/// they are, as on merged-/usr systems).
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// `/etc` entries programs read, by name (a trailing `*` matches a prefix).
/// Never a directory that also holds keys (`/etc/ssl`, `/etc/pki`): only
/// their public parts. docs/security.md lists the reason for each.
pub const ETC: &[&str] = &[
    // The dynamic loader.
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    // Time zone and locale.
    "localtime",
    "timezone",
    "locale.conf",
    "locale.gen",
    "locale.alias",
    // Name resolution (sockets only reach anything with --network on).
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "resolv.conf",
    "gai.conf",
    "services",
    "protocols",
    "networks",
    // CA certificates and TLS configuration, never private keys.
    "ssl/certs",
    "ssl/openssl.cnf",
    "ssl/cert.pem",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/tls/cert.pem",
    "pki/tls/openssl.cnf",
    "pki/ca-trust/extracted",
    "crypto-policies",
    // Fonts, for plots.
    "fonts",
    // Debian's alternatives (pager, editor, awk...), file types, the OS.
    "alternatives",
    "mime.types",
    "magic",
    "magic.mime",
    "os-release",
    "debian_version",
    "lsb-release",
    "mtab",
    // Interpreters' and tools' system configuration.
    "R",
    "matplotlibrc",
    "gitconfig",
    "python3",
    "python3.*",
    "papersize",
    "paperspecs",
    "inputrc",
    "terminfo",
    // Shells in pty jobs.
    "profile",
    "profile.d",
    "bash.bashrc",
    "shells",
];

/// Parts of `/sys` libraries read: the CPU and NUMA topology (BLAS, loky,
/// psutil, OpenMP size their thread pools from them).
pub const SYS: &[&str] = &["/sys/devices/system/cpu", "/sys/devices/system/node"];

/// Caches that save work: fontconfig's, so a first plot does not rebuild it.
pub const CACHES: &[&str] = &["/var/cache/fontconfig"];

/// A symlink recreated in the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub path: PathBuf,
    pub target: PathBuf,
}

/// The system part of every sandbox's view.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Bound read-only at their own path.
    pub binds: Vec<PathBuf>,
    /// Recreated as symlinks (their targets lie in the view).
    pub links: Vec<Link>,
    /// The names `/etc/passwd` and `/etc/group` give the sandbox's uid and gid.
    pub user: String,
    pub group: String,
}

impl View {
    /// The allow-list as it exists on this system.
    pub fn of_system() -> Self {
        let mut view = View {
            user: user_name(),
            group: group_name(),
            ..View::default()
        };
        for dir in SYSTEM_DIRS.iter().map(Path::new) {
            match std::fs::symlink_metadata(dir) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(dir) {
                        view.links.push(Link {
                            path: dir.to_path_buf(),
                            target,
                        });
                    }
                }
                Ok(m) if m.is_dir() => view.binds.push(dir.to_path_buf()),
                _ => {}
            }
        }
        for entry in etc_entries(Path::new("/etc")) {
            view.add_etc(&entry);
        }
        for dir in SYS.iter().chain(CACHES).map(Path::new) {
            if dir.is_dir() {
                view.binds.push(dir.to_path_buf());
            }
        }
        view
    }

    /// Whether `path` (canonical) is shown by one of the system binds.
    pub fn shows(&self, path: &Path) -> bool {
        self.binds.iter().any(|b| path.starts_with(b))
    }

    /// An `/etc` entry: a symlink into the view stays a symlink (tzdata's
    /// zone name is read from the `localtime` link); one pointing elsewhere
    /// (resolv.conf into /run) is bound as the file it names.
    fn add_etc(&mut self, entry: &Path) {
        let Ok(meta) = std::fs::symlink_metadata(entry) else {
            return;
        };
        if !meta.file_type().is_symlink() {
            self.binds.push(entry.to_path_buf());
            return;
        }
        let (Ok(target), Ok(real)) = (std::fs::read_link(entry), entry.canonicalize()) else {
            return;
        };
        let in_view = real.starts_with("/proc")
            || SYSTEM_DIRS
                .iter()
                .any(|d| real.starts_with(d) && Path::new(d).is_dir());
        if in_view {
            self.links.push(Link {
                path: entry.to_path_buf(),
                target,
            });
        } else {
            self.binds.push(entry.to_path_buf());
        }
    }

    /// `/etc/passwd` and `/etc/group` for a process of `uid`/`gid` whose
    /// home is `home`: so `getpass.getuser()`, `~` and `id` work, and no
    /// host account is listed.
    pub fn accounts(&self, uid: u32, gid: u32, home: &str) -> (String, String) {
        let nologin = "/usr/sbin/nologin";
        let mut passwd = String::new();
        let mut group = String::new();
        if uid == 0 {
            passwd.push_str(&format!("root:x:0:{gid}:root:{home}:/bin/sh\n"));
        } else {
            passwd.push_str(&format!("root:x:0:0:root:/nonexistent:{nologin}\n"));
            passwd.push_str(&format!(
                "{u}:x:{uid}:{gid}:{u}:{home}:/bin/sh\n",
                u = self.user
            ));
        }
        passwd.push_str(&format!(
            "nobody:x:65534:65534:nobody:/nonexistent:{nologin}\n"
        ));
        if gid != 0 {
            group.push_str("root:x:0:\n");
        }
        let name = if gid == 0 {
            "root"
        } else {
            self.group.as_str()
        };
        group.push_str(&format!("{name}:x:{gid}:\n"));
        group.push_str("nogroup:x:65534:\n");
        (passwd, group)
    }
}

/// The allow-listed entries of `etc` that exist.
fn etc_entries(etc: &Path) -> Vec<PathBuf> {
    let names: Vec<String> = std::fs::read_dir(etc)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    for pattern in ETC {
        match pattern.strip_suffix('*') {
            Some(prefix) => out.extend(
                names
                    .iter()
                    .filter(|n| n.starts_with(prefix))
                    .map(|n| etc.join(n)),
            ),
            None => {
                let path = etc.join(pattern);
                if std::fs::symlink_metadata(&path).is_ok() {
                    out.push(path);
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A name for the sandbox's uid: the server user's own, else "ferrepl".
/// The names of a session uid and gid other than the server's: the
/// system's, else "ferrepl".
pub fn account_names(uid: u32, gid: u32) -> (String, String) {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid));
    let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid));
    (
        usable(user.ok().flatten().map(|u| u.name)),
        usable(group.ok().flatten().map(|g| g.name)),
    )
}

fn user_name() -> String {
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid());
    usable(user.ok().flatten().map(|u| u.name))
}

/// A name for the sandbox's gid: the server group's own, else "ferrepl".
fn group_name() -> String {
    let group = nix::unistd::Group::from_gid(nix::unistd::getegid());
    usable(group.ok().flatten().map(|g| g.name))
}

fn usable(name: Option<String>) -> String {
    name.filter(|n| valid_name(n))
        .unwrap_or_else(|| "ferrepl".into())
}

/// A name that cannot break a passwd line.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// The first `/nix/store` path among `paths`: then the whole store is
/// shown (a store path's libraries are other store paths, and the store
/// holds no secrets by design: every user can read it).
pub fn nix_store(paths: &[PathBuf]) -> Option<PathBuf> {
    let store = Path::new("/nix/store");
    paths
        .iter()
        .any(|p| p.starts_with(store))
        .then(|| store.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_host_accounts_are_not_in_the_list() {
        for secret in [
            "shadow", "gshadow", "ssl", "ssh", "pki", "sudoers", "passwd", "group",
        ] {
            assert!(!ETC.contains(&secret), "{secret} must not be bound");
        }
        let view = View::of_system();
        for p in &view.binds {
            assert!(
                !p.starts_with("/etc/ssl/private") && !p.starts_with("/etc/pki/tls/private"),
                "{}",
                p.display()
            );
            assert!(!p.starts_with("/var/lib") && !p.starts_with("/home"));
        }
    }

    #[test]
    fn a_pattern_matches_a_prefix_only() {
        let etc = tempfile::tempdir().expect("tempdir");
        for name in ["python3.11", "python3", "pythonx", "shadow", "hosts"] {
            std::fs::write(etc.path().join(name), "").expect("write");
        }
        let names: Vec<String> = etc_entries(etc.path())
            .iter()
            .filter_map(|p| p.file_name()?.to_str().map(String::from))
            .collect();
        assert_eq!(names, ["hosts", "python3", "python3.11"]);
    }

    #[test]
    fn accounts_name_the_sandbox_user_with_its_home() {
        let view = View {
            user: "alice".into(),
            group: "staff".into(),
            ..View::default()
        };
        let (passwd, group) = view.accounts(1000, 50, "/run/x/home-w1");
        assert!(passwd.contains("alice:x:1000:50:alice:/run/x/home-w1:/bin/sh\n"));
        assert!(group.contains("staff:x:50:\n"));
        let (passwd, _) = view.accounts(0, 0, "/h");
        assert!(passwd.starts_with("root:x:0:0:root:/h:/bin/sh\n"));
        assert!(!valid_name("a:b") && !valid_name("") && valid_name("ci-user.1"));
    }
}
