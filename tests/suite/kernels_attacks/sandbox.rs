//! The kernel's sandbox seen from the agent's code in it: nothing on the
//! host's loopback or in another kernel's network namespace, no abstract
//! socket of the host, neither the server's runtime directory (the attach
//! index, with every kernel's key) nor its processes, no capabilities, and
//! no secret of the server's environment.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::{exec, jupyter_path, kernel_server};
use crate::support::{
    ATTEMPT, Launch, assert_failed, everything, kernels, outcome, py, py_path, unique,
    upstreams::test_env_dir,
};

#[tokio::test]
async fn a_kernel_reaches_nothing_on_the_hosts_loopback_nor_another_kernels() {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = tcp.local_addr().expect("addr").port();
    let abstract_name = unique("ferrepl-kernel-attack-");
    let addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            abstract_name.as_bytes(),
        )
        .expect("abstract address");
    let _abstract = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind abstract");

    let server = kernel_server(&[], &[]).await;
    let other = server
        .call(
            "python_sessions",
            json!({"action": "create", "session": "k2", "kernel": "python3"}),
        )
        .await;
    assert!(!other.is_error, "{other:#?}");
    // The other kernel listens on its own loopback (UDP: a TCP bind may
    // be refused); the first must not reach it, nor a host UDP socket.
    let host_udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    host_udp.set_nonblocking(true).expect("nonblocking");
    let host_udp_port = host_udp.local_addr().expect("addr").port();
    let listening = exec(
        &server,
        "k2",
        "import socket\nu = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nu.bind(('127.0.0.1', 0))\nu.settimeout(5)\nu.getsockname()[1]",
    )
    .await;
    listening.assert_ok();
    let other_port: u16 = listening
        .value()
        .and_then(|v| v.parse().ok())
        .expect("the other kernel's port");

    let code = format!(
        "{ATTEMPT}\nimport socket\n\
         attempt('host tcp', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=3).getpeername())\n\
         def datagram(port):\n    d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    return d.sendto(b'hello from k', ('127.0.0.1', port))\n\
         attempt('other kernel udp', lambda: datagram({other_port}))\n\
         attempt('host udp', lambda: datagram({host_udp_port}))\n\
         def abstract():\n    u = socket.socket(socket.AF_UNIX)\n    u.connect('\\0' + {name})\n    return 'connected'\n\
         attempt('host abstract', abstract)\n\
         attempt('raw', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))\n\
         attempt('outside', lambda: socket.create_connection(('1.1.1.1', 443), timeout=3))\n",
        name = py(&abstract_name),
    );
    let out = exec(&server, "k", &code).await;
    out.assert_ok();
    assert_failed(&out, "host tcp", "the host's loopback is not the kernel's");
    // A datagram is sent either way; whether it arrived says whether
    // the kernels (or the kernel and the host) share a network.
    let received = exec(
        &server,
        "k2",
        "try:\n    r = u.recv(100)\nexcept OSError as e:\n    r = type(e).__name__\nr",
    )
    .await;
    assert!(
        received.value() != Some("b'hello from k'"),
        "one kernel's datagram reached another kernel's loopback: {received:#?}"
    );
    let mut buf = [0u8; 64];
    assert!(
        host_udp.recv(&mut buf).is_err(),
        "a kernel's datagram reached the host's loopback"
    );
    assert_failed(
        &out,
        "host abstract",
        "abstract sockets are per network namespace",
    );
    assert_failed(&out, "raw", "no raw sockets");
    assert_failed(&out, "outside", "no network");
    drop(tcp);
}

/// The attach index entry of session `session` a server wrote under `runtime`.
fn index_entry(runtime: &Path, session: &str) -> Option<PathBuf> {
    let mut dirs = vec![runtime.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(path);
            } else if path.ends_with(format!("attach/{session}.json")) {
                return Some(path);
            }
        }
    }
    None
}

