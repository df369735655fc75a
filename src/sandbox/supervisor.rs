//! The supervisor of protected places (`sandbox::protected`): a process of
//! the launcher's, confined like the program (same uid, no capabilities,
//! same Landlock domain and mount namespace), that performs every call
//! which creates, changes, renames, removes or links a file system entry
//! for the program and everything it starts.
//!
//! The program installs a seccomp filter whose listener (`SECCOMP_RET_USER_NOTIF`)
//! it hands to the supervisor before exec. For each such call the supervisor
//! reads the path from the caller's memory, opens the parent directory
//! (the kernel resolves it, links included), checks the resolved place
//! against the protected ones, and, unless protected, performs the call
//! itself on that directory with the last name, never following a link it
//! did not check; a file it opens goes to the caller through
//! `SECCOMP_IOCTL_NOTIF_ADDFD`. It never lets the caller's call continue, so
//! nothing the caller changes after the check (its memory, a link) is used.
//! A refusal is `EROFS`, with one line on the program's stderr per place.
//! Nothing is left on disk: no placeholder is ever made.
//!
//! If the supervisor dies, the filtered calls fail (`ENOSYS`) and the
//! launcher ends the program: it fails closed.
//!
//! seccompiler has no user-notification action: the filter is compiled by
//! seccompiler with a `Trace` marker, which is then rewritten to
//! `SECCOMP_RET_USER_NOTIF`; the ioctls and structures are libc's.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use super::protected::Protected;

mod calls;
mod filter;
mod memory;

pub use filter::install;

/// What the program and the supervisor exchange once: the listener.
pub struct Handoff {
    pub ours: OwnedFd,
    pub theirs: OwnedFd,
}

/// A Unix socket pair (close-on-exec) for handing the listener over.
pub fn handoff() -> io::Result<Handoff> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here.
    Ok(unsafe {
        Handoff {
            ours: OwnedFd::from_raw_fd(fds[0]),
            theirs: OwnedFd::from_raw_fd(fds[1]),
        }
    })
}

/// Sends `fd` over `sock` (SCM_RIGHTS).
pub fn send_fd(sock: &OwnedFd, fd: RawFd) -> io::Result<()> {
    let byte = [1u8];
    let iov = [io::IoSlice::new(&byte)];
    let fds = [fd];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    nix::sys::socket::sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        &cmsg,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )?;
    Ok(())
}

/// Receives one descriptor from `sock` (None: the sender gave up).
fn recv_fd(sock: &OwnedFd) -> Option<OwnedFd> {
    let mut byte = [0u8];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = nix::sys::socket::recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    for cmsg in msg.cmsgs().ok()? {
        if let nix::sys::socket::ControlMessageOwned::ScmRights(fds) = cmsg
            && let Some(fd) = fds.first()
        {
            // SAFETY: the kernel just installed this descriptor for us.
            return Some(unsafe { OwnedFd::from_raw_fd(*fd) });
        }
    }
    None
}

/// The supervisor's life, in the parent after the fork: takes the listener
/// from `sock`, serves the notifications of `child` and all it starts until
/// `child` exits, then exits with its status.
pub fn serve(protected: &Protected, sock: OwnedFd, child: libc::pid_t) -> ! {
    // Nobody may read or write our memory, or trace us (same uid).
    // SAFETY: prctl(PR_SET_DUMPABLE) has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    ignore_job_signals();
    let listener = recv_fd(&sock);
    drop(sock);
    // SAFETY: pidfd_open on our own child.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child, 0) } as RawFd;
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    if let (Some(listener), Some(pidfd)) = (listener, pidfd) {
        let mut keep = vec![2, listener.as_raw_fd(), pidfd.as_raw_fd()];
        keep.sort();
        super::launcher::close_fds_except(&keep);
        let mut supervisor = Supervisor {
            protected,
            unshared: unshared(protected),
            listener,
            noted: HashSet::new(),
        };
        supervisor.run(&pidfd);
    }
    exit_as(child)
}

/// The program's process group gets the server's signals; they are not ours.
fn ignore_job_signals() {
    for sig in [
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGPIPE,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
    ] {
        // SAFETY: setting a signal's disposition to ignore.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
}

/// Waits for `child` and exits as it did.
fn exit_as(child: libc::pid_t) -> ! {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status only.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r == child {
            break;
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            std::process::exit(1);
        }
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // SAFETY: restoring the default disposition and re-raising.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
        }
        std::process::exit(128 + sig);
    }
    std::process::exit(libc::WEXITSTATUS(status))
}

