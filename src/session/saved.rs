//! Saved states (issue 44 §1): a Python session's variables, pickled by its
//! driver, kept as a file beside the store, so that a dormant session comes
//! back without re-running a cell.
//!
//! When: after a session has stayed idle for [`IDLE_BEFORE_SAVE`] since a
//! cell finished (the save runs in the interpreter, between cells: a call
//! that comes meanwhile waits for it), when it ends for `--session-ttl`,
//! and when the server shuts down. Where: `<store>.states/NAME.state` (the
//! driver's bytes) and `NAME.json` (what the server needs: the cell the
//! state is after, the interpreter's version, the packages imported, what
//! was left out). Bounded: one state, and all of a store's together, fit
//! in `--state-max-mb` (a budget of their own, apart from the store's);
//! the least recently saved go first.
//!
//! Loading: a call that names a dormant session with a saved state, or
//! python_sessions resume, starts a fresh interpreter and loads it: no cell
//! runs. The first result says what came back and what did not.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::durable::refused;
use super::error::SessionError;
use super::lifecycle::Pending;
use super::lineage::ranges;
use super::manager::SessionManager;
use super::state::Session;
use super::valid_name;

/// A session idle this long after its last cell gets its state saved.
pub const IDLE_BEFORE_SAVE: Duration = Duration::from_secs(10);
/// How often the saver looks for such sessions.
const SAVER_EVERY: Duration = Duration::from_secs(5);
/// Longest a save or a load may take.
const STATE_TIMEOUT: Duration = Duration::from_secs(600);
/// Saves at shutdown stop after this long in all.
const SHUTDOWN_SAVES: Duration = Duration::from_secs(20);
/// A meta file larger than this is not read.
const MAX_META_BYTES: u64 = 1 << 20;

/// What the server keeps about a saved state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SavedMeta {
    /// The cell the state is after (the driver's last cell).
    pub cell: u64,
    pub saved_unix: f64,
    /// The interpreter's version (Python's or R's).
    #[serde(alias = "python")]
    pub version: String,
    pub variables: Vec<String>,
    /// Left out, with why.
    pub skipped: BTreeMap<String, String>,
    /// Distributions of the modules imported, with their versions.
    pub packages: BTreeMap<String, String>,
    pub bytes: u64,
    pub seconds: f64,
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// `a, b, c and 4 more`.
fn some_names(names: &[String], most: usize) -> String {
    let shown: Vec<&str> = names.iter().take(most).map(String::as_str).collect();
    let mut text = shown.join(", ");
    if names.len() > most {
        text.push_str(&format!(" and {} more", names.len() - most));
    }
    text
}

pub(super) fn age(saved_unix: f64) -> String {
    let secs = (now_unix() - saved_unix).max(0.0);
    match secs {
        s if s < 120.0 => format!("{s:.0} s ago"),
        s if s < 7200.0 => format!("{:.0} min ago", s / 60.0),
        s if s < 172_800.0 => format!("{:.0} h ago", s / 3600.0),
        s => format!("{:.0} days ago", s / 86400.0),
    }
}

/// A dormant session without a state to load runs nothing until the agent
/// chooses: its cells are re-run only by a confirmed rebuild (nothing runs
/// twice by itself). `why`: why its saved state could not be loaded.
fn dormant_message(sess: &Session, why: Option<String>) -> String {
    let st = sess.lock();
    let ids: Vec<u64> = st.lineage.path().iter().map(|c| c.id).collect();
    let kept = match why {
        Some(why) => format!("their history is kept, and {why}"),
        None => "their history is kept, their variables are not".to_string(),
    };
    format!(
        "session '{name}' is dormant: an earlier server ran cells {cells} in it; {kept}. Nothing was run. python_sessions {{\"action\": \"rebuild\", \"session\": \"{name}\"}} shows what re-running them would do; {{\"action\": \"reset\"}} starts it afresh; or use another session",
        name = sess.name,
        cells = ranges(&ids),
    )
}

/// The file names of session `name`'s state and its meta.
fn names(name: &str) -> Option<(String, String)> {
    valid_name(name).then(|| (format!("{name}.state"), format!("{name}.json")))
}

impl SessionManager {
    /// The states' directory and session `name`'s file names in it.
    fn state_files(&self, name: &str) -> Option<(&crate::store::StatesDir, String, String)> {
        let dir = self.durable.states.as_deref()?;
        let (data, meta) = names(name)?;
        Some((dir, data, meta))
    }

