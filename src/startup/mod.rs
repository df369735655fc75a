//! Start-up decisions from the operator's flags and environment, made once
//! before any session exists: the interpreter, what sessions may read,
//! write and reach (the sandbox policy, probed), and how installers run.
//! Nothing a session can write is trusted or run here.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::{self, settings::Settings};
use crate::{installer, sandbox, state, worker};

mod cell_egress;
pub use cell_egress::{CellEgress, TenantEgress};
mod identity;
mod installers;
pub mod places;
pub use identity::uid_table;
pub mod preflight;
mod view;

/// What the server starts with.
pub struct Prepared {
    pub python: PathBuf,
    /// Where the venvs ferrepl keeps for workspaces go (python_install puts
    /// packages there), and the interpreter they are made from: when sessions
    /// are kept (a state directory) and the interpreter is not one the agent
    /// wrote; over the user's venv when it is one.
    pub kept_venvs: Option<KeptVenvs>,
    pub sandbox: sandbox::SandboxConfig,
    pub installer: installer::InstallerSettings,
    /// The map of places as start-up settled it: what sessions can write
    /// (the workspace, --allow-write, venvs, the kept venvs; upstream MCP
    /// servers never run from there), read, never see; ferrepl's own files.
    pub places: sandbox::places::Places,
    /// With `--network domains`, the cells' proxy (tenants get listeners
    /// of their own on it).
    pub cell_egress: Option<std::sync::Arc<CellEgress>>,
    /// The Jupyter kernels sessions may run on (--kernels).
    pub kernels: Vec<worker::kernel::KernelSpec>,
}

/// The venvs kept in the state directory (`<root>/venvs/...`).
#[derive(Debug, Clone)]
pub struct KeptVenvs {
    pub root: PathBuf,
    /// The interpreter they are made from (over a user's venv: its own).
    pub base: PathBuf,
    /// The user's venv they are kept over, which sessions only read.
    pub layer: Option<PathBuf>,
}

/// What start-up decides for beyond the settings: this server's own
/// places, and whether it serves tenants.
#[derive(Clone, Copy)]
pub struct Instance<'a> {
    /// This server's private runtime directory.
    pub runtime: &'a state::RuntimeDir,
    /// The stores' directory, checked (None: sessions are not kept).
    pub stores: Option<&'a Path>,
    pub tenants: bool,
    /// A root server's session uids.
    pub uids: Option<&'a sandbox::uids::TenantUids>,
    /// `doctor`: every decision and refusal, nothing created.
    pub peek: bool,
}

