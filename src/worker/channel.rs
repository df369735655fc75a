//! A worker's control channel: the server's ends, and the child's.

use std::os::fd::OwnedFd;

use tokio::net::UnixStream;

use super::Language;

/// The server's ends of a worker's control channel, and the child's.
pub(super) struct Channel {
    pub(super) reader: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    pub(super) writer: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    /// Python's side socket: requests answered while a cell runs.
    pub(super) side: Option<Box<dyn tokio::io::AsyncWrite + Send + Unpin>>,
    pub(super) child: Vec<OwnedFd>,
}

impl Channel {
    /// Python: a socket at fd 3 both ways (cells and checkpoints in, every
    /// event out), read by the driver's main thread between cells, so a cell
    /// starts without a handoff between threads; and a side socket at fd 4
    /// for what its control thread answers while a cell runs (input,
    /// inspect, completion). R: base R cannot open a socket it inherited but
    /// can open a pipe through /dev/fd, so requests come on a pipe at fd 3
    /// and events leave on a pipe at fd 4.
    pub(super) fn new(language: Language) -> std::io::Result<Channel> {
        match language {
            Language::Python => {
                let (parent, child) = socket_pair()?;
                let (read, write) = parent.into_split();
                let (side, side_child) = socket_pair()?;
                Ok(Channel {
                    reader: Box::new(read),
                    writer: Box::new(write),
                    side: Some(Box::new(side)),
                    child: vec![child, side_child],
                })
            }
            Language::R => {
                let (req_write, req_read) = tokio::net::unix::pipe::pipe()?;
                let (ev_write, ev_read) = tokio::net::unix::pipe::pipe()?;
                Ok(Channel {
                    reader: Box::new(ev_read),
                    writer: Box::new(req_write),
                    side: None,
                    child: vec![req_read.into_blocking_fd()?, ev_write.into_blocking_fd()?],
                })
            }
        }
    }
}

/// A connected pair: the server's end (async), the child's end.
fn socket_pair() -> std::io::Result<(UnixStream, OwnedFd)> {
    let (parent, child) = std::os::unix::net::UnixStream::pair()?;
    parent.set_nonblocking(true)?;
    Ok((UnixStream::from_std(parent)?, OwnedFd::from(child)))
}
