//! The store's unit tests: each writes through the public API, flushes
//! (never sleeps) and reads back, usually after a reopen.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;
use serde_json::json;

use super::*;

const WAIT: Duration = Duration::from_secs(10);

fn config(dir: &Path, workspace: &str) -> StoreConfig {
    StoreConfig {
        dir: dir.join("state"),
        workspace: PathBuf::from(workspace),
        principal: "local".into(),
        max_cells_per_session: 1000,
        keep: Duration::from_secs(30 * 86_400),
        max_sessions: 100,
        max_bytes: u64::MAX,
    }
}

fn open(cfg: &StoreConfig) -> Store {
    match Store::open(cfg).expect("open") {
        Opened::Ready(store) => store,
        Opened::Locked { path, holder_pid } => {
            panic!("{} locked by {holder_pid:?}", path.display())
        }
    }
}

fn session(name: &str) -> SessionRecord {
    SessionRecord {
        name: name.into(),
        language: "r".into(),
        options: json!({"workdir": "/w", "env": {"A": "1"}}),
        head: None,
    }
}

fn cell(id: u64, parent: Option<u64>) -> CellRecord {
    CellRecord {
        id,
        parent,
        source: json!({"code": format!("x = {id}")}),
        replayable: true,
        status: "ok".into(),
        elapsed_ms: 1.5,
        finished_unix: 1_700_000_000.25,
        summary: format!("out {id}"),
        images: json!([{"sha": "ab", "bytes": 12}]),
    }
}

fn ids(stored: &StoredSession) -> Vec<u64> {
    stored.cells.iter().map(|c| c.id).collect()
}

#[test]
fn store_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Store>();
}

#[test]
fn round_trip_survives_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "/ws/a");
    let store = open(&cfg);
    store.put_session(session("s"));
    let cells: Vec<_> = [cell(1, None), cell(2, Some(1)), cell(3, Some(2))].into();
    // Out of order, to see that load sorts by id.
    store.put_cell("s", cells[2].clone(), true);
    store.put_cell("s", cells[0].clone(), false);
    store.put_cell("s", cells[1].clone(), false);
    assert!(store.flush(WAIT));
    drop(store);

    let store = open(&cfg);
    let loaded = store.load().unwrap();
    assert_eq!(loaded.len(), 1);
    let mut expected = session("s");
    expected.head = Some(3);
    assert_eq!(loaded[0].record, expected);
    assert_eq!(loaded[0].cells, cells);
    assert!(loaded[0].updated_unix > 1_700_000_000.0);
}

#[test]
fn one_session_loads_alone_with_its_cells() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(&config(tmp.path(), "/ws/a"));
    for name in ["a", "b"] {
        store.put_session(session(name));
    }
    store.put_cell("a", cell(1, None), true);
    store.put_cell("b", cell(1, None), false);
    store.put_cell("b", cell(2, Some(1)), true);
    assert!(store.flush(WAIT));
    let b = store.load_session("b").unwrap().expect("b is stored");
    assert_eq!((b.record.name.as_str(), ids(&b)), ("b", vec![1, 2]));
    assert!(store.load_session("c").unwrap().is_none());
    assert_eq!(store.load().unwrap().len(), 2);
}

#[test]
fn put_session_again_keeps_cells() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(&config(tmp.path(), "/ws/a"));
    store.put_session(session("s"));
    store.put_cell("s", cell(1, None), true);
    let mut changed = session("s");
    changed.language = "python".into();
    changed.head = Some(1);
    store.put_session(changed.clone());
    assert!(store.flush(WAIT));
    let loaded = store.load().unwrap();
    assert_eq!(loaded[0].record, changed);
    assert_eq!(ids(&loaded[0]), [1]);
}

#[test]
fn put_cell_creates_a_missing_session_and_set_head_moves_it() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(&config(tmp.path(), "/ws/a"));
    store.put_cell("new", cell(1, None), true);
    store.put_cell("new", cell(2, Some(1)), true);
    assert!(store.flush(WAIT));
    let loaded = store.load().unwrap();
    assert_eq!(loaded[0].record.language, "python");
    assert_eq!(loaded[0].record.options, json!({}));
    assert_eq!(loaded[0].record.head, Some(2));
    store.set_head("new", Some(1));
    assert!(store.flush(WAIT));
    assert_eq!(store.load().unwrap()[0].record.head, Some(1));
    store.set_head("new", None);
    assert!(store.flush(WAIT));
    assert_eq!(store.load().unwrap()[0].record.head, None);
}

