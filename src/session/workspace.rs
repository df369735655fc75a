//! Managing sessions and their namespaces: create with options, delete, idle
//! expiry, history, completion and namespace edits without running code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{HistoryEntry, Session, SessionError, SessionManager};
use crate::worker::LaunchSpec;

pub struct StatusSnapshot {
    pub uptime_s: f64,
    pub python: String,
    pub workdir: String,
    pub limits: BTreeMap<String, Value>,
    pub sandbox: String,
}

/// Settings of a session created with python_sessions create.
#[derive(Debug, Default, Clone)]
pub struct SessionOptions {
    pub python: Option<PathBuf>,
    pub venv: Option<PathBuf>,
    pub workdir: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
}

use crate::worker::python::is_executable;

impl SessionManager {
    /// Creates a session with its own interpreter, directory or environment.
    pub async fn create(
        self: &Arc<Self>,
        name: &str,
        opts: SessionOptions,
    ) -> Result<Arc<Session>, SessionError> {
        if self.sessions().contains_key(name) {
            return Err(SessionError::Invalid(format!(
                "session '{name}' already exists; delete it first (python_sessions action=delete) or pick another name"
            )));
        }
        let mut spec: LaunchSpec = self.spec.clone();
        let mut custom = false;
        if let Some(venv) = &opts.venv {
            let venv = self.allowed_interpreter(venv, "venv")?;
            let python = venv.join("bin").join("python");
            if !is_executable(&python) {
                return Err(SessionError::Invalid(format!(
                    "'{}' is not a virtual environment: {} is missing; create it with `python3 -m venv {}`",
                    venv.display(),
                    python.display(),
                    venv.display()
                )));
            }
            spec.python = python;
            custom = true;
        }
        if let Some(python) = &opts.python {
            let python = self.allowed_interpreter(python, "python")?;
            if !is_executable(&python) {
                return Err(SessionError::Invalid(format!(
                    "interpreter '{}' does not exist or is not executable; pass the path of a python3 inside the workspace",
                    python.display()
                )));
            }
            spec.python = python;
            custom = true;
        }
        if let Some(dir) = &opts.workdir {
            spec.workdir = self.inside_workspace(dir)?;
            custom = true;
        }
        crate::sandbox::env::check(&opts.env).map_err(SessionError::Invalid)?;
        for (k, v) in &opts.env {
            spec.env.push((k.clone(), v.clone()));
            custom = true;
        }
        let sess = self.get_or_create_with(name, custom.then_some(spec))?;
        self.ensure_worker(&sess).await?;
        Ok(sess)
    }

    /// A `workdir` argument: an existing directory whose real location
    /// (symlinks resolved) is inside the server's workspace.
    fn inside_workspace(&self, dir: &Path) -> Result<PathBuf, SessionError> {
        let workspace = self.workspace();
        let path = crate::sandbox::paths::normalize(dir, workspace);
        let real = path.canonicalize().map_err(|_| {
            SessionError::Invalid(format!(
                "workdir '{}' does not exist; give a directory inside the workspace {}",
                dir.display(),
                workspace.display()
            ))
        })?;
        if !real.starts_with(workspace) || !real.is_dir() {
            return Err(SessionError::Invalid(format!(
                "workdir '{}' is not a directory inside the workspace {}; sessions may only start there",
                dir.display(),
                workspace.display()
            )));
        }
        Ok(real)
    }

    /// A `python`/`venv` argument: inside the workspace (it then runs in
    /// the same sandbox as everything else), or one the operator allowed
    /// (--python, --venv, --allow-python).
    fn allowed_interpreter(&self, path: &Path, arg: &str) -> Result<PathBuf, SessionError> {
        let workspace = self.workspace();
        let abs = crate::sandbox::paths::normalize(path, workspace);
        let allowed = self
            .spec
            .sandbox
            .as_ref()
            .map(|s| s.allowed_python.as_slice())
            .unwrap_or_default();
        let by_operator = allowed
            .iter()
            .any(|a| *a == abs || (a.is_dir() && abs.starts_with(a)));
        // Symlinks in the existing part of the path must not lead out (a
        // missing directory is reported as missing below).
        let inside = abs.starts_with(workspace)
            && abs
                .parent()
                .is_none_or(|p| p.canonicalize().map_or(true, |p| p.starts_with(workspace)));
        if inside || by_operator {
            return Ok(abs);
        }
        Err(SessionError::Invalid(format!(
            "{arg} '{}' is outside the workspace and was not allowed by the operator; use an interpreter or venv inside the workspace {} (e.g. python3 -m venv .venv), or ask the operator to start ferrepl with --allow-python {}",
            path.display(),
            workspace.display(),
            abs.display()
        )))
    }

    fn workspace(&self) -> &Path {
        self.spec
            .sandbox
            .as_ref()
            .map(|s| s.workspace.as_path())
            .unwrap_or(self.spec.workdir.as_path())
    }

