//! Named child agents (issue 24) over the real binary and real HTTP: `kin acp` with
//! `DEEPSEEK_BASE_URL` pointed at a loopback mock that records every model request. The model
//! picks an agent through `subagent`'s `agent` parameter; the child's own request shows its
//! persona and tools, a call outside them is refused, the descriptor records the agent, and a
//! continuable child resumed after a restart runs as it was started even after its file changed
//! or was deleted.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{body_string_contains, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

#[allow(dead_code)]
mod common;
use common::{KIN, Peer, chat_sse, chunk};

const WAIT: Duration = Duration::from_secs(30);

fn sse(body: String) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

/// A model answer that calls one tool.
fn tool_call(id: &str, name: &str, arguments: Value) -> ResponseTemplate {
    sse(chat_sse(&[
        chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
    ]))
}

/// A model answer of plain text.
fn text(answer: &str) -> ResponseTemplate {
    sse(chat_sse(&[chunk(json!({"role": "assistant", "content": answer}), None), chunk(json!({}), Some("stop"))]))
}

/// Mounts `answer` for the next model request (of any session) that contains `marker`
/// (`None`: any request); earlier-mounted answers go first.
async fn answer_once(server: &MockServer, marker: Option<&str>, answer: ResponseTemplate) {
    let mock = Mock::given(method("POST")).and(path("/chat/completions"));
    match marker {
        Some(marker) => {
            mock.and(body_string_contains(marker)).respond_with(answer).up_to_n_times(1).mount(server).await
        }
        None => mock.respond_with(answer).up_to_n_times(1).mount(server).await,
    }
}

fn body(request: &Request) -> Value {
    serde_json::from_slice(&request.body).unwrap()
}

fn system_text(request: &Value) -> String {
    request["messages"][0]["content"].as_str().unwrap_or_default().to_string()
}

fn tool_names(request: &Value) -> Vec<String> {
    let mut names: Vec<String> = request["tools"]
        .as_array()
        .map(|tools| tools.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    names.sort();
    names
}

fn tool_schema<'a>(request: &'a Value, name: &str) -> &'a Value {
    request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("no {name} tool offered: {request}"))
}

/// The text of the tool message answering `call_id`.
fn tool_result(request: &Value, call_id: &str) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no result for {call_id} in {request}"))
        .to_string()
}

/// One kin process of a test: its files live under `root`.
struct Kin {
    peer: Peer,
    frames: Vec<Value>,
}

impl Kin {
    fn start(root: &Path, server: &MockServer, subagents: bool) -> Kin {
        let mut peer = Peer::spawn(
            Command::new(KIN)
                .args(["acp", "--permission-mode", "bypass", "--config"])
                .arg(root.join("config.toml"))
                .arg("--sessions")
                .arg(root.join("sessions"))
                .arg("--log-file")
                .arg(root.join("kin.log"))
                .current_dir(root.join("cwd"))
                .env("DEEPSEEK_BASE_URL", server.uri())
                .env("DEEPSEEK_API_KEY", "sk-named-agents")
                .env("HOME", root.join("home"))
                .env("XDG_CONFIG_HOME", root.join("xdg"))
                .env_remove("CLAUDE_CONFIG_DIR")
                .env_remove("KIN_MODEL")
                .env_remove("RUST_LOG")
                .stderr(Stdio::null()),
        );
        let capabilities = if subagents { json!({"subagents": {}}) } else { json!({}) };
        let init = peer.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": capabilities}), WAIT);
        assert!(init.get("result").is_some(), "{init}");
        Kin { peer, frames: Vec::new() }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.peer.request(method, params);
        let frames = &mut self.frames;
        self.peer.response(id, WAIT, |frame| frames.push(frame.clone()))
    }

