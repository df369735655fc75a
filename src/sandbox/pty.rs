//! A terminal from the sandbox's own devpts for pty jobs. The server's pty
//! belongs to the host's devpts, which a sandbox does not see (so no job can
//! open another's terminal): the namespace's PID 1 opens a pty in the
//! private devpts, gives its slave to the program as controlling terminal,
//! and copies bytes between it and the server's pty (put in raw mode, so
//! only the inner terminal echoes and edits lines).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// A terminal call that failed, and the system's error.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct PtyError {
    what: &'static str,
    source: std::io::Error,
}

impl PtyError {
    /// `what` failed with the last OS error.
    fn last(what: &'static str) -> Self {
        PtyError {
            what,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// The inner terminal: its master (kept by PID 1) and slave path.
pub struct Inner {
    master: OwnedFd,
    slave: std::ffi::CString,
}

/// Opens a pty in the private devpts with the outer terminal's size, and
/// puts the outer terminal (our fd 0) in raw mode. The slave belongs to
/// the program's uid (`program`), so it can open `/dev/tty` again.
pub fn open(program: crate::sandbox::Identity) -> Result<Inner, PtyError> {
    let err = PtyError::last;
    // SAFETY: plain libc calls on descriptors we own; buffers are sized.
    unsafe {
        let fd = libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(err("open /dev/ptmx"));
        }
        let master = OwnedFd::from_raw_fd(fd);
        if libc::grantpt(fd) != 0 || libc::unlockpt(fd) != 0 {
            return Err(err("unlockpt"));
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(fd, name.as_mut_ptr(), name.len()) != 0 {
            return Err(err("ptsname"));
        }
        let slave = std::ffi::CStr::from_ptr(name.as_ptr()).to_owned();
        if libc::chown(slave.as_ptr(), program.uid, program.gid) != 0 {
            return Err(err("chown the terminal"));
        }
        let mut size: libc::winsize = std::mem::zeroed();
        if libc::ioctl(0, libc::TIOCGWINSZ, &mut size) == 0 {
            libc::ioctl(fd, libc::TIOCSWINSZ, &size);
        }
        let mut term: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(0, &mut term) == 0 {
            libc::cfmakeraw(&mut term);
            libc::tcsetattr(0, libc::TCSANOW, &term);
        }
        Ok(Inner { master, slave })
    }
}

impl Inner {
    pub fn master_fd(&self) -> i32 {
        self.master.as_raw_fd()
    }

    /// In the program's process: a new session with the inner terminal as
    /// controlling terminal and stdin, stdout and stderr.
    pub fn attach(&self) -> Result<(), PtyError> {
        let err = PtyError::last;
        // SAFETY: plain libc calls in the freshly forked child.
        unsafe {
            if libc::setsid() < 0 {
                return Err(err("setsid"));
            }
            let fd = libc::open(self.slave.as_ptr(), libc::O_RDWR);
            if fd < 0 {
                return Err(err("open the terminal"));
            }
            libc::ioctl(fd, libc::TIOCSCTTY, 0);
            for target in 0..3 {
                libc::dup2(fd, target);
            }
            if fd > 2 {
                libc::close(fd);
            }
        }
        Ok(())
    }

    /// Copies bytes both ways until `child` exits, then drains what it
    /// wrote last. Returns its status.
    pub fn relay(self, child: Pid) -> Option<WaitStatus> {
        let master = self.master.as_raw_fd();
        let mut outer_open = true;
        let mut buf = [0u8; 16 * 1024];
        loop {
            match waitpid(child, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {}
                Ok(ws @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => {
                    drain(master, &mut buf);
                    return Some(ws);
                }
                Ok(_) => {}
                Err(_) => return None,
            }
            // Orphans of the namespace are ours to reap as well.
            while let Ok(ws) = waitpid(
                Pid::from_raw(-1),
                Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
            ) {
                match ws {
                    WaitStatus::StillAlive => break,
                    WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)
                        if pid == child =>
                    {
                        drain(master, &mut buf);
                        return Some(ws);
                    }
                    _ => {}
                }
            }
            let mut fds = [
                libc::pollfd {
                    fd: if outer_open { 0 } else { -1 },
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: master,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: poll on two valid pollfd structs; the timeout bounds
            // how late a program's exit is noticed.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 50) };
            if n <= 0 {
                continue;
            }
            if fds[0].revents != 0 && !copy(0, master, &mut buf) {
                outer_open = false;
            }
            if fds[1].revents != 0 && !copy(master, 1, &mut buf) {
                // The terminal is gone (every holder closed it): wait for
                // the program's exit without polling it again.
                let status = loop {
                    match waitpid(child, Some(WaitPidFlag::__WALL)) {
                        Err(nix::errno::Errno::EINTR) => continue,
                        Ok(ws @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => {
                            break Some(ws);
                        }
                        Ok(_) => continue,
                        Err(_) => break None,
                    }
                };
                return status;
            }
        }
    }
}

/// One read from `from`, written in full to `to`; false at end or error.
fn copy(from: i32, to: i32, buf: &mut [u8]) -> bool {
    // SAFETY: reading into and writing from a buffer we own.
    let n = unsafe { libc::read(from, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
    }
    if n == 0 {
        return false;
    }
    write_all(to, &buf[..n as usize]);
    true
}

fn write_all(fd: i32, mut data: &[u8]) {
    while !data.is_empty() {
        // SAFETY: writing from a buffer we own.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        data = &data[n as usize..];
    }
}

/// What the program wrote just before it exited.
fn drain(master: i32, buf: &mut [u8]) {
    // SAFETY: fcntl on our own descriptor.
    unsafe {
        let flags = libc::fcntl(master, libc::F_GETFL);
        libc::fcntl(master, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    for _ in 0..1024 {
        if !copy(master, 1, buf) {
            break;
        }
    }
}
