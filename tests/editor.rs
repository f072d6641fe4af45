//! What an editor user meets, over real pipes against the real binary with loopback model
//! servers: images and embedded files in prompts reach an OpenAI-compatible and an Anthropic
//! server in their wire shapes (and a route that takes no images gets a placeholder and one
//! notice), `read` shows an image file, and a loaded session shows the prompt's image again.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[allow(dead_code)]
mod common;
use common::{KIN, Peer, chat_sse, chunk};

/// A 1×1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
const WAIT: Duration = Duration::from_secs(30);

fn sse(body: String) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

fn openai_text(text: &str) -> ResponseTemplate {
    sse(chat_sse(&[chunk(json!({"role": "assistant", "content": text}), None), chunk(json!({}), Some("stop"))]))
}

fn anthropic_sse(events: &[Value]) -> ResponseTemplate {
    let body: String =
        events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("message"))).collect();
    sse(body)
}

fn message_start() -> Value {
    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [], "stop_reason": null, "usage": {"input_tokens": 10, "output_tokens": 1}}})
}

fn anthropic_text(text: &str) -> ResponseTemplate {
    anthropic_sse(&[
        message_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        json!({"type": "message_stop"}),
    ])
}

fn anthropic_tool_use(id: &str, name: &str, input: Value) -> ResponseTemplate {
    anthropic_sse(&[
        message_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
        json!({"type": "message_stop"}),
    ])
}

/// A kin over pipes, the frames it sent so far, and its working directory.
struct Editor {
    kin: Peer,
    frames: Vec<Value>,
    _tmp: tempfile::TempDir,
    cwd: std::path::PathBuf,
}

impl Editor {
    /// `kin acp` in bypass mode with `config` and `env`, its sessions and cwd in a scratch dir.
    fn start(config: &str, env: &[(&str, String)], model: &str) -> Editor {
        Editor::start_in("bypass", config, env, model)
    }

