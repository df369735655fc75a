//! Starting a process: the command line (the sandbox launcher's under the
//! sandbox), its environment, its session, its standard streams.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use command_fds::{CommandFdExt, FdMapping};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::process::Child;

use super::Process;
use crate::output::Stream;
use crate::sandbox::SandboxConfig;
use crate::sandbox::cgroup::Cgroup;

/// The first fd of a worker's control channel (a socket, or two pipes).
pub const CONTROL_FD: i32 = 3;

/// An output stream of a started process.
pub type Output = Box<dyn AsyncRead + Send + Unpin>;
/// The standard input of a started process.
pub type Input = Box<dyn AsyncWrite + Send + Unpin>;

/// How a process's standard streams are connected.
#[derive(Debug)]
pub enum Stdio {
    /// Pipes for stdout and stderr; stdin a pipe (`stdin`) or /dev/null;
    /// `control` become the process's fds [`CONTROL_FD`], 4, ... in order.
    Pipes { stdin: bool, control: Vec<OwnedFd> },
    /// One terminal of `rows` x `cols` for all three (pty-process makes
    /// the process a session leader with it as its controlling terminal).
    Pty { rows: u16, cols: u16 },
}

/// A program to start.
#[derive(Debug)]
pub struct Launch<'a> {
    pub program: &'a Path,
    pub args: &'a [OsString],
    /// Where it starts.
    pub cwd: &'a Path,
    /// Its own variables, over the environment every process starts from.
    pub env: &'a [(String, String)],
    /// The confinement; None (no settings at all) runs the program with
    /// `env`, over the server's own environment if `inherit_env`.
    pub sandbox: Option<&'a SandboxConfig>,
    pub inherit_env: bool,
    /// Its private temporary directory (HOME, TMPDIR) under the sandbox:
    /// made here, removed by [`Process::remove_home`].
    pub home: PathBuf,
    /// The name of its cgroups.
    pub label: &'a str,
    /// A package installer: it reaches the installers' egress proxy (with
    /// `--network packages`), nothing else. Any other process reaches the
    /// cells' proxy with `--network domains`.
    pub egress: bool,
    /// Paths of the server's it may read besides the policy's.
    pub extra_read: &'a [PathBuf],
    /// Files (name, bytes) written into its private temporary directory
    /// before it starts, mode 0600 and its own (a kernel's connection
    /// file): the directory is made for them even without the sandbox.
    pub files: &'a [(&'a str, Vec<u8>)],
    /// A Jupyter kernel: it may make IPv4/IPv6 sockets inside its empty
    /// network namespace (ipykernel binds loopback for its own pipes and
    /// libzmq aborts when the socket is refused); never outside one.
    pub inet_in_netns: bool,
    pub stdio: Stdio,
}

/// A started process.
pub struct Spawned {
    pub process: Process,
    pub child: Child,
    /// Stdout then stderr, or the terminal.
    pub outputs: Vec<(Stream, Output)>,
    pub stdin: Option<Input>,
}

/// The environment a process gets.
enum Env {
    /// Exactly these variables.
    Only(BTreeMap<String, String>),
    /// These over the server's own.
    Over(Vec<(String, String)>),
}

/// What to execute: the program, or the launcher that confines it.
struct Command {
    program: PathBuf,
    args: Vec<OsString>,
    env: Env,
    home: Option<PathBuf>,
    cgroup: Option<Cgroup>,
    /// The uid and gid the program runs as when not the server's: its
    /// pipes become its own, so it can open `/dev/stdout` or `/dev/fd/3`.
    owner: Option<crate::sandbox::Identity>,
}

/// Starts `launch`. Every process ferrepl runs starts here.
pub fn spawn(launch: Launch<'_>) -> std::io::Result<Spawned> {
    let pty = matches!(launch.stdio, Stdio::Pty { .. });
    let command = command(&launch, pty)?;
    let (child, outputs, stdin) = match launch.stdio {
        Stdio::Pipes { stdin, control } => spawn_pipes(&command, launch.cwd, stdin, control)?,
        Stdio::Pty { rows, cols } => spawn_pty(&command, launch.cwd, rows, cols)?,
    };
    let process = Process {
        pid: child.id().unwrap_or(0),
        home: command.home,
        cgroup: Mutex::new(command.cgroup.map(Arc::new)),
        reaped: RwLock::new(false),
    };
    Ok(Spawned {
        process,
        child,
        outputs,
        stdin,
    })
}

