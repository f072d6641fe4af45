//! The agent tree over ACP, driving the real binary over pipes with recorded scenarios: a client
//! that advertises `clientCapabilities.subagents` sees every child announced on its parent
//! before any of the child's traffic, the child's updates under its own id, the delegating tool
//! call linked to it, messages between sessions in both transcripts, per-session usage, the
//! child's state from running to idle, per-child cancel, refused requests on a child id, and the
//! re-announcement of a continuable child when its parent is loaded after a restart (the same
//! answer every time). A client without the capability sees none of it.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

#[allow(dead_code)]
mod common;
use common::{Peer, WAIT};

const SPAWN_PROMPT: &str = "Delegate: have a child reply CHILD_OK, then say PARENT_DONE.";
const FOLLOWUPS_PROMPT: &str = "Start a background child, send it two more messages, then try an unknown id.";

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name)
}

/// `kin acp` over pipes, in replay mode and `bypass`.
fn replaying(sessions: &Path, replay: &Path, cwd: &Path) -> Peer {
    replaying_in_mode(sessions, replay, cwd, "bypass")
}

fn replaying_in_mode(sessions: &Path, replay: &Path, cwd: &Path, mode: &str) -> Peer {
    let mut command = common::acp(sessions, Some(replay));
    command.args(["--permission-mode", mode]).current_dir(cwd);
    spawn(command)
}

/// Runs `command` without the caller's `KIN_*` settings.
fn spawn(mut command: std::process::Command) -> Peer {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("KIN_") {
            command.env_remove(key);
        }
    }
    Peer::spawn(&mut command)
}

/// `initialize`, with or without `clientCapabilities.subagents`.
fn initialize(kin: &mut Peer, subagents: bool) -> Value {
    let capabilities = if subagents { json!({"subagents": {}}) } else { json!({}) };
    let response = kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": capabilities}), WAIT);
    assert_eq!(response["result"]["agentInfo"]["name"], "kin", "{response}");
    response
}

/// The `session/update` in a frame as (session id, update).
fn update(frame: &Value) -> Option<(&str, &Value)> {
    (frame["method"] == "session/update")
        .then(|| (frame["params"]["sessionId"].as_str().unwrap_or(""), &frame["params"]["update"]))
}

/// The updates of one kind for one session, in order.
fn updates<'a>(frames: &'a [Value], session: &str, kind: &str) -> Vec<&'a Value> {
    frames
        .iter()
        .filter_map(update)
        .filter(|(s, u)| *s == session && u["sessionUpdate"] == kind)
        .map(|(_, u)| u)
        .collect()
}

/// The `subagent_update`s about `child` sent on `parent`.
fn announcements<'a>(frames: &'a [Value], parent: &str, child: &str) -> Vec<&'a Value> {
    updates(frames, parent, "subagent_update").into_iter().filter(|u| u["sessionId"] == child).collect()
}

/// The concatenated text of a session's chunks of one kind.
fn text(frames: &[Value], session: &str, kind: &str) -> String {
    updates(frames, session, kind).iter().filter_map(|u| u["content"]["text"].as_str()).collect()
}

/// The child announced on `parent` first, and the index of that announcement.
fn first_child(frames: &[Value], parent: &str) -> (String, usize) {
    let index = frames
        .iter()
        .position(|f| update(f).is_some_and(|(s, u)| s == parent && u["sessionUpdate"] == "subagent_update"))
        .expect("a child was announced on the parent");
    let child = frames[index]["params"]["update"]["sessionId"].as_str().unwrap().to_string();
    assert_ne!(child, parent);
    (child, index)
}

/// No frame before `index` names `child`.
fn nothing_names_before(frames: &[Value], child: &str, index: usize) {
    for (i, frame) in frames.iter().enumerate().take(index) {
        assert!(!frame.to_string().contains(child), "frame {i} names the child before its announcement: {frame}");
    }
}

fn state_names(states: &[&Value]) -> Vec<String> {
    states.iter().filter_map(|u| u["state"]["state"].as_str()).map(str::to_string).collect()
}

fn refused(response: &Value, child: &str) {
    assert_eq!(response["error"]["code"], -32602, "{response}");
    assert_eq!(
        response["error"]["message"],
        format!("Invalid params: {child} is a subagent session; only session/cancel is allowed on it"),
        "{response}"
    );
}

fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (cwd, sessions) = (tmp.path().join("cwd"), tmp.path().join("sessions"));
    std::fs::create_dir_all(&cwd).unwrap();
    (tmp, cwd, sessions)
}

fn wait_for(path: &Path) {
    common::until_blocking(&path.display().to_string(), || path.exists());
}

#[test]
fn a_subscribed_client_sees_the_child_announced_linked_streamed_and_settled() {
    let (_tmp, cwd, sessions) = dirs();
    let mut kin = replaying(&sessions, &scenario("subagent-spawn"), &cwd);
    let init = initialize(&mut kin, true);
    let capabilities = &init["result"]["agentCapabilities"]["sessionCapabilities"];
    for method in ["list", "resume", "close", "fork"] {
        assert_eq!(capabilities[method], json!({}), "sessionCapabilities.{method}: {init}");
    }
    let parent = kin.new_session(&cwd);
    let id =
        kin.request("session/prompt", json!({"sessionId": parent, "prompt": [{"type": "text", "text": SPAWN_PROMPT}]}));
    let frames = kin.frames_to(id);
    assert_eq!(frames.last().unwrap()["result"]["stopReason"], "end_turn", "{frames:#?}");

    // Announced on the parent before anything names the child.
    let (child, index) = first_child(&frames, &parent);
    nothing_names_before(&frames, &child, index);
    let announcement = &frames[index]["params"]["update"];
    assert_eq!(announcement["title"], "Reply with CHILD_OK");
    assert_eq!(announcement["description"], "Reply with exactly CHILD_OK.");
    assert_eq!(announcement["capabilities"], json!({"cancel": {}}));
    assert_eq!(announcement["state"], json!({"state": "running"}));
    assert_eq!(announcement["cwd"], json!(cwd));

    // The child's own updates, under its id.
    assert_eq!(text(&frames, &child, "agent_message_chunk"), "CHILD_OK");
    assert_eq!(text(&frames, &parent, "agent_message_chunk"), "PARENT_DONE");

    // The delegating tool call links to the child while it runs and when it completes.
    let link = json!({"type": "session", "sessionId": child});
    let calls: Vec<&Value> =
        updates(&frames, &parent, "tool_call_update").into_iter().filter(|u| u["toolCallId"] == "call_1").collect();
    assert!(calls.iter().any(|u| u["content"] == json!([link]) && u.get("status").is_none()), "{calls:#?}");
    let last = calls.last().unwrap();
    assert_eq!(last["status"], "completed");
    assert_eq!(last["content"], json!([{"type": "content", "content": {"type": "text", "text": "CHILD_OK"}}, link]));

    // Running, then idle with the stop reason.
    let states = announcements(&frames, &parent, &child);
    assert_eq!(state_names(&states), ["running", "idle"]);
    assert_eq!(states.last().unwrap()["state"], json!({"state": "idle", "stopReason": "end_turn"}));

    // The child's task appears in both transcripts, linked by message ids.
    let incoming = updates(&frames, &child, "session_message");
    let outgoing = updates(&frames, &parent, "session_message");
    assert_eq!((incoming.len(), outgoing.len()), (1, 1), "{frames:#?}");
    let (incoming, outgoing) = (incoming[0], outgoing[0]);
    for view in [incoming, outgoing] {
        assert_eq!(view["senderSessionId"], parent.as_str());
        assert_eq!(view["recipientSessionId"], child.as_str());
        assert_eq!(view["content"], json!([{"type": "text", "text": "Reply with exactly CHILD_OK."}]));
    }
    assert_eq!(incoming["senderMessageId"], outgoing["messageId"]);
    assert_eq!(outgoing["recipientMessageId"], incoming["messageId"]);

    // Usage per session after each model call: the child's one call, the parent's two; `size` is
    // the route's window (deepseek-v4-flash: 1,000,000).
    let child_usage = updates(&frames, &child, "usage_update");
    assert_eq!(child_usage.len(), 1);
    assert_eq!(child_usage[0]["_meta"]["kin"], json!({"inputTokens": 20, "outputTokens": 2, "modelCalls": 1}));
    assert_eq!((child_usage[0]["used"].as_u64(), child_usage[0]["size"].as_u64()), (Some(22), Some(1_000_000)));
    let parent_usage = updates(&frames, &parent, "usage_update");
    assert_eq!(parent_usage.len(), 2);
    assert_eq!(parent_usage[1]["_meta"]["kin"], json!({"inputTokens": 40, "outputTokens": 12, "modelCalls": 2}));

    // Only session/cancel may name a child.
    let prompt = json!({"sessionId": child, "prompt": [{"type": "text", "text": "hi"}]});
    refused(&kin.call("session/prompt", prompt, WAIT), &child);
    refused(&kin.call("session/set_mode", json!({"sessionId": child, "modeId": "ask"}), WAIT), &child);
    refused(&kin.call("session/load", json!({"sessionId": child, "cwd": cwd, "mcpServers": []}), WAIT), &child);
    refused(&kin.call("session/resume", json!({"sessionId": child, "cwd": cwd}), WAIT), &child);
    refused(&kin.call("session/close", json!({"sessionId": child}), WAIT), &child);
    refused(&kin.call("session/fork", json!({"sessionId": child, "cwd": cwd}), WAIT), &child);
    kin.notify("session/cancel", json!({"sessionId": child}));

    // Children are never listed.
    let listed = kin.call("session/list", json!({}), WAIT);
    let ids: Vec<&str> =
        listed["result"]["sessions"].as_array().unwrap().iter().filter_map(|s| s["sessionId"].as_str()).collect();
    assert_eq!(ids, [parent.as_str()]);
    kin.exit();
}