/// The directories the program writes that are not shared with the host
/// (its temporary directory, /dev/shm), as named and as resolved: names are
/// not protected there.
fn unshared(protected: &Protected) -> Vec<PathBuf> {
    protected
        .unshared
        .iter()
        .filter(|w| !protected.in_root(w) && w.is_dir())
        .cloned()
        .flat_map(|w| {
            let real = w.canonicalize().ok();
            std::iter::once(w).chain(real)
        })
        .collect()
}

struct Supervisor<'a> {
    protected: &'a Protected,
    /// Writable places outside the shared roots (see `unshared`).
    unshared: Vec<PathBuf>,
    listener: OwnedFd,
    /// Places already named on the program's stderr.
    noted: HashSet<PathBuf>,
}

/// One notification: the caller and its call.
pub(crate) struct Call {
    pub id: u64,
    pub pid: libc::pid_t,
    pub nr: i64,
    pub args: [u64; 6],
}

/// What the supervisor answers a call with.
pub(crate) enum Answer {
    /// The call's return value.
    Value(i64),
    /// A descriptor to install in the caller (its flags: O_CLOEXEC or 0),
    /// whose number is the call's return value.
    Fd(OwnedFd, u32),
    Errno(i32),
    /// Answered later, by a thread of its own.
    Later,
}

impl Supervisor<'_> {
    fn run(&mut self, pidfd: &OwnedFd) {
        // The kernel's notification may be larger than libc's structure.
        let mut buf = vec![0u64; 64];
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: self.listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: pidfd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: poll on two valid descriptors.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return;
            }
            if fds[1].revents != 0 {
                return;
            }
            if fds[0].revents & libc::POLLIN == 0 {
                if fds[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                    return;
                }
                continue;
            }
            buf.iter_mut().for_each(|w| *w = 0);
            // SAFETY: `buf` is zeroed and larger than the kernel's notification.
            let r = unsafe {
                libc::ioctl(
                    self.listener.as_raw_fd(),
                    libc::SECCOMP_IOCTL_NOTIF_RECV,
                    buf.as_mut_ptr(),
                )
            };
            if r != 0 {
                continue;
            }
            // SAFETY: the kernel filled a seccomp_notif at the start of `buf`.
            let notif: libc::seccomp_notif =
                unsafe { std::ptr::read(buf.as_ptr() as *const libc::seccomp_notif) };
            let call = Call {
                id: notif.id,
                pid: notif.pid as libc::pid_t,
                nr: notif.data.nr as i64,
                args: notif.data.args,
            };
            let answer = calls::answer(self, &call);
            self.respond(&call, answer);
        }
    }

    /// Whether the call's caller is still the one that made it (so what was
    /// read from its memory and /proc is its own).
    pub(crate) fn still_valid(&self, id: u64) -> bool {
        let mut id = id;
        // SAFETY: the ioctl reads one u64.
        unsafe {
            libc::ioctl(
                self.listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
                &mut id,
            ) == 0
        }
    }

    fn respond(&self, call: &Call, answer: Answer) {
        respond(self.listener.as_raw_fd(), call.id, answer);
    }

    /// Opens `object` (a FIFO to write) on a thread, which answers call
    /// `id` when a reader comes; at most `MAX_WAITING_OPENS` at a time.
    pub(crate) fn open_later(
        &self,
        id: u64,
        object: OwnedFd,
        flags: i32,
        cloexec: u32,
    ) -> Result<Answer, i32> {
        use std::sync::atomic::Ordering;
        if WAITING_OPENS.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING_OPENS {
            WAITING_OPENS.fetch_sub(1, Ordering::SeqCst);
            return Err(libc::EAGAIN);
        }
        let listener = self.listener.as_raw_fd();
        let spawned = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                let path = cstring(format!("/proc/self/fd/{}", object.as_raw_fd()).as_bytes());
                let answer = match open_at(libc::AT_FDCWD, &path, flags, 0) {
                    Ok(fd) => Answer::Fd(fd, cloexec),
                    Err(e) => Answer::Errno(e),
                };
                respond(listener, id, answer);
                WAITING_OPENS.fetch_sub(1, Ordering::SeqCst);
            });
        match spawned {
            Ok(_) => Ok(Answer::Later),
            Err(_) => {
                WAITING_OPENS.fetch_sub(1, Ordering::SeqCst);
                Err(libc::EAGAIN)
            }
        }
    }

    /// A link made in a shared place that leads into an unshared one (the
    /// process's temporary directory): host programs would follow it to
    /// whatever was written there, `.git` included. Named once, like a
    /// protected place.
    pub(crate) fn refuse_link(&mut self, at: &Path, target: &Path) -> Option<i32> {
        if !self.protected.in_root(at) {
            return None;
        }
        let lexical = super::paths::normalize(target, at.parent().unwrap_or(Path::new("/")));
        // The longest part that exists, resolved (links on the way count).
        let mut real = lexical.clone();
        let mut rest = Vec::new();
        while !real.exists() {
            let (Some(name), Some(parent)) = (real.file_name(), real.parent()) else {
                break;
            };
            rest.push(name.to_os_string());
            real = parent.to_path_buf();
        }
        let mut resolved = real.canonicalize().unwrap_or(real);
        resolved.extend(rest.iter().rev());
        // Into one, or to a directory above one (`/tmp`, `/`).
        let inside = |p: &Path| {
            self.unshared
                .iter()
                .any(|u| p.starts_with(u) || u.starts_with(p))
        };
        if !inside(&lexical) && !inside(&resolved) {
            return None;
        }
        if self.noted.len() < 64 && self.noted.insert(at.to_path_buf()) {
            let line = format!(
                "ferrepl: {} may not link to {}: a link from the workspace into the sandbox's own temporary places would let host programs find what is written there unchecked\n",
                at.display(),
                target.display()
            );
            // SAFETY: writing a buffer to stderr.
            unsafe {
                libc::write(2, line.as_ptr().cast(), line.len());
            }
        }
        Some(libc::EROFS)
    }

    /// The protected place a change of `path` would touch, named once on
    /// the program's stderr; `holding`: also when `path` holds one (renames
    /// and removals).
    pub(crate) fn refuse(&mut self, path: &Path, holding: bool) -> Option<i32> {
        let place = if holding {
            self.protected.touched(path)
        } else {
            self.protected.find(path)
        }?;
        if self.noted.len() < 64 && self.noted.insert(place.clone()) {
            let line = format!("ferrepl: {}\n", self.protected.refusal(&place));
            // SAFETY: writing a buffer to stderr.
            unsafe {
                libc::write(2, line.as_ptr().cast(), line.len());
            }
        }
        Some(libc::EROFS)
    }
}

