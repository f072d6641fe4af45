//! Seed 003 contracts that held only by reading the code (issue 17): continuable starts on a
//! provider without continuable support, reports to a parent that is not live, lifecycle
//! listeners that fail, one start/end pair per continuable epoch, depth kept across a cold
//! resume, a live child outside its Activation, the continuable fork path (descriptor right after
//! the seed), and a continuable child's persona and tool filter at start and on cold resume. Over
//! the real runtime, JSONL store and agent loop with the scripted model.

use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::BoxFuture;
use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::model::{text_response, tool_call_response};
use kin::testkit::session::SessionHeader;
use kin::testkit::subagent::catalog::{ListEntry, Mode};
use kin::testkit::subagent::{
    Capabilities, ErrorCode, Lifecycle, ResolvedStart, StopReason, SubagentError, SubagentProvider, SubagentRun,
};
use kin::testkit::tools::Caller;
use serde_json::json;

#[allow(dead_code)]
mod common;
use common::{parent, runtime, runtime_with, start_request, until};

/// A one-shot-only provider: no `prepare_continuable`.
struct OneShotOnly;

impl SubagentProvider for OneShotOnly {
    fn name(&self) -> &str {
        "one-shot-only"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    fn start(&self, _: ResolvedStart) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        async { Err(SubagentError::new(ErrorCode::Infrastructure, "not used")) }.boxed()
    }
}