#[test]
fn second_open_is_locked_until_the_first_is_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "/ws/a");
    let first = open(&cfg);
    match Store::open(&cfg).unwrap() {
        Opened::Locked { path, holder_pid } => {
            assert_eq!(path, first.path());
            assert_eq!(holder_pid, Some(std::process::id()));
        }
        Opened::Ready(_) => panic!("opened twice"),
    }
    drop(first);
    assert!(matches!(Store::open(&cfg).unwrap(), Opened::Ready(_)));
}

#[test]
fn workspaces_and_principals_get_their_own_files() {
    let tmp = tempfile::tempdir().unwrap();
    let a = open(&config(tmp.path(), "/ws/a"));
    let b = open(&config(tmp.path(), "/ws/b"));
    let mut other = config(tmp.path(), "/ws/a");
    other.principal = "tenant-2".into();
    let c = open(&other);
    assert_ne!(a.path(), b.path());
    assert_ne!(a.path(), c.path());
    assert_eq!(a.path().parent(), b.path().parent());
    let name = a.path().file_name().unwrap().to_str().unwrap();
    assert_eq!(name, format!("{:016x}-local.sqlite3", fnv1a(b"/ws/a")));
    // Stable across builds: the name must be found again after an upgrade.
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
}

#[test]
fn files_are_private() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "/ws/a");
    let store = open(&cfg);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cfg.dir), 0o700);
    assert_eq!(mode(store.path()), 0o600);
}

#[test]
fn retention_by_age() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path(), "/ws/a");
    let store = open(&cfg);
    store.put_session(session("old"));
    store.put_cell("old", cell(1, None), true);
    assert!(store.flush(WAIT));
    drop(store);
    assert_eq!(open(&cfg).load().unwrap().len(), 1);
    cfg.keep = Duration::ZERO;
    let store = open(&cfg);
    assert!(store.load().unwrap().is_empty());
    let conn = Connection::open(store.path()).unwrap();
    let cells: i64 = conn
        .query_row("SELECT count(*) FROM cells", [], |r| r.get(0))
        .unwrap();
    assert_eq!(cells, 0);
}

#[test]
fn retention_keeps_the_most_recently_updated_sessions() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path(), "/ws/a");
    let store = open(&cfg);
    for name in ["s1", "s2", "s3"] {
        store.put_session(session(name));
        assert!(store.flush(WAIT));
    }
    // s1 is now the most recent.
    store.set_head("s1", None);
    assert!(store.flush(WAIT));
    drop(store);
    cfg.max_sessions = 2;
    let names: Vec<_> = open(&cfg)
        .load()
        .unwrap()
        .into_iter()
        .map(|s| s.record.name)
        .collect();
    assert_eq!(names, ["s1", "s3"]);
}

#[test]
fn retention_of_cells_keeps_the_heads_path_first() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path(), "/ws/a");
    let store = open(&cfg);
    // 1 - 2 - 3 and 2 - 6 are side branches; the head's path is 1 - 4 - 5.
    for (id, parent) in [
        (1, None),
        (2, Some(1)),
        (3, Some(2)),
        (4, Some(1)),
        (5, Some(4)),
    ] {
        store.put_cell("s", cell(id, parent), true);
    }
    store.put_cell("s", cell(6, Some(2)), false);
    assert!(store.flush(WAIT));
    drop(store);

    cfg.max_cells_per_session = 4;
    let loaded = open(&cfg).load().unwrap();
    assert_eq!(
        ids(&loaded[0]),
        [1, 4, 5, 6],
        "the newest side cell fills the budget"
    );
    cfg.max_cells_per_session = 2;
    let loaded = open(&cfg).load().unwrap();
    assert_eq!(
        ids(&loaded[0]),
        [4, 5],
        "the path loses its oldest cells last"
    );
    assert_eq!(loaded[0].record.head, Some(5));
}

#[test]
fn cell_cap_is_applied_while_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path(), "/ws/a");
    cfg.max_cells_per_session = 10;
    let store = open(&cfg);
    for id in 1..=schema::PRUNE_EVERY as u64 {
        store.put_cell("s", cell(id, (id > 1).then(|| id - 1)), true);
    }
    assert!(store.flush(WAIT));
    let loaded = store.load().unwrap();
    let expected: Vec<u64> =
        (schema::PRUNE_EVERY as u64 - 9..=schema::PRUNE_EVERY as u64).collect();
    assert_eq!(ids(&loaded[0]), expected);
}

