//! Starting one MCP server and the handshake, under the server's startup timeout.
//!
//! A stdio server runs exactly the given command and arguments in the session cwd, with a
//! cleared environment: only `PATH` and `HOME` (kin's own, so a bare `npx` is found) and the
//! given variables, so kin's API keys never reach it. It runs under the bash tool's supervisor
//! (`sandbox::supervise`, unconfined), so no process it starts outlives it, `setsid` or
//! double-forked ones included, nor kin. Its stderr goes to kin's log at debug level (lines cut
//! at 4 KiB, 1 MiB per server, then only a note), and its last lines are kept for the notice of
//! a failure. Closing gives the server a grace to exit (stdin closed, then SIGTERM to its
//! process group), then kills everything it started.
//!
//! An HTTP server is reached over streamable HTTP with the given headers (the ones the transport
//! owns — `Accept`, `Mcp-Session-Id`, `Last-Event-Id` — are dropped with a warning).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientCacheConfig, ClientHandler, MAX_CLIENT_CACHE_TTL, Peer, RoleClient, ServiceExt};
use tokio::io::AsyncReadExt;

use super::spec::Transport;
use crate::sandbox::supervise::{self, Input, Program, Supervised};
use crate::tools::capture::{MAX_ERROR_TEXT_BYTES, cut};

/// How long a closing server may take to exit before everything it started is killed.
pub(super) const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// How long a close waits for the supervisor to have killed and reaped what was left.
const KILL_WAIT: Duration = Duration::from_secs(2);

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
    /// A stdio server's supervised process (everything it started is killed if dropped).
    process: tokio::sync::Mutex<Option<Supervised>>,
}

impl Connection {
    /// A started connection. Its `tools/list` answers are kept until the server says its tool
    /// list changed (rmcp drops them when the notification arrives, in order with the results
    /// after it), so listing at every step asks the server only after a change.
    async fn new(service: RunningService<RoleClient, Handler>, process: Option<Supervised>) -> Connection {
        let peer = service.peer().clone();
        peer.set_response_cache_config(ClientCacheConfig::default().with_default_ttl(MAX_CLIENT_CACHE_TTL)).await;
        Connection { service: tokio::sync::Mutex::new(Some(service)), peer, process: tokio::sync::Mutex::new(process) }
    }

    /// Whether the connection has ended (the server exited or hung up).
    pub(super) fn is_closed(&self) -> bool {
        self.peer.is_transport_closed()
    }

    /// Closes the connection: a stdio server's stdin is closed, it gets half of `CLOSE_GRACE` to
    /// exit, then SIGTERM to its process group and the other half; then everything it started
    /// (its background processes too) is killed.
    pub(super) async fn close(&self) {
        if let Some(mut service) = self.service.lock().await.take() {
            let _ = service.close_with_timeout(CLOSE_GRACE / 2).await;
        }
        if let Some(mut process) = self.process.lock().await.take() {
            if tokio::time::timeout(CLOSE_GRACE / 2, process.exited()).await.is_err() {
                process.terminate();
                if tokio::time::timeout(CLOSE_GRACE / 2, process.exited()).await.is_err() {
                    tracing::debug!("an MCP server did not exit within the grace; killing it");
                }
            }
            process.finish(KILL_WAIT).await;
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
            let env = child_env(env);
            let dir = cwd.filter(|c| c.is_dir());
            let path = resolve(command, dir, &env).map_err(|reason| fail(reason, &tail))?;
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let program = Program::in_env(&path, &args, env.into_iter().map(|(k, v)| (k.into(), v.into())))
                .map_err(|e| fail(format!("the command `{command}` could not be started: {e}"), &tail))?;
            // Dropped before the handshake completes (a failure, or the session closed
            // meanwhile), it kills everything the server started.
            let mut process = supervise::spawn(program, dir.unwrap_or(Path::new("")), None, Input::Piped)
                .map_err(|e| fail(format!("the command `{command}` could not be started: {e}"), &tail))?;
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (process.stdin.take(), process.stdout.take(), process.stderr.take())
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
                    let exited = tokio::time::timeout(Duration::from_millis(500), process.exited()).await;
                    let reason = match exited {
                        Ok(Ok(status)) => format!("it exited ({status}) before completing the MCP handshake"),
                        Ok(Err(e)) => not_run(command, &e),
                        Err(_) => handshake_error(&e.to_string()),
                    };
                    return Err(fail(reason, &tail));
                }
                Err(_) => return Err(fail(timed_out(), &tail)),
            };
            Ok(Connection::new(service, Some(process)).await)
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
            Ok(Connection::new(service, None).await)
        }
        Transport::Unsupported { kind } => Err(fail(format!("the `{kind}` transport is not supported"), &tail)),
    }
}

