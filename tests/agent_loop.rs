//! The agent loop with the scripted model over a real JSONL store: turns and steps, the FIFO
//! inbox (`followup`, `inject`), cancellation, tool dispatch and tool errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kin::testkit::agent::{AgentDeps, AgentHandle, PromptRefused, TurnEnd, spawn_agent};
use kin::testkit::model::http::RetryPolicy;
use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::model::{
    ChunkStream, Model, ModelEvent, ModelRequest, ModelRoute, RetryInfo, text_response, tool_call_response,
};
use kin::testkit::session::{Event, SessionHeader, SessionStore};
use kin::testkit::tools::{Access, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[allow(dead_code)]
mod common;

/// Echoes its `text` argument after `delay_ms`, counting concurrent calls. With `"hold": true`
/// it says it started (`Gate::entered`) and waits for `Gate::release` (or its cancellation)
/// instead: a test fences "while the tool runs" on that, not on a delay.
struct Echo {
    name: &'static str,
    parallel: bool,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Tool for Echo {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> String {
        "echo".into()
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"text": {"type": "string"}}})
    }
    fn access(&self, _arguments: &Value) -> Access {
        // It touches nothing; these sessions have no permission gate anyway.
        Access::Plan
    }
    fn parallel_safe(&self) -> bool {
        self.parallel
    }
    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let (running, peak, gate) = (self.running.clone(), self.peak.clone(), self.gate.clone());
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            let delay = arguments["delay_ms"].as_u64().unwrap_or(0);
            let ran = async {
                if arguments["hold"] == true {
                    gate.entered.notify_one();
                    gate.release.notified().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
            };
            let cancelled = tokio::select! {
                () = ran => false,
                () = ctx.cancel.cancelled() => true,
            };
            running.fetch_sub(1, Ordering::SeqCst);
            if cancelled {
                return Err(ToolError::new("ABORTED", "tool call aborted"));
            }
            match arguments["text"].as_str() {
                Some("fail") => Err(ToolError::new("ECHO_FAILED", "echo was told to fail")),
                Some(text) => Ok(ToolOutput::text(text)),
                None => Err(ToolError::new("INVALID_ARGUMENTS", "text is required")),
            }
        }
        .boxed()
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: SessionStore,
    handle: AgentHandle,
    model: Arc<ScriptedModel>,
    peak: Arc<AtomicUsize>,
    gate: Arc<Gate>,
    id: String,
}

fn start(entries: Vec<ReplayEntry>, max_steps: u32) -> Fixture {
    start_with(entries, max_steps, RetryPolicy::default())
}

fn start_with(entries: Vec<ReplayEntry>, max_steps: u32, retry: RetryPolicy) -> Fixture {
    let model = Arc::new(ScriptedModel::new(entries));
    start_on(model.clone(), model, max_steps, retry)
}

/// An agent whose calls `serving` answers (`model` keeps the fixture's scripted model).
fn start_on(model: Arc<ScriptedModel>, serving: Arc<dyn Model>, max_steps: u32, retry: RetryPolicy) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = SessionStore::new(dir.path());
    let id = "bbbbbbbb-0000-4000-8000-000000000001".to_string();
    let session = store.create(SessionHeader::new(id.clone(), 1, Some("/w".into()))).unwrap();
    let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let gate = Arc::new(Gate::default());
    let mut tools = ToolRegistry::new();
    for (name, parallel) in [("echo", false), ("pecho", true)] {
        let (running, peak, gate) = (running.clone(), peak.clone(), gate.clone());
        tools.register(Arc::new(Echo { name, parallel, running, peak, gate }));
    }
    let deps = AgentDeps {
        model: serving,
        tools,
        route: ModelRoute::parse("test/model").unwrap(),
        system: "be brief".into(),
        max_steps,
        max_parallel_tools: 4,
        depth: 0,
        permissions: None,
        prompt: None,
        file_access: None,
        retry,
        compaction: Default::default(),
    };
    let handle = spawn_agent(session, deps);
    Fixture { _dir: dir, store, handle, model, peak, gate, id }
}

fn chunks(c: Vec<kin::testkit::model::StreamChunk>) -> ReplayEntry {
    ReplayEntry::Chunks(c)
}

fn text(t: &str) -> Vec<Value> {
    vec![json!({"type": "text", "text": t})]
}

fn user() -> Value {
    json!({"kind": "user"})
}

impl Fixture {
    /// Until the model was called `n` times (a hanging call is running once it was made).
    async fn called(&self, n: usize) {
        common::until(&format!("model call {n}"), || self.model.requests().len() >= n).await;
    }

    async fn events(&self) -> Vec<Event> {
        self.handle.flush().await.unwrap();
        self.store.inspect(&self.id).unwrap().events
    }
}

fn kinds(events: &[Event]) -> Vec<&str> {
    events.iter().filter(|e| e.kind != "assistant/chunk").map(|e| e.kind.as_str()).collect()
}

