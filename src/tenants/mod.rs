//! Tenants: who a request belongs to (its bearer token decides), and each
//! tenant's own sessions, jobs, workspace (`<workdir>/<tenant>`), store and
//! limits, built on its first request. A server without tenant tokens has
//! one, the sole tenant, which is the workspace itself.

pub mod build;
mod preinstall;
pub mod store;
pub use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

pub use crate::config::tokens::{Tenant, TokenTable};
pub use build::{Base, TenantApp};

/// The tenants of one server process.
pub struct Instance {
    base: Base,
    tokens: RwLock<Arc<TokenTable>>,
    /// Where the tokens came from (reloaded on SIGHUP).
    token_file: Option<PathBuf>,
    /// Held while tenants are revoked or reinstated against the tokens, so
    /// a reload and a tenant built beside it agree on the latest tokens.
    revocation: Mutex<()>,
    live: Mutex<HashMap<Tenant, Arc<Slot>>>,
    /// Set by shutdown: no tenant is built after it.
    closing: AtomicBool,
    started: Instant,
    /// Bumped after each token reload, for what must follow it (the HTTP
    /// connections of a removed or replaced token are closed).
    reloads: tokio::sync::watch::Sender<u64>,
}

/// A tenant's parts once built; its first callers wait on `building`, so a
/// slow build (store, cgroups, a directory scan) holds up no other tenant.
#[derive(Default)]
struct Slot {
    app: OnceLock<Arc<TenantApp>>,
    building: Mutex<()>,
}

/// Whether `tenant` has lost all its tokens (the sole tenant never does:
/// without a token file nothing is reloaded).
fn revoked(tokens: &TokenTable, tenant: &Tenant) -> bool {
    matches!(tenant, Tenant::Named(_)) && !tokens.has(tenant)
}

impl Instance {
    pub fn new(base: Base, tokens: TokenTable, token_file: Option<PathBuf>) -> Arc<Self> {
        Arc::new(Self {
            base,
            tokens: RwLock::new(Arc::new(tokens)),
            token_file,
            revocation: Mutex::new(()),
            live: Mutex::new(HashMap::new()),
            closing: AtomicBool::new(false),
            started: Instant::now(),
            reloads: tokio::sync::watch::channel(0).0,
        })
    }

    /// Changes after each token reload.
    pub fn watch_reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    pub fn tokens(&self) -> Arc<TokenTable> {
        self.tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether requests must present a token.
    pub fn needs_token(&self) -> bool {
        !self.tokens().is_empty()
    }

    /// Re-reads the token file. A file that cannot be read or parsed, or
    /// that would switch between one tenant and named tenants, leaves the
    /// tokens as they were. A tenant whose tokens are all gone is revoked:
    /// its running interpreters and jobs are killed and no new work starts
    /// for it, also from requests already past the token check; its
    /// sessions, files and store are kept for when a token of it returns.
    pub fn reload_tokens(&self) -> Result<String, String> {
        let Some(path) = &self.token_file else {
            return Err("no --auth-token-file to reload".into());
        };
        let table = TokenTable::read(path)?;
        let current = self.tokens();
        if table.has_tenants() != current.has_tenants() {
            return Err(
                "the file switches between one tenant and named tenants; restart ferrepl for that"
                    .into(),
            );
        }
        let table = Arc::new(table);
        let _revocation = self.revocation.lock().unwrap_or_else(|e| e.into_inner());
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = table.clone();
        let mut done = format!("tokens reloaded from {}", path.display());
        for app in self.live() {
            let name = app.tenant.name();
            if !revoked(&table, &app.tenant) {
                if app.reinstate() {
                    done.push_str(&format!("; tenant '{name}' reinstated"));
                }
            } else if let Some(ended) = app.revoke() {
                done.push_str(&format!(
                    "; tenant '{name}' revoked: {} interpreter(s) and {} job(s) killed",
                    ended.sessions, ended.jobs
                ));
            }
        }
        self.reloads.send_modify(|n| *n += 1);
        Ok(done)
    }

    pub fn base(&self) -> &Base {
        &self.base
    }

    /// The parts of `tenant`, built on first use. Blocking (the build
    /// opens its store and makes its directories): call it off the async
    /// threads once serving.
    pub fn tenant(&self, tenant: &Tenant) -> anyhow::Result<Arc<TenantApp>> {
        let slot = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.entry(tenant.clone()).or_default().clone()
        };
        if let Some(app) = slot.app.get() {
            return Ok(app.clone());
        }
        let _building = slot.building.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(app) = slot.app.get() {
            return Ok(app.clone());
        }
        if self.closing.load(Ordering::SeqCst) {
            anyhow::bail!("ferrepl is shutting down");
        }
        let app = Arc::new(self.base.build(tenant)?);
        tracing::info!(tenant = tenant.name(), "tenant started");
        let app = slot.app.get_or_init(|| app).clone();
        // Built for a request that passed the token check before a reload
        // took its tokens away. Checked after `live` holds it: a reload
        // either sees it there or has replaced the tokens before this.
        let _revocation = self.revocation.lock().unwrap_or_else(|e| e.into_inner());
        if revoked(&self.tokens(), tenant) && app.revoke().is_some() {
            tracing::info!(
                tenant = tenant.name(),
                "tenant revoked: its tokens were removed"
            );
        }
        Ok(app)
    }

    /// Every tenant built so far.
    pub fn live(&self) -> Vec<Arc<TenantApp>> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut apps: Vec<Arc<TenantApp>> =
            live.values().filter_map(|s| s.app.get().cloned()).collect();
        apps.sort_by(|a, b| a.tenant.name().cmp(b.tenant.name()));
        apps
    }

    pub fn is_draining(&self) -> bool {
        self.base.gate.is_draining()
    }

    /// Tool calls being served now (over every tenant).
    pub fn calls_in_flight(&self) -> usize {
        self.base.gate.calls_in_flight()
    }

    /// Ready for new work: not draining, and a worker could start (the
    /// interpreter is still there).
    pub fn is_ready(&self) -> Result<(), String> {
        if self.is_draining() {
            return Err("draining".into());
        }
        if !crate::executables::is_executable(&self.base.python) {
            return Err(format!(
                "the interpreter {} is gone",
                self.base.python.display()
            ));
        }
        Ok(())
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Refuses new sessions, cells and jobs, then waits up to `grace` for
    /// running cells to finish and every call in flight (a python_wait
    /// collecting one) to be answered. Results no call is collecting do not
    /// hold it: their cells stay in the saved history. Returns the cells still running.
    pub async fn drain(&self, grace: Duration) -> usize {
        self.base.gate.start_draining();
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            // Calls first: a call that starts a cell between the two reads
            // has its cell among the running.
            let calls = self.base.gate.calls_in_flight();
            // A revoked tenant's cells answer no one.
            let running: usize = self
                .live()
                .iter()
                .filter(|t| !t.is_revoked())
                .map(|t| t.manager.running())
                .sum();
            if running + calls == 0 || tokio::time::Instant::now() >= deadline {
                return running;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Ends every tenant's jobs and workers and flushes their stores (a
    /// tenant being built is waited for; none is built after).
    pub async fn shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let slots: Vec<Arc<Slot>> = {
            let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.values().cloned().collect()
        };
        let _ = tokio::task::spawn_blocking(move || {
            for slot in slots {
                drop(slot.building.lock().unwrap_or_else(|e| e.into_inner()));
            }
        })
        .await;
        let apps = self.live();
        futures::future::join_all(apps.iter().map(|a| a.shutdown())).await;
    }
}
