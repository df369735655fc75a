//! Sessions that outlive their interpreter or the server: the path of cells
//! whose effects an interpreter holds, finished cells written to the store,
//! and rebuilding a state by re-running its path (cells that failed, were
//! interrupted or crashed are skipped). Stored sessions coming back at
//! start: `stored.rs`.

use std::time::SystemTime;

use super::report::CellStatus;
use super::resume::Ready;
use super::source::{HISTORY_PREVIEW_CHARS, StoredSource};
use super::*;
use crate::store::{CellRecord, SessionRecord, Store};

/// How sessions survive: the store (None with --resume off, or when another
/// server holds this workspace's store) and the bounds on rebuilding.
pub struct Durability {
    pub store: Option<Store>,
    /// --resume-max-cells: the most cells one rebuild re-runs.
    pub max_cells: usize,
    /// --resume-max-seconds: how long one rebuild may take.
    pub max_time: Duration,
    /// --state-max-cells: cells of a session's tree kept (for branching).
    pub max_tree: usize,
    /// --checkpoints: frozen copies kept per Python session (0: none).
    pub checkpoints: usize,
    /// --checkpoint-min-ms: cells quicker than this get no copy.
    pub checkpoint_min: Duration,
    /// Where saved states are kept (beside the store; None without one).
    pub states: Option<std::sync::Arc<crate::store::StatesDir>>,
    /// --state-max-mb: one saved state, and all of them together.
    pub state_cap: u64,
    /// Why sessions are not kept across restarts though --resume is on
    /// (another server holds the store): said in the default session's
    /// first result.
    pub unkept: Option<String>,
    /// Each server is a new conversation (stdio: a client starts one per
    /// conversation): the stored default sessions come back renamed
    /// `earlier-*` and `default` starts fresh. Over HTTP the token's
    /// shared `default` stays itself across restarts.
    pub new_conversation: bool,
}

impl Durability {
    pub fn off() -> Self {
        Self {
            store: None,
            max_cells: 200,
            max_time: Duration::from_secs(120),
            max_tree: 1000,
            checkpoints: 0,
            checkpoint_min: Duration::from_millis(100),
            states: None,
            state_cap: 512 << 20,
            unkept: None,
            new_conversation: true,
        }
    }
}

/// What a session keeps in memory to re-run its path (code bytes); older
/// cells are dropped past it and the path can no longer be rebuilt whole.
const MAX_PATH_BYTES: usize = 16 << 20;

/// A cell whose effects the interpreter holds, oldest first.
#[derive(Debug, Clone)]
pub(super) struct PathCell {
    pub id: u64,
    pub parent: Option<u64>,
    /// Its code and its ancestors' (from a fresh interpreter): cells with
    /// the same hash made the same state, so a copy of one serves the other.
    pub hash: u64,
    pub source: Arc<StoredSource>,
    pub status: CellStatus,
    /// False when its code was too long for the store to keep whole.
    pub replayable: bool,
    /// It called upstream MCP servers: a rebuild does not repeat that.
    pub tool_calls: bool,
}

/// Why a session's variables are not in its interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pending {
    /// Stored by an earlier server: its history is kept, its variables are
    /// not; only python_sessions rebuild (confirmed) re-runs its cells.
    Dormant,
    /// Its interpreter died under a cell: python_sessions rebuild re-runs
    /// its path when asked; the next cell starts a new path instead.
    Crashed,
    /// A cell asked for the state after another cell (`parent`): the first
    /// call rebuilds it.
    Branch(u64),
}

impl Pending {
    /// Rebuilt by the next call that needs the interpreter: only a switch
    /// to a branch, which that call asked for by naming its cell.
    pub(super) fn rebuilds_on_use(self) -> bool {
        matches!(self, Pending::Branch(_))
    }

    pub(super) fn why(self) -> String {
        match self {
            Pending::Dormant => "dormant since the server restarted".into(),
            Pending::Crashed => "its interpreter had crashed".into(),
            Pending::Branch(0) => "switched to a fresh interpreter".into(),
            Pending::Branch(id) => format!("switched to the state after cell {id}"),
        }
    }
}