/// The `subagent-spawn` scenario under `tmp`, its child streaming `chunks` and then hanging
/// (writing `.child-ready` in the cwd) until it is cancelled.
fn hanging_child(tmp: &Path, chunks: Value) -> PathBuf {
    let replay = tmp.join("replay");
    std::fs::create_dir_all(&replay).unwrap();
    for name in ["session.jsonl", "session.1.jsonl"] {
        std::fs::copy(scenario("subagent-spawn").join(name), replay.join(name)).unwrap();
    }
    let entry = json!({"kind": "hang", "readyFile": ".child-ready", "chunks": chunks});
    let hang = json!({"patches": [{"script": 1, "at": 0, "entry": entry}]});
    std::fs::write(replay.join("replay.override.json"), hang.to_string()).unwrap();
    replay
}

#[test]
fn cancelling_a_child_by_its_id_cancels_that_child_only() {
    let (tmp, cwd, sessions) = dirs();
    // The child streams a little, then hangs until it is cancelled.
    let chunks = json!([
        {"type": "block-start", "index": 0, "blockType": "text"},
        {"type": "text-delta", "index": 0, "text": "working"}
    ]);
    let replay = hanging_child(tmp.path(), chunks);
    let mut kin = replaying(&sessions, &replay, &cwd);
    initialize(&mut kin, true);
    let parent = kin.new_session(&cwd);
    let id =
        kin.request("session/prompt", json!({"sessionId": parent, "prompt": [{"type": "text", "text": SPAWN_PROMPT}]}));
    let mut frames = kin
        .frames_until(|f| update(f).is_some_and(|(s, u)| s != parent && u["sessionUpdate"] == "agent_message_chunk"));
    let (child, index) = first_child(&frames, &parent);
    nothing_names_before(&frames, &child, index);
    wait_for(&cwd.join(".child-ready"));
    kin.notify("session/cancel", json!({"sessionId": child}));
    frames.extend(kin.frames_to(id));

    // The parent carries on: only the child was cancelled.
    assert_eq!(frames.last().unwrap()["result"]["stopReason"], "end_turn", "{frames:#?}");
    assert_eq!(text(&frames, &parent, "agent_message_chunk"), "PARENT_DONE");
    assert_eq!(text(&frames, &child, "agent_message_chunk"), "working");
    let states = announcements(&frames, &parent, &child);
    assert_eq!(state_names(&states), ["running", "idle"]);
    assert_eq!(states.last().unwrap()["state"], json!({"state": "idle", "stopReason": "cancelled"}));
    let result =
        updates(&frames, &parent, "tool_call_update").into_iter().rfind(|u| u["toolCallId"] == "call_1").unwrap();
    assert_eq!(result["status"], "failed");
    assert_eq!(result["content"][0]["content"]["text"], "Error: subagent run was cancelled");
    assert_eq!(result["content"][1], json!({"type": "session", "sessionId": child}));
    kin.exit();
}

