//! Compaction through the agent loop, with the scripted model over a real JSONL store: the
//! pressure check at the start of a step compacts when the reported usage of the last call
//! reaches the threshold of the route's window, and the step's request carries the checkpoint
//! and the kept tail. Overflow recovery against loopback providers (DeepSeek's and Anthropic's
//! context-exceeded errors), and `/compact` over pipes against the real binary.

use std::sync::Arc;

use kin::testkit::agent::compact::Policy;
use kin::testkit::agent::{AgentDeps, TurnEnd, spawn_agent};
use kin::testkit::model::capacity::{ModelEntry, ModelTable};
use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::model::{Model, ModelRoute, Purpose, StreamChunk, text_response};
use kin::testkit::session::{SessionHeader, SessionStore};
use kin::testkit::tools::ToolRegistry;
use serde_json::{Value, json};

#[allow(dead_code)]
mod common;

/// A text answer whose usage reports `input` tokens.
fn answer(text: &str, input: u64) -> ReplayEntry {
    let chunks = text_response(&[text])
        .into_iter()
        .map(|chunk| match chunk {
            StreamChunk::Usage { .. } => StreamChunk::Usage { usage: json!({"inputTokens": input, "outputTokens": 5}) },
            other => other,
        })
        .collect();
    ReplayEntry::Chunks(chunks)
}

fn text(t: &str) -> Vec<Value> {
    vec![json!({"type": "text", "text": t})]
}

/// `test/model` has a `window`-token context; summaries are written on a route without a known
/// window, so their requests go unfitted (the fitting has tests of its own).
fn policy(window: u64, retain_ratio: f64) -> Policy {
    let entry = ModelEntry { context_window: Some(window), price: None };
    let models = ModelTable { routes: vec![("test/model".into(), entry)], ..Default::default() };
    let summary_route = Some(ModelRoute::parse("test/summariser").unwrap());
    Policy { retain_ratio, summary_route, models: Arc::new(models), ..Policy::default() }
}

struct Run {
    _dir: tempfile::TempDir,
    store: SessionStore,
    model: Arc<ScriptedModel>,
}

/// Two prompts (a long first one) against a 2000-token window.
async fn two_turns(first_usage: u64, compaction: Policy, entries: Vec<ReplayEntry>) -> Run {
    let mut all = vec![answer("ok", first_usage)];
    all.extend(entries);
    let model = Arc::new(ScriptedModel::new(all));
    let route = ModelRoute::parse("test/model").unwrap();
    let (dir, store, end) = prompt_twice(model.clone() as Arc<dyn Model>, route, compaction).await;
    assert_eq!(end, TurnEnd::Completed);
    Run { _dir: dir, store, model }
}

/// A fresh session on `model`: a long first prompt (which must complete), then a second;
/// the second's turn end.
async fn prompt_twice(
    model: Arc<dyn Model>,
    route: ModelRoute,
    compaction: Policy,
) -> (tempfile::TempDir, SessionStore, TurnEnd) {
    let prompts = [text(&"x".repeat(2000)), text("second")];
    let (dir, store, ends) = prompt_each(model, route, compaction, &prompts).await;
    assert_eq!(ends[0], TurnEnd::Completed);
    (dir, store, ends[1].clone())
}

/// An agent on `model` without tools, at most 5 steps a prompt.
fn deps(model: Arc<dyn Model>, route: ModelRoute, compaction: Policy) -> AgentDeps {
    AgentDeps {
        model,
        tools: ToolRegistry::new(),
        route,
        system: "be brief".into(),
        max_steps: 5,
        max_parallel_tools: 1,
        depth: 0,
        permissions: None,
        prompt: None,
        file_access: None,
        retry: Default::default(),
        compaction,
    }
}

/// A fresh session on `model` given each of `prompts` in turn; each turn's end.
async fn prompt_each(
    model: Arc<dyn Model>,
    route: ModelRoute,
    compaction: Policy,
    prompts: &[Vec<Value>],
) -> (tempfile::TempDir, SessionStore, Vec<TurnEnd>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SessionStore::new(dir.path());
    let session = store.create(SessionHeader::new("s", 1, Some("/w".into()))).unwrap();
    let handle = spawn_agent(session, deps(model, route, compaction));
    let mut ends = Vec::new();
    for prompt in prompts {
        ends.push(handle.followup(prompt.clone(), json!({"kind": "user"})).unwrap().await.unwrap());
    }
    handle.shutdown().await;
    (dir, store, ends)
}

fn kinds(run: &Run) -> Vec<String> {
    let events = run.store.inspect("s").unwrap().events;
    events.iter().filter(|e| e.kind != "assistant/chunk").map(|e| e.kind.to_string()).collect()
}

