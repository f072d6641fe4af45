//! Where `bash` runs a command when the editor offers terminals of its own: `Terminals`, the seam
//! the protocol layer implements over ACP's `terminal/*` requests (no ACP type crosses it), and
//! `run`, the one driver of such a command: create (the editor embeds the live terminal in the
//! call), wait for its exit under the call's timeout and cancellation, read its output, kill it
//! on cancellation or timeout, and release it always — also when the call's future is dropped.
//!
//! `bash` uses it only for a command no sandbox confines (`bash` decides): the editor spawns the
//! process, so kin's kernel confinement and its supervisor cannot reach it. The result text
//! follows the local path's rules: capped to its head and tail (`LIMITS`), `(no output)`,
//! `[exit code: N]`, the same timeout and abort errors. Unlike the local path the editor's
//! terminal interleaves stdout and stderr, and keeps only the last `LIMITS.total()` bytes of a
//! longer output, which the result says.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::ToolError;
use super::capture::{Capture, Limits};

/// One command for the editor's terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalCommand {
    /// The session whose call runs it (the editor shows the terminal there).
    pub session_id: String,
    /// The tool call the terminal is embedded in.
    pub call_id: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Where it runs; `None`: where the editor chooses.
    pub cwd: Option<PathBuf>,
    /// The most output the editor keeps (its tail).
    pub output_limit: u64,
    /// A note shown with the terminal on the call (why the command is not sandboxed).
    pub note: Option<String>,
}

/// How a terminal's command ended: its exit code, or the signal that ended it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TerminalExit {
    pub code: Option<u32>,
    pub signal: Option<String>,
}

/// A terminal's output so far, and whether the editor cut its beginning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TerminalText {
    pub output: String,
    pub truncated: bool,
}

/// The editor's terminals. `create` answers the terminal's id once the command started (and the
/// call shows it); every other method names that id. Each future is independent of `self`.
pub trait Terminals: Send + Sync + fmt::Debug {
    fn create(&self, command: TerminalCommand) -> BoxFuture<'static, io::Result<String>>;
    fn wait(&self, session_id: &str, terminal: &str) -> BoxFuture<'static, io::Result<TerminalExit>>;
    fn output(&self, session_id: &str, terminal: &str) -> BoxFuture<'static, io::Result<TerminalText>>;
    fn kill(&self, session_id: &str, terminal: &str) -> BoxFuture<'static, io::Result<()>>;
    /// Frees the terminal (killing its command if it still runs); its id is then unknown.
    fn release(&self, session_id: &str, terminal: &str) -> BoxFuture<'static, io::Result<()>>;
}

/// How long a kill, an output read or a release may take after the command's end, timeout or
/// cancellation before kin stops waiting for the editor.
const ANSWER_LIMIT: Duration = Duration::from_secs(2);

/// What `run` needs of `bash`'s result rules.
pub(super) struct Rules {
    pub limits: Limits,
    pub timeout_ms: u64,
    pub timed_out: fn(u64, &str) -> ToolError,
    pub aborted: fn() -> ToolError,
    pub with_exit_code: fn(String, i32) -> String,
}

/// A created terminal, released when this is dropped unless `release` ran: a call whose future
/// is dropped (a cancellation past its grace) still frees it, after a kill.
struct Held {
    terminals: Arc<dyn Terminals>,
    session: String,
    id: String,
    released: bool,
}

impl Held {
    async fn kill(&self) {
        if let Ok(Err(e)) = tokio::time::timeout(ANSWER_LIMIT, self.terminals.kill(&self.session, &self.id)).await {
            tracing::debug!(terminal = %self.id, "the editor could not kill the terminal: {e}");
        }
    }

    async fn output(&self) -> TerminalText {
        match tokio::time::timeout(ANSWER_LIMIT, self.terminals.output(&self.session, &self.id)).await {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => {
                TerminalText { output: format!("[the editor did not give the output: {e}]"), truncated: false }
            }
            Err(_) => TerminalText { output: "[the editor did not give the output in time]".into(), truncated: false },
        }
    }

    async fn release(mut self) {
        self.released = true;
        if let Ok(Err(e)) = tokio::time::timeout(ANSWER_LIMIT, self.terminals.release(&self.session, &self.id)).await {
            tracing::debug!(terminal = %self.id, "the editor could not release the terminal: {e}");
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let (kill, release) =
            (self.terminals.kill(&self.session, &self.id), self.terminals.release(&self.session, &self.id));
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let _ = tokio::time::timeout(ANSWER_LIMIT, kill).await;
                    let _ = tokio::time::timeout(ANSWER_LIMIT, release).await;
                });
            }
            Err(_) => tracing::warn!(terminal = %self.id, "no runtime left to release the editor's terminal"),
        }
    }
}

/// Releases a terminal whose creation is answered after its call gave up on it.
fn release_when_created(
    terminals: Arc<dyn Terminals>,
    session: String,
    created: tokio::task::JoinHandle<io::Result<String>>,
) {
    tokio::spawn(async move {
        if let Ok(Ok(id)) = created.await {
            drop(Held { terminals, session, id, released: false });
        }
    });
}

/// How the wait for the command ended.
enum Ending {
    Exited(io::Result<TerminalExit>),
    TimedOut,
    Aborted,
}

