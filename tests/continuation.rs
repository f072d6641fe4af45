//! Continuable children over the real runtime, JSONL store and agent loop with the scripted
//! model: concurrency, settlement races, authority, ownership (waiting), reports, interrupts
//! and draining.

use std::time::Duration;

use kin::testkit::agent::TurnEnd;
use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::model::{text_response, tool_call_response};
use kin::testkit::runtime::Runtime;
use kin::testkit::subagent::{ErrorCode, Lifecycle};
use serde_json::json;

#[allow(dead_code)]
mod common;
use common::{parent, runtime, runtime_with, start_request, until};

fn texts(n: usize, text: &str) -> Vec<ReplayEntry> {
    (0..n).map(|_| ReplayEntry::Chunks(text_response(&[text]))).collect()
}

fn turn_ends(rt: &Runtime, id: &str) -> Vec<String> {
    rt.store()
        .inspect(id)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == "turn/end")
        .map(|e| e.data["reason"]["kind"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_background_children_complete_and_settle_with_intact_logs() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), texts(20, "done"), "");
    let (_, caller) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    let starts = (0..20).map(|i| {
        let (m, c) = (manager.clone(), caller.clone());
        async move { m.start("spawn", format!("child {i}"), start_request(&c, &format!("task {i}"))).await }
    });
    let started: Vec<(String, String)> =
        futures::future::join_all(starts).await.into_iter().map(Result::unwrap).collect();
    until("every child to settle", || started.iter().all(|(id, _)| !manager.is_resident(id))).await;
    for (id, _) in &started {
        let scanned = rt.store().inspect(id).unwrap();
        assert!(scanned.torn.is_none());
        assert_eq!(turn_ends(&rt, id), ["completed"], "{id}");
        let descriptors = scanned.events.iter().filter(|e| e.kind == "subagent/descriptor").count();
        assert_eq!(descriptors, 1);
        assert_eq!(scanned.events[1].kind, "session/end-seed");
        assert_eq!(scanned.header.seed_length, None, "spawn has no lineage seed");
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followup_racing_settlement_is_delivered_exactly_once() {
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let (rt, _) = runtime(dir.path(), texts(2, "ok"), "");
        let (_, caller) = parent(&rt, dir.path());
        let manager = rt.continuation().clone();
        let (child, _) = manager.start("spawn", "racer".into(), start_request(&caller, "first")).await.unwrap();
        // A deliberate race probe, not a fence: sleep a little so some rounds race the
        // settlement and some cold-resume (either way the message is delivered once).
        tokio::time::sleep(Duration::from_millis(round)).await;
        let source = json!({"kind": "coordinator", "senderSessionId": caller.header.id});
        manager.followup(&caller, &child, vec![json!({"type": "text", "text": "second"})], source).await.unwrap();
        until("the child to settle", || !manager.is_resident(&child)).await;
        let events = rt.store().inspect(&child).unwrap().events;
        let seconds =
            events.iter().filter(|e| e.kind == "user/message" && e.data["content"][0]["text"] == "second").count();
        assert_eq!(seconds, 1, "round {round}");
        assert_eq!(turn_ends(&rt, &child), ["completed", "completed"], "round {round}");
        let turns: Vec<u64> =
            events.iter().filter(|e| e.kind == "turn/start").map(|e| e.data["turn"].as_u64().unwrap()).collect();
        assert_eq!(turns, [1, 2], "contiguous turns, round {round}");
        rt.shutdown().await;
    }
}

