//! Starting one MCP server and the handshake, under the server's startup timeout.
//!
//! A stdio server runs exactly the given command and arguments in the session cwd, in its own
//! process group, with a cleared environment: only `PATH` and `HOME` (kin's own, so a bare
//! `npx` is found) and the given variables, so kin's API keys never reach it. Its stderr goes to
//! kin's log at debug level (lines cut at 4 KiB, 1 MiB per server, then only a note), and its
//! last lines are kept for the notice of a failure. Closing gives the server a grace to exit
//! (stdin closed, then SIGTERM), then kills its whole process group.
//!
//! An HTTP server is reached over streamable HTTP with the given headers (the ones the transport
//! owns — `Accept`, `Mcp-Session-Id`, `Last-Event-Id` — are dropped with a warning).

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientCacheConfig, ClientHandler, MAX_CLIENT_CACHE_TTL, Peer, RoleClient, ServiceExt};
use tokio::io::AsyncReadExt;

use super::spec::Transport;
use crate::tools::capture::{MAX_ERROR_TEXT_BYTES, cut};

/// How long a closing server may take to exit before its process group is killed.
pub(super) const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The longest stderr line logged (the rest of the line is dropped).
const MAX_LINE: usize = 4096;
/// How much of a server's stderr is logged at most.
const MAX_LOGGED: usize = 1024 * 1024;
/// How many stderr lines a failure notice quotes.
const TAIL_LINES: usize = 8;

/// The `PATH` a server gets when kin itself has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// kin as an MCP client: no sampling, roots or elicitation; the handshake pinned to the last
/// protocol revision that has one (servers negotiate down from it).
#[derive(Clone)]
pub(super) struct Handler;

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("kin", env!("CARGO_PKG_VERSION")))
            .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!("an MCP server's tool list changed");
    }
}

/// The last lines a server wrote to stderr.
#[derive(Default)]
pub(super) struct StderrTail(Mutex<VecDeque<String>>);

impl StderrTail {
    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The kept lines, oldest first.
    pub(super) fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }
}

/// A live connection to one server.
pub(super) struct Connection {
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, Handler>>>,
    pub peer: Peer<RoleClient>,
    /// The process group of a stdio server.
    pgid: Option<i32>,
    /// A stdio server's process (killed if dropped), waited for at close.
    child: tokio::sync::Mutex<Option<tokio::process::Child>>,
}

impl Connection {
    /// A started connection. Its `tools/list` answers are kept until the server says its tool
    /// list changed (rmcp drops them when the notification arrives, in order with the results
    /// after it), so listing at every step asks the server only after a change.
    async fn new(
        service: RunningService<RoleClient, Handler>,
        pgid: Option<i32>,
        child: Option<tokio::process::Child>,
    ) -> Connection {
        let peer = service.peer().clone();
        peer.set_response_cache_config(ClientCacheConfig::default().with_default_ttl(MAX_CLIENT_CACHE_TTL)).await;
        Connection {
            service: tokio::sync::Mutex::new(Some(service)),
            peer,
            pgid,
            child: tokio::sync::Mutex::new(child),
        }
    }

    /// Whether the connection has ended (the server exited or hung up).
    pub(super) fn is_closed(&self) -> bool {
        self.peer.is_transport_closed()
    }

    /// Closes the connection: a stdio server's stdin is closed, it gets half of `CLOSE_GRACE` to
    /// exit, then SIGTERM and the other half; then its process group is killed.
    pub(super) async fn close(&self) {
        if let Some(mut service) = self.service.lock().await.take() {
            let _ = service.close_with_timeout(CLOSE_GRACE / 2).await;
        }
        if let Some(mut child) = self.child.lock().await.take()
            && tokio::time::timeout(CLOSE_GRACE / 2, child.wait()).await.is_err()
        {
            signal_group(self.pgid, libc::SIGTERM);
            if tokio::time::timeout(CLOSE_GRACE / 2, child.wait()).await.is_err() {
                tracing::debug!("an MCP server did not exit within the grace; killing its process group");
            }
        }
        signal_group(self.pgid, libc::SIGKILL);
    }
}

