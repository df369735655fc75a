//! Kernel sessions after a server restart. A Jupyter kernel hands no
//! variables over, so nothing of it is saved: a stored kernel session comes
//! back dormant (listed, with its history), and the first call that needs
//! it starts a fresh kernel of the same name, saying plainly that the
//! kernel restarted and its variables are gone. No cell is re-run by it:
//! until the next cell starts a new path, python_sessions rebuild re-runs
//! the old one only when an agent asks. A session whose kernel the new
//! server no longer offers is refused, saying which kernel and what to do.

use std::sync::Arc;

use super::error::SessionError;
use super::lifecycle::Pending;
use super::lineage::ranges;
use super::manager::SessionManager;
use super::state::Session;

impl SessionManager {
    /// A dormant kernel session (`kernel` is its kernel's name) on a fresh
    /// kernel; the note its next result carries (empty when another call
    /// woke it meanwhile).
    pub(super) async fn wake_kernel(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        kernel: &str,
    ) -> Result<String, SessionError> {
        self.ensure_worker(sess).await?;
        let _guard = sess.start_lock.lock().await;
        let mut st = sess.lock();
        if !st.lifecycle.is_dormant() {
            return Ok(String::new());
        }
        let ids: Vec<u64> = st.lineage.path().iter().map(|c| c.id).collect();
        st.lifecycle.set_pending(Pending::KernelRestarted);
        let note = format!(
            "Session '{}' runs on a fresh '{kernel}' kernel: the server restarted, and the kernel that ran cells {} ended with it, so their variables are gone. No cell was re-run; python_history shows their code.",
            sess.name,
            ranges(&ids)
        );
        st.notes.push(note.clone());
        Ok(note)
    }
}

/// Why stored session `name` cannot run: its kernel `kernel` is not among
/// those this server offers (`offered`, from --kernels).
pub(super) fn kernel_not_offered(name: &str, kernel: &str, offered: &[String]) -> String {
    let now = match offered {
        [] => "this server offers no kernels".to_string(),
        names => format!("this server offers {}", names.join(", ")),
    };
    format!(
        "session '{name}' ran on the Jupyter kernel '{kernel}', which this server does not offer ({now}; --kernels names them); its history is kept (python_history) and nothing was run. To use it again, the operator restarts ferrepl with '{kernel}' in --kernels; or delete it (python_sessions action=delete) and create a session on an offered kernel"
    )
}
