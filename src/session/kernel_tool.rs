//! Which cell tool runs code in a session on a Jupyter kernel of another
//! language than Python or R (bash, julia, ...): kernel_exec runs its
//! cells, python_exec refuses it (the code is not Python), and kernel_exec
//! refuses every other session. Following such a cell is the Python
//! tools' work (python_wait, python_output): its session is a Python one
//! for routing.

use super::error::SessionError;
use super::manager::SessionManager;

impl SessionManager {
    /// The kernels offered (--kernels) of another language, as
    /// (name, language): kernel_exec exists only when there is one.
    pub fn other_kernels(&self) -> Vec<(String, String)> {
        self.spec
            .kernels
            .iter()
            .filter_map(|k| Some((k.name.clone(), k.other_language.clone()?)))
            .collect()
    }

    /// The kernel language of session `name`, when it runs on a kernel of
    /// another language.
    fn other_language_of(&self, name: &str) -> Option<String> {
        let sess = self.sessions().get(name)?.clone();
        let spec = sess.spec.as_ref()?;
        spec.kernel.as_ref()?.other_language.clone()
    }

    /// Refuses code for session `name` sent by the wrong cell tool:
    /// `by_kernel_exec` is whether kernel_exec sent it.
    pub fn check_cell_tool(&self, name: &str, by_kernel_exec: bool) -> Result<(), SessionError> {
        match (self.other_language_of(name), by_kernel_exec) {
            (Some(lang), false) => Err(SessionError::Invalid(format!(
                "session '{name}' runs a {lang} kernel, not Python: run its code with kernel_exec (python_wait and python_output follow its cells)"
            ))),
            (None, true) => {
                // The name is the caller's: echoed back no longer than a
                // valid one.
                let name: String = name.chars().take(64).collect();
                let kernels: Vec<String> = self
                    .other_kernels()
                    .into_iter()
                    .map(|(k, lang)| format!("{k} ({lang})"))
                    .collect();
                Err(SessionError::Invalid(format!(
                    "session '{name}' is not on a kernel of another language; kernel_exec runs code only there. Create one first: python_sessions {{\"action\": \"create\", \"session\": \"{name}\", \"kernel\": KERNEL}} with a kernel of {}",
                    kernels.join(", ")
                )))
            }
            _ => Ok(()),
        }
    }
}
