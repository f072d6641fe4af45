//! What the integration tests share. First, the real `kin` binary as a JSON-RPC peer over pipes
//! (`binary`, `catalog`, `agent_tree`, `crash_safety`, `e2e_http`, `fuzz_protocol`, `named_agents`); then an
//! in-process runtime over a temporary store with the scripted model, a live parent session in it
//! and a start request from that parent (`catalog`, `continuation`, `subagents`, `acp_provider`).
//!
//! [`Peer::spawn`] starts a prepared [`Command`] with stdin and stdout piped and a thread that
//! forwards each stdout line into a channel; the methods write frames to stdin and read frames
//! back, waiting for the response to a request id while passing over the notifications and
//! requests kin sends meanwhile. What a test checks about the traffic (for instance that every
//! line is JSON-RPC 2.0) stays in that test, through the callback of [`Peer::response`] or its
//! own loop over [`Peer::frame`].

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use kin::testkit::config::{Config, Overrides};
use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::model::{Model, ModelRoute};
use kin::testkit::runtime::Runtime;
use kin::testkit::session::{Event, SessionHeader, SessionObserver};
use kin::testkit::subagent::StartRequest;
use kin::testkit::tools::{Caller, ToolRegistry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wiremock::{Respond, ResponseTemplate};

/// The binary under test.
pub const KIN: &str = env!("CARGO_BIN_EXE_kin");

/// `kin acp --config /dev/null --sessions SESSIONS [--replay REPLAY]`, stderr discarded; add
/// arguments, environment and a working directory before [`Peer::spawn`]. A placeholder
/// `DEEPSEEK_API_KEY` lets `session/new` through without replay (no test key store is read); a
/// test that calls a model sets its own.
pub fn acp(sessions: &Path, replay: Option<&Path>) -> Command {
    let mut command = Command::new(KIN);
    command.args(["acp", "--config", "/dev/null", "--sessions"]).arg(sessions);
    command.env("DEEPSEEK_API_KEY", "sk-placeholder-never-sent");
    if let Some(replay) = replay {
        command.arg("--replay").arg(replay);
    }
    command.stderr(Stdio::null());
    command
}

/// A JSON-RPC 2.0 request frame (built by kin's ACP client module).
pub fn request(id: u64, method: &str, params: Value) -> Value {
    kin::testkit::acp::request_frame(id, method, params).unwrap()
}

/// Whether `frame` is the response to request `id` (not a request from kin with the same id).
pub fn is_response(frame: &Value, id: u64) -> bool {
    frame["id"] == json!(id) && frame.get("method").is_none()
}

/// A running kin: the child process (its stdin in `child.stdin` until closed), its stdout lines
/// and the id of the last request sent with [`Peer::request`].
pub struct Peer {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    last_id: u64,
}

impl Peer {
    /// Spawns `command` with stdin and stdout piped (stderr as the command has it).
    pub fn spawn(command: &mut Command) -> Peer {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Peer { child, lines, last_id: 0 }
    }

    /// [`Peer::request`] numbers from `id + 1` on (to stay clear of ids a test uses itself).
    pub fn ids_after(mut self, id: u64) -> Peer {
        self.last_id = id;
        self
    }

    /// Writes one line to kin's stdin and flushes it.
    pub fn write_line(&mut self, line: &str) -> io::Result<()> {
        let stdin = self.child.stdin.as_mut().ok_or_else(|| io::Error::from(io::ErrorKind::BrokenPipe))?;
        writeln!(stdin, "{line}")?;
        stdin.flush()
    }

    /// Writes one frame; panics if kin's stdin is gone.
    pub fn send(&mut self, frame: Value) {
        self.write_line(&frame.to_string()).unwrap();
    }

    /// Sends a request with the next id; returns the id.
    pub fn request(&mut self, method: &str, params: Value) -> u64 {
        self.last_id += 1;
        let id = self.last_id;
        self.send(request(id, method, params));
        id
    }

    /// The next stdout line, if one comes within `timeout` (`None` as well once stdout closed).
    pub fn line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// The next stdout frame; panics if none comes within `timeout` or the line is not JSON.
    pub fn frame(&self, timeout: Duration) -> Value {
        let line = self.line(timeout).unwrap_or_else(|| panic!("kin wrote no frame within {timeout:?}"));
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("stdout carried a non-JSON line: {line}"))
    }

    /// Reads frames (each within `timeout`) up to the response to `id` and returns it; `each`
    /// sees every frame read, the response included.
    pub fn response(&self, id: u64, timeout: Duration, mut each: impl FnMut(&Value)) -> Value {
        loop {
            let frame = self.frame(timeout);
            each(&frame);
            if is_response(&frame, id) {
                return frame;
            }
        }
    }

    /// Reads frames (each within `timeout`) until every request of `ids` is answered, in
    /// whatever order the answers come; returns them by id.
    pub fn responses(&self, ids: &[u64], timeout: Duration) -> HashMap<u64, Value> {
        let mut answers = HashMap::new();
        while answers.len() < ids.len() {
            let frame = self.frame(timeout);
            if let Some(&id) = ids.iter().find(|&&id| is_response(&frame, id)) {
                answers.insert(id, frame);
            }
        }
        answers
    }

    /// Sends a request and returns its response, reading each frame within `timeout`.
    pub fn call(&mut self, method: &str, params: Value, timeout: Duration) -> Value {
        let id = self.request(method, params);
        self.response(id, timeout, |_| {})
    }

    /// The response to `id` if it comes within `timeout` all told; `None` on a timeout, a closed
    /// stdout or a non-JSON line (for tests that kill kin and take what arrived).
    pub fn response_within(&self, id: u64, timeout: Duration) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let frame: Value = serde_json::from_str(&self.lines.recv_timeout(left).ok()?).ok()?;
            if is_response(&frame, id) {
                return Some(frame);
            }
        }
        None
    }

    /// Sends a notification.
    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Frames (each within [`WAIT`], each JSON-RPC 2.0) up to and including the first one
    /// `stop` accepts.
    pub fn frames_until(&self, stop: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut frames = Vec::new();
        loop {
            let frame = self.frame(WAIT);
            assert_eq!(frame["jsonrpc"], "2.0", "{frame}");
            let done = stop(&frame);
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }

    /// Frames up to and including the response to request `id`.
    pub fn frames_to(&self, id: u64) -> Vec<Value> {
        self.frames_until(|f| is_response(f, id))
    }

    /// A `session/new` in `cwd`; its session id.
    pub fn new_session(&mut self, cwd: &Path) -> String {
        let response = self.call("session/new", json!({"cwd": cwd, "mcpServers": []}), WAIT);
        response["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session id: {response}")).to_string()
    }

    /// Closes kin's stdin (EOF on its protocol channel).
    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Closes kin's stdin and returns its exit status once it exited (within [`WAIT`]).
    pub fn exit(&mut self) -> ExitStatus {
        self.close_stdin();
        let mut status = None;
        until_blocking("kin to exit after stdin closed", || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status.unwrap()
    }
}

