//! Compaction through the agent loop, with the scripted model over a real JSONL store: the
//! pressure check at the start of a step compacts when the reported usage of the last call
//! reaches the threshold of the route's window, and the step's request carries the checkpoint
//! and the kept tail.

use std::sync::Arc;

use kin::agent::compact::Policy;
use kin::agent::{AgentDeps, TurnEnd, spawn_agent};
use kin::model::capacity::{ModelEntry, ModelTable};
use kin::model::script::{ReplayEntry, ScriptedModel};
use kin::model::{Model, ModelRoute, Purpose, StreamChunk, text_response};
use kin::session::{SessionHeader, SessionStore};
use kin::tools::ToolRegistry;
use serde_json::{Value, json};

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

fn policy(window: u64, retain_ratio: f64) -> Policy {
    let entry = ModelEntry { context_window: Some(window), price: None };
    let models = ModelTable { routes: vec![("test/model".into(), entry)], ..Default::default() };
    Policy { retain_ratio, models: Arc::new(models), ..Policy::default() }
}

struct Run {
    _dir: tempfile::TempDir,
    store: SessionStore,
    model: Arc<ScriptedModel>,
}

/// Two prompts (a long first one) against a 2000-token window.
async fn two_turns(first_usage: u64, compaction: Policy, entries: Vec<ReplayEntry>) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let store = SessionStore::new(dir.path());
    let session = store.create(SessionHeader::new("s", 1, Some("/w".into()))).unwrap();
    let mut all = vec![answer("ok", first_usage)];
    all.extend(entries);
    let model = Arc::new(ScriptedModel::new(all));
    let deps = AgentDeps {
        model: model.clone() as Arc<dyn Model>,
        tools: ToolRegistry::new(),
        route: ModelRoute::parse("test/model").unwrap(),
        system: "be brief".into(),
        max_steps: 5,
        max_parallel_tools: 1,
        depth: 0,
        permissions: None,
        prompt: None,
        file_access: None,
        retry: Default::default(),
        compaction,
    };
    let handle = spawn_agent(session, deps);
    let user = json!({"kind": "user"});
    let end = handle.followup(text(&"x".repeat(2000)), user.clone()).unwrap().await.unwrap();
    assert_eq!(end, TurnEnd::Completed);
    let end = handle.followup(text("second"), user).unwrap().await.unwrap();
    assert_eq!(end, TurnEnd::Completed);
    handle.shutdown().await;
    Run { _dir: dir, store, model }
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