impl SessionState {
    pub(super) fn head(&self) -> Option<u64> {
        self.path.last().map(|c| c.id)
    }

    pub(super) fn extend_path(&mut self, cell: PathCell) {
        self.path_bytes += cell.source.size();
        self.path.push(cell);
        while self.path_bytes > MAX_PATH_BYTES && self.path.len() > 1 {
            let old = self.path.remove(0);
            self.path_bytes -= old.source.size();
            self.path_cut = true;
        }
    }

    /// The hash of a cell running `source` on the state after `parent`; a
    /// parent the tree no longer has makes it unique (its id).
    pub(super) fn hash_of(&self, id: u64, parent: Option<u64>, source: &StoredSource) -> u64 {
        let base = match parent {
            None => 0,
            Some(p) => match self.tree.get(&p) {
                Some(cell) => cell.hash,
                None => return crate::store::fnv1a(format!("cell {id}").as_bytes()),
            },
        };
        let mut bytes = base.to_le_bytes().to_vec();
        bytes.extend_from_slice(serde_json::to_string(source).unwrap_or_default().as_bytes());
        crate::store::fnv1a(&bytes)
    }

    /// Adds a finished cell to the tree, which keeps at most `cap` cells:
    /// the oldest off the current path go first, then the oldest on it.
    /// Past the cap it sheds a sixteenth at once, so the walk that finds
    /// them is not made for every cell.
    pub(super) fn add_to_tree(&mut self, cell: PathCell, cap: usize) {
        let cap = cap.max(1);
        self.tree.insert(cell.id, cell);
        if self.tree.len() <= cap {
            return;
        }
        let excess = self.tree.len() - (cap - cap / 16);
        // A child runs after its parent, so the path's ids ascend like the
        // tree's keys: one merge walk finds the cells off the path.
        let mut path = self.path.iter().map(|c| c.id).peekable();
        let mut victims = Vec::with_capacity(excess);
        for &id in self.tree.keys() {
            while path.next_if(|&p| p < id).is_some() {}
            if path.peek() != Some(&id) {
                victims.push(id);
                if victims.len() == excess {
                    break;
                }
            }
        }
        for id in victims {
            self.tree.remove(&id);
        }
        while self.tree.len() > cap - cap / 16 {
            self.tree.pop_first();
        }
    }

    /// The cells from the root to `id`, oldest first, and whether its oldest
    /// ancestors are no longer kept; None when `id` is not in the tree.
    pub(super) fn chain_to(&self, id: u64) -> Option<(Vec<PathCell>, bool)> {
        let mut chain = vec![self.tree.get(&id)?.clone()];
        while let Some(parent) = chain.last().and_then(|c| c.parent) {
            match self.tree.get(&parent) {
                Some(c) if chain.len() <= self.tree.len() => chain.push(c.clone()),
                _ => {
                    chain.reverse();
                    return Some((chain, true));
                }
            }
        }
        chain.reverse();
        Some((chain, false))
    }

