//! Starting a worker: what it is started from (`LaunchSpec`), the driver
//! sent to it (the embedded Python package, or R's), the bootstrap and the
//! environment it starts with, and the wait until it is ready. Kept apart
//! from the running worker (`mod.rs`), which only talks to it once started.

use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::process::{self, Launch, Stdio};

use super::*;

/// The driver, the Python package in `python/` (see its `__init__.py`), sent
/// as one text: `boot.py`, then each module's path and source, separated by
/// NUL (which Python source cannot contain). A new module is listed here.
macro_rules! driver_source {
    ($($path:literal),* $(,)?) => {
        concat!(
            include_str!("python/boot.py"),
            $("\0", $path, "\0", include_str!(concat!("python/", $path)),)*
        )
    };
}
const DRIVER_SOURCE: &str = driver_source!(
    "ferrepl_driver/__init__.py",
    "ferrepl_driver/channel.py",
    "ferrepl_driver/stdin.py",
    "ferrepl_driver/display.py",
    "ferrepl_driver/cells.py",
    "ferrepl_driver/introspect.py",
    "ferrepl_driver/control.py",
    "ferrepl_driver/checkpoint.py",
    "ferrepl_driver/signatures.py",
    "ferrepl_driver/tools.py",
    "ferrepl_driver/state.py",
    "ferrepl_driver/_vendor/__init__.py",
    "ferrepl_driver/_vendor/cloudpickle.py",
    "ferrepl_driver/main.py",
);

/// Reads the driver from fd 3 (length line, then the text above), runs
/// `boot.py` in a namespace of its own and hands it the control socket and
/// the package's sources; the session's variables live in `__main__`.
const BOOTSTRAP: &str = "import socket,sys\n\
_s=socket.socket(fileno=3)\n\
_f=_s.makefile('rb')\n\
_n=int(_f.readline())\n\
_p=_f.read(_n).decode('utf-8').split('\\0')\n\
_g={'__name__':'__ferrepl__'}\n\
exec(compile(_p[0],'<ferrepl-driver:boot.py>','exec'),_g)\n\
_g['boot']((_s,_f),dict(zip(_p[1::2],_p[2::2])))\n";

/// Everything needed to start a worker; one per interpreter configuration.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub language: Language,
    /// The interpreter: python, or R's front end.
    pub program: PathBuf,
    pub workdir: PathBuf,
    /// Variables set for the interpreter (checked by sandbox::env::check).
    pub env: Vec<(String, String)>,
    pub output_head_bytes: usize,
    pub output_tail_bytes: usize,
    pub max_value_chars: usize,
    pub max_image_bytes: u64,
    /// Directory for spilled output; each worker gets a subdirectory.
    pub log_dir: PathBuf,
    /// Budget of one cell's full output log (--output-log-bytes).
    pub cell_log_bytes: u64,
    /// OS confinement; None or mode off runs the interpreter directly.
    pub sandbox: Option<Arc<crate::sandbox::SandboxConfig>>,
    /// Fork checkpoints (Python): the driver keeps an anchor process and
    /// answers checkpoint, switch and drop requests.
    pub checkpoints: bool,
    /// The venv ferrepl keeps for the workspace (`program` is its
    /// interpreter), made before the first interpreter starts.
    pub venv: Option<Arc<session_venv::SessionVenv>>,
    /// The upstream MCP servers its code may call (the tenant's view).
    pub upstream: Option<Arc<crate::upstream::TenantUpstreams>>,
    /// Modules a Python driver imports before it says it is ready
    /// (--preimport: dotted names, checked by config::ready).
    pub preimport: Vec<String>,
    /// The installed Jupyter kernel it runs instead of the driver.
    pub kernel: Option<Arc<kernel::KernelSpec>>,
    /// The kernels sessions may be created on (--kernels); the server's
    /// Python spec carries them.
    pub kernels: Arc<[Arc<kernel::KernelSpec>]>,
}