/// Runs `command` in one of the editor's terminals and answers the result text, as `bash` does.
pub(super) async fn run(
    terminals: Arc<dyn Terminals>,
    command: TerminalCommand,
    cancel: &CancellationToken,
    rules: Rules,
) -> Result<String, ToolError> {
    let session = command.session_id.clone();
    // The command's timeout counts from the call, so an editor that never answers the create
    // cannot hold the turn.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(rules.timeout_ms);
    let mut created = tokio::spawn(terminals.create(command));
    let id = tokio::select! {
        created = &mut created => created
            .map_err(io::Error::other)
            .and_then(|id| id)
            .map_err(|e| ToolError::new("SPAWN_FAILED", format!("the editor could not start the command in a terminal: {e}")))?,
        () = tokio::time::sleep_until(deadline) => {
            release_when_created(terminals, session, created);
            return Err(ToolError::new(
                "TIMEOUT",
                format!(
                    "the editor did not start the command in a terminal within {} ms (the command's timeout); \
                     it did not run here, and is stopped if the editor starts it later",
                    rules.timeout_ms
                ),
            ));
        }
        () = cancel.cancelled() => {
            release_when_created(terminals, session, created);
            return Err((rules.aborted)());
        }
    };
    let held = Held { terminals: terminals.clone(), session: session.clone(), id: id.clone(), released: false };
    let ending = tokio::select! {
        exit = terminals.wait(&session, &id) => Ending::Exited(exit),
        () = tokio::time::sleep_until(deadline) => Ending::TimedOut,
        () = cancel.cancelled() => Ending::Aborted,
    };
    let result = match ending {
        Ending::Aborted => {
            held.kill().await;
            Err((rules.aborted)())
        }
        Ending::TimedOut => {
            held.kill().await;
            let output = render(&held.output().await, rules.limits);
            Err((rules.timed_out)(rules.timeout_ms, &output))
        }
        Ending::Exited(Err(e)) => {
            Err(ToolError::new("SPAWN_FAILED", format!("the editor's terminal did not report the command's end: {e}")))
        }
        Ending::Exited(Ok(exit)) => {
            let output = render(&held.output().await, rules.limits);
            Ok(match exit_code(&exit) {
                Some(code) => (rules.with_exit_code)(output, code),
                None => {
                    let signal = exit.signal.as_deref().unwrap_or("unknown");
                    let mut text = output;
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("[killed by signal: {signal}]"));
                    text
                }
            })
        }
    };
    held.release().await;
    result
}

/// The output as the result shows it: capped to `limits` (an editor may send more than it was
/// asked to keep), and saying when the editor cut its beginning.
fn render(text: &TerminalText, limits: Limits) -> String {
    let mut capture = Capture::new(limits);
    capture.push(text.output.as_bytes());
    let output = capture.render();
    if text.truncated {
        format!("[... earlier output omitted: the terminal keeps the last {} bytes ...]\n{output}", limits.total())
    } else {
        output
    }
}

/// The exit code the local path would report: the code, or 128 + the number of a known signal.
fn exit_code(exit: &TerminalExit) -> Option<i32> {
    if let Some(code) = exit.code {
        return Some(i32::try_from(code).unwrap_or(i32::MAX));
    }
    let name = exit.signal.as_deref()?.trim();
    let number = match name.parse::<i32>() {
        Ok(number) => number,
        Err(_) => signal_number(name.strip_prefix("SIG").unwrap_or(name))?,
    };
    Some(128 + number)
}

/// The number of a POSIX signal named without its `SIG` prefix (Linux numbering).
fn signal_number(name: &str) -> Option<i32> {
    const SIGNALS: [&str; 31] = [
        "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2", "PIPE", "ALRM",
        "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG", "XCPU", "XFSZ", "VTALRM", "PROF",
        "WINCH", "IO", "PWR", "SYS",
    ];
    let position = SIGNALS.iter().position(|s| s.eq_ignore_ascii_case(name))?;
    i32::try_from(position + 1).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_is_a_code_or_128_plus_a_known_signal() {
        let exit = |code: Option<u32>, signal: Option<&str>| TerminalExit { code, signal: signal.map(str::to_string) };
        assert_eq!(exit_code(&exit(Some(3), None)), Some(3));
        assert_eq!(exit_code(&exit(None, Some("SIGKILL"))), Some(137));
        assert_eq!(exit_code(&exit(None, Some("TERM"))), Some(143));
        assert_eq!(exit_code(&exit(None, Some("9"))), Some(137));
        assert_eq!(exit_code(&exit(None, Some("SIGNOPE"))), None);
        assert_eq!(exit_code(&exit(None, None)), None);
    }

    #[test]
    fn output_is_capped_and_a_cut_beginning_is_named() {
        let limits = Limits { head: 4, tail: 4 };
        let text = |output: &str, truncated| TerminalText { output: output.into(), truncated };
        assert_eq!(render(&text("hello", false), limits), "hello");
        assert_eq!(render(&text("0123456789", false), limits), "0123\n[... 2 bytes omitted ...]\n6789");
        assert_eq!(
            render(&text("tail", true), limits),
            "[... earlier output omitted: the terminal keeps the last 8 bytes ...]\ntail"
        );
    }
}
