//! A session's code calling the operator's MCP servers: the driver's
//! `upstream` events, answered by `upstream_reply` requests on the channel
//! read while a cell runs (see docs/protocol.md). Bounded per worker: calls
//! in flight (beyond them, calls wait for a slot, in the order they came,
//! as long as the interpreter waits for them) and per cell (calls made:
//! refused past the cap); counted per cell for its result.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::Worker;
use super::protocol::UpstreamEvent;
use crate::upstream::{CallOutcome, Failure, ProgressSink, TenantUpstreams};

/// Calls that may wait for a slot at once, per worker: beyond them a call
/// is refused (a flood of hand-made events holds no more than this).
const MAX_WAITING: usize = 4096;
/// Bytes of arguments (as JSON) the waiting calls of a worker may hold.
const MAX_WAITING_BYTES: usize = 64 << 20;

/// A worker's tool calls: those in flight or waiting for a slot (with
/// where their progress goes), and the current cell's count.
#[derive(Default)]
pub(super) struct Calls {
    in_flight: HashMap<u64, InFlight>,
    cell: CellCalls,
    /// Since when some call has been in flight or waiting (time waiting on
    /// upstream servers counts once however many calls overlap).
    busy_since: Option<Instant>,
    /// Free slots of `--mcp-max-in-flight`, counted from the first call.
    free: Option<usize>,
    /// Calls waiting for a slot, oldest first, each woken when it gets one.
    /// Kept here, under the worker's lock, rather than in a semaphore: the
    /// order is the order events came, and a call cancelled while waiting
    /// leaves the line before any slot can go to it.
    queue: VecDeque<(u64, oneshot::Sender<()>)>,
    /// Calls waiting for a slot, and the bytes of their arguments.
    waiting: usize,
    waiting_bytes: usize,
}

impl Calls {
    fn add(&mut self, id: u64, call: InFlight) {
        if self.in_flight.is_empty() {
            self.busy_since = Some(Instant::now());
        }
        self.in_flight.insert(id, call);
    }

    /// A call ends (answered, failed or cancelled): its slot goes to the
    /// oldest call waiting, or is free again.
    fn remove(&mut self, id: u64) -> Option<InFlight> {
        let call = self.in_flight.remove(&id);
        if let Some(c) = &call {
            if let Some(bytes) = c.waiting {
                self.waiting -= 1;
                self.waiting_bytes -= bytes;
                self.queue.retain(|(q, _)| *q != id);
            }
            if c.holds_slot {
                self.pass_slot();
            }
        }
        if call.is_some() && self.in_flight.is_empty() {
            self.settle_busy();
        }
        call
    }

    fn pass_slot(&mut self) {
        while let Some((id, wake)) = self.queue.pop_front() {
            let Some(call) = self.in_flight.get_mut(&id) else {
                continue;
            };
            if let Some(bytes) = call.waiting.take() {
                self.waiting -= 1;
                self.waiting_bytes -= bytes;
            }
            call.holds_slot = true;
            if wake.send(()).is_ok() {
                return;
            }
            // Its task is gone: so is the call.
            call.holds_slot = false;
            self.in_flight.remove(&id);
        }
        if let Some(free) = &mut self.free {
            *free += 1;
        }
    }

    /// Counts the time some call was in flight into the current cell.
    fn settle_busy(&mut self) {
        if let Some(since) = self.busy_since.take() {
            self.cell.seconds += since.elapsed().as_secs_f64();
        }
        if !self.in_flight.is_empty() {
            self.busy_since = Some(Instant::now());
        }
    }
}

struct InFlight {
    cancel: CancellationToken,
    /// `server.tool`, for progress lines.
    what: String,
    progress: ProgressSink,
    /// Waiting for a slot, holding this many bytes of arguments.
    waiting: Option<usize>,
    /// Holds one of the slots (given back when the call ends).
    holds_slot: bool,
}

/// The tool calls one cell made.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct CellCalls {
    pub count: u64,
    pub failed: u64,
    /// Time some call was waiting on an upstream server (overlapping calls
    /// count once).
    pub seconds: f64,
}

