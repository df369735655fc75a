//! The session registry: creating, finding, resetting and deleting
//! sessions, the spare worker, and shutdown.

use std::path::{Path, PathBuf};

use super::*;
use crate::executables::is_executable;

/// Settings of a session created with python_sessions create (kept in the
/// store, and checked again against the policy when it is resumed).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SessionOptions {
    pub python: Option<PathBuf>,
    pub venv: Option<PathBuf>,
    pub workdir: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub language: Language,
}

impl SessionManager {
    /// Starts the default session of each enabled language without
    /// waiting (R spends most of its start attaching its default packages,
    /// which then overlaps the client's handshake); Python's spare worker
    /// only once they are ready, so that it does not slow them down.
    pub fn warm_up(self: &Arc<Self>, start_defaults: bool) {
        let defaults = [
            (DEFAULT_R_SESSION, Language::R),
            (DEFAULT_SESSION, Language::Python),
        ];
        let defaults = defaults.into_iter().filter(move |_| start_defaults);
        self.warming.store(true, Ordering::SeqCst);
        let this = self.clone();
        tokio::spawn(async move {
            let starts = defaults
                .into_iter()
                .filter(|(_, lang)| this.spec_for(*lang).is_some())
                .map(|(name, lang)| {
                    let this = this.clone();
                    async move {
                        let started = match this.get_or_create(name, lang) {
                            Ok(sess) => this.ensure_worker(&sess).await.map(|_| ()),
                            Err(e) => Err(e),
                        };
                        if let Err(e) = started {
                            tracing::warn!("could not start the default {lang} session: {e}");
                        }
                    }
                });
            futures::future::join_all(starts).await;
            this.warming.store(false, Ordering::SeqCst);
            if this.python_on {
                this.refill_pool();
            }
        });
    }

    pub(super) fn get_or_create(
        &self,
        name: &str,
        lang: Language,
    ) -> Result<Arc<Session>, SessionError> {
        self.get_or_create_with(name, lang, None, None)
    }

