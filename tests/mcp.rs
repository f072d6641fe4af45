//! MCP servers end to end: `kin acp` over pipes, its model a loopback Chat Completions mock that
//! answers from a script, and the real MCP fixture server (`examples/mcp_fixture.rs`, rmcp's
//! server side, built by `cargo test`) given in `session/new` like an editor gives it. The
//! fixture notes every call it receives in a file, so a test sees what reached it.
//!
//! Also: servers kin cannot use (missing, printing garbage, hanging at initialize, `sse`), Zed's
//! exact `session/new` with an HTTP and a stdio server, and, when Node.js is here,
//! `@modelcontextprotocol/server-everything` through `npx`.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

#[allow(dead_code)]
mod common;
use common::{KIN, Peer, chat_sse, chunk};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The fixture server: `target/<profile>/examples/mcp_fixture`, next to this test's `deps/`.
fn fixture() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().and_then(Path::parent).unwrap().join("examples").join("mcp_fixture");
    assert!(
        path.is_file(),
        "{} is missing: `cargo test` builds it (with `--test mcp` alone, run `cargo build --examples` first)",
        path.display()
    );
    path
}

/// The model: each request gets the next scripted body (a plain "(end)" once they run out).
#[derive(Clone, Default)]
struct Script(Arc<Mutex<VecDeque<String>>>);

impl Respond for Script {
    fn respond(&self, _request: &Request) -> ResponseTemplate {
        let body = self.0.lock().unwrap().pop_front().unwrap_or_else(|| text_body("(end)"));
        ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
    }
}

impl Script {
    /// A step that calls tools: `(call id, tool name, arguments)`.
    fn calls(&self, calls: &[(&str, &str, Value)]) -> &Self {
        let tool_calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, (id, name, args))| {
                json!({"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
            })
            .collect();
        let body = chat_sse(&[
            chunk(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}), None),
            chunk(json!({}), Some("tool_calls")),
        ]);
        self.0.lock().unwrap().push_back(body);
        self
    }

    /// A step that answers with text.
    fn text(&self, text: &str) -> &Self {
        self.0.lock().unwrap().push_back(text_body(text));
        self
    }
}

fn text_body(text: &str) -> String {
    chat_sse(&[chunk(json!({"role": "assistant", "content": text}), None), chunk(json!({}), Some("stop"))])
}

/// A running kin with its model mock, answering permission requests from a queue.
struct Kin {
    tmp: tempfile::TempDir,
    server: MockServer,
    script: Script,
    peer: Peer,
    cwd: PathBuf,
    /// Every frame kin wrote, in order.
    frames: Vec<Value>,
    /// Option ids for the next `session/request_permission`s (then `cancelled`).
    answers: VecDeque<&'static str>,
    session: String,
}

impl Kin {
    /// Starts `kin acp` with `config` (TOML) and `initialize`s it with `capabilities`.
    async fn start(config: &str, capabilities: Value) -> Kin {
        Kin::start_with(config, capabilities, |_| {}).await
    }

    /// `start`, with `adjust` applied to kin's command first.
    async fn start_with(config: &str, capabilities: Value, adjust: impl FnOnce(&mut Command)) -> Kin {
        let server = MockServer::start().await;
        let script = Script::default();
        Mock::given(method("POST")).and(path("/chat/completions")).respond_with(script.clone()).mount(&server).await;
        let tmp = tempfile::tempdir().unwrap();
        let cwd = tmp.path().join("cwd");
        std::fs::create_dir_all(&cwd).unwrap();
        let config_path = tmp.path().join("config.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut command = Command::new(KIN);
        command
            .args(["acp", "--config"])
            .arg(&config_path)
            .arg("--sessions")
            .arg(tmp.path().join("sessions"))
            .env("DEEPSEEK_BASE_URL", server.uri())
            .env("DEEPSEEK_API_KEY", "sk-mcp-model-secret")
            .env("RUST_LOG", "kin=debug")
            .env_remove("KIN_MODEL")
            .env_remove("KIN_PERMISSION_MODE")
            .stderr(Stdio::null());
        adjust(&mut command);
        let peer = Peer::spawn(&mut command);
        let mut kin = Kin {
            tmp,
            server,
            script,
            peer,
            cwd,
            frames: Vec::new(),
            answers: VecDeque::new(),
            session: String::new(),
        };
        let init = kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": capabilities}));
        assert_eq!(
            init["result"]["agentCapabilities"]["mcpCapabilities"],
            json!({"http": true, "sse": false}),
            "{init}"
        );
        kin
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// Sends a request and reads frames up to its response, answering kin's own requests.
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.peer.request(method, params);
        loop {
            let frame = self.peer.frame(TIMEOUT);
            self.frames.push(frame.clone());
            if common::is_response(&frame, id) {
                return frame;
            }
            self.answer(&frame);
        }
    }

    /// Answers a `session/request_permission` from the queue (anything else kin asks: -32601).
    fn answer(&mut self, frame: &Value) {
        let (Some(method), Some(id)) = (frame["method"].as_str(), frame.get("id")) else { return };
        let reply = if method == "session/request_permission" {
            match self.answers.pop_front() {
                Some(option) => {
                    json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "selected", "optionId": option}}})
                }
                None => json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "cancelled"}}}),
            }
        } else {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "not here"}})
        };
        self.peer.send(reply);
    }

    /// Reads frames until `done` holds for one (within `TIMEOUT` in all), answering requests.
    fn until(&mut self, what: &str, mut done: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("timed out waiting for {what}"));
            let frame = self.peer.frame(left);
            self.frames.push(frame.clone());
            self.answer(&frame);
            if done(&frame) {
                return frame;
            }
        }
    }

    /// `session/new` in the cwd with these servers; panics unless it succeeds.
    fn new_session(&mut self, servers: Value) -> String {
        let cwd = self.cwd.clone();
        let created = self.call("session/new", json!({"cwd": cwd, "mcpServers": servers}));
        let id = created["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("session/new failed: {created}"));
        self.session = id.to_string();
        self.session.clone()
    }

    /// One prompt; returns its stop reason.
    fn prompt(&mut self, text: &str) -> String {
        let session = self.session.clone();
        let response =
            self.call("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}));
        response["result"]["stopReason"].as_str().unwrap_or_else(|| panic!("the prompt failed: {response}")).to_string()
    }

    fn set_mode(&mut self, mode: &str) {
        let session = self.session.clone();
        let set = self.call("session/set_mode", json!({"sessionId": session, "modeId": mode}));
        assert!(set.get("result").is_some(), "{set}");
    }

    /// The request bodies the model received.
    async fn model_requests(&self) -> Vec<Value> {
        let requests = self.server.received_requests().await.unwrap();
        requests.iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect()
    }

    /// The session log.
    fn log(&self) -> String {
        let store = kin::testkit::session::SessionStore::new(self.path("sessions"));
        std::fs::read_to_string(store.locate(&self.session).unwrap().unwrap()).unwrap()
    }

    /// The `session/update`s sent for the session, in order.
    fn updates(&self) -> Vec<&Value> {
        self.frames.iter().filter(|f| f["method"] == "session/update").map(|f| &f["params"]["update"]).collect()
    }

    /// Closes kin's stdin and waits for it to exit successfully.
    fn stop(self) {
        drop(self.stop_keeping_files());
    }

    /// `stop`, returning the temporary directory (sessions, fixture logs) to read on.
    fn stop_keeping_files(mut self) -> tempfile::TempDir {
        self.peer.close_stdin();
        let status = self.peer.child.wait().unwrap();
        assert!(status.success(), "kin exited with {status}");
        self.tmp
    }
}

/// A stdio server entry for the fixture, noting into `log`, with extra env.
fn fixture_entry(name: &str, log: &Path, env: &[(&str, &str)]) -> Value {
    let mut vars = vec![json!({"name": "FIXTURE_LOG", "value": log})];
    vars.extend(env.iter().map(|(k, v)| json!({"name": k, "value": v})));
    json!({"name": name, "command": fixture(), "args": [], "env": vars})
}

/// The lines the fixture wrote to `log`.
fn noted(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_string).collect()
}

