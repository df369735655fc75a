//! What job calls return: a job's report (status and new output) and its
//! row in the job list.

use serde::Serialize;

use super::job::Job;
use crate::output::RenderedOutput;
use crate::process::ExitInfo;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Still running; collect it with shell_wait.
    Running,
    /// Exited (see exit_code / signal).
    Exited,
}

impl JobStatus {
    /// The status of a job that has exited (`exit`) or not.
    fn of(exit: Option<&ExitInfo>) -> Self {
        match exit {
            Some(_) => JobStatus::Exited,
            None => JobStatus::Running,
        }
    }
}

/// Which job and where it stands: shared by its reports and its row in the
/// job list.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct JobState {
    pub job: String,
    pub command: String,
    /// running or exited.
    pub status: JobStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub pid: u32,
    pub pty: bool,
}

impl JobState {
    /// "running", "exit 2", "killed by SIGKILL" or "exited".
    pub fn describe(&self) -> String {
        match (self.status, self.exit_code, &self.signal) {
            (JobStatus::Running, _, _) => "running".to_string(),
            (_, Some(code), _) => format!("exit {code}"),
            (_, None, Some(sig)) => format!("killed by {sig}"),
            _ => "exited".to_string(),
        }
    }

    /// The state of `job`, `exit` if it has exited.
    fn of(job: &Job, exit: Option<&ExitInfo>) -> Self {
        JobState {
            job: job.id.clone(),
            command: job.command.clone(),
            status: JobStatus::of(exit),
            exit_code: exit.and_then(|e| e.code),
            signal: exit.and_then(ExitInfo::signal_name),
            pid: job.process.pid(),
            pty: job.pty,
        }
    }
}

/// What a job call returns.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub state: JobState,
    pub output: RenderedOutput,
    pub elapsed_ms: f64,
    pub notes: Vec<String>,
}

impl JobReport {
    pub fn is_error(&self) -> bool {
        self.state.status == JobStatus::Exited && self.state.exit_code != Some(0)
    }

    /// The report of `job`, `exit` if it has exited (and its output is in).
    pub(super) fn new(
        job: &Job,
        exit: Option<&ExitInfo>,
        output: RenderedOutput,
        elapsed_ms: f64,
        notes: Vec<String>,
    ) -> Self {
        JobReport {
            state: JobState::of(job, exit),
            output,
            elapsed_ms,
            notes,
        }
    }

    /// `self` then `later`: the output of both, the state of `later`.
    pub(super) fn merge(mut self, later: JobReport) -> JobReport {
        self.output.combined.push_str(&later.output.combined);
        self.output.stdout.push_str(&later.output.stdout);
        self.output.stderr.push_str(&later.output.stderr);
        self.output.total_bytes += later.output.total_bytes;
        self.output.omitted_bytes += later.output.omitted_bytes;
        self.notes.extend(later.notes);
        JobReport {
            output: self.output,
            notes: self.notes,
            ..later
        }
    }
}

/// A row of the job list.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct JobInfo {
    #[serde(flatten)]
    pub state: JobState,
    pub age_s: f64,
}

impl JobInfo {
    /// The row of `job`, `exit` if it has exited.
    pub(super) fn new(job: &Job, exit: Option<&ExitInfo>) -> Self {
        JobInfo {
            state: JobState::of(job, exit),
            age_s: job.started.elapsed().as_secs_f64(),
        }
    }
}