#[tokio::test]
async fn a_text_turn_writes_the_dsh_event_sequence() {
    let f = start(vec![chunks(text_response(&["hel", "lo"]))], 5);
    let end = f.handle.followup(text("hi"), user()).unwrap().await.unwrap();
    assert_eq!(end, TurnEnd::Completed);
    let events = f.events().await;
    assert_eq!(
        kinds(&events),
        ["turn/start", "user/message", "session/title", "step/start", "assistant/message", "step/end", "turn/end"],
        "the first prompt titles the session right after its user/message, as dsh does"
    );
    let message = events.iter().find(|e| e.kind == "assistant/message").unwrap();
    assert_eq!(message.data["message"]["content"], json!([{"type": "text", "text": "hello"}]));
    assert_eq!(message.data["message"]["source"], json!({"kind": "model", "provider": "test", "model": "model"}));
    let chunk_seqs: Vec<u64> = events.iter().filter(|e| e.kind == "assistant/chunk").map(|e| e.seq).collect();
    assert_eq!(message.source_event_seqs.as_ref().unwrap(), &chunk_seqs);
    let request = &f.model.requests()[0];
    assert_eq!(request.system, "be brief");
    assert_eq!(request.messages.len(), 1);
    assert_eq!(request.tools.len(), 2);
}

#[tokio::test]
async fn a_followup_sent_during_a_turn_becomes_its_own_later_turn() {
    let f = start(
        vec![
            ReplayEntry::Hang { chunks: text_response(&["x"])[..2].to_vec(), ready_file: None },
            chunks(text_response(&["second"])),
        ],
        5,
    );
    let first = f.handle.followup(text("one"), user()).unwrap();
    f.called(1).await;
    assert!(f.handle.is_running());
    let second = f.handle.followup(text("two"), user()).unwrap();
    f.handle.cancel();
    assert_eq!(first.await.unwrap(), TurnEnd::Aborted);
    assert_eq!(second.await.unwrap(), TurnEnd::Completed);
    let events = f.events().await;
    let starts: Vec<&Value> = events.iter().filter(|e| e.kind == "turn/start").map(|e| &e.data["turn"]).collect();
    assert_eq!(starts, [&json!(1), &json!(2)]);
    let ends: Vec<&Value> = events.iter().filter(|e| e.kind == "turn/end").map(|e| &e.data["reason"]["kind"]).collect();
    assert_eq!(ends, [&json!("aborted"), &json!("completed")]);
    // The second turn's only ordinary message is "two"; the model saw both prompts.
    let last = f.model.requests().pop().unwrap();
    let texts: Vec<&str> =
        last.messages.iter().filter(|m| m["role"] == "user").filter_map(|m| m["content"][0]["text"].as_str()).collect();
    assert_eq!(texts, ["one", "two"]);
}

#[tokio::test]
async fn inject_between_turns_appends_without_running_the_model() {
    let f = start(vec![chunks(text_response(&["ok"]))], 5);
    f.handle.inject(text("note"), json!({"kind": "plugin", "plugin": "test"})).await.unwrap();
    let events = f.events().await;
    assert_eq!(kinds(&events), ["user/message"]);
    assert!(f.model.requests().is_empty());
    f.handle.followup(text("go"), user()).unwrap().await.unwrap();
    let request = &f.model.requests()[0];
    assert_eq!(request.messages.len(), 2, "the injected note is model-visible");
}

