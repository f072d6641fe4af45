//! `send_message` and `interrupt_agent` aimed where they have no right to go, over the real
//! runtime and store with the scripted model, through the tools as the model calls them: a
//! refused call writes nothing anywhere (authorization comes from headers, before any repairing
//! load), both tools refuse the same targets with the same codes and texts, and a child the
//! catalog calls corrupt or unsupported is refused with that reason. And a `send_message` called
//! off says the truth about its message: cancelled before the hand-off, nothing is written;
//! cancelled or dropped after it, the message is on disk, runs, and the child still settles.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::model::text_response;
use kin::testkit::runtime::Runtime;
use kin::testkit::session::{Event, SessionHeader, SessionStore};
use kin::testkit::subagent::Lifecycle;
use kin::testkit::subagent::control::{InterruptTool, ReportTool, SendMessageTool};
use kin::testkit::tools::{Caller, Tool, ToolContext, ToolError};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[allow(dead_code)]
mod common;
use common::{parent, runtime, runtime_with, start_request, turn_ends, until};

/// Every file under `root` with its bytes, in path order.
fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                out.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn event(seq: u64, kind: &str, data: Value) -> Event {
    Event { kind: kind.into(), seq, time: 0, data: data.into(), source_event_seqs: None, surface_op: None }
}