fn count(log: &Path, line: &str) -> usize {
    noted(log).iter().filter(|l| *l == line).count()
}

/// The pids the fixture noted at its starts.
fn pids(log: &Path) -> Vec<i32> {
    noted(log).iter().filter_map(|l| l.strip_prefix("pid ")?.parse().ok()).collect()
}

/// Whether a process runs (a zombie does not).
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// The tool names of a model request.
fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(String::from))
        .collect()
}

/// The tool results of a model request, by call id.
fn tool_result(request: &Value, call: &str) -> String {
    let messages = request["messages"].as_array().unwrap();
    let found = messages.iter().find(|m| m["role"] == "tool" && m["tool_call_id"] == call);
    found.unwrap_or_else(|| panic!("no result for {call} in {request}"))["content"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_reach_the_model_and_their_results_come_back() {
    let mut kin = Kin::start("permission_mode = \"bypass\"\n", json!({})).await;
    let log = kin.path("fixture.log");
    kin.new_session(json!([fixture_entry("fx", &log, &[("SECRET_TOKEN", "s3cr3t-value")])]));
    kin.script
        .calls(&[
            ("c1", "mcp__fx__echo", json!({"text": "hi"})),
            ("c2", "mcp__fx__image", json!({})),
            ("c3", "mcp__fx__fail", json!({})),
            ("c4", "mcp__fx__structured", json!({})),
            ("c5", "mcp__fx__env", json!({})),
        ])
        .text("done");
    assert_eq!(kin.prompt("Use the fixture."), "end_turn");

    let requests = kin.model_requests().await;
    assert_eq!(requests.len(), 2);
    let names = tool_names(&requests[0]);
    for tool in ["echo", "image", "fail", "slow", "structured", "env", "add_tool", "stall_list", "crash"] {
        assert!(names.contains(&format!("mcp__fx__{tool}")), "{tool} missing from {names:?}");
    }
    let echo =
        requests[0]["tools"].as_array().unwrap().iter().find(|t| t["function"]["name"] == "mcp__fx__echo").unwrap();
    assert_eq!(echo["function"]["description"], "Echoes the text back.");
    assert_eq!(
        echo["function"]["parameters"],
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        "the schema goes to the model unchanged"
    );
    let second = &requests[1];
    assert_eq!(tool_result(second, "c1"), "echo: hi");
    let image = tool_result(second, "c2");
    assert!(
        image.starts_with("a red pixel\n[image image/png: "),
        "the chat API takes no images: a placeholder: {image}"
    );
    assert_eq!(tool_result(second, "c3"), "Error: the fixture failed on purpose");
    assert_eq!(tool_result(second, "c4"), "{\"temperature\":21,\"unit\":\"C\"}");
    let env = tool_result(second, "c5");
    let vars: Vec<&str> = env.split(',').collect();
    assert!(vars.iter().all(|v| ["FIXTURE_LOG", "HOME", "PATH", "SECRET_TOKEN"].contains(v)), "{env}");
    assert!(vars.contains(&"PATH") && vars.contains(&"SECRET_TOKEN"), "{env}");

    // The editor sees each call titled `server: tool {arguments}`, and the image on the call.
    let updates = kin.updates();
    let call = updates.iter().find(|u| u["sessionUpdate"] == "tool_call" && u["toolCallId"] == "c1").unwrap();
    // Kind `other` (ACP's default, so not written).
    assert_eq!(
        (call["title"].as_str(), call["kind"].as_str().unwrap_or("other")),
        (Some("fx: echo {\"text\":\"hi\"}"), "other"),
        "{call}"
    );
    let shown = updates.iter().find(|u| u["sessionUpdate"] == "tool_call_update" && u["toolCallId"] == "c2").unwrap();
    assert!(
        shown["content"].as_array().unwrap().iter().any(|c| c["content"]["type"] == "image"),
        "the editor gets the image: {shown}"
    );

    // The log: which servers (never env values), and each call and result like any tool.
    let text = kin.log();
    assert!(
        text.contains(r#""type":"mcp/servers","#)
            && text.contains(r#"{"servers":[{"name":"fx","kind":"stdio","origin":"editor"}]}"#),
        "{text}"
    );
    assert!(!text.contains("s3cr3t-value") && !text.contains("sk-mcp-model-secret"), "no secret in the log");
    assert!(text.contains(r#""meta":{"mcp":{"server":"fx","tool":"echo"}}"#), "{text}");

    // `kin sessions show` reads it without the server.
    let shown = Command::new(KIN)
        .args(["sessions", "show", &kin.session, "--sessions"])
        .arg(kin.path("sessions"))
        .args(["--config", "/dev/null"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("mcp servers: fx (stdio, editor)"), "{shown}");
    assert!(shown.contains("echo: hi") && shown.contains("[image image/png]"), "{shown}");

    let started = pids(&log);
    assert_eq!(started.len(), 1, "one server process for the session: {:?}", noted(&log));
    kin.stop();
    assert!(!running(started[0]), "the server was stopped with kin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_refuses_asks_and_a_rejected_call_never_reaches_the_server() {
    let mut kin = Kin::start("permission_mode = \"read-only\"\n", json!({})).await;
    let log = kin.path("fixture.log");
    kin.new_session(json!([fixture_entry("fx", &log, &[])]));
    // read-only refuses without asking.
    kin.script.calls(&[("r1", "mcp__fx__echo", json!({"text": "ro"}))]).text("refused");
    assert_eq!(kin.prompt("one"), "end_turn");
    // ask: the dialog names server, tool and arguments; a rejection never reaches the server.
    kin.set_mode("ask");
    kin.answers.push_back("reject-once");
    kin.script.calls(&[("a1", "mcp__fx__echo", json!({"text": "no"}))]).text("rejected");
    assert_eq!(kin.prompt("two"), "end_turn");
    // "allow always" is remembered per tool: the second echo does not ask.
    kin.answers.push_back("allow-always");
    kin.script
        .calls(&[("a2", "mcp__fx__echo", json!({"text": "yes"}))])
        .calls(&[("a3", "mcp__fx__echo", json!({"text": "again"}))])
        .text("allowed");
    assert_eq!(kin.prompt("three"), "end_turn");
    // accept-edits asks too (for another tool); bypass runs it.
    kin.set_mode("accept-edits");
    kin.answers.push_back("reject-once");
    kin.script.calls(&[("e1", "mcp__fx__image", json!({}))]).text("asked");
    assert_eq!(kin.prompt("four"), "end_turn");
    kin.set_mode("bypass");
    kin.script.calls(&[("b1", "mcp__fx__image", json!({}))]).text("ran");
    assert_eq!(kin.prompt("five"), "end_turn");
    // Arguments that are not an object cannot be sent: refused without asking.
    kin.set_mode("ask");
    kin.script.calls(&[("q1", "mcp__fx__fail", json!([1, 2]))]).text("refused");
    assert_eq!(kin.prompt("six"), "end_turn");

    let requests = kin.model_requests().await;
    let refused = tool_result(&requests[1], "r1");
    assert!(refused.starts_with("Error: ") && refused.contains("read-only"), "{refused}");
    assert_eq!(tool_result(&requests[3], "a1"), "Error: the user rejected this mcp__fx__echo call");
    assert_eq!(tool_result(&requests[6], "a3"), "echo: again");
    assert!(tool_result(&requests[8], "e1").contains("rejected"));
    assert!(tool_result(&requests[10], "b1").starts_with("a red pixel"));
    assert_eq!(tool_result(&requests[12], "q1"), "Error: arguments for fail must be a JSON object, not [1,2]");

    let asked: Vec<&Value> = kin
        .frames
        .iter()
        .filter(|f| f["method"] == "session/request_permission")
        .map(|f| &f["params"]["toolCall"])
        .collect();
    let titles: Vec<&str> = asked.iter().filter_map(|c| c["title"].as_str()).collect();
    assert_eq!(titles, ["fx: echo {\"text\":\"no\"}", "fx: echo {\"text\":\"yes\"}", "fx: image {}"], "{asked:?}");
    assert_eq!(asked[0]["rawInput"], json!({"text": "no"}));
    assert_eq!(count(&log, "call echo"), 2, "only the allowed calls reached the server: {:?}", noted(&log));
    assert_eq!(count(&log, "call image"), 1, "{:?}", noted(&log));
    kin.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_times_out_and_cancelling_the_turn_cancels_the_call() {
    let slow_log = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let config = format!(
        "permission_mode = \"bypass\"\n[mcp]\ntool_timeout_secs = 1\n\
         [mcp_servers.patient]\ncommand = {:?}\nenv = {{ FIXTURE_LOG = {:?} }}\ntool_timeout_secs = 60\n",
        fixture().display().to_string(),
        slow_log.display().to_string()
    );
    let mut kin = Kin::start(&config, json!({})).await;
    let log = kin.path("fixture.log");
    kin.new_session(json!([fixture_entry("fx", &log, &[])]));
    // The editor's server has the [mcp] default: 1 s.
    kin.script.calls(&[("t1", "mcp__fx__slow", json!({"seconds": 20}))]).text("timed out");
    assert_eq!(kin.prompt("wait"), "end_turn");
    let requests = kin.model_requests().await;
    let timed_out = tool_result(&requests[1], "t1");
    assert!(timed_out.contains("did not answer within 1 s"), "{timed_out}");
    common::until_blocking("the server to see the timeout's cancellation", || count(&log, "cancelled slow") == 1);

    // The config server waits 60 s; cancelling the turn cancels its call.
    kin.script.calls(&[("t2", "mcp__patient__slow", json!({"seconds": 20}))]);
    let session = kin.session.clone();
    let prompt = kin
        .peer
        .request("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": "wait more"}]}));
    common::until_blocking("the call to reach the server", || count(&slow_log, "call slow") == 1);
    kin.peer.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}));
    let response = kin.until("the prompt's response", |f| common::is_response(f, prompt));
    assert_eq!(response["result"]["stopReason"], "cancelled", "{response}");
    common::until_blocking("the server to see the cancellation", || count(&slow_log, "cancelled slow") == 1);
    kin.stop();
}

/// A server's answer longer than kin reads as one message (16 MiB) fails its call at once,
/// saying so (rmcp alone dropped it unseen, and the call waited out its timeout), and the server
/// keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_too_long_to_read_fails_its_call_at_once_saying_so() {
    let config = "permission_mode = \"bypass\"\n[mcp]\ntool_timeout_secs = 120\n";
    let mut kin = Kin::start(config, json!({})).await;
    let log = kin.path("fixture.log");
    kin.new_session(json!([fixture_entry("fx", &log, &[])]));
    kin.script.calls(&[("t1", "mcp__fx__huge", json!({}))]).calls(&[(
        "t2",
        "mcp__fx__echo",
        json!({"text": "still here"}),
    )]);
    let started = std::time::Instant::now();
    assert_eq!(kin.prompt("big"), "end_turn");
    assert!(started.elapsed() < Duration::from_secs(60), "the call failed at once, not at its timeout");
    let requests = kin.model_requests().await;
    let huge = tool_result(&requests[1], "t1");
    assert!(
        huge.contains("the MCP server fx answered, but its message of ")
            && huge.contains("bytes is larger than the 16777216 bytes kin reads and was dropped"),
        "{huge}"
    );
    assert!(huge.len() < 10_000, "{} bytes", huge.len());
    assert_eq!(tool_result(&requests[2], "t2"), "echo: still here");
    kin.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_list_changes_show_from_the_next_step_and_a_dead_server_restarts_once() {
    let mut kin = Kin::start("permission_mode = \"bypass\"\n", json!({"session": {"notices": {}}})).await;
    let log = kin.path("fixture.log");
    kin.new_session(json!([fixture_entry("fx", &log, &[])]));
    kin.script
        .calls(&[("l1", "mcp__fx__add_tool", json!({}))])
        .calls(&[("l2", "mcp__fx__late", json!({}))])
        .calls(&[("l3", "mcp__fx__crash", json!({}))])
        .calls(&[("l4", "mcp__fx__echo", json!({"text": "back"}))])
        .text("done");
    assert_eq!(kin.prompt("change"), "end_turn");
    let requests = kin.model_requests().await;
    assert!(!tool_names(&requests[0]).contains(&"mcp__fx__late".to_string()));
    assert!(tool_names(&requests[1]).contains(&"mcp__fx__late".to_string()), "{:?}", tool_names(&requests[1]));
    assert_eq!(tool_result(&requests[2], "l2"), "late tool ran");
    let crashed = tool_result(&requests[3], "l3");
    assert!(
        crashed.contains("MCP server fx is unavailable: it stopped during the call; kin restarts it once"),
        "{crashed}"
    );
    assert_eq!(tool_result(&requests[4], "l4"), "echo: back", "restarted before the next step");
    let started = pids(&log);
    assert_eq!(started.len(), 2, "{:?}", noted(&log));
    assert!(!running(started[0]));

    // A second death is not restarted: one notice says so.
    kin.script
        .calls(&[("m1", "mcp__fx__crash", json!({}))])
        .calls(&[("m2", "mcp__fx__echo", json!({"text": "gone"}))])
        .text("done");
    assert_eq!(kin.prompt("again"), "end_turn");
    let requests = kin.model_requests().await;
    let tools = tool_names(&requests[7]);
    assert!(!tools.iter().any(|t| t.starts_with("mcp__fx__")), "a dead server offers no tools: {tools:?}");
    let again = tool_result(&requests[6], "m1");
    assert!(again.contains("it was restarted once already, so kin does not start it again"), "{again}");
    let unknown = tool_result(&requests[7], "m2");
    assert!(unknown.contains("unknown tool") && unknown.contains("its MCP server is not running now"), "{unknown}");
    let notices: Vec<&Value> = kin.updates().into_iter().filter(|u| u["sessionUpdate"] == "notice").collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0]["title"], "MCP server `fx` stopped again");
    assert_eq!(pids(&log).len(), 2);
    kin.stop();
}

