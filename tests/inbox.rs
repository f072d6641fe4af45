//! The durable inbox end to end: the real `kin acp` binary over pipes, its model a loopback HTTP
//! server (wiremock) that answers from the request's last message, so a parent really calls
//! `subagent` (in the background), `send_message` and `bash`, and children really call `bash`
//! and `report`. What each test checks is read back from the session logs on disk.
//!
//! The model's commands (the last user message, or the last tool result):
//! - `start N <child prompt>`: N background `subagent` calls with that prompt;
//! - `send <child> <message>`: one `send_message`;
//! - `list`: one `list_agents`;
//! - `interrupt <child> [discard]`: one `interrupt_agent` (with `discard: true`);
//! - `wait <file>`: `bash` that creates `<file>.started` and waits until `<file>` exists;
//! - `gate <file> [big|report <text>]` (a child's prompt): `bash` waiting for `<file>`, then a
//!   300 KB answer (`big`), a `report` call (`report`, its output the rest of the line), or `ok`;
//! - a report a parent is woken by: the report's text is the command (`wait <file>`, …);
//! - anything else a child is sent (`m…`): `did m…` after a short delay, so messages queue.
//!
//! Waits for kin's side effects poll the logs (or a file a command creates): the order is fenced
//! by what is on disk, never by a sleep.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kin::testkit::session::{Event, SessionStore};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

#[allow(dead_code)]
mod common;
use common::{KIN, Peer, chat_sse, chunk, turn_ends};

const WAIT: Duration = Duration::from_secs(30);

/// The loopback model.
struct Brain {
    /// How long a child's answer to a message takes (so that later messages queue behind it).
    child_delay: Duration,
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

fn text_sse(text: &str) -> String {
    chat_sse(&[chunk(json!({"role": "assistant", "content": text}), None), chunk(json!({}), Some("stop"))])
}

fn calls_sse(calls: &[(&str, Value)]) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, (name, arguments))| {
            json!({"index": index, "id": format!("call_{}", uuid::Uuid::new_v4().simple()), "type": "function",
                   "function": {"name": name, "arguments": arguments.to_string()}})
        })
        .collect();
    chat_sse(&[
        chunk(json!({"role": "assistant", "content": null, "tool_calls": calls}), None),
        chunk(json!({}), Some("tool_calls")),
    ])
}

/// A command that waits for `file`. It also ends when the test's directory is gone, so a command
/// that outlives its kin (a SIGKILL test) cannot outlive the test.
fn gate_command(file: &str, then: &str) -> String {
    format!(
        "touch '{file}.started'; while [ ! -f '{file}' ]; do [ -e '{file}.started' ] || exit 1; sleep 0.02; done; echo {then}"
    )
}

impl Respond for Brain {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or_default();
        let sse = |body: String| ResponseTemplate::new(200).set_body_raw(body, "text/event-stream");
        let mut text = text_of(&last["content"]);
        if text.starts_with("Background subagent ") {
            text = text.lines().last().unwrap_or_default().to_string();
        }
        if last["role"] == "tool" {
            if text.contains("THEN_BIG") {
                let chunks: Vec<Value> = (0..300).map(|_| chunk(json!({"content": "x".repeat(1000)}), None)).collect();
                let mut all = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
                all.extend(chunks);
                all.push(chunk(json!({}), Some("stop")));
                return sse(chat_sse(&all));
            }
            if let Some(report) = text.lines().find_map(|l| l.strip_prefix("THEN_REPORT ")) {
                return sse(calls_sse(&[("report", json!({"output": report}))]));
            }
            return sse(text_sse("ok"));
        }
        let words: Vec<&str> = text.split_whitespace().collect();
        match words.as_slice() {
            ["start", n, prompt @ ..] => {
                let n: usize = n.parse().unwrap_or(1);
                let args = |i: usize| json!({"description": format!("worker {i}"), "prompt": prompt.join(" "), "run_in_background": true});
                let calls: Vec<(&str, Value)> = (0..n).map(|i| ("subagent", args(i))).collect();
                sse(calls_sse(&calls))
            }
            ["send", child, message @ ..] if !message.is_empty() => {
                let message = message.join(" ");
                sse(calls_sse(&[("send_message", json!({"subagent_id": child, "message": message}))]))
            }
            ["list"] => sse(calls_sse(&[("list_agents", json!({}))])),
            ["interrupt", child, rest @ ..] => {
                let arguments = json!({"agent_id": child, "discard": rest == ["discard"]});
                sse(calls_sse(&[("interrupt_agent", arguments)]))
            }
            ["wait", file] => sse(calls_sse(&[("bash", json!({"command": gate_command(file, "waited")}))])),
            ["gate", file, rest @ ..] => {
                let then = match rest {
                    ["big"] => "THEN_BIG".to_string(),
                    ["report", text @ ..] => format!("THEN_REPORT {}", text.join(" ")),
                    _ => "THEN_OK".to_string(),
                };
                sse(calls_sse(&[("bash", json!({"command": gate_command(file, &then)}))]))
            }
            [message] if message.starts_with('m') => {
                sse(text_sse(&format!("did {message}"))).set_delay(self.child_delay)
            }
            _ => sse(text_sse("ok")),
        }
    }
}

/// A loopback model server on its own runtime (the tests themselves block on pipes).
struct Model {
    server: MockServer,
    _runtime: tokio::runtime::Runtime,
}

fn model(child_delay: Duration) -> Model {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(async {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/chat/completions"))
            .respond_with(Brain { child_delay })
            .mount(&server)
            .await;
        server
    });
    Model { server, _runtime: runtime }
}