#[test]
fn oversized_code_is_kept_as_a_stub() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(&config(tmp.path(), "/ws/a"));
    let mut big = cell(1, None);
    big.source = json!({"code": "é".repeat(MAX_CODE_BYTES)});
    store.put_cell("s", big, true);
    let mut small = cell(2, Some(1));
    small.summary = "ü".repeat(MAX_SUMMARY_CHARS + 10);
    store.put_cell("s", small, true);
    assert!(store.flush(WAIT));
    let loaded = store.load().unwrap();
    let (stub, small) = (&loaded[0].cells[0], &loaded[0].cells[1]);
    assert!(!stub.replayable);
    assert_eq!(stub.source, json!({"code": "é".repeat(4000)}));
    assert!(small.replayable);
    assert_eq!(small.summary, "ü".repeat(MAX_SUMMARY_CHARS));
}

#[test]
fn an_id_sqlite_cannot_hold_loses_only_its_own_write() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(&config(tmp.path(), "/ws/a"));
    store.put_cell("s", cell(1, None), true);
    store.put_cell("s", cell(u64::MAX, Some(1)), true);
    store.put_cell("s", cell(2, Some(1)), true);
    assert!(store.flush(WAIT));
    let loaded = store.load().unwrap();
    assert_eq!(ids(&loaded[0]), [1, 2]);
    assert_eq!(loaded[0].record.head, Some(2));
}

#[test]
fn delete_session_removes_its_cells() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(&config(tmp.path(), "/ws/a"));
    store.put_session(session("gone"));
    store.put_session(session("kept"));
    store.put_cell("gone", cell(1, None), true);
    store.put_cell("kept", cell(1, None), true);
    store.delete_session("gone");
    assert!(store.flush(WAIT));
    let loaded = store.load().unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].record.name, "kept");
    let conn = Connection::open(store.path()).unwrap();
    let orphans: i64 = conn
        .query_row(
            "SELECT count(*) FROM cells WHERE session = 'gone'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphans, 0);
}

/// The config of a store made for /ws/a in a new directory, then changed
/// behind its back by `sql`.
fn tampered(sql: &str) -> (tempfile::TempDir, StoreConfig) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "/ws/a");
    let path = open(&cfg).path().to_path_buf();
    Connection::open(&path).unwrap().execute(sql, []).unwrap();
    (tmp, cfg)
}

#[test]
fn a_newer_schema_is_refused() {
    let (_tmp, cfg) = tampered("UPDATE meta SET value = 99 WHERE key = 'schema_version'");
    let err = Store::open(&cfg).unwrap_err();
    assert!(
        matches!(err, StoreError::Schema { found: 99, supported } if supported == SUPPORTED_VERSION),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("newer ferrepl") && message.contains("--state-dir"),
        "{message}"
    );
}

#[test]
fn a_store_of_another_workspace_is_refused() {
    let (_tmp, cfg) = tampered("UPDATE meta SET value = X'2f6f74686572' WHERE key = 'workspace'");
    match Store::open(&cfg).unwrap_err() {
        StoreError::WrongWorkspace {
            stored, expected, ..
        } => {
            assert_eq!(stored, Path::new("/other"));
            assert_eq!(expected, Path::new("/ws/a"));
        }
        err => panic!("{err:?}"),
    }
}

#[test]
fn an_unsafe_state_dir_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "/ws/a");
    std::fs::create_dir(&cfg.dir).unwrap();
    std::fs::set_permissions(&cfg.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = Store::open(&cfg).unwrap_err();
    assert!(matches!(err, StoreError::Unsafe(_)), "{err:?}");
    assert!(err.to_string().contains("chmod o-w"), "{err}");
    assert_eq!(
        std::fs::read_dir(&cfg.dir).unwrap().count(),
        0,
        "refused before any file"
    );

    let mut file = config(tmp.path(), "/ws/a");
    file.dir = tmp.path().join("a-file");
    std::fs::write(&file.dir, "").unwrap();
    assert!(matches!(Store::open(&file), Err(StoreError::Unsafe(_))));

    // A state directory swapped for a symbolic link (a session planting one
    // where it could write): refused, nothing created where it points.
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let mut linked = config(tmp.path(), "/ws/a");
    linked.dir = tmp.path().join("linked");
    std::os::unix::fs::symlink(&elsewhere, &linked.dir).unwrap();
    let err = Store::open(&linked).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);

    // Group-writable (a Kubernetes fsGroup volume) is allowed.
    let mut group = config(tmp.path(), "/ws/a");
    group.dir = tmp.path().join("group");
    std::fs::create_dir(&group.dir).unwrap();
    std::fs::set_permissions(&group.dir, std::fs::Permissions::from_mode(0o770)).unwrap();
    assert!(matches!(Store::open(&group), Ok(Opened::Ready(_))));
}