#[test]
fn closing_the_parent_while_its_child_works_records_the_delegation_as_cancelled() {
    let (tmp, cwd, sessions) = dirs();
    let replay = hanging_child(tmp.path(), json!([]));
    let mut kin = replaying(&sessions, &replay, &cwd);
    initialize(&mut kin, true);
    let parent = kin.new_session(&cwd);
    let id =
        kin.request("session/prompt", json!({"sessionId": parent, "prompt": [{"type": "text", "text": SPAWN_PROMPT}]}));
    wait_for(&cwd.join(".child-ready"));
    let close = kin.request("session/close", json!({"sessionId": parent}));
    let answers = kin.responses(&[id, close], WAIT);
    assert_eq!(answers[&close]["result"], json!({}), "{answers:#?}");
    assert_eq!(answers[&id]["result"]["stopReason"], "cancelled", "{answers:#?}");

    // The parent's log says the delegation was cancelled, not that kin broke.
    let store = kin::testkit::session::SessionStore::new(&sessions);
    let log = store.inspect(&parent).unwrap();
    let result = log.events.iter().find(|e| e.kind == "tool/result").expect("the delegation's result is written");
    let text = result.data["message"]["content"][0]["content"][0]["text"].as_str().unwrap_or_default().to_string();
    assert_eq!(result.data["error"]["code"], "ABORTED", "{:#}", result.data);
    assert!(text.contains("subagent run was cancelled"), "{text}");
    kin.exit();
}

