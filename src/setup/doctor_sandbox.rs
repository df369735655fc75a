//! Doctor's items about the sandbox itself, one per protection (Landlock,
//! seccomp, namespaces, cgroups, privileges, network isolation, the
//! session's uid), read from the server's own start-up probe and the
//! kernel's Landlock ABI.

use super::doctor::Status::{Good, Missing, Warn};
use super::doctor::{Item, Status, item};

pub(super) const NO_LANDLOCK: &str = "this kernel has no Landlock (Linux < 5.13 or lsm= without landlock): files outside the workspace are protected only by namespaces and permissions";
const LANDLOCK_OFF: &str = "Landlock is built in but not enabled (add landlock to the lsm= boot parameter): files outside the workspace are protected only by namespaces and permissions";
const CGROUPS_WATCH: &str = "no writable cgroup v1 memory or pids hierarchy (v2 is not used): limits are enforced by ferrepl's watch of process trees, not by the kernel";

/// One item per protection, read from the parts of the probe's description
/// `active` (`sandbox::probe` joins them with "; "), whether it found
/// namespaces, the writable cgroup v1 hierarchies (memory, pids), and the
/// kernel's Landlock ABI (or the errno of asking for it).
pub(super) fn sandbox_items(
    active: &str,
    namespaces: bool,
    cgroups: Option<(bool, bool)>,
    abi: Result<i64, i32>,
) -> Vec<Item> {
    let parts: Vec<&str> = active.split("; ").collect();
    let part = |prefix: &str| parts.iter().copied().find(|s| s.starts_with(prefix));
    let unknown = || (Warn, format!("not reported by the probe: {active}"));
    let landlock = landlock_status(&parts, abi).unwrap_or_else(unknown);
    let seccomp = match part("seccomp") {
        Some("seccomp filter on") => (Good, "system-call filter on".to_string()),
        Some(s) => (
            Missing,
            format!("{s}: any system call the kernel allows is open"),
        ),
        None => unknown(),
    };
    let namespaces = if namespaces {
        (Good, part("private mount").unwrap_or("on").to_string())
    } else {
        // The launcher's error may itself hold "; ": cut at the sentence's end.
        let end = "are not isolated";
        let why = match (active.find("NO private namespaces"), active.find(end)) {
            (Some(a), Some(b)) if a < b => &active[a..b + end.len()],
            _ => part("no private namespaces").unwrap_or("no private namespaces"),
        };
        (Missing, why.to_string())
    };
    let cgroups = match cgroups {
        Some((true, true)) => (
            Good,
            "v1 memory and pids: limits enforced by the kernel".into(),
        ),
        Some((memory, _)) => (
            Warn,
            CGROUPS_WATCH.replace("memory or pids", ["memory", "pids"][memory as usize]),
        ),
        None => (Warn, CGROUPS_WATCH.to_string()),
    };
    let privileges = match (part("all capabilities dropped"), part("no_new_privs on")) {
        (Some(a), Some(b)) => (Good, format!("{a}, {b}")),
        _ => {
            let said = [part("capabilities"), part("no_new_privs")].map(Option::unwrap_or_default);
            (Warn, said.join(", "))
        }
    };
    let network = match part("network") {
        Some(s) if s.starts_with("network off (") => {
            let proxy = part("package installers")
                .map(|i| format!("; {i}"))
                .unwrap_or_default();
            // --network domains: the cells' own allow-list.
            let cells = part("cells and shell jobs reach only")
                .unwrap_or("cells and jobs reach no network");
            (Good, format!("{cells}{proxy}"))
        }
        Some("network on") => (Warn, "sessions reach every host (--network on)".into()),
        Some(s) => (Missing, format!("{s}: sessions reach the network")),
        None => unknown(),
    };
    let uid = match (part("sessions run as"), part("uid boundary")) {
        (Some(s), _) => (Good, s.to_string()),
        (None, Some(s)) => (Warn, s.to_string()),
        (None, None) => unknown(),
    };
    let all = [
        ("landlock", landlock),
        ("seccomp", seccomp),
        ("namespaces", namespaces),
        ("cgroups", cgroups),
        ("privileges", privileges),
        ("network-isolation", network),
        ("uid", uid),
    ];
    all.map(|(name, (status, detail))| item(name, status, detail))
        .to_vec()
}

/// Landlock as the probe reported it (None: not reported), with the ABI.
fn landlock_status(parts: &[&str], abi: Result<i64, i32>) -> Option<(Status, String)> {
    let abi_n = abi.map_or("unknown".to_string(), |n| n.to_string());
    let landlock = parts
        .iter()
        .find_map(|s| s.split_once("Landlock filesystem ").map(|p| p.1));
    Some(match (landlock, abi) {
        // No Landlock at all (the fake probe's case too): that alone is the reason.
        (_, Err(libc::ENOSYS)) => (Missing, NO_LANDLOCK.to_string()),
        (_, Err(libc::EOPNOTSUPP)) => (Missing, LANDLOCK_OFF.to_string()),
        (Some(s), _) if s.starts_with("fully") => (Good, format!("{s} (kernel ABI {abi_n})")),
        (Some(s), _) if s.starts_with("partially") => (Warn, format!("{s}: kernel ABI {abi_n}")),
        (Some(s), _) => (Missing, format!("{s} (kernel ABI {abi_n})")),
        (None, _) => return None,
    })
}