pub(super) fn random_hex() -> String {
    let state = std::hash::RandomState::new();
    let mut out = String::new();
    for i in 0..2u64 {
        let mut h = state.build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// Starts a worker and waits (up to `timeout`) until it is ready; one that
/// does not get there is killed.
pub async fn launch_ready(
    spec: &LaunchSpec,
    timeout: Duration,
) -> Result<Arc<Worker>, WorkerError> {
    let worker = match launch(spec).await {
        Ok(worker) => worker,
        Err(e) => {
            crate::metrics::worker_start(spec.language.metric(), false);
            return Err(e);
        }
    };
    let ready = worker.wait_ready(timeout).await;
    crate::metrics::worker_start(spec.language.metric(), ready.is_ok());
    match ready {
        Ok(_) => Ok(worker),
        Err(e) => {
            worker.kill_in_background();
            Err(e)
        }
    }
}

/// Starts a worker process.
pub async fn launch(spec: &LaunchSpec) -> Result<Arc<Worker>, WorkerError> {
    if let Some(kernel) = &spec.kernel {
        return super::kernel::launch(spec, kernel).await;
    }
    let spawn_err = |source| WorkerError::Spawn {
        lang: spec.language,
        program: spec.program.display().to_string(),
        source,
    };
    if let Some(venv) = &spec.venv
        && venv.python() == spec.program
    {
        venv.ensure(spec, Duration::from_secs(60))
            .await
            .map_err(|e| {
                spawn_err(std::io::Error::other(format!(
                    "the sessions' venv {} could not be made from {}: {e}",
                    venv.dir.display(),
                    venv.base.display()
                )))
            })?;
        if let Some(preinstall) = &venv.preinstall {
            // Its packages go in before the first interpreter imports
            // anything; a failed or stuck preinstall only delays it (its
            // own bound), and calls answer within their window meanwhile.
            preinstall
                .settled(super::preinstall::MAX_PREINSTALL_TIME)
                .await;
        }
    }
    // The sandbox launcher would report a missing program only as an early
    // exit: say it plainly, with how to get one.
    let program = &spec.program;
    let found = if program.is_absolute() {
        crate::executables::is_executable(program)
    } else if program.components().count() == 1 {
        crate::executables::find_on_path_where(&program.to_string_lossy(), |_| true).is_some()
    } else {
        true // relative to the session's directory: the spawn will tell
    };
    if !found {
        return Err(spawn_err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "not found or not executable",
        )));
    }
    let channel = Channel::new(spec.language).map_err(spawn_err)?;
    let nonce = random_hex();
    let launch_no = NEXT_WORKER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let args: Vec<OsString> = match spec.language {
        Language::Python => vec!["-c".into(), BOOTSTRAP.into()],
        Language::R => r::ARGS
            .iter()
            .map(OsString::from)
            .chain([OsString::from(r::boot_expression())])
            .collect(),
    };
    let spawned = process::spawn(Launch {
        program: &spec.program,
        args: &args,
        cwd: &spec.workdir,
        env: &driver_env(spec, &nonce),
        sandbox: spec.sandbox.as_deref(),
        inherit_env: true,
        home: spec.log_dir.join(format!("home-{launch_no}")),
        label: &format!("w{launch_no}"),
        egress: false,
        extra_read: &[],
        files: &[],
        inet_in_netns: false,
        stdio: Stdio::Pipes {
            stdin: false,
            control: channel.child,
        },
    })
    .map_err(spawn_err)?;

    let (ctl_tx, ctl_rx) = mpsc::channel::<Vec<u8>>(64);
    let side_tx = channel.side.map(|side| {
        let (tx, rx) = mpsc::channel::<Vec<u8>>(64);
        tokio::spawn(readers::write_control(side, Vec::new(), rx));
        tx
    });
    let worker = Arc::new(Worker::new(spec, spawned.process, (ctl_tx, side_tx)));
    let first = match spec.language {
        Language::Python => {
            let mut first = format!("{}\n", DRIVER_SOURCE.len()).into_bytes();
            first.extend_from_slice(DRIVER_SOURCE.as_bytes());
            first
        }
        Language::R => r::driver_message(),
    };
    tokio::spawn(readers::write_control(channel.writer, first, ctl_rx));
    for (stream, pipe) in spawned.outputs {
        tokio::spawn(readers::read_pipe(
            pipe,
            stream,
            worker.clone(),
            nonce.clone(),
        ));
    }
    tokio::spawn(readers::read_control(channel.reader, worker.clone()));
    tokio::spawn(readers::watch_exit(spawned.child, worker.clone()));
    Ok(worker)
}

/// The driver's settings, then the session's own variables.
fn driver_env(spec: &LaunchSpec, nonce: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("FERREPL_NONCE".into(), nonce.to_string()),
        (
            "FERREPL_MAX_VALUE_CHARS".into(),
            spec.max_value_chars.to_string(),
        ),
        (
            "FERREPL_MAX_IMAGE_BYTES".into(),
            spec.max_image_bytes.to_string(),
        ),
    ];
    if std::env::var_os("MPLBACKEND").is_none() {
        env.push(("MPLBACKEND".into(), "Agg".into()));
    }
    if spec.checkpoints && spec.language == Language::Python {
        env.push(("FERREPL_CHECKPOINTS".into(), "1".into()));
    }
    if !spec.preimport.is_empty() && spec.language == Language::Python {
        env.push(("FERREPL_PREIMPORT".into(), spec.preimport.join(",")));
    }
    env.extend(spec.env.iter().cloned());
    env
}
