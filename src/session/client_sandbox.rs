//! `--sandbox inherit`: a session runs under the sandbox policy of the
//! client's last call that ran code. A call whose policy differs from the
//! one the session's interpreter was launched under restarts it under the
//! new one (its saved state loaded back where sessions save state), with a
//! note; a session whose policy equals the server's own takes pooled
//! interpreters as usual.

use std::path::PathBuf;
use std::sync::Arc;

use super::error::SessionError;
use super::lifecycle::Pending;
use super::manager::SessionManager;
use super::state::Session;
use crate::sandbox::client::{self, ClientPolicy, Narrowed};
use crate::worker::{Language, LaunchSpec};

impl SessionManager {
    /// Whether calls bring the client's sandbox policy (--sandbox inherit).
    pub fn inherits_client_sandbox(&self) -> bool {
        self.limits.client_sandbox
    }

    /// Under --sandbox inherit no interpreter starts but under a policy a
    /// call brought: a session no such call named yet (one brought back
    /// at start, a default one) is not started by a call that only reads.
    pub(super) fn check_client_policy(&self, sess: &Session) -> Result<(), SessionError> {
        if !self.limits.client_sandbox || sess.lock().client.is_some() {
            return Ok(());
        }
        Err(SessionError::Invalid(format!(
            "session '{}' has no interpreter yet, and under --sandbox inherit one starts only on a call that brings the client's sandbox policy: run a cell in it first (python_exec)",
            sess.name
        )))
    }

    /// Makes the venv ferrepl keeps, under the server's own sandbox (its
    /// making runs no code of the session's), before an interpreter starts
    /// under a policy that leaves it read-only.
    pub(super) async fn make_venv_first(&self, spec: &LaunchSpec) -> Result<(), SessionError> {
        let Some(venv) = &spec.venv else {
            return Ok(());
        };
        let base = match spec.language {
            Language::Python => &self.spec,
            Language::R => return Ok(()),
        };
        venv.ensure(base, std::time::Duration::from_secs(60))
            .await
            .map_err(|e| {
                SessionError::Invalid(format!("the sessions' venv could not be made: {e}"))
            })
    }

    /// The confinement `policy` leaves of the server's, for `lang`'s
    /// sessions; refused when the client works outside the workspace.
    pub fn narrow(
        &self,
        policy: &ClientPolicy,
        lang: Language,
    ) -> Result<Arc<Narrowed>, SessionError> {
        let spec = self.spec_for(lang).ok_or(SessionError::LanguageOff(lang))?;
        let ceiling = spec
            .sandbox
            .as_deref()
            .filter(|s| s.enabled())
            .ok_or_else(|| {
                SessionError::Invalid(
                    "--sandbox inherit needs the sandbox, which is off here".into(),
                )
            })?;
        policy
            .check_cwd(&ceiling.workspace)
            .map_err(SessionError::Invalid)?;
        // The kept venv stays read-only to cells under a narrowed policy:
        // a `.pth` planted there runs in every later interpreter.
        Ok(Arc::new(client::narrow(ceiling, policy, &[])))
    }

    /// ferrepl's own places for sessions (the venv it keeps), writable
    /// whatever the client's policy.
    pub fn own_places(&self) -> Vec<PathBuf> {
        self.spec.venv.iter().map(|v| v.dir.clone()).collect()
    }

    /// The launch settings of `sess` under its client's policy `narrowed`;
    /// None when that is the server's own (a pooled interpreter will do).
    pub(super) fn client_spec(
        &self,
        sess: &Session,
        narrowed: Option<&Narrowed>,
    ) -> Option<LaunchSpec> {
        let narrowed = narrowed?;
        let base = match sess.spec.as_deref() {
            Some(spec) => spec,
            None => self.spec_for(sess.language)?,
        };
        let ceiling = base.sandbox.as_deref()?;
        if client::key_of(ceiling) == narrowed.key && sess.spec.is_none() {
            return None;
        }
        let mut spec = base.clone();
        spec.sandbox = Some(Arc::new(narrowed.config.clone()));
        Some(spec)
    }