    fn new_session(&mut self, cwd: &Path) -> String {
        let response = self.call("session/new", json!({"cwd": cwd, "mcpServers": []}));
        response["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{response}")).to_string()
    }

    fn prompt(&mut self, session: &str, text: &str) -> Value {
        let response =
            self.call("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}));
        assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
        response
    }

    fn updates(&self) -> impl Iterator<Item = &Value> {
        self.frames.iter().filter(|f| f["params"]["update"].is_object()).map(|f| &f["params"]["update"])
    }

    /// Closes stdin and waits for a clean exit.
    fn stop(mut self) {
        self.peer.close_stdin();
        let status = self.peer.child.wait().unwrap();
        assert!(status.success(), "kin exited {status}");
    }
}

/// A test's directories: the workspace `cwd`, a fake home and config dir, and the config file.
fn layout(config: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    for dir in ["cwd", "home", "xdg"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("config.toml"), config).unwrap();
    (tmp, root)
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn read_log(root: &Path, id: &str) -> Vec<Value> {
    let store = kin::testkit::session::SessionStore::new(root.join("sessions"));
    let path = store.locate(id).unwrap().unwrap_or_else(|| panic!("no log for {id}"));
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn descriptor(log: &[Value]) -> Value {
    let found: Vec<&Value> = log.iter().filter(|e| e["type"] == "subagent/descriptor").collect();
    assert_eq!(found.len(), 1, "exactly one descriptor: {log:?}");
    found[0]["data"].clone()
}

/// The id of the one child session kin created (its `session` header names a parent).
fn only_child(root: &Path, parent: &str) -> String {
    let store = kin::testkit::session::SessionStore::new(root.join("sessions"));
    let parent_log = store.locate(parent).unwrap().unwrap();
    // <sessions>/<project>/<session>/<log>: the children are sessions of the same project.
    let dir = parent_log.parent().unwrap().parent().unwrap();
    let mut children = Vec::new();
    for entry in walk(dir) {
        let first = std::fs::read_to_string(&entry).unwrap();
        let header: Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
        if header["parentSession"] == parent {
            children.push(header["id"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(children.len(), 1, "one child of {parent}: {children:?}");
    children.pop().unwrap()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "jsonl") {
            files.push(path);
        }
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_picks_review_and_the_child_runs_as_it() {
    let server = MockServer::start().await;
    let (_tmp, root) = layout("");
    let cwd = root.join("cwd");
    answer_once(
        &server,
        None,
        tool_call(
            "call_1",
            "subagent",
            json!({"description": "check the parser", "prompt": "Review parser.rs.", "agent": "review"}),
        ),
    )
    .await;
    answer_once(&server, None, tool_call("call_c1", "bash", json!({"command": "touch pwned"}))).await;
    answer_once(&server, None, text("FINDINGS: none of weight")).await;
    answer_once(&server, None, text("PARENT_DONE")).await;

    let mut kin = Kin::start(&root, &server, true);
    let session = kin.new_session(&cwd);
    kin.prompt(&session, "Have the parser reviewed.");

    let requests: Vec<Value> = server.received_requests().await.unwrap().iter().map(body).collect();
    assert_eq!(requests.len(), 4, "parent, child twice, parent");
    // The parent is offered the agents by name, and reads what each is for.
    let subagent = &tool_schema(&requests[0], "subagent")["function"];
    assert_eq!(subagent["parameters"]["properties"]["agent"]["enum"], json!(["explore", "general", "review"]));
    let description = subagent["description"].as_str().unwrap();
    assert!(description.contains("\n- review: Reviews code read-only"), "{description}");
    assert!(description.contains("\n- explore: "), "{description}");
    // The child runs with the review persona and only the read-only tools.
    let child = &requests[1];
    assert!(system_text(child).contains("You are a reviewer"), "{}", system_text(child));
    assert!(!system_text(&requests[0]).contains("You are a reviewer"), "the parent's prompt has no persona");
    assert_eq!(tool_names(child), ["glob", "grep", "read"]);
    // Its call outside them is refused and never runs.
    let refused = tool_result(&requests[2], "call_c1");
    assert!(refused.contains("unknown tool \"bash\""), "{refused}");
    assert!(!cwd.join("pwned").exists(), "the refused command never ran");
    assert_eq!(tool_result(&requests[3], "call_1"), "FINDINGS: none of weight");

    // The descriptor records the agent, and the editor sees the child titled by it.
    let child_id = only_child(&root, &session);
    let recorded = descriptor(&read_log(&root, &child_id));
    assert_eq!(recorded["agent"], json!({"name": "review", "permissionMode": "read-only"}), "{recorded}");
    let call = kin.updates().find(|u| u["sessionUpdate"] == "tool_call" && u["toolCallId"] == "call_1").cloned();
    assert_eq!(call.unwrap()["title"], "review: check the parser");
    let announced = kin.updates().find(|u| u["sessionUpdate"] == "subagent_update").cloned().expect("announced");
    assert_eq!(announced["title"], "review: check the parser", "{announced}");
    kin.stop();
}

/// The requests of a child whose persona contains `marker`, in order.
async fn child_requests(server: &MockServer, marker: &str) -> Vec<Value> {
    server.received_requests().await.unwrap().iter().map(body).filter(|b| system_text(b).contains(marker)).collect()
}

/// Waits until the child's log holds `turns` completed turns and no open one.
async fn until_turns(root: &Path, child: &str, turns: usize) {
    common::until(&format!("{turns} child turns ended"), || {
        let Ok(Some(path)) = kin::testkit::session::SessionStore::new(root.join("sessions")).locate(child) else {
            return false;
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.matches("\"type\":\"turn/end\"").count() >= turns
            && text.matches("\"type\":\"turn/start\"").count() == turns
    })
    .await;
}

const NOTES_V1: &str =
    "---\nname: notes\ndescription: Takes notes.\ntools: [read]\nbackground: true\n---\nPERSONA_V1: you take notes.\n";
const NOTES_V2: &str = "---\nname: notes\ndescription: Takes notes, now with grep.\ntools: [read, grep]\n---\nPERSONA_V2: you take other notes.\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_child_runs_as_it_was_started_after_its_file_changed_or_vanished() {
    let server = MockServer::start().await;
    let (_tmp, root) = layout("");
    let cwd = root.join("cwd");
    let file = cwd.join(".kin/agents/notes.md");
    write(&file, NOTES_V1);
    // Every request of the child (its persona has the marker) gets the same answer.
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .and(body_string_contains("PERSONA_V"))
        .respond_with(text("NOTED"))
        .mount(&server)
        .await;
    // No `run_in_background`: the agent's `background: true` makes it a continuable child.
    let start = json!({"description": "take notes", "prompt": "Note the layout.", "agent": "notes"});
    answer_once(&server, None, tool_call("call_1", "subagent", start)).await;
    answer_once(&server, None, text("STARTED")).await;

    let mut kin = Kin::start(&root, &server, false);
    let session = kin.new_session(&cwd);
    kin.prompt(&session, "Start the note taker.");
    let child = only_child(&root, &session);
    until_turns(&root, &child, 1).await;
    let parent_requests: Vec<Value> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(body)
        .filter(|b| !system_text(b).contains("PERSONA_V"))
        .collect();
    assert_eq!(tool_result(&parent_requests[1], "call_1"), format!("started subagent {child}"));
    let first = child_requests(&server, "PERSONA_V1").await;
    assert_eq!(first.len(), 1);
    let first_tools = tool_names(&first[0]);
    assert!(first_tools.contains(&"read".to_string()) && !first_tools.contains(&"grep".to_string()), "{first_tools:?}");
    let recorded = descriptor(&read_log(&root, &child));
    assert_eq!(recorded["mode"], "continuable");
    assert_eq!(recorded["agent"]["name"], "notes");
    assert!(recorded["persona"].as_str().unwrap().starts_with("PERSONA_V1"), "{recorded}");
    kin.stop();

    // The file changes; after a restart the parent lists the child and sends it more work.
    write(&file, NOTES_V2);
    answer_once(&server, None, tool_call("call_2", "list_agents", json!({}))).await;
    let more = json!({"subagent_id": child, "message": "Note the tests too."});
    answer_once(&server, None, tool_call("call_3", "send_message", more.clone())).await;
    answer_once(&server, None, text("SENT")).await;
    let mut kin = Kin::start(&root, &server, true);
    let loaded = kin.call("session/load", json!({"sessionId": session, "cwd": cwd, "mcpServers": []}));
    assert!(loaded.get("result").is_some(), "{loaded}");
    // The agent tree shows the stored child titled by the agent it was started as.
    let stored = kin.updates().find(|u| u["sessionUpdate"] == "subagent_update").cloned().expect("announced");
    assert_eq!(stored["title"], "notes: take notes", "{stored}");
    kin.prompt(&session, "List them, then send more.");
    until_turns(&root, &child, 2).await;
    let requests: Vec<Value> = server.received_requests().await.unwrap().iter().map(body).collect();
    let after_list = requests.iter().rev().find(|b| b["messages"].to_string().contains("call_2")).unwrap();
    let listed = tool_result(after_list, "call_2");
    assert_eq!(listed, format!("{child} [complete] \u{2014} notes: take notes"));
    assert!(child_requests(&server, "PERSONA_V2").await.is_empty(), "the edited persona is never used");
    let resumed = child_requests(&server, "PERSONA_V1").await;
    assert_eq!(resumed.len(), 2, "the resumed turn runs with the recorded persona");
    assert_eq!(tool_names(&resumed[1]), first_tools, "and the recorded tools");
    kin.stop();
    let log = std::fs::read_to_string(root.join("kin.log")).unwrap();
    assert!(log.contains("the agent \"notes\" changed since it started"), "{log}");

    // The file is deleted; the child still resumes as it started.
    std::fs::remove_file(&file).unwrap();
    answer_once(&server, None, tool_call("call_4", "send_message", more)).await;
    answer_once(&server, None, text("SENT AGAIN")).await;
    let mut kin = Kin::start(&root, &server, false);
    kin.call("session/load", json!({"sessionId": session, "cwd": cwd, "mcpServers": []}));
    kin.prompt(&session, "Send more again.");
    until_turns(&root, &child, 3).await;
    let resumed = child_requests(&server, "PERSONA_V1").await;
    assert_eq!(resumed.len(), 3);
    assert_eq!(tool_names(&resumed[2]), first_tools);
    kin.stop();
    let log = std::fs::read_to_string(root.join("kin.log")).unwrap();
    assert!(log.contains("the agent \"notes\" it was started as is no longer defined"), "{log}");
    assert_eq!(descriptor(&read_log(&root, &child)), recorded, "cold resume writes no second descriptor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_come_from_both_file_locations_at_both_levels_and_the_config() {
    let server = MockServer::start().await;
    let config = "[agents.table]\ndescription = \"From the config table.\"\nprompt = \"TABLE\"\n\n\
                  [agents.shadowed]\ndescription = \"The config's shadowed.\"\n";
    let (_tmp, root) = layout(config);
    let cwd = root.join("cwd");
    // The workspace: kin's and Claude Code's directories; Claude's spelling, an unknown key.
    write(&cwd.join(".kin/agents/tester.md"), "---\ndescription: Runs the tests.\ntools: [read, bash]\n---\nTEST\n");
    write(
        &cwd.join(".claude/agents/docs.md"),
        "---\nname: docs\ndescription: Writes docs.\ntools: Read, Grep\ncolor: blue\nmaxTurns: 5\n---\nDOCS\n",
    );
    write(&cwd.join(".kin/agents/shadowed.md"), "---\ndescription: The workspace's shadowed.\n---\nWS\n");
    // A malformed file: the quoted value on line 3 is never closed.
    write(&cwd.join(".kin/agents/broken.md"), "---\ndescription: ok\nmodel: \"unclosed\n---\nBROKEN\n");
    // The user's level: kin's directory and Claude Code's; two files there define `twin`.
    write(&root.join("xdg/kin/agents/mine.md"), "---\ndescription: The user's own.\n---\nMINE\n");
    write(&root.join("xdg/kin/agents/twin.md"), "---\ndescription: One twin.\n---\nA\n");
    write(&root.join("home/.claude/agents/other.md"), "---\nname: twin\ndescription: Other twin.\n---\nB\n");
    answer_once(&server, None, text("OK")).await;

    let mut kin = Kin::start(&root, &server, false);
    let created = kin.call("session/new", json!({"cwd": cwd, "mcpServers": []}));
    let session = created["result"]["sessionId"].as_str().unwrap().to_string();
    // The editor gets the same agents, with what each is for.
    let listed = created["result"]["_meta"]["kin"]["agents"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = listed.iter().filter_map(|a| a["name"].as_str()).collect();
    assert_eq!(names, ["docs", "explore", "general", "mine", "review", "shadowed", "table", "tester"], "{created}");
    assert_eq!(listed[0], json!({"name": "docs", "description": "Writes docs."}));
    kin.prompt(&session, "Which agents are there?");
    kin.stop();
    let requests: Vec<Value> = server.received_requests().await.unwrap().iter().map(body).collect();
    let subagent = &tool_schema(&requests[0], "subagent")["function"];
    assert_eq!(
        subagent["parameters"]["properties"]["agent"]["enum"],
        json!(["docs", "explore", "general", "mine", "review", "shadowed", "table", "tester"]),
        "the clashing twin and the broken file are left out"
    );
    let description = subagent["description"].as_str().unwrap();
    assert!(description.contains("\n- shadowed: The workspace's shadowed."), "the workspace wins: {description}");
    assert!(description.contains("\n- table: From the config table."), "{description}");
    assert!(
        tool_schema(&requests[0], "subagent_fork")["function"]["parameters"]["properties"]["agent"]["enum"]
            .as_array()
            .is_some_and(|names| names.len() == 8),
        "subagent_fork offers the same agents"
    );
    let log = std::fs::read_to_string(root.join("kin.log")).unwrap();
    let broken = cwd.join(".kin/agents/broken.md");
    assert!(log.contains(&format!("agent file {}:3:", broken.display())), "the warning names file and line: {log}");
    let (one, other) = (root.join("xdg/kin/agents/twin.md"), root.join("home/.claude/agents/other.md"));
    let clash = log.lines().find(|l| l.contains("both define the agent \"twin\"")).unwrap_or_else(|| panic!("{log}"));
    assert!(clash.contains(&one.display().to_string()) && clash.contains(&other.display().to_string()), "{clash}");
    assert!(!log.contains("color"), "an unknown key is only a debug line: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_permission_mode_only_narrows_and_its_turn_limit_applies() {
    let server = MockServer::start().await;
    let (_tmp, root) = layout("");
    let cwd = root.join("cwd");
    // kin runs in bypass; the agent may write but its mode is read-only.
    write(
        &cwd.join(".kin/agents/scribe.md"),
        "---\ndescription: Writes files.\ntools: [write]\npermissionMode: read-only\n---\nSCRIBE\n",
    );
    write(
        &cwd.join(".kin/agents/brief.md"),
        "---\ndescription: Answers briefly.\ntools: [read]\nmaxTurns: 1\n---\nBRIEF\n",
    );
    write(&cwd.join("a.txt"), "a\n");
    let scribe = json!({"description": "write it", "prompt": "Write out.txt.", "agent": "scribe"});
    answer_once(&server, None, tool_call("call_1", "subagent", scribe)).await;
    answer_once(&server, None, tool_call("call_w", "write", json!({"file_path": "out.txt", "content": "x"}))).await;
    answer_once(&server, None, text("COULD NOT WRITE")).await;
    let brief = json!({"description": "read it", "prompt": "Read a.txt, then answer.", "agent": "brief"});
    answer_once(&server, None, tool_call("call_2", "subagent", brief)).await;
    answer_once(&server, None, tool_call("call_r", "read", json!({"file_path": "a.txt"}))).await;
    answer_once(&server, None, text("PARENT_DONE")).await;

    let mut kin = Kin::start(&root, &server, false);
    let session = kin.new_session(&cwd);
    kin.prompt(&session, "Write, then read.");
    kin.stop();
    let requests: Vec<Value> = server.received_requests().await.unwrap().iter().map(body).collect();
    assert_eq!(requests.len(), 6, "parent, scribe twice, parent, brief once, parent");
    assert_eq!(tool_names(&requests[1]), ["write"]);
    let refused = tool_result(&requests[2], "call_w");
    assert!(refused.contains("write is not allowed in read-only mode"), "{refused}");
    assert!(!cwd.join("out.txt").exists(), "the refused write never ran");
    // One model call is all `brief` gets: its turn ends at the step limit after the read.
    assert!(system_text(&requests[4]).contains("BRIEF"));
    assert_eq!(
        tool_result(&requests[5], "call_2"),
        "Error: subagent run failed: the model used all 1 steps of this turn without a final answer \
         (raise agent.max_steps to allow more)"
    );
    let store = kin::testkit::session::SessionStore::new(root.join("sessions"));
    let mut brief_log = None;
    for path in walk(store.locate(&session).unwrap().unwrap().parent().unwrap().parent().unwrap()) {
        let text = std::fs::read_to_string(&path).unwrap();
        if text.contains("\"name\":\"brief\"") {
            brief_log = Some(text);
        }
    }
    let brief_log = brief_log.expect("the brief child's log");
    assert!(brief_log.contains("\"maxTurns\":1"), "the descriptor records the limit");
    assert!(brief_log.contains("the model used all 1 steps of this turn"), "{brief_log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_an_unknown_model_runs_on_its_parents_and_the_editor_is_told() {
    let server = MockServer::start().await;
    let (_tmp, root) = layout("");
    let cwd = root.join("cwd");
    // `haiku` is a Claude alias kin was not told about ([model_aliases] is empty).
    write(&cwd.join(".kin/agents/fast.md"), "---\ndescription: Answers fast.\nmodel: haiku\n---\nFAST_PERSONA\n");
    answer_once(
        &server,
        None,
        tool_call("call_1", "subagent", json!({"description": "quick look", "prompt": "Look.", "agent": "fast"})),
    )
    .await;
    answer_once(&server, None, text("LOOKED")).await;
    answer_once(&server, None, text("PARENT_DONE")).await;

    // A client without the agent tree sees the call's progress (one with it sees the child).
    let mut kin = Kin::start(&root, &server, false);
    let session = kin.new_session(&cwd);
    kin.prompt(&session, "Have a quick look.");

    let requests: Vec<Value> = server.received_requests().await.unwrap().iter().map(body).collect();
    assert_eq!(requests.len(), 3, "parent, child, parent");
    assert!(system_text(&requests[1]).contains("FAST_PERSONA"), "the child runs as the agent");
    assert_eq!(requests[1]["model"], requests[0]["model"], "on its parent's model");
    // The editor sees why on the delegating call, and the parent's log records it.
    let notice = "agent \"fast\" (";
    let shown = kin.updates().any(|u| {
        u["sessionUpdate"] == "tool_call_update"
            && u["toolCallId"] == "call_1"
            && u["content"].as_array().is_some_and(|c| {
                c.iter().any(|c| {
                    c["content"]["text"]
                        .as_str()
                        .is_some_and(|t| t.starts_with(notice) && t.contains("asks for model \"haiku\""))
                })
            })
    });
    assert!(shown, "the notice reaches the editor: {:?}", kin.frames);
    let log = read_log(&root, &session);
    let progress: Vec<&Value> = log.iter().filter(|e| e["type"] == "tool/progress").collect();
    assert!(
        progress.iter().any(|e| e["data"]["text"].as_str().is_some_and(|t| t.contains("runs on its parent's model"))),
        "{progress:?}"
    );
    kin.stop();
}