/// The file a stdio server's `command` names, as a shell would find it: a name with a `/` is a
/// path (relative to the server's directory `dir`), a bare name the first executable file of
/// that name in the server's `PATH`.
fn resolve(command: &str, dir: Option<&Path>, env: &[(String, String)]) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable =
        |path: &Path| std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    let not_executable = || format!("the command `{command}` is not executable");
    if command.contains('/') {
        let path = dir.map_or_else(|| PathBuf::from(command), |dir| dir.join(command));
        return match std::fs::metadata(&path) {
            Err(_) => Err(format!("the command `{command}` was not found")),
            Ok(_) if executable(&path) => Ok(path),
            Ok(_) => Err(not_executable()),
        };
    }
    if command.is_empty() {
        return Err("the server's command is empty".into());
    }
    let search = env.iter().rev().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    let mut found_unrunnable = false;
    for entry in search.split(':') {
        let path = Path::new(if entry.is_empty() { "." } else { entry }).join(command);
        if executable(&path) {
            return Ok(path);
        }
        found_unrunnable |= path.is_file();
    }
    Err(if found_unrunnable { not_executable() } else { format!("the command `{command}` was not found") })
}

/// Why a stdio server's command, found, could not be run (the error `execve` gave).
fn not_run(command: &str, error: &std::io::Error) -> String {
    match error.raw_os_error() {
        // The file is there: what is missing is the interpreter its `#!` line names.
        Some(libc::ENOENT) => {
            format!("the command `{command}` could not be started: the interpreter its `#!` line names was not found")
        }
        Some(libc::EACCES) => format!("the command `{command}` is not executable"),
        Some(libc::ENOEXEC) => format!(
            "the command `{command}` is neither a program nor a script with a `#!` line (add one, such as `#!/bin/sh`)"
        ),
        _ => format!("the command `{command}` could not be started: {error}"),
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
    fn a_command_is_found_as_a_shell_finds_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (bin, other) = (dir.path().join("bin"), dir.path().join("other"));
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let make = |path: &Path, mode: u32| {
            std::fs::write(path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        make(&other.join("srv"), 0o644);
        make(&bin.join("srv"), 0o755);
        make(&other.join("plain"), 0o644);
        let path = |dirs: &[&Path]| {
            let joined: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            vec![("PATH".to_string(), joined.join(":"))]
        };
        assert_eq!(resolve("srv", None, &path(&[&other, &bin])).unwrap(), bin.join("srv"), "the first executable one");
        assert_eq!(
            resolve("plain", None, &path(&[&other, &bin])).unwrap_err(),
            "the command `plain` is not executable"
        );
        assert_eq!(resolve("nope", None, &path(&[&bin])).unwrap_err(), "the command `nope` was not found");
        assert_eq!(
            resolve("bin/srv", Some(dir.path()), &[]).unwrap(),
            bin.join("srv"),
            "relative to the server's directory"
        );
        assert_eq!(
            resolve("./other/srv", Some(dir.path()), &[]).unwrap_err(),
            "the command `./other/srv` is not executable"
        );
        assert!(resolve("", None, &[]).is_err());
        let said = not_run("srv", &std::io::Error::from_raw_os_error(libc::ENOEXEC));
        assert!(said.contains("`#!` line"), "{said}");
    }

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
            .stderr(std::process::Stdio::piped())
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
