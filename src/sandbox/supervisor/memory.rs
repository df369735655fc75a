//! Reading a caller's arguments from its memory (process_vm_readv: the
//! supervisor runs as the caller's uid, and the caller is dumpable).

/// The longest path the kernel takes.
const PATH_MAX: usize = 4096;

/// `len` bytes at `addr` in `pid`'s memory.
pub fn read_bytes(pid: libc::pid_t, addr: u64, len: usize) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = read_some(pid, addr + done as u64, &mut buf[done..])?;
        if n == 0 {
            return Err(libc::EFAULT);
        }
        done += n;
    }
    Ok(buf)
}

/// A NUL-terminated path at `addr` (without its NUL): EFAULT where it cannot
/// be read, ENAMETOOLONG past PATH_MAX.
pub fn read_path(pid: libc::pid_t, addr: u64) -> Result<Vec<u8>, i32> {
    if addr == 0 {
        return Err(libc::EFAULT);
    }
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < PATH_MAX {
        // Never across a page boundary: the next page may be unmapped.
        let to_page = 4096 - (at % 4096) as usize;
        let mut chunk = vec![0u8; to_page.min(PATH_MAX - out.len()).max(1)];
        let n = read_some(pid, at, &mut chunk)?;
        if n == 0 {
            return Err(libc::EFAULT);
        }
        if let Some(end) = chunk[..n].iter().position(|b| *b == 0) {
            out.extend_from_slice(&chunk[..end]);
            return Ok(out);
        }
        out.extend_from_slice(&chunk[..n]);
        at += n as u64;
    }
    Err(libc::ENAMETOOLONG)
}

fn read_some(pid: libc::pid_t, addr: u64, buf: &mut [u8]) -> Result<usize, i32> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local buffer is ours and `buf.len()` long; the remote one
    // is only read by the kernel, which checks it.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        let e = super::errno();
        return Err(if e == libc::ESRCH {
            libc::ENOENT
        } else {
            libc::EFAULT
        });
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_read_up_to_its_nul_across_pages() {
        let pid = std::process::id() as libc::pid_t;
        // A path that starts 3 bytes before a page boundary.
        let mut page = vec![0u8; 3 * 4096];
        let base = page.as_ptr() as usize;
        let start = (base / 4096 + 1) * 4096 - 3 - base;
        page[start..start + 9].copy_from_slice(b"/ws/.git\0");
        let addr = (base + start) as u64;
        assert_eq!(read_path(pid, addr).expect("read"), b"/ws/.git");
        assert_eq!(read_path(pid, 0), Err(libc::EFAULT));
        let long = vec![b'a'; 5000];
        assert_eq!(
            read_path(pid, long.as_ptr() as u64),
            Err(libc::ENAMETOOLONG)
        );
        assert_eq!(read_bytes(pid, addr, 4).expect("bytes"), b"/ws/");
    }
}
