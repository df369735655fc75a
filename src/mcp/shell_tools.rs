//! Shell job tools: shell_exec, shell_wait, shell_input, shell_kill,
//! shell_jobs, shell_output.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, RequestMetaObject};
use rmcp::{ErrorData as McpError, Peer, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::args::{Parameters, Seconds, SignalArg, secs};
use super::output_tool::{self, OutputParams, OutputWindow};
use super::render;
use super::server::FerreplServer;
use super::text::clean;
use crate::jobs::{Job, JobInfo, JobReport, JobSpec, JobStatus, parse_signal};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShellExecParams {
    /// Shell command, run as `/bin/sh -c COMMAND` in its own process group.
    pub command: String,
    /// Seconds to wait before returning status "running" (the job keeps running; collect it
    /// with shell_wait). Default 30.
    #[serde(default)]
    pub wait_s: Option<Seconds>,
    /// Working directory (relative to the server's workdir). Default: the workdir.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Text given to the command's stdin, which is then closed. Without it stdin stays open
    /// for shell_input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Run in a pseudo-terminal (for programs that need one); stdout and stderr are then one
    /// stream. Default false.
    #[serde(default)]
    pub pty: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShellWaitParams {
    /// Job id, e.g. "j3".
    pub job: String,
    /// Longest time to wait for the job to exit, in seconds. Default 30.
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShellInputParams {
    /// Job id.
    pub job: String,
    /// A line for the job's stdin (a newline is added).
    #[serde(default)]
    pub text: String,
    /// Close stdin after the text (Ctrl-D on a pty). Default false.
    #[serde(default)]
    pub eof: Option<bool>,
    /// Seconds to wait afterwards for the job to exit. Default 0: return at once.
    #[serde(default)]
    pub wait_s: Option<Seconds>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShellKillParams {
    /// Job id.
    pub job: String,
    /// Signal name or number (TERM, KILL, INT, HUP...). Default TERM, followed by KILL if the
    /// job is still running 2 s later.
    #[serde(default)]
    pub signal: Option<SignalArg>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShellOutputParams {
    /// Job id.
    pub job: String,
    /// Window start: characters from 0, or a line number from 1 with `lines`.
    #[serde(default)]
    pub offset: Option<u64>,
    /// Window size: characters (default 20000, at most 200000), or lines with `lines`
    /// (default 200, at most 10000).
    #[serde(default)]
    pub limit: Option<u64>,
    /// Count offset and limit in lines.
    #[serde(default)]
    pub lines: Option<bool>,
    /// Regular expression: only matching lines (numbered), with `context` lines around.
    #[serde(default)]
    pub grep: Option<String>,
    /// Context lines around grep matches. Default 1, at most 20.
    #[serde(default)]
    pub context: Option<u64>,
}

/// structuredContent of shell_exec, shell_wait, shell_input and shell_kill.
#[derive(Debug, Serialize, JsonSchema)]
pub struct JobOutput {
    pub job: String,
    pub command: String,
    /// running or exited.
    pub status: JobStatus,
    /// Exit code, when the job exited normally.
    pub exit_code: Option<i32>,
    /// Signal that ended the job (e.g. SIGKILL), if any.
    pub signal: Option<String>,
    pub pid: u32,
    pub pty: bool,
    /// Output returned by this call (only what was not shown before).
    pub stdout: String,
    pub stderr: String,
    pub output_bytes: u64,
    pub omitted_bytes: u64,
    pub elapsed_ms: f64,
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct JobsOutput {
    pub jobs: Vec<JobInfo>,
}

fn job_result(r: &JobReport) -> CallToolResult {
    let mut text = String::new();
    for n in &r.notes {
        text.push_str(&format!("[ferrepl] {n}\n"));
    }
    let body = clean(&r.output.combined);
    text.push_str(&body);
    if !body.is_empty() && !body.ends_with('\n') {
        text.push('\n');
    }
    let state = match (r.status, r.exit_code, &r.signal) {
        (JobStatus::Running, _, _) => {
            text.push_str(&format!(
                "[ferrepl] job {} is still running; call shell_wait to keep waiting, shell_input to type into it, or shell_kill to stop it.\n",
                r.job
            ));
            "running".to_string()
        }
        (_, Some(code), _) => format!("exit {code}"),
        (_, None, Some(sig)) => format!("killed by {sig}"),
        _ => "exited".to_string(),
    };
    let secs = r.elapsed_ms / 1000.0;
    text.push_str(&format!(
        "-- {state} | job {} | pid {} | {secs:.1} s --",
        r.job, r.pid
    ));
    let out = JobOutput {
        job: r.job.clone(),
        command: r.command.clone(),
        status: r.status,
        exit_code: r.exit_code,
        signal: r.signal.clone(),
        pid: r.pid,
        pty: r.pty,
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

#[tool_router(router = shell_router, vis = "pub(super)")]
impl FerreplServer {
    #[tool(
        description = "Run a shell command (/bin/sh -c) as a background job in its own process group. Returns when it exits \
(exit code; isError for non-zero) or after wait_s with status 'running' and the output so far; then use shell_wait, \
shell_input (stdin), shell_kill. pty=true runs it in a terminal. Long output is cut to its head and tail; shell_output reads it all. \
Example: {\"command\": \"pytest -x -q\", \"wait_s\": 120}.",
        output_schema = schema_for_output::<JobOutput>(),
        annotations(title = "Run a shell command", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = true)
    )]
    async fn shell_exec(
        &self,
        Parameters(p): Parameters<ShellExecParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let spec = JobSpec {
            command: p.command,
            cwd: p.cwd.map(Into::into),
            env: p.env.unwrap_or_default(),
            stdin: p.stdin,
            pty: p.pty.unwrap_or(false),
            shown: None,
            egress: false,
        };
        let job = match self.jobs.start(spec) {
            Ok(j) => j,
            Err(e) => return Ok(render::tool_error(e)),
        };
        let wait = self.manager.wait_window(secs(p.wait_s));
        Ok(self.drive_job(job, wait, meta, peer, ct, true).await)
    }

    #[tool(
        description = "Wait for a shell job: returns as soon as it exits or wait_s runs out, with only the output not shown \
before. Example: {\"job\": \"j1\", \"wait_s\": 60}.",
        output_schema = schema_for_output::<JobOutput>(),
        annotations(title = "Wait for a job", read_only_hint = true, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn shell_wait(
        &self,
        Parameters(p): Parameters<ShellWaitParams>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, McpError> {
        let job = match self.jobs.get(&p.job) {
            Ok(j) => j,
            Err(e) => return Ok(render::tool_error(e)),
        };
        let wait = self.manager.wait_window(secs(p.wait_s));
        Ok(self.drive_job(job, wait, meta, peer, ct, false).await)
    }

    #[tool(
        description = "Type a line into a running job's stdin (a newline is added); eof=true closes stdin afterwards. \
Returns the job's state and new output (after wait_s, default 0). Example: {\"job\": \"j2\", \"text\": \"yes\"}.",
        output_schema = schema_for_output::<JobOutput>(),
        annotations(title = "Send input to a job", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn shell_input(
        &self,
        Parameters(p): Parameters<ShellInputParams>,
    ) -> Result<CallToolResult, McpError> {
        let job = match self
            .jobs
            .input(&p.job, &p.text, p.eof.unwrap_or(false))
            .await
        {
            Ok(j) => j,
            Err(e) => return Ok(render::tool_error(e)),
        };
        let wait = match p.wait_s {
            Some(_) => self.manager.wait_window(secs(p.wait_s)),
            None => std::time::Duration::ZERO,
        };
        Ok(job_result(&self.jobs.wait(&job, wait).await))
    }

    #[tool(
        description = "Stop a job: send a signal to its whole process group (children included). Default TERM, then KILL if \
it is still running 2 s later. Returns the final result. Example: {\"job\": \"j1\"} or {\"job\": \"j1\", \"signal\": \"INT\"}.",
        output_schema = schema_for_output::<JobOutput>(),
        annotations(title = "Kill a job", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn shell_kill(
        &self,
        Parameters(p): Parameters<ShellKillParams>,
    ) -> Result<CallToolResult, McpError> {
        let signal = match parse_signal(p.signal.as_ref().map_or("TERM", SignalArg::as_str)) {
            Ok(s) => s,
            Err(e) => return Ok(render::tool_error(e)),
        };
        Ok(match self.jobs.kill(&p.job, signal).await {
            Ok(report) => job_result(&report),
            Err(e) => render::tool_error(e),
        })
    }

    #[tool(
        description = "List shell jobs: id, command, status (running/exited), exit code or signal, pid, age. Finished jobs are \
kept for a while (see server_status). Example: {}.",
        output_schema = schema_for_output::<JobsOutput>(),
        annotations(title = "List jobs", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn shell_jobs(&self) -> Result<CallToolResult, McpError> {
        let jobs = self.jobs.list();
        let mut text = String::new();
        if jobs.is_empty() {
            text.push_str("no jobs; shell_exec starts one\n");
        }
        for j in &jobs {
            let state = match (j.status, j.exit_code, &j.signal) {
                (JobStatus::Running, _, _) => "running".to_string(),
                (_, Some(c), _) => format!("exit {c}"),
                (_, None, Some(s)) => format!("killed by {s}"),
                _ => "exited".into(),
            };
            text.push_str(&format!(
                "{}: {state}, pid {}, {:.0} s ago{}: {}\n",
                j.job,
                j.pid,
                j.age_s,
                if j.pty { ", pty" } else { "" },
                j.command
            ));
        }
        Ok(render::structured(text, &JobsOutput { jobs }))
    }

    #[tool(
        description = "Read a job's full output: a window by characters or lines, or the lines matching a regular expression. \
Example: {\"job\": \"j1\", \"grep\": \"FAILED|Error\"}.",
        output_schema = schema_for_output::<OutputWindow>(),
        annotations(title = "Read a job's output", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn shell_output(
        &self,
        Parameters(p): Parameters<ShellOutputParams>,
    ) -> Result<CallToolResult, McpError> {
        let (job, bytes, dropped, running) = match self.jobs.output(&p.job) {
            Ok(found) => found,
            Err(e) => return Ok(render::tool_error(e)),
        };
        let params = OutputParams {
            session: None,
            cell: None,
            offset: p.offset,
            limit: p.limit,
            lines: p.lines,
            grep: p.grep,
            context: p.context,
        };
        let source = output_tool::Source {
            origin: output_tool::Origin::Job(job.id().to_string()),
            running,
            bytes,
            dropped,
        };
        Ok(match output_tool::window(source, &params) {
            Ok(w) => render::structured(output_tool::render(&w, params.lines.unwrap_or(false)), &w),
            Err(e) => render::tool_error(e),
        })
    }
}

impl FerreplServer {
    /// Waits for a job while sending progress notifications; a cancelled
    /// shell_exec interrupts the job (SIGINT to its group).
    pub(super) async fn drive_job(
        &self,
        job: Arc<Job>,
        wait: std::time::Duration,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        ct: CancellationToken,
        interrupt_on_cancel: bool,
    ) -> CallToolResult {
        let token = meta.get_progress_token();
        let every = std::time::Duration::from_secs(1);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let fut = self.jobs.wait(&job, wait);
        tokio::pin!(fut);
        loop {
            tokio::select! {
                report = &mut fut => return job_result(&report),
                _ = ticker.tick(), if token.is_some() => {
                    if let (Some(token), Some((elapsed, line))) = (&token, self.jobs.progress(&job)) {
                        let message = format!("job {} running for {elapsed:.0} s{}", job.id(),
                            if line.is_empty() { String::new() } else { format!(": {line}") });
                        let _ = peer
                            .notify_progress(ProgressNotificationParam::new(token.clone(), elapsed).with_message(message))
                            .await;
                    }
                }
                _ = ct.cancelled() => {
                    if interrupt_on_cancel {
                        self.jobs.interrupt(&job);
                        return render::tool_error(format!("the call was cancelled by the client; job {} was sent SIGINT", job.id()));
                    }
                    return render::tool_error(format!("the call was cancelled by the client; job {} keeps running", job.id()));
                }
            }
        }
    }
}
