//! Cells another client runs in a kernel session (an operator who ran
//! `ferrepl attach`): the bridge sees them on IOPub under a session id not
//! its own, follows each from its `execute_input` to its idle status, and
//! hands a bounded summary (code, status, the start of the output) to the
//! worker, so the agent learns its kernel's state moved under it. Never
//! answers or interrupts those cells: they are the other client's.

use jupyter_protocol::{ExecutionState, JupyterMessage, JupyterMessageContent};

use super::media::{cap, strip_ansi, text_of};

/// Characters of another client's code and output kept per cell.
const MAX_CODE_CHARS: usize = 4000;
const MAX_OUTPUT_CHARS: usize = 2000;
/// Cells of other clients followed at once (a client that starts more
/// without their ends arriving loses its oldest).
const MAX_FOLLOWED: usize = 8;

/// A cell another client ran, as the worker keeps it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ForeignCell {
    pub code: String,
    /// ok or error.
    pub status: String,
    /// The start of its output, its value or its error.
    pub output: String,
}

/// Other clients' cells whose end has not come yet, by their request's id.
#[derive(Default)]
pub(super) struct Foreign {
    followed: Vec<(String, ForeignCell)>,
}

impl Foreign {
    /// Looks at an IOPub message; returns another client's cell once it
    /// ended. `own` is the bridge's session id: its cells are not foreign.
    pub(super) fn observe(&mut self, own: &str, msg: &JupyterMessage) -> Option<ForeignCell> {
        let parent = msg.parent_header.as_ref()?;
        if parent.session == own {
            return None;
        }
        let id = parent.msg_id.as_str();
        if let JupyterMessageContent::ExecuteInput(input) = &msg.content {
            if self.followed.len() >= MAX_FOLLOWED {
                self.followed.remove(0);
            }
            let cell = ForeignCell {
                code: cap(&input.code, MAX_CODE_CHARS),
                status: "ok".into(),
                output: String::new(),
            };
            self.followed.push((id.to_string(), cell));
            return None;
        }
        let at = self.followed.iter().position(|(m, _)| m == id)?;
        let cell = &mut self.followed[at].1;
        let text = match &msg.content {
            JupyterMessageContent::StreamContent(s) => s.text.clone(),
            JupyterMessageContent::ExecuteResult(r) => {
                format!("{}\n", text_of(&r.data).unwrap_or_default())
            }
            JupyterMessageContent::DisplayData(d) => match text_of(&d.data) {
                Some(t) => format!("{t}\n"),
                None => "[a display]\n".into(),
            },
            JupyterMessageContent::ErrorOutput(e) => {
                cell.status = "error".into();
                let last = e.traceback.last().map(|l| strip_ansi(l));
                format!(
                    "{}\n",
                    last.unwrap_or_else(|| format!("{}: {}", e.ename, e.evalue))
                )
            }
            JupyterMessageContent::Status(s) if s.execution_state == ExecutionState::Idle => {
                return Some(self.followed.remove(at).1);
            }
            _ => return None,
        };
        // Bounded: past the cap the rest of its output is dropped.
        if cell.output.chars().count() < MAX_OUTPUT_CHARS {
            cell.output.push_str(&text);
            cell.output = cap(&cell.output, MAX_OUTPUT_CHARS);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use jupyter_protocol::{ExecuteInput, Status, StreamContent};

    use super::*;

    /// A message of the kernel's answering `parent`.
    fn answer(parent: &JupyterMessage, content: JupyterMessageContent) -> JupyterMessage {
        JupyterMessage::new(content, Some(parent))
    }

    fn request(session: &str) -> JupyterMessage {
        JupyterMessage::new(JupyterMessageContent::Status(Status::busy()), None)
            .with_session(session)
    }

    fn input(code: &str) -> JupyterMessageContent {
        JupyterMessageContent::ExecuteInput(ExecuteInput {
            code: code.into(),
            ..ExecuteInput::default()
        })
    }

    fn idle() -> JupyterMessageContent {
        JupyterMessageContent::Status(Status::idle())
    }

    #[test]
    fn another_clients_cell_is_followed_to_its_end_and_the_bridges_own_are_not() {
        let mut foreign = Foreign::default();
        let own = request("bridge");
        assert!(
            foreign
                .observe("bridge", &answer(&own, input("a = 1")))
                .is_none()
        );
        assert!(foreign.observe("bridge", &answer(&own, idle())).is_none());

        let other = request("console");
        assert!(
            foreign
                .observe("bridge", &answer(&other, input("print('hi')")))
                .is_none()
        );
        let out = JupyterMessageContent::StreamContent(StreamContent::stdout("hi\n"));
        assert!(foreign.observe("bridge", &answer(&other, out)).is_none());
        let cell = foreign
            .observe("bridge", &answer(&other, idle()))
            .expect("the other client's cell ended");
        assert_eq!(cell.code, "print('hi')");
        assert_eq!(cell.output, "hi\n");
        assert_eq!(cell.status, "ok");
        // An idle for a request that ran no cell (kernel_info) is nobody's cell.
        let info = request("console");
        assert!(foreign.observe("bridge", &answer(&info, idle())).is_none());
    }

    #[test]
    fn output_and_followed_cells_stay_bounded() {
        let mut foreign = Foreign::default();
        let requests: Vec<JupyterMessage> = (0..MAX_FOLLOWED + 2).map(|_| request("c")).collect();
        for r in &requests {
            foreign.observe("bridge", &answer(r, input("x")));
        }
        assert_eq!(foreign.followed.len(), MAX_FOLLOWED);
        // The oldest were let go: their end is nobody's cell now.
        assert!(
            foreign
                .observe("bridge", &answer(&requests[0], idle()))
                .is_none()
        );
        let last = &requests[MAX_FOLLOWED + 1];
        for _ in 0..100 {
            let out = JupyterMessageContent::StreamContent(StreamContent::stdout(&"y".repeat(100)));
            foreign.observe("bridge", &answer(last, out));
        }
        let cell = foreign
            .observe("bridge", &answer(last, idle()))
            .expect("ended");
        assert!(
            cell.output.chars().count() < MAX_OUTPUT_CHARS + 100,
            "{}",
            cell.output.len()
        );
    }
}