#[test]
fn a_store_file_swapped_for_a_link_is_neither_followed_nor_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "/ws/a");
    std::fs::create_dir(&cfg.dir).unwrap();
    std::fs::set_permissions(&cfg.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let target = tmp.path().join("victim");
    std::fs::write(&target, "keep me").unwrap();
    // An old store's name pointing at a file elsewhere: cleanup must not
    // remove what it points to, nor the link as if it were a store.
    let old = cfg.dir.join("00000000000000aa-local.sqlite3");
    std::os::unix::fs::symlink(&target, &old).unwrap();
    let mut aged = config(tmp.path(), "/ws/a");
    aged.keep = Duration::ZERO;
    let _store = open(&aged);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    // The store itself where a link was planted: refused, not followed.
    let hash = fnv1a(b"/ws/b");
    let planted = cfg.dir.join(format!("{hash:016x}-local.sqlite3"));
    std::os::unix::fs::symlink(&target, &planted).unwrap();
    let err = Store::open(&config(tmp.path(), "/ws/b")).unwrap_err();
    assert!(!matches!(err, StoreError::Schema { .. }), "{err:?}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
}

#[test]
fn an_invalid_principal_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for principal in ["", "../x", "a b", "é", &"p".repeat(65)] {
        let mut cfg = config(tmp.path(), "/ws/a");
        cfg.principal = principal.into();
        let err = Store::open(&cfg).unwrap_err();
        assert!(
            matches!(err, StoreError::Invalid(_)),
            "{principal:?}: {err:?}"
        );
    }
    assert!(
        !tmp.path().join("state").exists(),
        "refused before touching the disk"
    );
}

#[test]
fn writes_queued_before_drop_are_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "/ws/a");
    let store = open(&cfg);
    for id in 1..=200 {
        store.put_cell("s", cell(id, None), true);
    }
    drop(store);
    let loaded = open(&cfg).load().unwrap();
    assert_eq!(loaded[0].cells.len(), 200);
    assert_eq!(loaded[0].record.head, Some(200));
}

#[test]
fn stores_of_other_workspaces_unused_past_keep_are_removed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let old_cfg = config(tmp.path(), "/old/workspace");
    let recent_cfg = config(tmp.path(), "/recent/workspace");
    let (old_path, recent_path) = {
        let old = open(&old_cfg);
        old.put_session(session("s"));
        assert!(old.flush(WAIT));
        let recent = open(&recent_cfg);
        recent.put_session(session("s"));
        assert!(recent.flush(WAIT));
        (old.path().to_path_buf(), recent.path().to_path_buf())
    };
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(40 * 86_400);
    for suffix in ["", "-wal"] {
        let file = with_suffix(&old_path, suffix);
        if let Ok(f) = std::fs::File::options().write(true).open(&file) {
            f.set_modified(long_ago).expect("set mtime");
        }
    }
    let _third = open(&config(tmp.path(), "/third/workspace"));
    assert!(!old_path.exists(), "the unused store was kept");
    assert!(!with_suffix(&old_path, ".lock").exists());
    assert!(recent_path.exists(), "a store in use was removed");
}

#[test]
fn the_store_keeps_to_its_size_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path(), "/ws/size");
    let big = |id| CellRecord {
        source: json!({"code": "x".repeat(100_000 + id as usize)}),
        ..cell(id, None)
    };
    {
        let store = open(&cfg);
        store.put_session(session("old"));
        store.put_cell("old", big(1), true);
        assert!(store.flush(WAIT));
        store.put_session(session("new"));
        store.put_cell("new", big(1), true);
        store.put_cell("new", big(2), true);
        assert!(store.flush(WAIT));
    }
    cfg.max_bytes = 150_000;
    let store = open(&cfg);
    let kept = store.load().unwrap();
    let names: Vec<&str> = kept.iter().map(|s| s.record.name.as_str()).collect();
    assert_eq!(
        names,
        ["new"],
        "the least recently updated session goes first"
    );
    assert_eq!(ids(&kept[0]), [2], "then the last one's oldest cells");
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}
