//! The bridge: plays a kernel worker's driver inside the server. It takes
//! the worker's requests (exec, input, control requests with ids), speaks
//! the Jupyter protocol with the kernel over its ipc sockets, and writes
//! what the driver would: output on the emulated stdout and stderr pipes,
//! a fence marker on both before every cell event, the events as JSON
//! lines (docs/protocol.md). Requests the kernel answers by a message of
//! its own (completion, inspection, interrupts) are `asking.rs`'s;
//! requests a kernel has no answer for get a reply saying so. Ends with
//! the kernel (or the worker).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use base64::Engine;
use jupyter_protocol::{
    ConnectionInfo, ExecuteRequest, ExecutionState, InputReply, JupyterMessage,
    JupyterMessageContent, Media, MediaType, ReplyStatus, Stdio,
};
use jupyter_zmq_client as zmq;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::asking::Asked;
use super::connect::Held;
use super::foreign::Foreign;
use super::media::{
    MAX_EVENT_IMAGE_BYTES, MAX_EVENT_TEXT_CHARS, MAX_PROMPT_CHARS, cap, error_of, png_size, text_of,
};
use super::pipes::{Pipes, Sent};

use crate::worker::Worker;
use crate::worker::protocol::PyError;

/// Cells asked for while one runs (the session sends one at a time).
const MAX_QUEUED: usize = 64;
/// How long a cell whose execute_reply came waits for its idle status,
/// counted from the reply or the cell's last output message after it
/// (the bridge may still be working through a backlog of its output).
/// The kernel publishes its output on a PUB socket, which drops messages
/// past ZeroMQ's high-water mark (1,000) while the bridge lags behind a
/// burst; the idle status can be among them, and the reply (on the shell
/// socket, never dropped) says the cell is over anyway.
pub(super) const IDLE_AFTER_REPLY: std::time::Duration = std::time::Duration::from_secs(2);
/// Said on the cell's stderr when it ended without its idle status.
const OUTPUT_MAY_BE_INCOMPLETE: &str = "[ferrepl: the kernel's output channel dropped messages (more than it queues were sent faster than the server read them): this cell's output may be incomplete]\n";

/// A message from one of the kernel's sockets.
pub(super) enum Incoming {
    Shell(JupyterMessage),
    /// A shell message of this type that could not be read.
    ShellUnread(String),
    IoPub(JupyterMessage),
    Stdin(JupyterMessage),
    Control(JupyterMessage),
}

/// The cell the kernel runs.
struct Running {
    cell: u64,
    msg_id: String,
    started: Instant,
    value: Option<String>,
    error: Option<PyError>,
    /// The kernel's prompt waiting for an answer.
    prompt: Option<JupyterMessage>,
    /// Its execute_reply's status and its output's idle status, which
    /// come on two sockets in either order: the cell ends with both.
    reply: Option<ReplyStatus>,
    idle: bool,
    /// Since the reply came: when the cell was last heard of (the reply,
    /// then its output); its idle status is waited for until
    /// `IDLE_AFTER_REPLY` later.
    replied_at: Option<tokio::time::Instant>,
}

struct Queued {
    cell: u64,
    code: String,
    path: bool,
}

pub(super) struct Bridge {
    pub(super) worker: Weak<Worker>,
    pub(super) changed: watch::Receiver<u64>,
    /// The kernel's connection, as its connection file has it.
    pub(super) info: ConnectionInfo,
    /// Where the server's relays to the kernel's sockets listen (`relay.rs`).
    pub(super) relays: PathBuf,
    pub(super) program: String,
    pub(super) connection_file: PathBuf,
    pub(super) max_value_chars: usize,
    pub(super) max_image_bytes: u64,
    /// Code run silently before the first cell (an R kernel's library path).
    pub(super) prelude: Option<&'static str>,
    pub(super) pipes: Pipes,
    pub(super) requests: mpsc::Receiver<Vec<u8>>,
    pub(super) side: mpsc::Receiver<Vec<u8>>,
    /// What the kernel printed itself, shown when it does not start.
    pub(super) started_output: Arc<Mutex<Vec<u8>>>,
}

/// The bridge's sending halves of the kernel's sockets (their readers
/// are tasks of their own, `connect.rs`).
pub(super) struct Sockets {
    pub(super) shell: zmq::DealerSendConnection,
    pub(super) stdin: zmq::DealerSendConnection,
    pub(super) control: zmq::DealerSendConnection,
}