    pub(super) fn clear_path(&mut self) {
        self.path.clear();
        self.path_bytes = 0;
        self.path_cut = false;
        self.pending = None;
        self.skip = 0;
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// "1-3, 5, 7-8".
pub fn ranges(ids: &[u64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        while i + 1 < ids.len() && ids[i + 1] == ids[i] + 1 {
            i += 1;
        }
        parts.push(if ids[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", ids[i])
        });
        i += 1;
    }
    parts.join(", ")
}

impl SessionManager {
    /// Writes a session's settings to the store.
    pub(super) fn persist_session(&self, sess: &Session) {
        let Some(store) = &self.durable.store else {
            return;
        };
        let head = sess.lock().head();
        store.put_session(SessionRecord {
            name: sess.name.clone(),
            language: sess.language.key().to_string(),
            options: serde_json::to_value(sess.options.clone().unwrap_or_default())
                .unwrap_or_default(),
            head,
        });
    }

    pub(super) fn persist_head(&self, sess: &Session, head: Option<u64>) {
        if let Some(store) = &self.durable.store {
            store.set_head(&sess.name, head);
        }
    }

    pub(super) fn forget_stored(&self, name: &str) {
        if let Some(store) = &self.durable.store {
            store.delete_session(name);
        }
    }

    /// A finished cell joins the interpreter's path and the store.
    pub(super) fn record_cell(
        &self,
        sess: &Session,
        st: &mut SessionState,
        run: &RunningCell,
        report: &CellReport,
    ) {
        let source = run.source.clone();
        let replayable = source.size() <= crate::store::MAX_CODE_BYTES;
        let node = PathCell {
            id: run.number,
            parent: run.parent,
            hash: st.hash_of(run.number, run.parent, &source),
            source: source.clone(),
            status: report.status,
            replayable,
            tool_calls: run.tool_calls > 0,
        };
        if report.status != CellStatus::Crashed {
            st.extend_path(node.clone());
        }
        st.add_to_tree(node, self.durable.max_tree);
        let Some(store) = &self.durable.store else {
            return;
        };
        let summary = st
            .history
            .back()
            .filter(|h| h.cell == run.number)
            .map(|h| h.output_preview.clone())
            .unwrap_or_default();
        let images: Vec<Value> = report
            .images
            .info
            .iter()
            .map(|i| serde_json::json!({"mime": i.mime, "bytes": i.bytes, "width": i.width, "height": i.height}))
            .collect();
        store.put_cell(
            &sess.name,
            CellRecord {
                id: run.number,
                parent: run.parent,
                source: stored_source(&source, run.tool_calls),
                replayable,
                status: report.status.as_str().to_string(),
                elapsed_ms: report.elapsed_ms,
                finished_unix: now_unix(),
                summary: summary.chars().take(HISTORY_PREVIEW_CHARS * 2).collect(),
                images: Value::Array(images),
            },
            report.status != CellStatus::Crashed,
        );
    }

    /// The session's worker for a call that needs its state (python_inspect,
    /// ...): a session that must be rebuilt is, within the call's default
    /// window; the account waits in the notes for the next result.
    pub(super) async fn ready_worker(
        self: &Arc<Self>,
        sess: &Arc<Session>,
    ) -> Result<Arc<Worker>, SessionError> {
        match self.ready(sess, None).await? {
            Ready::Worker(worker) => Ok(worker),
            Ready::Rebuilding(worker) => {
                self.await_rebuild(sess, &worker, self.wait_window(None))
                    .await
            }
        }
    }

    /// A cell's `parent`: unless the interpreter holds the state right after
    /// cell `target` (0: a fresh interpreter), it goes there: by resuming
    /// the checkpoint of `target` or of its nearest ancestor that has one,
    /// else in a fresh interpreter; the next step re-runs what is missing.
    pub(super) async fn branch_to(
        &self,
        sess: &Arc<Session>,
        target: u64,
    ) -> Result<(), SessionError> {
        let _guard = sess.start_lock.lock().await;
        let (chain, cut) = {
            let mut st = sess.lock();
            self.refresh(sess, &mut st);
            if let Some(busy) = super::cells::busy_now(sess, &st) {
                return Err(busy);
            }
            if st.head().unwrap_or(0) == target && st.pending.is_none() {
                return Ok(());
            }
            if target == 0 {
                (Vec::new(), false)
            } else {
                st.chain_to(target).ok_or_else(|| {
                    let ids: Vec<u64> = st.tree.keys().copied().collect();
                    SessionError::Invalid(format!(
                        "parent {target} is not a finished cell of session '{}' (its cells: {}); python_history lists them with their parents, 0 means a fresh interpreter",
                        sess.name,
                        if ids.is_empty() { "none".to_string() } else { ranges(&ids) }
                    ))
                })?
            }
        };
        if !cut
            && !chain.is_empty()
            && let Some(holds) = self.resume_checkpoint(sess, &chain, target).await
        {
            self.after_resume(sess, chain, holds, target);
            self.persist_head(sess, Some(target));
            return Ok(());
        }
        let old = {
            let mut st = sess.lock();
            if let Some(note) = st.checkpoints.why_none(&chain) {
                st.notes.push(note);
            }
            st.clear_path();
            for cell in chain {
                st.extend_path(cell);
            }
            st.path_cut |= cut;
            st.pending = Some(Pending::Branch(target));
            st.completed = None;
            st.checkpoints.clear();
            st.worker.take()
        };
        if let Some(old) = old {
            old.kill();
        }
        self.persist_head(sess, (target != 0).then_some(target));
        Ok(())
    }

    /// python_sessions rebuild: says which cells a rebuild of a crashed or
    /// dormant session re-runs, and with `confirm` re-runs them, within the
    /// default window; past it the rebuild goes on and the message says how
    /// to follow it.
    pub async fn rebuild(
        self: &Arc<Self>,
        name: &str,
        confirm: bool,
    ) -> Result<String, SessionError> {
        let sess = self.existing(name)?;
        let under_way = sess.lock().rebuild.is_some();
        if !under_way {
            let Some(pending) = sess.lock().pending else {
                return Err(SessionError::Invalid(format!(
                    "session '{name}' has nothing to rebuild: its interpreter holds the state of its cells (python_history lists them); python_sessions action=reset starts it afresh"
                )));
            };
            if !confirm {
                let st = sess.lock();
                return Ok(super::rebuild::preview(&sess, &st, self.durable.max_cells));
            }
            let size = super::rebuild::rebuild_size(&sess.lock());
            if size > self.durable.max_cells {
                // Refused whole, the session left as it is (still dormant).
                return Err(SessionError::Invalid(format!(
                    "a rebuild of session '{name}' would re-run {}, more than the {} one may (--resume-max-cells); nothing was run: raise the flag or reset the session",
                    super::rebuild::cells(size),
                    super::rebuild::cells(self.durable.max_cells)
                )));
            }
            refused(&sess)?;
            let worker = self.ensure_worker(&sess).await?;
            let _guard = sess.start_lock.lock().await;
            let mut st = sess.lock();
            if st.rebuild.is_none() && st.pending == Some(pending) {
                // The account replaces the note that a fresh interpreter started.
                st.notes.clear();
                self.begin_rebuild(&sess, &mut st, &worker);
            }
        }
        let Some((id, worker)) = ({
            let st = sess.lock();
            st.rebuild.as_ref().map(|r| r.id).zip(st.worker.clone())
        }) else {
            return self.rebuilt_account(&sess, None);
        };
        match self
            .await_rebuild(&sess, &worker, self.wait_window(None))
            .await
        {
            Ok(_) => self.rebuilt_account(&sess, Some(id)),
            Err(SessionError::Rebuilding(now)) => Ok(format!(
                "{}. The next result says what was re-run.",
                now.replacen("session", "Session", 1)
            )),
            Err(e) => Err(e),
        }
    }

    /// The account of rebuild `id` (or the last one), taken out of the
    /// notes unless a queued cell's result carries it.
    fn rebuilt_account(&self, sess: &Session, id: Option<u64>) -> Result<String, SessionError> {
        let mut st = sess.lock();
        match st.rebuilt.clone() {
            Some((done, text, queued)) if id.is_none_or(|id| id == done) => {
                if !queued {
                    st.notes.retain(|n| *n != text);
                }
                Ok(text)
            }
            _ => Err(SessionError::Invalid(format!(
                "session '{}' has nothing to rebuild: its interpreter holds the state of its cells",
                sess.name
            ))),
        }
    }

    /// The offer made when an interpreter died under a cell.
    pub(super) fn restore_offer(&self, sess: &Session, st: &SessionState) -> Option<String> {
        let ids: Vec<u64> = st
            .path
            .iter()
            .filter(|c| c.status == CellStatus::Ok && c.replayable)
            .map(|c| c.id)
            .collect();
        if ids.is_empty() {
            return None;
        }
        Some(format!(
            "To rebuild its variables, call python_sessions {{action: \"rebuild\", session: \"{}\", confirm: true}} before any other cell: it re-runs cells {}, and what they did outside the session happens again.",
            sess.name,
            ranges(&ids)
        ))
    }
}

/// A stored session whose settings the current policy refuses cannot run.
pub(super) fn refused(sess: &Session) -> Result<(), SessionError> {
    match &sess.refused {
        Some(why) => Err(SessionError::Invalid(format!(
            "session '{}' was stored with settings the current policy refuses ({why}); delete it (python_sessions action=delete) and create it again",
            sess.name
        ))),
        None => Ok(()),
    }
}

impl SessionOptions {
    /// No settings of its own (a default session, or one created plain).
    pub(super) fn is_plain(&self) -> bool {
        self.python.is_none()
            && self.venv.is_none()
            && self.workdir.is_none()
            && self.env.is_empty()
    }
}

/// A cell's source as the store keeps it, with how many tool calls it made
/// (the source's own form ignores the extra key when read back).
fn stored_source(source: &StoredSource, tool_calls: u64) -> Value {
    let mut value = serde_json::to_value(source).unwrap_or_default();
    if tool_calls > 0
        && let Value::Object(map) = &mut value
    {
        map.insert("tool_calls".into(), Value::from(tool_calls));
    }
    value
}

/// Whether a stored cell's source says it called tools.
pub(super) fn stored_tool_calls(source: &Value) -> bool {
    source
        .get("tool_calls")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(id: u64, parent: Option<u64>) -> PathCell {
        PathCell {
            id,
            parent,
            hash: id,
            source: Arc::new(StoredSource::Code {
                code: format!("c{id}"),
            }),
            status: CellStatus::Ok,
            replayable: true,
            tool_calls: false,
        }
    }

    fn add(st: &mut SessionState, id: u64, parent: Option<u64>) {
        st.extend_path(cell(id, parent));
        st.add_to_tree(cell(id, parent), 4);
    }

    #[test]
    fn the_tree_drops_cells_off_the_path_first_then_the_oldest() {
        let mut st = SessionState::fresh();
        add(&mut st, 1, None);
        add(&mut st, 2, Some(1));
        add(&mut st, 3, Some(2));
        // Back to the state after 2: cell 3 leaves the path.
        st.path.truncate(2);
        add(&mut st, 4, Some(2));
        add(&mut st, 5, Some(4));
        assert_eq!(st.tree.keys().copied().collect::<Vec<_>>(), [1, 2, 4, 5]);
        add(&mut st, 6, Some(5));
        assert_eq!(st.tree.keys().copied().collect::<Vec<_>>(), [2, 4, 5, 6]);
    }

    #[test]
    fn a_long_path_keeps_its_newest_cells_within_the_cap() {
        let mut st = SessionState::fresh();
        for id in 1..=100 {
            st.extend_path(cell(id, (id > 1).then(|| id - 1)));
            st.add_to_tree(cell(id, (id > 1).then(|| id - 1)), 32);
            assert!(st.tree.len() <= 32, "{} cells kept", st.tree.len());
        }
        assert!(st.tree.len() >= 30);
        assert_eq!(st.tree.keys().next_back(), Some(&100));
        let oldest = *st.tree.keys().next().unwrap_or(&0);
        assert_eq!(oldest, 101 - st.tree.len() as u64, "not the newest run");
    }

    #[test]
    fn ranges_join_runs() {
        assert_eq!(ranges(&[1, 2, 3, 5, 7, 8]), "1-3, 5, 7-8");
        assert_eq!(ranges(&[4]), "4");
        assert_eq!(ranges(&[]), "");
    }
}