#[tokio::test]
async fn usage_past_the_threshold_compacts_before_the_next_step() {
    let entries = vec![answer("Summary of the long prompt.", 0), answer("done", 300)];
    let run = two_turns(1700, policy(2000, 0.005), entries).await;
    let kinds = kinds(&run);
    let second = kinds.iter().rposition(|k| k == "turn/start").unwrap();
    assert_eq!(
        kinds[second..],
        [
            "turn/start",
            "user/message",
            "compact/start",
            "compact/summary",
            "user/message",
            "compact/end",
            "step/start",
            "assistant/message",
            "step/end",
            "turn/end"
        ]
    );
    let events = run.store.inspect("s").unwrap().events;
    let start = events.iter().find(|e| e.kind == "compact/start").unwrap();
    assert_eq!(start.data, json!({"turn": 2}), "an automatic compaction belongs to the open turn");
    let requests = run.model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[1].purpose, Purpose::Compaction);
    assert_eq!(requests[1].messages.len(), 3, "the shadowed prompt and answer, then the instruction");
    // The step after the compaction: the checkpoint, then the kept tail ("second").
    let step = &requests[2];
    assert_eq!(step.purpose, Purpose::Step);
    assert_eq!(step.messages.len(), 2);
    let checkpoint = &step.messages[0]["content"];
    assert!(checkpoint[0]["text"].as_str().unwrap().starts_with("This is an automatically generated checkpoint"));
    assert_eq!(checkpoint[1]["text"], "Summary of the long prompt.");
    assert_eq!(step.messages[1]["content"][0]["text"], "second");
    // A reload folds to the same history.
    let loaded = run.store.load("s").unwrap();
    assert_eq!(loaded.messages().len(), 3, "checkpoint, second, done");
}

#[tokio::test]
async fn below_the_threshold_or_without_a_window_nothing_is_compacted() {
    let run = two_turns(1500, policy(2000, 0.005), vec![answer("done", 300)]).await;
    assert!(!kinds(&run).iter().any(|k| k.starts_with("compact/")));
    assert_eq!(run.model.requests().len(), 2);
    let unknown = Policy { models: Arc::new(ModelTable::default()), ..policy(2000, 0.005) };
    let run = two_turns(1_000_000, unknown, vec![answer("done", 300)]).await;
    assert!(!kinds(&run).iter().any(|k| k.starts_with("compact/")), "test/model has no known window");
    let off = Policy { auto: false, ..policy(2000, 0.005) };
    let run = two_turns(1900, off, vec![answer("done", 300)]).await;
    assert!(!kinds(&run).iter().any(|k| k.starts_with("compact/")), "auto = false");
}

#[tokio::test]
async fn a_failed_pressure_compaction_is_recorded_and_the_step_goes_on() {
    let throw = ReplayEntry::Throw { chunks: vec![], message: "summary model down".into(), code: "X".into() };
    let run = two_turns(1700, policy(2000, 0.005), vec![throw, answer("done", 300)]).await;
    let events = run.store.inspect("s").unwrap().events;
    let end = events.iter().find(|e| e.kind == "compact/end").unwrap();
    assert_eq!(end.data, json!({"turn": 2, "error": "summary model down"}));
    let step = &run.model.requests()[2];
    assert_eq!(step.messages.len(), 3, "the whole history, uncompacted");
    assert!(!events.iter().any(|e| e.kind == "compact/summary"));
}

// ---- Overflow recovery over loopback HTTP ---------------------------------------------------

/// A provider behind a loopback server: its route, the path it posts to, its environment, a
/// text answer in its SSE format, and its context-exceeded error document.
struct Provider {
    route: &'static str,
    path: &'static str,
    base_var: &'static str,
    key_var: &'static str,
    answer: fn(&str) -> String,
    overflow: fn() -> Value,
}

fn chat_answer(text: &str) -> String {
    let chunk = |delta: Value, finish: Value| json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    let events = [chunk(json!({"role": "assistant", "content": text}), Value::Null), chunk(json!({}), json!("stop"))];
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

fn anthropic_answer(text: &str) -> String {
    let usage = json!({"input_tokens": 10, "output_tokens": 1});
    [
        json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "model": "claude-test", "content": [], "stop_reason": null, "usage": usage}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}}),
        json!({"type": "message_stop"}),
    ]
    .iter()
    .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
    .collect()
}

const DEEPSEEK: Provider = Provider {
    route: "deepseek/deepseek-v4-flash",
    path: "/chat/completions",
    base_var: "DEEPSEEK_BASE_URL",
    key_var: "DEEPSEEK_API_KEY",
    answer: chat_answer,
    overflow: || {
        json!({"error": {
            "message": "This model's maximum context length is 131072 tokens. However, you requested 140000 tokens (139000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            "type": "invalid_request_error",
            "param": null,
            "code": "invalid_request_error",
        }})
    },
};

const ANTHROPIC: Provider = Provider {
    route: "anthropic/claude-test",
    path: "/v1/messages",
    base_var: "ANTHROPIC_BASE_URL",
    key_var: "ANTHROPIC_API_KEY",
    answer: anthropic_answer,
    overflow: || json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 215000 tokens > 200000 maximum"}}),
};

/// What the loopback provider was asked, in order: `summary` for a summary request, else the
/// texts of the request's messages.
type Asked = Arc<std::sync::Mutex<Vec<Value>>>;