/// A server that ignores the end of its input dies with kin, even when kin is killed with
/// SIGKILL (as an editor stops an agent): it would be left running, orphaned, before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_the_end_of_its_input_dies_with_a_killed_kin() {
    let mut kin = Kin::start("permission_mode = \"bypass\"\n", json!({})).await;
    let pid_file = kin.path("server.pid");
    let script = format!("echo $$ > {}; trap '' TERM HUP; exec sleep 300", pid_file.display());
    kin.new_session(json!([{"name": "stubborn", "command": "sh", "args": ["-c", script], "env": []}]));
    common::until_blocking("the server to start", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|p| p.ends_with('\n'))
    });
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert!(running(pid));
    kin.peer.child.kill().unwrap();
    kin.peer.child.wait().unwrap();
    common::until_blocking("the server to die with kin", || !running(pid));
}

/// What a server starts in the background, in a session of its own (`setsid`, out of its
/// process group), is stopped with it: when the session closes, and when a server that never
/// completes its handshake is given up. Only the server's process group was killed before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_setsid_helpers_stop_with_it() {
    let config = "permission_mode = \"bypass\"\n[mcp]\nstartup_timeout_secs = 1\n";
    let mut kin = Kin::start(config, json!({})).await;
    let (log, helper, stalled) = (kin.path("fixture.log"), kin.path("helper.pid"), kin.path("stalled.pid"));
    let mut server = fixture_entry("fx", &log, &[]);
    let script = format!("setsid sleep 300 & echo $! > {}; exec {}", helper.display(), fixture().display());
    server["command"] = json!("sh");
    server["args"] = json!(["-c", script]);
    let stalled_script = format!("setsid sleep 300 & echo $! > {}; exec sleep 300", stalled.display());
    let never = json!({"name": "never", "command": "sh", "args": ["-c", stalled_script], "env": []});
    let id = kin.new_session(json!([server, never]));
    kin.script.calls(&[("e1", "mcp__fx__echo", json!({"text": "up"}))]).text("done");
    assert_eq!(kin.prompt("go"), "end_turn");
    assert_eq!(tool_result(&kin.model_requests().await[1], "e1"), "echo: up");
    let pid_in = |file: &Path| -> i32 { std::fs::read_to_string(file).unwrap().trim().parse().unwrap() };
    // The step waited for both servers: the one that never answers was given up by now.
    let (helper, stalled) = (pid_in(&helper), pid_in(&stalled));
    common::until_blocking("the given-up server's helper to stop", || !running(stalled));
    assert!(running(helper), "the live server's helper runs while the session is open");
    let closed = kin.call("session/close", json!({"sessionId": id}));
    assert!(closed.get("result").is_some(), "{closed}");
    assert!(!running(helper), "stopped with the session");
    kin.stop();
}

