//! Unit tests of doctor.rs.
use super::*;
use crate::setup::doctor_sandbox::NO_LANDLOCK;

const FULL: &str = "workspace-write: Landlock filesystem fully enforced; private mount, PID, IPC, UTS and network namespaces (a root of only the allow-listed system, read-only, with its own /dev and /proc); all capabilities dropped; seccomp filter on; network off (only Unix sockets); no_new_privs on; no memory limit; sessions run as uid 20000, the workspace's owner";

fn find<'a>(items: &'a [Item], name: &str) -> &'a Item {
    items.iter().find(|i| i.name == name).expect(name)
}

#[test]
fn long_version_names_the_version_and_the_sandbox() {
    let v = long_version();
    assert!(
        v.starts_with(&format!("{} (", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    let os = match cfg!(target_os = "linux") {
        true => "linux: landlock seccomp namespaces cgroups)",
        false => ": no sandbox)",
    };
    assert!(v.ends_with(os), "{v}");
    if let Some(rev) = option_env!("FERREPL_GIT_REV") {
        assert!(v.contains(&format!("(git {rev}, ")), "{v}");
    }
}

#[test]
fn a_full_sandbox_is_ok_but_for_cgroups() {
    let items = sandbox_items(FULL, true, None, Ok(6));
    for name in [
        "landlock",
        "seccomp",
        "namespaces",
        "privileges",
        "network-isolation",
        "uid",
    ] {
        assert_eq!(find(&items, name).status, Good, "{name}: {items:?}");
    }
    assert!(find(&items, "landlock").detail.contains("ABI 6"));
    assert_eq!(find(&items, "cgroups").status, Warn);
}

#[test]
fn missing_layers_say_why() {
    let namespaces = FULL.split("; ").nth(1).expect("the namespaces part");
    let active = FULL
        .replace("fully enforced", "not enforced (kernel without Landlock)")
        .replace("seccomp filter on", "seccomp unavailable (EINVAL)")
        .replace(namespaces, "NO private namespaces (unshare: EPERM; retry): reads are held to the allow-list by Landlock, but other processes, host Unix sockets and file metadata outside the workspace are not isolated")
        .replace("sessions run as uid 20000, the workspace's owner", "uid boundary DEGRADED: sessions run as root without capabilities (unshare: EPERM)");
    let items = sandbox_items(&active, false, None, Err(libc::ENOSYS));
    let expected = [
        ("landlock", NO_LANDLOCK),
        ("seccomp", "EINVAL"),
        ("namespaces", "; retry"),
    ];
    for (name, why) in expected {
        let found = find(&items, name);
        assert_eq!(found.status, Missing, "{found:?}");
        assert!(found.detail.contains(why), "{found:?}");
    }
    let uid = find(&items, "uid");
    assert_eq!(uid.status, Warn, "{uid:?}");
    assert!(uid.detail.contains("DEGRADED"), "{uid:?}");
}

#[test]
fn python_versions_before_the_minimum_are_missing() {
    let cases = [
        ("3.12.1", Good),
        ("3.13.0rc1", Good),
        ("3.8.10", Missing),
        ("?", Missing),
    ];
    for (version, status) in cases {
        assert_eq!(python_item(version, "p").status, status, "{version}");
    }
}

#[test]
fn text_is_coloured_only_when_asked() {
    let items = vec![item("python", Good, "Python 3.12")];
    let report = Report {
        version: long_version(),
        workdir: None,
        ready: true,
        items,
        sandbox: None,
    };
    assert!(!render(&report, false).contains('\x1b'));
    assert!(render(&report, true).contains("\x1b[32mok"));
}