    /// `kin acp` in permission `mode`, otherwise as `start`.
    fn start_in(mode: &str, config: &str, env: &[(&str, String)], model: &str) -> Editor {
        let tmp = tempfile::tempdir().unwrap();
        let cwd = tmp.path().join("cwd");
        std::fs::create_dir_all(&cwd).unwrap();
        let config_path = tmp.path().join("config.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut command = Command::new(KIN);
        command
            .args(["acp", "--permission-mode", mode, "--model", model, "--config"])
            .arg(&config_path)
            .arg("--sessions")
            .arg(tmp.path().join("sessions"))
            .env("HOME", tmp.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("KIN_MODEL")
            .stderr(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        Editor { kin: Peer::spawn(&mut command), frames: Vec::new(), _tmp: tmp, cwd }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.kin.request(method, params);
        let frames = &mut self.frames;
        self.kin.response(id, WAIT, |frame| frames.push(frame.clone()))
    }

    fn init(&mut self, capabilities: Value) {
        let init = self.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": capabilities}));
        assert_eq!(init["result"]["agentCapabilities"]["promptCapabilities"]["image"], true, "{init}");
        assert_eq!(init["result"]["agentCapabilities"]["promptCapabilities"]["embeddedContext"], true, "{init}");
    }

    fn new_session(&mut self) -> String {
        let session = self.call("session/new", json!({"cwd": self.cwd, "mcpServers": []}));
        session["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{session}")).to_string()
    }

    fn prompt(&mut self, session: &str, prompt: Value) -> Value {
        let response = self.call("session/prompt", json!({"sessionId": session, "prompt": prompt}));
        assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
        response
    }

    /// The updates sent so far, taken.
    fn updates(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.frames)
            .into_iter()
            .filter(|f| f["method"] == "session/update")
            .map(|f| f["params"]["update"].clone())
            .collect()
    }
}

/// The JSON bodies the server received.
async fn bodies(server: &MockServer) -> Vec<Value> {
    server.received_requests().await.unwrap().iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect()
}

fn keys(openai: &MockServer, anthropic: &MockServer) -> Vec<(&'static str, String)> {
    vec![
        ("OPENAI_BASE_URL", openai.uri()),
        ("OPENAI_API_KEY", "sk-openai-test".into()),
        ("ANTHROPIC_BASE_URL", anthropic.uri()),
        ("ANTHROPIC_API_KEY", "sk-anthropic-test".into()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_prompt_reaches_openai_and_anthropic_in_their_wire_shapes() {
    let openai = MockServer::start().await;
    Mock::given(method("POST")).and(path("/chat/completions")).respond_with(openai_text("A dot.")).mount(&openai).await;
    let anthropic = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(anthropic_text("Still a dot."))
        .mount(&anthropic)
        .await;
    let config = "[model_settings]\nchoices = [\"openai/gpt-test\", \"anthropic/claude-test\"]\n";
    let mut editor = Editor::start(config, &keys(&openai, &anthropic), "openai/gpt-test");
    editor.init(json!({}));
    let session = editor.new_session();
    editor.prompt(
        &session,
        json!([
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image", "data": PNG, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///w/notes.md", "text": "a note", "mimeType": "text/markdown"}},
        ]),
    );
    let sent = bodies(&openai).await;
    let user = sent[0]["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        user,
        json!({"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG}")}},
            {"type": "text", "text": "\n[resource uri=\"file:///w/notes.md\"]\na note\n[/resource]\n"},
        ]}),
        "OpenAI-compatible: image_url parts, the resource as text with its URI"
    );

    let switched = editor.call(
        "session/set_config_option",
        json!({"sessionId": session, "configId": "model", "value": "anthropic/claude-test"}),
    );
    assert!(switched.get("result").is_some(), "{switched}");
    editor.prompt(&session, json!([{"type": "image", "data": PNG, "mimeType": "image/png"}]));
    let sent = bodies(&anthropic).await;
    let messages = sent[0]["messages"].as_array().unwrap();
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}});
    assert_eq!(messages[0]["content"][1], image, "the first prompt's image, in the history: {}", messages[0]);
    assert_eq!(messages.last().unwrap()["content"], json!([image]), "Anthropic: an image block");

    // A loaded session shows the prompts' images again.
    editor.updates();
    let loaded = editor.call("session/load", json!({"sessionId": session, "cwd": editor.cwd, "mcpServers": []}));
    assert!(loaded.get("result").is_some(), "{loaded}");
    let shown: Vec<Value> = editor
        .updates()
        .into_iter()
        .filter(|u| u["sessionUpdate"] == "user_message_chunk")
        .map(|u| u["content"].clone())
        .collect();
    let kinds: Vec<&str> = shown.iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["text", "image", "text", "image"], "{shown:?}");
    assert_eq!(shown[1], json!({"type": "image", "data": PNG, "mimeType": "image/png"}));
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_takes_no_images_gets_a_placeholder_and_one_notice() {
    let deepseek = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(openai_text("I see no image."))
        .mount(&deepseek)
        .await;
    let env = vec![("DEEPSEEK_BASE_URL", deepseek.uri()), ("DEEPSEEK_API_KEY", "sk-test".into())];
    let mut editor = Editor::start("", &env, "deepseek/deepseek-v4-flash");
    editor.init(json!({"session": {"notices": {}}}));
    let session = editor.new_session();
    editor.updates();
    editor.prompt(
        &session,
        json!([{"type": "text", "text": "Look:"}, {"type": "image", "data": PNG, "mimeType": "image/png"}]),
    );
    let sent = bodies(&deepseek).await;
    assert_eq!(
        sent[0]["messages"].as_array().unwrap().last().unwrap(),
        &json!({"role": "user", "content": "Look:\n[image image/png: not shown, this model takes no images]"})
    );
    let notices: Vec<Value> = editor.updates().into_iter().filter(|u| u["sessionUpdate"] == "notice").collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0]["title"], "Images not sent");
    let description = notices[0]["description"].as_str().unwrap();
    assert!(!description.contains('\n') && description.contains("deepseek/deepseek-v4-flash"), "{description}");
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_shows_an_image_file_to_a_model_that_takes_images() {
    let anthropic = MockServer::start().await;
    let messages = || path("/v1/messages");
    Mock::given(method("POST"))
        .and(messages())
        .respond_with(anthropic_tool_use("toolu_1", "read", json!({"file_path": "shot.png"})))
        .up_to_n_times(1)
        .mount(&anthropic)
        .await;
    Mock::given(method("POST")).and(messages()).respond_with(anthropic_text("A dot.")).mount(&anthropic).await;
    let openai = MockServer::start().await;
    let mut editor = Editor::start("", &keys(&openai, &anthropic), "anthropic/claude-test");
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD.decode(PNG).unwrap();
    std::fs::write(Path::new(&editor.cwd).join("shot.png"), &png).unwrap();
    editor.init(json!({}));
    let session = editor.new_session();
    editor.prompt(&session, json!([{"type": "text", "text": "What does shot.png show?"}]));
    let sent = bodies(&anthropic).await;
    assert_eq!(sent.len(), 2);
    let result = &sent[1]["messages"].as_array().unwrap().last().unwrap()["content"][0];
    assert_eq!(result["type"], "tool_result", "{result}");
    assert_eq!(
        result["content"][1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}),
        "{result}"
    );
    // The editor sees the image on the call's result too.
    let update = editor
        .updates()
        .into_iter()
        .find(|u| u["sessionUpdate"] == "tool_call_update" && u["status"] == "completed")
        .unwrap();
    assert_eq!(update["content"][1]["content"], json!({"type": "image", "data": PNG, "mimeType": "image/png"}));
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_commands_are_offered_and_expanded_from_the_workspace_and_user_files() {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/chat/completions")).respond_with(openai_text("Done.")).mount(&server).await;
    let env = vec![("OPENAI_BASE_URL", server.uri()), ("OPENAI_API_KEY", "sk-test".into())];
    let mut editor = Editor::start("", &env, "openai/gpt-test");
    let workspace = editor.cwd.join(".kin/commands");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(
        workspace.join("review.md"),
        "---\ndescription: Review a file\nargument-hint: <path>\n---\nReview $ARGUMENTS for bugs.\n",
    )
    .unwrap();
    // The user's Claude Code commands (HOME is the scratch dir).
    let user = editor.cwd.parent().unwrap().join(".claude/commands");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(user.join("hello.md"), "Say hello in one word.").unwrap();
    editor.init(json!({}));
    let session = editor.new_session();
    editor.prompt(&session, json!([{"type": "text", "text": "/review src/lib.rs"}]));
    let offered: Vec<Value> = editor
        .updates()
        .into_iter()
        .filter(|u| u["sessionUpdate"] == "available_commands_update")
        .map(|u| u["availableCommands"].clone())
        .collect();
    assert_eq!(
        offered,
        [json!([
            {"name": "init", "description": "Draft an AGENTS.md for this workspace", "input": {"hint": "what to focus on (optional)"}},
            {"name": "compact", "description": "Summarize the conversation so far to free up context", "input": {"hint": "what the summary should focus on (optional)"}},
            {"name": "review", "description": "Review a file", "input": {"hint": "<path>"}},
            {"name": "hello", "description": "Say hello in one word."},
        ])],
        "offered once, after session/new"
    );
    editor.prompt(&session, json!([{"type": "text", "text": "/hello"}]));
    editor.prompt(&session, json!([{"type": "text", "text": "/init"}]));
    editor.prompt(&session, json!([{"type": "text", "text": "/usr/bin/true fails, why?"}]));
    let asked: Vec<String> = bodies(&server)
        .await
        .iter()
        .map(|b| {
            let last = b["messages"].as_array().unwrap().last().unwrap();
            last["content"].as_str().map(str::to_string).unwrap_or_else(|| last["content"][0]["text"].to_string())
        })
        .collect();
    assert_eq!(asked[0], "Review src/lib.rs for bugs.\n");
    assert_eq!(asked[1], "Say hello in one word.");
    assert!(asked[2].contains("draft AGENTS.md"), "{}", asked[2]);
    assert_eq!(asked[3], "/usr/bin/true fails, why?", "not a command: sent as it is");
    // A loaded session is offered its commands again.
    let loaded = editor.call("session/load", json!({"sessionId": session, "cwd": editor.cwd, "mcpServers": []}));
    assert!(loaded.get("result").is_some(), "{loaded}");
    let frame = editor.kin.frame(WAIT);
    assert_eq!(frame["params"]["update"]["sessionUpdate"], "available_commands_update", "{frame}");
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_titled_by_its_first_prompt_then_by_the_title_model() {
    let deepseek = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(openai_text("Fixed it."))
        .mount(&deepseek)
        .await;
    let titler = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(openai_text("Flaky parser test fix"))
        .mount(&titler)
        .await;
    let env = vec![
        ("DEEPSEEK_BASE_URL", deepseek.uri()),
        ("DEEPSEEK_API_KEY", "sk-test".into()),
        ("OPENAI_BASE_URL", titler.uri()),
        ("OPENAI_API_KEY", "sk-titler".into()),
    ];
    let mut editor = Editor::start("title_model = \"openai/titler\"\n", &env, "deepseek/deepseek-v4-flash");
    editor.init(json!({}));
    let session = editor.new_session();
    editor.prompt(&session, json!([{"type": "text", "text": "Please fix the flaky parser test in src/lib.rs"}]));
    let titles = |updates: &[Value]| -> Vec<String> {
        updates
            .iter()
            .filter(|u| u["sessionUpdate"] == "session_info_update")
            .map(|u| u["title"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(titles(&editor.updates()), ["Please fix the flaky parser"], "the fallback title, during the turn");
    // The model's title follows the prompt's answer.
    let mut seen = Vec::new();
    while !seen.iter().any(|t: &String| t == "Flaky parser test fix") {
        let frame = editor.kin.frame(WAIT);
        seen.extend(titles(&[frame["params"]["update"].clone()]));
    }
    let asked = bodies(&titler).await;
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["model"], "titler");
    assert!(asked[0].get("tools").is_none(), "no tools for the title call");
    let conversation = asked[0]["messages"][1]["content"].as_str().unwrap();
    assert!(conversation.contains("flaky parser test") && conversation.contains("Fixed it."), "{conversation}");

    let listed = editor.call("session/list", json!({}));
    assert_eq!(listed["result"]["sessions"][0]["title"], "Flaky parser test fix", "{listed}");
    editor.updates();
    editor.call("session/load", json!({"sessionId": session, "cwd": editor.cwd, "mcpServers": []}));
    assert_eq!(
        titles(&editor.updates()),
        ["Please fix the flaky parser", "Flaky parser test fix"],
        "a loaded session shows its titles in log order"
    );
    // A second prompt asks for no second title.
    editor.prompt(&session, json!([{"type": "text", "text": "Thanks"}]));
    assert_eq!(bodies(&titler).await.len(), 1);
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

/// An OpenAI-compatible answer that calls `name` with `arguments`.
fn openai_tool_call(id: &str, name: &str, arguments: Value) -> ResponseTemplate {
    let call = json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
        "function": {"name": name, "arguments": arguments.to_string()}}]});
    sse(chat_sse(&[chunk(call, None), chunk(json!({}), Some("tool_calls"))]))
}

