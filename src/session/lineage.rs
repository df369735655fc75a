//! A session's lineage: the path of cells whose effects its interpreter
//! holds (what a rebuild re-runs, where the next cell's parent comes
//! from), and the tree of finished cells with their hashes (the branches
//! `parent` can go back to), both bounded.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::report::CellStatus;
use super::source::StoredSource;

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

/// The path and the tree of one session.
#[derive(Default)]
pub(super) struct Lineage {
    /// The cells whose effects the interpreter holds, oldest first: what a
    /// rebuild re-runs, and where the next cell's parent comes from.
    path: Vec<PathCell>,
    path_bytes: usize,
    /// Its oldest cells were dropped (bounds), so it cannot be rebuilt whole.
    cut: bool,
    /// Finished cells by id, each with its parent: the branches (bounded).
    tree: BTreeMap<u64, PathCell>,
    /// Cells at the start of the path the interpreter holds already (a
    /// rebuild after resuming an ancestor's checkpoint re-runs the rest).
    skip: usize,
}

impl Lineage {
    pub(super) fn head(&self) -> Option<u64> {
        self.path.last().map(|c| c.id)
    }

    pub(super) fn extend_path(&mut self, cell: PathCell) {
        self.path_bytes += cell.source.size();
        self.path.push(cell);
        while self.path_bytes > MAX_PATH_BYTES && self.path.len() > 1 {
            let old = self.path.remove(0);
            self.path_bytes -= old.source.size();
            self.cut = true;
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

    /// Forgets the path (a fresh interpreter holds nothing).
    pub(super) fn clear(&mut self) {
        self.path.clear();
        self.path_bytes = 0;
        self.cut = false;
        self.skip = 0;
    }

    /// The path becomes `chain` (from `chain_to`); `cut`: its oldest
    /// ancestors are no longer kept.
    pub(super) fn set_path(&mut self, chain: Vec<PathCell>, cut: bool) {
        self.clear();
        for cell in chain {
            self.extend_path(cell);
        }
        self.cut |= cut;
    }

    /// The cells whose effects the interpreter holds, oldest first.
    pub(super) fn path(&self) -> &[PathCell] {
        &self.path
    }

    /// Finished cells by id, each with its parent.
    pub(super) fn tree(&self) -> &BTreeMap<u64, PathCell> {
        &self.tree
    }

    /// Its oldest cells were dropped: it cannot be rebuilt whole.
    pub(super) fn is_cut(&self) -> bool {
        self.cut
    }

    /// Cells at the start of the path the interpreter holds already.
    pub(super) fn skip(&self) -> usize {
        self.skip
    }

    pub(super) fn set_skip(&mut self, holds: usize) {
        self.skip = holds;
    }

    pub(super) fn take_skip(&mut self) -> usize {
        std::mem::take(&mut self.skip)
    }

    /// A rebuild reached the first `reached` cells of the path: the rest
    /// are not held; those of `failed` failed when re-run.
    pub(super) fn rebuilt_to(&mut self, reached: usize, failed: &[u64]) {
        self.path.truncate(reached);
        for c in self.path.iter_mut().filter(|c| failed.contains(&c.id)) {
            c.status = CellStatus::Error;
        }
        self.path_bytes = self.path.iter().map(|c| c.source.size()).sum();
    }

    /// A saved state after cell `cell` was loaded: the cells after it leave
    /// the path; their ids.
    pub(super) fn loaded_after(&mut self, cell: u64) -> Vec<u64> {
        let after = match self.path.iter().position(|c| c.id == cell) {
            Some(i) => {
                let later = self.path.split_off(i + 1);
                later.iter().map(|c| c.id).collect()
            }
            None => Vec::new(),
        };
        self.path_bytes = self.path.iter().map(|c| c.source.size()).sum();
        after
    }
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

    fn add(st: &mut Lineage, id: u64, parent: Option<u64>) {
        st.extend_path(cell(id, parent));
        st.add_to_tree(cell(id, parent), 4);
    }

    #[test]
    fn the_tree_drops_cells_off_the_path_first_then_the_oldest() {
        let mut st = Lineage::default();
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
        let mut st = Lineage::default();
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
