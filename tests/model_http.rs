//! The HTTP model clients against a loopback mock server (wiremock) speaking the Chat
//! Completions and Anthropic Messages SSE formats: the chunks kin emits, the requests it sends
//! (roles, tool results, reasoning round-trips, auth headers), retries, and the failures a user
//! must act on. The API key never appears in an error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kin::testkit::model::http::{RetryPolicy, Server};
use kin::testkit::model::openai::{OpenAiConfig, OpenAiModel};
use kin::testkit::model::router::{ModelSettings, NamedProvider, ProviderKind, model_for_route};
use kin::testkit::model::{
    ChunkStream, Failure, FinishReason, Model, ModelEvent, ModelRequest, ModelResult, ModelRoute, RetryInfo,
    StreamChunk, ToolSchema,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

#[allow(dead_code)]
mod common;

const KEY: &str = "sk-test-secret-0123456789";
const CHAT: &str = "/chat/completions";
const MESSAGES: &str = "/v1/messages";

// ---- Building requests and reading results -------------------------------------------------

fn fake_env(vars: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars.into_iter().map(|(name, value)| (name.to_string(), value)).collect();
    move |name: &str| vars.get(name).cloned()
}

fn deepseek_env(server: &MockServer) -> impl Fn(&str) -> Option<String> {
    fake_env(vec![("DEEPSEEK_BASE_URL", server.uri()), ("DEEPSEEK_API_KEY", KEY.to_string())])
}

fn fast_settings() -> ModelSettings {
    ModelSettings {
        retry: RetryPolicy { max_attempts: 3, base_delay_ms: 1, max_delay_ms: 5, ..RetryPolicy::default() },
        ..ModelSettings::default()
    }
}

/// A model whose calls pass on every item of `inner`'s stream, keeping a copy of each retry
/// reported in band (`seen`).
struct Recorded {
    inner: Arc<dyn Model>,
    seen: Arc<Mutex<Vec<RetryInfo>>>,
}

impl Model for Recorded {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ChunkStream {
        let mut inner = self.inner.stream(request, cancel);
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let seen = self.seen.clone();
        tokio::spawn(async move {
            while let Some(item) = inner.recv().await {
                if let Ok(ModelEvent::Retry(retry)) = &item {
                    seen.lock().unwrap().push(retry.clone());
                }
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        });
        rx
    }
}

fn recorded(inner: Arc<dyn Model>) -> (Arc<dyn Model>, Arc<Mutex<Vec<RetryInfo>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    (Arc::new(Recorded { inner, seen: seen.clone() }), seen)
}

fn routed(
    route: &str,
    settings: &ModelSettings,
    env: &dyn Fn(&str) -> Option<String>,
) -> (Arc<dyn Model>, Arc<Mutex<Vec<RetryInfo>>>) {
    let route = ModelRoute::parse(route).unwrap();
    recorded(model_for_route(&route, settings, env).unwrap())
}

fn request(route: &str, messages: Vec<Value>) -> ModelRequest {
    ModelRequest {
        session_id: "session-1".into(),
        turn: 1,
        step: 1,
        cwd: None,
        route: ModelRoute::parse(route).unwrap(),
        system: "You are kin.".into(),
        messages: std::sync::Arc::new(messages),
        tools: vec![ToolSchema {
            name: "read".into(),
            description: "Read a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        purpose: kin::testkit::model::Purpose::Step,
        max_tokens: None,
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}, "id": "u"})
}

fn tool_result(call_id: &str, text: &str) -> Value {
    json!({
        "role": "user",
        "source": {"kind": "tool", "callId": call_id},
        "content": [{"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}], "isError": false}],
        "id": "t",
    })
}

/// The assistant message the turn loop builds from the block-ends of a response.
fn assistant_message(chunks: &[StreamChunk]) -> Value {
    let content: Vec<Value> = chunks
        .iter()
        .filter_map(|chunk| match chunk {
            StreamChunk::BlockEnd { block, .. } => Some(block.clone()),
            _ => None,
        })
        .collect();
    json!({"role": "assistant", "content": content, "source": {"kind": "model"}, "id": "a"})
}

async fn collect(mut stream: ChunkStream) -> Vec<ModelResult> {
    let all = async {
        let mut items = Vec::new();
        while let Some(item) = stream.recv().await {
            items.push(item);
        }
        items
    };
    tokio::time::timeout(Duration::from_secs(20), all).await.expect("the model stream did not end")
}

async fn call(model: &Arc<dyn Model>, request: ModelRequest) -> Vec<ModelResult> {
    collect(model.stream(request, CancellationToken::new())).await
}

/// The chunks of a call that did not fail, after checking that its retries came in band before
/// every chunk (a call is retried only while nothing of the failed attempt reached the consumer).
fn chunks(results: Vec<ModelResult>) -> Vec<StreamChunk> {
    let mut chunks = Vec::new();
    for result in results {
        match result.expect("a chunk or a retry, not a failure") {
            ModelEvent::Chunk(chunk) => chunks.push(chunk),
            ModelEvent::Retry(retry) => assert!(chunks.is_empty(), "a retry after chunks: {retry:?} after {chunks:?}"),
        }
    }
    chunks
}

/// The failure a call ended with (thrown), after checking the key is nowhere in the results.
fn thrown(results: &[ModelResult]) -> Failure {
    assert!(!format!("{results:?}").contains(KEY), "the API key leaked: {results:?}");
    match results.last() {
        Some(Err(failure)) => failure.clone(),
        other => panic!("expected a failure, got {other:?}"),
    }
}

async fn requests(server: &MockServer) -> Vec<Request> {
    server.received_requests().await.unwrap()
}

fn header(request: &Request, name: &str) -> Option<String> {
    request.headers.get(name).map(|v| v.to_str().unwrap().to_string())
}

fn finish(reason: FinishReason) -> StreamChunk {
    StreamChunk::Finish { reason, replay_state: None }
}

fn start(index: u64, block_type: &str) -> StreamChunk {
    StreamChunk::BlockStart { index, block_type: block_type.into() }
}

fn text_delta(index: u64, text: &str) -> StreamChunk {
    StreamChunk::TextDelta { index, text: text.into() }
}

fn reasoning_delta(index: u64, text: &str) -> StreamChunk {
    StreamChunk::ReasoningDelta { index, text: text.into() }
}

fn call_delta(index: u64, id: &str, name: Option<&str>, arguments: &str) -> StreamChunk {
    StreamChunk::ToolCallDelta {
        index,
        id: id.into(),
        name: name.map(str::to_string),
        arguments_delta: arguments.into(),
    }
}

fn end(index: u64, block: Value) -> StreamChunk {
    StreamChunk::BlockEnd { index, block }
}

// ---- Chat Completions SSE ---------------------------------------------------------------------

fn chat_sse(events: &[Value]) -> String {
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

fn delta(delta: Value) -> Value {
    json!({"id": "cmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

fn finish_reason(reason: &str) -> Value {
    json!({"id": "cmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

fn usage(usage: Value) -> Value {
    json!({"id": "cmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage})
}

fn text_answer(text: &str) -> String {
    chat_sse(&[
        delta(json!({"role": "assistant", "content": ""})),
        delta(json!({"content": text})),
        finish_reason("stop"),
    ])
}

fn sse(body: String) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

async fn once(server: &MockServer, route_path: &str, response: impl wiremock::Respond + 'static) {
    Mock::given(method("POST")).and(path(route_path)).respond_with(response).up_to_n_times(1).mount(server).await;
}

async fn always(server: &MockServer, route_path: &str, response: ResponseTemplate) {
    Mock::given(method("POST")).and(path(route_path)).respond_with(response).mount(server).await;
}

fn answered_hello(results: Vec<ModelResult>) {
    let chunks = chunks(results);
    assert_eq!(
        chunks,
        vec![
            start(0, "text"),
            text_delta(0, "hello"),
            end(0, json!({"type": "text", "text": "hello"})),
            finish(FinishReason::Stop),
        ]
    );
}

// ---- Chat Completions: streams and requests --------------------------------------------------

#[tokio::test]
async fn deepseek_reasoning_and_tool_calls_round_trip() {
    let server = MockServer::start().await;
    let first = chat_sse(&[
        delta(json!({"role": "assistant", "content": null, "reasoning_content": ""})),
        delta(json!({"content": null, "reasoning_content": "Need "})),
        delta(json!({"content": null, "reasoning_content": "the file."})),
        delta(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "read", "arguments": ""}}]}),
        ),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\":"}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"a.txt\"}"}}]})),
        finish_reason("tool_calls"),
        usage(
            json!({"prompt_tokens": 100, "completion_tokens": 20, "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36, "completion_tokens_details": {"reasoning_tokens": 12}}),
        ),
    ]);
    let second = chat_sse(&[
        delta(json!({"reasoning_content": "Done."})),
        delta(json!({"content": "It says hello."})),
        finish_reason("stop"),
    ]);
    once(&server, CHAT, sse(first)).await;
    once(&server, CHAT, sse(second)).await;
    once(&server, CHAT, sse(text_answer("hello"))).await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    let route = "deepseek/deepseek-v4-flash";

    // Step 1: reasoning, then a tool call assembled from indexed deltas.
    let step1 = chunks(call(&model, request(route, vec![user("Read a.txt")])).await);
    assert_eq!(
        step1,
        vec![
            start(0, "reasoning"),
            reasoning_delta(0, "Need "),
            reasoning_delta(0, "the file."),
            end(0, json!({"type": "reasoning", "text": "Need the file."})),
            start(1, "tool-call"),
            call_delta(1, "call_1", Some("read"), ""),
            call_delta(1, "call_1", None, "{\"path\":"),
            call_delta(1, "call_1", None, "\"a.txt\"}"),
            end(1, json!({"type": "tool-call", "id": "call_1", "name": "read", "arguments": "{\"path\":\"a.txt\"}"})),
            StreamChunk::Usage {
                usage: json!({"inputTokens": 100, "outputTokens": 20, "cacheReadTokens": 64, "reasoningTokens": 12})
            },
            finish(FinishReason::ToolCalls),
        ]
    );

    // Step 2 of the same turn: the reasoning goes back with the tool call.
    let turn1 = vec![user("Read a.txt"), assistant_message(&step1), tool_result("call_1", "hello")];
    let step2 = chunks(call(&model, request(route, turn1.clone())).await);
    assert_eq!(step2.last(), Some(&finish(FinishReason::Stop)), "{step2:?}");

    // Turn 2: the reasoning of turn 1 is dropped.
    let mut turn2 = turn1;
    turn2.push(assistant_message(&step2));
    turn2.push(user("Thanks"));
    answered_hello(call(&model, request(route, turn2)).await);

    let sent = requests(&server).await;
    assert_eq!(sent.len(), 3);
    for request in &sent {
        assert_eq!(header(request, "authorization"), Some(format!("Bearer {KEY}")));
    }
    let tools = json!([{"type": "function", "function": {"name": "read", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
    assert_eq!(
        sent[0].body_json::<Value>().unwrap(),
        json!({
            "model": "deepseek-v4-flash",
            "messages": [
                {"role": "system", "content": "You are kin."},
                {"role": "user", "content": "Read a.txt"},
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": tools,
        })
    );
    let tool_call = json!([{"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a.txt\"}"}}]);
    assert_eq!(
        sent[1].body_json::<Value>().unwrap()["messages"],
        json!([
            {"role": "system", "content": "You are kin."},
            {"role": "user", "content": "Read a.txt"},
            {"role": "assistant", "content": null, "reasoning_content": "Need the file.", "tool_calls": tool_call},
            {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
        ])
    );
    assert_eq!(
        sent[2].body_json::<Value>().unwrap()["messages"],
        json!([
            {"role": "system", "content": "You are kin."},
            {"role": "user", "content": "Read a.txt"},
            {"role": "assistant", "content": null, "tool_calls": tool_call},
            {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
            {"role": "assistant", "content": "It says hello."},
            {"role": "user", "content": "Thanks"},
        ])
    );
    assert!(retries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn openai_parallel_tool_calls_are_assembled_per_index() {
    let server = MockServer::start().await;
    let body = chat_sse(&[
        delta(
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "read", "arguments": "{\"path\""}}]}),
        ),
        delta(
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "glob", "arguments": "{\"pattern\""}}]}),
        ),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": ":\"a\"}"}}]})),
        delta(json!({"tool_calls": [{"index": 1, "function": {"arguments": ":\"*.rs\"}"}}]})),
        finish_reason("tool_calls"),
    ]);
    once(&server, "/v1/chat/completions", sse(body)).await;
    let env = fake_env(vec![("OPENAI_BASE_URL", format!("{}/v1", server.uri())), ("OPENAI_API_KEY", KEY.to_string())]);
    let (model, _) = routed("openai/gpt-test", &fast_settings(), &env);
    let got = chunks(call(&model, request("openai/gpt-test", vec![user("Look around")])).await);
    assert_eq!(
        got,
        vec![
            start(0, "tool-call"),
            call_delta(0, "call_a", Some("read"), "{\"path\""),
            start(1, "tool-call"),
            call_delta(1, "call_b", Some("glob"), "{\"pattern\""),
            call_delta(0, "call_a", None, ":\"a\"}"),
            call_delta(1, "call_b", None, ":\"*.rs\"}"),
            end(0, json!({"type": "tool-call", "id": "call_a", "name": "read", "arguments": "{\"path\":\"a\"}"})),
            end(1, json!({"type": "tool-call", "id": "call_b", "name": "glob", "arguments": "{\"pattern\":\"*.rs\"}"})),
            finish(FinishReason::ToolCalls),
        ]
    );
    let sent = requests(&server).await;
    assert_eq!(header(&sent[0], "authorization"), Some(format!("Bearer {KEY}")));
}