/// A model that makes `calls` one step each, in order, then answers "Done.".
async fn calling_model(calls: &[(&str, Value)]) -> MockServer {
    let server = MockServer::start().await;
    for (i, (name, arguments)) in calls.iter().enumerate() {
        Mock::given(method("POST"))
            .and(path("/chat/completions"))
            .respond_with(openai_tool_call(&format!("call_{i}"), name, arguments.clone()))
            .up_to_n_times(1)
            .mount(&server)
            .await;
    }
    Mock::given(method("POST")).and(path("/chat/completions")).respond_with(openai_text("Done.")).mount(&server).await;
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_locations_are_absolute_with_the_line_of_a_read_and_an_edit() {
    let server = calling_model(&[
        ("read", json!({"file_path": "src/notes.txt", "offset": 2})),
        ("edit", json!({"file_path": "src/notes.txt", "old_string": "gamma", "new_string": "GAMMA"})),
    ])
    .await;
    let env = vec![("OPENAI_BASE_URL", server.uri()), ("OPENAI_API_KEY", "sk-test".into())];
    let mut editor = Editor::start("", &env, "openai/gpt-test");
    std::fs::create_dir_all(editor.cwd.join("src")).unwrap();
    std::fs::write(editor.cwd.join("src/notes.txt"), "alpha\nbeta\ngamma\n").unwrap();
    editor.init(json!({}));
    let session = editor.new_session();
    editor.prompt(&session, json!([{"type": "text", "text": "Shout the third line"}]));
    assert_eq!(std::fs::read_to_string(editor.cwd.join("src/notes.txt")).unwrap(), "alpha\nbeta\nGAMMA\n");
    let file = editor.cwd.join("src/notes.txt").display().to_string();
    let updates = editor.updates();
    let calls: Vec<&Value> = updates.iter().filter(|u| u["sessionUpdate"] == "tool_call").collect();
    assert_eq!(calls.len(), 2, "{updates:?}");
    assert_eq!(calls[0]["locations"], json!([{"path": file, "line": 2}]), "a read: absolute, where it starts");
    assert_eq!(calls[1]["locations"], json!([{"path": file}]), "an edit: absolute; the line comes with its result");
    let edited = updates
        .iter()
        .find(|u| u["sessionUpdate"] == "tool_call_update" && u["toolCallId"] == "call_1" && u["status"] == "completed")
        .unwrap_or_else(|| panic!("no completed edit: {updates:?}"));
    assert_eq!(edited["locations"], json!([{"path": file, "line": 3}]), "the edit changed line 3: {edited}");
    // A loaded session shows the same locations.
    editor.call("session/load", json!({"sessionId": session, "cwd": editor.cwd, "mcpServers": []}));
    let replayed = editor.updates();
    let located: Vec<&Value> = replayed.iter().filter_map(|u| u.get("locations")).collect();
    assert_eq!(
        located,
        [&json!([{"path": file, "line": 2}]), &json!([{"path": file}]), &json!([{"path": file, "line": 3}])],
        "{replayed:?}"
    );
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

/// The statuses the editor was told for `call`, in order (the `tool_call`, each update, and a
/// permission request's `toolCall`, marked `asked:<status>`).
fn statuses(frames: &[Value], call: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for frame in frames {
        if frame["method"] == "session/update" {
            let update = &frame["params"]["update"];
            if update["toolCallId"] == call
                && let Some(status) = update["status"].as_str()
            {
                seen.push(status.to_string());
            }
        } else if frame["method"] == "session/request_permission" && frame["params"]["toolCall"]["toolCallId"] == call {
            seen.push(format!("asked:{}", frame["params"]["toolCall"]["status"].as_str().unwrap_or("none")));
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_permission_is_pending_then_in_progress_once_allowed() {
    let server = calling_model(&[
        ("write", json!({"file_path": "a.txt", "content": "one"})),
        ("write", json!({"file_path": "b.txt", "content": "two"})),
    ])
    .await;
    let env = vec![("OPENAI_BASE_URL", server.uri()), ("OPENAI_API_KEY", "sk-test".into())];
    let mut editor = Editor::start_in("ask", "", &env, "openai/gpt-test");
    editor.init(json!({}));
    let session = editor.new_session();
    let prompt = editor
        .kin
        .request("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": "Write both"}]}));
    let mut frames = Vec::new();
    // The first write is allowed, the second rejected.
    let mut answers = ["allow-once", "reject-once"].into_iter();
    loop {
        let frame = editor.kin.frame(WAIT);
        frames.push(frame.clone());
        if frame["method"] == "session/request_permission" {
            let call = frame["params"]["toolCall"]["toolCallId"].as_str().unwrap().to_string();
            // While the question is open the call is pending.
            assert_eq!(statuses(&frames, &call).last().map(String::as_str), Some("asked:pending"), "{frames:?}");
            let option = answers.next().expect("two questions");
            editor.kin.send(json!({"jsonrpc": "2.0", "id": frame["id"], "result": {"outcome": {"outcome": "selected", "optionId": option}}}));
        }
        if common::is_response(&frame, prompt) {
            assert_eq!(frame["result"]["stopReason"], "end_turn", "{frame}");
            break;
        }
    }
    assert_eq!(statuses(&frames, "call_0"), ["in_progress", "pending", "asked:pending", "in_progress", "completed"]);
    assert_eq!(
        statuses(&frames, "call_1"),
        ["in_progress", "pending", "asked:pending", "failed"],
        "a refused call never runs"
    );
    assert!(editor.cwd.join("a.txt").exists() && !editor.cwd.join("b.txt").exists());
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_output_reaches_the_editor_while_the_command_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("go");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // The command prints, then waits for the test to write to the FIFO, then prints again.
    let command = format!("echo live-start; read line < {}; echo \"got $line\"", fifo.display());
    let server = calling_model(&[("bash", json!({"command": command, "description": "Wait for the test"}))]).await;
    let env = vec![("OPENAI_BASE_URL", server.uri()), ("OPENAI_API_KEY", "sk-test".into())];
    let mut editor = Editor::start("", &env, "openai/gpt-test");
    editor.init(json!({}));
    let session = editor.new_session();
    let prompt = editor
        .kin
        .request("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": "Run it"}]}));
    let text = |update: &Value| update["content"][0]["content"]["text"].as_str().unwrap_or_default().to_string();
    // Output the command printed arrives while it still waits (it cannot end before the write).
    loop {
        let frame = editor.kin.frame(WAIT);
        assert!(!common::is_response(&frame, prompt), "the turn ended before any live output: {frame}");
        let update = &frame["params"]["update"];
        if update["sessionUpdate"] == "tool_call_update" && update["toolCallId"] == "call_0" {
            assert!(update.get("status").is_none(), "the call still runs: {update}");
            if text(update).contains("live-start") {
                assert!(!text(update).contains("got"), "{update}");
                break;
            }
        }
    }
    std::fs::write(&fifo, "go\n").unwrap();
    let mut result = None;
    editor.kin.response(prompt, WAIT, |frame| {
        let update = &frame["params"]["update"];
        if update["toolCallId"] == "call_0" && update["status"] == "completed" {
            result = Some(text(update));
        }
    });
    assert_eq!(result.as_deref(), Some("live-start\ngot go\n"), "the result holds the whole output");
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_question_is_asked_on_the_parents_delegating_call_for_a_client_without_subagents() {
    // The parent delegates; the child writes a file (asked: mode ask); then both answer.
    let server = calling_model(&[
        ("subagent", json!({"description": "Note taker", "prompt": "Write note.txt"})),
        ("write", json!({"file_path": "note.txt", "content": "noted"})),
    ])
    .await;
    let env = vec![("OPENAI_BASE_URL", server.uri()), ("OPENAI_API_KEY", "sk-test".into())];
    let mut editor = Editor::start_in("ask", "", &env, "openai/gpt-test");
    editor.init(json!({}));
    let session = editor.new_session();
    let prompt = editor
        .kin
        .request("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": "Delegate"}]}));
    let mut frames = Vec::new();
    let mut asked = Vec::new();
    loop {
        let frame = editor.kin.frame(WAIT);
        frames.push(frame.clone());
        if let Some(id) = frame["params"]["sessionId"].as_str() {
            assert_eq!(id, session, "every frame names the session the client knows: {frame}");
        }
        if frame["method"] == "session/request_permission" {
            asked.push(frame["params"].clone());
            editor.kin.send(json!({"jsonrpc": "2.0", "id": frame["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}}));
        }
        if common::is_response(&frame, prompt) {
            assert_eq!(frame["result"]["stopReason"], "end_turn", "{frame}");
            break;
        }
    }
    assert_eq!(asked.len(), 1, "{asked:?}");
    let call = &asked[0]["toolCall"];
    assert_eq!(call["toolCallId"], "call_0", "asked on the delegating call: {call}");
    assert_eq!(call["title"], "Note taker: Write note.txt", "titled with the child's label");
    assert_eq!(call["kind"], "edit");
    assert_eq!(std::fs::read_to_string(editor.cwd.join("note.txt")).unwrap(), "noted");
    // Once answered, the delegating call shows as itself again, still running, then completes.
    let titled: Vec<(&Value, &Value)> = frames
        .iter()
        .map(|f| &f["params"]["update"])
        .filter(|u| u["toolCallId"] == "call_0" && u.get("title").is_some())
        .map(|u| (&u["sessionUpdate"], &u["title"]))
        .collect();
    assert_eq!(
        titled,
        [(&json!("tool_call"), &json!("Note taker")), (&json!("tool_call_update"), &json!("Note taker"))],
        "announced, then restored after the question"
    );
    assert_eq!(statuses(&frames, "call_0").last().map(String::as_str), Some("completed"));
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}