pub fn prepare(settings: &Settings, instance: Instance<'_>) -> anyhow::Result<Prepared> {
    let workdir = settings.workdir.as_path();
    let Instance {
        runtime: state_dir,
        stores: kept_in,
        tenants,
        uids: _,
        peek,
    } = instance;
    // The map of places: what the flags name, ferrepl's own files and the
    // private places; start-up adds what it discovers below.
    let mut places = places::named(settings);
    places::add_own_and_hidden(&mut places, settings, state_dir, kept_in);
    if tenants {
        check_shared_places(&places, kept_in)?;
    }
    let (mut python, mut source) =
        worker::python::resolve(settings.interpreters.python.as_deref(), workdir);
    // Judged from the path as named: a venv's interpreter links to its base.
    let named_a_venv = worker::session_venv::in_a_venv(&python);
    let named_venv = python
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    let abs = |p: &PathBuf| sandbox::paths::normalize(p, workdir);
    // The user's venv: --venv, the .venv found upward, or the one --python
    // lies in. Sessions only read it (a .pth there would run on the host);
    // installs go to a venv kept over it. The first two stay among the
    // places the server never trusts or runs (sessions wrote them before).
    let mut venvs = Vec::new();
    if let Some(venv) = &settings.interpreters.venv {
        venvs.push(abs(venv));
    } else if source == worker::python::PythonSource::Venv
        && let Some(dir) = python.parent().and_then(Path::parent)
    {
        venvs.push(dir.to_path_buf());
    }
    if settings.interpreters.venv.is_none() {
        // The .venv found upward (--venv is on the map already).
        for venv in &venvs {
            places.add_untrusted("the .venv found upward", venv);
        }
    }
    // What sessions can write: nothing there is trusted or run by the
    // server outside the sandbox.
    let writable = places.writable();
    if venvs.is_empty()
        && named_a_venv
        && let Some(dir) = named_venv
    {
        venvs.push(dir);
    }
    // The system interpreter on PATH is the base for creating venvs and for
    // finding the installation sessions need to read.
    let path_python = writable
        .find_on_path("python3")
        .and_then(|p| sandbox::paths::real_executable(&p));
    if !writable.contains(&python)
        && let Some(real) = sandbox::paths::real_executable(&python)
    {
        // A pyenv/asdf shim would pick its version per session from files
        // the agent can write; sessions run the binary it selects now.
        python = real;
    }
    let base_python = if writable.contains(&python) {
        path_python.clone().unwrap_or_else(|| python.clone())
    } else {
        python.clone()
    };
    if let Some(dir) = settings.interpreters.venv.as_ref().map(abs) {
        let made = dir.join("bin/python");
        python = match peek {
            // Doctor makes nothing: a venv not made yet would be made from
            // the base interpreter, which is what it checks then.
            true if made.is_file() => made,
            true => base_python.clone(),
            false => worker::python::ensure_venv(&dir, &base_python, &writable)?,
        };
        source = worker::python::PythonSource::VenvFlag;
    }
    let plain = matches!(
        source,
        worker::python::PythonSource::Path | worker::python::PythonSource::Flag
    ) && !named_a_venv
        && !writable.contains(&python);
    let kept_venvs = match (kept_in, venvs.first()) {
        (Some(root), Some(user)) => Some(KeptVenvs {
            root: root.to_path_buf(),
            base: python.clone(),
            layer: Some(user.clone()),
        }),
        (Some(root), None) if plain => Some(KeptVenvs {
            root: root.to_path_buf(),
            base: python.clone(),
            layer: None,
        }),
        _ => None,
    };
    let mut kept_dirs = Vec::new();
    if let (Some(kept), false, false) = (&kept_venvs, tenants, peek) {
        // The sole tenant's: writable in the view (and idmapped like the
        // workspace when that is root's), so it is named before the
        // sandbox is settled. Tenants' are added as each is built.
        let owner = sandbox::owner_of(workdir);
        let dir = worker::session_venv::prepare_dir(
            &kept.root,
            workdir,
            "local",
            kept.layer.as_deref(),
            owner,
        )
        .with_context(|| format!("the sessions' venv in {}", kept.root.display()))?;
        places.add_writable("the sessions' kept venv", &dir);
        kept_dirs.push(dir);
    }
    let writable = places.writable();
    if tenants && python.starts_with(workdir) {
        anyhow::bail!(
            "the interpreter {} is inside --workdir, which holds the tenants' workspaces and is not in their sessions' view; give --python outside it",
            python.display()
        );
    }
    tracing::info!(python = %python.display(), ?source, workdir = %workdir.display(), "ferrepl {} starting", env!("CARGO_PKG_VERSION"));
    // Read once, now: nothing sessions can write names a kernel or its program.
    let kernels = worker::kernel::spec::discover(
        &settings.interpreters.kernels,
        &worker::kernel::spec::data_dirs(std::env::var_os("JUPYTER_PATH").as_deref(), &python),
        &places,
    )?;

    let (mut sandbox_cfg, summary) = sandbox_settings(
        settings,
        instance,
        Interpreters {
            python: &python,
            base_python: &base_python,
            venvs: &venvs,
            kept: &kept_dirs,
            kernels: &kernels,
        },
        &mut places,
    )?;
    // The cells' first: its refusal (no namespaces) comes before the
    // installers' warning about the same.
    let cell_proxy = cell_egress::settle(settings, &mut sandbox_cfg, state_dir)?;
    let (installer, proxy) = installers::settle(settings, &mut sandbox_cfg, state_dir, &writable)?;
    if sandbox_cfg.enabled() {
        guard_own_files(&places, &sandbox_cfg)?;
    }
    // Every refusal is behind us: only now does anything start.
    if let Some(proxy) = proxy {
        proxy.start()?;
    }
    if settings.sandbox.inherit {
        // The status line and doctor say who decides.
        sandbox_cfg.active.push_str(
            "; inherit: each call runs under the client's sandbox policy (Codex's), narrowing this setting, never widening it",
        );
    }
    let cell_egress = cell_proxy.map(cell_egress::CellProxy::start).transpose()?;
    if sandbox_cfg.enabled() {
        // The whole description is long (doctor shows it item by item).
        tracing::info!("sandbox: {summary} (details: ferrepl doctor)");
        tracing::debug!("sandbox: {}", sandbox_cfg.active);
    } else {
        tracing::warn!("sandbox: {}", sandbox_cfg.active);
    }
    if let Some(kept) = &kept_venvs {
        places.add_writable("the kept venvs", &kept.root);
    }
    places.protected = sandbox_cfg.protected.clone();
    Ok(Prepared {
        python,
        kept_venvs,
        sandbox: sandbox_cfg,
        installer,
        places,
        cell_egress,
        kernels,
    })
}

