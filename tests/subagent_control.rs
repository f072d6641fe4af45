//! `send_message` and `interrupt_agent` aimed where they have no right to go, over the real
//! runtime and store with the scripted model, through the tools as the model calls them: a
//! refused call writes nothing anywhere (authorization comes from headers, before any repairing
//! load), both tools refuse the same targets with the same codes and texts, and a child the
//! catalog calls corrupt or unsupported is refused with that reason.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::session::{Event, SessionHeader, SessionStore};
use kin::testkit::subagent::control::{InterruptTool, SendMessageTool};
use kin::testkit::tools::{Caller, Tool, ToolContext, ToolError};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[allow(dead_code)]
mod common;
use common::{parent, runtime_with, until};

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
    let mut ctx = ToolContext::detached(None, CancellationToken::new());
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