/// One test's directories and model.
struct World {
    _tmp: tempfile::TempDir,
    cwd: PathBuf,
    sessions: PathBuf,
    config: PathBuf,
    model: Model,
    store: SessionStore,
}

fn world(child_delay: Duration) -> World {
    world_with(child_delay, "")
}

/// `world` with more of `kin.toml` (`extra`, appended).
fn world_with(child_delay: Duration, extra: &str) -> World {
    let tmp = tempfile::tempdir().unwrap();
    let (cwd, sessions, config) = (tmp.path().join("cwd"), tmp.path().join("sessions"), tmp.path().join("kin.toml"));
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(&config, format!("[model_settings]\nretry_base_delay_ms = 10\n{extra}")).unwrap();
    let store = SessionStore::new(&sessions);
    World { _tmp: tmp, cwd, sessions, config, model: model(child_delay), store }
}

impl World {
    /// `kin acp` in bypass mode against the loopback model; `limit`: a soft file-size limit in
    /// 512-byte blocks (the hard limit stays unlimited, so it can be raised from outside).
    fn command(&self, limit: Option<u32>, stderr: Option<&Path>) -> Command {
        let limit = limit.map_or(String::new(), |b| format!("ulimit -S -f {b}; "));
        let script = format!("{limit}exec \"$0\" acp --permission-mode bypass --config \"$1\" --sessions \"$2\"");
        let mut command = Command::new("sh");
        command
            .args(["-c", &script, KIN])
            .arg(&self.config)
            .arg(&self.sessions)
            .current_dir(&self.cwd)
            .env("DEEPSEEK_BASE_URL", self.model.server.uri())
            .env("DEEPSEEK_API_KEY", "sk-inbox-test")
            .env_remove("KIN_MODEL")
            .env("RUST_LOG", "warn");
        match stderr {
            Some(file) => command.stderr(std::fs::File::create(file).unwrap()),
            None => command.stderr(Stdio::null()),
        };
        command
    }

    fn kin(&self) -> Peer {
        self.kin_with(None)
    }

    /// `kin`, its log (warnings) going to `stderr`.
    fn kin_logging_to(&self, stderr: &Path) -> Peer {
        self.kin_with(Some(stderr))
    }

    fn kin_with(&self, stderr: Option<&Path>) -> Peer {
        let mut kin = Peer::spawn(&mut self.command(None, stderr)).ids_after(100);
        let init = kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), WAIT);
        assert!(init.get("result").is_some(), "{init}");
        kin
    }

    fn new_session(&self, kin: &mut Peer) -> String {
        let new = kin.call("session/new", json!({"cwd": self.cwd, "mcpServers": []}), WAIT);
        new["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{new}")).to_string()
    }

    fn load(&self, kin: &mut Peer, id: &str) {
        let loaded = kin.call("session/load", json!({"sessionId": id, "cwd": self.cwd, "mcpServers": []}), WAIT);
        assert!(loaded.get("result").is_some(), "{loaded}");
    }

    fn events(&self, id: &str) -> Vec<Event> {
        self.store.inspect(id).map(|s| s.events).unwrap_or_default()
    }

    /// The stored children of `parent`, oldest first.
    fn children(&self, parent: &str) -> Vec<String> {
        let mut children: Vec<_> = self
            .store
            .list()
            .into_iter()
            .filter(|s| s.header.parent_session.as_deref() == Some(parent))
            .map(|s| (s.header.created_at, s.header.id))
            .collect();
        children.sort();
        children.into_iter().map(|(_, id)| id).collect()
    }
}