/// Serves `provider`: the first `overflows` step requests are refused as too long for the
/// context window; a summary request gets a summary, any other step request `done`.
async fn overflowing_server(provider: &Provider, overflows: usize) -> (wiremock::MockServer, Asked) {
    let asked: Asked = Arc::default();
    let seen = asked.clone();
    let (answer, overflow) = (provider.answer, provider.overflow);
    let respond = move |request: &wiremock::Request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        let text = body.to_string();
        let mut seen = seen.lock().unwrap();
        if text.contains("You are now acting as a compaction engine") {
            seen.push(json!("summary"));
            return wiremock::ResponseTemplate::new(200)
                .set_body_raw(answer("Summary of the long prompt."), "text/event-stream");
        }
        seen.push(body["messages"].clone());
        let steps = seen.iter().filter(|s| s.is_array()).count();
        if steps > 1 && steps <= 1 + overflows {
            return wiremock::ResponseTemplate::new(400).set_body_json(overflow());
        }
        wiremock::ResponseTemplate::new(200).set_body_raw(answer("done"), "text/event-stream")
    };
    (serving(provider.path, respond).await, asked)
}

/// A loopback server answering every POST to `path` with `respond`.
async fn serving(path: &str, respond: impl wiremock::Respond + 'static) -> wiremock::MockServer {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path(path))
        .respond_with(respond)
        .mount(&server)
        .await;
    server
}

/// Two prompts (a long first one) through the real HTTP client of `provider`; the second
/// prompt's turn end.
async fn overflow_run(provider: &Provider, overflows: usize, compaction: Policy) -> (Run, TurnEnd, Asked) {
    let (server, asked) = overflowing_server(provider, overflows).await;
    let (model, route) = served(provider, &server);
    let (dir, store, end) = prompt_twice(model, route, compaction).await;
    let scripted = Arc::new(ScriptedModel::new(Vec::<ReplayEntry>::new()));
    (Run { _dir: dir, store, model: scripted }, end, asked)
}

/// `provider`'s HTTP model (kin's real client) pointed at `server`, and its route.
fn served(provider: &Provider, server: &wiremock::MockServer) -> (Arc<dyn Model>, ModelRoute) {
    let env = |name: &str| match name {
        n if n == provider.base_var => Some(server.uri()),
        n if n == provider.key_var => Some("sk-test".to_string()),
        _ => None,
    };
    let route = ModelRoute::parse(provider.route).unwrap();
    let settings = kin::testkit::model::router::ModelSettings::default();
    (kin::testkit::model::router::model_for_route(&route, &settings, &env).unwrap(), route)
}

/// The conversation messages of a request, as JSON text (Chat Completions' system message left out).
fn conversation(messages: &Value) -> Vec<String> {
    messages.as_array().unwrap().iter().filter(|m| m["role"] != "system").map(|m| m.to_string()).collect()
}

#[tokio::test]
async fn a_context_overflow_compacts_and_a_retry_turn_asks_again() {
    for provider in [&DEEPSEEK, &ANTHROPIC] {
        let (run, end, asked) = overflow_run(provider, 1, Policy::default()).await;
        assert_eq!(end, TurnEnd::Completed, "{}", provider.route);
        let kinds = kinds(&run);
        let second = kinds.iter().position(|k| k == "turn/end").unwrap() + 1;
        assert_eq!(
            kinds[second..],
            [
                "turn/start",
                "user/message",
                "step/start",
                "step/end",
                "compact/start",
                "compact/summary",
                "user/message",
                "compact/end",
                "turn/end",
                "turn/start",
                "step/start",
                "assistant/message",
                "step/end",
                "turn/end"
            ],
            "{}",
            provider.route
        );
        let events = run.store.inspect("s").unwrap().events;
        let data = |kind: &str, nth: usize| events.iter().filter(|e| e.kind == kind).nth(nth).unwrap().data.clone();
        assert_eq!(data("compact/start", 0), json!({"turn": 2}));
        let failed = data("turn/end", 1);
        assert_eq!(failed["reason"]["kind"], "error");
        assert_eq!(failed["reason"]["failure"]["code"], "CONTEXT_WINDOW_EXCEEDED");
        assert_eq!(data("turn/start", 2), json!({"turn": 3, "trigger": {"kind": "retry"}}));
        // The provider saw: the first prompt, the refused second, the summary request, then the
        // retry with the checkpoint and the newest message only.
        let asked = asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 4, "{}: {asked:?}", provider.route);
        assert_eq!(asked[2], "summary");
        // (Anthropic joins consecutive user messages into one.)
        let retry = conversation(&asked[3]).join("\n");
        let summary = retry.find("Summary of the long prompt.").expect(&retry);
        assert!(retry.contains("<compacted-summary>") && retry.rfind("second").unwrap() > summary);
        assert!(!retry.contains("xxxx"), "the long prompt is gone from the retry");
        let refused = conversation(&asked[1]);
        assert!(refused.iter().any(|m| m.contains("xxxx")), "the refused request held the whole history");
    }
}

