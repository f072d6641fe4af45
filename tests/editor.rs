//! What an editor user meets, over real pipes against the real binary with loopback model
//! servers: images and embedded files in prompts reach an OpenAI-compatible and an Anthropic
//! server in their wire shapes (and a route that takes no images gets a placeholder and one
//! notice), `read` shows an image file, and a loaded session shows the prompt's image again;
//! titles, locations, statuses and live output; and `bash` in the editor's terminals, with a test
//! client (`TermClient`) that implements `terminal/*` by spawning the processes for real.

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
    assert!(description.starts_with("The image stays in the session, but the model"), "{description}");
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
    let updates = editor.updates();
    // The session is titled by what the user typed, not by the command's expansion.
    let titles: Vec<&Value> =
        updates.iter().filter(|u| u["sessionUpdate"] == "session_info_update").map(|u| &u["title"]).collect();
    assert_eq!(titles, [&json!("/review src/lib.rs")]);
    let offered: Vec<Value> = updates
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
    // A blank command file is refused, naming the command, not sent as an empty message.
    std::fs::write(workspace.join("empty.md"), "---\ndescription: Nothing\n---\n  \n").unwrap();
    let refused =
        editor.call("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": "/empty"}]}));
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("/empty expands to an empty prompt"), "{message}");
    assert_eq!(bodies(&server).await.len(), 4, "no model call");
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
    let (mut editor, _, prompt) = prompted(&server, "ask", "", json!({}), "Write both");
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
        // A client that did not advertise `terminal` gets the local path: kin asks it for none.
        assert!(!frame["method"].as_str().is_some_and(|m| m.starts_with("terminal/")), "{frame}");
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
    let (mut editor, session, prompt) = prompted(&server, "ask", "", json!({}), "Delegate");
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

// ---------------------------------------------------------------------------------------------
// the editor's terminals

/// One terminal the test client runs for kin: a real process, its output (stdout and stderr
/// interleaved, as a terminal has them), and the `terminal/wait_for_exit` requests not yet answered.
struct Term {
    child: std::process::Child,
    output: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    limit: usize,
    waits: Vec<Value>,
}

/// A client that implements `terminal/*` for real (it spawns the processes kin asks for) and
/// answers permission questions with `allow-once`. `events` is what happened, in order:
/// `create:<id>`, `embed:<id>` (the call's content showed the terminal), `wait:<id>`,
/// `output:<id>`, `kill:<id>`, `release:<id>`, `exit:<id>`.
#[derive(Default)]
struct TermClient {
    terms: std::collections::BTreeMap<String, Term>,
    created: Vec<Value>,
    events: Vec<String>,
    frames: Vec<Value>,
    /// Never answers `terminal/create` (an editor that hangs).
    silent: bool,
}

impl TermClient {
    fn answer(kin: &mut common::Peer, frame: &Value, result: Value) {
        kin.send(json!({"jsonrpc": "2.0", "id": frame["id"], "result": result}));
    }

