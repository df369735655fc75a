//! A stdio upstream server's process: started outside the sandbox, as the
//! operator configured it, with exactly its configured environment over a
//! minimal base, in a process group of its own that ends with it.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Mutex;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

use crate::output::redact::{Secrets, StreamRedactor};

/// The only variables of ferrepl's own environment an upstream gets (its
/// configured `env` comes on top): never ferrepl's token or anything else.
const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG"];
/// A line of an upstream's stderr longer than this is cut in the log.
const MAX_LOG_LINE: usize = 2000;

/// Where upstream servers may run from: never from (nor with PATH entries
/// in) what sessions can write, where a session could plant its own
/// program or module for ferrepl to run outside the sandbox.
#[derive(Debug, Clone)]
pub struct SpawnRules {
    pub writable: crate::sandbox::paths::Writable,
    /// Relative `cwd` and commands, and the default working directory: the
    /// servers file's directory.
    pub base_dir: std::path::PathBuf,
}

impl SpawnRules {
    /// The working directory, PATH and absolute command of a server, or why
    /// it may not run.
    fn place(
        &self,
        command: &str,
        cwd: Option<&str>,
    ) -> Result<(std::path::PathBuf, std::ffi::OsString, std::path::PathBuf), String> {
        let dir = match cwd {
            Some(c) => self.base_dir.join(c),
            None => self.base_dir.clone(),
        };
        if self.writable.contains(&dir) {
            return Err(format!(
                "its working directory {} lies where sessions can write; give a \"cwd\" outside the workspace",
                dir.display()
            ));
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let entries: Vec<std::path::PathBuf> = std::env::split_paths(&path)
            .filter(|p| !self.writable.contains(p))
            .collect();
        let path = std::env::join_paths(&entries).unwrap_or_default();
        let program = if command.contains('/') {
            dir.join(command)
        } else {
            entries
                .iter()
                .map(|d| d.join(command))
                .find(|p| crate::executables::is_executable(p))
                .ok_or_else(|| {
                    format!("cannot run {command:?}: not found on PATH (outside the places sessions write)")
                })?
        };
        if self.writable.contains(&program) {
            return Err(format!(
                "its command {} lies where sessions can write; install it outside the workspace",
                program.display()
            ));
        }
        Ok((dir, path, program))
    }
}

pub struct UpstreamChild {
    child: Mutex<Child>,
    pid: u32,
    /// Its last lines of stderr, for a start that failed.
    stderr_tail: std::sync::Arc<Mutex<std::collections::VecDeque<String>>>,
}

/// Lines of an upstream's stderr kept for its error message.
const TAIL_LINES: usize = 3;

impl UpstreamChild {
    pub fn spawn(
        name: &str,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&str>,
        rules: &SpawnRules,
        secrets: &Secrets,
    ) -> Result<(UpstreamChild, ChildStdout, ChildStdin), String> {
        let (dir, path, program) = rules.place(command, cwd)?;
        // Under this binary's containment mode (contain.rs) where it can
        // find itself, so that the server's whole tree ends with ferrepl.
        let mut cmd = match std::env::current_exe() {
            Ok(me) if cfg!(target_os = "linux") => {
                let mut c = Command::new(me);
                c.arg(super::contain::CONTAIN_ARG).arg("--").arg(&program);
                c
            }
            _ => Command::new(&program),
        };
        cmd.args(args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        for key in BASE_ENV {
            if let Some(value) = std::env::var_os(key) {
                cmd.env(key, value);
            }
        }
        cmd.env("PATH", &path);
        cmd.envs(env);
        cmd.current_dir(&dir);
        #[cfg(target_os = "linux")]
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Ends with ferrepl even when ferrepl is killed.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
        let pid = child.id().unwrap_or(0);
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err("its stdin or stdout could not be opened".into());
        };
        let stderr_tail = std::sync::Arc::new(Mutex::new(std::collections::VecDeque::new()));
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(follow_stderr(
                stderr,
                name.to_string(),
                stderr_tail.clone(),
                secrets.clone(),
            ));
        }
        Ok((
            UpstreamChild {
                child: Mutex::new(child),
                pid,
                stderr_tail,
            },
            stdout,
            stdin,
        ))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its last lines of stderr, joined ("" when it wrote none).
    pub fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    /// How it ended, once it has.
    pub fn exit_status(&self) -> Option<String> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        match child.try_wait() {
            Ok(Some(status)) => Some(crate::process::ExitInfo::now(Ok(status)).describe()),
            _ => None,
        }
    }
}