fn prompt(kin: &mut Peer, session: &str, text: &str) -> Value {
    kin.call("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}), WAIT)
}

fn first_text(data: &Value) -> String {
    data["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

/// The texts of a log's `user/message`s (their first text block).
fn user_texts(events: &[Event]) -> Vec<String> {
    events.iter().filter(|e| e.kind == "user/message").map(|e| first_text(e.data.value())).collect()
}

/// The texts of the messages a log's inbox insertions accepted, in order.
fn inserted(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == "agent/inbox/spliced")
        .flat_map(|e| e.data["inserted"].as_array().cloned().unwrap_or_default())
        .map(|m| first_text(&m))
        .collect()
}

fn discards(events: &[Event]) -> usize {
    events.iter().filter(|e| e.kind == "agent/inbox/spliced" && e.data["outcome"] == "canceled").count()
}

/// The texts of a log's tool results.
fn tool_results(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == "tool/result")
        .map(|e| e.data["message"]["content"][0]["content"][0]["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Starts one background child of `session` with `child_prompt`; returns its id.
fn start_child(world: &World, kin: &mut Peer, session: &str, child_prompt: &str) -> String {
    let before = world.children(session).len();
    assert_eq!(prompt(kin, session, &format!("start 1 {child_prompt}"))["result"]["stopReason"], "end_turn");
    let children = world.children(session);
    assert_eq!(children.len(), before + 1);
    children.last().unwrap().clone()
}

/// A kin with a parent session and one background child of it waiting at its gate (a `bash`
/// command that ends once the gate file exists): the world, kin, the parent, the gate, the child.
fn a_child_at_its_gate() -> (World, Peer, String, PathBuf, String) {
    let world = world(Duration::from_millis(1));
    let mut kin = world.kin();
    let parent = world.new_session(&mut kin);
    let gate = world.cwd.join("gate");
    let child = start_child(&world, &mut kin, &parent, &format!("gate {}", gate.display()));
    common::until_blocking("the child to wait at its gate", || world.cwd.join("gate.started").exists());
    (world, kin, parent, gate, child)
}

/// `send <child> <message>` through the parent's model: returns the `send_message` result.
fn send(world: &World, kin: &mut Peer, session: &str, child: &str, message: &str) -> String {
    let answer = prompt(kin, session, &format!("send {child} {message}"));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    tool_results(&world.events(session)).pop().unwrap()
}

/// How kin or the parent session is stopped.
#[derive(Clone, Copy, PartialEq)]
enum Stop {
    /// kin's stdin is closed.
    StdinClose,
    /// kin gets SIGTERM (its stdin stays open).
    Sigterm,
    /// `session/close` of the parent (kin goes on).
    SessionClose,
}

/// A child's queued messages after a stop: none discarded, and each ran exactly once, in order,
/// once the parent is loaded again.
fn queued_messages_survive(stop: Stop) {
    let (world, mut kin, parent, _gate, child) = a_child_at_its_gate();
    for m in ["m1", "m2", "m3"] {
        let result = send(&world, &mut kin, &parent, &child, m);
        assert!(result.contains("queued"), "{result}");
    }
    assert_eq!(inserted(&world.events(&child))[1..], ["m1", "m2", "m3"], "acknowledged means in the child's log");
    match stop {
        Stop::SessionClose => {
            assert!(kin.call("session/close", json!({"sessionId": parent}), WAIT).get("result").is_some());
        }
        Stop::StdinClose => {
            kin.close_stdin();
            assert!(kin.child.wait().unwrap().success());
        }
        Stop::Sigterm => {
            let pid = kin.child.id().to_string();
            assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
            assert!(kin.child.wait().unwrap().success(), "SIGTERM is a clean exit");
        }
    }
    let events = world.events(&child);
    assert_eq!(discards(&events), 0, "a stop discards nothing");
    assert!(!user_texts(&events).iter().any(|t| t.starts_with('m')), "none of them ran yet");
    // The running turn was ended by the stop (not left open for crash repair).
    assert_eq!(turn_ends(&events), ["disposed"]);
    if stop != Stop::SessionClose {
        kin = world.kin();
    }
    world.load(&mut kin, &parent);
    common::until_blocking("the restored messages to run", || {
        let events = world.events(&child);
        turn_ends(&events).len() == 4 && turn_ends(&events)[1..].iter().all(|e| e == "completed")
    });
    let events = world.events(&child);
    let ran: Vec<String> = user_texts(&events).into_iter().filter(|t| t.starts_with('m')).collect();
    assert_eq!(ran, ["m1", "m2", "m3"], "each once, in order");
    kin.close_stdin();
    let _ = kin.child.wait();
}

#[test]
fn a_clean_stdin_close_keeps_queued_messages_and_a_load_runs_them() {
    queued_messages_survive(Stop::StdinClose);
}

#[test]
fn sigterm_keeps_queued_messages_and_a_load_runs_them() {
    queued_messages_survive(Stop::Sigterm);
}

#[test]
fn session_close_keeps_queued_messages_and_a_load_runs_them() {
    queued_messages_survive(Stop::SessionClose);
}

#[test]
fn session_cancel_on_the_parent_lets_the_background_turn_complete() {
    let (world, mut kin, parent, gate, child) = a_child_at_its_gate();
    // The parent runs a turn of its own (a tool waiting for a file), and is cancelled in it.
    let hold = world.cwd.join("hold");
    let id = kin.request(
        "session/prompt",
        json!({"sessionId": parent, "prompt": [{"type": "text", "text": format!("wait {}", hold.display())}]}),
    );
    common::until_blocking("the parent's tool to run", || world.cwd.join("hold.started").exists());
    kin.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": parent}}));
    assert_eq!(kin.response(id, WAIT, |_| {})["result"]["stopReason"], "cancelled");
    std::fs::write(&gate, "").unwrap();
    common::until_blocking("the child's turn to end", || !turn_ends(&world.events(&child)).is_empty());
    assert_eq!(turn_ends(&world.events(&child)), ["completed"], "the accepted background turn went on");
    std::fs::write(&hold, "").unwrap();
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// A kin of `world` with a parent session whose background child waits at its gate (its prompt
/// `gate <file> <then>`), the parent then running a tool that waits (at `hold`, never opened),
/// and the child's gate opened: the child goes on while its parent is busy. Returns kin, the
/// parent and the child.
fn a_child_released_while_its_parent_runs_a_tool(world: &World, then: &str) -> (Peer, String, String) {
    let mut kin = world.kin();
    let parent = world.new_session(&mut kin);
    let gate = world.cwd.join("gate");
    let child = start_child(world, &mut kin, &parent, &format!("gate {} {then}", gate.display()));
    common::until_blocking("the child to wait at its gate", || world.cwd.join("gate.started").exists());
    let hold = world.cwd.join("hold");
    kin.request(
        "session/prompt",
        json!({"sessionId": parent, "prompt": [{"type": "text", "text": format!("wait {}", hold.display())}]}),
    );
    common::until_blocking("the parent's tool to run", || world.cwd.join("hold.started").exists());
    std::fs::write(&gate, "").unwrap();
    (kin, parent, child)
}

#[test]
fn a_report_accepted_while_the_parent_runs_a_tool_survives_a_sigkill() {
    let world = world(Duration::from_millis(1));
    let (mut kin, parent, child) = a_child_released_while_its_parent_runs_a_tool(&world, "report R_OK");
    // The child's report result is in its log: the parent accepted the report while its tool ran.
    common::until_blocking("the report to be accepted", || {
        tool_results(&world.events(&child)).iter().any(|r| r.starts_with("report accepted"))
    });
    kin.child.kill().unwrap();
    kin.child.wait().unwrap();
    let mut kin = world.kin();
    world.load(&mut kin, &parent);
    let reported =
        |events: &[Event]| events.iter().any(|e| e.kind == "user/message" && e.data["content"][1]["text"] == "R_OK");
    assert!(reported(&world.events(&parent)), "the report is in the parent's history after load");
    let reports = world
        .events(&parent)
        .iter()
        .filter(|e| e.kind == "user/message" && e.data["content"][1]["text"] == "R_OK")
        .count();
    assert_eq!(reports, 1);
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// A settlement notice steered into a parent that is running a tool waits in the parent's
/// next-step list; kin killed before a step takes it, the load gives it the turn of its own it
/// would have had at the end of that turn (it used to be appended without one: the parent never
/// heard its child was done until the user spoke).
#[test]
fn a_settlement_notice_staged_when_kin_dies_gets_a_turn_after_load() {
    let world = world_with(Duration::from_millis(1), "[subagents]\nsettlement_notice = true\n");
    let (mut kin, parent, child) = a_child_released_while_its_parent_runs_a_tool(&world, "");
    let notice = format!("Background subagent {child} finished");
    let is_notice = |e: &Event| e.kind == "user/message" && first_text(e.data.value()).starts_with(&notice);
    common::until_blocking("the notice to be staged for the parent's next step", || {
        let events = world.events(&parent);
        events.iter().any(|e| e.kind == "agent/inbox/spliced" && e.data["target"] == "next-step")
            && inserted(&events).iter().any(|t| t.starts_with(&notice))
    });
    kin.child.kill().unwrap();
    kin.child.wait().unwrap();
    let mut kin = world.kin();
    world.load(&mut kin, &parent);
    common::until_blocking("the notice's turn to answer", || {
        let events = world.events(&parent);
        events.iter().position(is_notice).is_some_and(|at| events[at..].iter().any(|e| e.kind == "turn/end"))
    });
    let events = world.events(&parent);
    let at = events.iter().position(is_notice).unwrap();
    assert_eq!(events[at - 1].kind, "turn/start", "the notice opens a turn of its own: {:?}", &events[at - 3..=at]);
    assert_eq!(events.iter().filter(|e| is_notice(e)).count(), 1);
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// A background child working when kin is killed (its command running, nothing queued behind
/// it): loading its parent closes the child's cut turn (`interrupted`) and, with settlement
/// notices, tells the parent it failed before it finished. The turn was left open, unnoticed.
#[test]
fn a_child_turn_cut_by_a_crash_is_closed_when_its_parent_loads() {
    let world = world_with(Duration::from_millis(1), "[subagents]\nsettlement_notice = true\n");
    let mut kin = world.kin();
    let parent = world.new_session(&mut kin);
    let gate = world.cwd.join("gate");
    let child = start_child(&world, &mut kin, &parent, &format!("gate {}", gate.display()));
    common::until_blocking("the child to wait at its gate", || world.cwd.join("gate.started").exists());
    kin.child.kill().unwrap();
    kin.child.wait().unwrap();
    let open = |events: &[Event]| {
        let last_start = events.iter().rposition(|e| e.kind == "turn/start");
        last_start.is_some_and(|at| !events[at..].iter().any(|e| e.kind == "turn/end"))
    };
    assert!(open(&world.events(&child)), "the crash cut the child's turn");
    let mut kin = world.kin();
    world.load(&mut kin, &parent);
    common::until_blocking("the child's cut turn to be closed", || !open(&world.events(&child)));
    let ends: Vec<Value> =
        world.events(&child).iter().filter(|e| e.kind == "turn/end").map(|e| e.data["reason"].clone()).collect();
    assert_eq!(ends.last().unwrap()["kind"], "interrupted", "{ends:?}");
    let failed = format!("Background subagent {child} failed before it finished.");
    common::until_blocking("the parent to hear of it", || {
        world.events(&parent).iter().any(|e| e.kind == "user/message" && first_text(e.data.value()) == failed)
    });
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// A full disk with children, made real with a file-size limit (RLIMIT_FSIZE, `ulimit -S -f`):
/// a tmpfs needs root, while a soft limit on kin's own process fails its writes past the limit
/// with EFBIG exactly where a full disk fails them with ENOSPC (the writer treats both alike), and
/// raising it from outside (`prlimit --pid`) is space returning, without restarting kin.
#[test]
fn a_full_disk_loses_no_accepted_follow_up_and_warns_a_bounded_number_of_times() {
    let world = world(Duration::from_millis(1));
    let stderr = world.cwd.join("kin.stderr");
    // 256 blocks of 512 bytes: room for every log but the child's after its 300 KB answer.
    let mut kin = Peer::spawn(&mut world.command(Some(256), Some(&stderr))).ids_after(100);
    assert!(
        kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), WAIT).get("result").is_some()
    );
    let parent = world.new_session(&mut kin);
    let gate = world.cwd.join("gate");
    let child = start_child(&world, &mut kin, &parent, &format!("gate {} big", gate.display()));
    common::until_blocking("the child to wait at its gate", || world.cwd.join("gate.started").exists());
    for m in ["m1", "m2", "m3"] {
        let result = send(&world, &mut kin, &parent, &child, m);
        assert!(result.contains("queued"), "{result}");
    }
    // The child's next answer does not fit its log: every write of it fails from now on.
    std::fs::write(&gate, "").unwrap();
    let warned =
        || std::fs::read_to_string(&stderr).unwrap_or_default().matches("cannot write the session log").count();
    common::until_blocking("the child's log to fill up", || warned() > 0);
    // A follow-up that cannot be written is refused, naming the cause; nothing claims it queued.
    let refused = send(&world, &mut kin, &parent, &child, "m4");
    assert!(
        refused.contains("could not be written to the log of session") && refused.contains("File too large"),
        "{refused}"
    );
    assert!(!refused.contains("queued"), "{refused}");
    // kin's log is written by a thread of its own: the warning may follow the answer.
    common::until_blocking("the refusal to be warned of", || {
        std::fs::read_to_string(&stderr)
            .unwrap_or_default()
            .contains("the events being accepted were not kept, and their sender was told so")
    });
    // The child runs its accepted messages meanwhile (in memory) and then keeps trying to write
    // them; give it a few retries while the disk stays full, then let space return.
    common::until_blocking("the child to retry its writes", || {
        std::fs::read_to_string(&stderr).unwrap_or_default().matches("more such failures").count() > 0
            || turn_ends(&world.events(&child)).is_empty()
    });
    let raised = Command::new("prlimit").args(["--pid", &kin.child.id().to_string(), "--fsize=unlimited"]).status();
    assert!(raised.unwrap().success(), "prlimit raises kin's soft file-size limit");
    common::until_blocking("every accepted follow-up to reach the log", || {
        let events = world.events(&child);
        turn_ends(&events).len() == 4
    });
    let events = world.events(&child);
    assert_eq!(turn_ends(&events), ["completed"; 4], "the first turn and every follow-up, none interrupted");
    let ran: Vec<String> = user_texts(&events).into_iter().filter(|t| t.starts_with('m')).collect();
    assert_eq!(ran, ["m1", "m2", "m3"], "m4 was refused, the rest ran once each");
    assert!(!inserted(&events).contains(&"m4".to_string()));
    kin.close_stdin();
    let _ = kin.child.wait();
    let warnings = std::fs::read_to_string(&stderr).unwrap().matches("cannot write the session log").count();
    assert!((1..=4).contains(&warnings), "warnings are rate-limited per log and kind: {warnings}");
}

/// The fault test: kin is SIGKILLed at random points, over and over (seeded: the seed is
/// printed, `KIN_INBOX_SEED` replays it), while several background children run and follow-ups
/// are queued behind their turns. After each kill every acknowledged follow-up is in its child's
/// log; after the last, loading the parent runs every accepted message exactly once: 0 lost, 0
/// duplicated.
#[test]
fn sigkills_while_follow_ups_queue_lose_and_duplicate_nothing() {
    const KILLS: usize = 100;
    const CHILDREN: usize = 3;
    let seed: u64 = std::env::var("KIN_INBOX_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x1b0c5);
    eprintln!("inbox fault seed: {seed} (set KIN_INBOX_SEED to replay); {KILLS} kills");
    let mut rng = fastrand::Rng::with_seed(seed);
    let world = world(Duration::from_millis(15));
    let mut kin = world.kin();
    let parent = world.new_session(&mut kin);
    assert_eq!(prompt(&mut kin, &parent, &format!("start {CHILDREN} hello"))["result"]["stopReason"], "end_turn");
    let children = world.children(&parent);
    assert_eq!(children.len(), CHILDREN);
    kin.close_stdin();
    let _ = kin.child.wait();
    let mut next = 0usize;
    let mut acknowledged: Vec<(String, String)> = Vec::new();
    for kill in 0..KILLS {
        let mut kin = world.kin();
        world.load(&mut kin, &parent);
        let deadline = Instant::now() + Duration::from_micros(rng.u64(0..60_000));
        // Every fourth round waits for its first acknowledgement before the kill, so that kills
        // land after acknowledgements however slow the machine is; the others kill at a
        // random point, often before one.
        let patient = kill % 4 == 0;
        for sent in 0..rng.usize(1..5) {
            let child = &children[rng.usize(0..CHILDREN)];
            let message = format!("m{next}");
            next += 1;
            let id = kin.request(
                "session/prompt",
                json!({"sessionId": parent, "prompt": [{"type": "text", "text": format!("send {child} {message}")}]}),
            );
            let left = match deadline.checked_duration_since(Instant::now()) {
                _ if patient && sent == 0 => common::WAIT,
                Some(left) => left,
                None => break,
            };
            match kin.response_within(id, left) {
                Some(frame) => {
                    assert_eq!(frame["result"]["stopReason"], "end_turn", "kill {kill}: {frame}");
                    let result = tool_results(&world.events(&parent)).pop().unwrap_or_default();
                    assert!(result.contains("queued"), "kill {kill}: {message}: {result}");
                    acknowledged.push((child.clone(), message));
                }
                None => break,
            }
        }
        kin.child.kill().unwrap();
        kin.child.wait().unwrap();
        for (child, message) in &acknowledged {
            assert!(
                inserted(&world.events(child)).contains(message),
                "kill {kill}: acknowledged {message} is not in {child}'s log"
            );
        }
        for child in &children {
            let ran = user_texts(&world.events(child));
            let mut seen = std::collections::HashSet::new();
            assert!(
                ran.iter().filter(|t| t.starts_with('m')).all(|t| seen.insert(t.clone())),
                "kill {kill}: a message ran twice in {child}: {ran:?}"
            );
        }
    }
    // The last load runs what is still pending: every accepted message, once.
    let mut kin = world.kin();
    world.load(&mut kin, &parent);
    let settled = |child: &String| {
        let events = world.events(child);
        let pending = kin::testkit::session::inbox::fold(&events, 0).map(|inbox| inbox.is_idle()).unwrap_or(false);
        let ran = user_texts(&events);
        pending && inserted(&events).iter().all(|m| ran.contains(m))
    };
    common::until_blocking("every child to run what it accepted", || children.iter().all(settled));
    let mut accepted = 0;
    for child in &children {
        let events = world.events(child);
        let ran: Vec<String> = user_texts(&events).into_iter().filter(|t| t.starts_with('m')).collect();
        let mut expected: Vec<String> = inserted(&events).into_iter().filter(|t| t.starts_with('m')).collect();
        expected.dedup();
        accepted += expected.len();
        let mut sorted = ran.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ran.len(), "{child}: duplicated: {ran:?}");
        let mut want = expected.clone();
        want.sort();
        want.dedup();
        assert_eq!(sorted, want, "{child}: every accepted message ran exactly once");
    }
    eprintln!("{} acknowledged, {accepted} accepted, {next} sent across {KILLS} kills", acknowledged.len());
    assert!(acknowledged.len() >= 20, "the kills should land both before and after acknowledgements");
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// How a background child's queue is discarded.
#[derive(Clone, Copy)]
enum Discard {
    /// The editor's cancel on the child in the agent tree (`session/cancel` naming it).
    EditorCancel,
    /// The parent's model: `interrupt_agent` with `discard`.
    Interrupt,
}

/// A child with two messages queued behind its running turn is stopped with a discard: its turn
/// ends aborted, the two never run, and the sender's next `list_agents` says they were
/// discarded; a later message runs and clears the note.
fn a_discard_shows_in_list_agents(how: Discard) {
    let (world, mut kin, parent, gate, child) = a_child_at_its_gate();
    for m in ["m1", "m2"] {
        assert!(send(&world, &mut kin, &parent, &child, m).contains("queued"));
    }
    assert!(prompt(&mut kin, &parent, "list")["result"].is_object());
    let listed = tool_results(&world.events(&parent)).pop().unwrap();
    assert!(listed.contains(&format!("{child} [running]")) && listed.contains("(2 queued)"), "{listed}");
    match how {
        Discard::EditorCancel => {
            kin.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": child}}));
        }
        Discard::Interrupt => {
            let answer = prompt(&mut kin, &parent, &format!("interrupt {child} discard"));
            assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
            let result = tool_results(&world.events(&parent)).pop().unwrap();
            assert_eq!(result, format!("interrupt requested for agent {child}; 2 queued messages discarded"));
        }
    }
    // Its turn stops and its queue is discarded, on disk.
    common::until_blocking("the discard", || discards(&world.events(&child)) == 1);
    common::until_blocking("the child to settle", || {
        world.events(&child).iter().any(|e| e.kind == "turn/end") && {
            assert!(prompt(&mut kin, &parent, "list")["result"].is_object());
            tool_results(&world.events(&parent)).pop().unwrap().contains("[complete]")
        }
    });
    let listed = tool_results(&world.events(&parent)).pop().unwrap();
    assert!(listed.contains("(2 queued messages discarded, never run)") && !listed.contains("queued)"), "{listed}");
    assert_eq!(turn_ends(&world.events(&child)), ["aborted"]);
    // The conversation goes on with the next message; the discarded ones never run.
    assert!(send(&world, &mut kin, &parent, &child, "m3").contains("queued"));
    common::until_blocking("m3 to run", || turn_ends(&world.events(&child)).len() == 2);
    let ran: Vec<String> = user_texts(&world.events(&child)).into_iter().filter(|t| t.starts_with('m')).collect();
    assert_eq!(ran, ["m3"]);
    assert!(prompt(&mut kin, &parent, "list")["result"].is_object());
    let listed = tool_results(&world.events(&parent)).pop().unwrap();
    assert!(!listed.contains("discarded"), "a turn that ran clears the note: {listed}");
    std::fs::write(&gate, "").unwrap();
    kin.close_stdin();
    let _ = kin.child.wait();
}

#[test]
fn the_editors_cancel_of_a_background_child_discards_its_queue_and_list_agents_says_so() {
    a_discard_shows_in_list_agents(Discard::EditorCancel);
}

#[test]
fn interrupt_agent_with_discard_drops_the_queue_and_the_senders_next_list_agents_says_so() {
    a_discard_shows_in_list_agents(Discard::Interrupt);
}

/// Whether a log event is a turn a child's report woke.
fn report_turn(event: &Event) -> bool {
    event.kind == "turn/start" && event.data["trigger"]["source"]["kind"] == "subagent-report"
}

/// A top-level session left by a SIGKILL with a message pending in its own inbox: with
/// `report_delivery = "wakeup"`, two children report while the parent runs a tool (both reports
/// are queued on the parent, inside that turn); the first report's turn then starts (`wait
/// <hold1>`, claimed) and kin is killed in it, so the second is pending. Returns the world, the
/// parent and `hold1` (which does not exist yet).
fn a_parent_killed_with_a_pending_report() -> (World, String, PathBuf) {
    let world = world_with(Duration::from_millis(1), "[subagents]\nreport_delivery = \"wakeup\"\n");
    let mut kin = world.kin();
    let parent = world.new_session(&mut kin);
    let (gate, hold0, hold1) = (world.cwd.join("gate"), world.cwd.join("hold0"), world.cwd.join("hold1"));
    let started =
        prompt(&mut kin, &parent, &format!("start 2 gate {} report wait {}", gate.display(), hold1.display()));
    assert_eq!(started["result"]["stopReason"], "end_turn", "{started}");
    assert_eq!(world.children(&parent).len(), 2);
    common::until_blocking("the children to wait at their gate", || world.cwd.join("gate.started").exists());
    kin.request(
        "session/prompt",
        json!({"sessionId": parent, "prompt": [{"type": "text", "text": format!("wait {}", hold0.display())}]}),
    );
    common::until_blocking("the parent's tool to run", || world.cwd.join("hold0.started").exists());
    std::fs::write(&gate, "").unwrap();
    common::until_blocking("both reports to be queued on the parent", || inserted(&world.events(&parent)).len() == 2);
    std::fs::write(&hold0, "").unwrap();
    common::until_blocking("the first report's turn to run its tool", || world.cwd.join("hold1.started").exists());
    kin.child.kill().unwrap();
    kin.child.wait().unwrap();
    let events = world.events(&parent);
    assert_eq!(events.iter().filter(|e| report_turn(e)).count(), 1, "one report ran, one is pending");
    (world, parent, hold1)
}

/// A top-level session with a pending message runs it when it is loaded (`session/load`) or
/// resumed (`session/resume`) after a restart: once, after the turn the kill interrupted.
fn a_top_level_pending_message_runs_after_a_restart(method: &str) {
    let (world, parent, hold1) = a_parent_killed_with_a_pending_report();
    std::fs::write(&hold1, "").unwrap();
    let mut kin = world.kin();
    let answer = kin.call(method, json!({"sessionId": parent, "cwd": world.cwd, "mcpServers": []}), WAIT);
    assert!(answer.get("result").is_some(), "{answer}");
    common::until_blocking("the pending report to run", || turn_ends(&world.events(&parent)).len() == 4);
    let events = world.events(&parent);
    assert_eq!(turn_ends(&events), ["completed", "completed", "interrupted", "completed"]);
    assert_eq!(events.iter().filter(|e| report_turn(e)).count(), 2, "each report ran once");
    let reports = user_texts(&events).iter().filter(|t| t.starts_with("Background subagent ")).count();
    assert_eq!(reports, 2);
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

#[test]
fn a_top_level_session_runs_its_pending_messages_when_loaded_after_a_restart() {
    a_top_level_pending_message_runs_after_a_restart("session/load");
}

#[test]
fn a_top_level_session_runs_its_pending_messages_when_resumed_after_a_restart() {
    a_top_level_pending_message_runs_after_a_restart("session/resume");
}

/// `session/fork` of a session with pending inbox messages: the fork's seed holds their
/// insertions (its seed is the source's completed turns), but they are the source's; the fork
/// never runs them, neither live nor when it is loaded after a restart, while the source still
/// does.
#[test]
fn a_fork_does_not_inherit_pending_inbox_messages() {
    let (world, parent, hold1) = a_parent_killed_with_a_pending_report();
    std::fs::write(&hold1, "").unwrap();
    let mut kin = world.kin();
    let forked = kin.call("session/fork", json!({"sessionId": parent, "cwd": world.cwd, "mcpServers": []}), WAIT);
    let fork = forked["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{forked}")).to_string();
    let seed_length = world.store.inspect(&fork).unwrap().header.seed_length.unwrap() as usize;
    let seeded = world.events(&fork);
    assert_eq!(inserted(&seeded[..seed_length]).len(), 2, "the seed holds both insertions");
    assert_eq!(prompt(&mut kin, &fork, "hello")["result"]["stopReason"], "end_turn");
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
    let mut kin = world.kin();
    world.load(&mut kin, &fork);
    // A pending message the fork had inherited would run first (a load wakes it), before this.
    assert_eq!(prompt(&mut kin, &fork, "hello")["result"]["stopReason"], "end_turn");
    let own = world.events(&fork).split_off(seed_length);
    assert!(!own.iter().any(report_turn), "the fork ran a report: {:?}", user_texts(&own));
    assert_eq!(user_texts(&own), ["hello", "hello"]);
    assert_eq!(turn_ends(&own), ["completed", "completed"]);
    // The source still has its pending report, and runs it when loaded.
    world.load(&mut kin, &parent);
    common::until_blocking("the source's pending report to run", || turn_ends(&world.events(&parent)).len() == 4);
    assert_eq!(world.events(&parent).iter().filter(|e| report_turn(e)).count(), 2);
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

/// A load over a live session whose child is at work is refused: the child runs under the
/// session's permissions, sandbox and MCP servers, which the load would replace (capped at the
/// start) while the child went on under the old ones. Nothing of the child's is stopped; once
/// everything has settled, the load goes through.
#[test]
fn a_load_over_a_live_session_with_a_child_at_work_is_refused_until_it_settles() {
    let (world, mut kin, parent, gate, child) = a_child_at_its_gate();
    let load = json!({"sessionId": parent, "cwd": world.cwd, "mcpServers": []});
    let refused = kin.call("session/load", load.clone(), WAIT);
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("has 1 subagent(s) at work ({child})")), "{refused}");
    assert!(message.contains("close the session first"), "{refused}");
    assert!(turn_ends(&world.events(&child)).is_empty(), "the child still runs");
    std::fs::write(&gate, "").unwrap();
    // The child's turn ends, its completion wakes the parent, and both settle; until then each
    // load is refused (a child at work, or a turn in flight).
    common::until_blocking("a load once everything settled", || {
        kin.call("session/load", load.clone(), WAIT).get("result").is_some()
    });
    assert_eq!(turn_ends(&world.events(&child)), ["completed"], "the child was not stopped");
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// `session/close` stops the session's children too; when a child's last events cannot be
/// written (a full disk), the close says so naming the child, instead of answering as if
/// everything were saved.
#[test]
fn a_close_whose_child_cannot_write_its_last_events_says_so() {
    let (_world, mut kin, parent, _gate, child) = a_child_at_its_gate();
    let full = Command::new("prlimit").args(["--pid", &kin.child.id().to_string(), "--fsize=1:"]).status();
    assert!(full.unwrap().success(), "prlimit lowers kin's soft file-size limit");
    let closed = kin.call("session/close", json!({"sessionId": parent}), WAIT);
    assert_eq!(closed["error"]["code"], -32603, "{closed}");
    let message = closed["error"]["message"].as_str().unwrap();
    assert!(message.contains("is closed") && message.contains(&format!("subagent {child}: ")), "{closed}");
    assert!(message.contains("File too large"), "{closed}");
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// A grandchild with a pending message, under a child that cannot be resumed (another process
/// holds its log's lock), stays on disk at a load: resumed under no live parent, it would run
/// with kin's start permissions and sandbox instead of its session's, and could not report. Once
/// the child can be resumed, the next load runs the grandchild's message, once.
#[test]
fn a_grandchild_is_not_resumed_while_its_parent_cannot_be() {
    let world = world(Duration::from_millis(1));
    let mut kin = world.kin();
    let parent = world.new_session(&mut kin);
    let gate = world.cwd.join("gate");
    let child = start_child(&world, &mut kin, &parent, &format!("start 1 gate {}", gate.display()));
    common::until_blocking("the grandchild to wait at its gate", || world.cwd.join("gate.started").exists());
    let grandchild = world.children(&child).pop().expect("the child started a grandchild");
    let queued = send(&world, &mut kin, &parent, &child, &format!("send {grandchild} m1"));
    assert!(queued.contains("queued"), "{queued}");
    common::until_blocking("the child to queue m1", || inserted(&world.events(&grandchild)).contains(&"m1".into()));
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
    assert!(!user_texts(&world.events(&grandchild)).contains(&"m1".to_string()), "m1 is pending");

    // Another process (this test's) holds the child's log lock: its resume fails.
    let holder = lock_log(&world, &child);
    let stderr = world.cwd.join("kin.stderr");
    let mut kin = world.kin_logging_to(&stderr);
    world.load(&mut kin, &parent);
    common::until_blocking("the grandchild to be left on disk", || {
        std::fs::read_to_string(&stderr).unwrap_or_default().contains("was not resumed: its parent was not")
    });
    assert!(!user_texts(&world.events(&grandchild)).contains(&"m1".to_string()), "m1 still pending");

    // The lock gone, the next load resumes both and the grandchild runs m1 once.
    drop(holder);
    world.load(&mut kin, &parent);
    common::until_blocking("m1 to run", || user_texts(&world.events(&grandchild)).contains(&"m1".to_string()));
    let ran = user_texts(&world.events(&grandchild)).iter().filter(|t| *t == "m1").count();
    assert_eq!(ran, 1);
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// Takes session `id`'s log lock as another kin process writing it would (until dropped): kin
/// cannot resume or load that session meanwhile.
fn lock_log(world: &World, id: &str) -> std::fs::File {
    let holder = std::fs::File::open(world.store.locate(id).unwrap().unwrap()).unwrap();
    // SAFETY: flock on an open file's descriptor.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&holder), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0, "the test holds the log lock of {id}");
    holder
}

/// `interrupt_agent` with `discard` on a child that is not running (its resume at the load
/// failed) discards the messages still pending in its log, durably, and says how many: they
/// never run, not even when a later load resumes it.
#[test]
fn interrupt_agent_with_discard_on_a_stored_child_discards_its_pending_messages() {
    let (world, mut kin, parent, _gate, child) = a_child_at_its_gate();
    for m in ["m1", "m2"] {
        assert!(send(&world, &mut kin, &parent, &child, m).contains("queued"));
    }
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());

    // The load cannot resume the child; once it has tried, the lock goes.
    let holder = lock_log(&world, &child);
    let stderr = world.cwd.join("kin.stderr");
    let mut kin = world.kin_logging_to(&stderr);
    world.load(&mut kin, &parent);
    common::until_blocking("the load to leave the child on disk", || {
        std::fs::read_to_string(&stderr).unwrap_or_default().contains("was not resumed")
    });
    drop(holder);
    let answer = prompt(&mut kin, &parent, &format!("interrupt {child} discard"));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let result = tool_results(&world.events(&parent)).pop().unwrap();
    assert_eq!(result, format!("interrupt requested for agent {child}; 2 queued messages discarded"));
    assert_eq!(discards(&world.events(&child)), 1, "the discard is in the child's log when answered");

    // A later load resumes nothing of them.
    world.load(&mut kin, &parent);
    assert!(send(&world, &mut kin, &parent, &child, "m3").contains("queued"));
    common::until_blocking("m3 to run", || user_texts(&world.events(&child)).contains(&"m3".to_string()));
    let ran: Vec<String> = user_texts(&world.events(&child)).into_iter().filter(|t| t.starts_with('m')).collect();
    assert_eq!(ran, ["m3"], "the discarded ones never ran");
    kin.close_stdin();
    let _ = kin.child.wait();
}