impl Bridge {
    pub(super) async fn run(mut self) {
        let mut readers = tokio::task::JoinSet::new();
        let ready = self.serve(&mut readers).await;
        if !ready {
            // Its own words are the reason it did not start.
            let text = std::mem::take(
                &mut *self
                    .started_output
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            let _ = self.pipes.write(1, &text).await;
        }
        // Dropping the pipes ends the worker's readers; the socket readers go too.
        readers.abort_all();
    }

    pub(super) fn gone(&self) -> bool {
        self.worker
            .upgrade()
            .is_none_or(|w| w.exit_info().is_some())
    }

    /// Connects, waits for the kernel, then serves; true once it was ready.
    async fn serve(&mut self, readers: &mut tokio::task::JoinSet<()>) -> bool {
        let session = super::random_hex();
        let (tx, mut rx) = mpsc::channel::<Held>(256);
        let Some(mut sockets) = self.connect(&session, &tx, readers).await else {
            return false;
        };
        let Some(version) = self.handshake(&mut sockets.shell, &mut rx).await else {
            return false;
        };
        if let Some(code) = self.prelude {
            // Its messages name no cell, so nothing of it reaches one.
            let request = ExecuteRequest {
                code: code.to_string(),
                silent: true,
                store_history: false,
                user_expressions: None,
                allow_stdin: false,
                stop_on_error: false,
            };
            let msg = JupyterMessage::new(JupyterMessageContent::ExecuteRequest(request), None);
            if sockets.shell.send(msg).await.is_err() {
                return false;
            }
        }
        let pid = self.kernel_pid().await;
        let ready =
            json!({"ev": "ready", "pid": pid, "version": version, "executable": self.program});
        if self.pipes.event(ready).await.is_err() {
            return true;
        }
        let mut queue: VecDeque<Queued> = VecDeque::new();
        let mut running: Option<Running> = None;
        let mut asked = Asked::default();
        let mut foreign = Foreign::default();
        loop {
            if running.is_none()
                && let Some(next) = queue.pop_front()
            {
                match self.start(&mut sockets.shell, next).await {
                    Ok(r) => running = r,
                    Err(_) => return true,
                }
            }
            let idle_due = running
                .as_ref()
                .filter(|c| !c.idle)
                .and_then(|c| c.replied_at)
                .map(|at| at + IDLE_AFTER_REPLY);
            let step = tokio::select! {
                () = until(idle_due) => self.idle_missed(&mut running).await,
                req = self.requests.recv() => match req {
                    Some(line) => self.request(&line, &mut queue, &mut running, &mut sockets, &mut asked).await,
                    None => return true,
                },
                req = self.side.recv() => match req {
                    Some(line) => self.request(&line, &mut queue, &mut running, &mut sockets, &mut asked).await,
                    None => return true,
                },
                msg = rx.recv() => match msg.map(Held::into_incoming) {
                    Some(Incoming::Shell(msg)) => match &msg.content {
                        JupyterMessageContent::ExecuteReply(r) => {
                            let parent = msg.parent_header.as_ref().map(|p| p.msg_id.as_str());
                            let ours = running.as_ref().is_some_and(|c| Some(c.msg_id.as_str()) == parent);
                            self.replied(ours.then(|| r.status.clone()), &mut running).await
                        }
                        _ => self.answered(msg, &mut asked).await,
                    },
                    Some(Incoming::Control(msg)) => self.answered(msg, &mut asked).await,
                    // One cell at a time: an unread execute_reply is the
                    // running cell's, and the status it could not carry is
                    // IRkernel's "abort" (interrupted).
                    Some(Incoming::ShellUnread(kind)) if kind == "execute_reply" => {
                        self.replied(Some(ReplyStatus::Aborted), &mut running).await
                    }
                    Some(Incoming::ShellUnread(_)) => Ok(()),
                    Some(Incoming::IoPub(msg)) if let Some(cell) = foreign.observe(&session, &msg) => {
                        self.pipes.event(json!({"ev": "foreign", "cell": cell})).await
                    }
                    Some(msg) => self.message(msg, &mut running).await,
                    None => return true,
                },
                changed = self.changed.changed() => {
                    if changed.is_err() || self.gone() {
                        return true;
                    }
                    Ok(())
                }
            };
            if step.is_err() {
                return true;
            }
        }
    }
}

impl Bridge {
    /// Sends cell `next` to the kernel (or refuses it at once).
    async fn start(
        &mut self,
        shell: &mut zmq::DealerSendConnection,
        next: Queued,
    ) -> std::io::Result<Option<Running>> {
        if next.path {
            let error = PyError {
                kind: "NotAvailable".into(),
                message: "python_run_file runs scripts in built-in sessions only".into(),
                traceback: "In a kernel session, run the script with python_exec: %run PATH\n"
                    .into(),
            };
            self.done(next.cell, "error", None, Some(error), 0.0)
                .await?;
            return Ok(None);
        }
        let request = ExecuteRequest {
            code: next.code,
            silent: false,
            store_history: true,
            user_expressions: None,
            allow_stdin: true,
            stop_on_error: false,
        };
        let msg = JupyterMessage::new(JupyterMessageContent::ExecuteRequest(request), None);
        let msg_id = msg.header.msg_id.clone();
        shell.send(msg).await.map_err(std::io::Error::other)?;
        Ok(Some(Running {
            cell: next.cell,
            msg_id,
            started: Instant::now(),
            value: None,
            error: None,
            prompt: None,
            reply: None,
            idle: false,
            replied_at: None,
        }))
    }

