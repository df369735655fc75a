//! MCP Tasks: the `io.modelcontextprotocol/tasks` extension (SEP-2663) as
//! rmcp implements it (`tasks/get`, `tasks/update`, `tasks/cancel`, a
//! `tools/call` answered with `resultType: "task"`), for the calls that run
//! long: python_exec, r_exec, python_install, r_install and shell_exec.
//!
//! A request that declares the extension in its own `_meta` runs its tool in a task of the
//! tenant's [`TaskStore`]. The call still waits its own window (`wait_s`, as
//! any call): work done by then is answered as today, without a task; work
//! still going is answered with the task's handle instead of `running`. The
//! task follows the cell or job to its end (no `--max-wait`: a task's wait is
//! its work's length) and completes with the result the tool would have
//! returned had the work ended within its window. `tasks/cancel` is the
//! call's cancel: the cell is interrupted (the session keeps its
//! variables), a job gets SIGINT. A cell blocked in `input()` completes the
//! task with today's `waiting_input` result (see docs/tools.md): the
//! extension's `input_required` carries elicitation requests, which go to
//! the user, while `input()` is answered by the agent (`python_wait`).
//!
//! The store belongs to a tenant, not to a connection: the work goes on
//! when its client disconnects and any client of the same tenant fetches
//! the result by the task's id (128 random bits). Bounded: at most as many
//! tasks working as the tenant has sessions and jobs (past that a call runs
//! as today), and an ended task is kept for `--job-ttl` (at least a minute),
//! at most [`MAX_KEPT`] of them, like finished jobs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult,
    DetailedTask, JsonObject, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::current_timestamp;
use rmcp::{ErrorData as McpError, RoleServer};
use tokio_util::sync::CancellationToken;

use super::server::FerreplServer;

/// The tools whose calls may become tasks.
const TASK_TOOLS: &[&str] = &[
    "python_exec",
    "r_exec",
    "kernel_exec",
    "python_install",
    "r_install",
    "shell_exec",
];

/// The polling interval a task suggests.
const POLL_INTERVAL_MS: u64 = 1000;

/// A task's wait for its work: until the work ends (a cell's own limit is
/// `--max-cell-seconds`); finite only so that deadlines cannot overflow.
pub(crate) const TASK_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Ended tasks kept at most per tenant (the oldest goes first), as many as
/// finished jobs.
pub const MAX_KEPT: usize = 100;

/// An ended task is kept at least this long, whatever `--job-ttl` says.
const MIN_KEEP: Duration = Duration::from_secs(60);

/// What a task's call carries (in its request's extensions): the call
/// follows its work to the end and reports progress as the task's status
/// message.
#[derive(Clone, Default)]
pub(crate) struct TaskLink {
    status: Arc<Mutex<Option<String>>>,
}

impl TaskLink {
    pub(crate) fn set_status(&self, message: String) {
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = Some(message);
    }