impl CellCalls {
    /// One short line for the cell's result; None when it made none.
    pub fn summary(&self) -> Option<String> {
        if self.count == 0 {
            return None;
        }
        let failed = if self.failed > 0 {
            format!(", {} failed", self.failed)
        } else {
            String::new()
        };
        Some(format!(
            "Tool calls: {}{failed}, {:.2} s waiting on servers.",
            self.count, self.seconds
        ))
    }
}

impl Worker {
    /// The current cell's calls so far, reset for the next cell.
    pub fn take_cell_calls(&self) -> CellCalls {
        let mut st = self.lock();
        st.calls.settle_busy();
        std::mem::take(&mut st.calls.cell)
    }

    /// Ends every call in flight or waiting (the worker is gone).
    pub(super) fn cancel_calls(&self) {
        let mut st = self.lock();
        for (_, call) in st.calls.in_flight.drain() {
            call.cancel.cancel();
        }
        st.calls.queue.clear();
        st.calls.waiting = 0;
        st.calls.waiting_bytes = 0;
        st.calls.settle_busy();
    }

    /// The latest progress an upstream tool reported on a call in flight:
    /// `server.tool: 3/10 message`.
    pub fn upstream_progress(&self) -> Option<String> {
        let st = self.lock();
        st.calls.in_flight.values().find_map(|call| {
            let progress = call.progress.lock().unwrap_or_else(|e| e.into_inner());
            progress.as_ref().map(|p| format!("{}: {p}", call.what))
        })
    }

    pub(super) fn on_upstream(self: &Arc<Self>, ev: UpstreamEvent) {
        let Some(upstreams) = self.upstream.clone() else {
            let result = match ev.op.as_str() {
                "servers" => Ok(json!([])),
                "cancel" => return,
                _ => Err(Failure::Refused(
                    "no MCP servers are configured for this session (the operator adds them with --mcp-servers FILE)".into(),
                )),
            };
            self.reply_upstream(ev.id, result.map(Reply::Data));
            return;
        };
        match ev.op.as_str() {
            "servers" => self.reply_upstream(ev.id, Ok(Reply::Data(json!(upstreams.servers())))),
            "cancel" => {
                let removed = self.lock().calls.remove(ev.id);
                if let Some(call) = removed {
                    call.cancel.cancel();
                }
            }
            "tools" | "call" => self.start_call(upstreams, ev),
            other => self.reply_upstream(
                ev.id,
                Err(Failure::Refused(format!("unknown request '{other}'"))),
            ),
        }
    }

