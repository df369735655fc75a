//! `SessionManager`: one tenant's sessions and what they share (launch
//! settings, limits, the store, the warm pool, the gate). The operations
//! on sessions are `impl SessionManager` blocks in the files of their
//! concerns; here only what every one of them needs: looking a session up,
//! and which languages are on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::default_language;
use super::error::SessionError;
use super::gate::{self, TenantGate};
use super::pool::WarmPool;
use super::settings::{Durability, Limits};
use super::state::Session;
use crate::worker::{Language, LaunchSpec};

/// Sessions whose client is gone, by name, with when it went.
#[derive(Default)]
pub(super) struct GoneClients(std::sync::Mutex<BTreeMap<String, Instant>>);

impl GoneClients {
    pub(super) fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct SessionManager {
    pub(super) spec: LaunchSpec,
    /// False when --languages leaves Python out: no Python session (and no
    /// pooled worker) is ever started.
    pub(super) python_on: bool,
    /// How R sessions start; None when R is not enabled (--languages).
    pub(super) r_spec: Option<LaunchSpec>,
    pub(super) limits: Limits,
    pub(super) durable: Durability,
    pub(super) sessions: Mutex<BTreeMap<String, Arc<Session>>>,
    pub(super) pool: Arc<WarmPool>,
    /// While the default sessions start: the pool is not filled yet
    /// (warm_up starts it).
    pub(super) warming: AtomicBool,
    pub(super) shutting_down: AtomicBool,
    pub(super) started: Instant,
    /// Draining, the instance's session budget, the workspace quota.
    pub(super) gate: Arc<TenantGate>,
    /// Stored sessions not brought back at start (no room): one comes back
    /// when its name is next used, instead of a fresh session overwriting
    /// its stored cells.
    pub(super) left_stored: Mutex<BTreeSet<String>>,
    /// Per-client default sessions whose client is gone.
    pub(super) gone: GoneClients,
    /// Code queued behind --preinstall, by session (`preinstall_wait.rs`).
    pub(super) behind_preinstall: super::preinstall_queue::PreinstallQueue,
    /// Whether a failed preinstall has been told in a result.
    pub(super) preinstall_noted: AtomicBool,
}

impl SessionManager {
    pub(super) fn sessions(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How sessions of `lang` start, if that language is enabled.
    pub(super) fn spec_for(&self, lang: Language) -> Option<&LaunchSpec> {
        match lang {
            Language::Python => self.python_on.then_some(&self.spec),
            Language::R => self.r_spec.as_ref(),
        }
    }

    /// The language of a session created without one: Python unless it is off.
    pub fn first_language(&self) -> Language {
        if self.python_on || self.r_spec.is_none() {
            Language::Python
        } else {
            Language::R
        }
    }

    /// Refuses a session of another language than the tool's (a session
    /// that does not exist yet is fine: the tool creates it).
    pub fn check_language(&self, name: &str, lang: Language) -> Result<(), SessionError> {
        if self.spec_for(lang).is_none() {
            return Err(SessionError::LanguageOff(lang));
        }
        let has = match self.sessions().get(name) {
            Some(s) => s.language,
            None => default_language(name).unwrap_or(lang),
        };
        if has != lang {
            return Err(SessionError::WrongLanguage {
                session: name.to_string(),
                has,
                wanted: lang,
            });
        }
        Ok(())
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

    /// Puts back a name `revive_stored` took (its session was not admitted).
    pub(super) fn leave_stored(&self, name: &str) {
        self.left_stored().insert(name.to_string());
    }

    pub(super) fn left_stored(&self) -> MutexGuard<'_, BTreeSet<String>> {
        self.left_stored.lock().unwrap_or_else(|e| e.into_inner())
    }
}