/// The sandbox fixed from the operator's flags and environment: what every
/// session and job may read, write and reach, and which interpreters
/// python_sessions may name. Then probed; with a one-line summary.
fn sandbox_settings(
    settings: &Settings,
    instance: Instance<'_>,
    found: Interpreters<'_>,
    places: &mut sandbox::places::Places,
) -> anyhow::Result<(sandbox::SandboxConfig, String)> {
    let workdir = settings.workdir.as_path();
    let (state_dir, kept_in) = (instance.runtime, instance.stores);
    let (tenants, uids) = (instance.tenants, instance.uids);
    let abs = |p: &PathBuf| sandbox::paths::normalize(p, workdir);
    let writable = &places.writable();
    let access = Access::granted(settings, found, writable);
    let sys_view = sandbox::view::View::of_system();
    // Private places an --allow-read/--allow-write path may not hold (the
    // stores and this instance's runtime directory are checked with
    // ferrepl's own files, with their own message).
    view::check_allow_paths(places)?;
    // The stored sessions of every workspace (one inside the workspace is
    // refused with ferrepl's own files).
    if let Some(dir) = kept_in.and_then(|d| d.canonicalize().ok())
        && !dir.starts_with(workdir)
        && !places.hidden().iter().any(|h| dir.starts_with(h))
    {
        places.add_hidden(&dir);
    }
    check_workspace(settings, places)?;
    let hidden = places.hidden();
    let mut read = access.read;
    read.extend(view::path_entries(
        &std::env::var_os("PATH").unwrap_or_default(),
        &sys_view,
        &hidden,
        writable,
    ));
    if settings.languages.contains(&worker::Language::R) {
        read.extend(view::r_dirs(settings, writable));
    }
    read.retain(|p| !sys_view.shows(p));
    read.extend(sandbox::view::nix_store(&read));
    places.show(read);
    let mut sandbox_cfg = sandbox::SandboxConfig {
        mode: settings.sandbox.mode,
        network: settings.sandbox.network == config::Network::On,
        egress: None,
        egress_hosts: Vec::new(),
        cell_egress: None,
        require: settings.sandbox.require,
        memory_limit: settings.sandbox.memory_limit,
        max_processes: settings.sandbox.max_processes,
        max_file_bytes: settings.sandbox.max_file_bytes,
        max_open_files: settings.sandbox.max_open_files,
        workspace: workdir.to_path_buf(),
        state: state_dir.path().to_path_buf(),
        view: sys_view,
        read: places.view_read(),
        installer_read: Vec::new(),
        write: places.view_write(),
        devices: settings.sandbox.allow_device.iter().map(abs).collect(),
        allowed_python: access.allowed_python,
        namespaces: settings.sandbox.namespaces,
        env: sandbox::env::inherited(&settings.sandbox.pass_env),
        active: String::new(),
        cgroups: None,
        identity: None,
        idmap: false,
        named_read: places.named_read(),
        idmapped: Vec::new(),
        identity_gap: None,
        namespaces_gap: None,
        protected: None,
    };
    sandbox_cfg.protected = protected_places(settings, &sandbox_cfg, found.venvs)?;
    if sandbox_cfg.enabled() {
        sandbox_cfg.cgroups = sandbox::cgroup::CgroupRoot::detect();
    }
    identity::choose(&mut sandbox_cfg, tenants, uids)?;
    let applied = sandbox::probe(&mut sandbox_cfg)?;
    if sandbox_cfg.enabled() {
        let (uid_part, degraded) = identity::describe(&sandbox_cfg, tenants);
        if degraded && settings.sandbox.require {
            anyhow::bail!("--sandbox-require: {uid_part}");
        }
        sandbox_cfg.active.push_str("; ");
        sandbox_cfg.active.push_str(&uid_part);
    }
    if tenants && !applied.namespaces && !applied.landlock_full() {
        // Neither a private mount namespace nor Landlock would keep one
        // tenant's sessions out of another's workspace.
        anyhow::bail!(
            "tenants need a sandbox that keeps each tenant in its own workspace (private mount namespaces or full Landlock), and this one has neither: {}; run where the kernel allows them (see docs/deploy.md), or serve one tenant per instance",
            sandbox_cfg.active
        );
    }
    if tenants {
        identity::refuse_degraded_tenants(
            &sandbox_cfg,
            applied.namespaces,
            settings.sandbox.allow_degraded_isolation,
        )?;
    }
    if sandbox_cfg.enabled() {
        warn_unreadable_interpreter(&sandbox_cfg, found.python);
    }
    let summary = sandbox::short_description(&sandbox_cfg, &applied);
    Ok((sandbox_cfg, summary))
}

