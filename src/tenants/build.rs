//! One tenant's components (sessions, jobs, files, store, cgroups), built
//! from what start-up decided once for the instance.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::config::settings::Settings;
use crate::config::tokens::Tenant;
use crate::installer::InstallerSettings;
use crate::jobs::JobManager;
use crate::mcp::groups::ToolGroups;
use crate::mcp::server::AppParts;
use crate::sandbox::SandboxConfig;
use crate::session::SessionManager;
use crate::session::gate::{Gate, TenantGate, WorkspaceQuota};
use crate::worker::Language;
use crate::{files, worker};

/// What every tenant is built from.
pub struct Base {
    pub settings: Settings,
    pub groups: ToolGroups,
    pub python: PathBuf,
    /// The venvs kept for workspaces whose interpreter is not one.
    pub kept_venvs: Option<crate::startup::KeptVenvs>,
    pub sandbox: SandboxConfig,
    pub installer: InstallerSettings,
    pub log_dir: PathBuf,
    pub gate: Arc<Gate>,
    /// Tenants' own uids (a root server; None: sessions keep the server's).
    pub uids: Option<Arc<crate::sandbox::uids::TenantUids>>,
    /// The upstream MCP servers sessions' code may call (--mcp-servers).
    pub upstreams: Arc<crate::upstream::Upstreams>,
    /// The viewer's address (--viewer), named in python_sessions status.
    pub viewer_url: Option<String>,
    /// With `--network domains`, the cells' proxy.
    pub cell_egress: Option<Arc<crate::startup::CellEgress>>,
    /// The Jupyter kernels sessions may run on (--kernels).
    pub kernels: Arc<[Arc<worker::kernel::KernelSpec>]>,
}

/// One tenant's running parts.
pub struct TenantApp {
    pub tenant: Tenant,
    pub parts: AppParts,
    pub manager: Arc<SessionManager>,
    pub jobs: Arc<JobManager>,
    gate: Arc<TenantGate>,
    /// Removed once the sessions are gone (the fields drop in order).
    _cgroup: Option<crate::sandbox::cgroup::TenantCgroup>,
    /// A named tenant's listener on the cells' proxy, closed after its
    /// sessions.
    _cell_egress: Option<crate::startup::TenantEgress>,
}

