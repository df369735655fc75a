//! Who the tests run as and the modes of the files they make: many checks
//! depend on root (chown, other uids, a cgroup of their own), and the same
//! questions were asked a few ways before they were asked here.

use std::path::Path;

/// Whether the tests run as root (the effective uid).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The uid the tests (and so an unprivileged server they start) run as.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// `path` with mode `mode`.
pub fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}