    /// Ends a session: its interpreter and everything it started.
    pub fn delete(&self, name: &str) -> Result<String, SessionError> {
        let sess = self.existing(name)?;
        self.sessions().remove(name);
        let mut st = sess.lock();
        let running = st.running.take().map(|r| r.number);
        if let Some(w) = st.worker.take() {
            w.kill();
        }
        st.logs.clear();
        let mut msg = format!("Session '{name}' was deleted; its interpreter and processes ended.");
        if let Some(cell) = running {
            msg.push_str(&format!(" Cell {cell}, which was running, was stopped."));
        }
        if super::is_default_name(name) {
            msg.push_str(" The next call without a session name starts a fresh default session.");
        }
        Ok(msg)
    }

    /// Watches every session's process tree: past the memory limit or the
    /// process limit, the tree is killed and the crash report says why.
    pub fn spawn_resource_watch(self: &Arc<Self>) {
        let Some(sandbox) = self.spec.sandbox.clone().filter(|s| s.enabled()) else {
            return;
        };
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(this) = this.upgrade() else {
                    return;
                };
                let workers: Vec<(String, Arc<crate::worker::Worker>)> = this
                    .sessions()
                    .iter()
                    .filter_map(|(name, s)| s.lock().worker.clone().map(|w| (name.clone(), w)))
                    .filter(|(_, w)| w.exit_info().is_none())
                    .collect();
                if workers.is_empty() {
                    continue;
                }
                let sandbox = sandbox.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    let snap = crate::sandbox::watch::Snapshot::take();
                    for (name, w) in workers {
                        let (rss, count) = snap.usage(w.root_pid());
                        let reason = if let Some(hit) = w.cgroup_limit_hit() {
                            Some(format!(
                                "Session '{name}' {hit}, so all of its processes were killed."
                            ))
                        } else if count as u64 > sandbox.max_processes {
                            Some(format!(
                                "Session '{name}' went over its limit of {} processes (--max-processes; a fork bomb?), so all of them were killed.",
                                sandbox.max_processes
                            ))
                        } else {
                            match sandbox.memory_limit {
                                Some(limit) if rss > limit => Some(format!(
                                    "Session '{name}' went over its memory limit of {} (--memory-limit): its processes used {} MiB, so they were killed.",
                                    crate::units::human_bytes(limit),
                                    rss / (1024 * 1024)
                                )),
                                _ => None,
                            }
                        };
                        if let Some(reason) = reason {
                            tracing::warn!("{reason}");
                            w.set_kill_reason(reason);
                            w.kill();
                        }
                    }
                })
                .await;
            }
        });
    }

    /// Ends sessions that have been idle longer than --session-ttl.
    pub fn spawn_reaper(self: &Arc<Self>) {
        let Some(ttl) = self.limits.session_ttl else {
            return;
        };
        let this = Arc::downgrade(self);
        let every = (ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(this) = this.upgrade() else {
                    return;
                };
                let idle: Vec<String> = this
                    .sessions()
                    .iter()
                    .filter(|(_, s)| {
                        let st = s.lock();
                        st.running.is_none() && st.last_used.elapsed() > ttl
                    })
                    .map(|(name, _)| name.clone())
                    .collect();
                for name in idle {
                    tracing::info!(session = %name, "ending session idle longer than --session-ttl");
                    let _ = this.delete(&name);
                }
            }
        });
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
        let skip = st.history.len().saturating_sub(n);
        Ok(st.history.iter().skip(skip).cloned().collect())
    }

    /// The running cell of a session, as (number, code, seconds), for history.
    pub fn running_cell(&self, name: &str) -> Option<(u64, String, f64)> {
        let sess = self.existing(name).ok()?;
        let st = sess.lock();
        st.running
            .as_ref()
            .map(|r| (r.number, r.code.clone(), r.elapsed_secs()))
    }

    /// A request answered by the driver's control thread.
    async fn control(
        self: &Arc<Self>,
        name: &str,
        op: &str,
        args: serde_json::Map<String, Value>,
    ) -> Result<Value, SessionError> {
        let sess = if super::is_default_name(name) {
            self.get_or_create(name)?
        } else {
            self.existing(name)?
        };
        let worker = self.ensure_worker(&sess).await?;
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
                .unwrap_or("the request failed");
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
            .and_then(|s| s.spec.as_ref().map(|spec| spec.python.clone()))
            .unwrap_or_else(|| self.spec.python.clone())
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
            if let Some(run) = &st.running {
                return Err(super::cells::busy(&sess.name, run));
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
            python: self.spec.python.display().to_string(),
            workdir: self.spec.workdir.display().to_string(),
            limits,
            sandbox: self
                .spec
                .sandbox
                .as_ref()
                .map(|s| s.active.clone())
                .unwrap_or_else(|| "OFF".to_string()),
        }
    }
}