/// Reads a server's stderr to its end: each line to the log and the tail,
/// secrets redacted first (across the pipe's chunks) and only then cut to
/// [`MAX_LOG_LINE`]; a longer line's rest is skipped, never held.
async fn follow_stderr(
    mut stderr: ChildStderr,
    name: String,
    tail: std::sync::Arc<Mutex<std::collections::VecDeque<String>>>,
    secrets: Secrets,
) {
    let mut redactor = StreamRedactor::new(secrets);
    let mut lines = Lines::default();
    let mut chunk = vec![0u8; 8192];
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for line in lines.feed(&redactor.push(&chunk[..n])) {
            keep_line(&name, &tail, line);
        }
    }
    let rest = redactor.finish();
    let mut last = lines.feed(&rest);
    last.extend(lines.end());
    for line in last {
        keep_line(&name, &tail, line);
    }
}

fn keep_line(name: &str, tail: &Mutex<std::collections::VecDeque<String>>, line: String) {
    tracing::info!(server = %name, "upstream: {line}");
    let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
    if tail.len() == TAIL_LINES {
        tail.pop_front();
    }
    tail.push_back(line);
}

/// Splits redacted text into lines of at most [`MAX_LOG_LINE`] bytes
/// (longer ones cut, marked, their rest dropped as it comes).
#[derive(Default)]
struct Lines {
    current: Vec<u8>,
    /// The current line was cut: drop the rest of it.
    cut: bool,
}

impl Lines {
    fn feed(&mut self, mut text: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        while !text.is_empty() {
            let (piece, ended) = match memchr::memchr(b'\n', text) {
                Some(i) => (&text[..i], Some(i + 1)),
                None => (text, None),
            };
            if !self.cut {
                let room = MAX_LOG_LINE - self.current.len();
                if piece.len() > room {
                    self.current.extend_from_slice(&piece[..room]);
                    self.cut = true;
                } else {
                    self.current.extend_from_slice(piece);
                }
            }
            match ended {
                Some(next) => {
                    out.push(self.take());
                    text = &text[next..];
                }
                None => break,
            }
        }
        out
    }

    /// The last line, if the text did not end with a newline.
    fn end(&mut self) -> Option<String> {
        (!self.current.is_empty() || self.cut).then(|| self.take())
    }

    fn take(&mut self) -> String {
        let bytes = std::mem::take(&mut self.current);
        // Lossy: a character the cut split shows as one replacement sign.
        let mut line = String::from_utf8_lossy(&bytes)
            .trim_end_matches('\r')
            .to_string();
        if std::mem::take(&mut self.cut) {
            line.push_str(" [cut]");
        }
        line
    }
}

impl Drop for UpstreamChild {
    fn drop(&mut self) {
        // Its whole group: npx and the node it started alike.
        if self.pid > 0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.start_kill();
        let _ = child.try_wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_cut_after_redaction() {
        let mut lines = Lines::default();
        assert!(lines.feed(b"par").is_empty());
        assert_eq!(lines.feed(b"tial\nnext\r\nla"), ["partial", "next"]);
        assert_eq!(lines.end().as_deref(), Some("la"));
        assert_eq!(lines.end(), None);
        let long = vec![b'x'; MAX_LOG_LINE + 10];
        assert!(lines.feed(&long).is_empty());
        let got = lines.feed(b"more\nok\n");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], format!("{} [cut]", "x".repeat(MAX_LOG_LINE)));
        assert_eq!(got[1], "ok");
    }

    /// A secret that straddles the cut is redacted whole before the line
    /// is cut (not left as its first characters).
    #[tokio::test]
    async fn a_secret_at_the_cut_is_redacted_before_it() {
        let secrets = Secrets::of(["0123456789abcdef"]);
        let mut text = "x".repeat(MAX_LOG_LINE - 4).into_bytes();
        text.extend_from_slice(b"0123456789abcdef tail\nnext 0123456789abcdef\n");
        let mut redactor = StreamRedactor::new(secrets);
        let mut lines = Lines::default();
        let mut got = Vec::new();
        for piece in text.chunks(7) {
            got.extend(lines.feed(&redactor.push(piece)));
        }
        got.extend(lines.feed(&redactor.finish()));
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[0].ends_with("xxxx[red [cut]"),
            "{}",
            &got[0][got[0].len() - 30..]
        );
        assert_eq!(got[1], "next [redacted]");
    }
}
