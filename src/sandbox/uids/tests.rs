use std::os::unix::fs::PermissionsExt;

use super::*;

#[test]
fn ranges_are_checked() {
    assert_eq!(parse_range("20000-59999"), Ok((20000, 59999)));
    for bad in ["0-10", "10-5", "x", "5", "1-4294967295"] {
        assert!(parse_range(bad).is_err(), "{bad}");
    }
}

/// A table in a fresh directory of this user's (root's in CI; the
/// checks ask for this server's user) and places to name in keys.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Self {
        Host {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn table(&self) -> PathBuf {
        self.dir.path().join("uids").join("uids.json")
    }

    /// An instance whose state directory and workspace exist.
    fn instance(&self, state: &str, workspace: &str) -> Instance {
        let (s, w) = (self.dir.path().join(state), self.dir.path().join(workspace));
        std::fs::create_dir_all(&s).expect("state dir");
        std::fs::create_dir_all(&w).expect("workspace");
        Instance {
            state_dir: Some(s),
            workdir: w,
        }
    }

    fn open(&self, instance: &Instance, range: (u32, u32)) -> TenantUids {
        TenantUids::open(&self.table(), instance.clone(), range).expect("open the table")
    }

    fn text(&self) -> String {
        std::fs::read_to_string(self.table()).expect("the table")
    }
}

const RANGE: (u32, u32) = (3_000_000, 3_000_010);

#[test]
fn a_key_keeps_its_uid_and_no_uid_serves_two_keys() {
    let host = Host::new();
    let a = host.instance("state-a", "project-a");
    let uids = host.open(&a, RANGE);
    let alice = uids.identity_of("alice").expect("alice");
    let bob = uids.identity_of("bob").expect("bob");
    let sole = uids.identity_of(SOLE).expect("sole");
    assert_ne!(alice.uid, bob.uid);
    assert!(sole.uid != alice.uid && sole.uid != bob.uid);
    assert_eq!(alice.gid, alice.uid);
    // A restart, bob asking first: the same uids.
    let again = host.open(&a, RANGE);
    assert_eq!(again.identity_of("bob").expect("bob").uid, bob.uid);
    assert_eq!(again.identity_of("alice").expect("alice").uid, alice.uid);
    // Another project, another state directory, the same tenant names:
    // uids of their own.
    let b = host.instance("state-b", "project-b");
    let other = host.open(&b, RANGE);
    let taken = [alice.uid, bob.uid, sole.uid];
    for tenant in ["alice", "bob", SOLE] {
        let uid = other.identity_of(tenant).expect(tenant).uid;
        assert!(!taken.contains(&uid), "{tenant} of project b got {uid}");
    }
    // The same workspace under another state directory is another key.
    let c = Instance {
        state_dir: b.state_dir.clone(),
        workdir: a.workdir.clone(),
    };
    let third = host.open(&c, RANGE).identity_of(SOLE).expect("sole").uid;
    assert_ne!(third, sole.uid);
    let mode = std::fs::metadata(host.table())
        .expect("table")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let dir_mode = std::fs::metadata(host.table().parent().expect("dir"))
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700);
}

#[test]
fn a_full_range_is_refused_naming_the_table_and_how_to_prune() {
    let host = Host::new();
    let one = (3_000_000, 3_000_000);
    host.open(&host.instance("s", "a"), one)
        .identity_of(SOLE)
        .expect("the one uid");
    let err = host
        .open(&host.instance("s", "b"), one)
        .identity_of(SOLE)
        .expect_err("no uid left");
    let text = err.to_string();
    assert!(
        text.contains(&host.table().display().to_string())
            && text.contains("remove the entries")
            && text.contains("wider --tenant-uids"),
        "{text}"
    );
}

#[test]
fn a_gone_workspace_frees_its_uid_once_its_server_is_gone() {
    let host = Host::new();
    let one = (3_000_000, 3_000_000);
    let a = host.instance("s", "a");
    let uid = host.open(&a, one).identity_of(SOLE).expect("a").uid;
    // The workspace is removed while its server (this process) runs:
    // the uid stays a's.
    std::fs::remove_dir(&a.workdir).expect("remove a");
    let b = host.instance("s", "b");
    assert!(host.open(&b, one).identity_of(SOLE).is_err());
    // Its server gone (another boot, as the table says): b gets it.
    let dead = host.text().replace(
        &boot_id().expect("a boot id"),
        "00000000-0000-0000-0000-000000000000",
    );
    std::fs::write(host.table(), dead).expect("rewrite");
    assert_eq!(host.open(&b, one).identity_of(SOLE).expect("b").uid, uid);
    let a_key = format!("{}\"", a.workdir.display());
    assert!(
        !host.text().contains(&a_key),
        "a's key is dropped: {}",
        host.text()
    );
}

