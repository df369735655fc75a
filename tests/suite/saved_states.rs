//! Saved states (issue 44 §1): a session's variables saved beside the store
//! (`<state-dir>/<store>.states/NAME.state` and `NAME.json`) when it has
//! stayed idle after a cell and when the server shuts down, and loaded into
//! a fresh interpreter by the next server, running no cell: Python (with
//! NumPy and pandas, aliases kept, functions and classes of cells by value,
//! unpicklable variables named), R (data frames, closures, models;
//! connections named), after a SIGKILL (the last saved state, the later
//! cells named), `python_sessions resume`, the refusals of a state saved by
//! another interpreter or with other packages, the files' lifetime (delete,
//! reset, `--state-max-mb`), what a session cannot do to them (forge the
//! bytes of a save, reach the directory), and the dormant line of a fresh
//! default.
//!
//! Every test starts servers on one workspace and state directory (`Place`)
//! in turn; a server is stopped gracefully by closing its stdin (it saves
//! the states of its sessions then) or killed. Waits on the server's own
//! idle saver poll for the file it writes, bounded.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::durable::{Place, assert_dormant, message, state_of};
use crate::support::{StdioServer, ToolOutput, path_str, rich_python_arg};

/// The servers here are given this long to exit after their stdin closes:
/// they save their sessions' states first (at most 20 s in all).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest a session's idle save takes to appear: 10 s idle, a saver
/// that looks every 5 s, and the save itself.
const IDLE_SAVE_TIMEOUT: Duration = Duration::from_secs(30);
/// wait_s of R cells (R starts slowly on a debug build and a busy host).
const R_WAIT_S: f64 = 50.0;

// Place (a workspace and a state directory that outlive the servers of
// a test) is durable.rs's; the saved states' own views of it are here.
impl Place {
    /// A server whose sessions run the interpreter with NumPy and pandas.
    async fn rich_server(&self) -> StdioServer {
        let python = rich_python_arg();
        self.server(&["--python", &python]).await
    }

