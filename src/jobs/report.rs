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

/// What a job call returns.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub job: String,
    pub command: String,
    pub status: JobStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub pid: u32,
    pub pty: bool,
    pub output: RenderedOutput,
    pub elapsed_ms: f64,
    pub notes: Vec<String>,
}

impl JobReport {
    pub fn is_error(&self) -> bool {
        self.status == JobStatus::Exited && self.exit_code != Some(0)
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
            job: job.id.clone(),
            command: job.command.clone(),
            status: JobStatus::of(exit),
            exit_code: exit.and_then(|e| e.code),
            signal: exit.and_then(ExitInfo::signal_name),
            pid: job.process.pid(),
            pty: job.pty,
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

/// A row of shell_jobs.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct JobInfo {
    pub job: String,
    pub command: String,
    /// running or exited.
    pub status: JobStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub pid: u32,
    pub pty: bool,
    pub age_s: f64,
}

impl JobInfo {
    /// The row of `job`, `exit` if it has exited.
    pub(super) fn new(job: &Job, exit: Option<&ExitInfo>) -> Self {
        JobInfo {
            job: job.id.clone(),
            command: job.command.clone(),
            status: JobStatus::of(exit),
            exit_code: exit.and_then(|e| e.code),
            signal: exit.and_then(ExitInfo::signal_name),
            pid: job.process.pid(),
            pty: job.pty,
            age_s: job.started.elapsed().as_secs_f64(),
        }
    }
}