#[tokio::test]
async fn a_continuable_start_on_a_provider_without_continuable_support_is_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![], "");
    rt.subagents().register_provider(Arc::new(OneShotOnly)).unwrap();
    let (_, caller) = parent(&rt, dir.path());
    let err = rt.continuation().start("one-shot-only", "bg".into(), start_request(&caller, "go")).await.unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        (
            ErrorCode::UnsupportedCapability,
            "subagent provider \"one-shot-only\" does not support continuable children (no prepareContinuable capability)"
        )
    );
    assert_eq!(rt.store().list().len(), 1, "no child exists, only the parent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_to_a_parent_that_is_not_live_is_parent_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![ReplayEntry::Hang { chunks: vec![], ready_file: None }], "");
    // The parent is a session no agent holds in this process.
    let header = SessionHeader::new("00000000-0000-4000-8000-0000000000aa", 1, Some(dir.path().display().to_string()));
    let ghost = Arc::new(Caller {
        header,
        depth: 0,
        route: kin::testkit::model::ModelRoute::parse("p/m").unwrap(),
        history: None,
    });
    let manager = rt.continuation().clone();
    let (child, _) = manager.start("spawn", "orphan".into(), start_request(&ghost, "work")).await.unwrap();
    let err = manager.report(&child, "progress").await.unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        (ErrorCode::ParentUnavailable, "direct parent is not live; report was not delivered")
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_failing_lifecycle_listener_is_contained() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![ReplayEntry::Chunks(text_response(&["child says hi"]))], "");
    let (_, caller) = parent(&rt, dir.path());
    rt.subagents().observe(|_| panic!("a listener that fails"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    rt.subagents().observe(move |e| sink.lock().unwrap().push(e.clone()));
    let run = rt.subagents().start("spawn", start_request(&caller, "hi")).await.unwrap();
    let result = run.result.await.unwrap().unwrap();
    (run.dispose)().await.unwrap();
    assert_eq!((result.output.as_str(), result.stop_reason), ("child says hi", StopReason::Completed));
    let seen = seen.lock().unwrap().clone();
    assert!(matches!(&seen[..], [Lifecycle::Start { .. }, Lifecycle::End { .. }]), "{seen:?}");
}

/// The `(run id, start or end)` of every lifecycle event about `child`.
fn epochs(events: &[Lifecycle], child: &str) -> Vec<(String, &'static str)> {
    events
        .iter()
        .filter_map(|e| match e {
            Lifecycle::Start { run_id, id, .. } if id == child => Some((run_id.clone(), "start")),
            Lifecycle::End { run_id, id, .. } if id == child => Some((run_id.clone(), "end")),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_continuable_epoch_has_its_own_start_end_pair_and_run_id() {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![ReplayEntry::Chunks(text_response(&["first"])), ReplayEntry::Chunks(text_response(&["second"]))];
    let (rt, _) = runtime(dir.path(), entries, "");
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    rt.subagents().observe(move |e| sink.lock().unwrap().push(e.clone()));
    let (_, caller) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    let (child, _) = manager.start("spawn", "twice".into(), start_request(&caller, "go")).await.unwrap();
    until("the first epoch to settle", || epochs(&events.lock().unwrap(), &child).len() == 2).await;
    let source = json!({"kind": "coordinator", "senderSessionId": caller.header.id});
    manager.followup(&caller, &child, vec![json!({"type": "text", "text": "again"})], source).await.unwrap();
    until("the resumed epoch to settle", || epochs(&events.lock().unwrap(), &child).len() == 4).await;
    let pairs = epochs(&events.lock().unwrap(), &child);
    let kinds: Vec<&str> = pairs.iter().map(|(_, k)| *k).collect();
    assert_eq!(kinds, ["start", "end", "start", "end"]);
    assert_eq!(pairs[0].0, pairs[1].0, "one run id per epoch");
    assert_eq!(pairs[2].0, pairs[3].0);
    assert_ne!(pairs[0].0, pairs[2].0, "a cold resume is a new epoch with a new run id");
    let ends: Vec<Option<String>> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Lifecycle::End { id, output, .. } if *id == child => Some(output.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ends, [Some("first".to_string()), Some("second".to_string())], "each end carries its final output");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_resume_keeps_the_stored_depth() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::new([]).route("settle", [ReplayEntry::Chunks(text_response(&["settled"]))]).route(
        "delegate",
        [
            ReplayEntry::Chunks(tool_call_response("d", "subagent", r#"{"description":"d","prompt":"deeper"}"#)),
            ReplayEntry::Chunks(text_response(&["could not"])),
        ],
    );
    let (rt, _) = runtime_with(dir.path(), model, "[subagents]\nmax_depth = 2\n");
    let (_, top) = parent(&rt, dir.path());
    // The caller is at depth 1, so its child is at depth 2 (the cap).
    let mut header = top.header.clone();
    header.delegation_depth = 1;
    let caller = Arc::new(Caller { header, depth: 1, route: top.route.clone(), history: None });
    let manager = rt.continuation().clone();
    let (child, _) = manager.start("spawn", "deep".into(), start_request(&caller, "settle")).await.unwrap();
    assert_eq!(rt.store().inspect(&child).unwrap().header.delegation_depth, 2);
    until("the child to settle", || !manager.is_resident(&child)).await;
    // Resumed from its log, the child is still at depth 2: its own delegation is refused. (A
    // user-sourced message, so the scripted model routes the resumed turn by its text.)
    let source = json!({"kind": "user"});
    manager.followup(&caller, &child, vec![json!({"type": "text", "text": "delegate"})], source).await.unwrap();
    until("the resumed child to settle", || !manager.is_resident(&child)).await;
    let events = rt.store().inspect(&child).unwrap().events;
    let result = events.iter().find(|e| e.kind == "tool/result").expect("the resumed child's delegation");
    assert_eq!(
        result.data["message"]["content"][0]["content"][0]["text"],
        "Error: subagent depth 3 exceeds maxDepth 2"
    );
    assert!(rt.store().list().iter().all(|s| s.header.delegation_depth <= 2), "no depth-3 session exists");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_message_to_a_live_child_outside_its_activation_is_an_ownership_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, model) = runtime(dir.path(), vec![ReplayEntry::Hang { chunks: vec![], ready_file: None }], "");
    let (_, caller) = parent(&rt, dir.path());
    // A live one-shot child of the caller: running, but no Activation of the manager holds it.
    let run = rt.subagents().start("spawn", start_request(&caller, "work")).await.unwrap();
    // Its turn is running, so its task is in its log (`start` only queues the turn: a child
    // disposed before the turn starts never logs its task).
    until("the child's model call", || calls_of(&model, &run.id).len() == 1).await;
    let source = json!({"kind": "coordinator", "senderSessionId": caller.header.id});
    let err = rt
        .continuation()
        .followup(&caller, &run.id, vec![json!({"type": "text", "text": "more"})], source)
        .await
        .unwrap_err();
    assert_eq!(
        (err.code, err.message.clone()),
        (ErrorCode::Unauthorized, format!("subagent \"{}\" is live but not a continuable child of this agent", run.id))
    );
    (run.dispose)().await.unwrap();
    let events = rt.store().inspect(&run.id).unwrap().events;
    let messages = events.iter().filter(|e| e.kind == "user/message").count();
    assert_eq!(messages, 1, "only the task: the refused message was never delivered");
    rt.shutdown().await;
}

fn text(t: &str) -> Vec<serde_json::Value> {
    vec![json!({"type": "text", "text": t})]
}

/// The tool names and system prompt of each model call `session` made.
fn calls_of(model: &ScriptedModel, session: &str) -> Vec<(Vec<String>, String)> {
    model
        .requests()
        .into_iter()
        .filter(|r| r.session_id == session)
        .map(|r| (r.tools.iter().map(|t| t.name.clone()).collect(), r.system.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuable_fork_runs_for_real_with_its_descriptor_right_after_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    let fork = r#"{"description":"fork it","prompt":"carry on","run_in_background":true}"#;
    let model = ScriptedModel::new([])
        .route("remember 42", [ReplayEntry::Chunks(text_response(&["noted"]))])
        .route(
            "fork now",
            [
                ReplayEntry::Chunks(tool_call_response("f", "subagent_fork", fork)),
                ReplayEntry::Chunks(text_response(&["forked"])),
            ],
        )
        .route("carry on", [ReplayEntry::Chunks(text_response(&["the number was 42"]))]);
    let (rt, model) = runtime_with(dir.path(), model, "");
    let (parent_id, _) = parent(&rt, dir.path());
    for prompt in ["remember 42", "fork now"] {
        assert_eq!(
            rt.prompt(&parent_id, text(prompt)).unwrap().await.unwrap(),
            kin::testkit::agent::TurnEnd::Completed
        );
    }
    let child = rt
        .store()
        .list()
        .into_iter()
        .find(|s| s.header.parent_session.as_deref() == Some(parent_id.as_str()))
        .expect("the forked child")
        .header;
    until("the forked child to settle", || !rt.continuation().is_resident(&child.id)).await;
    let log = rt.store().inspect(&child.id).unwrap();
    let seed_length = log.header.seed_length.expect("a fork records its seed length") as usize;
    assert!(seed_length > 0, "the seed holds the parent's history");
    let descriptors: Vec<usize> =
        log.events.iter().enumerate().filter(|(_, e)| e.kind == "subagent/descriptor").map(|(i, _)| i).collect();
    assert_eq!(descriptors, [seed_length], "one descriptor, right after the seed");
    assert_eq!(log.events[seed_length].data.to_value()["mode"], "continuable");
    // The child's model call saw the parent's history, then its own prompt, and it answered.
    let call = model.requests().into_iter().find(|r| r.session_id == child.id).expect("the child's model call");
    let history = serde_json::to_string(&*call.messages).unwrap();
    assert!(history.contains("remember 42") && history.contains("noted") && history.contains("carry on"), "{history}");
    let answer = log.events.iter().rev().find(|e| e.kind == "assistant/message").expect("the child's answer");
    assert!(answer.data.to_value().to_string().contains("the number was 42"));
    // It lists as a continuable child of the parent.
    let listed: Vec<_> = rt.child_tree(&parent_id, 1).unwrap().into_iter().map(|t| t.entry).collect();
    assert!(
        matches!(&listed[..], [ListEntry::Child { id, mode: Mode::Continuable, .. }] if *id == child.id),
        "{listed:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuable_childs_persona_and_tool_filter_apply_at_start_and_on_cold_resume() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::new([])
        .route("go", [ReplayEntry::Chunks(text_response(&["plain"])), ReplayEntry::Chunks(text_response(&["first"]))])
        .route("again", [ReplayEntry::Chunks(text_response(&["second"]))]);
    let (rt, model) = runtime_with(dir.path(), model, "");
    let (_, caller) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    // An unfiltered child first: the tools a filter takes away are there without one.
    let (plain, _) = manager.start("spawn", "plain".into(), start_request(&caller, "go")).await.unwrap();
    until("the plain child to settle", || !manager.is_resident(&plain)).await;
    let (plain_tools, plain_system) = calls_of(&model, &plain).remove(0);
    assert!(plain_tools.iter().any(|t| t == "subagent") && !plain_system.contains("PERSONA-X"), "{plain_tools:?}");
    let mut request = start_request(&caller, "go");
    request.persona = Some("You are PERSONA-X.".into());
    request.tool_filter =
        Some(kin::testkit::subagent::descriptor::ToolFilter { allow: None, deny: Some(vec!["subagent*".into()]) });
    let (child, _) = manager.start("spawn", "styled".into(), request).await.unwrap();
    until("the styled child to settle", || !manager.is_resident(&child)).await;
    // Cold resume: the Activation is gone, the descriptor is read back from the log.
    let source = json!({"kind": "user"});
    manager.followup(&caller, &child, text("again"), source).await.unwrap();
    until("the resumed child to settle", || !manager.is_resident(&child)).await;
    let calls = calls_of(&model, &child);
    assert_eq!(calls.len(), 2, "the start and the cold resume");
    let expected: Vec<String> = plain_tools.iter().filter(|t| !t.starts_with("subagent")).cloned().collect();
    for (tools, system) in &calls {
        assert_eq!(tools, &expected, "the filter applies");
        assert!(system.contains("You are PERSONA-X."), "the persona applies: {system}");
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_agent_stopped_outside_the_manager_still_settles_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::new([])
        .route("work", [ReplayEntry::Hang { chunks: vec![], ready_file: None }])
        .route("more", [ReplayEntry::Chunks(text_response(&["resumed"]))]);
    let (rt, model) = runtime_with(dir.path(), model, "");
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    rt.subagents().observe(move |e| sink.lock().unwrap().push(e.clone()));
    let (_, caller) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    let (child, _) = manager.start("spawn", "stopped".into(), start_request(&caller, "work")).await.unwrap();
    // Its turn is running (a queued one would stay pending and run again on resume).
    until("the child's model call", || calls_of(&model, &child).len() == 1).await;
    // The child's agent stops behind the manager's back: its final flush can never be retried.
    kin::testkit::subagent::inprocess::ChildFactory::live_agent(&*rt, &child)
        .expect("the child's agent")
        .shutdown()
        .await;
    // Settled once its `subagent/end` is out (the Activation is gone before that is emitted).
    until("the stopped child to settle", || epochs(&events.lock().unwrap(), &child).len() == 2).await;
    assert!(!manager.is_resident(&child));
    assert_eq!(epochs(&events.lock().unwrap(), &child).iter().map(|(_, k)| *k).collect::<Vec<_>>(), ["start", "end"]);
    // Its log is intact, so a follow-up resumes it cold.
    let source = json!({"kind": "user"});
    manager.followup(&caller, &child, text("more"), source).await.unwrap();
    until("the resumed child to settle", || epochs(&events.lock().unwrap(), &child).len() == 4).await;
    let log = rt.store().inspect(&child).unwrap();
    let answer = log.events.iter().rev().find(|e| e.kind == "assistant/message").expect("the resumed answer");
    assert!(answer.data.to_value().to_string().contains("resumed"));
    rt.shutdown().await;
}
