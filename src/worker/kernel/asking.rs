//! The worker's requests a kernel answers with a message of its own:
//! completion and inspection (`complete_request`, `inspect_request` on the
//! shell socket, answered between cells) and interrupts
//! (`interrupt_request` on the control socket, answered at once). Each
//! request is remembered by its message id until the kernel's answer, which
//! becomes the driver's `reply` event. Never waits for an answer: the
//! worker's request times out on its own, and the oldest unanswered ones
//! are let go past a bound.

use std::collections::VecDeque;

use jupyter_protocol::{
    CompleteRequest, InspectRequest, InterruptRequest, JupyterMessage, JupyterMessageContent,
    ReplyStatus,
};
use serde_json::{Value, json};

use super::bridge::{Bridge, Sockets};
use super::media::{cap, strip_ansi, text_of};
use super::pipes::Sent;

/// Requests waiting for the kernel's answer; past this the oldest is let
/// go (its worker request has timed out by then: a busy kernel answers
/// completions only once its cell ends).
const MAX_ASKED: usize = 32;
/// Completions returned, as the driver's.
const MAX_COMPLETIONS: usize = 200;
/// Characters of the kernel's inspection text kept, as for a built-in
/// session's source.
const MAX_INSPECT_CHARS: usize = 8000;

/// What a request the kernel was sent was for.
enum Pending {
    /// Request id and code.
    Complete(u64, String),
    /// Request id and the name inspected.
    Inspect(u64, String),
    Interrupt(u64),
}

/// Requests the kernel has not answered yet, oldest first, by message id.
#[derive(Default)]
pub(super) struct Asked(VecDeque<(String, Pending)>);

impl Asked {
    fn add(&mut self, msg: &JupyterMessage, pending: Pending) {
        if self.0.len() >= MAX_ASKED {
            self.0.pop_front();
        }
        self.0.push_back((msg.header.msg_id.clone(), pending));
    }

    fn take(&mut self, msg: &JupyterMessage) -> Option<Pending> {
        let parent = msg.parent_header.as_ref()?;
        let at = self.0.iter().position(|(id, _)| *id == parent.msg_id)?;
        self.0.remove(at).map(|(_, pending)| pending)
    }
}

impl Bridge {
    /// Asks the kernel to complete `req`'s code at its cursor.
    pub(super) async fn ask_completion(
        &mut self,
        req: &Value,
        sockets: &mut Sockets,
        asked: &mut Asked,
    ) -> Sent {
        let Some(id) = req["id"].as_u64() else {
            return Ok(());
        };
        let code = req["code"].as_str().unwrap_or_default().to_string();
        let chars = code.chars().count();
        let cursor_pos = req["cursor"]
            .as_u64()
            .map_or(chars, |c| usize::try_from(c).unwrap_or(chars).min(chars));
        let ask = CompleteRequest {
            code: code.clone(),
            cursor_pos,
        };
        let msg = JupyterMessage::new(JupyterMessageContent::CompleteRequest(ask), None);
        asked.add(&msg, Pending::Complete(id, code));
        sockets.shell.send(msg).await.map_err(std::io::Error::other)
    }

    /// Asks the kernel about the name in `req` (as `name?` at a prompt).
    pub(super) async fn ask_inspection(
        &mut self,
        req: &Value,
        sockets: &mut Sockets,
        asked: &mut Asked,
    ) -> Sent {
        let Some(id) = req["id"].as_u64() else {
            return Ok(());
        };
        let name = req["name"].as_str().unwrap_or_default().to_string();
        if name.trim().is_empty() {
            let message = "a kernel session does not list its variables: name one to inspect, or run %whos (IPython) or ls.str() (R) as a cell";
            return self
                .reply(req, json!({"ok": false, "message": message}))
                .await;
        }
        let ask = InspectRequest {
            cursor_pos: name.chars().count(),
            code: name.clone(),
            detail_level: Some(0),
        };
        let msg = JupyterMessage::new(JupyterMessageContent::InspectRequest(ask), None);
        asked.add(&msg, Pending::Inspect(id, name));
        sockets.shell.send(msg).await.map_err(std::io::Error::other)
    }

    /// Asks the kernel to interrupt its cell, on its control socket (a
    /// kernelspec with `interrupt_mode: message`).
    pub(super) async fn ask_interrupt(
        &mut self,
        req: &Value,
        sockets: &mut Sockets,
        asked: &mut Asked,
    ) -> Sent {
        let Some(id) = req["id"].as_u64() else {
            return Ok(());
        };
        let msg = JupyterMessage::new(
            JupyterMessageContent::InterruptRequest(InterruptRequest {}),
            None,
        );
        tracing::debug!(id, "kernel: interrupt_request sent on the control socket");
        asked.add(&msg, Pending::Interrupt(id));
        sockets
            .control
            .send(msg)
            .await
            .map_err(std::io::Error::other)
    }

    /// A reply of the kernel's on its shell or control socket: the answer
    /// to a request asked, as the driver's reply.
    pub(super) async fn answered(&mut self, msg: JupyterMessage, asked: &mut Asked) -> Sent {
        let Some(pending) = asked.take(&msg) else {
            return Ok(());
        };
        let (id, body) = match (pending, &msg.content) {
            (Pending::Complete(id, code), JupyterMessageContent::CompleteReply(reply)) => {
                let token: String = code
                    .chars()
                    .skip(reply.cursor_start)
                    .take(reply.cursor_end.saturating_sub(reply.cursor_start))
                    .collect();
                let completions: Vec<Value> = reply
                    .matches
                    .iter()
                    .take(MAX_COMPLETIONS)
                    .map(|m| json!({"text": m, "kind": "name"}))
                    .collect();
                let body = json!({"ok": true, "engine": "kernel", "token": token,
                    "completions": completions});
                (id, body)
            }
            (Pending::Inspect(id, name), JupyterMessageContent::InspectReply(reply)) => {
                let text =
                    text_of(&reply.data).map(|t| cap(strip_ansi(t).trim_end(), MAX_INSPECT_CHARS));
                let body = match text {
                    Some(text) if reply.found => {
                        json!({"ok": true, "detail": {"name": name, "text": text}})
                    }
                    _ => json!({"ok": false,
                        "message": format!("'{}' was not found by the kernel (it answered the inspect_request with nothing found)", cap(&name, 200))}),
                };
                (id, body)
            }
            (Pending::Interrupt(id), JupyterMessageContent::InterruptReply(reply)) => {
                let body = if reply.status == ReplyStatus::Ok {
                    json!({"ok": true})
                } else {
                    let why = reply
                        .error
                        .as_ref()
                        .map(|e| format!("{}: {}", e.ename, e.evalue))
                        .unwrap_or_else(|| "no reason given".into());
                    json!({"ok": false, "message": cap(&why, 500)})
                };
                tracing::debug!(id, ok = body["ok"] == true, "kernel: interrupt_reply");
                (id, body)
            }
            // The answer to another kind of request than asked: not one.
            _ => return Ok(()),
        };
        let mut body = body;
        body["ev"] = json!("reply");
        body["id"] = json!(id);
        self.pipes.event(body).await
    }
}