#[test]
fn the_table_must_be_this_users_alone() {
    let host = Host::new();
    let a = host.instance("s", "a");
    host.open(&a, RANGE).identity_of(SOLE).expect("a");
    // Writable by the group: refused, naming the file.
    std::fs::set_permissions(host.table(), PermissionsExt::from_mode(0o620)).expect("chmod");
    let err = TenantUids::open(&host.table(), a.clone(), RANGE)
        .err()
        .expect("a group-writable table is refused");
    assert!(err.to_string().contains("chmod go-w"), "{err}");
    std::fs::set_permissions(host.table(), PermissionsExt::from_mode(0o600)).expect("chmod");
    // Its directory writable by others: refused.
    let dir = host.table().parent().expect("dir").to_path_buf();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o703)).expect("chmod");
    assert!(TenantUids::open(&host.table(), a.clone(), RANGE).is_err());
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o700)).expect("chmod");
    // A symbolic link in the file's place is not followed.
    let elsewhere = host.dir.path().join("elsewhere.json");
    std::fs::rename(host.table(), &elsewhere).expect("move");
    std::os::unix::fs::symlink(&elsewhere, host.table()).expect("symlink");
    let err = TenantUids::open(&host.table(), a.clone(), RANGE)
        .err()
        .expect("a symlink is refused");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    // A relative path is refused.
    assert!(TenantUids::open(Path::new("uids.json"), a, RANGE).is_err());
}

#[test]
fn a_table_giving_one_uid_twice_or_root_is_refused() {
    let host = Host::new();
    let a = host.instance("s", "a");
    host.open(&a, RANGE).identity_of("alice").expect("alice");
    host.open(&a, RANGE).identity_of("bob").expect("bob");
    let table: serde_json::Value = serde_json::from_str(&host.text()).expect("json");
    let first = table["entries"][0]["uid"].clone();
    for (uid, why) in [(first, "twice"), (serde_json::json!(0), "uid 0")] {
        let mut bad = table.clone();
        bad["entries"][1]["uid"] = uid;
        std::fs::write(host.table(), bad.to_string()).expect("write");
        let err = TenantUids::open(&host.table(), a.clone(), RANGE)
            .err()
            .expect("refused");
        assert!(err.to_string().contains(why), "{err}");
    }
}

#[test]
fn the_directory_is_made_when_a_uid_is_first_needed() {
    let host = Host::new();
    let a = host.instance("s", "a");
    let dir = host.table().parent().expect("dir").to_path_buf();
    // A server whose sessions run as the workspace's owner needs none.
    let uids = host.open(&a, RANGE);
    assert!(!dir.exists());
    uids.prepare().expect("prepare");
    assert!(dir.is_dir() && !host.table().exists());
    uids.identity_of(SOLE).expect("a uid");
    assert!(host.table().is_file());
    // Its parent missing: refused, naming the directory and the flag.
    let missing = host.dir.path().join("no/such/uids.json");
    let uids = TenantUids::open(&missing, a, RANGE).expect("nothing checked yet");
    let err = uids.prepare().expect_err("no parent");
    let text = err.to_string();
    assert!(
        text.contains("no/such") && text.contains("--uid-table"),
        "{text}"
    );
}

#[test]
fn peeking_writes_nothing() {
    let host = Host::new();
    let a = host.instance("s", "a");
    let peek = TenantUids::peek(&host.table(), a.clone(), RANGE);
    assert_eq!(peek.identity_of(SOLE).expect("would get").uid, RANGE.0);
    assert!(!host.table().exists());
    let uid = host.open(&a, RANGE).identity_of(SOLE).expect("a").uid;
    let before = host.text();
    let peek = TenantUids::peek(&host.table(), a, RANGE);
    assert_eq!(peek.identity_of(SOLE).expect("has").uid, uid);
    assert_eq!(host.text(), before);
}

#[test]
fn paths_that_are_not_utf8_stay_apart() {
    use std::os::unix::ffi::OsStrExt;
    let host = Host::new();
    let mk = |b: &[u8]| {
        let ws = host.dir.path().join(std::ffi::OsStr::from_bytes(b));
        std::fs::create_dir_all(&ws).expect("mkdir");
        Instance {
            state_dir: None,
            workdir: ws,
        }
    };
    let (a, b) = (mk(b"ws-\xff"), mk(b"ws-\xfe"));
    let ua = host.open(&a, RANGE).identity_of(SOLE).expect("a").uid;
    let ub = host.open(&b, RANGE).identity_of(SOLE).expect("b").uid;
    assert_ne!(ua, ub);
    assert_eq!(host.open(&a, RANGE).identity_of(SOLE).expect("a").uid, ua);
}