#[tokio::test]
async fn a_kernel_sees_neither_the_servers_runtime_nor_its_processes_nor_capabilities() {
    let runtime = tempfile::tempdir().expect("runtime");
    let runtime_str = runtime.path().display().to_string();
    let server = kernel_server(&[], &[("XDG_RUNTIME_DIR", runtime_str.as_str())]).await;
    let entry = index_entry(runtime.path(), "k").expect("the attach index entry of k");
    let index = entry.parent().expect("the index directory").to_path_buf();
    let code = format!(
        "{ATTEMPT}\nimport os\n\
         attempt('index entry', lambda: open({entry}).read())\n\
         attempt('index dir', lambda: os.listdir({index}))\n\
         def servers():\n    seen = []\n    for p in os.listdir('/proc'):\n        if p.isdigit():\n            try:\n                c = open('/proc/%s/cmdline' % p, 'rb').read()\n            except OSError:\n                continue\n            if b'--kernels' in c:\n                seen.append(p)\n    if seen:\n        return seen\n    raise LookupError('none')\n\
         attempt('server process', servers)\n\
         def caps():\n    for l in open('/proc/self/status'):\n        if l.startswith('CapEff') and int(l.split()[1], 16):\n            return l\n    raise LookupError('none')\n\
         attempt('capabilities', caps)\n\
         attempt('ptrace', lambda: open('/proc/1/mem', 'rb').read(1))\n",
        entry = py_path(&entry),
        index = py_path(&index),
    );
    let out = exec(&server, "k", &code).await;
    out.assert_ok();
    assert_failed(
        &out,
        "index entry",
        "the attach index holds every kernel's key",
    );
    assert_failed(
        &out,
        "index dir",
        "the server's runtime directory is private",
    );
    assert_failed(
        &out,
        "server process",
        "the server is outside the kernel's PID namespace",
    );
    assert_failed(
        &out,
        "capabilities",
        "the kernel has no effective capability",
    );
    assert_failed(&out, "ptrace", "no other process's memory");
}

#[tokio::test]
async fn the_servers_secrets_never_reach_the_kernel_and_the_kernelspecs_env_does() {
    let secret = unique("secret");
    let url = format!("https://user:{secret}@example.invalid/simple");
    let envs = [
        ("GITHUB_TOKEN", secret.as_str()),
        ("OPENAI_API_KEY", secret.as_str()),
        ("AWS_SECRET_ACCESS_KEY", secret.as_str()),
        ("FERREPL_TEST_SECRET", secret.as_str()),
        ("PIP_INDEX_URL", url.as_str()),
        ("UV_INDEX_URL", url.as_str()),
    ];
    // A kernelspec of the operator's (outside the workspace) setting a
    // variable: the kernel gets it.
    let data = tempfile::tempdir().expect("jupyter dir");
    let dir = data.path().join("kernels/withenv");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let python = test_env_dir().join("nb/bin/python");
    let spec = json!({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "language": "python",
        "env": {"KERNELSPEC_SAYS": "from-kernel-json"},
    });
    std::fs::write(dir.join("kernel.json"), spec.to_string()).expect("write");
    let paths = std::env::join_paths([data.path().to_path_buf(), jupyter_path()]).expect("join");
    let launch = Launch::new(&["--kernels", "withenv"])
        .env("JUPYTER_PATH", paths)
        .envs(&envs);
    let server = kernels::with_kernel_session(launch, "k", "withenv").await;
    let code = format!(
        "{ATTEMPT}\nimport os\n\
         print('ENV', dict(os.environ))\n\
         for p in os.listdir('/proc'):\n    if p.isdigit():\n        try:\n            print('PROC', p, open('/proc/%s/environ' % p, 'rb').read())\n        except OSError:\n            pass\n\
         attempt('spec env', lambda: os.environ['KERNELSPEC_SAYS'])\n\
         attempt('secret', lambda: [k for k, v in os.environ.items() if {marker} in v] or 1/0)\n",
        marker = py(&secret),
    );
    let out = exec(&server, "k", &code).await;
    out.assert_ok();
    assert!(
        !everything(&out).contains(&secret),
        "a secret of the server's environment reached the kernel: {out:#?}"
    );
    assert_eq!(
        outcome(&out, "spec env"),
        "OK 'from-kernel-json'",
        "{out:#?}"
    );
}