    /// Creates a session (with its own launch settings, if given) unless it exists.
    pub(super) fn get_or_create_with(
        &self,
        name: &str,
        lang: Language,
        spec: Option<LaunchSpec>,
        options: Option<SessionOptions>,
    ) -> Result<Arc<Session>, SessionError> {
        self.check_language(name, lang)?;
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(SessionError::ShuttingDown);
        }
        self.gate.check_revoked()?;
        if !valid_name(name) {
            return Err(SessionError::BadName(name.to_string()));
        }
        if let Some(s) = self.sessions().get(name) {
            s.lock().last_used = Instant::now();
            return Ok(s.clone());
        }
        let mut evicted = None;
        let (sess, new, reviving) = loop {
            match self.admit(name, lang, spec.clone(), options.clone()) {
                Ok(added) => break added,
                // Full: a session whose client is gone makes room first.
                Err(
                    e @ (SessionError::TooMany { .. }
                    | SessionError::Refused(gate::Refusal::InstanceFull { .. })),
                ) => {
                    let instance = matches!(e, SessionError::Refused(_));
                    match (evicted.is_none(), self.evict_for_room(instance)) {
                        (true, Some(gone)) => evicted = Some(gone),
                        _ => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        };
        if let Some(gone) = evicted {
            sess.lock().notes.push(format!(
                "Session '{gone}', whose client had disconnected, was ended to make room for this one."
            ));
        }
        if new {
            self.persist_session(&sess);
            if default_language(name).is_some() {
                let notes = self
                    .durable
                    .unkept
                    .clone()
                    .into_iter()
                    .chain(self.dormant_line());
                sess.lock().notes.extend(notes);
            }
        } else if reviving {
            // Brought back from the store: it may be of the other language.
            self.check_language(name, lang)?;
        }
        Ok(sess)
    }

    /// Adds session `name` if the instance and the tenant have room: the
    /// session, whether it is new, whether it came back from the store.
    fn admit(
        &self,
        name: &str,
        lang: Language,
        spec: Option<LaunchSpec>,
        options: Option<SessionOptions>,
    ) -> Result<(Arc<Session>, bool, bool), SessionError> {
        let revived = self.revive_stored(name);
        let reviving = revived.is_some();
        // Counted over every tenant of the instance, then over this one.
        let added = self.gate.instance.admit_session(name, || {
            let mut map = self.sessions();
            if let Some(s) = map.get(name) {
                return Ok((s.clone(), false));
            }
            if map.len() >= self.limits.max_sessions {
                crate::metrics::admission_refusal(if self.limits.sessions_share {
                    "tenant_sessions_full"
                } else {
                    "instance_full"
                });
                return Err(SessionError::TooMany {
                    name: name.to_string(),
                    limit: self.limits.max_sessions,
                    share: self.limits.sessions_share,
                });
            }
            let new = revived.is_none();
            let sess = Arc::new(revived.unwrap_or_else(|| Session::new(name, lang, spec, options)));
            map.insert(name.to_string(), sess.clone());
            Ok((sess, new))
        });
        match added.map_err(SessionError::from).and_then(|added| added) {
            Ok((sess, new)) => Ok((sess, new, reviving)),
            Err(e) => {
                if reviving {
                    self.leave_stored(name);
                }
                Err(e)
            }
        }
    }

    /// Cells still running and results no call has collected yet: what a
    /// drain waits for.
    pub fn unfinished(&self) -> usize {
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        sessions
            .iter()
            .filter(|sess| {
                let mut st = sess.lock();
                self.refresh(sess, &mut st);
                st.running.is_some() || st.completed.is_some() || st.rebuild.is_some()
            })
            .count()
    }

    /// Counts a tool call in flight on the instance (see `Instance::drain`).
    pub fn call_started(&self) -> gate::Slot {
        self.gate.instance.call_started()
    }

    /// Sessions of this tenant, dormant ones included.
    pub fn session_count(&self) -> usize {
        self.sessions().len()
    }

    pub(super) fn existing(&self, name: &str) -> Result<Arc<Session>, SessionError> {
        let map = self.sessions();
        match map.get(name) {
            Some(s) => {
                s.lock().last_used = Instant::now();
                Ok(s.clone())
            }
            None => Err(SessionError::NotFound {
                name: name.to_string(),
                existing: if map.is_empty() {
                    "none".to_string()
                } else {
                    map.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            }),
        }
    }

    /// A ready worker: a pooled one if there is one, else a fresh launch.
    pub(super) async fn acquire_worker(
        self: &Arc<Self>,
        custom: Option<&LaunchSpec>,
        lang: Language,
    ) -> Result<Arc<Worker>, SessionError> {
        let custom = match (custom, lang) {
            (Some(spec), _) => Some(spec),
            (None, Language::Python) if self.python_on => None,
            // Only Python keeps a warm pool.
            (None, lang) => Some(self.spec_for(lang).ok_or(SessionError::LanguageOff(lang))?),
        };
        self.start_worker(custom)
            .await
            .map_err(|source| SessionError::Worker {
                session: String::new(),
                source,
            })
    }

    async fn start_worker(
        self: &Arc<Self>,
        custom: Option<&LaunchSpec>,
    ) -> Result<Arc<Worker>, WorkerError> {
        let timeout = self.limits.start_timeout;
        if let Some(spec) = custom {
            // Own settings: no pooled worker can match them.
            return worker::launch_ready(spec, timeout).await;
        }
        // Pooled workers are ready already; one that died since is replaced.
        let worker = match self.pool.take() {
            Some(w) if w.wait_ready(timeout).await.is_ok() => w,
            _ => worker::launch_ready(&self.spec, timeout).await?,
        };
        if !self.warming.load(Ordering::SeqCst) {
            self.gate.instance.pool_place_freed();
        }
        Ok(worker)
    }

    /// Refills this tenant's pool if it is short and warmed up already.
    pub(super) fn top_up_pool(self: &Arc<Self>) {
        if !self.warming.load(Ordering::SeqCst) && self.pool.len() < self.pool.target() {
            self.refill_pool();
        }
    }

    /// Tops the warm pool up in the background (--warm-pool).
    pub(super) fn refill_pool(self: &Arc<Self>) {
        let this = Arc::downgrade(self);
        self.pool.refill(self.spec.clone(), move || {
            this.upgrade()
                .is_none_or(|m| m.shutting_down.load(Ordering::SeqCst) || m.gate.is_revoked())
        });
    }

    /// The session's live worker, starting one if it has none or it died.
    pub(super) async fn ensure_worker(
        self: &Arc<Self>,
        sess: &Arc<Session>,
    ) -> Result<Arc<Worker>, SessionError> {
        let _guard = sess.start_lock.lock().await;
        self.gate.check_revoked()?;
        {
            let mut st = sess.lock();
            self.refresh(sess, &mut st);
            if st.rebuild.is_some()
                && let Some(w) = &st.worker
            {
                // The rebuild's task owns its interpreter, dead or alive.
                return Ok(w.clone());
            }
            if let Some(w) = &st.worker {
                match w.exit_info() {
                    None => return Ok(w.clone()),
                    Some(exit) => {
                        if st.running.is_none()
                            && !st.pending.is_some_and(durable::Pending::rebuilds_on_use)
                        {
                            if let Some(reason) = w.take_kill_reason() {
                                st.notes.push(reason);
                            }
                            let note = format!(
                                "The interpreter of session '{}' had exited ({}) after cell {}; its variables were lost. This cell runs in a fresh interpreter.",
                                sess.name,
                                exit.describe(),
                                st.last_cell
                            );
                            st.notes.push(note);
                            if st.pending.is_none() {
                                // Died between cells: nothing offered it back.
                                st.clear_path();
                            }
                        }
                        st.worker = None;
                    }
                }
            }
        }
        let worker = self
            .acquire_worker(sess.spec.as_deref(), sess.language)
            .await
            .map_err(|e| match e {
                SessionError::Worker { source, .. } => SessionError::Worker {
                    session: sess.name.clone(),
                    source,
                },
                other => other,
            })?;
        if let Some(info) = worker.ready_info() {
            tracing::info!(session = %sess.name, pid = info.pid, version = %info.python_version, "session interpreter started");
        }
        {
            let mut st = sess.lock();
            st.worker = Some(worker.clone());
            // Copies belonged to the interpreter before.
            st.checkpoints.clear();
        }
        // Revoked while it started: `end_all` may have passed this session
        // before the worker was in it.
        if let Err(refused) = self.gate.check_revoked() {
            worker.set_kill_reason(refused.to_string());
            worker.kill_in_background();
            return Err(refused.into());
        }
        Ok(worker)
    }

    /// Restarts a session's interpreter; all its state is cleared.
    pub async fn reset(self: &Arc<Self>, name: &str) -> Result<String, SessionError> {
        let sess = if let Some(lang) = default_language(name) {
            self.get_or_create(name, lang)?
        } else {
            self.existing(name)?
        };
        let (old, stopped, rebuild) = {
            let mut st = sess.lock();
            st.completed = None;
            st.delivered = None;
            st.notes.clear();
            st.clear_path();
            let rebuild = st.rebuild.take().map(|rb| super::resume::ended_note(&rb));
            let stopped = st.running.take().filter(|r| !r.replay).map(|r| r.number);
            (st.worker.take(), stopped, rebuild)
        };
        sess.touch();
        if let Some(old) = old {
            old.kill_in_background();
        }
        self.persist_head(&sess, None);
        self.forget_state(&sess.name);
        let worker = self.ensure_worker(&sess).await?;
        sess.lock().notes.clear();
        let mut msg = format!(
            "Session '{}' was reset: a fresh interpreter (pid {}) is ready and all earlier variables are gone.",
            sess.name,
            worker.pid()
        );
        if let Some(cell) = stopped {
            msg.push_str(&format!(
                " Cell {cell}, which was still running, was stopped."
            ));
        }
        msg.extend(rebuild);
        Ok(msg)
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        // One look at /proc for every session's memory.
        let roots: Vec<u32> = sessions
            .iter()
            .filter_map(|s| s.lock().worker.as_ref().map(|w| w.root_pid()))
            .collect();
        let snap = crate::sandbox::watch::Snapshot::of_trees(&roots);
        sessions
            .iter()
            .map(|sess| {
                let mut st = sess.lock();
                self.refresh(sess, &mut st);
                let worker = st.worker.clone();
                let dead = worker.as_ref().is_some_and(|w| w.exit_info().is_some());
                let state = report::session_state(&st);
                let running_cell = match &st.rebuild {
                    Some(_) => super::resume::queued_cell(&st).map(|q| q.0),
                    None => st.running.as_ref().map(|r| r.number),
                };
                SessionInfo {
                    name: sess.name.clone(),
                    state: state.to_string(),
                    pid: worker.as_ref().filter(|_| !dead).map(|w| w.pid()),
                    cells: st.cells_run,
                    running_cell,
                    memory_bytes: worker
                        .as_ref()
                        .filter(|_| !dead)
                        .and_then(|w| w.rss_bytes(&snap)),
                    uptime_s: sess.created.elapsed().as_secs_f64(),
                    language: sess.language,
                    interpreter: worker
                        .as_ref()
                        .and_then(|w| w.ready_info())
                        .map(|i| format!("{} ({})", i.executable, i.python_version)),
                }
            })
            .collect()
    }

    /// Kills the interpreter of every session (its cells end crashed, with
    /// `reason` among their notes) and the warm pool's; the sessions stay.
    /// Returns how many sessions' interpreters were killed.
    pub fn end_all(&self, reason: &str) -> usize {
        for spare in self.pool.drain() {
            spare.kill();
        }
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        let mut ended = 0;
        for sess in sessions {
            let Some(worker) = sess.lock().worker.clone() else {
                continue;
            };
            if worker.exit_info().is_none() {
                worker.set_kill_reason(format!(
                    "{reason}, so ferrepl ended session '{}'.",
                    sess.name
                ));
                worker.kill();
                ended += 1;
            }
        }
        ended
    }

    /// Ends every worker (whole process groups) and refuses new work.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        // Before the interpreters end: they hold what is saved.
        self.save_all().await;
        let mut workers: Vec<Arc<Worker>> = self
            .sessions()
            .values()
            .filter_map(|s| s.lock().worker.clone())
            .collect();
        workers.extend(self.pool.drain());
        for w in &workers {
            w.kill();
        }
        if let Some(store) = &self.durable.store {
            // Blocking, bounded: the process is about to exit.
            if !store.flush(Duration::from_secs(2)) {
                tracing::warn!("the session store did not finish writing within 2 s");
            }
        }
        for w in &workers {
            let mut rx = w.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while w.exit_info().is_none() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
        }
    }

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
        let spec = self.spec_from_options(&opts)?;
        let sess = self.get_or_create_with(name, opts.language, spec, Some(opts))?;
        self.ensure_worker(&sess).await?;
        Ok(sess)
    }

    /// The launch settings of a session with these options: None when they
    /// are the server's own; an error when the policy refuses them.
    pub(super) fn spec_from_options(
        &self,
        opts: &SessionOptions,
    ) -> Result<Option<LaunchSpec>, SessionError> {
        let lang = opts.language;
        if lang != Language::Python && (opts.python.is_some() || opts.venv.is_some()) {
            return Err(SessionError::Invalid(format!(
                "python and venv apply to Python sessions; an {lang} session takes only workdir and env"
            )));
        }
        let mut spec: LaunchSpec = self
            .spec_for(lang)
            .ok_or(SessionError::LanguageOff(lang))?
            .clone();
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
            spec.program = python;
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
            spec.program = python;
            custom = true;
        }
        if let Some(dir) = &opts.workdir {
            spec.workdir = self.inside_workspace(dir)?;
            custom = true;
        }
        crate::sandbox::env::check(&opts.env)?;
        for (k, v) in &opts.env {
            spec.env.push((k.clone(), v.clone()));
            custom = true;
        }
        Ok(custom.then_some(spec))
    }

