//! The external agent's process: spawned as the leader of its own process group with piped
//! stdio, its stderr kept bounded (the last bytes, newlines or not) for error messages, and its
//! end: wait for it to exit after its stdin closed, then kill the whole group and wait the kill
//! grace. Every path reaps it; a process dropped mid-way has its group killed.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::ExternalAgentConfig;
use crate::subagent::{ErrorCode, SubagentError};
use crate::tools::capture::{Capture, Limits, snapshot, spawn_reader, utf8_start};

/// The agent's stderr keeps its last 4 KiB.
const STDERR_LIMITS: Limits = Limits { head: 0, tail: 4096 };
/// Stderr lines quoted in error messages.
const STDERR_LINES: usize = 8;
/// How long the stderr reader may take to catch up once the process exited.
const STDERR_SETTLE: Duration = Duration::from_millis(200);

/// One running agent process.
pub(crate) struct AgentProcess {
    child: Child,
    /// The process group the child leads (spawned with `process_group(0)`).
    pgid: Option<libc::pid_t>,
    stderr: Arc<Mutex<Capture>>,
    stderr_reader: Option<JoinHandle<()>>,
    provider: String,
    /// The child's sandbox (its private temp dir lives as long as the process).
    _sandbox: Option<crate::sandbox::Confined>,
}

impl AgentProcess {
    /// Starts `config.command` in `cwd` (when it exists here: a remote one, over ssh, need not);
    /// returns the process and its stdin and stdout.
    pub(crate) fn spawn(
        config: &ExternalAgentConfig,
        cwd: &Path,
    ) -> Result<(AgentProcess, ChildStdin, ChildStdout), SubagentError> {
        let mut command = Command::new(&config.command);
        command
            .args(&config.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        crate::signals::die_with_kin(&mut command);
        for (key, value) in &config.env {
            command.env(key, value);
        }
        if cwd.is_dir() {
            command.current_dir(cwd);
        }
        let start_failed = |cause: String| {
            SubagentError::new(ErrorCode::StartFailed, format!("subagent provider \"{}\": {cause}", config.name))
        };
        // `sandbox = ...`: the child runs confined by the kernel (it and everything it starts).
        let sandbox = match &config.sandbox {
            Some(settings) => crate::sandbox::confine_command(&mut command, settings, cwd).map_err(&start_failed)?,
            None => None,
        };
        let mut child =
            command.spawn().map_err(|e| start_failed(format!("cannot start the command {:?}: {e}", config.command)))?;
        let pgid = child.id().and_then(|id| libc::pid_t::try_from(id).ok()).filter(|pid| *pid > 1);
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(start_failed("the child agent's pipes are missing".into()));
        };
        let stderr = Arc::new(Mutex::new(Capture::new(STDERR_LIMITS)));
        let stderr_reader = Some(spawn_reader(child.stderr.take(), stderr.clone()));
        let process =
            AgentProcess { child, pgid, stderr, stderr_reader, provider: config.name.clone(), _sandbox: sandbox };
        Ok((process, stdin, stdout))
    }

    /// `message` followed by the agent's last stderr lines, when it wrote any.
    pub(crate) fn with_stderr(&self, message: String) -> String {
        let capture = snapshot(&self.stderr);
        let tail = capture.tail_bytes();
        // A line cut by the cap is no line: start after the first newline.
        let kept = match capture.omitted() {
            0 => &tail[..],
            _ => tail.iter().position(|b| *b == b'\n').map_or(&tail[utf8_start(&tail)..], |at| &tail[at + 1..]),
        };
        let text = String::from_utf8_lossy(kept);
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let quoted = lines[lines.len().saturating_sub(STDERR_LINES)..].join(" | ");
        if quoted.is_empty() {
            return message;
        }
        match capture.omitted() {
            0 => format!("{message}; its stderr ended with: {quoted}"),
            omitted => format!(
                "{message}; its stderr ({} bytes, the first {omitted} not kept) ended with: {quoted}",
                capture.total()
            ),
        }
    }

    /// The agent's exit status, when it exits within `wait`.
    pub(crate) async fn exit_within(&mut self, wait: Duration) -> Option<ExitStatus> {
        let status = tokio::time::timeout(wait, self.child.wait()).await.ok().and_then(Result::ok);
        if status.is_some() {
            self.settle_stderr().await;
        }
        status
    }

    /// Lets the last stderr output arrive for an error message.
    async fn settle_stderr(&mut self) {
        if let Some(task) = self.stderr_reader.as_mut()
            && tokio::time::timeout(STDERR_SETTLE, task).await.is_ok()
        {
            self.stderr_reader = None;
        }
    }

    /// Ends the agent, whose stdin is closed: waits for it until `eof_deadline`, then kills its
    /// process group and waits `kill_grace`. The process is reaped on every path.
    pub(crate) async fn shutdown(mut self, eof_deadline: Instant, kill_grace: Duration) {
        let exited = matches!(tokio::time::timeout_at(eof_deadline, self.child.wait()).await, Ok(Ok(_)));
        if !exited {
            tracing::debug!(provider = %self.provider, "killing the child agent");
            self.kill_group();
            let _ = self.child.start_kill();
            if !matches!(tokio::time::timeout(kill_grace, self.child.wait()).await, Ok(Ok(_))) {
                tracing::warn!(
                    provider = %self.provider,
                    "the child agent did not exit within {kill_grace:?} of being killed"
                );
            }
        }
        self.settle_stderr().await;
        tracing::debug!(provider = %self.provider, "child agent ended; {}", self.with_stderr("its run is over".into()));
    }

    /// SIGKILL to the agent's process group (the agent and whatever it started), while the agent
    /// is not yet reaped (so the group id cannot have been reused).
    fn kill_group(&self) {
        if self.child.id().is_none() {
            return;
        }
        if let Some(pgid) = self.pgid {
            // SAFETY: kill(2) only takes integers; a negative pid addresses the process group the
            // unreaped child leads.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for AgentProcess {
    // A run dropped mid-way (its future abandoned) still kills what it started; tokio reaps the
    // child (`kill_on_drop`).
    fn drop(&mut self) {
        self.kill_group();
        if let Some(task) = &self.stderr_reader {
            task.abort();
        }
    }
}

/// How an exit status reads in an error message.
pub(crate) fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "unknown status".to_string(),
    }
}