    /// The policy the next interpreter of session `name` starts under,
    /// for calls that start one anyway (reset, resume, rebuild).
    pub fn set_client_sandbox(&self, name: &str, narrowed: Option<Arc<Narrowed>>) {
        let Some(narrowed) = narrowed else { return };
        // A default name (`default`, `default-3`) is made by the call.
        let sess = match super::default_language(name) {
            Some(lang) => self.get_or_create(name, lang).ok(),
            None => self.sessions().get(name).cloned(),
        };
        if let Some(sess) = sess {
            sess.lock().client = Some(narrowed);
        }
    }

    /// Puts session `name` under `narrowed` from now on: created if it is
    /// a default one, restarted (with a note) when its interpreter runs
    /// under another policy.
    pub async fn apply_client_sandbox(
        self: &Arc<Self>,
        name: &str,
        lang: Language,
        narrowed: Arc<Narrowed>,
    ) -> Result<(), SessionError> {
        let sess = self.get_or_create(name, lang)?;
        let quiet = {
            let mut st = sess.lock();
            let before = st.worker_under.clone();
            let live = st.worker.as_ref().is_some_and(|w| w.exit_info().is_none());
            if !live || before.as_deref() == Some(narrowed.key.as_str()) {
                st.client = Some(narrowed);
                return Ok(());
            }
            if st.inbox.running.is_some() || st.lifecycle.is_rebuilding() {
                return Err(SessionError::Invalid(format!(
                    "the client's sandbox policy changed ({}), and session '{name}' still runs a cell under the previous one; wait for it (python_wait) or interrupt it, then call again",
                    narrowed.summary
                )));
            }
            // An interpreter started ahead of any call (the default
            // session, a pooled one) ran nothing yet: replaced silently.
            st.client.is_none() && st.inbox.last() == 0
        };
        self.restart_under(&sess, narrowed, quiet).await
    }

    /// Ends the session's interpreter and starts one under `narrowed`,
    /// loading its saved state back when it has one.
    async fn restart_under(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        narrowed: Arc<Narrowed>,
        quiet: bool,
    ) -> Result<(), SessionError> {
        let saved = match sess.language {
            Language::Python if self.durable.states.is_some() => {
                match self.save_state(sess).await {
                    Ok(_) => {
                        let st = sess.lock();
                        st.lifecycle.saved_cell() == Some(st.inbox.last())
                            && self.saved_meta(&sess.name).is_some()
                    }
                    Err(e) => {
                        tracing::warn!(session = %sess.name, "state not saved before the policy change: {e}");
                        false
                    }
                }
            }
            _ => false,
        };
        let had_cells = {
            let mut st = sess.lock();
            st.client = Some(narrowed.clone());
            let old = st.worker.take();
            st.worker_under = None;
            if let Some(w) = old {
                w.kill_in_background();
            }
            st.checkpoints.clear();
            let had = !st.lineage.path().is_empty();
            if saved {
                st.lifecycle.set_pending(Pending::Dormant);
            } else {
                st.clear_path();
            }
            had
        };
        let head = format!(
            "The client's sandbox policy changed to {}: session '{}' restarted under it.",
            narrowed.summary, sess.name
        );
        if saved {
            let resumed = self.resume_saved(sess).await;
            let mut st = sess.lock();
            match resumed {
                // resume_saved put its own note last: ours goes before it.
                Ok(_) => {
                    let at = st.notes.len().saturating_sub(1);
                    st.notes.insert(at, head);
                }
                Err(e) => {
                    st.clear_path();
                    st.notes.push(format!(
                        "{head} Its saved state did not come back ({e}); its variables are gone."
                    ));
                }
            }
            return Ok(());
        }
        self.ensure_worker(sess).await?;
        if quiet {
            return Ok(());
        }
        let tail = if had_cells {
            " Its variables are gone (no saved state to load); re-run what you need."
        } else {
            ""
        };
        sess.lock().notes.push(format!("{head}{tail}"));
        Ok(())
    }
}