#[tokio::test]
async fn an_overflow_after_the_recovery_or_with_recovery_off_fails_with_a_clear_error() {
    let (run, end, asked) = overflow_run(&DEEPSEEK, 2, Policy::default()).await;
    let TurnEnd::Error(message) = end else { panic!("{end:?}") };
    assert!(message.starts_with("the conversation no longer fits the context window of deepseek/deepseek-v4-flash"));
    assert!(
        message.ends_with("; it still did not fit after 1 compaction (max_overflow_retries = 1); start a new session or use a model with a larger window"),
        "{message}"
    );
    assert_eq!(kinds(&run).iter().filter(|k| *k == "compact/end").count(), 1, "one recovery only");
    assert_eq!(asked.lock().unwrap().len(), 4, "prompt, refused, summary, refused retry");
    let off = Policy { max_overflow_retries: 0, ..Policy::default() };
    let (run, end, asked) = overflow_run(&DEEPSEEK, 1, off).await;
    let TurnEnd::Error(message) = end else { panic!("{end:?}") };
    assert!(
        message.ends_with(
            "; overflow recovery is off ([compaction] max_overflow_retries = 0): run /compact or start a new session"
        ),
        "{message}"
    );
    assert!(!kinds(&run).iter().any(|k| k.starts_with("compact/")));
    assert_eq!(asked.lock().unwrap().len(), 2);
}

/// One request a size-limited provider got: its body's length, whether it was a summary
/// request, and whether it was refused as too long.
#[derive(Debug, Clone, Copy)]
struct Seen {
    bytes: usize,
    summary: bool,
    refused: bool,
}

/// Serves DeepSeek's route like a provider with a context window of `limit` bytes of request
/// body: anything longer is refused as too long, a summary request gets a summary, any other
/// request `done`.
async fn size_limited_server(limit: usize) -> (wiremock::MockServer, Arc<std::sync::Mutex<Vec<Seen>>>) {
    let seen: Arc<std::sync::Mutex<Vec<Seen>>> = Arc::default();
    let log = seen.clone();
    let respond = move |request: &wiremock::Request| {
        let bytes = request.body.len();
        let summary = String::from_utf8_lossy(&request.body).contains("You are now acting as a compaction engine");
        let refused = bytes > limit;
        log.lock().unwrap().push(Seen { bytes, summary, refused });
        if refused {
            return wiremock::ResponseTemplate::new(400).set_body_json((DEEPSEEK.overflow)());
        }
        let answer = if summary { "Summary so far." } else { "done" };
        wiremock::ResponseTemplate::new(200).set_body_raw(chat_answer(answer), "text/event-stream")
    };
    (serving(DEEPSEEK.path, respond).await, seen)
}

/// Six prompts of 1,500 characters to DeepSeek's route served by a provider that takes 7,000
/// bytes of request (about 1,750 tokens at kin's four characters a token), kin told the route's
/// window is `window` tokens, the summary's cap 200: every turn's end, and what the provider saw.
async fn six_prompts_to_a_7000_byte_provider(
    window: u64,
) -> (Vec<TurnEnd>, Vec<Seen>, SessionStore, tempfile::TempDir) {
    let (server, seen) = size_limited_server(7000).await;
    let (model, route) = served(&DEEPSEEK, &server);
    let entry = ModelEntry { context_window: Some(window), price: None };
    let models = ModelTable { routes: vec![(route.to_string(), entry)], ..Default::default() };
    let compaction = Policy { threshold_ratio: 1.0, max_tokens: 200, models: Arc::new(models), ..Policy::default() };
    let prompts: Vec<Vec<Value>> = (0..6).map(|i| text(&format!("{i}").repeat(1500))).collect();
    let (dir, store, ends) = prompt_each(model, route, compaction, &prompts).await;
    let seen = seen.lock().unwrap().clone();
    (ends, seen, store, dir)
}

#[tokio::test]
async fn a_history_too_large_for_one_summary_request_is_compacted_in_rounds_the_provider_accepts() {
    // The fifth prompt's request no longer fits, and neither would one summary request holding
    // the four before it and the instruction.
    let (ends, seen, store, _dir) = six_prompts_to_a_7000_byte_provider(1750).await;
    assert!(ends.iter().all(|end| *end == TurnEnd::Completed), "{ends:?}");
    let summaries: Vec<&Seen> = seen.iter().filter(|s| s.summary).collect();
    assert!(summaries.len() >= 2, "more than one summary call: {seen:?}");
    assert!(summaries.iter().all(|s| s.bytes <= 7000), "every summary request fit the window: {seen:?}");
    let events = store.inspect("s").unwrap().events;
    let failed = events.iter().filter(|e| e.kind == "compact/end" && !e.data["error"].is_null()).count();
    assert_eq!(failed, 0, "no compaction failed");
    assert!(events.iter().filter(|e| e.kind == "compact/summary").count() >= 2);
}