    fn status(&self) -> Option<String> {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A task just opened, for its call to run in.
pub(crate) struct Opened {
    id: String,
    link: TaskLink,
    cancel: CancellationToken,
}

/// How a task ended.
enum Outcome {
    /// The tool's result (an `isError` one included): `completed`.
    Result(CallToolResult),
    /// A JSON-RPC error: `failed`.
    Error(McpError),
    /// Stopped by `tasks/cancel`, with what was stopped: `cancelled`.
    Cancelled(String),
}

struct Entry {
    task: Task,
    created: Instant,
    link: TaskLink,
    cancel: CancellationToken,
    ended: Option<(Instant, Outcome)>,
}

impl Entry {
    /// The task as `tasks/get` shows it now.
    fn detailed(&self, keep: Duration) -> DetailedTask {
        let mut task = self.task.clone();
        let payload = match &self.ended {
            None => {
                task.status_message = self.link.status().or(task.status_message);
                TaskPayload::Working
            }
            Some((at, outcome)) => {
                // Kept `keep` past its end: the lifetime is known now.
                let ttl = at.duration_since(self.created) + keep;
                task.ttl_ms = Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
                match outcome {
                    Outcome::Result(result) => {
                        task.status_message = last_line(result);
                        TaskPayload::Completed {
                            result: object_of(result),
                        }
                    }
                    Outcome::Error(error) => {
                        task.status_message = Some(error.message.to_string());
                        TaskPayload::Failed {
                            error: object_of(error),
                        }
                    }
                    Outcome::Cancelled(what) => {
                        task.status_message = Some(what.clone());
                        TaskPayload::Cancelled
                    }
                }
            }
        };
        DetailedTask::new(task, payload)
    }
}

/// A tenant's tasks.
pub struct TaskStore {
    entries: Mutex<HashMap<String, Entry>>,
    /// Tasks working at once at most.
    max_live: usize,
    /// How long an ended task is kept.
    keep: Duration,
}

impl TaskStore {
    /// `max_live`: the tenant's sessions and jobs (each working task follows
    /// one cell or job); `keep`: `--job-ttl`.
    pub fn new(max_live: usize, keep: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            max_live: max_live.max(1),
            keep: keep.max(MIN_KEEP),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new working task, or None when the tenant has its most working
    /// already (or no random id can be had): the call then runs as today.
    pub(crate) fn open(&self, tool: &str) -> Option<Opened> {
        let id = random_id()?;
        let mut entries = self.entries();
        self.sweep(&mut entries);
        if entries.values().filter(|e| e.ended.is_none()).count() >= self.max_live {
            return None;
        }
        let now = current_timestamp();
        let mut task = Task::new(id.clone(), TaskStatus::Working, now.clone(), now)
            .with_poll_interval_ms(POLL_INTERVAL_MS)
            .with_status_message(format!("{tool} started"));
        // Working: it lives as long as its work (set once it has ended).
        task.ttl_ms = None;
        let (link, cancel) = (TaskLink::default(), CancellationToken::new());
        let entry = Entry {
            task,
            created: Instant::now(),
            link: link.clone(),
            cancel: cancel.clone(),
            ended: None,
        };
        entries.insert(id.clone(), entry);
        Some(Opened { id, link, cancel })
    }

    fn settle(&self, id: &str, outcome: Outcome) {
        let mut entries = self.entries();
        if let Some(entry) = entries.get_mut(id) {
            entry.task.last_updated_at = current_timestamp();
            entry.ended = Some((Instant::now(), outcome));
        }
        self.sweep(&mut entries);
    }

    /// Removes an ended task, returning how it ended (a call whose work
    /// ended within its window answers with it directly).
    fn take(&self, id: &str) -> Option<Outcome> {
        let mut entries = self.entries();
        entries.get(id)?.ended.as_ref()?;
        entries.remove(id).and_then(|e| e.ended).map(|(_, o)| o)
    }

    fn seed(&self, id: &str) -> Option<Task> {
        self.entries().get(id).map(|e| e.task.clone())
    }

    /// `tasks/get`.
    pub fn get(&self, id: &str) -> Result<DetailedTask, McpError> {
        let mut entries = self.entries();
        self.sweep(&mut entries);
        let entry = entries.get(id).ok_or_else(|| unknown_task(id))?;
        Ok(entry.detailed(self.keep))
    }

    /// `tasks/update`: no task of ferrepl's asks for input, so there is
    /// nothing to answer; an unknown id is refused.
    pub fn update(&self, id: &str) -> Result<(), McpError> {
        let mut entries = self.entries();
        self.sweep(&mut entries);
        entries.get(id).map(|_| ()).ok_or_else(|| unknown_task(id))
    }

    /// `tasks/cancel`: the task's call is cancelled (its cell interrupted,
    /// its job sent SIGINT); it settles as `cancelled` once that is done.
    pub fn cancel(&self, id: &str) -> Result<(), McpError> {
        let mut entries = self.entries();
        self.sweep(&mut entries);
        let entry = entries.get_mut(id).ok_or_else(|| unknown_task(id))?;
        if entry.ended.is_none() {
            entry.cancel.cancel();
            entry.task.last_updated_at = current_timestamp();
        }
        Ok(())
    }

    /// Drops ended tasks past their keeping, then the oldest ended ones
    /// past [`MAX_KEPT`].
    fn sweep(&self, entries: &mut HashMap<String, Entry>) {
        entries.retain(|_, e| {
            e.ended
                .as_ref()
                .is_none_or(|(at, _)| at.elapsed() < self.keep)
        });
        let mut ended: Vec<(Instant, String)> = entries
            .iter()
            .filter_map(|(id, e)| e.ended.as_ref().map(|(at, _)| (*at, id.clone())))
            .collect();
        if ended.len() > MAX_KEPT {
            ended.sort();
            for (_, id) in &ended[..ended.len() - MAX_KEPT] {
                entries.remove(id);
            }
        }
    }
}

/// Whether this call may become a task (a tool that runs long): only when the request's own
/// `_meta` declares the extension, as the extension requires, whatever the
/// client declared at initialize. A legacy connection's requests carry no
/// capabilities of their own, so its clients (the Inspector CLI, SDKs in
/// legacy mode, which declare the extension but cannot follow a task) get
/// `running` results as before.
pub(crate) fn wanted(tool: &str, context: &RequestContext<RoleServer>) -> bool {
    TASK_TOOLS.contains(&tool)
        && context
            .meta
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks())
}

impl FerreplServer {
    /// Runs a call in the task `opened`; answers like any call when its
    /// work ends within its window, with the task's handle otherwise.
    pub(super) async fn call_as_task(
        &self,
        opened: Opened,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        unknown: Option<String>,
        started: Instant,
    ) -> Result<CallToolResponse, McpError> {
        let Opened { id, link, cancel } = opened;
        let window = self.manager.wait_window(wait_argument(&request));
        let tool = crate::metrics::tool_label(&request.name, super::groups::tool_names());
        // The task's own request: its cancellation is tasks/cancel (not the
        // connection's end), and its calls follow the work to the end.
        let mut own = context.clone();
        own.ct = cancel.clone();
        own.extensions.insert(link);
        let (server, store, task_id) = (self.clone(), self.tasks.clone(), id.clone());
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        // The call runs on its own so that even a panic in it ends the task.
        let work = tokio::spawn(async move { server.route(request, own, unknown).await });
        tokio::spawn(async move {
            let outcome = match work.await {
                Ok(Ok(CallToolResponse::Complete(result))) => {
                    if cancel.is_cancelled() && result.is_error == Some(true) {
                        Outcome::Cancelled(cancelled_message(&result))
                    } else {
                        Outcome::Result(result)
                    }
                }
                Ok(Ok(_)) => Outcome::Error(McpError::internal_error(
                    "the tool gave no final result",
                    None,
                )),
                Ok(Err(e)) => Outcome::Error(e),
                Err(e) => Outcome::Error(McpError::internal_error(
                    format!("the task's call failed: {e}"),
                    None,
                )),
            };
            crate::metrics::tool_call(tool, metric_of(&outcome), started.elapsed());
            store.settle(&task_id, outcome);
            let _ = done_tx.send(());
        });
        tokio::select! {
            waited = tokio::time::timeout(window, done_rx) => {
                if waited.is_ok()
                    && let Some(outcome) = self.tasks.take(&id)
                {
                    return match outcome {
                        Outcome::Result(result) => Ok(CallToolResponse::Complete(result)),
                        Outcome::Error(e) => Err(e),
                        Outcome::Cancelled(what) => Ok(CallToolResponse::Complete(
                            CallToolResult::error(vec![ContentBlock::text(format!("error: {what}"))]),
                        )),
                    };
                }
                let task = self.tasks.seed(&id).ok_or_else(|| unknown_task(&id))?;
                Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
            }
            _ = context.ct.cancelled() => {
                // The client gave up before it learned the task: as today,
                // the cell is interrupted (the job sent SIGINT).
                let _ = self.tasks.cancel(&id);
                Ok(CallToolResponse::Complete(CallToolResult::error(vec![ContentBlock::text(
                    "error: the call was cancelled by the client; its work was interrupted",
                )])))
            }
        }
    }
}

/// The `wait_s` a call gives, when it is one (a bad one is the tool's to
/// refuse).
fn wait_argument(request: &CallToolRequestParams) -> Option<f64> {
    let value = request.arguments.as_ref()?.get("wait_s")?.as_f64()?;
    (value.is_finite() && value >= 0.0).then_some(value)
}

/// What a cancelled call's error says, as the task's status message.
fn cancelled_message(result: &CallToolResult) -> String {
    let text = first_text(result).unwrap_or_default();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    text.replace(
        "the call was cancelled by the client",
        "the task was cancelled",
    )
}

fn first_text(result: &CallToolResult) -> Option<String> {
    result.content.iter().find_map(|c| match c {
        ContentBlock::Text(t) => Some(t.text.clone()),
        _ => None,
    })
}

/// A result's last line (a cell's or job's status line), as the status
/// message of its completed task.
fn last_line(result: &CallToolResult) -> Option<String> {
    let text = first_text(result)?;
    text.lines().last().map(str::to_string)
}

fn metric_of(outcome: &Outcome) -> crate::metrics::ToolOutcome {
    use crate::metrics::ToolOutcome;
    match outcome {
        Outcome::Result(r) if r.is_error == Some(true) => ToolOutcome::Error,
        Outcome::Result(_) => ToolOutcome::Ok,
        Outcome::Error(_) => ToolOutcome::ProtocolError,
        Outcome::Cancelled(_) => ToolOutcome::Error,
    }
}

fn object_of<T: serde::Serialize>(value: &T) -> JsonObject {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => JsonObject::new(),
    }
}

fn unknown_task(id: &str) -> McpError {
    McpError::invalid_params(
        format!("no task '{id}': it never existed here, or it ended and was dropped"),
        None,
    )
}

/// 128 random bits in hex: task ids are bearer handles, not guessable.
fn random_id() -> Option<String> {
    crate::config::tokens::random_id(16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Outcome {
        Outcome::Result(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    #[test]
    fn working_tasks_are_capped_and_ended_ones_kept_at_most_max_kept() {
        let store = TaskStore::new(2, Duration::from_secs(3600));
        let a = store.open("python_exec").expect("first").id;
        let _b = store.open("python_exec").expect("second");
        assert!(store.open("python_exec").is_none(), "a third is refused");
        store.settle(&a, ok("-- ok | cell 1 | session default | 1 ms --"));
        let detailed = store.get(&a).expect("kept");
        assert_eq!(detailed.status(), TaskStatus::Completed);
        assert_eq!(
            detailed.task.status_message.as_deref(),
            Some("-- ok | cell 1 | session default | 1 ms --")
        );
        assert!(detailed.task.ttl_ms.is_some_and(|ms| ms >= 3_600_000));
        for _ in 0..MAX_KEPT + 5 {
            let id = store.open("shell_exec").expect("room again").id;
            store.settle(&id, ok("done"));
        }
        assert!(store.get(&a).is_err(), "the oldest ended task went first");
        let ended = store
            .entries()
            .values()
            .filter(|e| e.ended.is_some())
            .count();
        assert_eq!(ended, MAX_KEPT);
    }

    #[test]
    fn a_working_task_shows_its_progress_and_no_lifetime_and_cancel_reaches_it() {
        let store = TaskStore::new(4, Duration::ZERO);
        let Opened { id, link, cancel } = store.open("python_exec").expect("open");
        link.set_status("running for 3 s: epoch 2".into());
        let detailed = store.get(&id).expect("known");
        assert_eq!(detailed.status(), TaskStatus::Working);
        assert_eq!(detailed.task.ttl_ms, None);
        assert_eq!(
            detailed.task.status_message.as_deref(),
            Some("running for 3 s: epoch 2")
        );
        store.cancel(&id).expect("ack");
        assert!(cancel.is_cancelled());
        store.settle(&id, Outcome::Cancelled("the cell was interrupted".into()));
        assert_eq!(
            store.get(&id).expect("kept").status(),
            TaskStatus::Cancelled
        );
        assert!(store.update(&id).is_ok());
        let err = store.get("nope").expect_err("unknown");
        assert_eq!(err.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    }

    #[test]
    fn ids_are_random_hex() {
        let (a, b) = (random_id().expect("id"), random_id().expect("id"));
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
