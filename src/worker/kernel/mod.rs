//! A worker backed by an installed Jupyter kernel (--kernels): the kernel
//! runs in the session's sandbox exactly like a driver would (same view,
//! uid, limits, no network), and an in-server bridge (`bridge.rs`) plays
//! the driver, turning the kernel's messages into the control events and
//! fenced pipe output the rest of the worker reads. The session machinery
//! sees an ordinary worker. Never speaks ZeroMQ by hand: the sockets and
//! message signing are jupyter-zmq-client's and jupyter-protocol's (the
//! relays between them and the kernel, `relay.rs`, only read lengths).

mod asking;
mod bridge;
mod connect;
mod foreign;
mod media;
mod pipes;
mod relay;
pub mod spec;

pub use foreign::ForeignCell;
pub use spec::KernelSpec;

use std::ffi::OsString;
use std::sync::{Arc, Mutex};

use jupyter_protocol::{ConnectionInfo, connection_info::Transport};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use super::{LaunchSpec, NEXT_WORKER, Worker, WorkerError, readers, start::random_hex};
use crate::output::Stream;
use crate::process::{self, Launch, Stdio};

/// The kernel's connection file, in its private directory.
const CONNECTION_FILE: &str = "connection.json";
/// The prefix of its sockets there (`k-1` ... `k-5`): short, as a Unix
/// socket's path has room for 107 bytes.
const SOCKET_PREFIX: &str = "k";
/// The prefix of the server's own sockets the bridge connects to
/// (`relay.rs`), in the runtime directory beside the kernel's home.
const RELAY_PREFIX: &str = "relay";
const MAX_SOCKET_PATH: usize = 107;
/// How much of what the kernel itself prints before it is ready is kept
/// to explain a failed start; after that it goes to the server's log only.
const START_OUTPUT_BYTES: usize = 8 * 1024;
/// The room of each emulated pipe between the bridge and the readers.
const PIPE_BYTES: usize = 64 * 1024;

/// Starts the kernel `kernel` in the session's sandbox and the bridge
/// that plays its driver.
pub(super) async fn launch(
    spec: &LaunchSpec,
    kernel: &KernelSpec,
) -> Result<Arc<Worker>, WorkerError> {
    let spawn_err = |source: std::io::Error| WorkerError::Kernel {
        kernel: kernel.name.clone(),
        reason: source.to_string(),
    };
    if let Some(sandbox) = spec.sandbox.as_deref()
        && sandbox.enabled()
        && !sandbox.namespaces
        && !sandbox.network
    {
        return Err(spawn_err(std::io::Error::other(
            "a kernel needs the sandbox's private namespaces, and this server runs without them (--no-namespaces, or a kernel that refuses them): libzmq aborts when it may not make a loopback socket, which only an empty network namespace of its own allows; run where namespaces are allowed (docs/deploy.md) or use a built-in Python session",
        )));
    }
    let launch_no = NEXT_WORKER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let home = spec.log_dir.join(format!("home-{launch_no}"));
    let prefix = home.join(SOCKET_PREFIX);
    let relays = spec.log_dir.join(format!("{RELAY_PREFIX}-{launch_no}"));
    if let Some(long) = [&prefix, &relays]
        .into_iter()
        .find(|p| p.as_os_str().len() + "-5".len() > MAX_SOCKET_PATH)
    {
        return Err(spawn_err(std::io::Error::other(format!(
            "the kernel's sockets would be at {}-N, longer than the 107 bytes a Unix socket's path may have; start ferrepl with a shorter runtime directory (XDG_RUNTIME_DIR) or --log-dir",
            long.display()
        ))));
    }
    let info = ConnectionInfo {
        ip: prefix.display().to_string(),
        transport: Transport::IPC,
        shell_port: 1,
        iopub_port: 2,
        stdin_port: 3,
        control_port: 4,
        hb_port: 5,
        key: random_hex(),
        signature_scheme: "hmac-sha256".into(),
        kernel_name: Some(kernel.name.clone()),
    };
    let connection = serde_json::to_vec(&info).map_err(|e| spawn_err(e.into()))?;
    let connection_file = home.join(CONNECTION_FILE);
    let args: Vec<OsString> = kernel.argv[1..]
        .iter()
        .map(|a| {
            a.replace("{connection_file}", &connection_file.display().to_string())
                .replace("{resource_dir}", &kernel.dir.display().to_string())
                .into()
        })
        .collect();
    let mut env = kernel.env.clone();
    env.extend(spec.env.iter().cloned());
    let files = [(CONNECTION_FILE, connection)];
    let spawned = process::spawn(Launch {
        program: kernel.program(),
        args: &args,
        cwd: &spec.workdir,
        env: &env,
        sandbox: spec.sandbox.as_deref(),
        inherit_env: true,
        home,
        label: &format!("k{launch_no}"),
        egress: false,
        extra_read: &[],
        files: &files,
        inet_in_netns: true,
        stdio: Stdio::Pipes {
            stdin: false,
            control: Vec::new(),
        },
    })
    .map_err(spawn_err)?;

    let (ctl_tx, ctl_rx) = mpsc::channel::<Vec<u8>>(64);
    let (side_tx, side_rx) = mpsc::channel::<Vec<u8>>(64);
    let worker = Arc::new(Worker::new(spec, spawned.process, (ctl_tx, Some(side_tx))));
    if let Ok(shared) = serde_json::to_value(&info) {
        worker.set_kernel_connection(shared);
    }
    let started_output = Arc::new(Mutex::new(Vec::new()));
    for (stream, pipe) in spawned.outputs {
        tokio::spawn(drain_to_log(
            pipe,
            stream,
            worker.root_pid(),
            started_output.clone(),
        ));
    }
    let nonce = random_hex();
    let (stdout, stdout_read) = tokio::io::duplex(PIPE_BYTES);
    let (stderr, stderr_read) = tokio::io::duplex(PIPE_BYTES);
    let (events, events_read) = tokio::io::duplex(PIPE_BYTES);
    for (stream, pipe) in [(Stream::Stdout, stdout_read), (Stream::Stderr, stderr_read)] {
        tokio::spawn(readers::read_pipe(
            pipe,
            stream,
            worker.clone(),
            nonce.clone(),
        ));
    }
    tokio::spawn(readers::read_control(events_read, worker.clone()));
    tokio::spawn(readers::watch_exit(spawned.child, worker.clone()));
    tokio::spawn(
        bridge::Bridge {
            worker: Arc::downgrade(&worker),
            changed: worker.subscribe(),
            info,
            relays,
            program: kernel.program().display().to_string(),
            connection_file,
            max_value_chars: spec.max_value_chars,
            max_image_bytes: spec.max_image_bytes,
            prelude: (kernel.language == super::Language::R).then_some(super::r::LIBRARY_FIRST),
            pipes: pipes::Pipes::new(stdout, stderr, events, &nonce),
            requests: ctl_rx,
            side: side_rx,
            started_output,
        }
        .run(),
    );
    Ok(worker)
}