    /// The saved state of session `name`, if there is one.
    pub(super) fn saved_meta(&self, name: &str) -> Option<SavedMeta> {
        let (dir, data, meta) = self.state_files(name)?;
        let file = dir.open(&meta).ok()?;
        if file.metadata().ok()?.len() > MAX_META_BYTES || dir.open(&data).is_err() {
            return None;
        }
        serde_json::from_reader(std::io::BufReader::new(file)).ok()
    }

    /// Removes session `name`'s saved state (deleted, or reset: the state
    /// is no longer the session's).
    pub(super) fn forget_state(&self, name: &str) {
        if let Some((dir, data, meta)) = self.state_files(name) {
            dir.remove(&data);
            dir.remove(&meta);
        }
    }

    /// The state follows its session to a new name.
    pub(super) fn rename_state(&self, from: &str, to: &str) {
        if let (Some((dir, d1, m1)), Some((d2, m2))) = (self.state_files(from), names(to)) {
            let _ = dir.rename(&d1, &d2);
            let _ = dir.rename(&m1, &m2);
        }
    }

    /// Saves the session's state if it changed since the last save and its
    /// interpreter is idle: what was saved, None when there was nothing to
    /// save. Holds the session's start lock: no cell starts meanwhile.
    /// Every file is reached through the states' directory descriptor.
    pub(super) async fn save_state(
        &self,
        sess: &Arc<Session>,
    ) -> Result<Option<SavedMeta>, String> {
        let Some((dir, data, meta_name)) = self.state_files(&sess.name) else {
            return Ok(None);
        };
        if sess.kernel().is_some() {
            // A kernel cannot hand its variables over: nothing to save.
            return Ok(None);
        }
        let _guard = sess.start_lock.lock().await;
        let worker = {
            let st = sess.lock();
            let idle = st.inbox.running.is_none() && st.lifecycle.holds();
            let changed =
                st.lifecycle.saved_cell() != Some(st.inbox.last()) && !st.lineage.path().is_empty();
            match &st.worker {
                Some(w) if idle && changed && w.exit_info().is_none() => w.clone(),
                _ => return Ok(None),
            }
        };
        let shown = |name: &str| dir.shown().join(name).display().to_string();
        let partial = format!("{data}.partial");
        let file = dir
            .create(&partial)
            .map_err(|e| format!("{}: {e}", shown(&partial)))?;
        let cap = self.durable.state_cap;
        let saved = worker
            .save_state(tokio::fs::File::from_std(file), cap, STATE_TIMEOUT)
            .await;
        let (reply, written) = match saved {
            Ok(r) => r,
            Err(e) => {
                dir.remove(&partial);
                return Err(e.to_string());
            }
        };
        let cell = reply
            .get("cell")
            .and_then(Value::as_u64)
            .unwrap_or_else(|| sess.lock().inbox.last());
        let meta = SavedMeta {
            cell,
            saved_unix: now_unix(),
            version: reply
                .get("version")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            variables: strings(reply.get("variables")),
            skipped: string_map(reply.get("skipped")),
            packages: string_map(reply.get("packages")),
            bytes: written,
            seconds: reply.get("seconds").and_then(Value::as_f64).unwrap_or(0.0),
        };
        let json = serde_json::to_vec(&meta).map_err(|e| e.to_string())?;
        let meta_partial = format!("{meta_name}.partial");
        let written = (|| -> std::io::Result<()> {
            use std::io::Write;
            let mut f = dir.create(&meta_partial)?;
            f.write_all(&json)?;
            f.sync_all()?;
            dir.rename(&partial, &data)?;
            dir.rename(&meta_partial, &meta_name)
        })();
        if let Err(e) = written {
            dir.remove(&partial);
            dir.remove(&meta_partial);
            return Err(format!("{}: {e}", shown(&data)));
        }
        sess.lock().lifecycle.set_saved_cell(cell);
        prune_states(dir, cap, &data);
        tracing::debug!(session = %sess.name, bytes = meta.bytes, "state saved");
        Ok(Some(meta))
    }