/// The protected places of a writable workspace (and of --allow-write
/// paths), from the built-in list and the operator's --protect and
/// --allow-write-protected; and the user's venv where it lies in one under
/// another name than `.venv` (`--venv env`), protected and freed like
/// `.venv`.
fn protected_places(
    settings: &Settings,
    sandbox_cfg: &sandbox::SandboxConfig,
    venvs: &[PathBuf],
) -> anyhow::Result<Option<sandbox::protected::Protected>> {
    // Read-only sessions still write the --allow-write paths: those are
    // protected like a writable workspace.
    let writes_shared = match sandbox_cfg.mode {
        sandbox::SandboxMode::Off => false,
        sandbox::SandboxMode::ReadOnly => !sandbox_cfg.write.is_empty(),
        sandbox::SandboxMode::WorkspaceWrite => true,
    };
    if !writes_shared {
        return Ok(None);
    }
    // Each root as given (its place in a namespace's view) and resolved
    // (its place without namespaces, where links are followed).
    let mut roots = vec![sandbox_cfg.workspace.clone()];
    for path in &sandbox_cfg.write {
        roots.push(path.clone());
        if let Ok(real) = path.canonicalize()
            && real != *path
        {
            roots.push(real);
        }
    }
    let mut protected = sandbox::protected::Protected::new(
        roots,
        &settings.sandbox.protect,
        &settings.sandbox.allow_write_protected,
    )?;
    if protected.names.iter().any(|n| n == ".venv") {
        for venv in venvs {
            let venv = venv.canonicalize().unwrap_or_else(|_| venv.clone());
            let shared = protected.roots.iter().any(|r| venv.starts_with(r));
            if shared && protected.find(&venv).is_none() {
                protected.venvs.push(venv);
            }
        }
    }
    Ok((!protected.is_empty()).then_some(protected))
}

/// Where ferrepl's own files stand against the view: refused inside
/// anything sessions can write or read; and no bound path may lie inside
/// another place sessions can write.
fn guard_own_files(
    places: &sandbox::places::Places,
    sandbox_cfg: &sandbox::SandboxConfig,
) -> anyhow::Result<()> {
    view::check_own_files(places)?;
    let mut nested = view::bound_paths(sandbox_cfg);
    nested.extend(sandbox_cfg.devices.iter().cloned());
    view::check_nesting(places, &nested)?;
    // A cover would be a mount over one name, which a rename on the host
    // (a rotated tokens file, a Kubernetes Secret's new version) undoes.
    view::refuse_bound(places, &view::bound_paths(sandbox_cfg))
}

/// The interpreters start-up settled on and the venvs around them.
#[derive(Clone, Copy)]
struct Interpreters<'a> {
    /// What sessions run.
    python: &'a Path,
    /// The interpreter it was made from (venvs are made from it too).
    base_python: &'a Path,
    /// The user's venvs: read, never written, by sessions.
    venvs: &'a [PathBuf],
    /// The kept venvs sessions install into.
    kept: &'a [PathBuf],
    /// The Jupyter kernels sessions may run on: their programs and
    /// kernelspecs are shown read-only.
    kernels: &'a [worker::kernel::KernelSpec],
}

/// What sessions may read beyond the system and the workspace, and the
/// interpreters python_sessions may name.
struct Access {
    read: Vec<PathBuf>,
    allowed_python: Vec<PathBuf>,
}

