//! Stored sessions coming back at start: dormant (listed, with their
//! history; their cells re-run only when an agent asks for a rebuild)
//! while the instance has room, the rest when their name is next used. A
//! new server is a new conversation: the stored default sessions come back
//! under names of their own (`earlier-default`, `earlier-default-2`, ...),
//! and `default` starts fresh.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::durable::{policy_refusal, stored_tool_calls};
use super::kept::HistoryEntry;
use super::kernel_restart::kernel_not_offered;
use super::lifecycle::Pending;
use super::lineage::PathCell;
use super::manager::SessionManager;
use super::rebuild::cells;
use super::report::CellStatus;
use super::saved::age;
use super::source::StoredSource;
use super::state::{Session, SessionOptions};
use super::{default_language, valid_name};
use crate::store::StoredSession;
use crate::worker::Language;

/// How the default sessions of an earlier conversation are named.
const EARLIER: &str = "earlier-";

/// `earlier-NAME`, else `earlier-NAME-2`, ... : the first not in `taken`.
fn earlier_name(name: &str, taken: &BTreeSet<String>) -> Option<String> {
    (1..1000)
        .map(|n| match n {
            1 => format!("{EARLIER}{name}"),
            n => format!("{EARLIER}{name}-{n}"),
        })
        .find(|c| !taken.contains(c) && valid_name(c))
}

impl SessionManager {
    /// What an earlier server stored, as dormant sessions: read and built
    /// before any lock is taken (the instance's lock is held only to count
    /// them in).
    pub(super) fn read_stored(&self) -> Vec<(String, Session)> {
        let Some(store) = &self.durable.store else {
            return Vec::new();
        };
        let mut stored = store.load().unwrap_or_else(|e| {
            tracing::warn!(
                "could not read the session store {}: {e}",
                store.path().display()
            );
            Vec::new()
        });
        let mut taken: BTreeSet<String> = stored.iter().map(|s| s.record.name.clone()).collect();
        for s in stored.iter_mut().filter(|_| self.durable.new_conversation) {
            let name = s.record.name.clone();
            if default_language(&name).is_none() || name.starts_with(EARLIER) {
                continue;
            }
            let Some(free) = earlier_name(&name, &taken) else {
                continue;
            };
            store.rename_session(&name, &free);
            self.rename_state(&name, &free);
            taken.remove(&name);
            taken.insert(free.clone());
            s.record.name = free;
        }
        stored
            .into_iter()
            .filter(|s| valid_name(&s.record.name))
            .filter_map(|s| {
                let name = s.record.name.clone();
                let sess = self.dormant_session(s);
                if sess.is_none() {
                    tracing::debug!(session = %name, "stored session not loaded");
                }
                Some((name, sess?))
            })
            .collect()
    }

    /// Stored sessions come back dormant: listed, with their history,
    /// rebuilt by the first call that needs their state; at most `room` of
    /// them (the instance's budget) and this tenant's limit. The rest stay
    /// stored until their name is used again.
    pub(super) fn add_stored(&self, stored: Vec<(String, Session)>, room: usize) {
        let most = room.min(self.limits.max_sessions);
        let mut map = self.sessions();
        for (name, sess) in stored {
            if map.len() >= most {
                tracing::warn!(
                    session = %name,
                    "stored session left in the store: no room (--max-sessions); it comes back when its name is used again"
                );
                self.left_stored().insert(name);
                continue;
            }
            map.insert(name, Arc::new(sess));
        }
    }

    /// A session left in the store at start, taken back from it (dormant)
    /// for its name's next use.
    pub(super) fn revive_stored(&self, name: &str) -> Option<Session> {
        if !self.left_stored().remove(name) {
            return None;
        }
        let store = self.durable.store.as_ref()?;
        let stored = store.load_session(name).unwrap_or_else(|e| {
            tracing::warn!("could not read session '{name}' from the store: {e}");
            None
        });
        let revived = stored.and_then(|s| self.dormant_session(s));
        if revived.is_none() {
            tracing::debug!(session = %name, "stored session not brought back");
        }
        revived
    }

