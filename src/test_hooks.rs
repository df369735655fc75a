//! The test hooks, all here and only in debug builds (the tests run
//! against them; a release build has none): each is read from the
//! environment of the server under test, never from anything a session
//! can set.

/// `FERREPL_TEST_TENANT_EXTRA_READ`: a path put in every named tenant's
/// view, to show that their uids keep tenants apart where a view would
/// not (tests/suite/escape/uids.rs).
pub fn tenant_extra_read() -> Option<std::path::PathBuf> {
    if cfg!(debug_assertions) {
        std::env::var_os("FERREPL_TEST_TENANT_EXTRA_READ").map(std::path::PathBuf::from)
    } else {
        None
    }
}

/// `FERREPL_DOCTOR_FAKE_PROBE=no-landlock`: doctor reports what a kernel
/// without Landlock would (tests/suite/doctor.rs).
pub const DOCTOR_FAKE_PROBE: &str = "FERREPL_DOCTOR_FAKE_PROBE";

/// Whether doctor should report a kernel without Landlock.
pub fn doctor_without_landlock() -> bool {
    cfg!(debug_assertions)
        && std::env::var(DOCTOR_FAKE_PROBE).is_ok_and(|fake| fake == "no-landlock")
}

/// `FERREPL_TEST_PREINSTALL_GATE`: a file the preinstall waits for before
/// it installs anything, so a test sees the server answer and a cell
/// queue while it is under way (tests/suite/preinstall.rs).
pub fn preinstall_gate() -> Option<std::path::PathBuf> {
    if cfg!(debug_assertions) {
        std::env::var_os("FERREPL_TEST_PREINSTALL_GATE").map(std::path::PathBuf::from)
    } else {
        None
    }
}