    /// A dormant session with a saved state comes back by loading it into
    /// a fresh interpreter; no cell runs. The note for its first result.
    pub(super) async fn resume_saved(
        self: &Arc<Self>,
        sess: &Arc<Session>,
    ) -> Result<String, SessionError> {
        // Its settings are checked before any interpreter starts for it.
        refused(sess)?;
        if let Some(kernel) = sess.kernel() {
            // A kernel saves nothing: a fresh one (`kernel_restart.rs`).
            let kernel = kernel.to_string();
            return self.wake_kernel(sess, &kernel).await;
        }
        let dormant_error = |why: Option<String>| SessionError::Invalid(dormant_message(sess, why));
        let Some(meta) = self.saved_meta(&sess.name) else {
            return Err(dormant_error(None));
        };
        let Some((dir, data, _)) = self.state_files(&sess.name) else {
            return Err(dormant_error(None));
        };
        let file = match dir.open(&data) {
            Ok(f) => tokio::fs::File::from_std(f),
            Err(e) => {
                return Err(dormant_error(Some(format!(
                    "its saved state cannot be read: {e}"
                ))));
            }
        };
        let worker = self.ensure_worker(sess).await?;
        let _guard = sess.start_lock.lock().await;
        if sess.lock().lifecycle.pending() != Some(Pending::Dormant) {
            // Another call resumed it meanwhile.
            return Ok(String::new());
        }
        let version = worker
            .ready_info()
            .map(|r| r.python_version)
            .unwrap_or_default();
        if !version.is_empty() && version != meta.version {
            let lang = sess.language;
            return Err(dormant_error(Some(format!(
                "its state was saved by {lang} {}, and its interpreter is now {lang} {version}",
                meta.version
            ))));
        }
        let loaded = worker.load_state(file, &meta.packages, STATE_TIMEOUT).await;
        let reply = match loaded {
            Ok(r) => r,
            Err(e) => {
                // Whatever it loaded is not the session's: a fresh one next.
                // (The lock is let go before the message takes it again.)
                let old = sess.lock().worker.take();
                if let Some(w) = old {
                    w.kill();
                }
                return Err(dormant_error(Some(format!(
                    "its saved state could not be loaded: {e}"
                ))));
            }
        };
        let mut st = sess.lock();
        st.lifecycle.clear_pending();
        let last = st.inbox.last();
        st.lifecycle.set_saved_cell(last);
        let after = st.lineage.loaded_after(meta.cell);
        let back = strings(reply.get("variables"));
        let mut note = format!(
            "Session '{}' was resumed from its state saved after cell {} ({}) in {:.1} s; no cell was re-run. Back: {}.",
            sess.name,
            meta.cell,
            age(meta.saved_unix),
            reply.get("seconds").and_then(Value::as_f64).unwrap_or(0.0),
            if back.is_empty() {
                "no variables".to_string()
            } else {
                some_names(&back, 8)
            }
        );
        if !meta.skipped.is_empty() {
            let lost: Vec<String> = meta
                .skipped
                .iter()
                .take(6)
                .map(|(name, why)| format!("{name} ({why})"))
                .collect();
            note.push_str(&format!(
                " Not saved, so not back (recreate them): {}{}.",
                lost.join(", "),
                if meta.skipped.len() > 6 {
                    format!(" and {} more", meta.skipped.len() - 6)
                } else {
                    String::new()
                }
            ));
        }
        let again = strings(reply.get("reimported"));
        if !again.is_empty() {
            note.push_str(&format!(
                " Modules of the workspace were imported again, running their top-level code: {}.",
                some_names(&again, 6)
            ));
        }
        if !after.is_empty() {
            note.push_str(&format!(
                " Cells {} ran after the save; their effects on variables are not back (python_history shows their code).",
                ranges(&after)
            ));
        }
        st.notes.push(note.clone());
        Ok(note)
    }

    /// Ends an idle session whose state is saved (saved now if it changed),
    /// keeping it in the store: its name brings it back, resumed. False
    /// when it has no saved state.
    pub(super) async fn end_saved(&self, name: &str) -> bool {
        let Ok(sess) = self.existing(name) else {
            return false;
        };
        if let Err(e) = self.save_state(&sess).await {
            tracing::warn!(session = %name, "its state was not saved: {e}");
            return false;
        }
        let current = {
            let st = sess.lock();
            st.lifecycle.saved_cell() == Some(st.inbox.last())
        };
        if !current || self.saved_meta(name).is_none() {
            return false;
        }
        self.sessions().remove(name);
        let worker = sess.lock().worker.take();
        if let Some(w) = worker {
            w.kill();
        }
        self.leave_stored(name);
        true
    }