#[tokio::test]
async fn follow_ups_need_the_exact_parent_and_a_continuable_child() {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![
        ReplayEntry::Chunks(text_response(&["child"])),
        ReplayEntry::Chunks(tool_call_response("c", "subagent", r#"{"description":"d","prompt":"one-shot"}"#)),
        ReplayEntry::Chunks(text_response(&["one-shot child"])),
        ReplayEntry::Chunks(text_response(&["parent"])),
    ];
    let (rt, _) = runtime(dir.path(), entries, "");
    let (parent_id, caller) = parent(&rt, dir.path());
    let (_, stranger) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    let (child, _) = manager.start("spawn", "mine".into(), start_request(&caller, "go")).await.unwrap();
    let source = json!({"kind": "coordinator", "senderSessionId": stranger.header.id});
    let err = manager
        .followup(&stranger, &child, vec![json!({"type": "text", "text": "x"})], source.clone())
        .await
        .unwrap_err();
    assert_eq!(
        (err.code, err.message.clone()),
        (ErrorCode::Unauthorized, format!("subagent \"{child}\" belongs to another parent session"))
    );
    until("settled", || !manager.is_resident(&child)).await;
    let err = manager.followup(&stranger, &child, vec![], source.clone()).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Unauthorized, "cold resume checks the parent too");
    let unknown = "22222222-2222-4222-8222-222222222222";
    let err = manager.followup(&caller, unknown, vec![], source.clone()).await.unwrap_err();
    assert_eq!((err.code, err.message), (ErrorCode::NotResumable, format!("subagent \"{unknown}\" is unavailable")));
    // A one-shot child has no continuation state.
    assert_eq!(
        rt.prompt(&parent_id, vec![json!({"type": "text", "text": "delegate"})]).unwrap().await.unwrap(),
        TurnEnd::Completed
    );
    let one_shot = rt
        .store()
        .list()
        .into_iter()
        .find(|s| s.header.parent_session.as_deref() == Some(parent_id.as_str()) && s.header.id != child)
        .unwrap()
        .header
        .id;
    let err = manager.followup(&caller, &one_shot, vec![], source).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::NotResumable);
    assert!(err.message.ends_with(
        "has no supported continuation state and cannot be resumed; do not retry send_message with this id"
    ));
    // The descriptor was never duplicated by the failed resumes.
    let descriptors =
        rt.store().inspect(&child).unwrap().events.iter().filter(|e| e.kind == "subagent/descriptor").count();
    assert_eq!(descriptors, 1);
    rt.shutdown().await;
}

/// A running continuable child that names itself is told what the catalog says of the caller
/// itself, not that it belongs to another parent.
#[tokio::test]
async fn a_child_naming_itself_is_not_its_own_child() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![ReplayEntry::Hang { chunks: vec![], ready_file: None }], "");
    let (_, caller) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    let (child, _) = manager.start("spawn", "mine".into(), start_request(&caller, "go")).await.unwrap();
    assert!(manager.is_resident(&child), "its turn hangs: its Activation lives");
    let header = rt.store().inspect(&child).unwrap().header;
    let itself = kin::testkit::tools::Caller { header, ..(*caller).clone() };
    let own = format!("subagent \"{child}\" is live but not a continuable child of this agent");
    let source = json!({"kind": "coordinator", "senderSessionId": child});
    let err = manager.followup(&itself, &child, vec![json!({"type": "text", "text": "x"})], source).await.unwrap_err();
    assert_eq!((err.code, err.message), (ErrorCode::Unauthorized, own.clone()));
    let err = manager.interrupt(&child, &child, false).await.unwrap_err();
    assert_eq!((err.code, err.message), (ErrorCode::Unauthorized, own));
    rt.shutdown().await;
}