    /// A `workdir` argument: an existing directory whose real location
    /// (symlinks resolved) is inside the server's workspace.
    pub(super) fn inside_workspace(&self, dir: &Path) -> Result<PathBuf, SessionError> {
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
            if !real.starts_with(workspace) {
                crate::metrics::sandbox_refusal(crate::metrics::SandboxRefusal::Cwd);
            }
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
    pub(super) fn allowed_interpreter(
        &self,
        path: &Path,
        arg: &str,
    ) -> Result<PathBuf, SessionError> {
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
        crate::metrics::sandbox_refusal(crate::metrics::SandboxRefusal::Interpreter);
        Err(SessionError::Invalid(format!(
            "{arg} '{}' is outside the workspace and was not allowed by the operator; use an interpreter or venv inside the workspace {} (e.g. python3 -m venv env: .venv is the user's and protected), or ask the operator to start ferrepl with --allow-python {}",
            path.display(),
            workspace.display(),
            abs.display()
        )))
    }

    pub(super) fn workspace(&self) -> &Path {
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
        self.forget_stored(name);
        self.forget_state(name);
        let mut st = sess.lock();
        let rebuild = st.rebuild.take().map(|rb| super::resume::ended_note(&rb));
        let running = st.running.take().filter(|r| !r.replay).map(|r| r.number);
        if let Some(w) = st.worker.take() {
            w.kill();
        }
        st.logs.clear();
        drop(st);
        sess.touch();
        let mut msg = format!("Session '{name}' was deleted; its interpreter and processes ended.");
        if let Some(cell) = running {
            msg.push_str(&format!(" Cell {cell}, which was running, was stopped."));
        }
        msg.extend(rebuild);
        if super::is_default_name(name) {
            msg.push_str(" The next call without a session name starts a fresh default session.");
        }
        Ok(msg)
    }
}
