//! The registry of a tenant's sessions: the manager made (with the
//! sessions its store kept), the default sessions started, creating and
//! finding sessions (within the tenant's and the instance's room, a gone
//! client's session making room first), python_sessions create, reset and
//! list, and what a drain or the metrics count.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::SessionError;
use super::gate::{Refusal, TenantGate};
use super::lifecycle::{ended_note, queued_cell};
use super::manager::SessionManager;
use super::pool::WarmPool;
use super::report::SESSION_STATES;
use super::settings::{Durability, Limits};
use super::state::{Session, SessionInfo, SessionOptions};
use super::{DEFAULT_R_SESSION, DEFAULT_SESSION, default_language, valid_name};
use crate::worker::{Language, LaunchSpec};

impl SessionManager {
    pub fn new(
        spec: LaunchSpec,
        python_on: bool,
        r_spec: Option<LaunchSpec>,
        limits: Limits,
        durable: Durability,
        gate: Arc<TenantGate>,
    ) -> Arc<Self> {
        let pool = Arc::new(WarmPool::new(
            limits.warm_pool,
            limits.start_timeout,
            gate.instance.clone(),
        ));
        let manager = Self {
            spec,
            python_on,
            r_spec,
            limits,
            durable,
            sessions: Mutex::new(BTreeMap::new()),
            pool,
            warming: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            started: Instant::now(),
            gate,
            left_stored: Mutex::new(Default::default()),
            gone: Default::default(),
            behind_preinstall: Default::default(),
            preinstall_noted: AtomicBool::new(false),
        };
        let manager = Arc::new(manager);
        let stored = manager.read_stored();
        manager
            .gate
            .instance
            .register(&manager, |room| manager.add_stored(stored, room));
        manager
    }

    /// Starts the default session of each enabled language without
    /// waiting (R spends most of its start attaching its default packages,
    /// which then overlaps the client's handshake); Python's spare worker
    /// only once they are ready, so that it does not slow them down.
    pub fn warm_up(self: &Arc<Self>, start_defaults: bool) {
        let defaults = [
            (DEFAULT_R_SESSION, Language::R),
            (DEFAULT_SESSION, Language::Python),
        ];
        // Under --sandbox inherit nothing starts before a call brings the
        // client's policy: no default session, no pool.
        let start_defaults = start_defaults && !self.limits.client_sandbox;
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
            if this.python_on && !this.limits.client_sandbox {
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
                    | SessionError::Refused(Refusal::InstanceFull { .. })),
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

    /// Cells still running (a rebuild counts as one): what a drain waits
    /// for. A finished result no call has collected does not count: a
    /// client still after it has its call in flight (which the drain waits
    /// for too), and one that is gone would hold the drain to its end.
    pub fn running(&self) -> usize {
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        sessions
            .iter()
            .filter(|sess| {
                let mut st = sess.lock();
                self.refresh(sess, &mut st);
                st.inbox.running.is_some() || st.lifecycle.is_rebuilding()
            })
            .count()
    }

    /// Creates a session with its own interpreter, directory or environment.
    pub async fn create(
        self: &Arc<Self>,
        name: &str,
        opts: SessionOptions,
        client: Option<Arc<crate::sandbox::client::Narrowed>>,
    ) -> Result<Arc<Session>, SessionError> {
        if self.sessions().contains_key(name) {
            return Err(SessionError::Invalid(format!(
                "session '{name}' already exists; delete it first (python_sessions action=delete) or pick another name"
            )));
        }
        let spec = self.spec_from_options(&opts)?;
        let sess = self.get_or_create_with(name, opts.language, spec, Some(opts))?;
        sess.lock().client = client;
        self.ensure_worker(&sess).await?;
        Ok(sess)
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
            st.inbox.completed = None;
            st.inbox.delivered = None;
            st.notes.clear();
            st.clear_path();
            let rebuild = st.lifecycle.take_rebuild().map(|rb| ended_note(&rb));
            let stopped = st
                .inbox
                .running
                .take()
                .filter(|r| !r.replay)
                .map(|r| r.number);
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
                let state = st.summary();
                let running_cell = match st.lifecycle.rebuild() {
                    Some(rb) => queued_cell(rb).map(|q| q.0),
                    None => st.inbox.running.as_ref().map(|r| r.number),
                };
                SessionInfo {
                    name: sess.name.clone(),
                    state: state.to_string(),
                    pid: worker.as_ref().filter(|_| !dead).map(|w| w.pid()),
                    cells: st.inbox.cells_run(),
                    running_cell,
                    memory_bytes: worker
                        .as_ref()
                        .filter(|_| !dead)
                        .and_then(|w| w.rss_bytes(&snap)),
                    uptime_s: sess.created.elapsed().as_secs_f64(),
                    language: sess.listed_language(),
                    interpreter: worker
                        .as_ref()
                        .and_then(|w| w.ready_info())
                        .map(|i| format!("{} ({})", i.executable, i.python_version)),
                    kernel: sess.kernel().map(str::to_string),
                }
            })
            .collect()
    }

    /// How many sessions are in each of [`SESSION_STATES`] (every state
    /// listed, zeros included), for the metrics. Pending worker events are
    /// applied first, as `list` does, so a cell that has finished is not
    /// counted busy.
    pub fn state_counts(&self) -> Vec<(&'static str, u64)> {
        let sessions: Vec<_> = self.sessions().values().cloned().collect();
        let mut counts: Vec<(&'static str, u64)> = SESSION_STATES.iter().map(|s| (*s, 0)).collect();
        for sess in &sessions {
            let state = {
                let mut st = sess.lock();
                self.refresh(sess, &mut st);
                st.summary()
            };
            if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == state) {
                slot.1 += 1;
            }
        }
        counts
    }
}