    /// Handles one frame from kin.
    fn handle(&mut self, kin: &mut common::Peer, frame: &Value) {
        self.frames.push(frame.clone());
        let params = &frame["params"];
        let id = params["terminalId"].as_str().unwrap_or_default().to_string();
        match frame["method"].as_str().unwrap_or_default() {
            "session/update" => {
                let update = &params["update"];
                for content in update["content"].as_array().into_iter().flatten() {
                    if content["type"] == "terminal" {
                        self.events.push(format!("embed:{}", content["terminalId"].as_str().unwrap()));
                    }
                }
            }
            "session/request_permission" => {
                Self::answer(kin, frame, json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}}))
            }
            "terminal/create" if self.silent => self.created.push(params.clone()),
            "terminal/create" => {
                self.created.push(params.clone());
                let id = format!("term-{}", self.terms.len() + 1);
                let mut command = Command::new(params["command"].as_str().unwrap());
                let args: Vec<&str> = params["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
                // One pipe for both streams, as a terminal has them.
                let (mut reader, writer) = std::io::pipe().unwrap();
                command.args(args).stdin(Stdio::null()).stdout(writer.try_clone().unwrap()).stderr(writer);
                if let Some(cwd) = params["cwd"].as_str() {
                    command.current_dir(cwd);
                }
                let child = command.spawn().unwrap();
                drop(command);
                let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
                let sink = output.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = std::io::Read::read(&mut reader, &mut buf) {
                        if n == 0 {
                            break;
                        }
                        sink.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                });
                let limit = params["outputByteLimit"].as_u64().unwrap_or(u64::MAX) as usize;
                self.terms.insert(id.clone(), Term { child, output, limit, waits: Vec::new() });
                self.events.push(format!("create:{id}"));
                Self::answer(kin, frame, json!({"terminalId": id}));
            }
            "terminal/wait_for_exit" => {
                self.events.push(format!("wait:{id}"));
                self.terms.get_mut(&id).expect("a known terminal").waits.push(frame.clone());
            }
            "terminal/output" => {
                self.events.push(format!("output:{id}"));
                let term = self.terms.get(&id).expect("a known terminal");
                let bytes = term.output.lock().unwrap().clone();
                let cut = bytes.len().saturating_sub(term.limit);
                let text = String::from_utf8_lossy(&bytes[cut..]).into_owned();
                Self::answer(kin, frame, json!({"output": text, "truncated": cut > 0}));
            }
            "terminal/kill" => {
                self.events.push(format!("kill:{id}"));
                let _ = self.terms.get_mut(&id).expect("a known terminal").child.kill();
                Self::answer(kin, frame, json!({}));
            }
            "terminal/release" => {
                self.events.push(format!("release:{id}"));
                let mut term = self.terms.remove(&id).expect("a known terminal");
                let _ = term.child.kill();
                let _ = term.child.wait();
                Self::answer(kin, frame, json!({}));
            }
            _ => {}
        }
    }

    /// Answers the waits of terminals whose command ended.
    fn reap(&mut self, kin: &mut common::Peer) {
        for (id, term) in &mut self.terms {
            if term.waits.is_empty() {
                continue;
            }
            if let Some(status) = term.child.try_wait().unwrap() {
                use std::os::unix::process::ExitStatusExt;
                self.events.push(format!("exit:{id}"));
                let signal = status.signal().map(|s| if s == 9 { "SIGKILL".to_string() } else { s.to_string() });
                for wait in term.waits.drain(..) {
                    Self::answer(kin, &wait, json!({"exitCode": status.code(), "signal": signal}));
                }
            }
        }
    }

    /// Serves kin until the response to `id` (returned), calling `each` after every frame.
    fn serve(&mut self, kin: &mut common::Peer, id: u64, mut each: impl FnMut(&mut Self, &mut common::Peer)) -> Value {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            assert!(std::time::Instant::now() < deadline, "no response to {id} within {WAIT:?}: {:?}", self.events);
            self.reap(kin);
            let Some(line) = kin.line(Duration::from_millis(20)) else { continue };
            let frame: Value = serde_json::from_str(&line).unwrap();
            if common::is_response(&frame, id) {
                return frame;
            }
            self.handle(kin, &frame);
            each(self, kin);
        }
    }

    /// The text of the call's completed or failed update.
    fn result(&self, call: &str) -> (String, String) {
        let update = self
            .frames
            .iter()
            .map(|f| &f["params"]["update"])
            .find(|u| u["toolCallId"] == call && (u["status"] == "completed" || u["status"] == "failed"))
            .unwrap_or_else(|| panic!("no result for {call}: {:?}", self.frames));
        let text = update["content"].as_array().unwrap().iter().filter_map(|c| c["content"]["text"].as_str()).collect();
        (update["status"].as_str().unwrap().to_string(), text)
    }

    fn methods(&self) -> Vec<String> {
        self.frames
            .iter()
            .filter_map(|f| f["method"].as_str())
            .filter(|m| m.starts_with("terminal/"))
            .map(String::from)
            .collect()
    }
}