    /// One line for the first result of a fresh default session: the
    /// dormant sessions it may rebuild (at most 200 characters).
    pub(super) fn dormant_line(&self) -> Option<String> {
        const MOST: usize = 200;
        let names: Vec<(String, usize, Option<String>)> = self
            .sessions()
            .iter()
            .filter_map(|(name, s)| {
                let st = s.lock();
                let kernel = s.kernel().map(str::to_string);
                st.lifecycle
                    .is_dormant()
                    .then(|| (name.clone(), st.lineage.path().len(), kernel))
            })
            .collect();
        // Read outside the sessions' lock.
        let mut dormant: Vec<(String, String)> = names
            .into_iter()
            .map(|(name, n, kernel)| {
                let what = match (kernel, self.saved_meta(&name)) {
                    // Named, it comes back on a fresh kernel.
                    (Some(kernel), _) => format!("{}, kernel {kernel}", cells(n)),
                    (None, Some(m)) => format!(
                        "saved {}, {} vars, {}",
                        age(m.saved_unix),
                        m.variables.len(),
                        crate::units::human_bytes(m.bytes)
                    ),
                    (None, None) => format!("{}, not saved", cells(n)),
                };
                (name, what)
            })
            .collect();
        if dormant.is_empty() {
            return None;
        }
        dormant.sort();
        let head = "Dormant: ";
        let tail = ". Name one to resume it; unsaved ones: python_sessions rebuild.";
        let mut listed = String::new();
        for (i, (name, what)) in dormant.iter().enumerate() {
            let item = format!("{}{name} ({what})", if i > 0 { ", " } else { "" });
            let more = format!(", +{} more", dormant.len() - i);
            if head.len() + listed.len() + item.len() + more.len() + tail.len() > MOST {
                listed.push_str(&more);
                break;
            }
            listed.push_str(&item);
        }
        Some(format!("{head}{listed}{tail}"))
    }

    fn dormant_session(&self, s: StoredSession) -> Option<Session> {
        let options: SessionOptions = serde_json::from_value(s.record.options.clone()).ok()?;
        let lang = Language::parse(&s.record.language)?;
        if s.cells.is_empty() && options.is_plain() {
            return None;
        }
        // The policy may have changed since: a refusal is given at first use.
        let (spec, refused) = match self.spec_from_options(&SessionOptions {
            language: lang,
            ..options.clone()
        }) {
            Ok(spec) => (spec, None),
            Err(e) => {
                let name = &s.record.name;
                let refusal = match &options.kernel {
                    Some(kernel) if self.kernel_language(kernel).is_none() => {
                        kernel_not_offered(name, kernel, &self.kernel_names())
                    }
                    _ => policy_refusal(name, &e.to_string()),
                };
                (None, Some(refusal))
            }
        };
        let mut sess = Session::new(&s.record.name, lang, spec, Some(options));
        sess.refused = refused;
        {
            let st = sess.state_mut();
            for cell in &s.cells {
                let Ok(source) = serde_json::from_value::<StoredSource>(cell.source.clone()) else {
                    continue;
                };
                let node = PathCell {
                    id: cell.id,
                    parent: cell.parent,
                    hash: st.lineage.hash_of(cell.id, cell.parent, &source),
                    source: Arc::new(source),
                    status: CellStatus::parse(&cell.status).unwrap_or(CellStatus::Error),
                    replayable: cell.replayable,
                    tool_calls: stored_tool_calls(&cell.source),
                };
                st.lineage.add_to_tree(node, self.durable.max_tree);
            }
            if let Some((chain, cut)) = s.record.head.and_then(|h| st.lineage.chain_to(h)) {
                st.lineage.set_path(chain, cut);
            }
            let keep = self.limits.keep_cells.max(1) * 4;
            for cell in s.cells.iter().skip(s.cells.len().saturating_sub(keep)) {
                let code = serde_json::from_value::<StoredSource>(cell.source.clone())
                    .map(|src| src.as_source().describe())
                    .unwrap_or_default();
                let entry = HistoryEntry {
                    cell: cell.id,
                    parent: cell.parent,
                    current: false,
                    code,
                    status: CellStatus::parse(&cell.status).unwrap_or(CellStatus::Error),
                    elapsed_ms: cell.elapsed_ms,
                    output_preview: cell.summary.clone(),
                    by: None,
                };
                st.kept.add_history(entry, usize::MAX);
            }
            let newest = s.cells.iter().map(|c| c.id).max().unwrap_or(0);
            st.inbox.restore(newest, s.cells.len() as u64);
            if !st.lineage.path().is_empty() {
                st.lifecycle.set_pending(Pending::Dormant);
            }
        }
        Some(sess)
    }
}
