//! Binding a listening TCP address, refused with the fix named: an address
//! in use or not of this machine is the operator's to change, so the error
//! says which flag changes it.

use std::net::SocketAddr;

/// Binds `addr` for `flag`. `other` is how the operator gives another
/// address (e.g. "--http PORT").
pub async fn listen(
    flag: &str,
    addr: SocketAddr,
    other: &str,
) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("{flag}: {}", refusal(addr, &e, other)))
}

fn refusal(addr: SocketAddr, error: &std::io::Error, other: &str) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::AddrInUse => {
            format!("{addr} is in use: stop the other server or pick another port with {other}")
        }
        ErrorKind::AddrNotAvailable => format!(
            "{addr} is not an address of this machine: give one of its own (127.0.0.1, 0.0.0.0 \
             for all) with {other}"
        ),
        ErrorKind::PermissionDenied if addr.port() < 1024 => format!(
            "port {} needs privileges: pick one of 1024 or above with {other}",
            addr.port()
        ),
        _ => format!("cannot listen on {addr}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_names_the_flag_that_changes_it() {
        let addr: SocketAddr = "127.0.0.1:80".parse().expect("address");
        let fix = "--http PORT";
        for kind in [
            std::io::ErrorKind::AddrInUse,
            std::io::ErrorKind::AddrNotAvailable,
            std::io::ErrorKind::PermissionDenied,
        ] {
            let text = refusal(addr, &std::io::Error::from(kind), fix);
            assert!(text.contains(fix), "{kind:?}: {text}");
        }
    }
}