#[tokio::test]
async fn a_summary_request_refused_as_too_long_is_sent_again_with_half_the_history() {
    // kin is told of a window twice what the provider takes (its estimate undercounting): the
    // fifth prompt overflows, the recovery's first summary request is refused, and the next
    // ones carry half as much, in rounds, until the history is compacted and the turn retried.
    let (ends, seen, store, _dir) = six_prompts_to_a_7000_byte_provider(3500).await;
    assert!(ends.iter().all(|end| *end == TurnEnd::Completed), "{ends:?}");
    let summaries: Vec<&Seen> = seen.iter().filter(|s| s.summary).collect();
    assert!(summaries[0].refused, "{seen:?}");
    assert!(summaries[1..].iter().all(|s| !s.refused), "{seen:?}");
    let events = store.inspect("s").unwrap().events;
    let errors: Vec<String> = events
        .iter()
        .filter(|e| e.kind == "compact/end")
        .filter_map(|e| e.data["error"].as_str().map(str::to_string))
        .collect();
    assert_eq!(errors.len(), 1, "the refused attempt is recorded: {errors:?}");
    assert!(errors[0].contains("maximum context length"), "{}", errors[0]);
}

// ---- `/compact` over pipes ------------------------------------------------------------------

/// `kin acp` on DeepSeek's route, served by `server` answering with `respond`, its sessions and
/// home in `dir`; initialized.
async fn kin_answered_by(
    server: &wiremock::MockServer,
    respond: impl wiremock::Respond + 'static,
    dir: &std::path::Path,
) -> common::Peer {
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/chat/completions"))
        .respond_with(respond)
        .mount(server)
        .await;
    let mut command = common::acp(&dir.join("sessions"), None);
    command.args(["--model", "deepseek/deepseek-v4-flash"]).env("DEEPSEEK_BASE_URL", server.uri());
    command.env("DEEPSEEK_API_KEY", "sk-test").env("HOME", dir).env_remove("XDG_CONFIG_HOME");
    let mut kin = common::Peer::spawn(&mut command);
    kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), std::time::Duration::from_secs(30));
    kin
}

/// `kin_answered_by` with a new session in `dir` whose first turn, a 2,000-character prompt, has
/// ended: the kin and the session's id.
async fn after_a_long_turn(
    server: &wiremock::MockServer,
    respond: impl wiremock::Respond + 'static,
    dir: &std::path::Path,
) -> (common::Peer, String) {
    let mut kin = kin_answered_by(server, respond, dir).await;
    let wait = std::time::Duration::from_secs(30);
    let new = kin.call("session/new", json!({"cwd": dir, "mcpServers": []}), wait);
    let session = new["result"]["sessionId"].as_str().unwrap().to_string();
    let long = json!({"sessionId": session, "prompt": [{"type": "text", "text": "x".repeat(2000)}]});
    let first = kin.call("session/prompt", long, wait);
    assert_eq!(first["result"]["stopReason"], "end_turn", "{first}");
    (kin, session)
}