#[tokio::test]
async fn inject_during_a_turn_lands_before_the_next_step() {
    let f = start(
        vec![chunks(tool_call_response("c1", "echo", r#"{"text":"a","hold":true}"#)), chunks(text_response(&["done"]))],
        5,
    );
    let turn = f.handle.followup(text("go"), user()).unwrap();
    f.gate.entered.notified().await;
    f.handle.inject(text("steer"), json!({"kind": "plugin", "plugin": "test"})).await.unwrap();
    f.gate.release.notify_one();
    assert_eq!(turn.await.unwrap(), TurnEnd::Completed);
    let events = f.events().await;
    let k = kinds(&events);
    let second_step = k.iter().rposition(|k| *k == "step/start").unwrap();
    assert_eq!(k[second_step - 1], "user/message", "{k:?}");
    assert_eq!(f.model.requests().len(), 2);
}

fn notice() -> Value {
    json!({"kind": "subagent-settled", "form": "notice", "summary": "done", "senderSessionId": "c"})
}

/// The turns' triggers in the log: the text of each turn's first user message.
fn turn_texts(events: &[Event]) -> Vec<String> {
    let mut texts = Vec::new();
    let mut open = false;
    for e in events {
        match e.kind.as_str() {
            "turn/start" => open = true,
            "user/message" if open => {
                texts.push(e.data["content"][0]["text"].as_str().unwrap_or_default().to_string());
                open = false;
            }
            _ => {}
        }
    }
    texts
}

#[tokio::test]
async fn steer_between_turns_starts_a_turn() {
    let f = start(vec![chunks(text_response(&["seen"])), chunks(text_response(&["after"]))], 5);
    f.handle.steer(text("child done"), notice()).await.unwrap();
    // FIFO: a follow-up sent now runs after the steered turn.
    assert_eq!(f.handle.followup(text("next"), user()).unwrap().await.unwrap(), TurnEnd::Completed);
    assert_eq!(turn_texts(&f.events().await), ["child done", "next"]);
    assert_eq!(f.model.requests().len(), 2);
}

#[tokio::test]
async fn steer_during_a_turn_lands_before_its_next_step_without_a_turn_of_its_own() {
    let f = start(
        vec![
            chunks(tool_call_response("c1", "echo", r#"{"text":"a","hold":true}"#)),
            chunks(text_response(&["done"])),
            chunks(text_response(&["after"])),
        ],
        5,
    );
    let turn = f.handle.followup(text("go"), user()).unwrap();
    f.gate.entered.notified().await;
    f.handle.steer(text("child done"), notice()).await.unwrap();
    f.gate.release.notify_one();
    assert_eq!(turn.await.unwrap(), TurnEnd::Completed);
    assert_eq!(f.handle.followup(text("next"), user()).unwrap().await.unwrap(), TurnEnd::Completed);
    let events = f.events().await;
    assert_eq!(turn_texts(&events), ["go", "next"], "no turn of its own");
    let k = kinds(&events);
    let second_step = k
        .iter()
        .position(|k| *k == "step/start")
        .map(|first| first + 1 + k[first + 1..].iter().position(|k| *k == "step/start").unwrap());
    assert_eq!(k[second_step.unwrap() - 1], "user/message", "{k:?}");
    assert_eq!(f.model.requests().len(), 3);
}

#[tokio::test]
async fn steer_that_no_step_took_before_the_turn_ended_gets_a_turn_of_its_own() {
    // One step: the tool call's turn ends at the step limit, with the message still staged.
    let f = start(
        vec![
            chunks(tool_call_response("c1", "echo", r#"{"text":"a","hold":true}"#)),
            chunks(text_response(&["seen"])),
            chunks(text_response(&["after"])),
        ],
        1,
    );
    let turn = f.handle.followup(text("go"), user()).unwrap();
    f.gate.entered.notified().await;
    f.handle.steer(text("child done"), notice()).await.unwrap();
    f.gate.release.notify_one();
    assert_ne!(turn.await.unwrap(), TurnEnd::Aborted);
    assert_eq!(f.handle.followup(text("next"), user()).unwrap().await.unwrap(), TurnEnd::Completed);
    let events = f.events().await;
    assert_eq!(turn_texts(&events), ["go", "child done", "next"]);
    assert_eq!(f.model.requests().len(), 3, "the notice's turn called the model");
    // The log says where it went: claimed from the step list, inserted in the turn queue.
    let targets: Vec<&Value> =
        events.iter().filter(|e| e.kind == "agent/inbox/spliced").map(|e| &e.data["target"]).collect();
    assert_eq!(targets[..2], [&json!("next-step"), &json!("next-step")], "staged, then claimed: {targets:?}");
    assert_eq!(targets[2], &json!("next-turn"), "then queued for a turn: {targets:?}");
    // And the log folds to an idle inbox: a reload does not run it again.
    let inbox = kin::testkit::session::inbox::fold(&events, 0).unwrap();
    assert!(inbox.is_idle(), "nothing pending after its turn");
}

#[tokio::test]
async fn tool_calls_run_and_their_results_feed_the_next_step() {
    let f = start(
        vec![
            chunks(tool_call_response("c1", "echo", r#"{"text":"pong"}"#)),
            chunks(tool_call_response("c2", "nosuch", "{}")),
            chunks(tool_call_response("c3", "echo", r#"{"text":"fail"}"#)),
            chunks(tool_call_response("c4", "echo", "{not json")),
            chunks(text_response(&["done"])),
        ],
        10,
    );
    assert_eq!(f.handle.followup(text("go"), user()).unwrap().await.unwrap(), TurnEnd::Completed);
    let events = f.events().await;
    let results: Vec<&Event> = events.iter().filter(|e| e.kind == "tool/result").collect();
    let block = |i: usize| &results[i].data["message"]["content"][0];
    assert_eq!(block(0)["content"][0]["text"], "pong");
    assert_eq!(block(0)["isError"], false);
    assert_eq!(block(1)["content"][0]["text"], "Error: unknown tool \"nosuch\"");
    assert_eq!(block(1)["isError"], true);
    assert_eq!(results[1].data["error"]["code"], "UNKNOWN_TOOL");
    assert_eq!(block(2)["content"][0]["text"], "Error: echo was told to fail");
    assert_eq!(results[2].data["error"]["code"], "ECHO_FAILED");
    assert_eq!(results[3].data["error"]["code"], "INVALID_ARGUMENTS");
    let calls: Vec<u64> = events.iter().filter(|e| e.kind == "tool/call").map(|e| e.seq).collect();
    for (result, call) in results.iter().zip(&calls) {
        assert_eq!(result.source_event_seqs, Some(vec![*call]));
    }
    assert_eq!(f.model.requests()[1].messages.last().unwrap()["content"][0]["toolCallId"], "c1");
}

/// One response calling `name` once per arguments text in `args` (ids `c0`, `c1`, …).
fn calls(name: &str, args: &[String]) -> ReplayEntry {
    use kin::testkit::model::StreamChunk;
    let mut all = Vec::new();
    let mut end = Vec::new();
    for (i, arguments) in args.iter().enumerate() {
        let one = tool_call_response(&format!("c{i}"), name, arguments);
        let index = i as u64;
        all.extend(one[..3].iter().cloned().map(|chunk| match chunk {
            StreamChunk::BlockStart { block_type, .. } => StreamChunk::BlockStart { index, block_type },
            StreamChunk::ToolCallDelta { id, name, arguments_delta, .. } => {
                StreamChunk::ToolCallDelta { index, id, name, arguments_delta }
            }
            StreamChunk::BlockEnd { block, .. } => StreamChunk::BlockEnd { index, block },
            other => other,
        }));
        end = one[3..].to_vec();
    }
    all.extend(end);
    ReplayEntry::Chunks(all)
}

fn two_calls(name: &str) -> ReplayEntry {
    calls(name, &[r#"{"text":"1","delay_ms":80}"#.into(), r#"{"text":"2","delay_ms":80}"#.into()])
}

#[tokio::test]
async fn parallel_safe_calls_overlap_and_exclusive_calls_do_not() {
    let f = start(vec![two_calls("pecho"), chunks(text_response(&["ok"]))], 5);
    f.handle.followup(text("go"), user()).unwrap().await.unwrap();
    assert_eq!(f.peak.load(Ordering::SeqCst), 2, "parallel-safe calls ran together");
    let events = f.events().await;
    let order: Vec<&str> = events
        .iter()
        .filter(|e| e.kind.as_str().starts_with("tool/"))
        .map(|e| e.data["callId"].as_str().or(e.data["message"]["source"]["callId"].as_str()).unwrap())
        .collect();
    assert_eq!(order, ["c0", "c1", "c0", "c1"], "results come back in call order");

    let g = start(vec![two_calls("echo"), chunks(text_response(&["ok"]))], 5);
    g.handle.followup(text("go"), user()).unwrap().await.unwrap();
    assert_eq!(g.peak.load(Ordering::SeqCst), 1, "exclusive calls are barriers");
}

#[tokio::test]
async fn cancelling_during_a_tool_call_aborts_it_and_the_turn() {
    let f = start(vec![chunks(tool_call_response("c1", "echo", r#"{"text":"slow","hold":true}"#))], 5);
    let turn = f.handle.followup(text("go"), user()).unwrap();
    f.gate.entered.notified().await;
    f.handle.cancel();
    let end = tokio::time::timeout(Duration::from_secs(2), turn).await.expect("cancel is prompt").unwrap();
    assert_eq!(end, TurnEnd::Aborted);
    let events = f.events().await;
    let result = events.iter().find(|e| e.kind == "tool/result").unwrap();
    assert_eq!(result.data["message"]["content"][0]["content"][0]["text"], "Error: tool call aborted");
    assert_eq!(events.last().unwrap().data["reason"]["kind"], "aborted");
}

#[tokio::test]
async fn the_step_limit_ends_the_turn_with_a_clear_error() {
    let entries = (0..3).map(|i| chunks(tool_call_response(&format!("c{i}"), "echo", r#"{"text":"x"}"#))).collect();
    let f = start(entries, 3);
    let end = f.handle.followup(text("loop"), user()).unwrap().await.unwrap();
    let TurnEnd::StepLimit(message) = end else { panic!("expected the step limit, got {end:?}") };
    assert!(message.contains("all 3 steps") && message.contains("agent.max_steps"), "{message}");
    let events = f.events().await;
    assert_eq!(events.last().unwrap().data["reason"]["failure"]["code"], "STEP_LIMIT");
}

#[tokio::test]
async fn model_failures_end_the_turn_with_their_message() {
    let f = start(
        vec![
            ReplayEntry::Throw { chunks: vec![], message: "rate limited".into(), code: "RATE_LIMIT".into() },
            chunks(text_response(&["x"])[..2].to_vec()),
        ],
        5,
    );
    assert_eq!(f.handle.followup(text("a"), user()).unwrap().await.unwrap(), TurnEnd::Error("rate limited".into()));
    let end = f.handle.followup(text("b"), user()).unwrap().await.unwrap();
    assert_eq!(end, TurnEnd::Error("the model stream ended without a finish".into()));
    let events = f.events().await;
    let reasons: Vec<&Value> = events.iter().filter(|e| e.kind == "turn/end").map(|e| &e.data["reason"]).collect();
    assert_eq!(reasons[0]["failure"]["code"], "RATE_LIMIT");
    assert_eq!(reasons[0]["step"], 1);
    assert_eq!(reasons[1]["failure"]["code"], "STREAM_INCOMPLETE");
}

/// A call that fails after streaming text keeps that text, as a cancelled one does: the editor
/// showed it, so the log (a replay of the session) and the next turn's model have it too.
#[tokio::test]
async fn a_failed_calls_streamed_text_is_kept() {
    let streamed = text_response(&["partial ", "answer"]);
    let f = start(
        vec![
            ReplayEntry::Throw {
                chunks: streamed[..3].to_vec(),
                message: "overloaded".into(),
                code: "SERVER_ERROR".into(),
            },
            chunks(text_response(&["again"])),
        ],
        5,
    );
    assert_eq!(f.handle.followup(text("a"), user()).unwrap().await.unwrap(), TurnEnd::Error("overloaded".into()));
    let events = f.events().await;
    let k = kinds(&events);
    let message = events.iter().find(|e| e.kind == "assistant/message").expect("the partial text is kept");
    assert_eq!(message.data["message"]["content"][0]["text"], "partial answer");
    let at = k.iter().position(|k| *k == "assistant/message").unwrap();
    assert_eq!(k[at + 1..at + 3], ["step/end", "turn/end"], "{k:?}");
    f.handle.followup(text("b"), user()).unwrap().await.unwrap();
    let next = f.model.requests().pop().unwrap();
    assert!(next.messages.iter().any(|m| m["role"] == "assistant"), "the next turn's model sees it");
}

/// A failed call's kept text is bounded: a model that streamed 3 MB before the call failed (a
/// looping server stopped at the response limit streams up to 64 MiB) leaves its first and last
/// 50 000 bytes in the history, the cut noted, not every byte for every later request.
#[tokio::test]
async fn a_failed_calls_kept_text_is_bounded() {
    let (head, tail) = ("h".repeat(1_500_000), "t".repeat(1_500_000));
    let streamed = text_response(&[head.as_str(), tail.as_str()]);
    let f = start(
        vec![ReplayEntry::Throw {
            chunks: streamed[..3].to_vec(),
            message: "too large".into(),
            code: "PROVIDER_ERROR".into(),
        }],
        5,
    );
    assert_eq!(f.handle.followup(text("a"), user()).unwrap().await.unwrap(), TurnEnd::Error("too large".into()));
    let events = f.events().await;
    let message = events.iter().find(|e| e.kind == "assistant/message").expect("the partial text is kept");
    let kept = message.data["message"]["content"][0]["text"].as_str().unwrap();
    assert!(kept.len() < 100_100, "{} bytes kept", kept.len());
    assert!(kept.starts_with(&"h".repeat(50_000)) && kept.ends_with(&"t".repeat(50_000)));
    assert!(kept.contains("[... 2900000 bytes omitted ...]"), "the cut says so");
}

#[tokio::test]
async fn shutdown_disposes_queued_turns_and_flushes() {
    let f = start(vec![ReplayEntry::Hang { chunks: vec![], ready_file: None }], 5);
    let first = f.handle.followup(text("one"), user()).unwrap();
    let queued = f.handle.followup(text("two"), user()).unwrap();
    f.called(1).await;
    f.handle.shutdown().await;
    assert_eq!(first.await.unwrap(), TurnEnd::Disposed);
    assert_eq!(queued.await.unwrap(), TurnEnd::Disposed);
    let events = f.store.inspect(&f.id).unwrap().events;
    assert_eq!(events.last().unwrap().kind, "turn/end", "the log was flushed at shutdown");
    assert!(f.handle.followup(text("three"), user()).is_err());
}

/// A response that completes with no content: no block, only the finish.
fn empty_response() -> ReplayEntry {
    chunks(vec![kin::testkit::model::StreamChunk::Finish {
        reason: kin::testkit::model::FinishReason::Stop,
        replay_state: None,
    }])
}

#[tokio::test(start_paused = true)]
async fn an_empty_completion_is_retried_at_the_step_as_a_call_of_its_own() {
    let f = start(vec![empty_response(), chunks(text_response(&["second try"]))], 5);
    let end = f.handle.followup(text("hi"), user()).unwrap().await.unwrap();
    assert_eq!(end, TurnEnd::Completed);
    let events = f.events().await;
    let retry = events.iter().find(|e| e.kind == "llm/retry").expect("the retry is in the log");
    assert_eq!(
        (&retry.data["turn"], &retry.data["step"], &retry.data["attempt"], &retry.data["code"]),
        (&json!(1), &json!(1), &json!(2), &json!("EMPTY_RESPONSE"))
    );
    assert_eq!(retry.data["maxAttempts"], 4);
    // Both attempts are recorded calls of the same step, the retry between them; only the
    // second one wrote an answer.
    let at = |kind: &str| events.iter().position(|e| e.kind == kind).unwrap();
    let finishes: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == "assistant/chunk" && e.data["chunk"]["type"] == "finish")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(finishes.len(), 2, "{events:#?}");
    assert!(finishes[0] < at("llm/retry") && at("llm/retry") < finishes[1]);
    let messages: Vec<&Event> = events.iter().filter(|e| e.kind == "assistant/message").collect();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].data["message"]["content"], json!([{"type": "text", "text": "second try"}]));
    assert_eq!(f.model.requests().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn empty_completions_fail_the_turn_once_the_attempts_are_used_up() {
    let retry = RetryPolicy { max_attempts: 2, ..RetryPolicy::default() };
    let f = start_with(vec![empty_response(), empty_response()], 5, retry);
    let end = f.handle.followup(text("hi"), user()).unwrap().await.unwrap();
    let message =
        "the model returned an empty completion (no text, reasoning or tool calls) (gave up after 2 attempts)";
    assert_eq!(end, TurnEnd::Error(message.into()));
    let events = f.events().await;
    assert_eq!(events.iter().filter(|e| e.kind == "llm/retry").count(), 1);
    assert!(events.iter().all(|e| e.kind != "assistant/message"));
    let last = events.last().unwrap();
    assert_eq!(last.data["reason"]["failure"]["code"], "EMPTY_RESPONSE");
    assert_eq!(last.data["reason"]["failure"]["message"], message);
    assert_eq!(f.model.requests().len(), 2);
}

/// `cancel_and_discard` while a turn runs with a message queued behind it: the turn ends
/// aborted and the queued message never starts, however the actor's select picks between the
/// turn's end and the discard (repeated, so a pick that lets the next turn in would show).
#[tokio::test]
async fn a_discard_with_the_cancel_never_lets_the_queued_message_start() {
    for round in 0..40 {
        let f = start(vec![ReplayEntry::Hang { chunks: vec![], ready_file: None }, chunks(text_response(&["no"]))], 5);
        let first = f.handle.followup(text("one"), user()).unwrap();
        let (_, queued) = f.handle.enqueue(text("two"), user()).await.unwrap();
        while !f.handle.is_running() {
            tokio::task::yield_now().await;
        }
        assert_eq!(f.handle.cancel_and_discard().await, Ok(1), "round {round}");
        assert_eq!(first.await.unwrap(), TurnEnd::Aborted);
        assert_eq!(queued.await.unwrap(), TurnEnd::Aborted);
        let events = f.events().await;
        assert_eq!(events.iter().filter(|e| e.kind == "turn/start").count(), 1, "round {round}: {:?}", kinds(&events));
        assert_eq!(f.model.requests().len(), 1, "round {round}: the discarded message reached the model");
    }
}

/// The agent owns the prompt slot: a second prompt is refused while the first is in flight,
/// also while it only waits behind another turn (when no turn of its own runs yet), and
/// accepted once the first one's turn has ended.
#[tokio::test]
async fn a_prompt_is_refused_while_another_is_in_flight_and_accepted_after_it() {
    let hang = ReplayEntry::Hang { chunks: vec![], ready_file: None };
    let f = start(vec![hang, chunks(text_response(&["one"])), chunks(text_response(&["two"]))], 5);
    let ahead = f.handle.followup(text("ahead"), user()).unwrap();
    while !f.handle.is_running() {
        tokio::task::yield_now().await;
    }
    let first = f.handle.prompt(text("one"), user()).unwrap();
    assert!(matches!(f.handle.prompt(text("again"), user()), Err(PromptRefused::Busy)));
    // The cancel reaches the prompt in flight too, though it still waits (see
    // `a_cancel_reaches_a_prompt_still_waiting_for_its_turn`).
    f.handle.cancel();
    assert_eq!(ahead.await.unwrap(), TurnEnd::Aborted);
    assert_eq!(first.await.unwrap(), TurnEnd::Aborted);
    let second = f.handle.prompt(text("two"), user()).unwrap();
    assert_eq!(second.await.unwrap(), TurnEnd::Completed);
    assert_eq!(f.model.requests().len(), 2, "the refused and the cancelled prompts never reached the model");
}

/// The agent owns its route: a route chosen while a turn runs is reported at once, the running
/// turn keeps the one it started with, and the next turn uses the new one.
#[tokio::test]
async fn a_route_chosen_during_a_turn_is_reported_at_once_and_used_from_the_next_turn() {
    let hang = ReplayEntry::Hang { chunks: vec![], ready_file: None };
    let f = start(vec![hang, chunks(text_response(&["next"]))], 5);
    let first = f.handle.followup(text("one"), user()).unwrap();
    while !f.handle.is_running() {
        tokio::task::yield_now().await;
    }
    let other = ModelRoute::parse("other/model").unwrap();
    f.handle.set_route(other.clone()).unwrap();
    assert_eq!(f.handle.route(), other);
    f.handle.cancel();
    assert_eq!(first.await.unwrap(), TurnEnd::Aborted);
    assert_eq!(f.handle.followup(text("two"), user()).unwrap().await.unwrap(), TurnEnd::Completed);
    let routes: Vec<String> = f.model.requests().iter().map(|r| r.route.to_string()).collect();
    assert_eq!(routes, ["test/model", "other/model"]);
}

/// A model whose call reports a retry in band, waits the hour the retry said, then answers.
struct RetriedAfterAnHour;

impl Model for RetriedAfterAnHour {
    fn stream(&self, _request: ModelRequest, _cancel: CancellationToken) -> ChunkStream {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            let retry = RetryInfo {
                attempt: 2,
                max_attempts: 3,
                delay_ms: 3_600_000,
                code: "RATE_LIMITED".into(),
                reason: "HTTP 429: slow down".into(),
                requested_delay_ms: Some(7_200_000),
            };
            let _ = tx.send(Ok(ModelEvent::Retry(retry))).await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            for chunk in text_response(&["after the wait"]) {
                let _ = tx.send(Ok(ModelEvent::Chunk(chunk))).await;
            }
        });
        rx
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_reported_in_band_is_written_when_it_happens_in_order_with_the_chunks() {
    let f = start_on(Arc::new(ScriptedModel::new([])), Arc::new(RetriedAfterAnHour), 5, RetryPolicy::default());
    let turn = f.handle.followup(text("hi"), user()).unwrap();
    // Half the wait: the paused clock moves only once every task is idle, so the agent has heard
    // all the model said so far; the retry is in the log (and before the editor) already.
    tokio::time::sleep(Duration::from_secs(1800)).await;
    let written = f.store.inspect(&f.id).unwrap().events;
    // The log line is the one the client's retry notice wrote before it came in band.
    let expected = concat!(
        r#"{"turn":1,"step":1,"attempt":2,"maxAttempts":3,"delayMs":3600000,"code":"RATE_LIMITED","#,
        r#""reason":"HTTP 429: slow down","requestedDelayMs":7200000}"#
    );
    let retries: Vec<&str> = written.iter().filter(|e| e.kind == "llm/retry").map(|e| e.data.text()).collect();
    assert_eq!(retries, [expected], "{written:#?}");
    assert!(written.iter().all(|e| e.kind != "assistant/chunk"), "{written:#?}");
    assert_eq!(turn.await.unwrap(), TurnEnd::Completed);
    let events = f.events().await;
    let order: Vec<&str> = events
        .iter()
        .map(|e| e.kind.as_str())
        .filter(|k| ["step/start", "llm/retry", "assistant/chunk", "assistant/message"].contains(k))
        .collect();
    let chunks = text_response(&["after the wait"]).len();
    let expected_order: Vec<&str> = ["step/start", "llm/retry"]
        .into_iter()
        .chain(std::iter::repeat_n("assistant/chunk", chunks))
        .chain(["assistant/message"])
        .collect();
    assert_eq!(order, expected_order);
    assert_eq!(events.iter().filter(|e| e.kind == "llm/retry").count(), 1);
}

/// A response may carry any number of calls: a step runs the first 64 and answers the rest with
/// an error saying so, each in call order, and the turn goes on.
#[tokio::test]
async fn a_step_runs_at_most_64_calls_and_says_so_to_the_rest() {
    let args: Vec<String> = (0..70).map(|i| format!(r#"{{"text":"{i}"}}"#)).collect();
    let f = start(vec![calls("pecho", &args), chunks(text_response(&["ok"]))], 5);
    assert_eq!(f.handle.followup(text("go"), user()).unwrap().await.unwrap(), TurnEnd::Completed);
    let events = f.events().await;
    assert_eq!(events.iter().filter(|e| e.kind == "tool/call").count(), 70, "every call is recorded");
    let results: Vec<&Event> = events.iter().filter(|e| e.kind == "tool/result").collect();
    assert_eq!(results.len(), 70);
    for (i, result) in results.iter().enumerate() {
        let block = &result.data["message"]["content"][0];
        assert_eq!(block["toolCallId"], format!("c{i}"), "call order");
        if i < 64 {
            assert_eq!(block["content"][0]["text"], i.to_string(), "call {i} ran");
        } else {
            assert_eq!(result.data["error"]["code"], "TOO_MANY_TOOL_CALLS", "call {i}");
            let text = block["content"][0]["text"].as_str().unwrap();
            assert!(text.starts_with("Error: not run: a step runs at most 64 tool calls"), "{text}");
        }
    }
    assert!(f.peak.load(Ordering::SeqCst) <= 4, "within the pool");
}

/// Calls the model gave one id get ids of their own: the results, the editor's calls and the
/// next request carry distinct ids (two results of one id are refused by model APIs).
#[tokio::test]
async fn tool_calls_sharing_an_id_are_given_ids_of_their_own() {
    use kin::testkit::model::StreamChunk;
    let args: Vec<String> = (0..3).map(|i| format!(r#"{{"text":"{i}"}}"#)).collect();
    let ReplayEntry::Chunks(chunks_of) = calls("echo", &args) else { unreachable!() };
    let renamed = |id: &str| match id {
        "c0" | "c1" => "same".to_string(),
        _ => "same-2".to_string(),
    };
    let chunks_of = chunks_of
        .into_iter()
        .map(|chunk| match chunk {
            StreamChunk::ToolCallDelta { index, id, name, arguments_delta } => {
                StreamChunk::ToolCallDelta { index, id: renamed(&id), name, arguments_delta }
            }
            StreamChunk::BlockEnd { index, mut block } => {
                let id = renamed(block["id"].as_str().unwrap());
                block["id"] = json!(id);
                StreamChunk::BlockEnd { index, block }
            }
            other => other,
        })
        .collect();
    let f = start(vec![ReplayEntry::Chunks(chunks_of), chunks(text_response(&["ok"]))], 5);
    assert_eq!(f.handle.followup(text("go"), user()).unwrap().await.unwrap(), TurnEnd::Completed);
    let events = f.events().await;
    let ids = |kind: &str, at: &dyn Fn(&Event) -> Value| -> Vec<Value> {
        events.iter().filter(|e| e.kind == kind).map(at).collect()
    };
    let expected = [json!("same"), json!("same-3"), json!("same-2")];
    assert_eq!(ids("tool/call", &|e| e.data["callId"].clone()), expected);
    assert_eq!(ids("tool/result", &|e| e.data["message"]["content"][0]["toolCallId"].clone()), expected);
    let texts = ids("tool/result", &|e| e.data["message"]["content"][0]["content"][0]["text"].clone());
    assert_eq!(texts, [json!("0"), json!("1"), json!("2")], "each call ran once, with its own arguments");
    let sent = &f.model.requests()[1].messages;
    let assistant = sent.iter().rev().find(|m| m["role"] == "assistant").unwrap();
    let called: Vec<Value> = assistant["content"].as_array().unwrap().iter().map(|b| b["id"].clone()).collect();
    assert_eq!(called, expected, "the next request's assistant message matches its results");
}

/// A response cut off at the output limit in the middle of a tool call ends the turn
/// `max-tokens`, and its calls are not run but answered: the next turn's request carries a result
/// for each (a call without one makes every later request one the model's API refuses).
#[tokio::test]
async fn the_calls_of_a_response_cut_off_at_the_output_limit_are_answered_not_run() {
    use kin::testkit::model::{FinishReason, StreamChunk};
    let mut cut = tool_call_response("c1", "echo", r#"{"text":"half"#);
    let last = cut.len() - 1;
    cut[last] = StreamChunk::Finish { reason: FinishReason::MaxTokens, replay_state: None };
    let f = start(vec![chunks(cut), chunks(text_response(&["ok"]))], 5);
    assert_eq!(f.handle.followup(text("go"), user()).unwrap().await.unwrap(), TurnEnd::MaxTokens);
    assert_eq!(f.peak.load(Ordering::SeqCst), 0, "the cut-off call did not run");
    assert_eq!(f.handle.followup(text("again"), user()).unwrap().await.unwrap(), TurnEnd::Completed);
    let events = f.events().await;
    let result = events.iter().find(|e| e.kind == "tool/result").expect("the cut-off call has a result");
    assert_eq!(result.data["error"]["code"], "TOOL_NOT_STARTED");
    let text = result.data["message"]["content"][0]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("cut off at the model's output limit"), "{text}");
    let kinds: Vec<&str> = kinds(&events).into_iter().skip_while(|k| *k != "assistant/message").take(4).collect();
    assert_eq!(kinds, ["assistant/message", "tool/result", "step/end", "turn/end"]);
    let second = &f.model.requests()[1].messages;
    let answered =
        second.iter().any(|m| m["content"][0]["type"] == "tool-result" && m["content"][0]["toolCallId"] == "c1");
    assert!(answered, "the next request answers the call: {second:#?}");
}

/// A `session/cancel` reaches a user prompt still waiting for its turn (behind a turn a message
/// started, or not yet taken up by the agent): that turn ends `aborted` without a model call,
/// instead of running to its end after the cancel.
#[tokio::test]
async fn a_cancel_reaches_a_prompt_still_waiting_for_its_turn() {
    let f = start(
        vec![
            chunks(tool_call_response("c1", "echo", r#"{"text":"a","hold":true}"#)),
            chunks(text_response(&["never"])),
        ],
        5,
    );
    let running = f.handle.followup(text("a message's turn"), user()).unwrap();
    f.gate.entered.notified().await;
    let waiting = f.handle.prompt(text("the user's prompt"), user()).unwrap();
    f.handle.cancel();
    assert_eq!(running.await.unwrap(), TurnEnd::Aborted);
    assert_eq!(waiting.await.unwrap(), TurnEnd::Aborted, "the waiting prompt was cancelled too");
    assert_eq!(f.model.requests().len(), 1, "no model call for the cancelled prompt");
    let ends: Vec<String> = f
        .events()
        .await
        .iter()
        .filter(|e| e.kind == "turn/end")
        .map(|e| e.data["reason"]["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ends, ["aborted", "aborted"]);

    // Cancelled as soon as it was sent: the same, whether or not its turn had begun.
    let g = start(vec![chunks(text_response(&["never"]))], 5);
    let sent = g.handle.prompt(text("go"), user()).unwrap();
    g.handle.cancel();
    assert_eq!(sent.await.unwrap(), TurnEnd::Aborted);
    // And the slot's token is the prompt's own: the next prompt runs.
    let next = g.handle.prompt(text("again"), user()).unwrap();
    assert_eq!(next.await.unwrap(), TurnEnd::Completed);
}
