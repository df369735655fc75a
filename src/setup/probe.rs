//! What `ferrepl doctor` asks the machine directly: the kernel's Landlock
//! ABI and whether a host answers a TCP connect.

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The kernel's Landlock ABI, or the errno of asking (ENOSYS: no Landlock;
/// EOPNOTSUPP: built in but not enabled at boot).
pub(super) fn landlock_abi() -> Result<i64, i32> {
    #[cfg(target_os = "linux")]
    {
        const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
        let null = std::ptr::null::<libc::c_void>();
        let call = libc::SYS_landlock_create_ruleset;
        // SAFETY: with a null attribute, size 0 and the VERSION flag the
        // call only returns a number; nothing is created.
        let abi = unsafe { libc::syscall(call, null, 0usize, LANDLOCK_CREATE_RULESET_VERSION) };
        if abi >= 0 {
            return Ok(abi);
        }
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
    #[cfg(not(target_os = "linux"))]
    Err(0)
}

/// A host as a name lookup takes it: an IPv6 address comes as a URL
/// writes it, in brackets.
fn unbracketed(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// A TCP connect from this process to `host:port` (the egress proxy
/// connects directly too), resolution included, within `timeout`;
/// on a thread, since name resolution takes no timeout.
pub(super) fn reach(
    host: String,
    port: u16,
    timeout: Duration,
) -> mpsc::Receiver<Result<String, String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        use std::net::ToSocketAddrs;
        let deadline = Instant::now() + timeout;
        let mut answer = Err(format!("{host} has no address"));
        let addrs = (unbracketed(&host), port).to_socket_addrs();
        if let Err(e) = &addrs {
            answer = Err(format!("cannot resolve {host}: {e}"));
        }
        for addr in addrs.into_iter().flatten() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match std::net::TcpStream::connect_timeout(&addr, left) {
                Ok(_) => {
                    answer = Ok(format!("{host}:{port}"));
                    break;
                }
                Err(e) => answer = Err(format!("{host}:{port} ({addr}): {e}")),
            }
        }
        let _ = tx.send(answer);
    });
    rx
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_ipv6_host_from_a_url_is_looked_up_without_brackets() {
        assert_eq!(super::unbracketed("[::1]"), "::1");
        assert_eq!(
            super::unbracketed("cloud.r-project.org"),
            "cloud.r-project.org"
        );
        let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(super::unbracketed("[::1]"), 80));
        assert!(addrs.is_ok_and(|mut a| a.next().is_some_and(|a| a.is_ipv6())));
    }
}