/// `kin acp` against a loopback DeepSeek whose second step request hangs until cancelled; every
/// summary request body goes to `summaries`, and each request's arrival to `arrived`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_compact_is_busy_during_a_turn_then_compacts_with_its_focus_and_shows_progress() {
    let server = wiremock::MockServer::start().await;
    let (arrived_tx, arrived) = std::sync::mpsc::channel::<&'static str>();
    let arrived_tx = std::sync::Mutex::new(arrived_tx);
    let summaries: Asked = Arc::default();
    let seen = summaries.clone();
    let steps = std::sync::atomic::AtomicUsize::new(0);
    let respond = move |request: &wiremock::Request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        let sse =
            |text: &str| wiremock::ResponseTemplate::new(200).set_body_raw(chat_answer(text), "text/event-stream");
        if body.to_string().contains("You are now acting as a compaction engine") {
            seen.lock().unwrap().push(body);
            let _ = arrived_tx.lock().unwrap().send("summary");
            return sse("Summary of the long prompt.");
        }
        let step = steps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = arrived_tx.lock().unwrap().send("step");
        match step {
            1 => sse("too late").set_delay(std::time::Duration::from_secs(120)),
            _ => sse("ok"),
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let mut kin = kin_answered_by(&server, respond, dir.path()).await;
    let wait = std::time::Duration::from_secs(30);
    let mut frames = Vec::new();
    let id = kin.request("session/new", json!({"cwd": dir.path(), "mcpServers": []}));
    let new = kin.response(id, wait, |_| {});
    let session = new["result"]["sessionId"].as_str().unwrap().to_string();
    let prompt = |text: &str| json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
    let id = kin.request("session/prompt", prompt(&"x".repeat(2000)));
    let first = kin.response(id, wait, |f| frames.push(f.clone()));
    assert_eq!(first["result"]["stopReason"], "end_turn", "{first}");
    let commands = frames
        .iter()
        .find(|f| f["params"]["update"]["sessionUpdate"] == "available_commands_update")
        .expect("the commands are offered");
    let names: Vec<&str> = commands["params"]["update"]["availableCommands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"compact"), "{names:?}");
    assert_eq!(arrived.recv_timeout(wait).unwrap(), "step");
    // A turn that hangs in its model call: `/compact` meanwhile is busy and writes nothing.
    let slow = kin.request("session/prompt", prompt("slow"));
    assert_eq!(arrived.recv_timeout(wait).unwrap(), "step", "the second turn is in its model call");
    let busy = kin.request("session/prompt", prompt("/compact"));
    let mut texts = Vec::new();
    let collect = |texts: &mut Vec<(String, String)>, f: &Value| {
        let update = &f["params"]["update"];
        if let Some(text) = update["content"]["text"].as_str() {
            texts.push((update["sessionUpdate"].as_str().unwrap_or_default().to_string(), text.to_string()));
        }
    };
    let answer = kin.response(busy, wait, |f| collect(&mut texts, f));
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let busy_text =
        "Compaction is unavailable because this process has an active compaction, or the agent is not idle.";
    assert_eq!(texts, [("agent_message_chunk".to_string(), busy_text.to_string())]);
    kin.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}));
    let cancelled = kin.response(slow, wait, |_| {});
    assert_eq!(cancelled["result"]["stopReason"], "cancelled", "{cancelled}");
    assert!(summaries.lock().unwrap().is_empty(), "a busy /compact asks no model");
    // `/compact` with an image attached is refused (its focus is text; the image would be lost).
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let attached = json!({"sessionId": session, "prompt": [
        {"type": "text", "text": "/compact"},
        {"type": "image", "mimeType": "image/png", "data": png},
    ]});
    let refused = kin.request("session/prompt", attached);
    let refused = kin.response(refused, wait, |_| {});
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("/compact takes only text"), "{refused}");
    assert!(summaries.lock().unwrap().is_empty(), "a refused /compact asks no model");
    // So is one with a file or a link attached: they are written into its text block, and would
    // become the focus, never the conversation.
    for block in [
        json!({"type": "resource", "resource": {"uri": "file:///w/notes.md", "text": "NOTES"}}),
        json!({"type": "resource_link", "name": "notes.md", "uri": "file:///w/notes.md"}),
    ] {
        let attached = json!({"sessionId": session, "prompt": [{"type": "text", "text": "/compact"}, block]});
        let refused = kin.request("session/prompt", attached);
        let refused = kin.response(refused, wait, |_| {});
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
        assert!(refused["error"]["message"].as_str().unwrap().contains("/compact takes only text"), "{refused}");
    }
    assert!(summaries.lock().unwrap().is_empty(), "a refused /compact asks no model");
    // After the turn: `/compact` with focus text compacts; the editor sees the progress thought
    // and the outcome with the tokens before and after, and the answer.
    let id = kin.request("session/prompt", prompt("/compact the open questions"));
    let mut texts = Vec::new();
    let done = kin.response(id, wait, |f| collect(&mut texts, f));
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    assert_eq!(arrived.recv_timeout(wait).unwrap(), "summary");
    let summary = summaries.lock().unwrap()[0].clone();
    let instruction = summary["messages"].as_array().unwrap().last().unwrap()["content"].to_string();
    assert!(instruction.contains("You are now acting as a compaction engine"), "{instruction}");
    assert!(instruction.contains("The user asked this checkpoint to focus on: the open questions"), "{instruction}");
    assert!(!summary.to_string().contains("slow"), "the newest message stays out of the summary");
    let kinds: Vec<&str> = texts.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(kinds, ["agent_thought_chunk", "agent_thought_chunk", "agent_message_chunk"], "{texts:?}");
    assert_eq!(texts[0].1, "Compacting conversation…\n");
    let outcome = texts[1].1.strip_prefix("Compacted 2 history items: ~").expect(&texts[1].1);
    let (before, after) = outcome.trim_end_matches(" tokens.\n").split_once(" tokens → ~").unwrap();
    let (before, after): (u64, u64) = (before.parse().unwrap(), after.parse().unwrap());
    assert!(before > 500 && after < before, "{outcome}");
    assert_eq!(texts[2].1, format!("Compacted 2 history items (~{before} tokens → ~{after} tokens)."));
    // The next prompt's request: the checkpoint, then what was kept and the prompt.
    let id = kin.request("session/prompt", prompt("next"));
    kin.response(id, wait, |_| {});
    let last: Value = serde_json::from_slice(&server.received_requests().await.unwrap().last().unwrap().body).unwrap();
    let history = conversation(&last["messages"]);
    assert!(history[0].contains("Summary of the long prompt."), "{history:?}");
    assert!(!history.iter().any(|m| m.contains("xxxx")), "{history:?}");
    // A loaded session replays the compaction's outcome.
    kin.close_stdin();
    kin.child.wait().unwrap();
    let mut frames = Vec::new();
    let mut kin2 = common::Peer::spawn(&mut {
        let mut command = common::acp(&dir.path().join("sessions"), None);
        command.args(["--model", "deepseek/deepseek-v4-flash"]).env("DEEPSEEK_BASE_URL", server.uri());
        command.env("HOME", dir.path()).env_remove("XDG_CONFIG_HOME");
        command
    });
    kin2.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), wait);
    let id = kin2.request("session/load", json!({"sessionId": session, "cwd": dir.path(), "mcpServers": []}));
    kin2.response(id, wait, |f| frames.push(f.clone()));
    let replayed: Vec<&str> = frames.iter().filter_map(|f| f["params"]["update"]["content"]["text"].as_str()).collect();
    assert!(replayed.contains(&texts[1].1.as_str()), "{replayed:?}");
    assert!(!replayed.contains(&"Compacting conversation…\n"), "a finished compaction replays its outcome only");
}