/// A server that does not exit when its input ends gets SIGTERM (a chance to clean up) before
/// it is killed at session close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_outstays_its_input_gets_sigterm_before_the_kill() {
    let mut kin = Kin::start("permission_mode = \"bypass\"\n", json!({})).await;
    let (log, termed) = (kin.path("fixture.log"), kin.path("termed"));
    let mut server = fixture_entry("fx", &log, &[]);
    // The fixture serves; when its input ends the shell stays, until a SIGTERM it notes (at once:
    // a shell runs a trap when the `wait` it is in returns, not before a foreground `sleep` ends,
    // which could outlast the grace).
    let script = format!(
        "trap 'echo term > {}; exit 0' TERM; exec 3<&0; {} <&3 3<&- & wait $!; while :; do sleep 1 & wait $!; done",
        termed.display(),
        fixture().display()
    );
    server["command"] = json!("sh");
    server["args"] = json!(["-c", script]);
    let id = kin.new_session(json!([server]));
    kin.script.calls(&[("e1", "mcp__fx__echo", json!({"text": "up"}))]).text("done");
    assert_eq!(kin.prompt("go"), "end_turn");
    let closed = kin.call("session/close", json!({"sessionId": id}));
    assert!(closed.get("result").is_some(), "{closed}");
    assert_eq!(std::fs::read_to_string(&termed).unwrap_or_default(), "term\n", "SIGTERM came before the kill");
    kin.stop();
}