#[tokio::test]
async fn text_usage_and_max_tokens() {
    let server = MockServer::start().await;
    let body = chat_sse(&[
        delta(json!({"role": "assistant", "content": "Hel"})),
        delta(json!({"content": "lo"})),
        finish_reason("length"),
        usage(json!({"prompt_tokens": 12, "completion_tokens": 64, "prompt_tokens_details": {"cached_tokens": 4}})),
    ]);
    once(&server, "/v1/chat/completions", sse(body)).await;
    let env = fake_env(vec![("OPENAI_BASE_URL", format!("{}/v1", server.uri())), ("OPENAI_API_KEY", KEY.to_string())]);
    let settings = ModelSettings { max_tokens: Some(64), reasoning_effort: Some("low".into()), ..fast_settings() };
    let (model, _) = routed("openai/gpt-test", &settings, &env);
    let got = chunks(call(&model, request("openai/gpt-test", vec![user("Hi")])).await);
    assert_eq!(
        got,
        vec![
            start(0, "text"),
            text_delta(0, "Hel"),
            text_delta(0, "lo"),
            end(0, json!({"type": "text", "text": "Hello"})),
            StreamChunk::Usage { usage: json!({"inputTokens": 12, "outputTokens": 64, "cacheReadTokens": 4}) },
            finish(FinishReason::MaxTokens),
        ]
    );
    let body = requests(&server).await[0].body_json::<Value>().unwrap();
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(body["reasoning_effort"], "low");
    assert_eq!(body["model"], "gpt-test");
}