/// The keyless scenario `compaction-threshold` (exact compare in `tests/scenarios.rs`): the
/// recorded log's history at the step after its compaction, which is that step's request, is
/// the checkpoint holding the summary, then the kept tail; the surface validates.
#[test]
fn the_threshold_scenario_s_step_after_compaction_asks_with_the_summary_and_the_tail() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/compaction-threshold/session.jsonl");
    let events = kin::testkit::session::scan::scan_file(&path).unwrap().events;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let start = kinds.iter().position(|k| *k == "compact/start").expect("the scenario compacts");
    assert_eq!(
        kinds[start..start + 5],
        ["compact/start", "compact/summary", "user/message", "compact/end", "step/start"]
    );
    assert_eq!(events[start].data, json!({"turn": 2}));
    let checkpoint = &events[start + 2];
    let prompt = events.iter().find(|e| e.kind == "user/message").unwrap().seq;
    let answer = events.iter().find(|e| e.kind == "assistant/message").unwrap().seq;
    assert_eq!(checkpoint.surface_op, Some(json!({"op": "replace", "start": prompt, "end": answer})));
    let (opened, summary) = (events[start].seq, events[start + 1].seq);
    assert_eq!(checkpoint.source_event_seqs, Some(vec![opened, summary, prompt, answer]));
    let request = kin::testkit::session::derive_messages(&events[..start + 4]);
    assert_eq!(request.len(), 2, "{request:?}");
    assert_eq!(request[0]["source"], json!({"kind": "plugin", "plugin": "compact"}));
    assert_eq!(request[0]["content"][1]["text"], "The user gave background for a task and was told it was noted.");
    assert_eq!(request[1]["content"][0]["text"], "What next?");
    kin::testkit::session::surface::validate(&events).unwrap();
}

/// A `/compact` cancelled while its summary is being written answers `cancelled` (with dsh's
/// "Compaction cancelled." text), not `end_turn`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_slash_compact_answers_cancelled() {
    let server = wiremock::MockServer::start().await;
    let (arrived_tx, arrived) = std::sync::mpsc::channel::<&'static str>();
    let arrived_tx = std::sync::Mutex::new(arrived_tx);
    let respond = move |request: &wiremock::Request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        let sse =
            |text: &str| wiremock::ResponseTemplate::new(200).set_body_raw(chat_answer(text), "text/event-stream");
        if body.to_string().contains("You are now acting as a compaction engine") {
            let _ = arrived_tx.lock().unwrap().send("summary");
            return sse("never used").set_delay(std::time::Duration::from_secs(120));
        }
        sse("ok")
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut kin, session) = after_a_long_turn(&server, respond, dir.path()).await;
    let wait = std::time::Duration::from_secs(30);
    let prompt = |text: &str| json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
    let compact = kin.request("session/prompt", prompt("/compact"));
    assert_eq!(arrived.recv_timeout(wait).unwrap(), "summary", "the summary is being written");
    kin.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}));
    let mut texts = Vec::new();
    let answer = kin.response(compact, wait, |f| {
        if let Some(text) = f["params"]["update"]["content"]["text"].as_str() {
            texts.push(text.to_string());
        }
    });
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    assert_eq!(texts.last().map(String::as_str), Some("Compaction cancelled."), "{texts:?}");
    kin.close_stdin();
    kin.child.wait().unwrap();
}

/// A `/compact` between turns whose summary call the provider fails once (a 500, retried at once
/// by its `Retry-After: 0`): the retry is logged as `llm/retry` with `turn: null`, as its
/// `compact/start` and `compact/end` say (the bracket consumes no turn number), inside them, and
/// the compaction goes on to its summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_slash_compact_summary_is_logged_between_turns_with_no_turn() {
    let server = wiremock::MockServer::start().await;
    let summaries = std::sync::atomic::AtomicUsize::new(0);
    let respond = move |request: &wiremock::Request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        let sse =
            |text: &str| wiremock::ResponseTemplate::new(200).set_body_raw(chat_answer(text), "text/event-stream");
        if body.to_string().contains("You are now acting as a compaction engine") {
            if summaries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                return wiremock::ResponseTemplate::new(500).insert_header("retry-after", "0");
            }
            return sse("Summary of the long prompt.");
        }
        sse("ok")
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut kin, session) = after_a_long_turn(&server, respond, dir.path()).await;
    let wait = std::time::Duration::from_secs(30);
    let prompt = |text: &str| json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
    let compacted = kin.call("session/prompt", prompt("/compact"), wait);
    assert_eq!(compacted["result"]["stopReason"], "end_turn", "{compacted}");
    kin.close_stdin();
    kin.child.wait().unwrap();
    let log = kin::testkit::session::SessionStore::new(dir.path().join("sessions")).inspect(&session).unwrap();
    let at = |kind: &str| log.events.iter().position(|e| e.kind == kind).unwrap_or_else(|| panic!("no {kind}"));
    let (start, retry, summary, end) = (at("compact/start"), at("llm/retry"), at("compact/summary"), at("compact/end"));
    assert_eq!(log.events[start].data["turn"], Value::Null, "a manual compaction is between turns");
    assert!(start < retry && retry < summary && summary < end, "the retry is inside the bracket, before the summary");
    let retried = &log.events[retry].data;
    assert_eq!(retried["turn"], Value::Null, "{retried}");
    assert_eq!((retried["step"].clone(), retried["attempt"].clone()), (json!(0), json!(2)), "{retried}");
    assert_eq!(log.events[end].data, json!({"turn": null}), "the compaction succeeded");
}