/// kin raises its soft limit on open files to the hard one (a descriptor per open session ran
/// out at about a thousand under the common 1,024), and what it starts gets the limit kin was
/// started with back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kin_raises_its_open_files_limit_and_its_servers_get_the_original() {
    use std::os::unix::process::CommandExt;
    let lowered = |command: &mut Command| {
        // SAFETY: setrlimit on a local struct, between fork and exec.
        unsafe {
            command.pre_exec(|| {
                let mut limit: libc::rlimit = std::mem::zeroed();
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
                limit.rlim_cur = 256;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                Ok(())
            });
        }
    };
    let mut kin = Kin::start_with("permission_mode = \"bypass\"\n", json!({}), lowered).await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", kin.peer.child.id())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers[0], numbers[1].replace("unlimited", "1048576"), "soft raised to the hard limit: {line}");
    let seen = kin.path("server-limit");
    let script = format!("ulimit -Sn > {}; exec sleep 300", seen.display());
    kin.new_session(json!([{"name": "limits", "command": "sh", "args": ["-c", script], "env": []}]));
    common::until_blocking("the server to note its limit", || {
        std::fs::read_to_string(&seen).is_ok_and(|l| l.ends_with('\n'))
    });
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "256\n", "the server gets the limit kin started with");
    kin.stop();
}

/// A step that waits for a server still starting says so after 2 s, instead of a silent
/// spinner for the server's startup timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_waiting_for_a_starting_server_says_so() {
    let config = "permission_mode = \"bypass\"\n[mcp]\nstartup_timeout_secs = 4\n";
    let mut kin = Kin::start(config, json!({"session": {"notices": {}}})).await;
    kin.new_session(json!([{"name": "slowpoke", "command": "sh", "args": ["-c", "exec sleep 300"], "env": []}]));
    kin.script.text("done");
    assert_eq!(kin.prompt("hi"), "end_turn");
    let titles: Vec<String> = kin
        .updates()
        .into_iter()
        .filter(|u| u["sessionUpdate"] == "notice")
        .map(|u| u["title"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        titles,
        ["Waiting for MCP servers to start: `slowpoke`", "MCP server `slowpoke` failed to start"],
        "said while the step waited, then the failure"
    );
    kin.stop();
}

/// A server that lists more tools than kin offers (256) is cut there, and one notice says so,
/// naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_too_many_tools_is_cut_and_a_notice_says_so() {
    let mut kin = Kin::start("permission_mode = \"bypass\"\n", json!({"session": {"notices": {}}})).await;
    let log = kin.path("fixture.log");
    kin.new_session(json!([fixture_entry("fx", &log, &[("FIXTURE_EXTRA_TOOLS", "300")])]));
    kin.script.text("done");
    assert_eq!(kin.prompt("hi"), "end_turn");
    let requests = kin.model_requests().await;
    let offered = tool_names(&requests[0]).iter().filter(|n| n.starts_with("mcp__fx__")).count();
    assert_eq!(offered, 256);
    let notices: Vec<&Value> = kin.updates().into_iter().filter(|u| u["sessionUpdate"] == "notice").collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0]["title"], "MCP server `fx` offers only some of its tools");
    let said = notices[0].to_string();
    assert!(said.contains("kin offers the first 256"), "{said}");
    kin.stop();
}