/// Answers call `id` on `listener`.
fn respond(listener: RawFd, id: u64, answer: Answer) {
    let (val, error) = match answer {
        Answer::Later => return,
        Answer::Fd(fd, flags) => {
            let mut addfd = libc::seccomp_notif_addfd {
                id,
                flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
                srcfd: fd.as_raw_fd() as u32,
                newfd: 0,
                newfd_flags: flags,
            };
            // SAFETY: the ioctl reads the structure; with FLAG_SEND it also
            // answers the call with the new descriptor's number.
            let r = unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &mut addfd) };
            if r >= 0 {
                return;
            }
            let errno = errno();
            if errno == libc::ENOENT {
                // The caller is gone.
                return;
            }
            (0, -errno)
        }
        Answer::Value(v) => (v, 0),
        Answer::Errno(e) => (0, -e),
    };
    let mut resp = libc::seccomp_notif_resp {
        id,
        val,
        error,
        flags: 0,
    };
    // SAFETY: the ioctl reads the response.
    unsafe {
        libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp);
    }
}

/// FIFOs being opened for writing on threads of their own, and the bound.
static WAITING_OPENS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const MAX_WAITING_OPENS: usize = 64;

/// A C string of `bytes` (a path read from the caller has no NUL inside).
pub(crate) fn cstring(bytes: &[u8]) -> CString {
    CString::new(bytes).unwrap_or_default()
}

/// `readlink` of one of our descriptors: the place it refers to.
pub(crate) fn fd_path(fd: &OwnedFd) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()
}

/// The current errno.
pub(crate) fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `openat` returning an owned descriptor.
pub(crate) fn open_at(dir: RawFd, path: &CStr, flags: i32, mode: u32) -> Result<OwnedFd, i32> {
    // SAFETY: openat with a valid C string.
    let fd = unsafe { libc::openat(dir, path.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        Err(errno())
    } else {
        // SAFETY: a descriptor just opened here.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}