/// A DeepSeek answer calling `read` (a tool the test's registry does not have: its result is
/// an error, which is all the loop needs) with the call id `id`.
fn chat_call(id: &str) -> String {
    let chunk = |delta: Value, finish: Value| json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    let call = json!({"index": 0, "id": id, "type": "function", "function": {"name": "read", "arguments": "{}"}});
    let events =
        [chunk(json!({"role": "assistant", "tool_calls": [call]}), Value::Null), chunk(json!({}), json!("tool_calls"))];
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

/// Serves DeepSeek's route like a provider whose window holds one tool result: a request with
/// two is refused as too long. A summary request gets a summary (after `summary_delay`), a
/// request whose last message is the user's `first` an answer, any other a tool call: every
/// overflow is recovered by a compaction, and the model calls a tool again at once. How many
/// step requests it got.
async fn overflowing_tool_loop(
    summary_delay: std::time::Duration,
) -> (wiremock::MockServer, Arc<std::sync::Mutex<usize>>) {
    let steps: Arc<std::sync::Mutex<usize>> = Arc::default();
    let counted = steps.clone();
    let respond = move |request: &wiremock::Request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        if body.to_string().contains("You are now acting as a compaction engine") {
            return wiremock::ResponseTemplate::new(200)
                .set_delay(summary_delay)
                .set_body_raw(chat_answer("Summary so far."), "text/event-stream");
        }
        let mut steps = counted.lock().unwrap();
        *steps += 1;
        let messages = body["messages"].as_array().unwrap();
        if messages.iter().filter(|m| m["role"] == "tool").count() >= 2 {
            return wiremock::ResponseTemplate::new(400).set_body_json((DEEPSEEK.overflow)());
        }
        let last = messages.last().unwrap();
        let answer = if last["role"] == "user" && last.to_string().contains("first") {
            chat_answer("ok")
        } else {
            chat_call(&format!("c{steps}"))
        };
        wiremock::ResponseTemplate::new(200).set_body_raw(answer, "text/event-stream")
    };
    (serving(DEEPSEEK.path, respond).await, steps)
}

/// Each overflow recovery opens a retry turn whose steps count from 1 again, and the model's
/// next tool call resets the overflow count: a provider that overflows after every tool step
/// kept one prompt running forever. The prompt's `max_steps` (5) now covers its retry turns.
#[tokio::test]
async fn overflow_recoveries_do_not_let_a_prompt_outrun_its_steps() {
    let (server, steps) = overflowing_tool_loop(std::time::Duration::ZERO).await;
    let (model, route) = served(&DEEPSEEK, &server);
    let (_dir, store, ends) =
        prompt_each(model, route, Policy::default(), &[text(&format!("first {}", "x".repeat(2000))), text("loop")])
            .await;
    assert_eq!(ends[0], TurnEnd::Completed);
    let TurnEnd::Error(message) = &ends[1] else { panic!("{:?}", ends[1]) };
    assert!(message.starts_with("the conversation no longer fits the context window"), "{message}");
    assert!(message.contains("the prompt used all 5 steps (its retry turns' included)"), "{message}");
    assert_eq!(*steps.lock().unwrap(), 1 + 5, "the first prompt's step, then five for the second");
    let events = store.inspect("s").unwrap().events;
    let retries = events.iter().filter(|e| e.kind == "turn/start" && e.data["trigger"]["kind"] == "retry").count();
    assert_eq!(retries, 1, "one recovery: the second overflow came with no step left");
}

/// A cancel while an overflow recovery compacts ends the prompt cancelled, as any cancel does,
/// not with the compaction's failure.
#[tokio::test]
async fn a_cancel_during_an_overflow_recovery_cancels_the_prompt() {
    let (server, _) = overflowing_tool_loop(std::time::Duration::from_secs(30)).await;
    let (model, route) = served(&DEEPSEEK, &server);
    let dir = tempfile::tempdir().unwrap();
    let store = SessionStore::new(dir.path());
    let session = store.create(SessionHeader::new("s", 1, Some("/w".into()))).unwrap();
    let handle = spawn_agent(session, deps(model, route, Policy::default()));
    let ended = handle.followup(text("loop"), json!({"kind": "user"})).unwrap();
    let events = || store.inspect("s").map(|log| log.events).unwrap_or_default();
    common::until("the recovery's compaction to start", || events().iter().any(|e| e.kind == "compact/start")).await;
    handle.cancel();
    assert_eq!(ended.await.unwrap(), TurnEnd::Aborted);
    handle.shutdown().await;
    let end = events().into_iter().rfind(|e| e.kind == "turn/end").unwrap();
    assert_eq!(end.data["reason"]["kind"], "aborted", "{}", end.data);
}