impl Peer {
    /// [`Peer::exit`] for a kin spawned with stderr piped: its status and all it wrote there.
    pub fn exit_with_stderr(&mut self) -> (ExitStatus, String) {
        let mut stderr = self.child.stderr.take().expect("kin's stderr is piped");
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        let status = self.exit();
        (status, reader.join().unwrap())
    }
}

impl Drop for Peer {
    /// A kin still running when its test ends (or fails) is killed and reaped.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A session observer that ignores every event.
pub struct Quiet;

impl SessionObserver for Quiet {
    fn on_event(&self, _: &SessionHeader, _: &Event) {}
}

/// A runtime with its sessions under `dir/sessions`, the config file text `config` and a
/// scripted model serving `entries` (returned too, to see what it was asked).
pub fn runtime(dir: &Path, entries: Vec<ReplayEntry>, config: &str) -> (Arc<Runtime>, Arc<ScriptedModel>) {
    runtime_with(dir, ScriptedModel::new(entries), config)
}

/// [`runtime`] with a model set up by the caller (routes, unrecorded calls).
pub fn runtime_with(dir: &Path, model: ScriptedModel, config: &str) -> (Arc<Runtime>, Arc<ScriptedModel>) {
    let config_path = dir.join("config.toml");
    std::fs::write(&config_path, config).unwrap();
    let overrides = Overrides { config: Some(config_path), sessions: Some(dir.join("sessions")), ..Default::default() };
    let config = Config::resolve(&overrides, &|_| None).unwrap();
    let model = Arc::new(model);
    (Runtime::new(config, model.clone() as Arc<dyn Model>, ToolRegistry::new()).unwrap(), model)
}

/// A live top-level session in `dir/cwd`, and its caller identity.
pub fn parent(rt: &Arc<Runtime>, dir: &Path) -> (String, Arc<Caller>) {
    let cwd = dir.join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let id = rt.new_session(&cwd, Arc::new(Quiet)).unwrap();
    let header = rt.store().inspect(&id).unwrap().header;
    (id, Arc::new(Caller { header, depth: 0, route: ModelRoute::parse("test/m").unwrap(), history: None }))
}

/// How long a test waits for something before it fails.
pub const WAIT: Duration = Duration::from_secs(30);

/// The one wait for a condition no event announces (a file on disk, a process gone, a log line):
/// polls `check` every 10 ms until it holds; panics after [`WAIT`] naming `what`. The runtime
/// keeps running meanwhile.
pub async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out after {WAIT:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// [`until`] for a test without a runtime (the thread sleeps between polls).
pub fn until_blocking(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out after {WAIT:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A start request from `parent` with the text `prompt`, a depth limit of 3 and nothing else.
pub fn start_request(parent: &Arc<Caller>, prompt: &str) -> StartRequest {
    StartRequest {
        label: None,
        prompt: vec![json!({"type": "text", "text": prompt})],
        parent: parent.clone(),
        cancel: CancellationToken::new(),
        route: None,
        output_schema: None,
        max_depth: Some(3),
        tool_filter: None,
        persona: None,
        call_id: None,
        progress: None,
        agent: None,
    }
}

/// A Chat Completions SSE body of `events` (each a `chat.completion.chunk`), then `[DONE]`.
pub fn chat_sse(events: &[Value]) -> String {
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

/// One `chat.completion.chunk` with `delta` (and a finish reason).
pub fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

/// A mock-server response held back until the test releases it (or half a minute passes): the
/// server serves nothing else meanwhile, so what the held answer causes comes after what the test
/// saw before releasing it.
pub struct Held {
    open: Arc<(Mutex<bool>, Condvar)>,
    response: ResponseTemplate,
}

impl Held {
    /// The response, and the release.
    pub fn new(response: ResponseTemplate) -> (Held, impl Fn()) {
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let opener = open.clone();
        let release = move || {
            *opener.0.lock().unwrap() = true;
            opener.1.notify_all();
        };
        (Held { open, response }, release)
    }
}

impl Respond for Held {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        let (open, changed) = &*self.open;
        let wait = Duration::from_secs(30);
        let (open, _) = changed.wait_timeout_while(open.lock().unwrap(), wait, |open| !*open).unwrap();
        assert!(*open, "the held response was never released");
        self.response.clone()
    }
}

/// A mock-server response that tells the test its request arrived (before any delay of the
/// response).
pub struct Heard {
    arrived: Mutex<mpsc::Sender<()>>,
    response: ResponseTemplate,
}

impl Heard {
    /// The response, and the receiver that hears of each request it answers.
    pub fn new(response: ResponseTemplate) -> (Heard, mpsc::Receiver<()>) {
        let (arrived, heard) = mpsc::channel();
        (Heard { arrived: Mutex::new(arrived), response }, heard)
    }
}

impl Respond for Heard {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        let _ = self.arrived.lock().unwrap().send(());
        self.response.clone()
    }
}

/// How each turn of a log ended (`turn/end`'s reason kind), in order.
pub fn turn_ends(events: &[kin::testkit::session::Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == "turn/end")
        .map(|e| e.data["reason"]["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}