impl Base {
    /// The workspace of `tenant`: the workspace itself for the sole tenant,
    /// `<workdir>/<tenant>` for a named one (created, never a symbolic link).
    fn workspace_of(&self, tenant: &Tenant) -> anyhow::Result<PathBuf> {
        let root = &self.settings.workdir;
        let Tenant::Named(name) = tenant else {
            return Ok(root.clone());
        };
        let dir = root.join(name);
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => anyhow::bail!(
                "{} exists and is not a directory; remove it so tenant '{name}' gets its workspace",
                dir.display()
            ),
            Err(_) => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
        }
        Ok(dir)
    }

    /// Builds and starts a tenant's parts (its default sessions warm up
    /// in the background).
    pub fn build(&self, tenant: &Tenant) -> anyhow::Result<TenantApp> {
        let workdir = self.workspace_of(tenant)?;
        let mut settings = self.settings.clone();
        settings.workdir = workdir.clone();
        let mut sandbox = self.sandbox.clone();
        sandbox.workspace = workdir.clone();
        sandbox.protected = sandbox.protected.map(|p| p.with_workspace(&workdir));
        let venv = self.kept_venv(tenant, &workdir, &mut sandbox)?;
        if let (Tenant::Named(name), Some(uids), Some(_)) = (tenant, &self.uids, sandbox.identity) {
            // Its own uid, owning its workspace; the server keeps its access.
            let id = uids.identity_of(name)?;
            crate::sandbox::uids::give_workspace(&workdir, id)
                .with_context(|| format!("cannot give {} to uid {}", workdir.display(), id.uid))?;
            sandbox.set_identity(Some(id), true);
            sandbox.active = sandbox.active.replace(
                "each tenant's own uid",
                &format!("this tenant's own uid {}", id.uid),
            );
        }
        // A named tenant's cells reach the proxy through a listener of its
        // own, which is how the proxy counts the tenant's share.
        let cell_egress = match (tenant, &self.cell_egress) {
            (Tenant::Named(name), Some(cells)) => Some(cells.for_tenant(name)?),
            _ => None,
        };
        if let Some(own) = &cell_egress {
            sandbox.cell_egress = Some(own.relay.clone());
        }
        if let (Tenant::Named(_), Some(extra)) = (tenant, crate::test_hooks::tenant_extra_read()) {
            sandbox.read.push(extra);
        }
        let mut cgroup = None;
        if let (Tenant::Named(name), Some(root)) = (tenant, &self.sandbox.cgroups) {
            let (tenant_root, group) = root.tenant(
                name,
                self.settings.tenant_memory,
                self.settings.sandbox.tenant_cpu_weight,
            );
            sandbox.cgroups = Some(tenant_root);
            cgroup = Some(group);
        }
        // Each named tenant's share (config::settings::Shares).
        let mut job_share = usize::MAX;
        if let Tenant::Named(_) = tenant {
            let shares = settings.shares;
            settings.limits.max_sessions = shares.sessions;
            settings.limits.sessions_share = true;
            job_share = shares.jobs;
            if settings.limits.warm_pool > 0 {
                settings.limits.warm_pool = shares.warm_pool;
            }
        }
        let sandbox = Arc::new(sandbox);
        let workspace = files::Workspace::new(&workdir)
            .with_context(|| format!("workspace root {}", workdir.display()))?
            .read_only(self.settings.sandbox.mode == crate::sandbox::SandboxMode::ReadOnly)
            .protected(sandbox.protected.clone().map(Arc::new));
        let log_dir = self.log_dir_of(tenant)?;
        let quota = match (tenant, self.settings.tenant_disk) {
            (Tenant::Named(_), Some(limit)) => {
                // The sessions' and jobs' HOME and TMPDIR (and their logs)
                // are written as freely as the workspace.
                let scratch = files::Workspace::new(&log_dir)
                    .with_context(|| format!("temporary directory {}", log_dir.display()))?;
                Some(WorkspaceQuota::watch(
                    vec![workspace.clone(), scratch],
                    limit,
                ))
            }
            _ => None,
        };
        let gate = TenantGate::new(self.gate.clone(), quota, job_share);
        let tenant_gate = gate.clone();
        let durable = super::store::open(&self.settings.stores, &workdir, tenant.name())?;

        let mut job_config = settings.job_config(&log_dir, sandbox.clone(), self.installer.clone());
        job_config.gate = Some(gate.clone());
        let jobs = JobManager::new(job_config);
        jobs.spawn_resource_watch();
        let mut spec = settings.launch_spec(
            Language::Python,
            self.python.clone(),
            &log_dir,
            sandbox.clone(),
        );
        if let Some(mut venv) = venv {
            if !self.settings.ready_made.preinstall.is_empty() {
                venv.preinstall = Some(Arc::new(worker::preinstall::Preinstall::new(
                    self.settings.ready_made.preinstall.clone(),
                )));
            }
            spec.program = venv.python();
            let venv = Arc::new(venv);
            spec.venv = Some(venv.clone());
            super::preinstall::spawn(
                venv,
                jobs.clone(),
                spec.clone(),
                settings.limits.start_timeout,
            );
        }
        let upstream = self.upstreams.tenant(tenant.name());
        let upstream_servers = upstream.servers();
        spec.upstream = Some(upstream.clone());
        spec.kernels = self.kernels.clone();
        let r_spec = self
            .settings
            .languages
            .contains(&Language::R)
            .then(|| self.r_spec(&settings, &workdir, &log_dir, sandbox.clone()))
            .map(|mut r| {
                r.upstream = Some(upstream);
                r
            });
        let manager = SessionManager::new(
            spec,
            self.settings.languages.contains(&Language::Python),
            r_spec,
            settings.limits.clone(),
            durable,
            gate,
        );
        // Per-client sessions are each client's own: none is started ahead
        // (stateless requests create the shared one when they come).
        let per_client = self.settings.serving.per_client && self.settings.serving.http.is_some();
        manager.warm_up(!per_client);
        manager.spawn_reaper();
        manager.spawn_state_saver();
        manager.spawn_resource_watch();
        let parts = AppParts::new(
            manager.clone(),
            jobs.clone(),
            workspace,
            self.groups.clone(),
            settings.structured,
            &upstream_servers,
        )
        .with_viewer(self.viewer_url.clone());
        Ok(TenantApp {
            tenant: tenant.clone(),
            parts,
            manager,
            jobs,
            gate: tenant_gate,
            _cgroup: cgroup,
            _cell_egress: cell_egress,
        })
    }

    /// The venv kept for the tenant's workspace (over the user's venv when
    /// the interpreter is one): a named tenant's is added to its view here,
    /// writable and its own (the sole tenant's was added at start-up).
    fn kept_venv(
        &self,
        tenant: &Tenant,
        workdir: &Path,
        sandbox: &mut SandboxConfig,
    ) -> anyhow::Result<Option<worker::session_venv::SessionVenv>> {
        let Some(kept) = &self.kept_venvs else {
            return Ok(None);
        };
        let owner = match (tenant, &self.uids, sandbox.identity) {
            (Tenant::Named(name), Some(uids), Some(_)) => Some(uids.identity_of(name)?),
            (Tenant::Named(_), _, _) => None,
            (Tenant::Sole, _, _) => crate::sandbox::owner_of(workdir),
        };
        let dir = worker::session_venv::prepare_dir(
            &kept.root,
            workdir,
            tenant.name(),
            kept.layer.as_deref(),
            owner,
        )
        .with_context(|| format!("the sessions' venv in {}", kept.root.display()))?;
        if let Tenant::Named(_) = tenant {
            sandbox.write.push(dir.clone());
            sandbox.allowed_python.push(dir.clone());
        }
        let mut venv = worker::session_venv::SessionVenv::new(dir, kept.base.clone());
        if let Some(user) = &kept.layer {
            venv = venv.over(user.clone());
        }
        // Shell jobs and subprocesses run the same interpreter as the
        // sessions, and see what python_install put there; the user's
        // venv's commands come next. VIRTUAL_ENV names the kept venv, the
        // one installers (uv, pip) may write.
        let path = venv.shell_path(sandbox.env.get("PATH").map(String::as_str));
        sandbox.env.insert("PATH".into(), path);
        sandbox
            .env
            .insert("VIRTUAL_ENV".into(), venv.dir.display().to_string());
        Ok(Some(venv))
    }

    /// Where a tenant's output logs and its processes' temporary homes go:
    /// its own directory, as job numbers start at 1 in every tenant.
    fn log_dir_of(&self, tenant: &Tenant) -> anyhow::Result<PathBuf> {
        let Tenant::Named(name) = tenant else {
            return Ok(self.log_dir.clone());
        };
        let dir = self.log_dir.join("tenants").join(name);
        crate::state::private_dir(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(dir)
    }

    fn r_spec(
        &self,
        settings: &Settings,
        workdir: &Path,
        log_dir: &Path,
        sandbox: Arc<SandboxConfig>,
    ) -> worker::LaunchSpec {
        let r = worker::r::resolve(self.settings.interpreters.r.as_deref());
        if r.is_none() {
            tracing::warn!(
                "R sessions are enabled but no R was found: {}",
                worker::r::INSTALL_HINT
            );
        }
        let r = r.unwrap_or_else(|| "R".into());
        let mut spec = settings.launch_spec(Language::R, r, log_dir, sandbox);
        let library = workdir.join(worker::r::LIBRARY);
        spec.env
            .push(("R_LIBS_USER".into(), library.display().to_string()));
        spec
    }
}

/// What a revocation ended.
pub struct Ended {
    pub sessions: usize,
    pub jobs: usize,
}

impl TenantApp {
    /// Its tokens are gone from the token file: new work is refused and its
    /// running interpreters and jobs are killed. Its sessions, files and
    /// store stay, for a tenant whose token comes back ([`Self::reinstate`]).
    /// What was ended, or None when it was revoked already.
    pub fn revoke(&self) -> Option<Ended> {
        if self.gate.set_revoked(true) {
            return None;
        }
        let reason = "The operator revoked this tenant's token";
        Some(Ended {
            sessions: self.manager.end_all(reason),
            jobs: self.jobs.end_all(reason),
        })
    }

    /// Its tokens are gone from the token file.
    pub fn is_revoked(&self) -> bool {
        self.gate.is_revoked()
    }

    /// A token of the tenant is back: new work is admitted again. True when
    /// it was revoked.
    pub fn reinstate(&self) -> bool {
        self.gate.set_revoked(false)
    }

    /// Ends its jobs and workers and flushes its store.
    pub async fn shutdown(&self) {
        self.jobs.shutdown();
        self.manager.shutdown().await;
    }
}