/// Kills a process group when dropped, unless disarmed: a start abandoned midway (its future
/// dropped when the session closes) leaves no process behind.
struct GroupGuard(Option<i32>);

impl GroupGuard {
    fn disarm(mut self) -> Option<i32> {
        self.0.take()
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        signal_group(self.0, libc::SIGKILL);
    }
}

/// Signals a process group (nothing when there is none or it is gone).
fn signal_group(pgid: Option<i32>, signal: libc::c_int) {
    if let Some(pgid) = pgid.filter(|p| *p > 1) {
        // SAFETY: killpg only sends a signal; a stale or missing group gives ESRCH, ignored.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

/// The most bytes of one message kin takes from a stdio server (rmcp's own limit, which it
/// enforces by dropping the line unseen, so a call waited for its timeout).
pub(super) const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// The pipe between the relay and rmcp.
const RELAY_BYTES: usize = 64 * 1024;

/// Hands a stdio server's messages to rmcp (`into`), each at most `MAX_MESSAGE_BYTES`. A longer
/// one (or one that is not UTF-8) is read to its end and dropped: when it answers a request of
/// kin's, rmcp gets an error answer to that request instead, saying why, so the call fails at
/// once with the reason; anything else is noted in the log and the server's stderr tail. Ends
/// (rmcp sees the server hang up) when the server's stdout does.
async fn relay(
    name: String,
    stdout: tokio::process::ChildStdout,
    mut into: tokio::io::DuplexStream,
    tail: Arc<StderrTail>,
) {
    use crate::jsonrpc::{Frame, Shape, next_frame};
    use tokio::io::AsyncWriteExt;
    use tokio_util::compat::TokioAsyncReadCompatExt;
    let mut reader = futures::io::BufReader::with_capacity(RELAY_BYTES, stdout.compat());
    while let Ok(Some(frame)) = next_frame(&mut reader, MAX_MESSAGE_BYTES).await {
        let (why, prefix) = match frame {
            Frame::Line(line) => {
                if into.write_all(line.as_bytes()).await.is_err() || into.write_all(b"\n").await.is_err() {
                    return;
                }
                continue;
            }
            Frame::Oversize { bytes, prefix } => (
                format!(
                    "its message of {bytes} bytes is larger than the {MAX_MESSAGE_BYTES} bytes kin reads and was dropped"
                ),
                prefix,
            ),
            Frame::NotUtf8 { prefix } => ("its message is not valid UTF-8 and was dropped".to_string(), prefix),
        };
        let shape = Shape::of(&prefix);
        tracing::warn!(server = %name, "MCP server {name}: {why}");
        tail.push(format!("(kin: {why})"));
        if shape.is_response() {
            let answer = serde_json::json!({
                "jsonrpc": "2.0",
                "id": shape.id(),
                "error": {"code": -32603, "message": format!("the MCP server {name} answered, but {why}")},
            });
            if into.write_all(format!("{answer}\n").as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// Why a server could not be used.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StartError {
    pub reason: String,
    pub stderr: Vec<String>,
}

/// Starts the server and runs the handshake within `timeout`. `tail` collects its stderr.
pub(super) async fn connect(
    name: &str,
    transport: &Transport,
    cwd: Option<&Path>,
    timeout: Duration,
    tail: Arc<StderrTail>,
) -> Result<Connection, StartError> {
    let fail = |reason: String, tail: &StderrTail| StartError { reason, stderr: tail.lines() };
    let handler = Handler;
    let timed_out = || {
        format!(
            "it did not complete the MCP handshake within {} s (raise startup_timeout_secs if it needs longer)",
            timeout.as_secs_f64()
        )
    };
    match transport {
        Transport::Stdio { command, args, env } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args).env_clear().envs(child_env(env)).process_group(0).kill_on_drop(true);
            crate::signals::die_with_kin(&mut cmd);
            if let Some(cwd) = cwd.filter(|c| c.is_dir()) {
                cmd.current_dir(cwd);
            }
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            let mut child = cmd.spawn().map_err(|e| match e.kind() {
                // The file is there: what is missing is the interpreter its `#!` line names.
                std::io::ErrorKind::NotFound if command.contains('/') && Path::new(command).is_file() => fail(
                    format!("the command `{command}` could not be started: the interpreter its `#!` line names was not found"),
                    &tail,
                ),
                std::io::ErrorKind::NotFound => fail(format!("the command `{command}` was not found"), &tail),
                std::io::ErrorKind::PermissionDenied => {
                    fail(format!("the command `{command}` is not executable"), &tail)
                }
                _ => fail(format!("the command `{command}` could not be started: {e}"), &tail),
            })?;
            let group = GroupGuard(child.id().and_then(|pid| i32::try_from(pid).ok()));
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                return Err(fail("its standard streams could not be opened".into(), &tail));
            };
            let reader = tokio::spawn(read_stderr(name.to_string(), stderr, tail.clone()));
            let (relayed, from_server) = tokio::io::duplex(RELAY_BYTES);
            tokio::spawn(relay(name.to_string(), stdout, from_server, tail.clone()));
            let started = tokio::time::timeout(timeout, handler.serve((relayed, stdin))).await;
            let service = match started {
                Ok(Ok(service)) => service,
                Ok(Err(e)) => {
                    // The last words of a server that exited are worth waiting a moment for, and
                    // so is its exit status.
                    let _ = tokio::time::timeout(Duration::from_millis(500), reader).await;
                    let exited = tokio::time::timeout(Duration::from_millis(500), child.wait()).await;
                    drop(group);
                    let reason = match exited {
                        Ok(Ok(status)) => format!("it exited ({status}) before completing the MCP handshake"),
                        _ => handshake_error(&e.to_string()),
                    };
                    return Err(fail(reason, &tail));
                }
                Err(_) => {
                    drop(group);
                    return Err(fail(timed_out(), &tail));
                }
            };
            let pgid = group.disarm();
            Ok(Connection::new(service, pgid, Some(child)).await)
        }
        Transport::Http { url, headers } => {
            if !reqwest::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https")) {
                return Err(fail(format!("its URL `{url}` is not a valid http or https URL"), &tail));
            }
            install_crypto_provider();
            let headers = http_headers(headers).map_err(|reason| fail(reason, &tail))?;
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
            let client = StreamableHttpClientTransport::from_config(config);
            let service = match tokio::time::timeout(timeout, handler.serve(client)).await {
                Ok(Ok(service)) => service,
                Ok(Err(e)) => return Err(fail(handshake_error(&e.to_string()), &tail)),
                Err(_) => return Err(fail(timed_out(), &tail)),
            };
            Ok(Connection::new(service, None, None).await)
        }
        Transport::Unsupported { kind } => Err(fail(format!("the `{kind}` transport is not supported"), &tail)),
    }
}

/// A handshake failure in words.
fn handshake_error(error: &str) -> String {
    if error.starts_with("connection closed") || error.contains("Broken pipe") {
        "it closed the connection before completing the MCP handshake (did it exit?)".into()
    } else {
        format!("the MCP handshake failed: {}", cut(error, MAX_ERROR_TEXT_BYTES))
    }
}

/// The child's environment: `PATH` and `HOME` from kin's, then the given variables.
fn child_env(given: &[(String, String)]) -> Vec<(String, String)> {
    let mut env = vec![("PATH".to_string(), std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.into()))];
    if let Ok(home) = std::env::var("HOME") {
        env.push(("HOME".into(), home));
    }
    for (key, value) in given {
        env.retain(|(k, _)| k != key);
        env.push((key.clone(), value.clone()));
    }
    env
}