/// A kin in permission `mode` with `config` whose model makes `calls`, initialized by a client
/// with terminals, and a session of it prompted with `text`: the model server, the editor, the
/// session and the prompt's request id.
async fn prompted_with_terminal(
    mode: &str,
    config: &str,
    calls: &[(&str, Value)],
    text: &str,
) -> (MockServer, Editor, String, u64) {
    let server = calling_model(calls).await;
    let (editor, session, prompt) = prompted(&server, mode, config, json!({"terminal": true}), text);
    (server, editor, session, prompt)
}

/// A kin in permission `mode` with `config` on `server`'s model, initialized with `capabilities`,
/// and a session of it prompted with `text`: the editor, the session and the prompt's request id.
fn prompted(server: &MockServer, mode: &str, config: &str, capabilities: Value, text: &str) -> (Editor, String, u64) {
    let env = vec![("OPENAI_BASE_URL", server.uri()), ("OPENAI_API_KEY", "sk-test".into())];
    let mut editor = Editor::start_in(mode, config, &env, "openai/gpt-test");
    editor.init(capabilities);
    let session = editor.new_session();
    let prompt =
        editor.kin.request("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}));
    (editor, session, prompt)
}

/// The text of the tool result the model got back in its last request.
async fn tool_text_sent_back(server: &MockServer) -> String {
    let last = bodies(server).await.pop().unwrap();
    let messages = last["messages"].as_array().unwrap();
    let tool = messages.iter().rev().find(|m| m["role"] == "tool").unwrap_or_else(|| panic!("{last}"));
    tool["content"].as_str().map(str::to_string).unwrap_or_else(|| tool["content"].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_runs_in_the_editors_terminal_which_the_call_shows_before_the_command_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("go");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let command =
        format!("echo term-start; echo term-err >&2; read line < {}; echo \"got $line\"; exit 4", fifo.display());
    let calls = [("bash", json!({"command": command, "description": "Wait for the test"}))];
    let (server, mut editor, session, prompt) = prompted_with_terminal("bypass", "", &calls, "Run it").await;
    let mut client = TermClient::default();
    let mut released = false;
    let response = client.serve(&mut editor.kin, prompt, |client, _| {
        // The call shows the terminal while the command still waits on the FIFO: then let it end.
        if !released && client.events.iter().any(|e| e == "embed:term-1") {
            assert!(!client.events.iter().any(|e| e.starts_with("exit:")), "{:?}", client.events);
            released = true;
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::write(fifo, "go\n").unwrap());
        }
    });
    assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
    assert!(released, "the terminal was never shown on the call: {:?}", client.events);
    let created = &client.created[0];
    assert_eq!(created["sessionId"], session.as_str());
    assert!(created["command"].as_str().unwrap().ends_with("sh"), "{created}");
    assert_eq!(created["args"], json!(["-c", command]));
    assert_eq!(created["cwd"], editor.cwd.display().to_string());
    assert_eq!(created["outputByteLimit"], 30_000);
    assert_eq!(
        client.events,
        ["create:term-1", "embed:term-1", "wait:term-1", "exit:term-1", "output:term-1", "release:term-1"],
        "shown before the wait, read after the exit, released at the end"
    );
    let expected = "term-start\nterm-err\ngot go\n\n[exit code: 4]";
    assert_eq!(client.result("call_0"), ("completed".to_string(), expected.to_string()));
    assert_eq!(tool_text_sent_back(&server).await, expected, "the model reads the terminal's output");
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

/// Live (non-zombie) processes whose command line holds `needle`.
fn running(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .filter(|cmdline| String::from_utf8_lossy(cmdline).contains(needle))
        .count()
}

/// An external agent that ignores the end of its input dies with kin, even when kin is killed
/// with SIGKILL (as an editor stops an agent): it was left running, orphaned, before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_agent_that_ignores_the_end_of_its_input_dies_with_a_killed_kin() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("agent.pid");
    let script = format!("echo $$ > {}; trap '' TERM HUP; exec sleep 300", pid_file.display());
    let config =
        format!("[acp_agents.stub]\ncommand = \"sh\"\nargs = [\"-c\", {}]\n", serde_json::to_string(&script).unwrap());
    let calls = [("delegate_stub", json!({"description": "wait", "prompt": "Wait."}))];
    let server = calling_model(&calls).await;
    let (mut editor, _session, _prompt) = prompted(&server, "bypass", &config, json!({}), "Delegate");
    common::until_blocking("the agent to start", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|p| p.ends_with('\n'))
    });
    let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_string();
    let alive = || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
    assert!(alive());
    editor.kin.child.kill().unwrap();
    editor.kin.child.wait().unwrap();
    common::until_blocking("the agent to die with kin", || !alive());
}