/// A server that says its tool list changed and then never answers `tools/list` holds one step
/// for its startup timeout, not every step: its earlier tools are kept (and work), it is not
/// asked again for a while, and one notice says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_the_server_never_sends_holds_one_step_not_every_one() {
    let config = "permission_mode = \"bypass\"\n[mcp]\nstartup_timeout_secs = 1\n";
    let mut kin = Kin::start(config, json!({"session": {"notices": {}}})).await;
    let log = kin.path("fixture.log");
    kin.new_session(json!([fixture_entry("fx", &log, &[])]));
    kin.script
        .calls(&[("s1", "mcp__fx__stall_list", json!({}))])
        .calls(&[("e1", "mcp__fx__echo", json!({"text": "one"}))])
        .calls(&[("e2", "mcp__fx__echo", json!({"text": "two"}))])
        .text("done");
    assert_eq!(kin.prompt("stall"), "end_turn");
    let requests = kin.model_requests().await;
    assert_eq!(tool_result(&requests[2], "e1"), "echo: one");
    assert_eq!(tool_result(&requests[3], "e2"), "echo: two");
    assert!(tool_names(&requests[3]).contains(&"mcp__fx__echo".to_string()), "the earlier tools are kept");
    assert_eq!(count(&log, "list"), 2, "the first listing and one re-list, not one per step");
    let notices: Vec<&Value> = kin.updates().into_iter().filter(|u| u["sessionUpdate"] == "notice").collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    let title = notices[0]["title"].as_str().unwrap();
    assert!(title.starts_with("MCP server `fx` changed its tools but could not list them"), "{title}");
    kin.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_kin_cannot_use_get_one_notice_each_and_the_others_work() {
    let mut kin = Kin::start(
        "permission_mode = \"bypass\"\n[mcp]\nstartup_timeout_secs = 2\n",
        json!({"session": {"notices": {}}}),
    )
    .await;
    let log = kin.path("fixture.log");
    let shell_pids = kin.path("pids");
    let sh = |script: &str| script.replace("PIDS", &shell_pids.display().to_string());
    // A script whose interpreter does not exist.
    let script = kin.path("server.sh");
    std::fs::write(&script, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let servers = json!([
        {"name": "missing", "command": "/nonexistent/mcp-server", "args": [], "env": []},
        {"name": "garbage", "command": "sh", "args": ["-c", sh("echo $$ >> PIDS; echo 'this is not JSON-RPC'; echo 'garbage server says hi' >&2; exec sleep 300")], "env": []},
        {"name": "hang", "command": "sh", "args": ["-c", sh("echo $$ >> PIDS; exec sleep 300")], "env": []},
        {"type": "sse", "name": "events", "url": "http://127.0.0.1:9/sse", "headers": []},
        {"name": "exits", "command": "sh", "args": ["-c", "echo 'error: GITHUB_TOKEN is not set' >&2; exit 1"], "env": []},
        {"name": "shebang", "command": script.display().to_string(), "args": [], "env": []},
        {"type": "http", "name": "badurl", "url": "not a url", "headers": []},
        fixture_entry("fx", &log, &[]),
    ]);
    kin.new_session(servers);
    let mut notices = Vec::new();
    while notices.len() < 7 {
        let frame = kin.until("seven notices", |f| f["params"]["update"]["sessionUpdate"] == "notice");
        notices.push(frame["params"]["update"].clone());
    }
    let find = |server: &str| {
        notices
            .iter()
            .find(|n| n["title"].as_str().unwrap().contains(&format!("`{server}`")))
            .unwrap_or_else(|| panic!("{notices:?}"))
    };
    let missing = find("missing");
    assert_eq!(missing["severity"], "warning");
    assert_eq!(missing["title"], "MCP server `missing` failed to start");
    assert_eq!(missing["description"], "The command `/nonexistent/mcp-server` was not found.");
    let garbage = find("garbage");
    assert!(
        garbage["description"].as_str().unwrap().contains("Last stderr lines:\ngarbage server says hi"),
        "{garbage}"
    );
    let hang = find("hang");
    assert!(hang["description"].as_str().unwrap().contains("within 2 s"), "{hang}");
    assert_eq!(find("events")["title"], "MCP server `events` was skipped");
    // A server that exits at start says so with its status and last words, not a broken pipe.
    let exits = find("exits")["description"].as_str().unwrap().to_string();
    assert!(exits.contains("exited (exit status: 1) before completing the MCP handshake"), "{exits}");
    assert!(exits.contains("GITHUB_TOKEN is not set"), "{exits}");
    let shebang = find("shebang")["description"].as_str().unwrap().to_string();
    assert!(shebang.contains("the interpreter its `#!` line names was not found"), "{shebang}");
    let badurl = find("badurl")["description"].as_str().unwrap().to_string();
    assert!(badurl.contains("is not a valid http or https URL"), "{badurl}");

    kin.script.calls(&[("w1", "mcp__fx__echo", json!({"text": "still here"}))]).text("done");
    assert_eq!(kin.prompt("go"), "end_turn");
    let requests = kin.model_requests().await;
    let tools = tool_names(&requests[0]);
    assert!(tools.iter().filter(|t| t.starts_with("mcp__")).all(|t| t.starts_with("mcp__fx__")), "{tools:?}");
    assert_eq!(tool_result(&requests[1], "w1"), "echo: still here");
    let shells: Vec<i32> =
        std::fs::read_to_string(&shell_pids).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(shells.len(), 2);
    common::until_blocking("the failed servers' processes to be gone", || shells.iter().all(|pid| !running(*pid)));
    kin.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_notice_capability_the_user_reads_an_agent_message() {
    let mut kin = Kin::start("permission_mode = \"bypass\"\n", json!({})).await;
    kin.new_session(json!([{"name": "missing", "command": "/nonexistent/mcp-server", "args": [], "env": []}]));
    let frame = kin.until("the message", |f| f["params"]["update"]["sessionUpdate"] == "agent_message_chunk");
    let text = frame["params"]["update"]["content"]["text"].as_str().unwrap();
    assert!(text.starts_with("MCP server `missing` failed to start: The command"), "{text}");
    kin.stop();
}

/// An `mcpServers` entry the SDK cannot read (alone it answers "data did not match any variant of
/// untagged enum McpServer") is refused with the request's id, naming the entry and what is wrong
/// with it; the same kin then opens a session once the entry is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_entry_kin_cannot_read_is_refused_naming_it_and_kin_keeps_serving() {
    let mut kin = Kin::start("permission_mode = \"bypass\"\n", json!({})).await;
    let log = kin.path("fixture.log");
    let cwd = kin.cwd.clone();
    for (bad, says) in [
        (
            json!({"type": "websocket", "name": "ws", "url": "ws://127.0.0.1:9"}),
            "mcpServers[1] (\"ws\") has the transport type \"websocket\", which kin does not know",
        ),
        (
            json!({"type": "http", "name": "web", "headers": []}),
            "mcpServers[1] (\"web\") cannot be read (missing field `url`)",
        ),
    ] {
        let servers = json!([fixture_entry("fx", &log, &[]), bad]);
        let refused = kin.call("session/new", json!({"cwd": cwd, "mcpServers": servers}));
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("Invalid params: {says}.")), "{message}");
        assert!(message.contains("fix the entry in the editor's MCP server settings, or remove it"), "{message}");
    }
    kin.new_session(json!([fixture_entry("fx", &log, &[]), {"type": "http", "name": "web", "url": "http://127.0.0.1:9/mcp", "headers": []}]));
    kin.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_share_the_servers_under_their_tool_filter() {
    let config = "permission_mode = \"bypass\"\n[subagents]\nallow_tools = [\"mcp__fx__echo\"]\nbackground = false\n";
    let mut kin = Kin::start(config, json!({})).await;
    let log = kin.path("fixture.log");
    kin.new_session(json!([fixture_entry("fx", &log, &[])]));
    kin.script
        .calls(&[("p1", "subagent", json!({"description": "echo", "prompt": "Echo child."}))])
        .calls(&[("k1", "mcp__fx__echo", json!({"text": "from the child"}))])
        .text("child done")
        .text("parent done");
    assert_eq!(kin.prompt("delegate"), "end_turn");
    let requests = kin.model_requests().await;
    assert_eq!(requests.len(), 4);
    let child_tools = tool_names(&requests[1]);
    assert!(child_tools.contains(&"mcp__fx__echo".to_string()), "{child_tools:?}");
    assert!(!child_tools.contains(&"mcp__fx__image".to_string()), "the child's filter applies: {child_tools:?}");
    assert_eq!(tool_result(&requests[2], "k1"), "echo: from the child");
    assert_eq!(pids(&log).len(), 1, "the child used the session's server: {:?}", noted(&log));
    kin.stop();
}