#[test]
fn without_the_capability_no_subagent_updates_leak() {
    let (_tmp, cwd, sessions) = dirs();
    let mut kin = replaying(&sessions, &scenario("subagent-spawn"), &cwd);
    initialize(&mut kin, false);
    let parent = kin.new_session(&cwd);
    let id =
        kin.request("session/prompt", json!({"sessionId": parent, "prompt": [{"type": "text", "text": SPAWN_PROMPT}]}));
    let frames = kin.frames_to(id);
    assert_eq!(frames.last().unwrap()["result"]["stopReason"], "end_turn", "{frames:#?}");
    for frame in &frames {
        if let Some((session, u)) = update(frame) {
            assert_eq!(session, parent, "only the parent's updates: {frame}");
            let kind = u["sessionUpdate"].as_str().unwrap_or("");
            assert!(!["subagent_update", "session_message", "session_message_chunk"].contains(&kind), "{frame}");
        }
        assert!(!frame.to_string().contains(r#""type":"session""#), "no session links: {frame}");
    }
    let calls: Vec<&Value> =
        updates(&frames, &parent, "tool_call_update").into_iter().filter(|u| u["toolCallId"] == "call_1").collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["content"], json!([{"type": "content", "content": {"type": "text", "text": "CHILD_OK"}}]));
    // The usage reaches a client without the capability too, with the route's window.
    let usage = updates(&frames, &parent, "usage_update");
    assert_eq!(usage.len(), 2, "one per model call of the parent");
    assert_eq!(usage[0]["size"], 1_000_000);
    // A child id is still refused for anything but cancel.
    let store = kin::testkit::session::SessionStore::new(&sessions);
    let child = store.list().into_iter().find(|s| s.header.parent_session.is_some()).unwrap().header.id;
    let prompt = json!({"sessionId": child, "prompt": [{"type": "text", "text": "hi"}]});
    refused(&kin.call("session/prompt", prompt, WAIT), &child);
    kin.exit();
}

#[test]
fn a_reloaded_parent_replays_and_reannounces_its_continuable_child() {
    let (_tmp, cwd, sessions) = dirs();
    let replay = scenario("continuable-followups");
    let mut kin = replaying(&sessions, &replay, &cwd);
    initialize(&mut kin, true);
    let parent = kin.new_session(&cwd);
    let id = kin.request(
        "session/prompt",
        json!({"sessionId": parent, "prompt": [{"type": "text", "text": FOLLOWUPS_PROMPT}]}),
    );
    let mut frames = kin.frames_to(id);
    assert_eq!(frames.last().unwrap()["result"]["stopReason"], "end_turn", "{frames:#?}");
    std::fs::write(cwd.join(".parent-done"), b"").unwrap();
    wait_for(&cwd.join(".dsh-snapshot-subagent-settled"));
    // A response is written after every notification queued before it.
    let fence = kin.request("session/list", json!({}));
    frames.extend(kin.frames_to(fence));

    let (child, index) = first_child(&frames, &parent);
    nothing_names_before(&frames, &child, index);
    let link = json!({"type": "session", "sessionId": child});
    let start = updates(&frames, &parent, "tool_call_update").into_iter().rfind(|u| u["toolCallId"] == "c1").unwrap();
    assert_eq!(start["status"], "completed");
    assert_eq!(start["content"][1], link);
    assert_eq!(text(&frames, &child, "agent_message_chunk"), "CHILD_OKSECOND_OKTHIRD_OK");
    let states = announcements(&frames, &parent, &child);
    assert_eq!(state_names(&states), ["running", "idle", "running", "idle", "running", "idle"]);
    // send_message in both transcripts.
    let incoming: Vec<&Value> = updates(&frames, &child, "session_message")
        .into_iter()
        .filter(|m| m["content"][0]["text"] == "Now reply SECOND_OK.")
        .collect();
    assert_eq!(incoming.len(), 1, "{frames:#?}");
    assert_eq!(incoming[0]["senderSessionId"], parent.as_str());
    let outgoing = updates(&frames, &parent, "session_message")
        .into_iter()
        .find(|m| m["messageId"] == incoming[0]["senderMessageId"])
        .expect("the outgoing view in the parent's transcript");
    assert_eq!(outgoing["recipientSessionId"], child.as_str());
    assert_eq!(outgoing["recipientMessageId"], incoming[0]["messageId"]);
    kin.exit();

    // After a restart, loading the parent replays the child and re-announces it, idle.
    let mut kin = replaying(&sessions, &replay, &cwd);
    initialize(&mut kin, true);
    // The frames up to the load response, and the notifications after it.
    let load = |kin: &mut Peer| -> (Vec<Value>, Vec<Value>) {
        let id = kin.request("session/load", json!({"sessionId": parent, "cwd": cwd, "mcpServers": []}));
        let before = kin.frames_to(id);
        let fence = kin.request("session/list", json!({}));
        let mut after = kin.frames_to(fence);
        after.pop();
        (before, after)
    };
    let (before, after) = load(&mut kin);
    assert!(before.last().unwrap()["result"]["modes"].is_object(), "{before:#?}");
    let (announced, index) = first_child(&before, &parent);
    assert_eq!(announced, child);
    let traffic = before.iter().position(|f| update(f).is_some_and(|(s, _)| s == child)).expect("the child replayed");
    assert!(index < traffic, "announced before the child's replay");
    let replayed = announcements(&before, &parent, &child);
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0]["title"], "Reply with CHILD_OK");
    assert_eq!(replayed[0]["description"], "Reply with exactly CHILD_OK.");
    assert_eq!(replayed[0]["capabilities"], json!({"cancel": {}}));
    assert_eq!(replayed[0]["state"], json!({"state": "idle", "stopReason": "end_turn"}));
    assert_eq!(text(&before, &child, "agent_message_chunk"), "CHILD_OKSECOND_OKTHIRD_OK");
    let again = announcements(&after, &parent, &child);
    assert_eq!(again.len(), 1, "re-announced after the response: {after:#?}");
    assert_eq!(again[0], replayed[0]);

    // Repeated loads give the same answer.
    let strip = |frames: &[Value]| -> Vec<Value> {
        frames
            .iter()
            .map(|f| {
                let mut f = f.clone();
                if let Some(map) = f.as_object_mut() {
                    map.remove("id");
                }
                f
            })
            .collect()
    };
    let (before_again, after_again) = load(&mut kin);
    assert_eq!(strip(&before_again), strip(&before));
    assert_eq!(after_again, after);

    // Close frees the parent; resume reattaches it without replay and re-announces the child.
    assert_eq!(kin.call("session/close", json!({"sessionId": parent}), WAIT)["result"], json!({}));
    let prompt = json!({"sessionId": parent, "prompt": [{"type": "text", "text": "hi"}]});
    assert_eq!(kin.call("session/prompt", prompt, WAIT)["error"]["code"], -32002);
    let id = kin.request("session/resume", json!({"sessionId": parent, "cwd": cwd}));
    let resumed = kin.frames_to(id);
    assert!(resumed.last().unwrap()["result"]["modes"].is_object(), "{resumed:#?}");
    // (The context meter is not history: it is shown as the log leaves it.)
    let replayed = |f: &Value| update(f).is_some_and(|(_, u)| u["sessionUpdate"] != "usage_update");
    assert!(!resumed.iter().any(replayed), "no replay before the resume response: {resumed:#?}");
    let fence = kin.request("session/list", json!({}));
    let after = kin.frames_to(fence);
    assert_eq!(announcements(&after, &parent, &child).len(), 1, "{after:#?}");

    // Fork: a new top-level session seeded with the parent's completed turns.
    let forked = kin.call("session/fork", json!({"sessionId": parent, "cwd": cwd}), WAIT);
    let fork = forked["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{forked}")).to_string();
    assert!(fork != parent && fork != child);
    let store = kin::testkit::session::SessionStore::new(&sessions);
    let seeded = store.inspect(&fork).unwrap();
    assert!(seeded.header.parent_session.is_none());
    assert!(seeded.events.iter().any(|e| e.kind == "session/end-seed"));
    let listed = kin.call("session/list", json!({}), WAIT);
    assert_eq!(listed["result"]["sessions"].as_array().unwrap().len(), 2, "{listed}");
    kin.exit();
}

