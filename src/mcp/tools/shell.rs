//! Shell job tools: shell_exec, shell_wait (which also feeds, signals and
//! lists jobs) and shell_output.

use std::sync::Arc;

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router};

use crate::jobs::{Job, JobInfo, JobReport, JobSpec, JobStatus, parse_signal};
use crate::mcp::args::{Parameters, secs};
use crate::mcp::call::Call;
use crate::mcp::error::{ToolError, ToolResult};
use crate::mcp::render;
use crate::mcp::server::FerreplServer;
use crate::mcp::surface::{JobOutput, JobsOutput, OutputWindow};
use crate::mcp::surface::{ShellExecParams, ShellOutputParams, ShellWaitParams};
use crate::mcp::window;
use crate::output::text::clean;

/// How to go on with a job still running, for shell jobs.
pub(crate) const SHELL_HINT: &str =
    "call shell_wait to keep waiting, give it input, or stop it with a signal.";

pub(crate) fn job_result(r: &JobReport, hint: &str) -> CallToolResult {
    let mut text = String::new();
    for n in &r.notes {
        text.push_str(&format!("[ferrepl] {n}\n"));
    }
    let body = clean(&r.output.combined);
    text.push_str(&body);
    if !body.is_empty() && !body.ends_with('\n') {
        text.push('\n');
    }
    let s = &r.state;
    if s.status == JobStatus::Running {
        text.push_str(&format!(
            "[ferrepl] job {} is still running; {hint}\n",
            s.job
        ));
    }
    let secs = r.elapsed_ms / 1000.0;
    text.push_str(&format!(
        "-- {} | job {} | pid {} | {secs:.1} s --",
        s.describe(),
        s.job,
        s.pid
    ));
    let out = JobOutput {
        state: s.clone(),
        stdout: clean(&r.output.stdout),
        stderr: clean(&r.output.stderr),
        output_bytes: r.output.total_bytes,
        omitted_bytes: r.output.omitted_bytes,
        elapsed_ms: r.elapsed_ms,
        notes: r.notes.clone(),
    };
    let content = vec![ContentBlock::text(text)];
    let mut result = if r.is_error() {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = serde_json::to_value(out).ok();
    result
}

#[tool_router(router = shell_router, vis = "pub(crate)")]
impl FerreplServer {
    #[tool(output_schema = schema_for_output::<JobOutput>())]
    async fn shell_exec(&self, args: Parameters<ShellExecParams>, call: Call) -> ToolResult {
        let p = args.0;
        // `python` on the job's PATH is the kept venv's once it is made; a
        // failure here shows when a session starts, not in the job.
        let _ = self.manager.ready_venv("default").await;
        let sandbox = self.client_job_sandbox(&call)?;
        let spec = JobSpec {
            command: p.command,
            cwd: p.cwd.map(Into::into),
            env: p.env.unwrap_or_default(),
            stdin: p.stdin,
            pty: p.pty.unwrap_or(false),
            shown: None,
            egress: false,
            reader: None,
            extra_read: Vec::new(),
            sandbox,
        };
        let job = self.jobs.start(spec)?;
        let wait = call.window(&self.manager, p.wait_s);
        let report = self.drive_job(job, wait, call, true).await?;
        Ok(job_result(&report, SHELL_HINT))
    }

    #[tool]
    async fn shell_wait(&self, args: Parameters<ShellWaitParams>, call: Call) -> ToolResult {
        let p = args.0;
        let Some(id) = p.job else {
            if p.input.is_some() || p.eof.is_some() || p.signal.is_some() {
                return Err(ToolError::new(
                    "name the job (e.g. \"j1\") to give it input or a signal; shell_wait {} lists the jobs",
                ));
            }
            return Ok(jobs_listing(&self.jobs.list()));
        };
        if let Some(signal) = &p.signal {
            if p.input.is_some() || p.eof.is_some() {
                return Err(ToolError::new("give either input/eof or signal, not both"));
            }
            let signal = parse_signal(signal.as_str())?;
            return Ok(job_result(&self.jobs.kill(&id, signal).await?, SHELL_HINT));
        }
        if p.input.is_some() || p.eof.is_some() {
            let text = p.input.unwrap_or_default();
            let job = self.jobs.input(&id, &text, p.eof.unwrap_or(false)).await?;
            let wait = match p.wait_s {
                Some(_) => self.manager.wait_window(secs(p.wait_s)),
                None => std::time::Duration::ZERO,
            };
            return Ok(job_result(&self.jobs.wait(&job, wait).await, SHELL_HINT));
        }
        let job = self.jobs.get(&id)?;
        let wait = self.manager.wait_window(secs(p.wait_s));
        let report = self.drive_job(job, wait, call, false).await?;
        Ok(job_result(&report, SHELL_HINT))
    }

    #[tool(output_schema = schema_for_output::<OutputWindow>())]
    async fn shell_output(&self, Parameters(p): Parameters<ShellOutputParams>) -> ToolResult {
        let (job, bytes, dropped, running) = self.jobs.output(&p.job)?;
        let source = window::Source {
            origin: window::Origin::Job(job.id().to_string()),
            running,
            bytes,
            dropped,
        };
        window::reply(source, &p.window)
    }
}

/// The text (and structured form) of a jobs listing.
fn jobs_listing(jobs: &[JobInfo]) -> CallToolResult {
    let mut text = String::new();
    if jobs.is_empty() {
        text.push_str("no jobs; shell_exec starts one\n");
    }
    for j in jobs {
        let s = &j.state;
        text.push_str(&format!(
            "{}: {}, pid {}, {:.0} s ago{}: {}\n",
            s.job,
            s.describe(),
            s.pid,
            j.age_s,
            if s.pty { ", pty" } else { "" },
            s.command
        ));
    }
    render::structured(
        text,
        &JobsOutput {
            jobs: jobs.to_vec(),
        },
    )
}

impl FerreplServer {
    /// Waits for a job while sending progress notifications; a cancelled
    /// shell_exec interrupts the job (SIGINT to its group).
    pub(crate) async fn drive_job(
        &self,
        job: Arc<Job>,
        wait: std::time::Duration,
        call: Call,
        interrupt_on_cancel: bool,
    ) -> Result<JobReport, ToolError> {
        let mut ticker = call.ticker();
        let fut = self.jobs.wait(&job, wait);
        tokio::pin!(fut);
        loop {
            tokio::select! {
                report = &mut fut => return Ok(report),
                _ = ticker.tick(), if call.wants_progress() => {
                    if let Some((elapsed, line)) = self.jobs.progress(&job) {
                        call.report(elapsed, &format!("job {}", job.id()), &line).await;
                    }
                }
                _ = call.cancelled() => {
                    if interrupt_on_cancel {
                        self.jobs.interrupt(&job);
                        return Err(ToolError::new(format!("the call was cancelled by the client; job {} was sent SIGINT", job.id())));
                    }
                    return Err(ToolError::new(format!("the call was cancelled by the client; job {} keeps running", job.id())));
                }
            }
        }
    }
}
