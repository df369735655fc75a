//! Each filtered call, performed by the supervisor: the caller's path is
//! read once, its directory opened (the kernel resolves it), the resolved
//! place checked, and the call made on that directory and last name, so
//! nothing changed after the check is used.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::memory::{read_bytes, read_path};
use super::{Answer, Call, Supervisor, cstring, errno, fd_path, open_at};

mod paths;

use paths::{Entry, caller_path, entry_at, start_dir};

/// Links followed by hand (a dangling one at the last name of a create).
const MAX_LINKS: usize = 40;

impl Supervisor<'_> {
    /// The caller's path argument at `addr` (relative to `dirfd`) as an
    /// entry; ENOENT if the caller is gone meanwhile.
    fn entry(&self, call: &Call, dirfd: i32, addr: u64) -> Result<Entry, i32> {
        let path = caller_path(call.pid, &read_path(call.pid, addr)?);
        let base = if path.starts_with(b"/") {
            None
        } else {
            Some(start_dir(call.pid, dirfd)?)
        };
        let entry = entry_at(base.as_ref(), &path)?;
        if !self.still_valid(call.id) {
            return Err(libc::ENOENT);
        }
        Ok(entry)
    }

    /// Refuses with the protected place `entry` is (or, `holding`, holds).
    fn check(&mut self, entry: &Entry, holding: bool) -> Result<(), i32> {
        match self.refuse(&entry.place(), holding) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Refuses with the protected place an opened object lies in.
    /// A file or directory whose place cannot be read (a path past
    /// PATH_MAX) is refused: it could lie in a protected place. Pipes,
    /// sockets and anonymous inodes have no place.
    fn check_object(&mut self, object: &OwnedFd) -> Result<(), i32> {
        match fd_path(object) {
            Some(path) if path.is_absolute() => {
                if is_own_proc(&path) {
                    return Err(libc::EACCES);
                }
                match self.refuse(&path, false) {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
            _ if has_place(object) => Err(libc::ENAMETOOLONG),
            _ => Ok(()),
        }
    }
}

/// Whether `object` is a file, directory or link (not a pipe, socket or
/// anonymous inode).
fn has_place(object: &OwnedFd) -> bool {
    [
        libc::S_IFREG,
        libc::S_IFDIR,
        libc::S_IFLNK,
        libc::S_IFCHR,
        libc::S_IFBLK,
    ]
    .iter()
    .any(|kind| is_kind(object, *kind))
}

/// Whether `path` is the supervisor's own /proc entry (reached through a
/// spelling of /proc/self the rewrite did not catch): never the caller's.
fn is_own_proc(path: &std::path::Path) -> bool {
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    [pid, tid]
        .iter()
        .any(|p| path.starts_with(format!("/proc/{p}")))
}

/// Answers one call.
pub(super) fn answer(s: &mut Supervisor, call: &Call) -> Answer {
    match perform(s, call) {
        Ok(answer) => answer,
        Err(e) => Answer::Errno(e),
    }
}

fn perform(s: &mut Supervisor, call: &Call) -> Result<Answer, i32> {
    let a = call.args;
    let fd = |i: usize| a[i] as i32;
    let here = libc::AT_FDCWD;
    match call.nr {
        libc::SYS_openat => open(s, call, fd(0), a[1], a[2] as i32, a[3] as u32),
        libc::SYS_mkdirat => make(s, call, fd(0), a[1], Make::Dir(a[2] as u32)),
        libc::SYS_mknodat => make(s, call, fd(0), a[1], Make::Node(a[2] as u32, a[3])),
        libc::SYS_symlinkat => symlink(s, call, a[0], fd(1), a[2]),
        libc::SYS_linkat => link(s, call, (fd(0), a[1]), (fd(2), a[3]), a[4] as i32),
        libc::SYS_renameat => rename(s, call, (fd(0), a[1]), (fd(2), a[3]), 0),
        libc::SYS_renameat2 => rename(s, call, (fd(0), a[1]), (fd(2), a[3]), a[4] as u32),
        libc::SYS_unlinkat => unlink(s, call, fd(0), a[1], a[2] as i32),
        libc::SYS_truncate => truncate(s, call, a[0], a[1] as i64),
        libc::SYS_fchmodat => chmod(s, call, fd(0), a[1], a[2] as u32, 0),
        452 => chmod(s, call, fd(0), a[1], a[2] as u32, a[3] as i32),
        libc::SYS_fchmod => chmod(s, call, fd(0), 0, a[1] as u32, libc::AT_EMPTY_PATH),
        libc::SYS_bind => bind(s, call, fd(0), a[1], a[2] as usize),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open => open(s, call, here, a[0], a[1] as i32, a[2] as u32),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_creat => {
            let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
            open(s, call, here, a[0], flags, a[1] as u32)
        }
        #[cfg(target_arch = "x86_64")]
        libc::SYS_mkdir => make(s, call, here, a[0], Make::Dir(a[1] as u32)),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_mknod => make(s, call, here, a[0], Make::Node(a[1] as u32, a[2])),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_symlink => symlink(s, call, a[0], here, a[1]),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_link => link(s, call, (here, a[0]), (here, a[1]), 0),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_rename => rename(s, call, (here, a[0]), (here, a[1]), 0),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_unlink => unlink(s, call, here, a[0], 0),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_rmdir => unlink(s, call, here, a[0], libc::AT_REMOVEDIR),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_chmod => chmod(s, call, here, a[0], a[1] as u32, 0),
        _ => {
            let _ = here;
            Err(libc::ENOSYS)
        }
    }
}

/// The caller's umask, made ours for a call that creates.
fn take_umask(pid: libc::pid_t) {
    let mask = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let v = s.lines().find_map(|l| l.strip_prefix("Umask:"))?;
            u32::from_str_radix(v.trim(), 8).ok()
        })
        .unwrap_or(0o077);
    // SAFETY: umask has no memory effects.
    unsafe {
        libc::umask(mask as libc::mode_t);
    }
}