/// A stored copy of `child`'s log under `id`, created at `created_at`, with `extra` lines
/// appended (e.g. a second descriptor, which makes it corrupt).
fn copy_child(sessions: &Path, child: &str, id: &str, created_at: u64, extra: &[Value]) {
    let store = kin::testkit::session::SessionStore::new(sessions);
    let from = store.locate(child).unwrap().unwrap();
    let text = std::fs::read_to_string(&from).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut header: Value = serde_json::from_str(&lines[0]).unwrap();
    header["id"] = json!(id);
    header["createdAt"] = json!(created_at);
    lines[0] = header.to_string();
    let first = lines.len() as u64 - 1;
    for (seq, line) in (first..).zip(extra) {
        let mut line = line.clone();
        line["seq"] = json!(seq);
        lines.push(line.to_string());
    }
    let cwd = header["cwd"].as_str().map(str::to_string);
    let to = kin::testkit::session::layout::log_path(sessions, cwd.as_deref(), id);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::write(to, lines.join("\n") + "\n").unwrap();
}

#[test]
fn the_reloaded_tree_is_the_catalogs_listing_with_its_diagnostics() {
    let (_tmp, cwd, sessions) = dirs();
    let replay = scenario("continuable-followups");
    let mut kin = replaying(&sessions, &replay, &cwd);
    initialize(&mut kin, true);
    let parent = kin.new_session(&cwd);
    let id = kin.request(
        "session/prompt",
        json!({"sessionId": parent, "prompt": [{"type": "text", "text": FOLLOWUPS_PROMPT}]}),
    );
    let frames = kin.frames_to(id);
    assert_eq!(frames.last().unwrap()["result"]["stopReason"], "end_turn", "{frames:#?}");
    std::fs::write(cwd.join(".parent-done"), b"").unwrap();
    wait_for(&cwd.join(".dsh-snapshot-subagent-settled"));
    let (child, _) = first_child(&frames, &parent);
    kin.exit();

    // Siblings of the child: one with a second descriptor (corrupt), one whose descriptor has
    // another version (unsupported), and one with no descriptor of its own (an ordinary child
    // session: omitted without a word). Created before the child, so they list first.
    let descriptor = |version: u64| json!({"type": "subagent/descriptor", "time": 0, "data": {"version": version, "mode": "one-shot", "provider": "spawn"}});
    let corrupt = "00000000-0000-4000-8000-00000000c001";
    let unsupported = "00000000-0000-4000-8000-00000000c002";
    copy_child(&sessions, &child, corrupt, 1, &[descriptor(2)]);
    copy_child(&sessions, &child, unsupported, 2, &[]);
    let store = kin::testkit::session::SessionStore::new(&sessions);
    let path = store.locate(unsupported).unwrap().unwrap();
    let text = std::fs::read_to_string(&path).unwrap().replace("\"version\":2", "\"version\":3");
    std::fs::write(&path, text).unwrap();
    let plain = "00000000-0000-4000-8000-00000000c003";
    let plain_path = kin::testkit::session::layout::log_path(&sessions, cwd.to_str(), plain);
    std::fs::create_dir_all(plain_path.parent().unwrap()).unwrap();
    let header = json!({"type": "session", "version": 0, "id": plain, "createdAt": 3, "cwd": cwd, "parentSession": parent, "delegationDepth": 1});
    std::fs::write(&plain_path, format!("{header}\n")).unwrap();

    // What the catalog lists for the parent.
    let query = kin::testkit::session::query::SessionQuery::new(kin::testkit::session::query::StoreSource::new(
        kin::testkit::session::SessionStore::new(&sessions),
        |_: &str| false,
    ));
    let listed = kin::testkit::subagent::catalog::list_children(Some(&query), &parent, &Default::default()).unwrap();
    let listed: Vec<(String, Option<&str>)> = listed
        .iter()
        .map(|e| match e {
            kin::testkit::subagent::catalog::ListEntry::Child { id, .. } => (id.clone(), None),
            kin::testkit::subagent::catalog::ListEntry::Diagnostic { id, reason } => {
                (id.clone(), Some(reason.as_str()))
            }
        })
        .collect();
    assert_eq!(
        listed,
        [(corrupt.to_string(), Some("corrupt")), (unsupported.to_string(), Some("unsupported")), (child.clone(), None)]
    );

    // The tree on load announces exactly those, in that order: the diagnostics as such.
    let mut kin = replaying(&sessions, &replay, &cwd);
    initialize(&mut kin, true);
    let id = kin.request("session/load", json!({"sessionId": parent, "cwd": cwd, "mcpServers": []}));
    let before = kin.frames_to(id);
    let announced: Vec<&Value> = updates(&before, &parent, "subagent_update");
    let ids: Vec<&str> = announced.iter().map(|u| u["sessionId"].as_str().unwrap()).collect();
    assert_eq!(ids, [corrupt, unsupported, child.as_str()], "{before:#?}");
    assert_eq!(announced[0]["title"], "subagent session corrupt");
    assert_eq!(announced[1]["title"], "subagent session unsupported");
    assert_eq!(announced[0]["state"]["stopReason"], "error");
    let error = &announced[0]["state"]["error"];
    assert_eq!(
        error["message"],
        format!("subagent session {corrupt} is corrupt; its history is not shown"),
        "{announced:#?}"
    );
    assert!(before.iter().all(|f| update(f).is_none_or(|(s, _)| s != corrupt && s != plain)), "{before:#?}");
    kin.exit();
}

