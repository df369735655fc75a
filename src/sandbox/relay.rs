//! The only way out of an installer's empty network namespace: PID 1
//! listens on 127.0.0.1:PORT inside it and copies every connection to the
//! server's egress proxy (a Unix socket PID 1 opened before the view was
//! built, so the socket is not in the view), which decides what may be
//! reached. The installer is told to use
//! `http://127.0.0.1:PORT` as its proxy.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Connections relayed at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;

/// Why the relay could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("socket: {0}")]
    Socket(std::io::Error),
    #[error("bringing lo up: {0}")]
    LoopbackUp(std::io::Error),
    #[error("relay on port {port}: {source}")]
    Listen { port: u16, source: std::io::Error },
    #[error("the egress proxy's socket {path}: {source}")]
    Proxy {
        path: String,
        source: std::io::Error,
    },
}

/// The proxy's socket as a descriptor (O_PATH: nothing is connected yet),
/// taken while the host's file system is still in view.
pub fn open_proxy(path: &str) -> Result<OwnedFd, RelayError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| RelayError::Proxy {
            path: path.to_string(),
            source,
        })?;
    Ok(OwnedFd::from(file))
}

/// Brings the namespace's loopback interface up (it starts down).
pub fn loopback_up() -> Result<(), RelayError> {
    // SAFETY: an ioctl on a socket we own, with a zeroed, sized ifreq.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(RelayError::Socket(std::io::Error::last_os_error()));
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let ok = libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req) == 0 && {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(sock, libc::SIOCSIFFLAGS, &req) == 0
        };
        let err = std::io::Error::last_os_error();
        libc::close(sock);
        if !ok {
            return Err(RelayError::LoopbackUp(err));
        }
    }
    Ok(())
}

/// Binds the relay's port (before the program starts, so it can connect at
/// once).
pub fn listen(port: u16) -> Result<TcpListener, RelayError> {
    TcpListener::bind(("127.0.0.1", port)).map_err(|source| RelayError::Listen { port, source })
}

/// Accepts and relays on threads of their own, for the life of PID 1.
pub fn spawn(listener: TcpListener, proxy: OwnedFd) {
    // Connecting through the descriptor's /proc link reaches the socket it
    // names, though its path is not in this mount namespace.
    let socket = Arc::new(format!("/proc/self/fd/{}", proxy.as_raw_fd()));
    // Held for the life of PID 1 (the link needs the descriptor open).
    std::mem::forget(proxy);
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let client = match client {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => continue,
                Err(_) => break,
            };
            if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
            let (socket, active) = (socket.clone(), active.clone());
            active.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                relay(client, &socket);
                active.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
}

fn relay(client: TcpStream, socket: &str) {
    let Ok(upstream) = UnixStream::connect(socket) else {
        let mut client = client;
        let _ = client.write_all(
            b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\nferrepl: the egress proxy is not reachable\n",
        );
        return;
    };
    let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    // The proxy bounds idle time; this only keeps a dead peer from
    // holding a thread forever.
    let idle = Some(Duration::from_secs(300));
    let _ = client.set_read_timeout(idle);
    let _ = upstream.set_read_timeout(idle);
    let up = std::thread::spawn(move || {
        copy(client, upstream2, |s| {
            let _ = s.shutdown(Shutdown::Write);
        })
    });
    copy(upstream, client2, |s| {
        let _ = s.shutdown(Shutdown::Write);
    });
    let _ = up.join();
}

fn copy<R: Read, W: Write>(mut from: R, mut to: W, done: impl FnOnce(&W)) {
    let mut buf = [0u8; 32 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    done(&to);
}