/// The command line and environment of `launch`: under the sandbox the
/// launcher's, with a private temporary HOME and the process's cgroups when
/// the kernel limits can be enforced that way; a terminal of its own
/// namespace (`pty`) where it has one.
fn command(launch: &Launch<'_>, pty: bool) -> std::io::Result<Command> {
    let home = &launch.home;
    let direct = |env| -> std::io::Result<Command> {
        let own_dir = !launch.files.is_empty();
        if own_dir {
            crate::state::fresh_private_dir(home)?;
            write_files(home, launch.files, None)?;
        }
        Ok(Command {
            program: launch.program.to_path_buf(),
            args: launch.args.to_vec(),
            env,
            home: own_dir.then(|| home.clone()),
            cgroup: None,
            owner: None,
        })
    };
    let sandbox = match launch.sandbox {
        Some(sandbox) if sandbox.enabled() => sandbox,
        Some(sandbox) => return direct(Env::Only(sandbox.environment(None, launch.env))),
        None if launch.inherit_env => return direct(Env::Over(launch.env.to_vec())),
        None => return direct(Env::Only(launch.env.iter().cloned().collect())),
    };
    crate::state::fresh_private_dir(home)?;
    let owner = sandbox.identity.filter(|_| sandbox.namespaces);
    if let Some(id) = owner {
        // The process's own: it runs as this uid.
        std::os::unix::fs::chown(home, Some(id.uid), Some(id.gid))?;
    }
    write_files(home, launch.files, owner)?;
    let mut policy = sandbox.policy(
        home,
        launch.cwd,
        sandbox.environment(Some(home), launch.env),
    );
    policy.pty = pty && policy.mounts.is_some();
    policy.inet_in_netns = launch.inet_in_netns && policy.mounts.is_some() && !policy.network;
    sandbox.add_reads(&mut policy, launch.extra_read);
    if launch.egress {
        sandbox.add_installer_reads(&mut policy);
        // The relay reaches the proxy's socket through a descriptor its PID 1
        // opens before the view is built: the socket is not in the view.
        if let (Some(relay), true) = (&sandbox.egress, policy.mounts.is_some()) {
            policy.egress = Some(relay.clone());
        }
    } else if let (Some(relay), true) = (&sandbox.cell_egress, policy.mounts.is_some()) {
        // --network domains: sessions and shell jobs reach the cells'
        // proxy, through a relay of the same kind; the variables point
        // HTTP clients at it (over any the operator passed on).
        policy.egress = Some(relay.clone());
        policy
            .env
            .extend(crate::sandbox::env::proxy_vars(relay.port));
    }
    let cgroup = sandbox.cgroup_for(&mut policy, launch.label);
    let (program, args) = sandbox.wrap(&policy, launch.program, launch.args)?;
    Ok(Command {
        program,
        args,
        // The launcher hands the policy's environment on.
        env: Env::Only(BTreeMap::new()),
        home: Some(home.clone()),
        cgroup,
        owner,
    })
}

/// Writes `files` into `dir`, readable only by `owner` (or the server).
fn write_files(
    dir: &Path,
    files: &[(&str, Vec<u8>)],
    owner: Option<crate::sandbox::Identity>,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    for (name, bytes) in files {
        let path = dir.join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        file.write_all(bytes)?;
        if let Some(id) = owner {
            std::os::unix::fs::chown(&path, Some(id.uid), Some(id.gid))?;
        }
    }
    Ok(())
}

type Started = (Child, Vec<(Stream, Output)>, Option<Input>);

fn spawn_pipes(
    command: &Command,
    cwd: &Path,
    stdin: bool,
    control: Vec<OwnedFd>,
) -> std::io::Result<Started> {
    use std::process::Stdio as PipeStdio;
    let mut cmd = tokio::process::Command::new(&command.program);
    cmd.args(&command.args);
    match &command.env {
        Env::Only(env) => cmd.env_clear().envs(env),
        Env::Over(env) => cmd.envs(env.iter().cloned()),
    };
    cmd.current_dir(cwd)
        .stdin(if stdin {
            PipeStdio::piped()
        } else {
            PipeStdio::null()
        })
        .stdout(PipeStdio::piped())
        .stderr(PipeStdio::piped())
        .kill_on_drop(true);
    // A session of its own (so also its own process group, with its pid as
    // id): no session or job may reach the server's controlling terminal,
    // which is often the operator's.
    // SAFETY: setsid is async-signal-safe, as pre_exec requires.
    let owner = command.owner;
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(id) = owner {
                give_pipes(&[0, 1, 2], id);
            }
            Ok(())
        });
    }
    if let Some(id) = owner {
        let fds: Vec<i32> = control.iter().map(AsRawFd::as_raw_fd).collect();
        give_pipes(&fds, id);
    }
    if !control.is_empty() {
        let mappings = (CONTROL_FD..)
            .zip(control)
            .map(|(child_fd, parent_fd)| FdMapping {
                parent_fd,
                child_fd,
            })
            .collect();
        cmd.fd_mappings(mappings)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    let mut child = cmd.spawn()?;
    // `cmd` holds the child's end of the control socket until it is dropped.
    drop(cmd);
    let mut outputs: Vec<(Stream, Output)> = Vec::new();
    if let Some(out) = child.stdout.take() {
        outputs.push((Stream::Stdout, Box::new(out)));
    }
    if let Some(err) = child.stderr.take() {
        outputs.push((Stream::Stderr, Box::new(err)));
    }
    let stdin = child.stdin.take().map(|s| Box::new(s) as Input);
    Ok((child, outputs, stdin))
}

/// Gives the pipes among `fds` to `id` (never a file or a device: stdin
/// may be /dev/null). Async-signal-safe: fstat and fchown only.
fn give_pipes(fds: &[i32], id: crate::sandbox::Identity) {
    for &fd in fds {
        // SAFETY: fstat into a zeroed struct we own; fchown on a descriptor.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO {
                libc::fchown(fd, id.uid, id.gid);
            }
        }
    }
}

fn spawn_pty(command: &Command, cwd: &Path, rows: u16, cols: u16) -> std::io::Result<Started> {
    let to_io = |e: pty_process::Error| std::io::Error::other(e.to_string());
    let (pty, pts) = pty_process::open().map_err(to_io)?;
    pty.resize(pty_process::Size::new(rows, cols))
        .map_err(to_io)?;
    let cmd = pty_process::Command::new(&command.program).args(&command.args);
    let cmd = match &command.env {
        Env::Only(env) => cmd.env_clear().envs(env),
        Env::Over(env) => cmd.envs(env.iter().cloned()),
    };
    let child = cmd
        .current_dir(cwd)
        .kill_on_drop(true)
        .spawn(pts)
        .map_err(to_io)?;
    let (read, write) = pty.into_split();
    Ok((
        child,
        vec![(Stream::Stdout, Box::new(read))],
        Some(Box::new(write)),
    ))
}