    /// python_sessions resume.
    pub async fn resume(self: &Arc<Self>, name: &str) -> Result<String, SessionError> {
        let sess = self.existing(name)?;
        if sess.lock().lifecycle.pending() != Some(Pending::Dormant) {
            return Err(SessionError::Invalid(format!(
                "session '{name}' is not dormant: its interpreter holds its state"
            )));
        }
        let note = self.resume_saved(&sess).await?;
        // Said here: the next result does not repeat it.
        sess.lock().notes.retain(|n| *n != note);
        Ok(note)
    }

    /// Saves sessions that have stayed idle since their last cell, one at
    /// a time, in the background.
    pub fn spawn_state_saver(self: &Arc<Self>) {
        if self.durable.states.is_none() {
            return;
        }
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SAVER_EVERY).await;
                let Some(this) = this.upgrade() else {
                    return;
                };
                if this.shutting_down.load(Ordering::SeqCst) {
                    return;
                }
                let due: Vec<Arc<Session>> = this
                    .sessions()
                    .values()
                    .filter(|s| {
                        let st = s.lock();
                        st.lifecycle.saved_cell() != Some(st.inbox.last())
                            && st.inbox.running.is_none()
                            && st.last_used.elapsed() >= IDLE_BEFORE_SAVE
                    })
                    .cloned()
                    .collect();
                for sess in due {
                    if let Err(e) = this.save_state(&sess).await {
                        tracing::warn!(session = %sess.name, "its state was not saved: {e}");
                        // Not tried again until another cell runs.
                        let mut st = sess.lock();
                        let last = st.inbox.last();
                        st.lifecycle.set_saved_cell(last);
                    }
                }
            }
        });
    }

    /// At shutdown: the states of idle sessions that changed, within a
    /// bounded time.
    pub(super) async fn save_all(&self) {
        if self.durable.states.is_none() {
            return;
        }
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_SAVES;
        for sess in sessions {
            match tokio::time::timeout_at(deadline, self.save_state(&sess)).await {
                Err(_) => {
                    tracing::warn!(
                        "saving sessions' states at shutdown took over {SHUTDOWN_SAVES:?}; the rest keep their last saved state"
                    );
                    return;
                }
                Ok(Err(e)) => tracing::warn!(session = %sess.name, "its state was not saved: {e}"),
                Ok(Ok(_)) => {}
            }
        }
    }
}

/// Keeps the states in `dir` within `cap` bytes in all, the least recently
/// saved going first (never `keep`).
fn prune_states(dir: &crate::store::StatesDir, cap: u64, keep: &str) {
    let mut states = dir.list(".state");
    let mut total: u64 = states.iter().map(|s| s.1).sum();
    states.sort_by_key(|s| s.2);
    for (name, size, _) in states {
        if total <= cap {
            break;
        }
        if name == keep {
            continue;
        }
        dir.remove(&name);
        if let Some(stem) = name.strip_suffix(".state") {
            dir.remove(&format!("{stem}.json"));
        }
        total = total.saturating_sub(size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_pruned_oldest_first_within_the_cap_never_the_new_one() {
        use std::io::Write;
        let parent = tempfile::tempdir().expect("tempdir");
        let fd = nix::fcntl::open(
            parent.path(),
            nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_RDONLY,
            nix::sys::stat::Mode::empty(),
        )
        .expect("open");
        let dir = crate::store::StatesDir::open_in(&fd, parent.path(), "s.states").expect("states");
        let path = parent.path().join("s.states");
        let write = |name: &str, bytes: usize| {
            let file = format!("{name}.state");
            dir.create(&file)
                .and_then(|mut f| f.write_all(&vec![0u8; bytes]))
                .expect("write");
            dir.create(&format!("{name}.json")).expect("meta");
            // Distinct mtimes, oldest first.
            std::thread::sleep(Duration::from_millis(20));
            file
        };
        let old = write("old", 600);
        let mid = write("mid", 300);
        let new = write("new", 900);
        prune_states(&dir, 1000, &new);
        assert!(
            path.join(&new).exists(),
            "the state just saved stays even past the cap"
        );
        assert!(!path.join(&old).exists() && !path.join("old.json").exists());
        assert!(
            !path.join(&mid).exists(),
            "still over the cap: the next oldest goes too"
        );
        let other = write("other", 50);
        prune_states(&dir, 1000, &other);
        assert!(
            path.join(&new).exists() && path.join(&other).exists(),
            "within the cap: nothing goes"
        );
    }

    #[test]
    fn names_are_listed_up_to_a_few() {
        let names: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        assert_eq!(some_names(&names, 2), "a, b and 2 more");
        assert_eq!(some_names(&names, 8), "a, b, c, d");
    }
}
