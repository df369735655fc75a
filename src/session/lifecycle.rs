//! Where a session stands towards its interpreter: it holds the path, or
//! it does not (dormant since a restart, crashed, switched to a branch)
//! and why, or a rebuild re-runs it now (`rebuild.rs` does it, `resume.rs`
//! starts it for a call); and the account of the last rebuild and the cell
//! whose state is saved (`saved.rs`).

use std::sync::Arc;
use std::time::Instant;

use super::error::SessionError;
use super::lineage::ranges;
use super::report::{CellReport, CellStatus, Images};
use super::source::StoredSource;
use crate::worker::Language;

/// Why a session's variables are not in its interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pending {
    /// Stored by an earlier server: its history is kept, its variables are
    /// not; only python_sessions rebuild (confirmed) re-runs its cells.
    Dormant,
    /// Its interpreter died under a cell: python_sessions rebuild re-runs
    /// its path when asked; the next cell starts a new path instead.
    Crashed,
    /// A kernel session stored by an earlier server, on a fresh kernel: its
    /// history is kept, its variables ended with the old kernel; the next
    /// cell starts a new path, and until then python_sessions rebuild
    /// re-runs the old one when asked.
    KernelRestarted,
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
            Pending::KernelRestarted => "its kernel restarted with the server".into(),
            Pending::Branch(0) => "switched to a fresh interpreter".into(),
            Pending::Branch(id) => format!("switched to the state after cell {id}"),
        }
    }
}

/// The error kind of a queued cell whose code did not run.
pub(super) const NOT_RUN: &str = "NotRun";

/// A rebuild under way, in the session's state.
pub(super) struct Rebuilding {
    /// Which rebuild: a reset or delete ends it by clearing it, and its
    /// task then leaves the session alone.
    pub(super) id: u64,
    pub(super) why: String,
    /// The cells it re-runs, in order (none past --resume-max-cells).
    pub(super) plan: Vec<u64>,
    /// The cell it re-runs now.
    pub(super) current: Option<u64>,
    pub(super) started: Instant,
    /// A call's code, run as the next cell once the rebuild is done.
    pub(super) queued: Option<Queued>,
    /// Why it must stop (an interrupt): the queued code then does not run.
    pub(super) stop: Option<String>,
    /// The result of the cell just re-run, for the task.
    pub(super) replayed: Option<CellReport>,
    /// Notes meant for the agent's next result, kept aside meanwhile.
    pub(super) aside: Vec<String>,
    /// A result no call had collected when the rebuild started.
    pub(super) kept: Option<CellReport>,
}

pub(super) struct Queued {
    pub(super) number: u64,
    pub(super) source: Arc<StoredSource>,
    pub(super) since: Instant,
}

impl Rebuilding {
    /// "(why): re-running cells 1-3, now cell 2, 4.1 s so far".
    fn detail(&self) -> String {
        let cells = match self.plan.as_slice() {
            [] => "nothing to re-run".to_string(),
            [one] => format!("re-running cell {one}"),
            many => format!("re-running cells {}", ranges(many)),
        };
        let now = match self.current {
            Some(c) if self.plan.len() > 1 => format!(", now cell {c}"),
            _ => String::new(),
        };
        format!(
            "({}): {cells}{now}, {:.1} s so far",
            self.why,
            self.started.elapsed().as_secs_f64()
        )
    }
}

/// The refusal of a call that cannot run while `rb` runs.
pub(super) fn rebuilding_error(name: &str, lang: Language, rb: &Rebuilding) -> SessionError {
    let wait = lang.wait_tool();
    let next = match &rb.queued {
        Some(q) => format!(
            "; cell {n} (code of an earlier call) runs after it. Call {wait} to follow it, or {wait} with interrupt: true to stop the rebuild (cell {n} then does not run)",
            n = q.number
        ),
        None => format!(
            ". {} queues code to run after it; {wait} with interrupt: true stops it",
            lang.exec_tool()
        ),
    };
    SessionError::Rebuilding(format!(
        "session '{}' is being rebuilt {}{next}",
        name,
        rb.detail()
    ))
}

/// The queued cell's `running` result while `rb` runs.
pub(super) fn running_report(
    name: &str,
    lang: Language,
    rb: &Rebuilding,
) -> Result<CellReport, SessionError> {
    let Some(q) = &rb.queued else {
        return Err(rebuilding_error(name, lang, rb));
    };
    let wait = lang.wait_tool();
    let mut note = format!("Rebuilding session '{}' {}", name, rb.detail());
    note.push_str(&format!(
        "; cell {n} (this code) runs after it. {wait} follows it; {wait} with interrupt: true stops the rebuild and cell {n} does not run.",
        n = q.number
    ));
    Ok(CellReport {
        status: CellStatus::Running,
        session: name.to_string(),
        language: lang,
        cell: q.number,
        output: Default::default(),
        background: None,
        value: None,
        error: None,
        prompt: None,
        elapsed_ms: q.since.elapsed().as_secs_f64() * 1000.0,
        images: Images::default(),
        notes: vec![note],
    })
}

/// The notes of a result no call collected, for the next one.
pub(super) fn uncollected(prev: CellReport) -> Vec<String> {
    let mut notes = vec![match &prev.error {
        Some(e) if e.kind == NOT_RUN => format!("Not collected before this call: {}.", e.message),
        _ => format!(
            "Cell {} finished before this call ({}); its result had not been collected:\n{}",
            prev.cell,
            prev.status.as_str(),
            prev.brief()
        ),
    }];
    notes.extend(prev.notes);
    notes
}

