//! Requests answered by a session's control thread or its records,
//! without running a cell: inspect, complete, namespace edits, imports,
//! history, full output and progress, and the server's status.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::default_language;
use super::error::SessionError;
use super::kept::HistoryEntry;
use super::lifecycle::{queued_cell, rebuild_progress};
use super::manager::SessionManager;
use crate::worker::Language;

/// What the status reports besides the sessions.
pub struct StatusSnapshot {
    pub uptime_s: f64,
    pub python: String,
    pub workdir: String,
    pub limits: BTreeMap<String, Value>,
    pub sandbox: String,
    /// Pooled interpreters ready now, and how many the pool keeps.
    pub warm_pool: (usize, usize),
}

impl SessionManager {
    pub async fn inspect(
        self: &Arc<Self>,
        name: &str,
        target: Option<&str>,
    ) -> Result<Value, SessionError> {
        let mut args = serde_json::Map::new();
        args.insert(
            "name".into(),
            target.map(Value::from).unwrap_or(Value::Null),
        );
        let sess = self.existing(name).ok();
        let tool = sess
            .as_ref()
            .map_or(Language::Python, |s| s.language)
            .inspect_tool();
        // A kernel lists no variables (its refusal says what to do instead).
        let next = match (sess.as_ref().and_then(|s| s.kernel()), target) {
            (Some(_), Some(_)) => "; check the name, or run the cell that defines it first".into(),
            (Some(_), None) => String::new(),
            (None, _) => format!("; call {tool} without a name to list the variables"),
        };
        self.control(name, "inspect", args)
            .await
            .map_err(|e| match e {
                SessionError::Invalid(msg) => SessionError::Inspect(format!("{msg}{next}")),
                other => other,
            })
    }

