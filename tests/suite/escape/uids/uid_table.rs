//! The host's uid table: instances never share a uid, a full range refuses
//! the next, and a table that is not root's alone is refused.

use std::os::unix::fs::PermissionsExt;

use serde_json::json;

use crate::support::{Launch, StdioServer, is_root, own_uid, path_str, test_uid_table};

use super::*;

/// The uid the default session of `server` runs as (checked from the host).
async fn session_uid(server: &StdioServer) -> u32 {
    let (seen, _) = seen_in(server.peer(), "default", "").await;
    assert_runs_as(seen.host_pid, seen.uid, "the session's interpreter");
    seen.uid
}

/// Attack: every project's root server ran its sessions as the same uid
/// (kept per state directory as "*", the default state directory shared by
/// all), so one project's session used up the uid's inotify instances and
/// processes and another's got EMFILE. Claim: root instances on other
/// projects, other state directories, or another project under the same
/// state directory never share a uid; each gets its own back after a
/// restart with --resume off (in the other order), kept in the host's table
/// under its (state directory, workspace). Unprivileged: all run as the
/// server's uid, and no table is kept.
#[tokio::test]
async fn instances_on_a_host_never_share_a_uid_and_keep_theirs_without_resume() {
    let range = "3100100-3100109";
    let (a, b) = (Place::new(), Place::new());
    // c: another project under a's state directory.
    let c_ws = tempfile::tempdir().expect("c's workspace");
    let instances = [
        (a.ws(), a.state.path()),
        (b.ws(), b.state.path()),
        (c_ws.path(), a.state.path()),
    ];
    let start = |i: usize| {
        let (ws, state) = instances[i];
        StdioServer::launch(launch_at(ws, state, range, &["--resume", "off"]))
    };
    let mut first = Vec::new();
    for i in 0..3 {
        let server = start(i).await;
        first.push(session_uid(&server).await);
        server.close_and_wait().await;
    }
    let mut again = vec![0; 3];
    for i in (0..3).rev() {
        let server = start(i).await;
        again[i] = session_uid(&server).await;
        server.close_and_wait().await;
    }
    assert_eq!(again, first, "each instance gets its own uid back");
    if is_root() {
        assert!(
            first[0] != first[1] && first[1] != first[2] && first[0] != first[2],
            "three instances, three uids: {first:?}"
        );
        for (i, (ws, state)) in instances.iter().enumerate() {
            assert_in_range(first[i], range);
            let keys = uid_entries(ws, state);
            assert_eq!(keys.get("*"), Some(&json!(first[i])), "{keys:?}");
            assert_eq!(keys.len(), 1, "{keys:?}");
        }
    } else {
        assert_eq!(first, vec![own_uid(); 3]);
        assert!(uid_entries(a.ws(), a.state.path()).is_empty());
    }
}

/// Claim: when every uid of --tenant-uids is held by an instance whose
/// workspace exists, the next instance refuses to start, naming the table
/// and how to prune it; once the holder has exited and its workspace is
/// gone, its uid is free again and the next instance starts on it.
/// Unprivileged: no table, both start.
#[tokio::test]
async fn a_full_range_refuses_the_next_instance_until_a_holder_is_gone() {
    let range = "3100110-3100110";
    let holder_place = Place::new();
    let holder = StdioServer::launch(holder_place.launch(range, &[])).await;
    let held = session_uid(&holder).await;
    let other = Place::new();
    if is_root() {
        assert_eq!(held, 3100110);
        let stderr = refused_start_with(
            &[
                "--state-dir",
                path_str(other.state.path()),
                "--tenant-uids",
                range,
            ],
            &[],
            &[],
        )
        .await;
        let table = test_uid_table().display().to_string();
        assert!(
            stderr.contains("no free uid left in --tenant-uids 3100110-3100110")
                && stderr.contains(&table)
                && stderr.contains("remove the entries")
                && stderr.contains("wider --tenant-uids"),
            "{stderr}"
        );
    }
    holder.close_and_wait().await;
    drop(holder_place);
    let next = StdioServer::launch(other.launch(range, &[])).await;
    let uid = session_uid(&next).await;
    if is_root() {
        assert_eq!(uid, held, "the gone workspace's uid is given again");
        assert_eq!(other.uid_table().get("*"), Some(&json!(uid)));
    } else {
        assert_eq!(uid, own_uid());
    }
}

/// Attack: a table someone else can write would let them give two
/// instances (two tenants) one uid. Claim: a root server refuses a table
/// whose directory is another user's, or a table file writable by others,
/// naming it; an unprivileged server keeps no table and ignores the
/// setting.
#[tokio::test]
async fn a_uid_table_that_is_not_roots_alone_is_refused() {
    let dir = tempfile::tempdir().expect("a directory");
    let table = dir.path().join("uids.json");
    if !is_root() {
        let server = StdioServer::launch(
            Launch::new(&["--warm-pool", "0"]).env("FERREPL_UID_TABLE", &table),
        )
        .await;
        assert_eq!(session_uid(&server).await, own_uid());
        assert!(!table.exists());
        return;
    }
    std::os::unix::fs::chown(dir.path(), Some(OWNER), Some(OWNER)).expect("chown");
    let env = [("FERREPL_UID_TABLE", table.as_os_str())];
    let stderr = refused_start_with(&["--warm-pool", "0"], &env, &[]).await;
    assert!(
        stderr.contains(&dir.path().display().to_string())
            && stderr.contains(&format!("uid {OWNER}"))
            && stderr.contains("--uid-table"),
        "{stderr}"
    );
    std::os::unix::fs::chown(dir.path(), Some(0), Some(0)).expect("chown");
    std::fs::write(&table, "{\"version\": 1, \"entries\": []}").expect("write");
    std::fs::set_permissions(&table, PermissionsExt::from_mode(0o666)).expect("chmod");
    let stderr = refused_start_with(&["--warm-pool", "0"], &env, &[]).await;
    assert!(
        stderr.contains(&table.display().to_string()) && stderr.contains("mode 666"),
        "{stderr}"
    );
}