    async fn done(
        &mut self,
        cell: u64,
        status: &str,
        value: Option<String>,
        error: Option<PyError>,
        elapsed_ms: f64,
    ) -> Sent {
        self.pipes
            .fenced(
                json!({"ev": "done", "cell": cell, "status": status, "value": value,
                "error": error, "elapsed_ms": elapsed_ms}),
            )
            .await
    }

    /// A request line from the worker.
    async fn request(
        &mut self,
        line: &[u8],
        queue: &mut VecDeque<Queued>,
        running: &mut Option<Running>,
        sockets: &mut Sockets,
        asked: &mut Asked,
    ) -> Sent {
        let Ok(req) = serde_json::from_slice::<Value>(line) else {
            return Ok(());
        };
        let op = req["op"].as_str().unwrap_or_default();
        match op {
            "exec" if queue.len() < MAX_QUEUED => {
                queue.push_back(Queued {
                    cell: req["cell"].as_u64().unwrap_or(0),
                    code: req["code"].as_str().unwrap_or_default().to_string(),
                    path: req.get("path").is_some_and(|p| !p.is_null()),
                });
                Ok(())
            }
            "exec" => {
                // Never silently: the session waits for every cell's end.
                let error = PyError {
                    kind: "QueueFull".into(),
                    message: format!("{MAX_QUEUED} cells are waiting for the kernel already"),
                    traceback:
                        "Wait for the running cells (python_wait), then run this one again.\n"
                            .into(),
                };
                let cell = req["cell"].as_u64().unwrap_or(0);
                self.done(cell, "error", None, Some(error), 0.0).await
            }
            "input" => {
                let Some(cell) = running.as_mut() else {
                    return Ok(());
                };
                let Some(prompt) = cell
                    .prompt
                    .take_if(|_| req["cell"].as_u64() == Some(cell.cell))
                else {
                    return Ok(());
                };
                let text = req["text"].as_str().unwrap_or_default();
                // Like a terminal (and the driver): the prompt and the
                // answer, unless it was a password.
                if let JupyterMessageContent::InputRequest(r) = &prompt.content
                    && !r.password
                {
                    let echo = format!("{}{text}\n", cap(&r.prompt, MAX_PROMPT_CHARS));
                    self.pipes.write(0, echo.as_bytes()).await?;
                }
                let reply = InputReply {
                    value: text.to_string(),
                    status: ReplyStatus::Ok,
                    error: None,
                };
                let msg =
                    JupyterMessage::new(JupyterMessageContent::InputReply(reply), Some(&prompt))
                        .with_zmq_identities(Vec::new());
                sockets.stdin.send(msg).await.map_err(std::io::Error::other)
            }
            "complete" => self.ask_completion(&req, sockets, asked).await,
            "inspect" => self.ask_inspection(&req, sockets, asked).await,
            "interrupt" => self.ask_interrupt(&req, sockets, asked).await,
            // Nothing to refresh: a kernel imports from its own paths.
            "refresh_imports" => self.reply(&req, json!({"ok": true})).await,
            _ => {
                let language = self
                    .worker
                    .upgrade()
                    .map_or(crate::worker::Language::Python, |w| w.language());
                let message = format!(
                    "a kernel session does not answer '{op}': it has no checkpoints, branches, saved state, namespace tools or ferrepl.call; use a built-in {language} session for that (python_sessions create without kernel)"
                );
                self.reply(&req, json!({"ok": false, "message": message}))
                    .await
            }
        }
    }

    pub(super) async fn reply(&mut self, req: &Value, mut body: Value) -> Sent {
        let Some(id) = req["id"].as_u64() else {
            return Ok(());
        };
        body["ev"] = json!("reply");
        body["id"] = json!(id);
        self.pipes.event(body).await
    }

