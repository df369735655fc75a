//! What a kept venv is given at start (`--preinstall`): the install's state
//! as interpreters and calls wait on it, and the stamp that lets a restart
//! with the same list skip it. The stamp lives beside the venv in the
//! server's own directory (`<state>/venvs/<name>.preinstalled`), never in
//! the venv sessions write; it is only compared, never run, and all it can
//! cause is an install skipped. The install itself is run by the tenant's
//! job manager (`tenants/preinstall.rs`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Longest a preinstall may run before it is killed and counted failed
/// (interpreters and calls wait at most this long for it).
pub const MAX_PREINSTALL_TIME: Duration = Duration::from_secs(30 * 60);

/// Where the preinstall is.
#[derive(Debug, Clone, PartialEq)]
pub enum PreinstallState {
    /// Under way since `since`; its install job, once started.
    Running { since: Instant, job: Option<String> },
    /// Installed (or already there, as the stamp said).
    Done,
    /// Not installed: why, and the job whose log says more.
    Failed { why: String, job: Option<String> },
}

/// The packages of `--preinstall` for one kept venv, and where their
/// install is.
#[derive(Debug)]
pub struct Preinstall {
    pub specs: Vec<String>,
    state: watch::Sender<PreinstallState>,
}

impl Preinstall {
    pub fn new(specs: Vec<String>) -> Self {
        let (state, _) = watch::channel(PreinstallState::Running {
            since: Instant::now(),
            job: None,
        });
        Self { specs, state }
    }

    pub fn state(&self) -> PreinstallState {
        self.state.borrow().clone()
    }

    pub fn set(&self, state: PreinstallState) {
        self.state.send_replace(state);
    }

    /// Whether it has ended (well or not), waiting at most `wait`.
    pub async fn settled(&self, wait: Duration) -> bool {
        let mut rx = self.state.subscribe();
        let ended = rx.wait_for(|s| !matches!(s, PreinstallState::Running { .. }));
        tokio::time::timeout(wait, ended)
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// One line for an agent waiting on it: what, for how long, where the
    /// installer's log is.
    pub fn progress(&self) -> String {
        let names = self.names();
        match self.state() {
            PreinstallState::Running { since, job } => {
                let mut line = format!(
                    "ferrepl is preinstalling {names} (--preinstall) into the sessions' venv, {:.0} s so far",
                    since.elapsed().as_secs_f64()
                );
                if let Some(job) = job {
                    line.push_str(&format!("; python_output {{job: \"{job}\"}} shows its log"));
                }
                line
            }
            PreinstallState::Done => format!("{names} (--preinstall) are installed"),
            PreinstallState::Failed { why, job } => {
                let log = job.map_or_else(
                    || "the server's log says why".to_string(),
                    |j| format!("python_output {{job: \"{j}\"}} shows the installer's log"),
                );
                format!(
                    "The preinstall of {names} (--preinstall) failed ({why}): {log}; python_install installs what is missing"
                )
            }
        }
    }

    /// The packages, shortened for a line.
    fn names(&self) -> String {
        const SHOWN: usize = 5;
        let mut names = self.specs.iter().take(SHOWN).cloned().collect::<Vec<_>>();
        if self.specs.len() > SHOWN {
            names.push(format!("{} more", self.specs.len() - SHOWN));
        }
        names.join(", ")
    }
}

/// The stamp of the kept venv `venv_dir`: beside it, in the server's own
/// `venvs` directory (sessions are bound only into the venv itself).
pub fn stamp_path(venv_dir: &Path) -> PathBuf {
    let mut name = venv_dir.file_name().unwrap_or_default().to_os_string();
    name.push(".preinstalled");
    venv_dir.with_file_name(name)
}

/// What the stamp holds once `specs` were installed over `base`.
fn stamp_text(base: &Path, specs: &[String]) -> String {
    let mut sorted = specs.to_vec();
    sorted.sort();
    format!(
        "ferrepl preinstall 1\nbase {}\n{}\n",
        base.display(),
        sorted.join("\n")
    )
}

/// Whether the stamp says `specs` were installed over `base` already.
pub fn is_stamped(venv_dir: &Path, base: &Path, specs: &[String]) -> bool {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let want = stamp_text(base, specs);
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(stamp_path(venv_dir))
    else {
        return false;
    };
    let mut text = String::new();
    let bound = want.len() as u64 + 1;
    file.take(bound).read_to_string(&mut text).is_ok() && text == want
}

/// Records that `specs` are installed over `base` (written whole, then
/// renamed over the old stamp).
pub fn write_stamp(venv_dir: &Path, base: &Path, specs: &[String]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = stamp_path(venv_dir);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".new");
    let new = path.with_file_name(name);
    let _ = std::fs::remove_file(&new);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&new)?;
    file.write_all(stamp_text(base, specs).as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&new, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_matches_the_same_list_in_any_order_only() {
        let dir = tempfile::tempdir().expect("dir");
        let venv = dir.path().join("abc-local");
        std::fs::create_dir(&venv).expect("venv dir");
        let base = Path::new("/usr/bin/python3");
        let specs = vec!["six".to_string(), "numpy>=2".to_string()];
        assert!(!is_stamped(&venv, base, &specs));
        write_stamp(&venv, base, &specs).expect("stamp");
        assert_eq!(stamp_path(&venv), dir.path().join("abc-local.preinstalled"));
        let reordered = vec!["numpy>=2".to_string(), "six".to_string()];
        assert!(is_stamped(&venv, base, &reordered));
        assert!(!is_stamped(&venv, base, &["six".to_string()]));
        assert!(!is_stamped(&venv, Path::new("/other/python"), &specs));
        // A link in its place is never followed.
        std::fs::remove_file(stamp_path(&venv)).expect("rm");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, stamp_text(base, &specs)).expect("write");
        std::os::unix::fs::symlink(&elsewhere, stamp_path(&venv)).expect("link");
        assert!(!is_stamped(&venv, base, &specs));
    }

    #[tokio::test]
    async fn settled_waits_for_the_end_within_its_window() {
        let p = std::sync::Arc::new(Preinstall::new(vec!["six".into()]));
        assert!(!p.settled(Duration::from_millis(10)).await);
        let q = p.clone();
        let waiting = tokio::spawn(async move { q.settled(Duration::from_secs(30)).await });
        p.set(PreinstallState::Done);
        assert!(waiting.await.expect("join"));
        assert!(p.progress().contains("six (--preinstall) are installed"));
    }
}