    /// The states' directory beside the store (`<hash>-<principal>.states`).
    fn states_dir(&self) -> Option<PathBuf> {
        std::fs::read_dir(self.state.path())
            .expect("read the state directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "states"))
    }

    /// Session `name`'s state file and meta file (whether they exist or not).
    fn files(&self, name: &str) -> (PathBuf, PathBuf) {
        let dir = self.states_dir().unwrap_or_else(|| {
            panic!(
                "no states directory in {}: {:?}",
                self.state.path().display(),
                listing(self.state.path())
            )
        });
        (
            dir.join(format!("{name}.state")),
            dir.join(format!("{name}.json")),
        )
    }

    /// Session `name`'s saved meta, if both its files are there.
    fn meta(&self, name: &str) -> Option<Value> {
        let dir = self.states_dir()?;
        if !dir.join(format!("{name}.state")).is_file() {
            return None;
        }
        let text = std::fs::read(dir.join(format!("{name}.json"))).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Session `name`'s saved meta, which must be there.
    fn saved(&self, name: &str) -> Value {
        self.meta(name).unwrap_or_else(|| {
            panic!(
                "no saved state of '{name}': {:?}",
                self.states_dir().map(|d| listing(&d))
            )
        })
    }

    /// Rewrites session `name`'s meta with `edit`.
    fn edit_meta(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        let mut meta = self.saved(name);
        edit(&mut meta);
        let (_, path) = self.files(name);
        std::fs::write(&path, serde_json::to_vec(&meta).expect("meta json")).expect("write meta");
    }

    /// Waits (bounded) for the server's idle saver to save session `name`
    /// after cell `cell`.
    async fn idle_saved(&self, name: &str, cell: u64) -> Value {
        let deadline = Instant::now() + IDLE_SAVE_TIMEOUT;
        loop {
            if let Some(meta) = self.meta(name)
                && meta["cell"] == cell
            {
                return meta;
            }
            assert!(
                Instant::now() < deadline,
                "no state of '{name}' after cell {cell} was saved within {IDLE_SAVE_TIMEOUT:?}: {:?}",
                self.states_dir().map(|d| listing(&d))
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits (bounded) until the store holds `cells` cells of session
    /// `name` with the last as its head: only then does a SIGKILL leave
    /// them stored (the store commits a few milliseconds after a cell).
    async fn stored(&self, name: &str, cells: u64) {
        let db = std::fs::read_dir(self.state.path())
            .expect("read the state directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "sqlite3"))
            .expect("a store in the state directory");
        let deadline = Instant::now() + crate::support::EVENT_TIMEOUT;
        loop {
            let held = rusqlite::Connection::open_with_flags(
                &db,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .and_then(|conn| {
                conn.query_row(
                    "SELECT (SELECT head FROM sessions WHERE name = ?1),
                        (SELECT count(*) FROM cells WHERE session = ?1)",
                    [name],
                    |r| Ok((r.get::<_, Option<u64>>(0)?, r.get::<_, u64>(1)?)),
                )
            });
            if matches!(held, Ok((Some(head), n)) if head == cells && n == cells) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the store does not hold {cells} cells of '{name}': {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The lines of a file of the workspace (none when it is missing).
    fn lines(&self, file: &str) -> Vec<String> {
        std::fs::read_to_string(self.workspace.path().join(file))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }
}

/// The names in a directory, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Stops the server as a client does (stdin closed): it saves its
/// sessions' states, then exits on its own, successfully.
async fn stop(server: StdioServer) {
    let status = server.close_and_wait_at_most(STOP_TIMEOUT).await;
    assert!(status.success(), "the server exited with {status:?}");
}

async fn action(server: &StdioServer, action: &str, session: &str) -> ToolOutput {
    server
        .call(
            "python_sessions",
            json!({"action": action, "session": session}),
        )
        .await
}

/// The one note of `out` that starts with `start`.
fn note_starting(out: &ToolOutput, start: &str) -> String {
    let notes = out.notes();
    let found: Vec<&String> = notes.iter().filter(|n| n.starts_with(start)).collect();
    assert_eq!(found.len(), 1, "one note starting {start:?}: {out:#?}");
    found[0].clone()
}

/// The variable names a meta lists.
fn variables(meta: &Value) -> Vec<&str> {
    meta["variables"]
        .as_array()
        .unwrap_or_else(|| panic!("no variables in {meta:#}"))
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

async fn r_exec_in(server: &StdioServer, session: &str, code: &str) -> ToolOutput {
    server
        .call(
            "r_exec",
            json!({"session": session, "code": code, "wait_s": R_WAIT_S}),
        )
        .await
}

/// The cell of the round trip: every kind of variable issue 44 names, two
/// that cannot be pickled, and a side effect that counts its runs.
const ROUND_TRIP_CELL: &str = "\
import numpy as np
import pandas as pd
x = 41
scale = 3
def f(v):
    return v * scale
g = lambda v: v + 1
class Point:
    def __init__(self, a, b):
        self.a, self.b = a, b
    def total(self):
        return self.a + self.b
p = Point(2, 5)
d = {'k': [1, 2]}
d2 = d
df = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})
arr = np.arange(12).reshape(3, 4)
fh = open('held.txt', 'w')
gen = (i for i in range(3))
with open('side.txt', 'a') as side:
    side.write('ran\\n')
";

/// Python: the variables of a cell come back in a new server without the
/// cell running again; aliases stay one object; what could not be pickled
/// is named.
#[tokio::test]
async fn a_python_session_comes_back_from_its_state_without_running_a_cell() {
    let place = Place::new();
    let first = place.rich_server().await;
    first.exec_in("data", ROUND_TRIP_CELL).await.assert_ok();
    stop(first).await;
    assert_eq!(place.lines("side.txt"), ["ran"]);

    // Saved at shutdown, with what was left out and why.
    let (state, meta_file) = place.files("data");
    assert!(state.is_file() && meta_file.is_file(), "{state:?}");
    let meta = place.saved("data");
    assert_eq!(meta["cell"], 1, "{meta:#}");
    let vars = variables(&meta);
    for name in ["x", "scale", "f", "g", "Point", "p", "d", "d2", "df", "arr"] {
        assert!(vars.contains(&name), "{name} not saved: {meta:#}");
    }
    for name in ["fh", "gen"] {
        assert!(!vars.contains(&name), "{name} listed as saved: {meta:#}");
        assert!(
            meta["skipped"][name]
                .as_str()
                .is_some_and(|w| !w.is_empty()),
            "{name} not named with why: {meta:#}"
        );
    }
    assert!(
        meta["packages"]["pandas"].is_string() && meta["packages"]["numpy"].is_string(),
        "{meta:#}"
    );
    assert!(
        meta["bytes"].as_u64() == std::fs::metadata(&state).ok().map(|m| m.len()),
        "{meta:#}"
    );

    let second = place.rich_server().await;
    assert_eq!(state_of(&second, "data").await, "dormant");
    let out = second
        .exec_in(
            "data",
            "print(x, f(2), g(1), p.total(), type(p) is Point, d is d2, d2['k'])\n\
             print(df.shape, df['b'].tolist(), int(arr.sum()), arr.shape)\n\
             print('fh' in globals(), 'gen' in globals())",
        )
        .await;
    out.assert_ok();
    assert_eq!(
        out.str_field("stdout"),
        "41 6 2 7 True True [1, 2]\n(3, 2) ['x', 'y', 'z'] 66 (3, 4)\nFalse False\n",
        "{out:#?}"
    );
    assert_eq!(out.cell(), 2, "cell numbers go on: {out:#?}");
    let note = note_starting(&out, "Session 'data' was resumed");
    assert!(
        note.starts_with("Session 'data' was resumed from its state saved after cell 1 (")
            && note.contains("; no cell was re-run. Back: ")
            && note.contains("Not saved, so not back (recreate them): ")
            && note.contains("fh (")
            && note.contains("gen (")
            && !note.contains("ran after the save"),
        "{note}"
    );
    assert_eq!(place.lines("side.txt"), ["ran"], "a cell ran again");
    assert_eq!(state_of(&second, "data").await, "idle");

    // Said once: the next result does not repeat it.
    let next = second.exec_in("data", "x + 1").await;
    assert_eq!(next.value(), Some("42"), "{next:#?}");
    assert!(!next.notes_text().contains("resumed"), "{next:#?}");
}

/// A module of the workspace is saved by name: loading imports it again,
/// which runs its top-level code, and the note says so.
#[tokio::test]
async fn a_workspace_module_is_imported_again_and_named() {
    let place = Place::new();
    std::fs::write(
        place.workspace.path().join("helper.py"),
        "with open('imports.txt', 'a') as f:\n    f.write('imported\\n')\n\ndef twice(v):\n    return 2 * v\n",
    )
    .expect("write helper.py");
    let first = place.server(&[]).await;
    first
        .exec_in("data", "import helper\nh = helper.twice\nr = h(4)")
        .await
        .assert_ok();
    stop(first).await;
    assert_eq!(place.lines("imports.txt"), ["imported"]);

    let second = place.server(&[]).await;
    let out = second.exec_in("data", "(h(5), r, helper.twice(1))").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("(10, 8, 2)"), "{out:#?}");
    let note = note_starting(&out, "Session 'data' was resumed");
    assert!(
        note.contains("no cell was re-run")
            && note.contains(
                "Modules of the workspace were imported again, running their top-level code: helper."
            ),
        "{note}"
    );
    assert_eq!(
        place.lines("imports.txt"),
        ["imported", "imported"],
        "the load imports the module once"
    );
}

/// A function defined in a cell reads the session's globals as they are
/// when it is called, after a resume as before it.
#[tokio::test]
async fn a_resumed_function_still_reads_the_sessions_globals() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first
        .exec_in(
            "data",
            "scale = 3\ndef f(v):\n    return v * scale\ndef h():\n    return later",
        )
        .await
        .assert_ok();
    stop(first).await;
    let second = place.server(&[]).await;
    let out = second
        .exec_in("data", "scale = 10\nlater = 'set after'\n(f(2), h())")
        .await;
    out.assert_ok();
    assert!(out.notes_text().contains("was resumed"), "{out:#?}");
    assert_eq!(out.value(), Some("(20, 'set after')"), "{out:#?}");
}

/// Saved while idle, then the server is killed after one more cell: the
/// next server loads the state of the saved cell and names the later one.
#[tokio::test]
async fn after_a_sigkill_the_idle_save_comes_back_and_later_cells_are_named() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first
        .exec_in("data", "x = 'saved'\nopen('side.txt', 'a').write('one\\n')")
        .await
        .assert_ok();
    let meta = place.idle_saved("data", 1).await;
    assert!(variables(&meta).contains(&"x"), "{meta:#}");
    first
        .exec_in("data", "x = 'after'\nopen('side.txt', 'a').write('two\\n')")
        .await
        .assert_ok();
    place.stored("data", 2).await;
    first.sigkill_and_reap(crate::support::EXIT_TIMEOUT).await;
    assert_eq!(
        place.saved("data")["cell"],
        1,
        "saved again before the kill"
    );

    let second = place.server(&[]).await;
    let out = second.exec_in("data", "x").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("'saved'"), "{out:#?}");
    let note = note_starting(&out, "Session 'data' was resumed");
    assert!(
        note.starts_with("Session 'data' was resumed from its state saved after cell 1 (")
            && note.contains("no cell was re-run")
            && note.contains("Cells 2 ran after the save"),
        "{note}"
    );
    assert_eq!(place.lines("side.txt"), ["one", "two"], "a cell ran again");
    assert_eq!(out.cell(), 3, "{out:#?}");
}

/// python_sessions resume loads the state and says so in its message; a
/// session that is not dormant is not resumed again.
#[tokio::test]
async fn resume_loads_the_state_and_says_so_once() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec_in("data", "kept = [1, 2, 3]").await.assert_ok();
    stop(first).await;

    let second = place.server(&[]).await;
    assert_eq!(state_of(&second, "data").await, "dormant");
    let resumed = action(&second, "resume", "data").await;
    let said = message(&resumed);
    assert!(
        said.starts_with("Session 'data' was resumed from its state saved after cell 1 (")
            && said.contains("no cell was re-run. Back: kept."),
        "{resumed:#?}"
    );
    assert_eq!(state_of(&second, "data").await, "idle");

    let again = action(&second, "resume", "data").await;
    assert!(
        again.is_error && again.text.contains("session 'data' is not dormant"),
        "{again:#?}"
    );
    let out = second.exec_in("data", "sum(kept)").await;
    assert_eq!(out.value(), Some("6"), "{out:#?}");
    assert!(
        !out.notes_text().contains("resumed"),
        "the resume said it already: {out:#?}"
    );
}

/// A state whose meta says another Python saved it is refused before
/// anything is loaded; the session stays dormant and a rebuild still works.
#[tokio::test]
async fn a_state_saved_by_another_python_is_refused_and_nothing_runs() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec_in("data", "x = 5").await.assert_ok();
    stop(first).await;
    let real = place.saved("data")["version"]
        .as_str()
        .expect("version in the meta")
        .to_string();
    assert!(real.starts_with("3."), "{real}");
    place.edit_meta("data", |m| m["version"] = json!("2.7.18"));

    let second = place.server(&[]).await;
    let refused = second
        .exec_in("data", "open('ran.txt', 'a').write('ran\\n')\nx")
        .await;
    assert!(refused.is_error, "{refused:#?}");
    assert!(
        refused.text.contains("session 'data' is dormant")
            && refused.text.contains("2.7.18")
            && refused.text.contains(&real)
            && refused.text.contains("Nothing was run")
            && refused.text.contains(r#""action": "rebuild""#),
        "{refused:#?}"
    );
    assert!(place.lines("ran.txt").is_empty(), "the refused code ran");
    assert_eq!(state_of(&second, "data").await, "dormant");
    // The same through resume.
    let resumed = action(&second, "resume", "data").await;
    assert!(
        resumed.is_error && resumed.text.contains("2.7.18"),
        "{resumed:#?}"
    );
    assert_eq!(state_of(&second, "data").await, "dormant");

    let rebuilt = second
        .call(
            "python_sessions",
            json!({"action": "rebuild", "session": "data", "confirm": true}),
        )
        .await;
    assert!(
        message(&rebuilt).contains("was rebuilt by re-running cells 1 "),
        "{rebuilt:#?}"
    );
    let out = second.exec_in("data", "x").await;
    assert_eq!(out.value(), Some("5"), "{out:#?}");
    assert!(place.lines("ran.txt").is_empty());
}

/// A state saved with other versions of the packages it imported is
/// refused by the driver before it unpickles anything.
#[tokio::test]
async fn a_state_saved_with_other_package_versions_is_refused() {
    let place = Place::new();
    let first = place.rich_server().await;
    first
        .exec_in(
            "frames",
            "import pandas as pd\ndf = pd.DataFrame({'a': [1]})",
        )
        .await
        .assert_ok();
    stop(first).await;
    let here = place.saved("frames")["packages"]["pandas"]
        .as_str()
        .unwrap_or_else(|| panic!("pandas not in the meta: {:#}", place.saved("frames")))
        .to_string();
    place.edit_meta("frames", |m| m["packages"] = json!({"pandas": "0.0.1"}));

    let second = place.rich_server().await;
    let refused = second
        .exec_in("frames", "open('ran.txt', 'a').write('ran\\n')\ndf")
        .await;
    assert!(refused.is_error, "{refused:#?}");
    assert!(
        refused.text.contains("session 'frames' is dormant")
            && refused.text.contains(&format!("pandas 0.0.1, here {here}"))
            && refused.text.contains("Nothing was run"),
        "{refused:#?}"
    );
    assert!(place.lines("ran.txt").is_empty(), "the refused code ran");
    assert_eq!(state_of(&second, "frames").await, "dormant");
}

/// R: a data frame, a closure with its environment and an lm model come
/// back; a connection is named as not saved.
#[tokio::test]
async fn an_r_session_comes_back_from_its_state() {
    let place = Place::new();
    let first = place.server(&["--languages", "python,r"]).await;
    let set = r_exec_in(
        &first,
        "stats",
        "df <- data.frame(a = 1:5, b = c(2.1, 3.9, 6.2, 7.8, 10.1))\n\
         make_counter <- function() { n <- 0; function() { n <<- n + 1; n } }\n\
         counter <- make_counter(); invisible(counter()); invisible(counter())\n\
         fit <- lm(b ~ a, data = df)\n\
         con <- file('held.txt', 'w')\n\
         cat('ran\\n', file = 'side.txt', append = TRUE)",
    )
    .await;
    set.assert_ok();
    stop(first).await;
    let meta = place.saved("stats");
    assert!(
        meta["skipped"]["con"]
            .as_str()
            .is_some_and(|w| w.contains("connection")),
        "{meta:#}"
    );

    let second = place.server(&["--languages", "python,r"]).await;
    let out = r_exec_in(
        &second,
        "stats",
        "cat(nrow(df), counter(), round(coef(fit)[['a']], 2), class(fit), exists('con'), '\\n')",
    )
    .await;
    out.assert_ok();
    assert!(
        out.str_field("stdout").contains("5 3 1.99 lm FALSE"),
        "{out:#?}"
    );
    let note = note_starting(&out, "Session 'stats' was resumed");
    assert!(
        note.contains("no cell was re-run")
            && note.contains("Not saved, so not back (recreate them): con (a connection"),
        "{note}"
    );
    assert_eq!(place.lines("side.txt"), ["ran"], "a cell ran again");
}

/// Deleting a session removes its saved state; resetting one does too.
#[tokio::test]
async fn delete_and_reset_remove_the_saved_state() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec_in("gone", "a = 1").await.assert_ok();
    first.exec_in("fresh", "b = 2").await.assert_ok();
    stop(first).await;
    for name in ["gone", "fresh"] {
        place.saved(name);
    }

    let second = place.server(&[]).await;
    let deleted = action(&second, "delete", "gone").await;
    assert!(!deleted.is_error, "{deleted:#?}");
    let (state, meta) = place.files("gone");
    assert!(!state.exists() && !meta.exists(), "{state:?} is left");

    let reset = action(&second, "reset", "fresh").await;
    assert!(!reset.is_error, "{reset:#?}");
    let (state, meta) = place.files("fresh");
    assert!(!state.exists() && !meta.exists(), "{state:?} is left");
    let out = second.exec_in("fresh", "'b' in globals()").await;
    assert_eq!(out.value(), Some("False"), "{out:#?}");
    assert!(!out.notes_text().contains("resumed"), "{out:#?}");
    stop(second).await;

    // Nothing brings 'gone' back; 'fresh' comes back as it was after the
    // reset (its one new cell), without the variable of before.
    assert!(place.meta("gone").is_none());
    let meta = place.saved("fresh");
    assert!(!variables(&meta).contains(&"b"), "{meta:#}");
    let third = place.server(&[]).await;
    let rows = third.sessions().await;
    assert!(!rows.iter().any(|r| r["name"] == "gone"), "{rows:#?}");
    let out = third.exec_in("fresh", "'b' in globals()").await;
    assert_eq!(out.value(), Some("False"), "{out:#?}");
}

/// A state over --state-max-mb is not saved; nothing breaks, and the
/// session comes back dormant without a state.
#[tokio::test]
async fn a_state_over_the_cap_is_not_saved() {
    let place = Place::new();
    let mut first = place.server(&["--state-max-mb", "1"]).await;
    first
        .exec_in("big", "b = bytes(3_000_000)")
        .await
        .assert_ok();
    first.exec_in("small", "s = 'fits'").await.assert_ok();
    // Drained (SIGTERM): the server saves, says why one state was not
    // saved, and exits cleanly.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(first.pid()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM the server");
    assert!(
        first
            .wait_stderr_contains("(--state-max-mb)", STOP_TIMEOUT)
            .await,
        "{}",
        first.stderr_log()
    );
    let status = tokio::time::timeout(STOP_TIMEOUT, first.child.wait())
        .await
        .expect("the drained server exits")
        .expect("wait for the server");
    assert!(status.success(), "{status:?}: {}", first.stderr_log());
    let log = first.stderr_log();
    let said = log
        .lines()
        .find(|l| l.contains("(--state-max-mb)"))
        .unwrap_or_default();
    assert!(
        said.contains("big") && said.contains("not saved"),
        "the log does not name the session: {log}"
    );
    assert!(place.meta("big").is_none(), "a state over the cap was kept");
    if let Some(dir) = place.states_dir() {
        assert!(
            !listing(&dir).iter().any(|n| n.starts_with("big.")),
            "{:?}",
            listing(&dir)
        );
    }
    place.saved("small");

    let second = place.server(&["--state-max-mb", "1"]).await;
    let out = second.exec_in("big", "len(b)").await;
    assert_dormant(&out, "big", "1");
    let small = second.exec_in("small", "s").await;
    assert_eq!(small.value(), Some("'fits'"), "{small:#?}");
}

/// Of two states that do not fit in --state-max-mb together, the one
/// saved first goes; its session comes back dormant without a state.
#[tokio::test]
async fn the_least_recently_saved_state_goes_first_within_the_cap() {
    let place = Place::new();
    let first = place.server(&["--state-max-mb", "1"]).await;
    first
        .exec_in("older", "v = bytes(600_000)")
        .await
        .assert_ok();
    place.idle_saved("older", 1).await;
    first
        .exec_in("newer", "w = bytes(600_000)")
        .await
        .assert_ok();
    place.idle_saved("newer", 1).await;
    assert!(
        place.meta("older").is_none(),
        "both kept, over the cap: {:?}",
        place.states_dir().map(|d| listing(&d))
    );
    stop(first).await;

    let second = place.server(&["--state-max-mb", "1"]).await;
    let out = second.exec_in("newer", "len(w)").await;
    assert_eq!(out.value(), Some("600000"), "{out:#?}");
    let out = second.exec_in("older", "len(v)").await;
    assert_dormant(&out, "older", "1");
}

/// A state file that was damaged (cut short, overwritten) is refused when
/// loaded; the session stays dormant and the server goes on.
#[tokio::test]
async fn a_damaged_state_is_refused_and_the_server_goes_on() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec_in("data", "x = 5").await.assert_ok();
    stop(first).await;
    let (state, _) = place.files("data");
    let mut bytes = std::fs::read(&state).expect("the saved state");
    let header_end = bytes
        .iter()
        .position(|b| *b == b'\n')
        .expect("a header line")
        + 1;
    // The header kept, the pickle garbled.
    for b in &mut bytes[header_end..] {
        *b = b'!';
    }
    std::fs::write(&state, &bytes).expect("damage the state");

    let mut second = place.server(&[]).await;
    let refused = second.exec_in("data", "x").await;
    assert!(refused.is_error, "{refused:#?}");
    assert!(
        refused.text.contains("session 'data' is dormant")
            && refused.text.contains("its saved state could not be loaded")
            && refused.text.contains("Nothing was run"),
        "{refused:#?}"
    );
    second.assert_alive();
    assert_eq!(state_of(&second, "data").await, "dormant");
    let other = second.exec("1 + 1").await;
    assert_eq!(other.value(), Some("2"), "{other:#?}");
}

/// A session ended for --session-ttl keeps its state: its name brings it
/// back in the same server, resumed, with no cell re-run.
#[tokio::test]
async fn a_session_ended_by_its_ttl_comes_back_from_its_state() {
    let place = Place::new();
    let server = place.server(&["--session-ttl", "3"]).await;
    server
        .exec_in("data", "x = 'kept'\nopen('side.txt', 'a').write('ran\\n')")
        .await
        .assert_ok();
    // Ended by the reaper, saved first.
    let deadline = Instant::now() + IDLE_SAVE_TIMEOUT;
    loop {
        let rows = server.sessions().await;
        let live = rows
            .iter()
            .any(|r| r["name"] == "data" && r["state"] != "dormant");
        if !live && place.meta("data").is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ended and saved within {IDLE_SAVE_TIMEOUT:?}: {rows:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let out = server.exec_in("data", "x").await;
    out.assert_ok();
    assert_eq!(out.value(), Some("'kept'"), "{out:#?}");
    assert!(
        out.notes_text()
            .contains("Session 'data' was resumed from its state saved after cell 1 ("),
        "{out:#?}"
    );
    assert_eq!(place.lines("side.txt"), ["ran"], "a cell ran again");
}

/// A cell that writes a forged `state_data` event on its control socket
/// changes nothing: no state is written from it, the session goes on in
/// step with the server, and its real state is saved later.
#[tokio::test]
async fn a_forged_state_event_writes_nothing() {
    let place = Place::new();
    let mut first = place.server(&[]).await;
    first.exec_in("data", "x = 7").await.assert_ok();
    let forged = first
        .exec_in(
            "data",
            "import os\nos.write(3, b'{\"ev\":\"state_data\",\"id\":1,\"bytes\":5}\\n12345')",
        )
        .await;
    forged.assert_ok();
    let after = first.exec_in("data", "x * 6").await;
    assert_eq!(after.value(), Some("42"), "{after:#?}");
    first.assert_alive();
    let dir = place.states_dir().expect("a states directory");
    assert!(listing(&dir).is_empty(), "{:?}", listing(&dir));
    stop(first).await;

    // The real state is saved at shutdown, and loads.
    let second = place.server(&[]).await;
    let out = second.exec_in("data", "x").await;
    assert_eq!(out.value(), Some("7"), "{out:#?}");
    assert!(out.notes_text().contains("was resumed"), "{out:#?}");
}

/// The states' directory is out of the sessions' view: a cell can neither
/// read a saved state nor put a file there.
#[tokio::test]
async fn a_session_cannot_reach_the_saved_states() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec_in("data", "secret = 'saved'").await.assert_ok();
    stop(first).await;
    let (state, _) = place.files("data");
    let dir = state.parent().expect("states dir").to_path_buf();
    let before = std::fs::read(&state).expect("the saved state");

    let second = place.server(&[]).await;
    let code = format!(
        "out = []\n\
         for what, act in [('read', lambda: open({state:?}, 'rb').read()),\n\
         ('list', lambda: os.listdir({dir:?})),\n\
         ('write', lambda: open({evil:?}, 'wb').write(b'x')),\n\
         ('replace', lambda: open({state:?}, 'wb').write(b'x'))]:\n\
         \x20   try:\n\
         \x20       act()\n\
         \x20       out.append(what + ' done')\n\
         \x20   except OSError as e:\n\
         \x20       out.append(what + ' refused')\n\
         out",
        state = path_str(&state),
        dir = path_str(&dir),
        evil = path_str(&dir.join("evil.state")),
    );
    let out = second.exec(&format!("import os\n{code}")).await;
    out.assert_ok();
    assert_eq!(
        out.value(),
        Some("['read refused', 'list refused', 'write refused', 'replace refused']"),
        "{out:#?}"
    );
    assert!(!dir.join("evil.state").exists());
    assert_eq!(std::fs::read(&state).expect("the saved state"), before);
    let back = second.exec_in("data", "secret").await;
    assert_eq!(back.value(), Some("'saved'"), "{back:#?}");
}

/// The states' directory swapped for a symlink while the server runs: the
/// server saves into the directory it opened, never through the link.
#[tokio::test]
async fn a_states_directory_swapped_for_a_symlink_redirects_nothing() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first.exec_in("data", "x = 1").await.assert_ok();
    let dir = place.states_dir().expect("a states directory");
    let moved = dir.with_extension("moved");
    let elsewhere = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("elsewhere");
    std::fs::rename(&dir, &moved).expect("move the states directory");
    std::os::unix::fs::symlink(elsewhere.path(), &dir).expect("symlink");
    stop(first).await;
    assert!(
        listing(elsewhere.path()).is_empty(),
        "written through the link: {:?}",
        listing(elsewhere.path())
    );
    assert!(
        moved.join("data.state").is_file() && moved.join("data.json").is_file(),
        "{:?}",
        listing(&moved)
    );
}

/// The first result of a fresh default names the dormant sessions: a
/// saved one with its age, variables and size, an unsaved one with its
/// cells.
#[tokio::test]
async fn the_dormant_line_names_saved_sessions_with_their_variables() {
    let place = Place::new();
    let first = place.server(&[]).await;
    first
        .exec_in("data", "a = 1\nb = 'two'\nc = [3]")
        .await
        .assert_ok();
    first.exec_in("lost", "z = 0").await.assert_ok();
    stop(first).await;
    let meta = place.saved("data");
    assert_eq!(variables(&meta), ["a", "b", "c"], "{meta:#}");
    let (state, json_file) = place.files("lost");
    std::fs::remove_file(state).expect("remove lost's state");
    std::fs::remove_file(json_file).expect("remove lost's meta");

    let second = place.server(&[]).await;
    let out = second.exec("1 + 1").await;
    out.assert_ok();
    let line = note_starting(&out, "Dormant: ");
    assert!(line.chars().count() <= 200, "{line}");
    assert!(
        line.contains("data (saved ")
            && line.contains(" s ago, 3 vars, ")
            && line.contains("lost (1 cell, not saved)")
            && line.ends_with("Name one to resume it; unsaved ones: python_sessions rebuild."),
        "{line}"
    );
}