/// The kernel's own stdout and stderr (its banner, its warnings): to the
/// server's log, line by line, never into a cell; until it is ready, its
/// last bytes are kept to explain a start that fails.
async fn drain_to_log(
    pipe: process::Output,
    stream: Stream,
    pid: u32,
    started: Arc<Mutex<Vec<u8>>>,
) {
    let mut lines = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        // A line longer than this is logged in pieces.
        match tokio::io::AsyncReadExt::take(&mut lines, 4096)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        tracing::debug!(pid, ?stream, "kernel: {}", text.trim_end());
        let mut kept = started.lock().unwrap_or_else(|e| e.into_inner());
        kept.extend_from_slice(&line);
        if kept.len() > START_OUTPUT_BYTES {
            let cut = kept.len() - START_OUTPUT_BYTES;
            kept.drain(..cut);
        }
    }
}

#[cfg(test)]
mod tests {
    /// 600000 -> "600,000", as the docs write numbers.
    fn grouped(n: usize) -> String {
        let digits = n.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    }

    /// security.md's bounds on what a kernel sends are the bridge's.
    #[test]
    fn security_md_states_the_bridges_bounds() {
        let doc = include_str!("../../../docs/security.md").replace('\n', " ");
        let said = [
            format!(
                "at most {} s after the last message",
                super::bridge::IDLE_AFTER_REPLY.as_secs()
            ),
            format!(
                "never past {} characters",
                grouped(super::media::MAX_EVENT_TEXT_CHARS)
            ),
            format!(
                "input prompt at {} characters",
                grouped(super::media::MAX_PROMPT_CHARS)
            ),
            format!(
                "bridge weigh at most {} MiB in all",
                super::connect::IN_FLIGHT_KIB / 1024
            ),
            format!(
                "one message over {} MiB",
                super::relay::MAX_KERNEL_MESSAGE_BYTES >> 20
            ),
        ];
        for phrase in said {
            assert!(doc.contains(&phrase), "docs/security.md has no `{phrase}`");
        }
    }
}