impl Access {
    /// From the interpreters (`python` and the base it was made from), the
    /// user's venvs (read-only), the kept venvs (python_sessions may name
    /// them), --allow-python, uv on PATH and --allow-read. What sessions
    /// write is the map's (`Places::view_write`).
    fn granted(
        settings: &Settings,
        found: Interpreters<'_>,
        writable: &sandbox::paths::Writable,
    ) -> Self {
        use sandbox::paths::{interpreter_dirs, normalize};
        let workdir = settings.workdir.as_path();
        let Interpreters {
            python,
            base_python,
            venvs,
            kept,
            kernels,
        } = found;
        let abs = |p: &PathBuf| normalize(p, workdir);
        let outside = |p: &Path| !p.starts_with(workdir);
        let mut read = interpreter_dirs(python, writable);
        read.extend(interpreter_dirs(base_python, writable));
        // The user's venvs are read, never written: a .pth or a bin/ script
        // planted there would run on the host (python_install writes the
        // venv kept over them).
        read.extend(venvs.iter().filter(|v| outside(v)).cloned());
        for kernel in kernels {
            read.extend(interpreter_dirs(kernel.program(), writable));
            read.push(kernel.dir.clone());
        }
        let mut allowed_python = vec![python.to_path_buf(), base_python.to_path_buf()];
        allowed_python.extend(venvs.iter().chain(kept).cloned());
        for p in settings.interpreters.allow_python.iter().map(abs) {
            if p.join("pyvenv.cfg").is_file() {
                // A venv: read-only, as the user's are (the operator's own
                // environment, run on the host too), never run by the
                // server; its base must be readable already (--python, or
                // another --allow-python).
                if outside(&p) {
                    read.push(p.clone());
                }
            } else if p.is_dir() {
                read.extend(interpreter_dirs(&p.join("bin").join("python3"), writable));
            } else {
                read.extend(interpreter_dirs(&p, writable));
            }
            allowed_python.push(p);
        }
        if let Some(uv) = writable.find_on_path("uv")
            && let Ok(real) = uv.canonicalize()
            && let Some(dir) = real.parent()
        {
            read.push(dir.to_path_buf());
        }
        read.extend(settings.sandbox.allow_read.iter().map(abs));
        read.sort();
        read.dedup();
        Access {
            read,
            allowed_python,
        }
    }
}

/// With tenants, nothing writable may be shared between them (one tenant
/// could change what another runs or reads), and the stores must not lie
/// in a tenant's workspace.
fn check_shared_places(
    places: &sandbox::places::Places,
    kept_in: Option<&Path>,
) -> anyhow::Result<()> {
    // Everything writable but the workspace (whose subdirectories are the
    // tenants' own): --allow-write, --venv, venvs in --allow-python.
    if places.writable_places().len() > 1 {
        anyhow::bail!(
            "--allow-write would be writable by every tenant (one could change what another runs), and --venv and venvs in --allow-python are not shared between tenants either; with tenants, each keeps its venvs in its own workspace (python_install, python_sessions create venv=...), and shared interpreters are given read-only with --python or --allow-python DIR"
        );
    }
    let workspace = &places.workspace;
    if let Some(stores) = kept_in.map(|d| sandbox::places::resolve(d, d))
        && stores.within(workspace)
    {
        // <workdir>/<name> would be tenant <name>'s workspace.
        anyhow::bail!(
            "--state-dir {} is inside --workdir {}, where a tenant's workspace could be it; put the stores outside the workspaces",
            stores.real.display(),
            workspace.given.display()
        );
    }
    Ok(())
}

/// Refuses a workspace that holds a private place, and --allow-read or
/// --allow-write paths inside the workspace.
fn check_workspace(settings: &Settings, places: &sandbox::places::Places) -> anyhow::Result<()> {
    let workdir = &places.workspace.given;
    if settings.sandbox.mode != sandbox::SandboxMode::Off
        && let Some(h) = places.hidden_in_workspace()
    {
        anyhow::bail!(
            "the workspace {} contains {}, which sessions must not see (a home, a temporary or runtime directory, or ferrepl's own state); pick a narrower --workdir, or set XDG_RUNTIME_DIR/TMPDIR elsewhere",
            workdir.display(),
            h.real.display()
        );
    }
    for place in places.allowed() {
        if place.at.within(&places.workspace) {
            anyhow::bail!(
                "--allow-read/--allow-write {} is inside the workspace, which sessions can already use (and could swap for a symlink); give paths outside it",
                place.at.given.display()
            );
        }
    }
    Ok(())
}

/// An interpreter inside the workspace (a `.venv`) whose real binary lies in
/// a place sessions may not read cannot start in the sandbox; nothing is
/// widened for it (the agent can rewrite it), but the operator is told how.
fn warn_unreadable_interpreter(sandbox_cfg: &sandbox::SandboxConfig, python: &Path) {
    if !python.starts_with(&sandbox_cfg.workspace) {
        return;
    }
    let Ok(real) = python.canonicalize() else {
        return;
    };
    let readable = real.starts_with(&sandbox_cfg.workspace)
        || sandbox_cfg.read.iter().any(|r| real.starts_with(r))
        || sandbox_cfg.view.shows(&real);
    if !readable {
        tracing::warn!(
            "the interpreter {} is {}, which is not in the sandbox's view; start ferrepl with --allow-python {} or --python PATH",
            python.display(),
            real.display(),
            real.display()
        );
    }
}
