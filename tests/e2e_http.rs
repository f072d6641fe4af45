//! End to end over real pipes and real HTTP: `kin acp` with `DEEPSEEK_BASE_URL` pointed at a
//! loopback mock completes a two-step tool turn, retrying a 500 on the way.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[allow(dead_code)]
mod common;
use common::{KIN, Peer, chat_sse, chunk};

fn sse(body: String) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kin_acp_completes_a_tool_turn_against_a_loopback_deepseek() {
    let server = MockServer::start().await;
    let tool_call = chat_sse(&[
        chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "read", "arguments": ""}}]}),
            None,
        ),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"file_path\": \"note.txt\"}"}}]}), None),
        chunk(json!({}), Some("tool_calls")),
    ]);
    let answer = chat_sse(&[
        chunk(json!({"role": "assistant", "content": "The note says hi."}), None),
        chunk(json!({}), Some("stop")),
    ]);
    let route = || path("/chat/completions");
    Mock::given(method("POST"))
        .and(route())
        .respond_with(ResponseTemplate::new(500))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST")).and(route()).respond_with(sse(tool_call)).up_to_n_times(1).mount(&server).await;
    Mock::given(method("POST")).and(route()).respond_with(sse(answer)).mount(&server).await;

    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(cwd.join("note.txt"), "hi\n").unwrap();
    let config = tmp.path().join("config.toml");
    std::fs::write(&config, "[model_settings]\nretry_base_delay_ms = 10\n").unwrap();
    let mut kin = Peer::spawn(
        Command::new(KIN)
            .args(["acp", "--permission-mode", "bypass", "--config"])
            .arg(&config)
            .arg("--sessions")
            .arg(tmp.path().join("sessions"))
            .env("DEEPSEEK_BASE_URL", server.uri())
            .env("DEEPSEEK_API_KEY", "sk-e2e-secret")
            .env_remove("KIN_MODEL")
            .stderr(Stdio::piped()),
    );
    let mut frames: Vec<Value> = Vec::new();
    let mut call = |id: u64, method: &str, params: Value, frames: &mut Vec<Value>| -> Value {
        kin.send(common::request(id, method, params));
        kin.response(id, Duration::from_secs(30), |frame| frames.push(frame.clone()))
    };
    call(1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), &mut frames);
    let session = call(2, "session/new", json!({"cwd": cwd, "mcpServers": []}), &mut frames);
    let id = session["result"]["sessionId"].as_str().unwrap().to_string();
    let response = call(
        3,
        "session/prompt",
        json!({"sessionId": id, "prompt": [{"type": "text", "text": "What does note.txt say?"}]}),
        &mut frames,
    );
    assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
    let updates: Vec<&Value> =
        frames.iter().filter_map(|f| f["params"]["update"].as_object().map(|_| &f["params"]["update"])).collect();
    assert!(
        updates.iter().any(|u| u["sessionUpdate"] == "agent_thought_chunk"
            && u["content"]["text"].as_str().unwrap_or("").contains("retrying")),
        "the retry is shown"
    );
    assert!(updates.iter().any(|u| u["sessionUpdate"] == "tool_call" && u["title"] == "Read note.txt"));
    let text: String = updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .collect();
    assert_eq!(text, "The note says hi.");
    let (status, stderr) = kin.exit_with_stderr();
    assert!(status.success());
    assert!(!stderr.contains("sk-e2e-secret"), "the key never reaches the logs");

    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 3, "500, tool call, answer");
    assert_eq!(requests[1].headers.get("authorization").unwrap(), "Bearer sk-e2e-secret");
    let last: Value = serde_json::from_slice(&requests[2].body).unwrap();
    let tool_message = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the tool result was sent back");
    assert_eq!(tool_message["tool_call_id"], "call_1");
    assert!(tool_message["content"].as_str().unwrap().contains("1: hi"));
    let log = std::fs::read_to_string(
        kin::testkit::session::SessionStore::new(tmp.path().join("sessions")).locate(&id).unwrap().unwrap(),
    )
    .unwrap();
    assert!(log.contains("\"type\":\"llm/retry\""), "the retry is in the session log");
    assert!(!log.contains("sk-e2e-secret"), "the key never reaches the session log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_scenario_replays_keyless() {
    let server = MockServer::start().await;
    let answer =
        chat_sse(&[chunk(json!({"role": "assistant", "content": "RECORDED"}), None), chunk(json!({}), Some("stop"))]);
    Mock::given(method("POST")).and(path("/chat/completions")).respond_with(sse(answer)).mount(&server).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("recorded");
    std::fs::create_dir_all(&dir).unwrap();
    let input =
        json!({"steps": [{"op": "initialize"}, {"op": "newSession"}, {"op": "prompt", "text": "Say RECORDED."}]});
    std::fs::write(dir.join("input.json"), input.to_string()).unwrap();
    let kin = env!("CARGO_BIN_EXE_kin");
    let record = Command::new(kin)
        .args(["scenario", "record"])
        .arg(&dir)
        .env("DEEPSEEK_BASE_URL", server.uri())
        .env("DEEPSEEK_API_KEY", "sk-record-secret")
        .env("XDG_CONFIG_HOME", tmp.path())
        .output()
        .unwrap();
    assert!(record.status.success(), "{}", String::from_utf8_lossy(&record.stdout));
    let log = std::fs::read_to_string(dir.join("session.jsonl")).unwrap();
    assert!(
        log.contains("RECORDED")
            && !log.contains("sk-record-secret")
            && !log.contains(&tmp.path().display().to_string())
    );
    let stdout = std::fs::read_to_string(dir.join("stdout.expected.jsonl")).unwrap();
    assert!(stdout.contains("RECORDED"));
    // Keyless replay: no base URL, no key.
    let replay = Command::new(kin)
        .args(["scenario", "run"])
        .arg(&dir)
        .env_remove("DEEPSEEK_BASE_URL")
        .env_remove("DEEPSEEK_API_KEY")
        .output()
        .unwrap();
    assert!(replay.status.success(), "{}", String::from_utf8_lossy(&replay.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_completion_is_recorded_as_its_own_call_and_the_recording_replays() {
    // dsh turns a completed response with no content into the retryable EMPTY_RESPONSE and
    // retries at the step, so its recorded log holds both calls; kin records and replays the same.
    let server = MockServer::start().await;
    let empty = chat_sse(&[chunk(json!({"role": "assistant", "content": ""}), Some("stop"))]);
    let answer = chat_sse(&[
        chunk(json!({"role": "assistant", "content": "AFTER_EMPTY"}), None),
        chunk(json!({}), Some("stop")),
    ]);
    let route = || path("/chat/completions");
    Mock::given(method("POST")).and(route()).respond_with(sse(empty)).up_to_n_times(1).mount(&server).await;
    Mock::given(method("POST")).and(route()).respond_with(sse(answer)).mount(&server).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("recorded");
    std::fs::create_dir_all(&dir).unwrap();
    let input = json!({"steps": [{"op": "initialize"}, {"op": "newSession"}, {"op": "prompt", "text": "Answer."}]});
    std::fs::write(dir.join("input.json"), input.to_string()).unwrap();
    // The retry waits no time, in the recording and in the replay.
    std::fs::write(dir.join("kin.toml"), "[model_settings]\nretry_base_delay_ms = 0\n").unwrap();
    let kin = env!("CARGO_BIN_EXE_kin");
    let record = Command::new(kin)
        .args(["scenario", "record"])
        .arg(&dir)
        .env("DEEPSEEK_BASE_URL", server.uri())
        .env("DEEPSEEK_API_KEY", "sk-record-secret")
        .env("XDG_CONFIG_HOME", tmp.path())
        .output()
        .unwrap();
    assert!(record.status.success(), "{}", String::from_utf8_lossy(&record.stdout));
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
    let log = std::fs::read_to_string(dir.join("session.jsonl")).unwrap();
    let events: Vec<Value> = log.lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect();
    let kinds: Vec<String> = events
        .iter()
        .filter_map(|e| match e["type"].as_str()? {
            "assistant/chunk" if e["data"]["chunk"]["type"] == "finish" => Some("finish".into()),
            kind @ ("llm/retry" | "assistant/message" | "turn/end") => Some(kind.into()),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["finish", "llm/retry", "finish", "assistant/message", "turn/end"], "{log}");
    let retry = events.iter().find(|e| e["type"] == "llm/retry").unwrap();
    assert_eq!((&retry["data"]["code"], &retry["data"]["step"]), (&json!("EMPTY_RESPONSE"), &json!(1)));
    // Keyless replay serves the two recorded calls in order.
    let replay = Command::new(kin)
        .args(["scenario", "run"])
        .arg(&dir)
        .env_remove("DEEPSEEK_BASE_URL")
        .env_remove("DEEPSEEK_API_KEY")
        .output()
        .unwrap();
    assert!(replay.status.success(), "{}", String::from_utf8_lossy(&replay.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_editor_switches_the_model_for_the_next_turn() {
    let server = MockServer::start().await;
    let answer =
        chat_sse(&[chunk(json!({"role": "assistant", "content": "ok"}), None), chunk(json!({}), Some("stop"))]);
    Mock::given(method("POST")).and(path("/chat/completions")).respond_with(sse(answer)).mount(&server).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut kin = Peer::spawn(
        common::acp(&tmp.path().join("sessions"), None)
            .args(["--model", "deepseek/deepseek-v4-flash"])
            .env("DEEPSEEK_BASE_URL", server.uri())
            .env("DEEPSEEK_API_KEY", "k"),
    );
    let mut call = |id: u64, method: &str, params: Value| -> Value {
        kin.send(common::request(id, method, params));
        kin.response(id, Duration::from_secs(30), |_| {})
    };
    call(1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    let created = call(2, "session/new", json!({"cwd": tmp.path(), "mcpServers": []}));
    let option = &created["result"]["configOptions"][0];
    assert_eq!(
        (option["id"].as_str(), option["currentValue"].as_str()),
        (Some("model"), Some("deepseek/deepseek-v4-flash")),
        "{created}"
    );
    let id = created["result"]["sessionId"].as_str().unwrap().to_string();
    let bad = call(3, "session/set_config_option", json!({"sessionId": id, "configId": "model", "value": "nope/none"}));
    assert_eq!(bad["error"]["code"], -32602);
    assert!(bad["error"]["message"].as_str().unwrap().contains("deepseek/deepseek-v4-pro"), "{bad}");
    // A value of no shape the SDK reads (alone it says only "data did not match any variant of
    // untagged enum SessionConfigOptionValue"): answered with the value and what the option takes.
    let shapeless = call(31, "session/set_config_option", json!({"sessionId": id, "configId": "model", "value": 5}));
    assert_eq!(shapeless["error"]["code"], -32602, "{shapeless}");
    assert_eq!(
        shapeless["error"]["message"],
        "Invalid params: the value 5 is not one kin reads for the option \"model\": the model option takes a route id \
         such as deepseek/deepseek-v4-pro, sent as {\"configId\": \"model\", \"value\": \"<id>\"}",
        "{shapeless}"
    );
    let set = call(
        4,
        "session/set_config_option",
        json!({"sessionId": id, "configId": "model", "value": "deepseek/deepseek-v4-pro"}),
    );
    assert_eq!(set["result"]["configOptions"][0]["currentValue"], "deepseek/deepseek-v4-pro", "{set}");
    call(5, "session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "hi"}]}));
    let requests = server.received_requests().await.unwrap();
    let body: Value = serde_json::from_slice(&requests.last().unwrap().body).unwrap();
    assert_eq!(body["model"], "deepseek-v4-pro");
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}