#[tokio::test]
async fn an_unsupported_provider_leaves_no_child() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![], "");
    let (_, caller) = parent(&rt, dir.path());
    let err = rt.continuation().start("nope", "x".into(), start_request(&caller, "go")).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::NoProvider);
    let mut deep = start_request(&caller, "go");
    deep.max_depth = Some(0);
    let err = rt.continuation().start("spawn", "x".into(), deep).await.unwrap_err();
    assert_eq!(err.message, "subagent depth 1 exceeds maxDepth 0");
    assert_eq!(rt.store().list().len(), 1, "only the parent exists");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_owning_a_live_grandchild_waits_and_settles_after_it() {
    let dir = tempfile::tempdir().unwrap();
    // The child starts a grandchild in the background, then answers; the grandchild hangs.
    let model = ScriptedModel::new([])
        .route(
            "start a leaf",
            [
                ReplayEntry::Chunks(tool_call_response(
                    "g",
                    "subagent",
                    r#"{"description":"leaf","prompt":"leaf","run_in_background":true}"#,
                )),
                ReplayEntry::Chunks(text_response(&["child done"])),
            ],
        )
        .route("leaf", [ReplayEntry::Hang { chunks: vec![], ready_file: None }]);
    let (rt, _) = runtime_with(dir.path(), model, "");
    let ends = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = ends.clone();
    rt.subagents().observe(move |e| {
        if let Lifecycle::End { id, .. } = e {
            sink.lock().unwrap().push(id.clone());
        }
    });
    let (_, caller) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    let (child, _) = manager.start("spawn", "middle".into(), start_request(&caller, "start a leaf")).await.unwrap();
    until("the child's turn to end", || turn_ends(&rt, &child).len() == 1).await;
    let grandchild = rt
        .store()
        .list()
        .into_iter()
        .find(|s| s.header.parent_session.as_deref() == Some(child.as_str()))
        .unwrap()
        .header
        .id;
    assert!(manager.is_resident(&grandchild));
    // (Whether the child settled too early is told by the order of the ends below, not by
    // waiting a while here and finding it still resident.)
    assert!(manager.is_resident(&child), "waiting: quiescent but owns a live grandchild");
    // Only an ancestor may interrupt; the parent is one (two levels up).
    let err = manager.interrupt("someone-else", &grandchild, false).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Unauthorized);
    manager.interrupt(&caller.header.id, &grandchild, false).await.unwrap();
    until("both to settle", || ends.lock().unwrap().len() == 2).await;
    assert_eq!(*ends.lock().unwrap(), [grandchild.clone(), child.clone()], "the child settled after its grandchild");
    assert!(!manager.is_resident(&child) && !manager.is_resident(&grandchild));
    assert_eq!(turn_ends(&rt, &grandchild), ["aborted"]);
    manager.interrupt(&caller.header.id, &grandchild, false).await.unwrap();
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_need_a_live_continuable_child_and_a_live_parent() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![ReplayEntry::Hang { chunks: vec![], ready_file: None }], "");
    let (parent_id, caller) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    let err = manager.report(&parent_id, "x").await.unwrap_err();
    assert_eq!(err.message, format!("agent \"{parent_id}\" is not a live continuable subagent and cannot report"));
    let (child, _) = manager.start("spawn", "reporter".into(), start_request(&caller, "work")).await.unwrap();
    let message_id = manager.report(&child, "progress").await.unwrap();
    // A report is bounded as a child's answer is: its first and last 40 000 bytes.
    let big = format!("{}{}", "h".repeat(150_000), "t".repeat(150_000));
    manager.report(&child, &big).await.unwrap();
    rt.continuation().drain().await;
    let events = rt.store().inspect(&parent_id).unwrap().events;
    let landed = events.iter().rfind(|e| e.kind == "user/message").unwrap();
    let text = landed.data["content"][1]["text"].as_str().unwrap();
    assert!(text.len() < 80_100 && text.contains("[... 220000 bytes omitted ...]"), "{} bytes", text.len());
    let report = events.iter().find(|e| e.kind == "user/message").expect("the quiet report landed between turns");
    assert_eq!(report.data["id"], message_id.as_str());
    assert_eq!(report.data["content"][0]["text"], format!("Background subagent {child} reported:"));
    assert_eq!(report.data["source"], json!({"kind": "subagent-report", "senderSessionId": child}));
    assert!(events.iter().all(|e| e.kind != "turn/start"), "a quiet report starts no turn");
    // After draining, admission is closed.
    let err = manager.start("spawn", "late".into(), start_request(&caller, "x")).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Draining);
    rt.shutdown().await;
}