/// Headers for the HTTP transport; the ones it owns are dropped.
fn http_headers(
    headers: &[(String, String)],
) -> Result<HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>, String> {
    let mut map = HashMap::new();
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if matches!(lower.as_str(), "accept" | "mcp-session-id" | "last-event-id") {
            tracing::warn!(header = %name, "dropping an MCP server header the HTTP transport sets itself");
            continue;
        }
        let header = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("the header name {name:?} is not a valid HTTP header name"))?;
        let value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| format!("the value of header {name:?} is not a valid HTTP header value"))?;
        map.insert(header, value);
    }
    Ok(map)
}

/// rmcp's HTTP client has no crypto provider of its own: ring (kin's model client already
/// uses it) becomes the process default, once.
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Logs a server's stderr at debug level, line by line, within the caps; keeps the tail.
async fn read_stderr(name: String, mut stderr: tokio::process::ChildStderr, tail: Arc<StderrTail>) {
    let mut logged = 0usize;
    let mut line: Vec<u8> = Vec::new();
    let mut cut = false;
    let mut buf = [0u8; 4096];
    let mut emit = |line: &mut Vec<u8>, cut: &mut bool| {
        let mut text = String::from_utf8_lossy(line).trim_end().to_string();
        if *cut {
            text.push('…');
        }
        line.clear();
        *cut = false;
        if logged < MAX_LOGGED {
            logged += text.len() + 1;
            tracing::debug!(server = %name, "MCP server stderr: {text}");
            if logged >= MAX_LOGGED {
                tracing::debug!(server = %name, "MCP server stderr: 1 MiB logged; the rest is not logged");
            }
        }
        tail.push(text);
    };
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &byte in &buf[..n] {
            if byte == b'\n' {
                emit(&mut line, &mut cut);
            } else if line.len() < MAX_LINE {
                line.push(byte);
            } else {
                cut = true;
            }
        }
    }
    if !line.is_empty() {
        emit(&mut line, &mut cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_environment_is_path_home_and_the_given_variables() {
        let env = child_env(&[("API_KEY".into(), "k".into()), ("PATH".into(), "/only/here".into())]);
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert!(keys.iter().all(|k| ["PATH", "HOME", "API_KEY"].contains(k)), "{keys:?}");
        assert!(env.contains(&("PATH".into(), "/only/here".into())));
        assert!(env.contains(&("API_KEY".into(), "k".into())));
    }

    #[test]
    fn transport_owned_and_invalid_headers() {
        let map = http_headers(&[("Authorization".into(), "Bearer t".into()), ("Accept".into(), "x".into())]).unwrap();
        assert_eq!(map.len(), 1);
        assert_eq!(map[&reqwest::header::AUTHORIZATION], "Bearer t");
        let err = http_headers(&[("bad name".into(), "v".into())]).unwrap_err();
        assert!(err.contains("\"bad name\""), "{err}");
        let err = http_headers(&[("X-Ok".into(), "line\nbreak".into())]).unwrap_err();
        assert!(err.contains("X-Ok"), "{err}");
    }

    #[tokio::test]
    async fn stderr_lines_are_cut_and_the_tail_kept() {
        let tail = Arc::new(StderrTail::default());
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 12 ]; do echo line$i >&2; i=$((i+1)); done; head -c 5000 /dev/zero | tr '\\0' x >&2"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        read_stderr("t".into(), stderr, tail.clone()).await;
        child.wait().await.unwrap();
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines[0], "line5");
        let last = lines.last().unwrap();
        assert_eq!(last.len(), MAX_LINE + '…'.len_utf8());
        assert!(last.ends_with('…'));
    }

    #[test]
    fn a_long_handshake_error_is_cut_and_says_so() {
        let said = format!("Mcp error: -32600: {}", "x".repeat(1 << 20));
        let text = handshake_error(&said);
        assert!(text.len() < MAX_ERROR_TEXT_BYTES + 100, "{} bytes", text.len());
        assert!(text.starts_with("the MCP handshake failed: Mcp error: -32600: xxx"), "{text:.80}");
        assert!(text.ends_with(" more bytes not shown ...]"), "{}", &text[text.len() - 60..]);
        assert_eq!(handshake_error("bad version"), "the MCP handshake failed: bad version");
    }
}