#[tokio::test]
async fn named_compatible_endpoint_sends_its_headers_and_no_key() {
    let server = MockServer::start().await;
    once(&server, "/v1/chat/completions", sse(text_answer("hello"))).await;
    let settings = ModelSettings {
        providers: vec![NamedProvider {
            name: "local".into(),
            base_url: format!("{}/v1/", server.uri()),
            api_key_env: None,
            headers: vec![("X-Team".into(), "kin".into())],
            kind: ProviderKind::OpenAi,
            images: false,
        }],
        ..fast_settings()
    };
    let (model, _) = routed("local/qwen3", &settings, &|_| None);
    answered_hello(call(&model, request("local/qwen3", vec![user("Hi")])).await);
    let sent = requests(&server).await;
    assert_eq!(header(&sent[0], "x-team"), Some("kin".into()));
    assert_eq!(header(&sent[0], "authorization"), None);
    assert_eq!(sent[0].body_json::<Value>().unwrap()["model"], "qwen3");
}

// ---- Retries -----------------------------------------------------------------------------------

#[tokio::test]
async fn rate_limit_honours_retry_after_then_succeeds() {
    let server = MockServer::start().await;
    once(
        &server,
        CHAT,
        ResponseTemplate::new(429)
            .insert_header("retry-after", "1")
            .set_body_json(json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error"}})),
    )
    .await;
    once(&server, CHAT, sse(text_answer("hello"))).await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    let started = Instant::now();
    answered_hello(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert!(started.elapsed() >= Duration::from_millis(900));
    let retries = retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 1, "{retries:?}");
    let retry = &retries[0];
    assert_eq!((retry.attempt, retry.max_attempts, retry.delay_ms, retry.code.as_str()), (2, 3, 1000, "RATE_LIMITED"));
    assert!(retry.reason.contains("HTTP 429"), "{}", retry.reason);
    assert_eq!(requests(&server).await.len(), 2);
}

#[tokio::test]
async fn a_long_retry_after_is_capped_and_the_notice_says_so() {
    let server = MockServer::start().await;
    once(
        &server,
        CHAT,
        ResponseTemplate::new(429)
            .insert_header("retry-after", "3600")
            .set_body_json(json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error"}})),
    )
    .await;
    once(&server, CHAT, sse(text_answer("hello"))).await;
    let mut settings = fast_settings();
    settings.retry.max_retry_after_ms = 300;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &settings, &deepseek_env(&server));
    // The call ends well before the hour the server asked for (the stream is collected within 20 s).
    answered_hello(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    let retries = retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert_eq!((retries[0].delay_ms, retries[0].requested_delay_ms), (300, Some(3_600_000)));
    // A wait within the cap is honoured as given and not reported as capped.
    let server = MockServer::start().await;
    once(&server, CHAT, ResponseTemplate::new(429).insert_header("retry-after-ms", "20")).await;
    once(&server, CHAT, sse(text_answer("hello"))).await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &settings, &deepseek_env(&server));
    answered_hello(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    let retries = retries.lock().unwrap().clone();
    assert_eq!((retries[0].delay_ms, retries[0].requested_delay_ms), (20, None));
}

/// A rate limit whose text speaks of tokens ("too many tokens per minute") is a rate limit:
/// waited out and retried, never taken for a context overflow (which compacts the history).
#[tokio::test]
async fn a_rate_limit_about_tokens_is_retried_not_taken_for_an_overflow() {
    let server = MockServer::start().await;
    let tpm = json!({"error": {"message": "Rate limit reached: too many tokens per minute (TPM). Please retry after 1s.", "code": "rate_limit_exceeded"}});
    once(&server, CHAT, ResponseTemplate::new(429).insert_header("retry-after-ms", "5").set_body_json(tpm)).await;
    once(&server, CHAT, sse(text_answer("hello"))).await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    answered_hello(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    let retries = retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert_eq!(retries[0].code, "RATE_LIMITED");
}

#[tokio::test]
async fn server_error_then_success() {
    let server = MockServer::start().await;
    once(&server, CHAT, ResponseTemplate::new(500).set_body_string("upstream exploded")).await;
    once(&server, CHAT, sse(text_answer("hello"))).await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    answered_hello(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    let retries = retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 1);
    assert_eq!(retries[0].code, "SERVER_ERROR");
    assert!(retries[0].delay_ms <= 5);
    assert!(retries[0].reason.contains("upstream exploded"));
    assert_eq!(requests(&server).await.len(), 2);
}

#[tokio::test]
async fn disconnect_before_any_chunk_is_retried() {
    let server = MockServer::start().await;
    let cut = format!("data: {}\n\n", delta(json!({"role": "assistant", "content": ""})));
    once(&server, CHAT, sse(cut)).await;
    once(&server, CHAT, sse(text_answer("hello"))).await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    answered_hello(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    let codes: Vec<String> = retries.lock().unwrap().iter().map(|r| r.code.clone()).collect();
    assert_eq!(codes, vec!["STREAM_INCOMPLETE".to_string()]);
    assert_eq!(requests(&server).await.len(), 2);
}

#[tokio::test]
async fn disconnect_after_chunks_finishes_with_an_error_and_no_retry() {
    let server = MockServer::start().await;
    let cut = format!("data: {}\n\n", delta(json!({"role": "assistant", "content": "partial"})));
    once(&server, CHAT, sse(cut)).await;
    once(&server, CHAT, sse(text_answer("hello"))).await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    let got = chunks(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[..2], [start(0, "text"), text_delta(0, "partial")]);
    match &got[2] {
        StreamChunk::Finish { reason: FinishReason::Error { failure }, .. } => {
            assert_eq!(failure.code, "STREAM_INCOMPLETE");
            // Whose stream it was.
            let whose = format!("(from {} for deepseek/deepseek-v4-flash)", server.uri());
            assert!(failure.message.ends_with(&whose), "{}", failure.message);
        }
        other => panic!("expected an error finish, got {other:?}"),
    }
    assert!(retries.lock().unwrap().is_empty());
    assert_eq!(requests(&server).await.len(), 1);
}

fn stalling_model(server: &MockServer, max_attempts: u32) -> (Arc<dyn Model>, Arc<Mutex<Vec<RetryInfo>>>) {
    let mut endpoint = Server::new(server.uri(), Some("DEEPSEEK_API_KEY"));
    endpoint.api_key = Some(KEY.into());
    endpoint.retry = RetryPolicy { max_attempts, base_delay_ms: 1, max_delay_ms: 5, ..RetryPolicy::default() };
    endpoint.idle_timeout = Duration::from_millis(300);
    let config = OpenAiConfig { deepseek: true, ..OpenAiConfig::new(endpoint) };
    recorded(Arc::new(OpenAiModel::new(config)))
}

#[tokio::test]
async fn a_stalled_stream_times_out_and_is_retried() {
    let server = MockServer::start().await;
    once(&server, CHAT, sse(text_answer("hello")).set_delay(Duration::from_secs(3))).await;
    once(&server, CHAT, sse(text_answer("hello"))).await;
    let (model, retries) = stalling_model(&server, 2);
    let started = Instant::now();
    let results =
        collect(model.stream(request("deepseek/deepseek-v4-flash", vec![user("Hi")]), CancellationToken::new())).await;
    answered_hello(results);
    assert!(started.elapsed() < Duration::from_secs(2));
    let codes: Vec<String> = retries.lock().unwrap().iter().map(|r| r.code.clone()).collect();
    assert_eq!(codes, vec!["TIMEOUT".to_string()]);

    let stalled = MockServer::start().await;
    always(&stalled, CHAT, sse(text_answer("hello")).set_delay(Duration::from_secs(3))).await;
    let (model, _) = stalling_model(&stalled, 1);
    let results =
        collect(model.stream(request("deepseek/deepseek-v4-flash", vec![user("Hi")]), CancellationToken::new())).await;
    let failure = thrown(&results);
    assert_eq!(failure.code, "TIMEOUT");
    assert!(failure.message.contains("idle timeout"), "{}", failure.message);
}

/// A loopback HTTP server that answers every request with an event stream made by `body`: it
/// writes the response head, then whatever `body` writes, until the client goes away.
async fn raw_sse_server<F, Fut>(body: F) -> String
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    raw_server("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n", body).await
}

/// A loopback HTTP server that answers every request with `head` (status line and headers,
/// through the blank line), then whatever `body` writes, until the client goes away.
async fn raw_server<F, Fut>(head: &'static str, body: F) -> String
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let body = Arc::new(body);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                if socket.write_all(head.as_bytes()).await.is_ok() {
                    body(socket).await;
                }
            });
        }
    });
    format!("http://{address}")
}