    pub fn history(
        &self,
        name: &str,
        last: Option<usize>,
    ) -> Result<Vec<HistoryEntry>, SessionError> {
        let sess = self.existing(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        let n = last.unwrap_or(20).max(1);
        let skip = st.kept.history().len().saturating_sub(n);
        let current: std::collections::HashSet<u64> =
            st.lineage.path().iter().map(|c| c.id).collect();
        Ok(st
            .kept
            .history()
            .iter()
            .skip(skip)
            .map(|h| HistoryEntry {
                current: h.by.is_none() && current.contains(&h.cell),
                ..h.clone()
            })
            .collect())
    }

    /// The running cell of a session, as (number, code, seconds), for history.
    pub fn running_cell(&self, name: &str) -> Option<(u64, String, f64)> {
        let sess = self.existing(name).ok()?;
        let st = sess.lock();
        if let Some(rb) = st.lifecycle.rebuild() {
            // The rebuild's cells are not new ones: the queued cell is.
            return queued_cell(rb);
        }
        st.inbox
            .running
            .as_ref()
            .map(|r| (r.number, r.code.clone(), r.elapsed_secs()))
    }

    /// A request answered by the driver's control thread.
    pub(super) async fn control(
        self: &Arc<Self>,
        name: &str,
        op: &str,
        args: serde_json::Map<String, Value>,
    ) -> Result<Value, SessionError> {
        let sess = if let Some(lang) = default_language(name) {
            self.get_or_create(name, lang)?
        } else {
            self.existing(name)?
        };
        // A dormant session is rebuilt first: inspecting it shows its state.
        let worker = self.ready_worker(&sess).await?;
        let kernel_between_cells = sess.kernel().is_some() && matches!(op, "inspect" | "complete");
        if sess.language == Language::R || kernel_between_cells {
            // R has one thread, and a kernel reads its shell socket between
            // cells: the request would only wait for the cell's end.
            let st = sess.lock();
            if let Some(busy) = sess.busy_now(&st) {
                return Err(busy);
            }
        }
        let reply = worker
            .control(op, args, self.limits.inspect_timeout)
            .await
            .map_err(|source| SessionError::Worker {
                session: sess.name.clone(),
                source,
            })?;
        if reply.get("ok").and_then(Value::as_bool) != Some(true) {
            let msg = reply
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or(if op == "inspect" {
                    "inspect failed"
                } else {
                    "the request failed"
                });
            return Err(SessionError::Invalid(format!(
                "session '{}': {msg}",
                sess.name
            )));
        }
        Ok(reply)
    }

    /// The interpreter a session runs (or would run, if it does not exist yet).
    pub fn session_python(&self, name: &str) -> PathBuf {
        self.sessions()
            .get(name)
            .and_then(|s| s.spec.as_ref().map(|spec| spec.program.clone()))
            .unwrap_or_else(|| self.spec.program.clone())
    }

    /// Makes the kept venv session `name` runs, if it runs one and it is
    /// not made yet (an install may come before any interpreter started).
    pub async fn ready_venv(&self, name: &str) -> Result<(), String> {
        let python = self.session_python(name);
        match &self.spec.venv {
            Some(venv) if venv.python() == python => {
                if let Some(preinstall) = &venv.preinstall
                    && !preinstall.settled(std::time::Duration::ZERO).await
                {
                    // Two installers in one venv at once would corrupt it.
                    return Err(format!(
                        "{}; call python_install again once it has ended",
                        preinstall.progress()
                    ));
                }
                venv.ensure(&self.spec, self.limits.start_timeout).await
            }
            _ => Ok(()),
        }
    }

    /// The interpreter sessions of `lang` run by default.
    pub fn interpreter_of(&self, lang: Language) -> PathBuf {
        self.spec_for(lang)
            .map_or_else(|| PathBuf::from("R"), |s| s.program.clone())
    }

    /// Makes newly installed packages importable in a running session.
    pub async fn refresh_imports(self: &Arc<Self>, name: &str) -> Result<(), SessionError> {
        if self.existing(name).is_err() {
            return Ok(());
        }
        self.control(name, "refresh_imports", serde_json::Map::new())
            .await
            .map(|_| ())
    }

    pub async fn complete(
        self: &Arc<Self>,
        name: &str,
        code: &str,
        cursor: Option<usize>,
    ) -> Result<Value, SessionError> {
        let mut args = serde_json::Map::new();
        args.insert("code".into(), Value::from(code));
        args.insert(
            "cursor".into(),
            cursor.map(Value::from).unwrap_or(Value::Null),
        );
        self.control(name, "complete", args).await
    }

    /// Sets, deletes or clears names. Refused while a cell runs, so a cell
    /// never sees its variables change under it.
    pub async fn edit_namespace(
        self: &Arc<Self>,
        name: &str,
        args: serde_json::Map<String, Value>,
    ) -> Result<Value, SessionError> {
        if let Ok(sess) = self.existing(name) {
            let mut st = sess.lock();
            self.refresh(&sess, &mut st);
            if let Some(busy) = sess.busy_now(&st) {
                return Err(busy);
            }
        }
        self.control(name, "namespace", args).await
    }

    /// What server_status reports besides the sessions.
    pub fn status(&self) -> StatusSnapshot {
        let l = &self.limits;
        let secs = |d: Duration| Value::from(d.as_secs_f64());
        let mut limits = BTreeMap::new();
        limits.insert("default-wait".into(), secs(l.default_wait));
        limits.insert("max-wait".into(), secs(l.max_wait));
        limits.insert("max-sessions".into(), Value::from(l.max_sessions));
        limits.insert(
            "session-ttl".into(),
            l.session_ttl.map(secs).unwrap_or(Value::Null),
        );
        limits.insert(
            "max-cell-seconds".into(),
            l.max_cell.map(secs).unwrap_or(Value::Null),
        );
        limits.insert("interrupt-grace".into(), secs(l.interrupt_grace));
        limits.insert("start-timeout".into(), secs(l.start_timeout));
        limits.insert("warm-pool".into(), Value::from(l.warm_pool));
        limits.insert("max-images".into(), Value::from(l.max_images));
        limits.insert(
            "max-image-bytes".into(),
            Value::from(self.spec.max_image_bytes),
        );
        limits.insert(
            "output-head-bytes".into(),
            Value::from(self.spec.output_head_bytes),
        );
        limits.insert(
            "output-tail-bytes".into(),
            Value::from(self.spec.output_tail_bytes),
        );
        limits.insert("output-log-bytes".into(), Value::from(l.cell_log_bytes));
        limits.insert("output-keep-cells".into(), Value::from(l.keep_cells));
        limits.insert(
            "max-value-chars".into(),
            Value::from(self.spec.max_value_chars),
        );
        StatusSnapshot {
            uptime_s: self.started.elapsed().as_secs_f64(),
            python: self.spec.program.display().to_string(),
            workdir: self.spec.workdir.display().to_string(),
            limits,
            sandbox: self
                .spec
                .sandbox
                .as_ref()
                .map(|s| s.active.clone())
                .unwrap_or_else(|| "OFF".to_string()),
            warm_pool: (self.pool.len(), self.pool.target()),
        }
    }

    /// The full output of a cell (default: the running or latest one):
    /// its number, whether it still runs, the bytes, and bytes not kept.
    pub fn cell_output(
        &self,
        name: &str,
        cell: Option<u64>,
    ) -> Result<(u64, bool, Vec<u8>, u64), SessionError> {
        let sess = self.existing(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        let running = st.inbox.running.as_ref().map(|r| r.number);
        let kept = st.kept.log_cells();
        let target = cell.or(running).or_else(|| kept.last().copied());
        let Some(target) = target else {
            return Err(SessionError::NoOutput {
                lang: sess.language,
                session: sess.name.clone(),
                detail: "no cell has run yet".into(),
            });
        };
        if Some(target) == running {
            let worker = st.worker.clone();
            let Some(run) = st.inbox.running.as_mut() else {
                return Err(SessionError::Idle(sess.language, sess.name.clone()));
            };
            let mut bytes = run.log.bytes();
            if let Some(w) = worker {
                w.peek_log(&mut bytes);
            }
            return Ok((target, true, bytes, run.log.dropped()));
        }
        match st.kept.log_mut(target) {
            Some(log) => {
                let dropped = log.dropped();
                Ok((target, false, log.bytes(), dropped))
            }
            None => Err(SessionError::NoOutput {
                lang: sess.language,
                session: sess.name.clone(),
                detail: match (kept.first(), kept.last()) {
                    (Some(a), Some(b)) => format!(
                        "cell {target} is not kept (output is kept for cells {a}..{b}; --output-keep-cells)"
                    ),
                    _ => format!("cell {target} has no output kept"),
                },
            }),
        }
    }

    /// Elapsed seconds of the running cell and its latest output line.
    pub fn progress(&self, name: &str) -> Option<(f64, String)> {
        let sess = self.existing(name).ok()?;
        let st = sess.lock();
        if let Some(rb) = st.lifecycle.rebuild() {
            return Some(rebuild_progress(&sess.name, rb));
        }
        let run = st.inbox.running.as_ref()?;
        // A tool call's own progress says more than the last line printed.
        let line = st
            .worker
            .as_ref()
            .and_then(|w| w.upstream_progress())
            .or_else(|| st.worker.as_ref().and_then(|w| w.last_output_line()))
            .or_else(|| run.output.last_line())
            .unwrap_or_default();
        Some((run.started.elapsed().as_secs_f64(), line))
    }
}