    /// A message from the kernel: the running cell's output, prompt or end.
    async fn message(&mut self, msg: Incoming, running: &mut Option<Running>) -> Sent {
        let (Incoming::IoPub(msg) | Incoming::Stdin(msg)) = msg else {
            return Ok(());
        };
        let Some(cell) = running.as_mut() else {
            return Ok(());
        };
        if msg.parent_header.as_ref().map(|p| p.msg_id.as_str()) != Some(cell.msg_id.as_str()) {
            return Ok(());
        }
        if cell.replied_at.is_some() {
            cell.replied_at = Some(tokio::time::Instant::now());
        }
        match &msg.content {
            JupyterMessageContent::StreamContent(s) => {
                let idx = usize::from(matches!(s.name, Stdio::Stderr));
                self.pipes.write(idx, s.text.as_bytes()).await?;
            }
            JupyterMessageContent::ExecuteResult(r) => {
                let max = self.max_value_chars.min(MAX_EVENT_TEXT_CHARS);
                cell.value = text_of(&r.data).map(|t| cap(t, max));
            }
            JupyterMessageContent::DisplayData(d) => {
                let number = cell.cell;
                self.display(number, &d.data).await?;
            }
            JupyterMessageContent::UpdateDisplayData(d) => {
                let number = cell.cell;
                self.display(number, &d.data).await?;
            }
            JupyterMessageContent::ErrorOutput(e) => {
                cell.error = Some(error_of(e, self.max_value_chars));
            }
            JupyterMessageContent::InputRequest(r) => {
                let event = json!({"ev": "input_request", "cell": cell.cell,
                    "prompt": cap(&r.prompt, MAX_PROMPT_CHARS), "password": r.password});
                cell.prompt = Some(msg.clone());
                self.pipes.fenced(event).await?;
            }
            JupyterMessageContent::Status(s) if s.execution_state == ExecutionState::Idle => {
                cell.idle = true;
                return self.ended(running).await;
            }
            _ => {}
        }
        Ok(())
    }

    /// The running cell's execute_reply (`status` None when it was
    /// another request's).
    async fn replied(
        &mut self,
        status: Option<ReplyStatus>,
        running: &mut Option<Running>,
    ) -> Sent {
        match (status, running.as_mut()) {
            (Some(status), Some(cell)) => {
                cell.reply = Some(status);
                cell.replied_at = Some(tokio::time::Instant::now());
                self.ended(running).await
            }
            _ => Ok(()),
        }
    }

    /// The running cell's idle status did not come in time after its
    /// reply (`IDLE_AFTER_REPLY`): it ends without it, saying its output
    /// may be cut.
    async fn idle_missed(&mut self, running: &mut Option<Running>) -> Sent {
        let Some(cell) = running.as_mut() else {
            return Ok(());
        };
        tracing::debug!(cell = cell.cell, "no idle status after the kernel's reply");
        cell.idle = true;
        self.pipes
            .write(1, OUTPUT_MAY_BE_INCOMPLETE.as_bytes())
            .await?;
        self.ended(running).await
    }

    /// Ends the running cell once both its reply and its idle status came.
    async fn ended(&mut self, running: &mut Option<Running>) -> Sent {
        let Some(cell) = running.take_if(|c| c.idle && c.reply.is_some()) else {
            return Ok(());
        };
        let status = match (&cell.error, &cell.reply) {
            (Some(e), _) if e.kind == "KeyboardInterrupt" => "interrupted",
            (_, Some(ReplyStatus::Aborted)) => "interrupted",
            (Some(_), _) => "error",
            (None, _) => "ok",
        };
        let elapsed = cell.started.elapsed().as_secs_f64() * 1000.0;
        self.done(cell.cell, status, cell.value, cell.error, elapsed)
            .await
    }

    /// A displayed object: an image as a display event, else its text.
    async fn display(&mut self, cell: u64, data: &Media) -> Sent {
        let image = data.content.iter().find_map(|m| match m {
            MediaType::Png(b) => Some(("image/png", b)),
            MediaType::Jpeg(b) => Some(("image/jpeg", b)),
            _ => None,
        });
        if let Some((mime, b64)) = image {
            let b64: String = b64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(&b64) {
                let limit = self.max_image_bytes.min(MAX_EVENT_IMAGE_BYTES);
                if bytes.len() as u64 > limit {
                    // The driver's words (display.py's emit_image).
                    let note = format!(
                        "[image not shown: {mime} of {} bytes is over the limit of {limit} bytes (--max-image-bytes); save it smaller, e.g. with a lower dpi]\n",
                        bytes.len()
                    );
                    return self.pipes.write(0, note.as_bytes()).await;
                }
                let (width, height) = png_size(&bytes).unzip();
                let sha = {
                    use sha2::Digest;
                    let digest = sha2::Sha256::digest(&bytes);
                    digest
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                };
                let event = json!({"ev": "display", "cell": cell, "mime": mime, "data": b64,
                    "bytes": bytes.len(), "width": width, "height": height, "sha": sha});
                return self.pipes.fenced(event).await;
            }
        }
        match text_of(data) {
            Some(text) => {
                let text = format!("{}\n", cap(text, self.max_value_chars));
                self.pipes.write(0, text.as_bytes()).await
            }
            None => Ok(()),
        }
    }
}

/// Waits until `deadline`, or for ever without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