/// Our `/proc/self/fd/N` path of an opened object, to reach it again.
fn magic(object: &OwnedFd) -> std::ffi::CString {
    cstring(format!("/proc/self/fd/{}", object.as_raw_fd()).as_bytes())
}

fn is_kind(object: &OwnedFd, kind: libc::mode_t) -> bool {
    // SAFETY: fstat writes the structure only.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    unsafe { libc::fstat(object.as_raw_fd(), &mut st) == 0 && st.st_mode & libc::S_IFMT == kind }
}

fn value(r: libc::c_int) -> Result<Answer, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(Answer::Value(r as i64))
    }
}

fn open(
    s: &mut Supervisor,
    call: &Call,
    dirfd: i32,
    addr: u64,
    flags: i32,
    mode: u32,
) -> Result<Answer, i32> {
    let entry = s.entry(call, dirfd, addr)?;
    let cloexec = if flags & libc::O_CLOEXEC != 0 {
        libc::O_CLOEXEC as u32
    } else {
        0
    };
    open_entry(s, call, entry, (flags, mode, cloexec), 0)
}

fn open_entry(
    s: &mut Supervisor,
    call: &Call,
    entry: Entry,
    (flags, mode, cloexec): (i32, u32, u32),
    depth: usize,
) -> Result<Answer, i32> {
    let nofollow = flags & libc::O_NOFOLLOW != 0;
    let creating = flags & libc::O_CREAT != 0;
    for _ in 0..4 {
        match entry.object(!nofollow) {
            Ok(object) => {
                if creating && flags & libc::O_EXCL != 0 {
                    return Err(libc::EEXIST);
                }
                s.check_object(&object)?;
                if is_kind(&object, libc::S_IFLNK) {
                    return Err(libc::ELOOP);
                }
                let reopen = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW);
                if is_kind(&object, libc::S_IFIFO)
                    && flags & libc::O_ACCMODE != libc::O_RDWR
                    && flags & libc::O_NONBLOCK == 0
                {
                    // Opening a FIFO waits for its other end, which may
                    // need us meanwhile: opened on a thread of its own.
                    return s.open_later(call.id, object, reopen, cloexec);
                }
                if flags & libc::O_TMPFILE == libc::O_TMPFILE {
                    take_umask(call.pid);
                }
                let fd = open_at(libc::AT_FDCWD, &magic(&object), reopen, mode)?;
                return Ok(Answer::Fd(fd, cloexec));
            }
            Err(libc::ENOENT) if creating => {
                let last = entry.last_c();
                if !nofollow && let Some(target) = read_link_at(&entry.parent, &last) {
                    // A dangling link: the file is created where it points.
                    if depth >= MAX_LINKS {
                        return Err(libc::ELOOP);
                    }
                    let target = caller_path(call.pid, &target);
                    let next = entry_at(Some(&entry.parent), &target)?;
                    return open_entry(s, call, next, (flags, mode, cloexec), depth + 1);
                }
                s.check(&entry, false)?;
                take_umask(call.pid);
                match open_at(
                    entry.parent.as_raw_fd(),
                    &last,
                    flags | libc::O_NOFOLLOW,
                    mode,
                ) {
                    Ok(fd) => return Ok(Answer::Fd(fd, cloexec)),
                    // A link appeared after the check: look again.
                    Err(libc::ELOOP) if !nofollow => continue,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(libc::ELOOP)
}

/// The target of the link `name` in `dir`, if it is one.
fn read_link_at(dir: &OwnedFd, name: &CStr) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: readlinkat writes at most `buf.len()` bytes.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n <= 0 || n as usize >= buf.len() {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

enum Make {
    Dir(u32),
    Node(u32, u64),
}

fn make(s: &mut Supervisor, call: &Call, dirfd: i32, addr: u64, what: Make) -> Result<Answer, i32> {
    let entry = s.entry(call, dirfd, addr)?;
    if entry.is_dot() {
        return Err(libc::EEXIST);
    }
    s.check(&entry, false)?;
    take_umask(call.pid);
    let dir = entry.parent.as_raw_fd();
    let last = entry.last_c();
    // SAFETY: the calls take a valid descriptor and C string.
    value(unsafe {
        match what {
            Make::Dir(mode) => libc::mkdirat(dir, last.as_ptr(), mode as libc::mode_t),
            Make::Node(mode, dev) => {
                libc::mknodat(dir, last.as_ptr(), mode as libc::mode_t, dev as libc::dev_t)
            }
        }
    })
}

fn symlink(
    s: &mut Supervisor,
    call: &Call,
    target: u64,
    dirfd: i32,
    addr: u64,
) -> Result<Answer, i32> {
    let target_bytes = read_path(call.pid, target)?;
    let target = cstring(&target_bytes);
    let entry = s.entry(call, dirfd, addr)?;
    if entry.is_dot() {
        return Err(libc::EEXIST);
    }
    // A link is checked as what it would stand for: named as a protected
    // place, as an ancestor of one (`conf` for a protected `conf/run.sh`),
    // or as the first part of a sequence (`renv`).
    s.check(&entry, true)?;
    {
        use std::os::unix::ffi::OsStrExt;
        let target_path = std::path::Path::new(std::ffi::OsStr::from_bytes(&target_bytes));
        if let Some(e) = s.refuse_link(&entry.place(), target_path) {
            return Err(e);
        }
    }
    // SAFETY: valid C strings and descriptor.
    value(unsafe {
        libc::symlinkat(
            target.as_ptr(),
            entry.parent.as_raw_fd(),
            entry.last_c().as_ptr(),
        )
    })
}

/// The source object of a link or mode change: the caller's descriptor
/// itself (AT_EMPTY_PATH with an empty path), or the entry at its path.
fn source(
    s: &mut Supervisor,
    call: &Call,
    (dirfd, addr): (i32, u64),
    flags: i32,
    follow: bool,
) -> Result<OwnedFd, i32> {
    let empty = addr == 0 || read_path(call.pid, addr).is_ok_and(|p| p.is_empty());
    if flags & libc::AT_EMPTY_PATH != 0 && empty {
        let proc = format!("/proc/{}/fd/{dirfd}", call.pid);
        let object = open_at(libc::AT_FDCWD, &cstring(proc.as_bytes()), libc::O_PATH, 0)
            .map_err(|e| if e == libc::ENOENT { libc::EBADF } else { e })?;
        if !s.still_valid(call.id) {
            return Err(libc::ENOENT);
        }
        return Ok(object);
    }
    s.entry(call, dirfd, addr)?.object(follow)
}

fn link(
    s: &mut Supervisor,
    call: &Call,
    old: (i32, u64),
    new: (i32, u64),
    flags: i32,
) -> Result<Answer, i32> {
    let object = source(s, call, old, flags, flags & libc::AT_SYMLINK_FOLLOW != 0)?;
    s.check_object(&object)?;
    let entry = s.entry(call, new.0, new.1)?;
    if entry.is_dot() {
        return Err(libc::EEXIST);
    }
    s.check(&entry, false)?;
    // SAFETY: valid C strings and descriptors.
    value(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            magic(&object).as_ptr(),
            entry.parent.as_raw_fd(),
            entry.last_c().as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}

fn rename(
    s: &mut Supervisor,
    call: &Call,
    old: (i32, u64),
    new: (i32, u64),
    flags: u32,
) -> Result<Answer, i32> {
    let from = s.entry(call, old.0, old.1)?;
    let to = s.entry(call, new.0, new.1)?;
    if from.is_dot() || to.is_dot() {
        return Err(libc::EBUSY);
    }
    s.check(&from, true)?;
    s.check(&to, true)?;
    // A directory moved between a shared place and any other (the
    // process's temporary directory, where nothing is protected) could
    // carry a repository changed there: refused as across file systems,
    // so `mv` and shutil.move copy it entry by entry, each checked.
    // Links likewise: one made in the temporary directory could lead back
    // into it.
    let shared = |e: &Entry| s.protected.in_root(&e.place());
    if shared(&from) != shared(&to)
        && from
            .object(false)
            .is_ok_and(|o| is_kind(&o, libc::S_IFDIR) || is_kind(&o, libc::S_IFLNK))
    {
        return Err(libc::EXDEV);
    }
    // SAFETY: valid C strings and descriptors.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            from.parent.as_raw_fd(),
            from.last_c().as_ptr(),
            to.parent.as_raw_fd(),
            to.last_c().as_ptr(),
            flags,
        )
    };
    value(r as libc::c_int)
}

fn unlink(
    s: &mut Supervisor,
    call: &Call,
    dirfd: i32,
    addr: u64,
    flags: i32,
) -> Result<Answer, i32> {
    let entry = s.entry(call, dirfd, addr)?;
    if entry.is_dot() {
        return Err(if flags & libc::AT_REMOVEDIR != 0 {
            libc::EINVAL
        } else {
            libc::EISDIR
        });
    }
    s.check(&entry, true)?;
    // SAFETY: valid C string and descriptor.
    value(unsafe { libc::unlinkat(entry.parent.as_raw_fd(), entry.last_c().as_ptr(), flags) })
}

fn truncate(s: &mut Supervisor, call: &Call, addr: u64, len: i64) -> Result<Answer, i32> {
    let object = s.entry(call, libc::AT_FDCWD, addr)?.object(true)?;
    s.check_object(&object)?;
    // SAFETY: a valid C string.
    value(unsafe { libc::truncate(magic(&object).as_ptr(), len) })
}

fn chmod(
    s: &mut Supervisor,
    call: &Call,
    dirfd: i32,
    addr: u64,
    mode: u32,
    flags: i32,
) -> Result<Answer, i32> {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    let object = source(s, call, (dirfd, addr), flags, follow)?;
    s.check_object(&object)?;
    if is_kind(&object, libc::S_IFLNK) {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: a valid C string.
    value(unsafe { libc::chmod(magic(&object).as_ptr(), mode as libc::mode_t) })
}

/// The caller's socket, for a bind made here.
fn caller_fd(pid: libc::pid_t, fd: RawFd) -> Result<OwnedFd, i32> {
    use std::os::fd::FromRawFd;
    let tgid = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse::<libc::pid_t>().ok())
        })
        .ok_or(libc::ENOENT)?;
    // SAFETY: pidfd_open and pidfd_getfd return new descriptors or -1.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, tgid, 0);
        if pidfd < 0 {
            return Err(errno());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        let got = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if got < 0 {
            let e = errno();
            return Err(if e == libc::EBADF || e == libc::ESRCH {
                libc::EBADF
            } else {
                e
            });
        }
        Ok(OwnedFd::from_raw_fd(got as RawFd))
    }
}

fn bind(s: &mut Supervisor, call: &Call, fd: RawFd, addr: u64, len: usize) -> Result<Answer, i32> {
    if len > std::mem::size_of::<libc::sockaddr_storage>() {
        return Err(libc::EINVAL);
    }
    let bytes = read_bytes(call.pid, addr, len)?;
    let socket = caller_fd(call.pid, fd)?;
    if !s.still_valid(call.id) {
        return Err(libc::ENOENT);
    }
    let family = bytes
        .get(..2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .unwrap_or(0);
    let path = bytes.get(2..).unwrap_or_default();
    if family == libc::AF_UNIX as u16 && path.first().is_some_and(|b| *b != 0) {
        // A socket file: created like any entry.
        let end = path.iter().position(|b| *b == 0).unwrap_or(path.len());
        let path = caller_path(call.pid, &path[..end]);
        let base = if path.starts_with(b"/") {
            None
        } else {
            Some(start_dir(call.pid, libc::AT_FDCWD)?)
        };
        let entry = entry_at(base.as_ref(), &path)?;
        s.check(&entry, false)?;
        let mut un: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        un.sun_family = libc::AF_UNIX as libc::sa_family_t;
        if entry.last.len() >= un.sun_path.len() {
            return Err(libc::ENAMETOOLONG);
        }
        for (d, b) in un.sun_path.iter_mut().zip(&entry.last) {
            *d = *b as libc::c_char;
        }
        take_umask(call.pid);
        // SAFETY: fchdir to a directory we hold; bind with a filled address
        // relative to it (we are single-threaded).
        return value(unsafe {
            if libc::fchdir(entry.parent.as_raw_fd()) != 0 {
                return Err(errno());
            }
            libc::bind(
                socket.as_raw_fd(),
                (&un as *const libc::sockaddr_un).cast(),
                (2 + entry.last.len() + 1) as libc::socklen_t,
            )
        });
    }
    // SAFETY: the address bytes are a copy of the caller's, `len` long.
    value(unsafe {
        libc::bind(
            socket.as_raw_fd(),
            bytes.as_ptr().cast(),
            len as libc::socklen_t,
        )
    })
}
