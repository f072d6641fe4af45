//! Protocol fuzzing over real pipes: a seeded generator of malformed and hostile JSON-RPC (bad
//! JSON, wrong types, huge strings, deep nesting, unknown methods, ids of every JSON type,
//! requests before initialize, interleaved cancels). kin must answer or ignore each, never exit,
//! keep stdout pure JSON-RPC, and still serve a normal session afterwards.

use std::time::Duration;

use serde_json::json;

#[allow(dead_code)]
mod common;
use common::Peer;

fn hostile(rng: &mut fastrand::Rng, session: &str) -> String {
    let ids = [json!(1), json!("str-id"), json!(null), json!(1.5), json!(true), json!([1]), json!({"a": 1}), json!(-7)];
    let methods =
        ["initialize", "session/new", "session/prompt", "session/load", "session/cancel", "session/list", "nope/x", ""];
    let id = ids[rng.usize(..ids.len())].clone();
    let method = methods[rng.usize(..methods.len())];
    match rng.u8(..10) {
        0 => "{not json".to_string(),
        1 => "[]".to_string(),
        2 => format!("{}{}", "[".repeat(5000), "]".repeat(5000)),
        3 => json!({"jsonrpc": "2.0", "id": id, "method": method, "params": "x".repeat(rng.usize(1..200_000))}).to_string(),
        4 => json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"sessionId": 42, "cwd": [], "prompt": "no"}}).to_string(),
        5 => json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}).to_string(),
        6 => json!({"jsonrpc": "1.0", "id": id, "method": method}).to_string(),
        7 => json!({"jsonrpc": "2.0", "id": id, "result": {"unexpected": true}}).to_string(),
        8 => json!({"jsonrpc": "2.0", "id": id, "method": "session/load", "params": {"sessionId": "../../../etc/passwd\u{0}", "cwd": "/", "mcpServers": []}}).to_string(),
        _ => json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"sessionId": session, "prompt": [{"type": "image", "data": "AA", "mimeType": "image/png"}]}}).to_string(),
    }
}

#[test]
fn hostile_json_rpc_never_stops_kin_from_serving() {
    let seed = std::env::var("KIN_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_2026);
    eprintln!("protocol fuzz seed: {seed} (set KIN_FUZZ_SEED to replay)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let tmp = tempfile::tempdir().unwrap();
    let replay = tmp.path().join("replay");
    std::fs::create_dir_all(&replay).unwrap();
    std::fs::write(
        replay.join("session.jsonl"),
        "{\"type\":\"session\",\"version\":0,\"id\":\"{{sessionId}}\",\"createdAt\":0,\"delegationDepth\":0}\n",
    )
    .unwrap();
    let answer = json!([{"kind": "chunks", "chunks": [
        {"type": "block-start", "index": 0, "blockType": "text"},
        {"type": "text-delta", "index": 0, "text": "STILL_SERVING"},
        {"type": "block-end", "index": 0, "block": {"type": "text", "text": "STILL_SERVING"}},
        {"type": "finish", "reason": {"kind": "stop"}}
    ]}]);
    std::fs::write(replay.join("replay.override.json"), answer.to_string()).unwrap();
    // Requests of ours take ids from 1001 on, clear of the hostile frames' ids.
    let mut kin = Peer::spawn(&mut common::acp(&tmp.path().join("sessions"), Some(&replay))).ids_after(1000);
    // Hostile traffic before initialize, then a real session id to aim at, then more.
    for _ in 0..150 {
        kin.write_line(&hostile(&mut rng, "no-session")).unwrap();
    }
    let timeout = Duration::from_secs(60);
    assert!(
        kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), timeout)["result"].is_object()
    );
    let created = kin.call("session/new", json!({"cwd": tmp.path(), "mcpServers": []}), timeout);
    let session = created["result"]["sessionId"].as_str().expect("a session after the storm").to_string();
    for _ in 0..150 {
        kin.write_line(&hostile(&mut rng, &session)).unwrap();
    }
    // A 10 MB prompt is accepted (or refused cleanly) and the session still answers.
    let huge = "x".repeat(10 * 1024 * 1024);
    let answered =
        kin.call("session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": huge}]}), timeout);
    assert!(answered.get("result").is_some() || answered.get("error").is_some());
    let listed = kin.call("session/list", json!({}), timeout);
    assert!(listed["result"]["sessions"].is_array(), "{listed}");
    assert!(kin.child.try_wait().unwrap().is_none(), "kin is still running");
    kin.close_stdin();
    let status = kin.child.wait().unwrap();
    assert!(status.code().is_some(), "kin exited normally at EOF: {status:?}");
}
