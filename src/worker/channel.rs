//! A worker's control channel: the server's ends, and the child's.

use std::os::fd::OwnedFd;

use tokio::net::UnixStream;

use super::Language;

/// The server's ends of a worker's control channel, and the child's.
pub(super) struct Channel {
    pub(super) reader: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    pub(super) writer: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    pub(super) child: Vec<OwnedFd>,
}

impl Channel {
    /// Python: one socket (fd 3) both ways. R: base R cannot open a socket
    /// it inherited but can open a pipe through /dev/fd, so requests come
    /// on a pipe at fd 3 and events leave on a pipe at fd 4.
    pub(super) fn new(language: Language) -> std::io::Result<Channel> {
        match language {
            Language::Python => {
                let (parent, child) = std::os::unix::net::UnixStream::pair()?;
                parent.set_nonblocking(true)?;
                let (read, write) = UnixStream::from_std(parent)?.into_split();
                Ok(Channel {
                    reader: Box::new(read),
                    writer: Box::new(write),
                    child: vec![OwnedFd::from(child)],
                })
            }
            Language::R => {
                let (req_write, req_read) = tokio::net::unix::pipe::pipe()?;
                let (ev_write, ev_read) = tokio::net::unix::pipe::pipe()?;
                Ok(Channel {
                    reader: Box::new(ev_read),
                    writer: Box::new(req_write),
                    child: vec![req_read.into_blocking_fd()?, ev_write.into_blocking_fd()?],
                })
            }
        }
    }
}