/// A replay log of chunk groups `(turn, step, chunks)`, optionally led by the session's prompt.
fn script(path: &Path, prompt: Option<&str>, groups: &[(u64, u64, Vec<Value>)]) {
    let mut lines = vec![json!({"type":"session","version":0,"id":"{{sessionId}}","createdAt":u64::from(prompt.is_some()),"delegationDepth":0}).to_string()];
    let mut seq = 0;
    if let Some(prompt) = prompt {
        lines.push(json!({"type":"user/message","seq":0,"time":0,"data":{"content":[{"type":"text","text":prompt}],"source":{"kind":"user"},"role":"user","id":"m"},"surfaceOp":"append"}).to_string());
        seq = 1;
    }
    for (turn, step, chunks) in groups {
        for chunk in chunks {
            lines.push(
                json!({"type":"assistant/chunk","seq":seq,"time":0,"data":{"turn":turn,"step":step,"chunk":chunk}})
                    .to_string(),
            );
            seq += 1;
        }
    }
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn call_chunks(id: &str, name: &str, args: Value) -> Vec<Value> {
    let args = args.to_string();
    vec![
        json!({"type":"block-start","index":0,"blockType":"tool-call"}),
        json!({"type":"tool-call-delta","index":0,"id":id,"name":name,"argumentsDelta":args}),
        json!({"type":"block-end","index":0,"block":{"type":"tool-call","id":id,"name":name,"arguments":args}}),
        json!({"type":"finish","reason":{"kind":"tool-calls"}}),
    ]
}

fn text_chunks(text: &str) -> Vec<Value> {
    vec![
        json!({"type":"block-start","index":0,"blockType":"text"}),
        json!({"type":"text-delta","index":0,"text":text}),
        json!({"type":"block-end","index":0,"block":{"type":"text","text":text}}),
        json!({"type":"finish","reason":{"kind":"stop"}}),
    ]
}

#[test]
fn a_child_waiting_on_permission_is_shown_as_requiring_action() {
    let (_tmp, cwd, sessions) = dirs();
    let replay = cwd.parent().unwrap().join("replay-permission");
    std::fs::create_dir_all(&replay).unwrap();
    script(
        &replay.join("session.jsonl"),
        None,
        &[
            (1, 1, call_chunks("d1", "subagent", json!({"description": "Run it", "prompt": "Run echo hi."}))),
            (1, 2, text_chunks("done")),
        ],
    );
    script(
        &replay.join("session.1.jsonl"),
        Some("Run echo hi."),
        &[
            (1, 1, call_chunks("b1", "bash", json!({"command": "echo hi", "description": "say hi"}))),
            (1, 2, text_chunks("ran")),
        ],
    );
    let mut kin = replaying_in_mode(&sessions, &replay, &cwd, "ask");
    initialize(&mut kin, true);
    let parent = kin.new_session(&cwd);
    let prompt =
        kin.request("session/prompt", json!({"sessionId": parent, "prompt": [{"type": "text", "text": "go"}]}));
    let mut frames = Vec::new();
    loop {
        let frame = kin.frame(WAIT);
        if frame["method"] == "session/request_permission" {
            assert_ne!(frame["params"]["sessionId"], json!(parent), "the request carries the child's session id");
            let answer = json!({"jsonrpc": "2.0", "id": frame["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}});
            frames.push(frame);
            kin.send(answer);
            continue;
        }
        let done = common::is_response(&frame, prompt);
        frames.push(frame);
        if done {
            break;
        }
    }
    assert_eq!(frames.last().unwrap()["result"]["stopReason"], "end_turn");
    let asked = frames.iter().position(|f| f["method"] == "session/request_permission").expect("the child asked");
    let child = frames[asked]["params"]["sessionId"].as_str().unwrap().to_string();
    let states: Vec<(usize, String)> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| {
            f["params"]["sessionId"] == json!(parent)
                && f["params"]["update"]["sessionUpdate"] == "subagent_update"
                && f["params"]["update"]["sessionId"] == json!(child)
        })
        .filter_map(|(i, f)| f["params"]["update"]["state"]["state"].as_str().map(|s| (i, s.to_string())))
        .collect();
    let waiting = states.iter().find(|(_, s)| s == "requires_action").expect("requires_action was sent");
    assert!(waiting.0 < asked, "requires_action comes before the request: {states:?}");
    assert!(states.iter().any(|(i, s)| *i > asked && s == "running"), "running again after the answer: {states:?}");
    kin.exit();
}

#[test]
fn a_childs_tool_calls_show_on_the_delegating_call_only_without_the_tree() {
    // subagent-depth-rejection: the child's own `subagent` call ("Grandchild") is its progress.
    let replay = scenario("subagent-depth-rejection");
    for subagents in [false, true] {
        let (_tmp, cwd, sessions) = dirs();
        let mut command = std::process::Command::new(common::KIN);
        command.args(["acp", "--permission-mode", "bypass", "--config"]).arg(replay.join("kin.toml"));
        command.arg("--sessions").arg(&sessions).arg("--replay").arg(&replay).current_dir(&cwd);
        command.stderr(std::process::Stdio::null());
        let mut kin = spawn(command);
        initialize(&mut kin, subagents);
        let parent = kin.new_session(&cwd);
        let prompt = json!([{"type": "text", "text": "Delegate to a child that delegates again."}]);
        let id = kin.request("session/prompt", json!({"sessionId": parent, "prompt": prompt}));
        let frames = kin.frames_to(id);
        assert_eq!(frames.last().unwrap()["result"]["stopReason"], "end_turn", "{frames:#?}");
        let progress: Vec<&Value> = updates(&frames, &parent, "tool_call_update")
            .into_iter()
            .filter(|u| {
                u["toolCallId"] == "call_1" && u.get("status").is_none() && u["content"][0]["type"] == "content"
            })
            .collect();
        if subagents {
            assert!(progress.is_empty(), "the child's own session shows it: {progress:?}");
        } else {
            assert_eq!(progress.len(), 1, "{frames:#?}");
            assert_eq!(progress[0]["content"][0]["content"]["text"], "Grandchild");
        }
        kin.exit();
    }
}