/// The DeepSeek endpoint at `base_url`, with the key, one attempt and the idle timeout `idle`.
fn raw_endpoint(base_url: String, idle: Duration) -> Server {
    let mut endpoint = Server::new(base_url, Some("DEEPSEEK_API_KEY"));
    endpoint.api_key = Some(KEY.into());
    endpoint.retry = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
    endpoint.idle_timeout = idle;
    endpoint
}

fn endpoint_model(endpoint: Server) -> Arc<dyn Model> {
    Arc::new(OpenAiModel::new(OpenAiConfig { deepseek: true, ..OpenAiConfig::new(endpoint) }))
}

fn raw_model(base_url: String, idle: Duration) -> Arc<dyn Model> {
    endpoint_model(raw_endpoint(base_url, idle))
}

#[tokio::test(start_paused = true)]
async fn keep_alive_comments_do_not_stop_the_idle_timeout() {
    // On a paused clock: the server's pauses and the watchdog's timeout are exact.
    use tokio::io::AsyncWriteExt;
    // A server that only ever sends keep-alive comments.
    let silent = raw_sse_server(|mut socket| async move {
        while socket.write_all(b": keep-alive\n\n").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let model = raw_model(silent, Duration::from_millis(400));
    let results = call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await;
    let failure = thrown(&results);
    assert_eq!(failure.code, "TIMEOUT");
    assert!(failure.message.contains("keep-alive comments do not count"), "{}", failure.message);
    // Model data rearms the watchdog: text every 150 ms among keep-alives outlasts the timeout.
    let talking = raw_sse_server(|mut socket| async move {
        for piece in ["he", "l", "l", "o"] {
            let event = format!(": keep-alive\n\ndata: {}\n\n", delta(json!({"content": piece})));
            if socket.write_all(event.as_bytes()).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let end = format!("data: {}\n\ndata: [DONE]\n\n", finish_reason("stop"));
        let _ = socket.write_all(end.as_bytes()).await;
    })
    .await;
    let model = raw_model(talking, Duration::from_millis(400));
    let got = chunks(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert_eq!(got[2..].first(), Some(&text_delta(0, "l")), "{got:?}");
    assert_eq!(got.last(), Some(&finish(FinishReason::Stop)));
}

#[tokio::test]
async fn an_endless_event_is_cut_off_not_buffered() {
    use tokio::io::AsyncWriteExt;
    // One `data:` line that never ends: kin stops at 16 MiB instead of buffering it all.
    let endless = raw_sse_server(|mut socket| async move {
        if socket.write_all(b"data: ").await.is_err() {
            return;
        }
        let block = vec![b'x'; 1 << 20];
        while socket.write_all(&block).await.is_ok() {}
    })
    .await;
    let model = raw_model(endless, Duration::from_secs(10));
    let failure = thrown(&call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert_eq!(failure.code, "PROVIDER_ERROR");
    assert!(failure.message.contains("an event larger than 16 MiB"), "{}", failure.message);
}

#[tokio::test]
async fn an_endless_error_body_is_cut_and_says_so() {
    use tokio::io::AsyncWriteExt;
    // HTTP 500 with a chunked body that never ends: kin quotes its first 16 KiB and fails at
    // once, instead of reading until the idle timeout (a minute here, beyond `collect`'s 20 s).
    let head = "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    let endless = raw_server(head, |mut socket| async move {
        let text = "upstream exploded ".repeat(256);
        let chunk = format!("{:x}\r\n{text}\r\n", text.len());
        while socket.write_all(chunk.as_bytes()).await.is_ok() {}
    })
    .await;
    let model = raw_model(endless, Duration::from_secs(60));
    let failure = thrown(&call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert_eq!(failure.code, "SERVER_ERROR");
    assert!(failure.message.contains("HTTP 500"), "{}", failure.message);
    assert!(failure.message.contains("upstream exploded upstream exploded"), "{}", failure.message);
    assert!(failure.message.ends_with("… (body cut at 16 KiB)"), "{}", failure.message);
}

#[tokio::test]
async fn an_endless_response_is_stopped_at_the_byte_budget() {
    use tokio::io::AsyncWriteExt;
    // Valid text deltas forever: each one rearms the idle watchdog, only the budget ends it.
    let looping = raw_sse_server(|mut socket| async move {
        let event = format!("data: {}\n\n", delta(json!({"content": "again and again "})));
        while socket.write_all(event.as_bytes()).await.is_ok() {}
    })
    .await;
    let mut endpoint = raw_endpoint(looping, Duration::from_secs(60));
    endpoint.max_response_bytes = 64 * 1024;
    let model = endpoint_model(endpoint);
    let got = chunks(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert_eq!(got[..2], [start(0, "text"), text_delta(0, "again and again ")]);
    match got.last() {
        Some(StreamChunk::Finish { reason: FinishReason::Error { failure }, .. }) => {
            assert_eq!(failure.code, "PROVIDER_ERROR");
            assert!(failure.message.contains("larger than 64 KiB"), "{}", failure.message);
            assert!(failure.message.contains("is the server looping?"), "{}", failure.message);
        }
        other => panic!("expected an error finish, got {other:?}"),
    }
}

#[tokio::test]
async fn a_response_over_the_byte_budget_is_not_retried() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    // Before any chunk reached the consumer a retry would be allowed: the budget's failure is
    // not retryable, so the server is called once even with attempts to spare.
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let padded = raw_sse_server(move |mut socket| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let comment = format!(": {}\n\n", "padding ".repeat(128));
            while socket.write_all(comment.as_bytes()).await.is_ok() {}
        }
    })
    .await;
    let mut endpoint = raw_endpoint(padded, Duration::from_secs(60));
    endpoint.max_response_bytes = 64 * 1024;
    endpoint.retry = RetryPolicy { max_attempts: 3, base_delay_ms: 1, max_delay_ms: 5, ..RetryPolicy::default() };
    let model = endpoint_model(endpoint);
    let failure = thrown(&call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert_eq!(failure.code, "PROVIDER_ERROR");
    assert!(failure.message.contains("larger than 64 KiB"), "{}", failure.message);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_emoji_split_into_lone_surrogate_escapes_is_joined() {
    let server = MockServer::start().await;
    // Raw event text: the JSON escapes are the provider's, not serde's.
    let body = [
        r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"ok \ud83d"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"\ude00 done"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":", lone \udc00 and \ud83d"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"write","arguments":"{\"t\":\"\ud83d"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\ude00\"}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ]
    .iter()
    .map(|data| format!("data: {data}\n\n"))
    .collect::<String>();
    once(&server, CHAT, sse(body)).await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    let got = chunks(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert_eq!(
        got,
        vec![
            start(0, "text"),
            text_delta(0, "ok "),
            text_delta(0, "😀 done"),
            text_delta(0, ", lone \u{FFFD} and "),
            // The high half that never got its low half ends the block as U+FFFD.
            text_delta(0, "\u{FFFD}"),
            end(0, json!({"type": "text", "text": "ok 😀 done, lone \u{FFFD} and \u{FFFD}"})),
            start(1, "tool-call"),
            call_delta(1, "c1", Some("write"), "{\"t\":\""),
            call_delta(1, "c1", None, "😀\"}"),
            end(1, json!({"type": "tool-call", "id": "c1", "name": "write", "arguments": "{\"t\":\"😀\"}"})),
            finish(FinishReason::ToolCalls),
        ]
    );
    assert!(retries.lock().unwrap().is_empty());

    let server = MockServer::start().await;
    let events = [
        ("message_start", message_start(3).to_string()),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.into(),
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi \ud83d"}}"#.into(),
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\ude00"}}"#.into(),
        ),
        ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.into()),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#.into(),
        ),
        ("message_stop", r#"{"type":"message_stop"}"#.into()),
    ];
    let body: String = events.iter().map(|(kind, data)| format!("event: {kind}\ndata: {data}\n\n")).collect();
    once(&server, MESSAGES, sse(body)).await;
    let (model, _) = routed("anthropic/claude-test", &fast_settings(), &anthropic_env(&server));
    let got = chunks(call(&model, request("anthropic/claude-test", vec![user("Hi")])).await);
    assert_eq!(
        got[..4],
        [start(0, "text"), text_delta(0, "hi "), text_delta(0, "😀"), end(0, json!({"type": "text", "text": "hi 😀"}))]
    );
    assert_eq!(got.last(), Some(&finish(FinishReason::Stop)));
}

#[tokio::test]
async fn an_empty_completion_is_passed_on_for_the_step_to_retry() {
    // The client does not retry an empty completion itself: it delivers it as it came (one
    // request, a finish), so the agent's step names it EMPTY_RESPONSE and each retry is a call
    // of its own in the log, whatever the model.
    let server = MockServer::start().await;
    let empty = chat_sse(&[delta(json!({"role": "assistant", "content": ""})), finish_reason("stop")]);
    always(&server, CHAT, sse(empty)).await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    let got = chunks(call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert_eq!(got.last(), Some(&finish(FinishReason::Stop)), "{got:?}");
    assert!(!got.iter().any(|c| matches!(c, StreamChunk::BlockStart { .. })), "{got:?}");
    assert!(retries.lock().unwrap().is_empty());
    assert_eq!(requests(&server).await.len(), 1);
}

#[tokio::test]
async fn cancellation_aborts_the_request_at_once() {
    let server = MockServer::start().await;
    let (slow, arrived) = common::Heard::new(sse(text_answer("hello")).set_delay(Duration::from_secs(10)));
    once(&server, CHAT, slow).await;
    let (model, _) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    let cancel = CancellationToken::new();
    let stream = model.stream(request("deepseek/deepseek-v4-flash", vec![user("Hi")]), cancel.clone());
    // Cancelled once the server holds the request (its answer is ten seconds away).
    let cancelled = tokio::task::spawn_blocking(move || {
        arrived.recv_timeout(Duration::from_secs(30)).expect("the request reached the server");
        cancel.cancel();
        Instant::now()
    });
    let got = chunks(collect(stream).await);
    let took = cancelled.await.unwrap().elapsed();
    assert!(took < Duration::from_secs(5), "the stream ended {took:?} after the cancel");
    assert_eq!(got, vec![finish(FinishReason::Aborted { failure: None })]);
}

// ---- Failures the user must act on --------------------------------------------------------------

#[tokio::test]
async fn context_overflow_is_not_retried() {
    let server = MockServer::start().await;
    always(
        &server,
        CHAT,
        ResponseTemplate::new(400).set_body_json(json!({"error": {
            "message": "This model's maximum context length is 131072 tokens. However, you requested 140000 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }})),
    )
    .await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    let results = call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await;
    let failure = thrown(&results);
    assert_eq!(failure.code, "CONTEXT_WINDOW_EXCEEDED");
    assert_eq!(failure.extra["status"], 400);
    assert!(failure.message.contains("maximum context length"));
    assert!(retries.lock().unwrap().is_empty());
    assert_eq!(requests(&server).await.len(), 1);
}

#[tokio::test]
async fn a_redirect_is_not_followed_so_the_key_stays_with_the_configured_server() {
    let (server, elsewhere) = (MockServer::start().await, MockServer::start().await);
    always(&elsewhere, MESSAGES, sse(text_answer("stolen"))).await;
    let target = format!("{}{MESSAGES}", elsewhere.uri());
    always(&server, MESSAGES, ResponseTemplate::new(307).insert_header("location", target.as_str())).await;
    let env = fake_env(vec![("ANTHROPIC_BASE_URL", server.uri()), ("ANTHROPIC_API_KEY", KEY.to_string())]);
    let (model, retries) = routed("anthropic/claude-x", &fast_settings(), &env);
    let failure = thrown(&call(&model, request("anthropic/claude-x", vec![user("Hi")])).await);
    assert_eq!(failure.code, "PROVIDER_ERROR");
    assert_eq!(failure.extra["status"], 307);
    assert!(
        failure.message.contains(&format!("redirected the request for anthropic/claude-x (HTTP 307) to {target}")),
        "{}",
        failure.message
    );
    assert!(failure.message.contains("set the provider's base URL"), "{}", failure.message);
    assert!(retries.lock().unwrap().is_empty(), "a redirect is not retried");
    assert_eq!(requests(&server).await.len(), 1);
    assert!(requests(&elsewhere).await.is_empty(), "nothing, and no key, reached the other server");
}

#[tokio::test]
async fn a_document_answered_with_200_is_an_error_that_quotes_it_not_a_broken_stream() {
    let server = MockServer::start().await;
    always(
        &server,
        CHAT,
        ResponseTemplate::new(200).set_body_json(
            json!({"error": {"message": "Insufficient credits: top up your account", "type": "billing"}}),
        ),
    )
    .await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    let failure = thrown(&call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert_eq!(failure.code, "PROVIDER_ERROR");
    assert!(
        failure.message.contains("with application/json instead of an event stream (HTTP 200 OK)"),
        "{}",
        failure.message
    );
    assert!(failure.message.contains("Insufficient credits: top up your account"), "{}", failure.message);
    assert!(retries.lock().unwrap().is_empty(), "not retried");
    let portal = MockServer::start().await;
    always(
        &portal,
        CHAT,
        ResponseTemplate::new(200)
            .set_body_raw("<html><body>Log in to the Wi-Fi</body></html>", "text/html; charset=utf-8"),
    )
    .await;
    let (model, _) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&portal));
    let failure = thrown(&call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await);
    assert!(failure.message.contains("with text/html instead of an event stream"), "{}", failure.message);
    assert!(failure.message.contains("Log in to the Wi-Fi"), "{}", failure.message);
}

#[tokio::test]
async fn a_rejected_key_names_the_variable_but_never_the_key() {
    let server = MockServer::start().await;
    always(
        &server,
        CHAT,
        ResponseTemplate::new(401).set_body_json(json!({"error": {
            "message": format!("Authentication Fails, Your api key: {KEY} is invalid"),
            "type": "authentication_error",
        }})),
    )
    .await;
    let (model, retries) = routed("deepseek/deepseek-v4-flash", &fast_settings(), &deepseek_env(&server));
    let results = call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await;
    let failure = thrown(&results);
    assert_eq!(failure.code, "AUTH_FAILED");
    assert!(
        failure.message.starts_with("the API key in DEEPSEEK_API_KEY was rejected (HTTP 401)"),
        "{}",
        failure.message
    );
    assert!(failure.message.contains("[redacted]"), "{}", failure.message);
    assert!(retries.lock().unwrap().is_empty());
    let sent = requests(&server).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(header(&sent[0], "authorization"), Some(format!("Bearer {KEY}")));
}

#[tokio::test]
async fn an_unknown_model_names_the_model_and_the_route() {
    let server = MockServer::start().await;
    once(
        &server,
        "/v1/chat/completions",
        ResponseTemplate::new(404).set_body_json(json!({"error": {
            "message": "The model `nope` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "code": "model_not_found",
        }})),
    )
    .await;
    let env = fake_env(vec![("OPENAI_BASE_URL", format!("{}/v1", server.uri())), ("OPENAI_API_KEY", KEY.to_string())]);
    let (model, retries) = routed("openai/nope", &fast_settings(), &env);
    let results = call(&model, request("openai/nope", vec![user("Hi")])).await;
    let failure = thrown(&results);
    assert_eq!(failure.code, "MODEL_NOT_FOUND");
    assert!(failure.message.contains("\"nope\""), "{}", failure.message);
    assert!(failure.message.contains("openai/nope"), "{}", failure.message);
    assert!(retries.lock().unwrap().is_empty());

    // DeepSeek answers an unknown model with 400 "Model Not Exist".
    let deepseek = MockServer::start().await;
    always(
        &deepseek,
        CHAT,
        ResponseTemplate::new(400)
            .set_body_json(json!({"error": {"message": "Model Not Exist", "type": "invalid_request_error"}})),
    )
    .await;
    let (model, _) = routed("deepseek/nope", &fast_settings(), &deepseek_env(&deepseek));
    let results = call(&model, request("deepseek/nope", vec![user("Hi")])).await;
    assert_eq!(thrown(&results).code, "MODEL_NOT_FOUND");
}

#[tokio::test]
async fn a_missing_key_fails_the_call_not_the_startup() {
    let server = MockServer::start().await;
    always(&server, CHAT, sse(text_answer("hello"))).await;
    let env = fake_env(vec![("DEEPSEEK_BASE_URL", server.uri())]);
    let route = ModelRoute::parse("deepseek/deepseek-v4-flash").unwrap();
    let model =
        model_for_route(&route, &fast_settings(), &env).unwrap_or_else(|e| panic!("startup must not need a key: {e}"));
    let results = call(&model, request("deepseek/deepseek-v4-flash", vec![user("Hi")])).await;
    let failure = thrown(&results);
    assert_eq!(failure.code, "MISSING_CREDENTIAL");
    assert!(failure.message.contains("DEEPSEEK_API_KEY"), "{}", failure.message);
    assert!(requests(&server).await.is_empty());
}

#[tokio::test]
async fn an_unknown_provider_lists_the_known_ones() {
    let route = ModelRoute::parse("mystery/m1").unwrap();
    let error =
        model_for_route(&route, &ModelSettings::default(), &|_| None).err().expect("an unknown provider is an error");
    assert!(error.contains("deepseek, openai, anthropic"), "{error}");
}

// ---- Anthropic Messages --------------------------------------------------------------------------

fn anthropic_sse(events: &[Value]) -> String {
    events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect()
}

fn message_start(input_tokens: u64) -> Value {
    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [], "stop_reason": null, "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 0}}})
}

fn anthropic_text(text: &str, stop_reason: &str) -> String {
    anthropic_sse(&[
        message_start(30),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": 7}}),
        json!({"type": "message_stop"}),
    ])
}

fn anthropic_env(server: &MockServer) -> impl Fn(&str) -> Option<String> {
    fake_env(vec![("ANTHROPIC_BASE_URL", server.uri()), ("ANTHROPIC_API_KEY", KEY.to_string())])
}

#[tokio::test]
async fn anthropic_thinking_and_tool_use_round_trip() {
    let server = MockServer::start().await;
    let first = anthropic_sse(&[
        message_start(20),
        json!({"type": "ping"}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "look."}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "SIG=="}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Reading."}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"path\":"}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "\"a.txt\"}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 42}}),
        json!({"type": "message_stop"}),
    ]);
    once(&server, MESSAGES, sse(first)).await;
    once(&server, MESSAGES, sse(anthropic_text("hello", "end_turn"))).await;
    let (model, _) = routed("anthropic/claude-test", &fast_settings(), &anthropic_env(&server));
    let route = "anthropic/claude-test";

    let step1 = chunks(call(&model, request(route, vec![user("Read a.txt")])).await);
    assert_eq!(
        step1,
        vec![
            start(0, "reasoning"),
            reasoning_delta(0, "Let me "),
            reasoning_delta(0, "look."),
            end(0, json!({"type": "reasoning", "text": "Let me look.", "signature": "SIG=="})),
            start(1, "text"),
            text_delta(1, "Reading."),
            end(1, json!({"type": "text", "text": "Reading."})),
            start(2, "tool-call"),
            call_delta(2, "toolu_1", Some("read"), ""),
            call_delta(2, "toolu_1", None, "{\"path\":"),
            call_delta(2, "toolu_1", None, "\"a.txt\"}"),
            end(2, json!({"type": "tool-call", "id": "toolu_1", "name": "read", "arguments": "{\"path\":\"a.txt\"}"})),
            StreamChunk::Usage {
                usage: json!({"inputTokens": 25, "outputTokens": 42, "cacheReadTokens": 5, "cacheWriteTokens": 0})
            },
            finish(FinishReason::ToolCalls),
        ]
    );

    // Step 2: a staged user message after the tool result merges into the same user turn.
    let messages =
        vec![user("Read a.txt"), assistant_message(&step1), tool_result("toolu_1", "hello"), user("Be brief.")];
    let step2 = chunks(call(&model, request(route, messages)).await);
    assert_eq!(step2.last(), Some(&finish(FinishReason::Stop)));

    let sent = requests(&server).await;
    assert_eq!(sent.len(), 2);
    for request in &sent {
        assert_eq!(header(request, "x-api-key"), Some(KEY.to_string()));
        assert_eq!(header(request, "anthropic-version"), Some("2023-06-01".into()));
        assert_eq!(header(request, "authorization"), None);
    }
    assert_eq!(
        sent[0].body_json::<Value>().unwrap(),
        json!({
            "model": "claude-test",
            "max_tokens": 8192,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Read a.txt"}]}],
            "stream": true,
            "system": "You are kin.",
            "tools": [{"name": "read", "description": "Read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
        })
    );
    assert_eq!(
        sent[1].body_json::<Value>().unwrap()["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Read a.txt"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Let me look.", "signature": "SIG=="},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.txt"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false, "content": [{"type": "text", "text": "hello"}]},
                {"type": "text", "text": "Be brief."},
            ]},
        ])
    );
}

#[tokio::test]
async fn anthropic_overload_in_the_stream_is_retried_and_max_tokens_is_mapped() {
    let server = MockServer::start().await;
    let overloaded = anthropic_sse(&[
        message_start(10),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    once(&server, MESSAGES, sse(overloaded)).await;
    // An overload right after an empty block's start showed nothing yet: retried as well.
    let after_a_start = anthropic_sse(&[
        message_start(10),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    once(&server, MESSAGES, sse(after_a_start)).await;
    once(&server, MESSAGES, sse(anthropic_text("cut", "max_tokens"))).await;
    let (model, retries) = routed("anthropic/claude-test", &fast_settings(), &anthropic_env(&server));
    let got = chunks(call(&model, request("anthropic/claude-test", vec![user("Hi")])).await);
    assert_eq!(
        got,
        vec![
            start(0, "text"),
            text_delta(0, "cut"),
            end(0, json!({"type": "text", "text": "cut"})),
            StreamChunk::Usage {
                usage: json!({"inputTokens": 35, "outputTokens": 7, "cacheReadTokens": 5, "cacheWriteTokens": 0})
            },
            finish(FinishReason::MaxTokens),
        ]
    );
    let codes: Vec<String> = retries.lock().unwrap().iter().map(|r| r.code.clone()).collect();
    assert_eq!(codes, vec!["SERVER_ERROR".to_string(), "SERVER_ERROR".to_string()]);
}

#[tokio::test]
async fn anthropic_rejected_and_missing_keys() {
    let server = MockServer::start().await;
    always(
        &server,
        MESSAGES,
        ResponseTemplate::new(401).set_body_json(
            json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
        ),
    )
    .await;
    let (model, _) = routed("anthropic/claude-test", &fast_settings(), &anthropic_env(&server));
    let results = call(&model, request("anthropic/claude-test", vec![user("Hi")])).await;
    let failure = thrown(&results);
    assert_eq!(failure.code, "AUTH_FAILED");
    assert!(failure.message.contains("ANTHROPIC_API_KEY"), "{}", failure.message);
    assert_eq!(requests(&server).await.len(), 1);

    let keyless = fake_env(vec![("ANTHROPIC_BASE_URL", server.uri())]);
    let (model, _) = routed("anthropic/claude-test", &fast_settings(), &keyless);
    let results = call(&model, request("anthropic/claude-test", vec![user("Hi")])).await;
    let failure = thrown(&results);
    assert_eq!(failure.code, "MISSING_CREDENTIAL");
    assert!(failure.message.contains("ANTHROPIC_API_KEY"));
    assert_eq!(requests(&server).await.len(), 1);
}