    fn start_call(self: &Arc<Self>, upstreams: Arc<TenantUpstreams>, ev: UpstreamEvent) {
        let limits = upstreams.limits().clone();
        let token = CancellationToken::new();
        let progress = ProgressSink::default();
        let is_call = ev.op == "call";
        let granted = {
            let mut st = self.lock();
            if st.calls.in_flight.contains_key(&ev.id) {
                drop(st);
                return self.reply_upstream(
                    ev.id,
                    Err(Failure::Refused(
                        "a tool call with this id is in flight already; each call needs its own id"
                            .into(),
                    )),
                );
            }
            // A runaway loop is refused, not queued: waiting calls count.
            if is_call && st.calls.cell.count >= limits.max_cell_calls {
                drop(st);
                return self.reply_upstream(
                    ev.id,
                    Err(Failure::Refused(format!(
                        "this cell has made {} tool calls, the most one cell may (--mcp-max-cell-calls); continue in another cell",
                        limits.max_cell_calls
                    ))),
                );
            }
            // Every slot taken: the call waits for one, within bounds that
            // keep a flood of events from holding the server's memory.
            let free = *st.calls.free.get_or_insert(limits.max_in_flight.max(1));
            let waiting = if free == 0 || !st.calls.queue.is_empty() {
                let bytes = ev
                    .arguments
                    .as_ref()
                    .map_or(0, |a| serde_json::to_vec(a).map_or(0, |v| v.len()));
                if st.calls.waiting >= MAX_WAITING
                    || st.calls.waiting_bytes + bytes > MAX_WAITING_BYTES
                {
                    let (n, held) = (st.calls.waiting, st.calls.waiting_bytes);
                    drop(st);
                    return self.reply_upstream(
                        ev.id,
                        Err(Failure::Refused(format!(
                            "this session has {} tool calls in flight (--mcp-max-in-flight) and {n} more waiting for a slot, holding {} KiB of arguments (at most {MAX_WAITING} calls and {} MiB wait); await some before starting more",
                            limits.max_in_flight,
                            held >> 10,
                            MAX_WAITING_BYTES >> 20
                        ))),
                    );
                }
                st.calls.waiting += 1;
                st.calls.waiting_bytes += bytes;
                Some(bytes)
            } else {
                None
            };
            if is_call {
                st.calls.cell.count += 1;
            }
            let what = format!(
                "{}.{}",
                ev.server.as_deref().unwrap_or(""),
                ev.tool.as_deref().unwrap_or("")
            );
            let granted = if waiting.is_some() {
                let (wake, granted) = oneshot::channel();
                st.calls.queue.push_back((ev.id, wake));
                Some(granted)
            } else {
                st.calls.free = Some(free - 1);
                None
            };
            st.calls.add(
                ev.id,
                InFlight {
                    cancel: token.clone(),
                    what,
                    progress: progress.clone(),
                    holds_slot: waiting.is_none(),
                    waiting,
                },
            );
            granted
        };
        let worker = self.clone();
        tokio::spawn(async move {
            // A call waiting for its slot: one cancelled meanwhile
            // (interrupt, the code stopped waiting, the worker ended) has
            // left the line already, and leaves without a word.
            if let Some(granted) = granted {
                tokio::select! {
                    given = granted => if given.is_err() { return },
                    _ = token.cancelled() => return,
                }
            }
            let server = ev.server.unwrap_or_default();
            let work = async {
                if is_call {
                    let arguments = match ev.arguments {
                        None | Some(Value::Null) => Map::new(),
                        Some(Value::Object(m)) => m,
                        Some(_) => {
                            return Err(Failure::Refused(
                                "a tool's arguments are keyword arguments (a JSON object)".into(),
                            ));
                        }
                    };
                    let tool = ev.tool.unwrap_or_default();
                    match upstreams
                        .call(&server, &tool, arguments, Some(progress))
                        .await
                    {
                        CallOutcome::Ok(v) => Ok(Reply::Data(v)),
                        CallOutcome::ToolError(m) => Ok(Reply::ToolError(m)),
                        CallOutcome::Failure(f) => Err(f),
                    }
                } else {
                    upstreams.tools(&server).await.map(Reply::Data)
                }
            };
            let outcome = tokio::select! {
                r = work => Some(r),
                _ = token.cancelled() => None,
            };
            {
                let mut st = worker.lock();
                st.calls.remove(ev.id);
                if is_call && !matches!(outcome, Some(Ok(Reply::Data(_)))) {
                    st.calls.cell.failed += 1;
                }
            }
            // A cancelled call gets no answer: the code stopped waiting.
            if let Some(outcome) = outcome {
                worker.reply_upstream(ev.id, outcome);
            }
        });
    }

    fn reply_upstream(self: &Arc<Self>, id: u64, outcome: Result<Reply, Failure>) {
        let mut msg = Map::new();
        msg.insert("op".into(), json!("upstream_reply"));
        msg.insert("id".into(), json!(id));
        match outcome {
            Ok(Reply::Data(result)) => {
                msg.insert("ok".into(), json!(true));
                msg.insert("result".into(), result);
            }
            Ok(Reply::ToolError(message)) => {
                msg.insert("ok".into(), json!(false));
                msg.insert("kind".into(), json!("tool_error"));
                msg.insert("error".into(), json!(message));
            }
            Err(failure) => {
                let (kind, message) = match failure {
                    Failure::Refused(m) => ("refused", m),
                    Failure::Failed(m) => ("failed", m),
                };
                msg.insert("ok".into(), json!(false));
                msg.insert("kind".into(), json!(kind));
                msg.insert("error".into(), json!(message));
            }
        }
        // R reads this one as JSON with a parser of its own (tools.R): it
        // carries third-party data, which must never reach R's evaluator as
        // the R expressions of other requests do.
        let line = match self.language {
            super::Language::R => {
                let mut line = serde_json::to_vec(&msg).unwrap_or_default();
                line.push(b'\n');
                line
            }
            super::Language::Python => self.encode(&msg),
        };
        let channel = self.channel_for(true).clone();
        tokio::spawn(async move {
            let _ = channel.send(line).await;
        });
    }
}

enum Reply {
    Data(Value),
    ToolError(String),
}