/// An editor that never answers `terminal/create` does not hold the turn: the command's own
/// timeout ends the call, saying the command did not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_the_editor_never_creates_times_out_with_the_command() {
    let calls = [("bash", json!({"command": "echo never", "description": "Never", "timeoutMs": 300}))];
    let (_server, mut editor, _session, prompt) = prompted_with_terminal("bypass", "", &calls, "Run").await;
    let mut client = TermClient { silent: true, ..Default::default() };
    let response = client.serve(&mut editor.kin, prompt, |_, _| {});
    assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
    assert_eq!(client.created.len(), 1, "asked once");
    let (status, text) = client.result("call_0");
    assert_eq!(status, "failed");
    assert!(text.starts_with("Error: the editor did not start the command in a terminal within 300 ms"), "{text}");
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_terminal_command_is_killed_and_released_and_a_timed_out_one_too() {
    let seconds = format!("41.{}", std::process::id());
    let calls = [
        ("bash", json!({"command": format!("echo waiting; sleep {seconds}"), "description": "Wait"})),
        ("bash", json!({"command": format!("echo slow; sleep {seconds}"), "description": "Slow", "timeoutMs": 300})),
    ];
    let (_server, mut editor, session, prompt) = prompted_with_terminal("bypass", "", &calls, "Wait").await;
    let mut client = TermClient::default();
    let mut cancelled = false;
    let response = client.serve(&mut editor.kin, prompt, |client, kin| {
        if !cancelled && client.events.iter().any(|e| e == "wait:term-1") {
            cancelled = true;
            kin.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}));
        }
    });
    assert_eq!(response["result"]["stopReason"], "cancelled", "{response}");
    // The result (the abort) is the turn's last update: reading on to it serves kill and release.
    // (The client answers the abandoned wait when the killed command ends, if it is still held.)
    let asked: Vec<&String> = client.events.iter().filter(|e| !e.starts_with("exit:")).collect();
    assert_eq!(
        asked,
        ["create:term-1", "embed:term-1", "wait:term-1", "kill:term-1", "release:term-1"],
        "killed, released"
    );
    assert_eq!(client.result("call_0"), ("failed".to_string(), "Error: command aborted".to_string()));
    assert!(client.terms.is_empty(), "every terminal was released");
    assert_eq!(running(&format!("sleep\0{seconds}")), 0, "the command was killed");

    // A timeout kills too, and the model reads the output before it, as on the local path.
    let prompt = editor
        .kin
        .request("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": "Again"}]}));
    let mut client = TermClient::default();
    let response = client.serve(&mut editor.kin, prompt, |_, _| {});
    assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
    let asked: Vec<&String> = client.events.iter().filter(|e| !e.starts_with("exit:")).collect();
    assert_eq!(
        asked,
        ["create:term-1", "embed:term-1", "wait:term-1", "kill:term-1", "output:term-1", "release:term-1"]
    );
    let (status, text) = client.result("call_1");
    assert_eq!(status, "failed");
    assert!(text.starts_with("Error: command timed out after 300 ms and was killed"), "{text}");
    assert!(text.ends_with("Output before the timeout:\nslow\n"), "{text}");
    assert_eq!(running(&format!("sleep\0{seconds}")), 0, "the command was killed");
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confined_command_stays_local_and_only_an_allowed_escalation_uses_the_terminal() {
    if !kin::testkit::sandbox::landlock_for_tests() {
        return;
    }
    let calls = [
        ("bash", json!({"command": "echo inside > confined.txt; echo done", "description": "Write"})),
        (
            "bash",
            json!({"command": "echo outside > escalated.txt; echo ok", "description": "Write anyway", "sandbox": "off"}),
        ),
    ];
    // Mode ask: the sandboxed command runs without a question, the escalation is asked (allowed).
    let (_server, mut editor, _, prompt) =
        prompted_with_terminal("ask", "sandbox = \"read-only\"\n", &calls, "Write").await;
    let mut client = TermClient::default();
    let response = client.serve(&mut editor.kin, prompt, |_, _| {});
    assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
    // The confined command ran in kin, under the kernel sandbox: its write was refused.
    let (status, text) = client.result("call_0");
    assert_eq!(status, "completed");
    assert!(text.starts_with("sandboxed: read-only"), "{text}");
    assert!(text.contains("confined.txt: Permission denied"), "{text}");
    assert!(!editor.cwd.join("confined.txt").exists(), "the sandbox held");
    // Only the escalation the user allowed went to the editor's terminal, with the note.
    assert_eq!(client.created.len(), 1, "{:?}", client.created);
    assert!(client.created[0]["args"][1].as_str().unwrap().contains("escalated.txt"), "{:?}", client.created);
    let embedded = client
        .frames
        .iter()
        .map(|f| &f["params"]["update"])
        .find(|u| u["content"][1]["type"] == "terminal")
        .unwrap_or_else(|| panic!("{:?}", client.frames));
    assert_eq!(embedded["toolCallId"], "call_1");
    assert_eq!(
        embedded["content"][0]["content"]["text"],
        "not sandboxed: the user allowed this command to run outside the sandbox"
    );
    assert_eq!(std::fs::read_to_string(editor.cwd.join("escalated.txt")).unwrap(), "outside\n");
    assert_eq!(client.methods().last().map(String::as_str), Some("terminal/release"));
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

/// Whether a model request is the child's (its first user message is `prompt`).
fn asked_by(prompt: &'static str) -> impl Fn(&wiremock::Request) -> bool + Send + Sync {
    move |request: &wiremock::Request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
        let first = body["messages"].as_array().and_then(|m| m.iter().find(|m| m["role"] == "user")).cloned();
        first.is_some_and(|m| m["content"].to_string().contains(prompt))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_childs_question_after_its_call_ended_is_asked_on_the_parent_on_a_call_of_its_own() {
    // The parent starts a background child and ends its turn; the child then writes a file
    // (asked: mode ask), long after the delegating call completed.
    let server = MockServer::start().await;
    let child = "Write note.txt in the background";
    let post = || Mock::given(method("POST")).and(path("/chat/completions"));
    let write = json!({"file_path": "note.txt", "content": "noted"});
    // The child's first answer (its write) waits until the editor saw the delegating call end.
    let (held, release) = common::Held::new(openai_tool_call("child_call", "write", write));
    post().and(asked_by(child)).respond_with(held).up_to_n_times(1).with_priority(1).mount(&server).await;
    // Its next request carries the write's result: the file is written by then.
    let (heard, written) = common::Heard::new(openai_text("Written."));
    post().and(asked_by(child)).respond_with(heard).with_priority(2).mount(&server).await;
    let start = json!({"description": "Note taker", "prompt": child, "run_in_background": true});
    post()
        .respond_with(openai_tool_call("call_0", "subagent", start))
        .up_to_n_times(1)
        .with_priority(3)
        .mount(&server)
        .await;
    post().respond_with(openai_text("Started.")).with_priority(4).mount(&server).await;
    let (mut editor, session, prompt) = prompted(&server, "ask", "", json!({}), "Delegate");
    let mut frames = Vec::new();
    let (mut ended, mut asked) = (false, None);
    let note = editor.cwd.join("note.txt");
    while !(ended && asked.is_some()) {
        let frame = editor.kin.frame(WAIT);
        frames.push(frame.clone());
        if let Some(id) = frame["params"]["sessionId"].as_str() {
            assert_eq!(id, session, "every frame names the session the client knows: {frame}");
        }
        if statuses(&frames, "call_0").last().map(String::as_str) == Some("completed") {
            release();
        }
        if frame["method"] == "session/request_permission" {
            // The delegating call completed before the child asked.
            assert_eq!(statuses(&frames, "call_0").last().map(String::as_str), Some("completed"), "{frames:?}");
            asked = Some(frame["params"].clone());
            editor.kin.send(json!({"jsonrpc": "2.0", "id": frame["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}}));
        }
        if common::is_response(&frame, prompt) {
            assert_eq!(frame["result"]["stopReason"], "end_turn", "{frame}");
            ended = true;
        }
    }
    let asked = asked.unwrap();
    let call = &asked["toolCall"];
    let id = call["toolCallId"].as_str().unwrap().to_string();
    assert!(id.ends_with("/child_call") && id != "call_0", "a call of its own, not the ended delegating one: {call}");
    assert_eq!(call["title"], "Note taker: Write note.txt", "titled with the child's label");
    assert_eq!(call["kind"], "edit");
    written.recv_timeout(WAIT).expect("the child's write returned");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "noted");
    // That call was announced (pending) before the question; the delegating call stayed completed.
    let announced = frames
        .iter()
        .map(|f| &f["params"]["update"])
        .find(|u| u["sessionUpdate"] == "tool_call" && u["toolCallId"] == id.as_str())
        .unwrap_or_else(|| panic!("the question's call was never announced: {frames:?}"));
    // (`pending` is a tool call's default status, which the SDK leaves out.)
    assert!(announced.get("status").is_none_or(|s| s == "pending"), "{announced}");
    assert_eq!(announced["title"], call["title"]);
    let call_0 = statuses(&frames, "call_0");
    assert_eq!(call_0.last().map(String::as_str), Some("completed"), "{call_0:?}");
    assert_eq!(call_0.iter().filter(|s| *s == "completed").count(), 1, "never reopened: {call_0:?}");
    // Once answered, the question's call is done.
    let deadline = std::time::Instant::now() + WAIT;
    while statuses(&frames, &id).last().map(String::as_str) != Some("completed") {
        assert!(std::time::Instant::now() < deadline, "{:?}", statuses(&frames, &id));
        frames.push(editor.kin.frame(WAIT));
    }
    assert_eq!(statuses(&frames, &id), ["asked:pending", "completed"]);
    editor.kin.close_stdin();
    assert!(editor.kin.child.wait().unwrap().success());
}

/// An editor (or script) that closes kin's stdin while a turn runs and a listing was just asked
/// for still gets both answers before kin exits: the listing's, then the prompt's `cancelled`
/// (the turn is stopped once the other requests are answered). Before, kin ended at the end of
/// its input and neither answer came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_read_before_stdin_closes_are_answered_before_exit() {
    let server = MockServer::start().await;
    let (heard, asked) = common::Heard::new(openai_text("never sent").set_delay(Duration::from_secs(120)));
    Mock::given(method("POST")).and(path("/chat/completions")).respond_with(heard).mount(&server).await;
    let (mut editor, session, prompt) = prompted(&server, "bypass", "", json!({}), "Wait");
    asked.recv_timeout(WAIT).expect("the turn calls the model");
    let listing = editor.kin.request("session/list", json!({}));
    editor.kin.close_stdin();
    let answers = editor.kin.responses(&[prompt, listing], WAIT);
    assert_eq!(answers[&prompt]["result"]["stopReason"], "cancelled", "{}", answers[&prompt]);
    let listed = answers[&listing]["result"]["sessions"].as_array().unwrap_or_else(|| panic!("{}", answers[&listing]));
    assert!(listed.iter().any(|s| s["sessionId"] == session), "{listed:?}");
    assert!(editor.kin.exit().success());
}
