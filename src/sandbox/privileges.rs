//! Dropping every capability before the program runs, whoever started the
//! server: a session of a root server must not keep root's powers (raw
//! sockets, changing interfaces, devices, ownership of other users' files).

/// Locks the process out of ever regaining capabilities: root is not
/// special on exec (NOROOT), uid changes do not touch capabilities, and no
/// ambient capability can be raised; all locked.
const SECUREBITS: libc::c_ulong = (1 << 0) // SECBIT_NOROOT
    | (1 << 1) // SECBIT_NOROOT_LOCKED
    | (1 << 2) // SECBIT_NO_SETUID_FIXUP
    | (1 << 3) // SECBIT_NO_SETUID_FIXUP_LOCKED
    | (1 << 5) // SECBIT_KEEP_CAPS_LOCKED
    | (1 << 6) // SECBIT_NO_CAP_AMBIENT_RAISE
    | (1 << 7); // SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// The kernel refused to clear the capability sets, or to switch to the
/// program's uid and gid.
#[derive(Debug, thiserror::Error)]
pub enum CapsetError {
    #[error("capset: {0}")]
    Capset(std::io::Error),
    #[error("cannot run as uid {uid} gid {gid}: {source}")]
    Identity {
        uid: u32,
        gid: u32,
        source: std::io::Error,
    },
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn last_cap() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// Switches to `identity` (no supplementary groups), keeping the
/// capabilities until the caller clears them (SECBIT_NO_SETUID_FIXUP).
fn become_identity(identity: crate::sandbox::Identity) -> Result<(), CapsetError> {
    let fail = |source| CapsetError::Identity {
        uid: identity.uid,
        gid: identity.gid,
        source,
    };
    // SAFETY: setgroups/setresgid/setresuid with plain values.
    unsafe {
        // Refused where a user namespace denies setgroups: the groups are
        // then the launcher's, which maps only its own gid.
        let _ = libc::setgroups(0, std::ptr::null());
        if libc::setresgid(identity.gid, identity.gid, identity.gid) != 0
            || libc::setresuid(identity.uid, identity.uid, identity.uid) != 0
        {
            return Err(fail(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Clears the bounding, ambient, inheritable, permitted and effective sets
/// and locks the securebits, switching to `identity` on the way. Returns
/// whether every set ended up empty.
pub fn drop_all(identity: Option<crate::sandbox::Identity>) -> Result<bool, CapsetError> {
    // SAFETY: prctl and capset with valid arguments and owned structs.
    unsafe {
        // Needs CAP_SETPCAP; an unprivileged process without a user
        // namespace has no capabilities to lose, so failure is checked below.
        libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0);
        for cap in 0..=last_cap() {
            libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
        if let Some(identity) = identity {
            become_identity(identity)?;
        }
        let mut header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData::default(); 2];
        if libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        ) != 0
        {
            return Err(CapsetError::Capset(std::io::Error::last_os_error()));
        }
    }
    Ok(all_empty())
}

/// True when /proc/self/status shows no capability in any set.
pub fn all_empty() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let sets = ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"];
    sets.iter().all(|name| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .is_some_and(|v| u64::from_str_radix(v.trim(), 16) == Ok(0))
    })
}

/// True when the bounding set is empty too (nothing can be gained by exec).
pub fn bounding_empty() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapBnd:"))
                .map(|v| u64::from_str_radix(v.trim(), 16) == Ok(0))
        })
        .unwrap_or(false)
}
