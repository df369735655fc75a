//! A session's interpreter: taken from the warm pool or launched, started
//! again when it died (saying so), and the launch settings of a session
//! created with its own interpreter, directory or environment, checked
//! against the policy.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::error::SessionError;
use super::lifecycle::Pending;
use super::manager::SessionManager;
use super::state::{Session, SessionOptions};
use crate::executables::is_executable;
use crate::worker::{self, Language, LaunchSpec, Worker, WorkerError};

impl SessionManager {
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
        if self.limits.client_sandbox {
            return;
        }
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
            if st.lifecycle.is_rebuilding()
                && let Some(w) = &st.worker
            {
                // The rebuild's task owns its interpreter, dead or alive.
                return Ok(w.clone());
            }
            // Launched under another client policy than the session's now
            // (--sandbox inherit; a call changed it while this one started):
            // not used. A change between cells was handled already, its
            // state saved first (client_sandbox.rs); this one ran nothing.
            let stale = st.worker.is_some()
                && st
                    .client
                    .as_ref()
                    .is_some_and(|c| st.worker_under.as_deref() != Some(c.key.as_str()));
            if stale && st.inbox.running.is_none() {
                if let Some(old) = st.worker.take() {
                    old.kill_in_background();
                }
                st.checkpoints.clear();
                if !st.lineage.path().is_empty() {
                    st.clear_path();
                    st.notes.push(format!(
                        "The client's sandbox policy changed: session '{}' restarted under it; its variables are gone.",
                        sess.name
                    ));
                }
            }
            if let Some(w) = &st.worker {
                match w.exit_info() {
                    None => return Ok(w.clone()),
                    Some(exit) => {
                        if st.inbox.running.is_none()
                            && !st.lifecycle.pending().is_some_and(Pending::rebuilds_on_use)
                        {
                            if let Some(reason) = w.take_kill_reason() {
                                st.notes.push(reason);
                            }
                            let note = format!(
                                "The interpreter of session '{}' had exited ({}) after cell {}; its variables were lost. This cell runs in a fresh interpreter.",
                                sess.name,
                                exit.describe(),
                                st.inbox.last()
                            );
                            st.notes.push(note);
                            if st.lifecycle.pending().is_none() {
                                // Died between cells: nothing offered it back.
                                st.clear_path();
                            }
                        }
                        st.worker = None;
                    }
                }
            }
        }
        // Under the client's policy (--sandbox inherit) when it narrows
        // the server's: the launch settings and the key it is recorded
        // under, from one look at the session.
        self.check_client_policy(sess)?;
        let client = sess.lock().client.clone();
        let under_client = self.client_spec(sess, client.as_deref());
        let under = client.as_ref().map(|c| c.key.clone()).or_else(|| {
            let spec = sess.spec.as_deref().or(self.spec_for(sess.language))?;
            spec.sandbox.as_deref().map(crate::sandbox::client::key_of)
        });
        if let Some(spec) = &under_client {
            self.make_venv_first(spec).await?;
        }
        let worker = self
            .acquire_worker(
                under_client.as_ref().or(sess.spec.as_deref()),
                sess.language,
            )
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
            st.worker_under = under;
            if let Some(info) = worker.kernel_connection() {
                let writes = self.spec.sandbox.as_ref().map(|s| s.write.as_slice());
                crate::attach::publish(
                    &self.spec.log_dir,
                    &sess.name,
                    info,
                    self.workspace(),
                    writes.unwrap_or_default(),
                );
            }
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

    /// The launch settings of a session with these options: None when they
    /// are the server's own; an error when the policy refuses them.
    pub(super) fn spec_from_options(
        &self,
        opts: &SessionOptions,
    ) -> Result<Option<LaunchSpec>, SessionError> {
        let lang = opts.language;
        if let Some(name) = &opts.kernel {
            return self.kernel_spec(name, opts).map(Some);
        }
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

    /// The launch settings of a session on the installed kernel `name`:
    /// the server's settings for the kernel's language with the kernel's
    /// program, never another interpreter or venv.
    fn kernel_spec(&self, name: &str, opts: &SessionOptions) -> Result<LaunchSpec, SessionError> {
        // The server's Python spec carries the kernels, even with Python off.
        let Some(kernel) = self.spec.kernels.iter().find(|k| k.name == name) else {
            let offered = self.kernel_names();
            return Err(SessionError::Invalid(match offered.is_empty() {
                true => format!(
                    "no Jupyter kernels are offered; the operator names them with --kernels (kernel '{name}')"
                ),
                false => format!(
                    "no kernel '{name}'; the kernels offered (--kernels) are: {}",
                    offered.join(", ")
                ),
            }));
        };
        if opts.python.is_some() || opts.venv.is_some() || opts.language != kernel.language {
            return Err(SessionError::Invalid(format!(
                "a session on kernel '{name}' runs the kernel's own interpreter, {} one: leave out python, venv and language",
                kernel.language.with_article()
            )));
        }
        let base = match kernel.language {
            Language::Python => self.spec_for(Language::Python).unwrap_or(&self.spec),
            // Its cells answer through the r_ tools, which --languages turns on.
            lang => self.spec_for(lang).ok_or_else(|| {
                SessionError::Invalid(format!(
                    "kernel '{name}' is {} kernel: its sessions answer through {}, which this server does not offer; start it with --languages python,{}",
                    lang.with_article(),
                    lang.exec_tool(),
                    lang.key()
                ))
            })?,
        };
        let mut spec = base.clone();
        spec.program = kernel.program().to_path_buf();
        spec.kernel = Some(kernel.clone());
        // A kernel has no frozen copies, and its venv is its own.
        spec.checkpoints = false;
        spec.venv = None;
        if let Some(dir) = &opts.workdir {
            spec.workdir = self.inside_workspace(dir)?;
        }
        crate::sandbox::env::check(&opts.env)?;
        spec.env
            .extend(opts.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        Ok(spec)
    }

    /// The language of the offered kernel `name`, which a session created
    /// on it speaks (None when no such kernel is offered).
    pub fn kernel_language(&self, name: &str) -> Option<Language> {
        let kernel = self.spec.kernels.iter().find(|k| k.name == name)?;
        Some(kernel.language)
    }

    /// The names of the kernels sessions may be created on (--kernels).
    pub fn kernel_names(&self) -> Vec<String> {
        self.spec.kernels.iter().map(|k| k.name.clone()).collect()
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
}