/// The fixture serving MCP over HTTP, noting into `log`: the process and its `host:port`.
fn http_fixture(log: &Path) -> (std::process::Child, String) {
    let mut http = Command::new(fixture())
        .arg("--http")
        .env("FIXTURE_LOG", log)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(http.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr =
        line.trim().strip_prefix("listening ").unwrap_or_else(|| panic!("the fixture said {line:?}")).to_string();
    (http, addr)
}

/// Over HTTP: an answer larger than the client reads ends the connection, which kin opens again
/// for the next step (no restart is used up: the server still serves); a server that dies during
/// a call ends the call (pings go unanswered) instead of holding it for the tool timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_s_oversized_answer_fails_the_call_and_its_death_ends_it() {
    let tmp = tempfile::tempdir().unwrap();
    let http_log = tmp.path().join("http.log");
    let (mut http, addr) = http_fixture(&http_log);
    let config = "permission_mode = \"bypass\"\n[mcp]\ntool_timeout_secs = 60\n";
    let mut kin = Kin::start(config, json!({"session": {"notices": {}}})).await;
    kin.new_session(json!([{"type": "http", "name": "remote", "url": format!("http://{addr}/mcp"), "headers": []}]));
    kin.script
        .calls(&[("h1", "mcp__remote__huge", json!({}))])
        .calls(&[("h2", "mcp__remote__echo", json!({"text": "still here"}))])
        .calls(&[("h3", "mcp__remote__slow", json!({"seconds": 50}))])
        .text("done");
    let session = kin.session.clone();
    let prompt =
        kin.peer.request("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}));
    // The fixture notes the slow call as it starts it: then it dies.
    common::until_blocking("the slow call to reach the server", || count(&http_log, "call slow") == 1);
    http.kill().unwrap();
    http.wait().unwrap();
    let answer = kin.until("the prompt's answer", |f| common::is_response(f, prompt));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let requests = kin.model_requests().await;
    let ended = "MCP server remote is unavailable: the connection to it ended during the call";
    let huge = tool_result(&requests[1], "h1");
    assert!(huge.contains(ended) && huge.contains("larger than the 16 MiB kin reads"), "{huge}");
    assert_eq!(tool_result(&requests[2], "h2"), "echo: still here", "connected again");
    let died = tool_result(&requests[3], "h3");
    assert!(died.contains(ended), "{died}");
    // A second lost connection is not the end of it: the next step connects again (and finds
    // nobody, which one notice says).
    let notices: Vec<&Value> = kin.updates().into_iter().filter(|u| u["sessionUpdate"] == "notice").collect();
    assert!(notices.iter().all(|n| !n["title"].as_str().unwrap().contains("stopped again")), "{notices:?}");
    kin.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeds_session_new_with_an_http_and_a_stdio_server() {
    let tmp = tempfile::tempdir().unwrap();
    let http_log = tmp.path().join("http.log");
    let (mut http, addr) = http_fixture(&http_log);

    let mut kin = Kin::start("permission_mode = \"bypass\"\n", json!({"fs": {"readTextFile": true}})).await;
    let log = kin.path("fixture.log");
    // Zed's shape: stdio entries without `type`, `env` as name/value pairs; http with headers.
    let servers = json!([
        {"name": "fixture", "command": fixture(), "args": [], "env": [{"name": "FIXTURE_LOG", "value": log}]},
        {"type": "http", "name": "remote", "url": format!("http://{addr}/mcp"), "headers": [{"name": "Authorization", "value": "Bearer zed-token"}]},
    ]);
    kin.new_session(servers);
    kin.script
        .calls(&[
            ("z1", "mcp__remote__echo", json!({"text": "over http"})),
            ("z2", "mcp__fixture__echo", json!({"text": "over stdio"})),
        ])
        .text("done");
    assert_eq!(kin.prompt("both"), "end_turn");
    let requests = kin.model_requests().await;
    assert_eq!(tool_result(&requests[1], "z1"), "echo: over http");
    assert_eq!(tool_result(&requests[1], "z2"), "echo: over stdio");
    assert!(noted(&http_log).contains(&"auth Bearer zed-token".to_string()), "{:?}", noted(&http_log));
    assert!(kin.log().contains(r#"{"name":"remote","kind":"http","origin":"editor"}"#));
    assert!(!kin.log().contains("zed-token"), "headers never reach the log");
    kin.stop();
    let _ = http.kill();
    let _ = http.wait();
}

/// `@modelcontextprotocol/server-everything`, installed from `tests/mcp-everything/package.json`
/// into a scratch directory and started through `npx` (skipped, saying why, when it cannot be
/// installed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_through_npx() {
    let available = |program: &str| {
        Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !available("node") || !available("npx") {
        eprintln!("skipping: node/npx not found; the server-everything test needs Node.js");
        return;
    }
    let npm_dir = tempfile::tempdir().unwrap();
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp-everything/package.json");
    std::fs::copy(package, npm_dir.path().join("package.json")).unwrap();
    let install = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--loglevel=error", "--fetch-timeout=60000", "--fetch-retries=2"])
        .current_dir(npm_dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if !install.status.success() {
        eprintln!(
            "skipping: npm could not install @modelcontextprotocol/server-everything ({}): {}",
            install.status,
            String::from_utf8_lossy(&install.stderr)
        );
        return;
    }
    let mut kin = Kin::start("permission_mode = \"bypass\"\n[mcp]\nstartup_timeout_secs = 60\n", json!({})).await;
    let npx = json!({"name": "everything", "command": "npx", "args": ["--no-install", "mcp-server-everything", "stdio"], "env": []});
    // npx finds the installed package from the session cwd.
    kin.cwd = npm_dir.path().to_path_buf();
    kin.new_session(json!([npx]));
    kin.script
        .calls(&[
            ("e1", "mcp__everything__echo", json!({"message": "hi"})),
            ("e2", "mcp__everything__get-sum", json!({"a": 2, "b": 3})),
        ])
        .text("done");
    assert_eq!(kin.prompt("everything"), "end_turn");
    let requests = kin.model_requests().await;
    let tools = tool_names(&requests[0]);
    assert!(tools.contains(&"mcp__everything__get-tiny-image".to_string()), "{tools:?}");
    assert_eq!(tool_result(&requests[1], "e1"), "Echo: hi");
    assert!(tool_result(&requests[1], "e2").contains('5'), "{}", tool_result(&requests[1], "e2"));
    kin.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_close_and_load_start_and_stop_the_servers() {
    let mut kin = Kin::start("permission_mode = \"bypass\"\n", json!({})).await;
    let (first, second) = (kin.path("first.log"), kin.path("second.log"));
    let id = kin.new_session(json!([fixture_entry("fx", &first, &[])]));
    kin.script.calls(&[("f1", "mcp__fx__echo", json!({"text": "fx"}))]).text("done");
    assert_eq!(kin.prompt("first"), "end_turn");
    // A resume naming the same servers keeps them.
    let same = kin.call(
        "session/resume",
        json!({"sessionId": id, "cwd": kin.cwd, "mcpServers": [fixture_entry("fx", &first, &[])]}),
    );
    assert!(same.get("result").is_some(), "{same}");
    // A resume naming others replaces them.
    let other = kin.call(
        "session/resume",
        json!({"sessionId": id, "cwd": kin.cwd, "mcpServers": [fixture_entry("fy", &second, &[])]}),
    );
    assert!(other.get("result").is_some(), "{other}");
    assert!(!running(pids(&first)[0]), "the replaced server is stopped before the resume answers");
    common::until_blocking("the second server", || pids(&second).len() == 1);
    kin.script.calls(&[("r1", "mcp__fy__echo", json!({"text": "fy"}))]).text("done");
    assert_eq!(kin.prompt("which"), "end_turn");
    let requests = kin.model_requests().await;
    assert!(!tool_names(&requests[2]).iter().any(|t| t.starts_with("mcp__fx__")));
    assert_eq!(tool_result(&requests[3], "r1"), "echo: fy");
    // Closing the session stops its servers; loading it starts the ones it names now.
    let closed = kin.call("session/close", json!({"sessionId": id}));
    assert!(closed.get("result").is_some(), "{closed}");
    assert!(!running(pids(&second)[0]), "closed with the session");
    let loaded = kin.call(
        "session/load",
        json!({"sessionId": id, "cwd": kin.cwd, "mcpServers": [fixture_entry("fx", &first, &[])]}),
    );
    assert!(loaded.get("result").is_some(), "{loaded}");
    common::until_blocking("the server of the loaded session", || pids(&first).len() == 2);
    // A fork gets the servers its request names.
    let forked = kin.call(
        "session/fork",
        json!({"sessionId": id, "cwd": kin.cwd, "mcpServers": [fixture_entry("fy", &second, &[])]}),
    );
    assert!(forked["result"]["sessionId"].is_string(), "{forked}");
    common::until_blocking("the fork's server", || pids(&second).len() == 2);
    let last = pids(&first)[1];
    let store = kin::testkit::session::SessionStore::new(kin.path("sessions"));
    let path = store.locate(&id).unwrap().unwrap();
    let tmp = kin.stop_keeping_files();
    assert!(!running(last), "stopped on exit");
    let log = std::fs::read_to_string(path).unwrap();
    let recorded: Vec<&str> = log.lines().filter(|l| l.contains(r#""type":"mcp/servers""#)).collect();
    assert_eq!(recorded.len(), 3, "new, the resume that changed them, load: {recorded:?}");
    assert!(recorded[1].contains(r#""name":"fy""#) && recorded[2].contains(r#""name":"fx""#));
    drop(tmp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_servers_read_only_hints_count_and_no_one_elses() {
    let trusted_log = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let config = format!(
        "permission_mode = \"read-only\"\n[mcp_servers.trusted]\ncommand = {:?}\nenv = {{ FIXTURE_LOG = {:?} }}\n\
         trust = \"read-only-hints\"\n",
        fixture().display().to_string(),
        trusted_log.display().to_string()
    );
    let mut kin = Kin::start(&config, json!({})).await;
    let log = kin.path("fixture.log");
    kin.new_session(json!([fixture_entry("fx", &log, &[])]));
    // `echo` is annotated readOnlyHint: it runs in read-only mode from the trusted server only.
    kin.script
        .calls(&[
            ("h1", "mcp__trusted__echo", json!({"text": "trusted"})),
            ("h2", "mcp__trusted__image", json!({})),
            ("h3", "mcp__fx__echo", json!({"text": "untrusted"})),
        ])
        .text("done");
    assert_eq!(kin.prompt("hints"), "end_turn");
    let requests = kin.model_requests().await;
    assert_eq!(tool_result(&requests[1], "h1"), "echo: trusted");
    assert!(tool_result(&requests[1], "h2").contains("read-only"), "{}", tool_result(&requests[1], "h2"));
    assert!(tool_result(&requests[1], "h3").contains("read-only"), "{}", tool_result(&requests[1], "h3"));
    assert_eq!(count(&trusted_log, "call echo"), 1);
    assert_eq!(count(&trusted_log, "call image"), 0);
    assert_eq!(count(&log, "call echo"), 0, "an editor server is never trusted");
    kin.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kin_run_uses_the_config_servers_and_notes_the_unusable_ones_on_stderr() {
    let server = MockServer::start().await;
    let script = Script::default();
    Mock::given(method("POST")).and(path("/chat/completions")).respond_with(script.clone()).mount(&server).await;
    script.calls(&[("k1", "mcp__fx__echo", json!({"text": "headless"}))]).text("ANSWER");
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("fixture.log");
    let config = tmp.path().join("config.toml");
    let text = format!(
        "[mcp_servers.fx]\ncommand = {:?}\nenv = {{ FIXTURE_LOG = {:?} }}\n\
         [mcp_servers.missing]\ncommand = \"/nonexistent/mcp-server\"\n",
        fixture().display().to_string(),
        log.display().to_string()
    );
    std::fs::write(&config, text).unwrap();
    let run = Command::new(KIN)
        .args(["run", "--permission-mode", "bypass", "Use the fixture."])
        .arg("--config")
        .arg(&config)
        .arg("--sessions")
        .arg(tmp.path().join("sessions"))
        .current_dir(tmp.path())
        .env("DEEPSEEK_BASE_URL", server.uri())
        .env("DEEPSEEK_API_KEY", "sk-run")
        .env_remove("KIN_MODEL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "ANSWER", "the answer alone on stdout");
    assert!(
        stderr.contains(
            "kin: MCP server `missing` failed to start: The command `/nonexistent/mcp-server` was not found."
        ),
        "{stderr}"
    );
    assert_eq!(count(&log, "call echo"), 1, "{:?}", noted(&log));
    let requests = server.received_requests().await.unwrap();
    let second: Value = serde_json::from_slice(&requests[1].body).unwrap();
    assert_eq!(tool_result(&second, "k1"), "echo: headless");
}