/// A stored session whose last turn was interrupted by a crash (a load would repair it), with
/// `extra` events before the turn.
fn interrupted(store: &SessionStore, header: SessionHeader, extra: Vec<Event>) {
    let mut session = store.create_seeded(header, extra).unwrap();
    session.append("turn/start", json!({"turn": 1, "trigger": {"kind": "message", "source": {"kind": "user"}}}));
    session.append_surface(
        "user/message",
        json!({"content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}, "role": "user", "id": "m"}),
        None,
    );
    session.append("step/start", json!({"turn": 1, "step": 1}));
    session.flush().unwrap();
}

fn child_header(id: &str, parent: &str) -> SessionHeader {
    let mut header = SessionHeader::new(id, 5, Some("/elsewhere".into()));
    header.parent_session = Some(parent.into());
    header.origin = Some("subagent".into());
    header.delegation_depth = 1;
    header
}

fn descriptor(seq: u64, version: u64) -> Event {
    event(
        seq,
        "subagent/descriptor",
        json!({"version": version, "mode": "continuable", "provider": "spawn", "label": "x"}),
    )
}

fn ctx(caller: &Arc<Caller>) -> ToolContext {
    ctx_with(caller, CancellationToken::new())
}

/// A call of `caller`'s cancelled by `cancel`.
fn ctx_with(caller: &Arc<Caller>, cancel: CancellationToken) -> ToolContext {
    let mut ctx = ToolContext::detached(None, cancel);
    ctx.caller = Some(caller.clone());
    ctx
}

async fn send(tool: &SendMessageTool, caller: &Arc<Caller>, id: &str) -> Result<String, ToolError> {
    let args = json!({"subagent_id": id, "message": "do more"});
    tool.execute(args, ctx(caller)).await.map(|out| out.content[0]["text"].as_str().unwrap().to_string())
}

async fn interrupt(tool: &InterruptTool, caller: &Arc<Caller>, id: &str) -> Result<String, ToolError> {
    tool.execute(json!({"agent_id": id}), ctx(caller))
        .await
        .map(|out| out.content[0]["text"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_control_calls_write_nothing_and_both_tools_refuse_alike() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::new([]).route("busy", [ReplayEntry::Hang { chunks: vec![], ready_file: None }]);
    let (rt, _) = runtime_with(dir.path(), model, "");
    let (_, caller) = parent(&rt, dir.path());
    // Another top-level session, busy in a turn.
    let (busy, _) = parent(&rt, dir.path());
    let _turn = rt.prompt(&busy, vec![json!({"type": "text", "text": "busy"})]).unwrap();
    until("the busy session's turn to start", || {
        rt.store().inspect(&busy).unwrap().events.iter().any(|e| e.kind == "step/start")
    })
    .await;
    // Stored sessions a load would repair: a top-level one and a stranger's continuable child.
    let store = rt.store().clone();
    let stored_top = "33333333-3333-4333-8333-333333333333";
    interrupted(&store, SessionHeader::new(stored_top, 5, Some("/elsewhere".into())), vec![]);
    let strangers = "44444444-4444-4444-8444-444444444444";
    interrupted(&store, child_header(strangers, "55555555-5555-4555-8555-555555555555"), vec![descriptor(0, 2)]);
    let unknown = "66666666-6666-4666-8666-666666666666";
    let sessions = dir.path().join("sessions");
    let before = snapshot(&sessions);
    let (send_tool, interrupt_tool) =
        (SendMessageTool(rt.continuation().clone()), InterruptTool(rt.continuation().clone()));
    let me = caller.header.id.clone();
    let live =
        |id: &str| ("UNAUTHORIZED", format!("subagent \"{id}\" is live but not a continuable child of this agent"));
    let foreign = |id: &str| ("UNAUTHORIZED", format!("subagent \"{id}\" belongs to another parent session"));
    let cases = [
        (busy.as_str(), live(&busy)),
        (me.as_str(), live(&me)),
        (stored_top, foreign(stored_top)),
        (strangers, foreign(strangers)),
        (unknown, ("NOT_RESUMABLE", format!("subagent \"{unknown}\" is unavailable"))),
        ("../../etc/passwd", ("NOT_RESUMABLE", "subagent \"../../etc/passwd\" is unavailable (".to_string())),
    ];
    for (target, (code, text)) in cases {
        let sent = send(&send_tool, &caller, target).await.unwrap_err();
        let interrupted = interrupt(&interrupt_tool, &caller, target).await.unwrap_err();
        assert_eq!(
            (sent.code.as_str(), sent.message.starts_with(&text)),
            (code, true),
            "send_message to {target}: {}",
            sent.message
        );
        assert_eq!(
            (&interrupted.code, &interrupted.message),
            (&sent.code, &sent.message),
            "interrupt_agent of {target}"
        );
    }
    // A blank message or report is refused before anything else: nothing to deliver.
    for blank in ["", "  \n\t"] {
        let sent =
            send_tool.execute(json!({"subagent_id": unknown, "message": blank}), ctx(&caller)).await.unwrap_err();
        assert_eq!(sent.code, "INVALID_ARGUMENTS");
        assert!(
            sent.message.starts_with("message is empty: write what the subagent should do next"),
            "{}",
            sent.message
        );
        let reported =
            ReportTool(rt.continuation().clone()).execute(json!({"output": blank}), ctx(&caller)).await.unwrap_err();
        assert_eq!(reported.code, "INVALID_ARGUMENTS");
        assert!(reported.message.starts_with("output is empty"), "{}", reported.message);
    }
    assert_eq!(snapshot(&sessions), before, "a refused call wrote nothing anywhere");
    rt.cancel(&busy);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_child_the_catalog_calls_corrupt_or_unsupported_is_refused_with_that_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime_with(dir.path(), ScriptedModel::new([]), "");
    let (_, caller) = parent(&rt, dir.path());
    let store = rt.store().clone();
    let me = caller.header.id.clone();
    let duplicated = "77777777-7777-4777-8777-777777777777";
    interrupted(&store, child_header(duplicated, &me), vec![descriptor(0, 2), descriptor(1, 2)]);
    let future = "88888888-8888-4888-8888-888888888888";
    interrupted(&store, child_header(future, &me), vec![descriptor(0, 3)]);
    let listed = kin::testkit::subagent::list_agents::render(
        &kin::testkit::subagent::catalog::list_children(
            Some(&kin::testkit::session::query::SessionQuery::new(
                kin::testkit::session::query::StoreSource::persisted_only(store.clone()),
            )),
            &me,
            &CancellationToken::new(),
        )
        .unwrap(),
    );
    assert!(listed.contains(&format!("{duplicated} [diagnostic: corrupt]")), "{listed}");
    assert!(listed.contains(&format!("{future} [diagnostic: unsupported]")), "{listed}");
    let sessions = dir.path().join("sessions");
    let before = snapshot(&sessions);
    let tool = SendMessageTool(rt.continuation().clone());
    for (id, reason) in [(duplicated, "corrupt"), (future, "unsupported")] {
        let err = send(&tool, &caller, id).await.unwrap_err();
        assert_eq!(err.code, "NOT_RESUMABLE", "{}", err.message);
        assert_eq!(
            err.message,
            format!(
                "subagent \"{id}\" is {reason} (its subagent descriptor cannot be used) and cannot be resumed; do not retry send_message with this id"
            )
        );
    }
    assert_eq!(snapshot(&sessions), before, "nothing was resumed or repaired");
    rt.shutdown().await;
}

/// A runtime answering with `entries`, a parent session's caller, a background child of it
/// started with the prompt "first" (its first turn takes the first entry), and the
/// `subagent/end`s seen from before the start on (the child may settle before the start's caller
/// runs again).
async fn started(entries: Vec<ReplayEntry>) -> (tempfile::TempDir, Arc<Runtime>, Arc<Caller>, String, Ends) {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), entries, "");
    let (_, caller) = parent(&rt, dir.path());
    let ends = ended(&rt);
    let request = start_request(&caller, "first");
    let (child, _) = rt.continuation().start("spawn", "worker".into(), request).await.unwrap();
    (dir, rt, caller, child, ends)
}

type Ends = Arc<Mutex<Vec<String>>>;

/// The ids of the children whose `subagent/end` was emitted, in order.
fn ended(rt: &Runtime) -> Ends {
    let ends = Arc::new(Mutex::new(Vec::new()));
    let sink = ends.clone();
    rt.subagents().observe(move |e| {
        if let Lifecycle::End { id, .. } = e {
            sink.lock().unwrap().push(id.clone());
        }
    });
    ends
}

fn log(rt: &Runtime, id: &str) -> Vec<Event> {
    rt.store().inspect(id).unwrap().events
}

fn first_text(message: &Value) -> String {
    message["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

/// How many of a log's inbox insertions and of its `user/message`s carry `text`.
fn carried(events: &[Event], text: &str) -> (usize, usize) {
    let inserted = events
        .iter()
        .filter(|e| e.kind == "agent/inbox/spliced")
        .flat_map(|e| e.data["inserted"].as_array().cloned().unwrap_or_default())
        .filter(|m| first_text(m) == text)
        .count();
    let run = events.iter().filter(|e| e.kind == "user/message" && e.data["content"][0]["text"] == text).count();
    (inserted, run)
}

/// The file a `gated` model call waits for, in the caller's (and so its children's) cwd.
fn gate(caller: &Caller) -> PathBuf {
    PathBuf::from(caller.header.cwd.clone().unwrap()).join("release")
}

/// A model call that waits for the `gate` file, then answers `text`.
fn gated(text: &str) -> ReplayEntry {
    ReplayEntry::Gated { file: "release".into(), entry: Box::new(ReplayEntry::Chunks(text_response(&[text]))) }
}

/// On one thread, one poll of the call hands the message over (or commits to it): the child's
/// agent cannot run before this task waits, so the call is cancelled while the write is still to
/// come. The answer must be what became of the message — delivered — and the message's turn must
/// still count: the child settles after it, with one `subagent/end`.
#[tokio::test(flavor = "current_thread")]
async fn a_send_message_cancelled_after_its_hand_off_answers_delivered_and_the_child_settles() {
    let (_dir, rt, caller, child, ends) =
        started(vec![gated("one"), ReplayEntry::Chunks(text_response(&["two"]))]).await;
    let manager = rt.continuation().clone();
    let tool = SendMessageTool(manager.clone());
    let cancel = CancellationToken::new();
    let mut call = tool.execute(json!({"subagent_id": child, "message": "do more"}), ctx_with(&caller, cancel.clone()));
    assert!(futures::poll!(&mut call).is_pending(), "the write waits for the child's agent");
    assert_eq!(carried(&log(&rt, &child), "do more"), (0, 0), "not written yet when the call is cancelled");
    cancel.cancel();
    let answer = match call.await {
        Ok(out) => out.content[0]["text"].as_str().unwrap().to_string(),
        Err(e) => panic!("the message is on its way, yet the call answered {}: {}", e.code, e.message),
    };
    assert_eq!(answer, format!("message queued as the next turn for subagent {child}"));
    // Accepted means on disk: the insertion was written before the answer.
    assert_eq!(carried(&log(&rt, &child), "do more"), (1, 0));
    assert!(manager.is_resident(&child), "its first turn is still gated");
    std::fs::write(gate(&caller), b"").unwrap();
    until("the child to settle", || !ends.lock().unwrap().is_empty()).await;
    assert_eq!(*ends.lock().unwrap(), std::slice::from_ref(&child));
    assert!(!manager.is_resident(&child));
    let events = log(&rt, &child);
    assert_eq!(turn_ends(&events), ["completed", "completed"], "the message ran as its own turn");
    assert_eq!(carried(&events, "do more"), (1, 1));
    rt.shutdown().await;
}

/// A call cancelled before anything reached the child is aborted, says the message was not
/// delivered, and writes nothing: the child's inbox never holds it and it settles after its
/// first turn as if the call had not been made.
#[tokio::test(flavor = "current_thread")]
async fn a_send_message_cancelled_before_its_hand_off_writes_nothing() {
    let (_dir, rt, caller, child, ends) = started(vec![gated("one")]).await;
    let manager = rt.continuation().clone();
    let tool = SendMessageTool(manager.clone());
    let cancel = CancellationToken::new();
    cancel.cancel();
    let err =
        tool.execute(json!({"subagent_id": child, "message": "do more"}), ctx_with(&caller, cancel)).await.unwrap_err();
    assert_eq!(
        (err.code.as_str(), err.message.clone()),
        (
            "ABORTED",
            format!("tool call aborted before the message was handed to subagent \"{child}\"; it was not delivered")
        )
    );
    std::fs::write(gate(&caller), b"").unwrap();
    until("the child to settle", || !ends.lock().unwrap().is_empty()).await;
    assert!(!manager.is_resident(&child));
    let events = log(&rt, &child);
    assert_eq!(turn_ends(&events), ["completed"]);
    assert_eq!(carried(&events, "do more"), (0, 0), "nothing of the message was written");
    rt.shutdown().await;
}

/// A call to a settled child dropped after its first poll (its turn went away without an answer):
/// the resume and the hand-off it committed to still complete, so the message runs and the
/// resumed child settles again instead of staying resident for good.
#[tokio::test(flavor = "current_thread")]
async fn a_send_message_dropped_while_resuming_its_child_still_delivers_and_the_child_settles() {
    let entries = vec![ReplayEntry::Chunks(text_response(&["one"])), ReplayEntry::Chunks(text_response(&["two"]))];
    let (_dir, rt, caller, child, ends) = started(entries).await;
    let manager = rt.continuation().clone();
    until("the child to settle", || ends.lock().unwrap().len() == 1).await;
    assert!(!manager.is_resident(&child));
    let tool = SendMessageTool(manager.clone());
    let mut call = tool.execute(json!({"subagent_id": child, "message": "do more"}), ctx(&caller));
    assert!(futures::poll!(&mut call).is_pending());
    drop(call);
    until("the resumed child to settle again", || ends.lock().unwrap().len() == 2).await;
    assert_eq!(*ends.lock().unwrap(), [child.clone(), child.clone()]);
    assert!(!manager.is_resident(&child));
    let events = log(&rt, &child);
    assert_eq!(turn_ends(&events), ["completed", "completed"]);
    assert_eq!(carried(&events, "do more"), (1, 1), "delivered once, and run");
    rt.shutdown().await;
}

/// A background start dropped after its first poll (the `subagent` tool call cut short while the
/// child's log is being made): the start still runs to its end, so the child exists with its
/// prompt accepted, runs it, and settles, instead of staying resident with nobody watching its
/// turn (or half-made).
#[tokio::test(flavor = "current_thread")]
async fn a_background_start_dropped_midway_still_starts_the_child_and_it_settles() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![ReplayEntry::Chunks(text_response(&["one"]))], "");
    let (parent_id, caller) = parent(&rt, dir.path());
    let manager = rt.continuation().clone();
    let ends = ended(&rt);
    let mut start = Box::pin(manager.start("spawn", "worker".into(), start_request(&caller, "first")));
    // Dropped while still pending (a cut-short call): before the fix, one poll ran the start up to
    // the hand-off to the child's agent, and the drop cut it there.
    assert!(futures::poll!(&mut start).is_pending());
    drop(start);
    until("the child to settle", || ends.lock().unwrap().len() == 1).await;
    let child = ends.lock().unwrap()[0].clone();
    assert!(!manager.is_resident(&child));
    let events = log(&rt, &child);
    assert_eq!(turn_ends(&events), ["completed"], "the prompt was accepted and ran");
    assert_eq!(events.iter().filter(|e| e.kind == "subagent/descriptor").count(), 1);
    let header = rt.store().inspect(&child).unwrap().header;
    assert_eq!(header.parent_session.as_deref(), Some(parent_id.as_str()));
    rt.shutdown().await;
}