/// A rebuild's progress: (seconds, "rebuilding session 'x' (why): ...").
pub(super) fn rebuild_progress(name: &str, rb: &Rebuilding) -> (f64, String) {
    let line = format!("rebuilding session '{name}' {}", rb.detail());
    (rb.started.elapsed().as_secs_f64(), line)
}

/// The queued cell of a rebuild under way: (number, code, seconds).
pub(super) fn queued_cell(rb: &Rebuilding) -> Option<(u64, String, f64)> {
    let q = rb.queued.as_ref()?;
    Some((
        q.number,
        q.source.as_source().describe(),
        q.since.elapsed().as_secs_f64(),
    ))
}

/// What a reset or delete says of the rebuild it ended.
pub(super) fn ended_note(rb: &Rebuilding) -> String {
    match &rb.queued {
        Some(q) => format!(
            " Its rebuild was stopped; cell {}, queued after it, did not run.",
            q.number
        ),
        None => " Its rebuild was stopped.".to_string(),
    }
}

/// Whether the interpreter holds the session's path: the states exclude
/// each other.
enum Stage {
    /// It does (or the session has no path yet).
    Holds,
    /// It does not, and why.
    Pending(Pending),
    /// A rebuild re-runs the path now.
    Rebuilding(Box<Rebuilding>),
}

/// The account of the last rebuild.
#[derive(Clone)]
pub(super) struct Rebuilt {
    pub(super) id: u64,
    pub(super) text: String,
    /// A cell was queued after it: that cell's result carries the account.
    pub(super) queued: bool,
}

/// A session's stage, its last rebuild and its last saved state.
pub(super) struct Lifecycle {
    stage: Stage,
    rebuilt: Option<Rebuilt>,
    /// The last cell whose state is saved (saved.rs): none to save until
    /// another cell runs.
    saved_cell: Option<u64>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            stage: Stage::Holds,
            rebuilt: None,
            saved_cell: None,
        }
    }
}

impl Lifecycle {
    /// Why the interpreter does not hold the path, when no rebuild runs.
    pub(super) fn pending(&self) -> Option<Pending> {
        match &self.stage {
            Stage::Pending(p) => Some(*p),
            _ => None,
        }
    }

    /// Dormant, and no rebuild runs.
    pub(super) fn is_dormant(&self) -> bool {
        self.pending() == Some(Pending::Dormant)
    }

    /// The interpreter holds the path: nothing pending, no rebuild.
    pub(super) fn holds(&self) -> bool {
        matches!(self.stage, Stage::Holds)
    }

    /// The interpreter no longer holds the path, for `why`. A rebuild
    /// under way stays (it owns the interpreter).
    pub(super) fn set_pending(&mut self, why: Pending) {
        if !self.is_rebuilding() {
            self.stage = Stage::Pending(why);
        }
    }

    /// What was pending is no longer (a fresh path, a state loaded).
    pub(super) fn clear_pending(&mut self) {
        if let Stage::Pending(_) = self.stage {
            self.stage = Stage::Holds;
        }
    }

    pub(super) fn take_pending(&mut self) -> Option<Pending> {
        let pending = self.pending();
        self.clear_pending();
        pending
    }

    pub(super) fn rebuild(&self) -> Option<&Rebuilding> {
        match &self.stage {
            Stage::Rebuilding(rb) => Some(rb),
            _ => None,
        }
    }

    pub(super) fn rebuild_mut(&mut self) -> Option<&mut Rebuilding> {
        match &mut self.stage {
            Stage::Rebuilding(rb) => Some(rb),
            _ => None,
        }
    }

    pub(super) fn is_rebuilding(&self) -> bool {
        matches!(self.stage, Stage::Rebuilding(_))
    }

    /// A rebuild starts (what was pending is what it rebuilds).
    pub(super) fn start_rebuild(&mut self, rb: Rebuilding) {
        self.stage = Stage::Rebuilding(Box::new(rb));
    }

    /// Ends the rebuild under way if it is rebuild `id`.
    pub(super) fn end_rebuild(&mut self, id: u64) -> Option<Box<Rebuilding>> {
        if self.rebuild().is_some_and(|rb| rb.id == id) {
            return self.take_rebuild();
        }
        None
    }

    /// Ends the rebuild under way, whichever (a reset, a delete).
    pub(super) fn take_rebuild(&mut self) -> Option<Box<Rebuilding>> {
        match std::mem::replace(&mut self.stage, Stage::Holds) {
            Stage::Rebuilding(rb) => Some(rb),
            other => {
                self.stage = other;
                None
            }
        }
    }

    pub(super) fn rebuilt(&self) -> Option<&Rebuilt> {
        self.rebuilt.as_ref()
    }

    pub(super) fn set_rebuilt(&mut self, rebuilt: Rebuilt) {
        self.rebuilt = Some(rebuilt);
    }

    /// The last cell whose state is saved.
    pub(super) fn saved_cell(&self) -> Option<u64> {
        self.saved_cell
    }

    pub(super) fn set_saved_cell(&mut self, cell: u64) {
        self.saved_cell = Some(cell);
    }
}
