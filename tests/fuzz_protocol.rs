//! Protocol fuzzing over real pipes: a seeded generator of malformed and hostile JSON-RPC (bad
//! JSON, wrong types, huge strings, deep nesting, unknown methods, ids of every JSON type,
//! requests before initialize, interleaved cancels, frames that are not UTF-8 or longer than the
//! maximum frame size). Each frame comes with the answer it must get — an error with its code
//! and id, a result, or nothing (an ignored notification or response) — and each is checked on
//! its own: a fence request follows every frame, and what arrives before the fence's answer
//! (plus the frame's own answer, if it comes later) must be exactly the expected answer. kin
//! never exits, keeps stdout pure JSON-RPC and still serves a normal session afterwards.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[allow(dead_code)]
mod common;
use common::Peer;

/// The frame limit the fuzzed kin runs with (`--max-frame-bytes`).
const MAX_FRAME: usize = 4 * 1024 * 1024;
const TIMEOUT: Duration = Duration::from_secs(60);

/// What kin must answer to a frame.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    /// An error response with this id and code.
    Error(Value, i64),
    /// A result for this id.
    Result(Value),
    /// Nothing: a notification, or a response to no request of kin's.
    Nothing,
}

/// Ids a JSON-RPC request may carry (the SDK refuses the others with a null id).
fn valid_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64() || id.is_null()
}

/// The id a frame with a method that kin cannot serve is answered with: its own when the client
/// can match it (a string or an integer), else null.
fn matched_id(id: &Value) -> Value {
    if id.is_string() || id.is_i64() { id.clone() } else { Value::Null }
}

/// The answer to a well-formed request to `method` with `id`: refused before `initialize`
/// (unless it is `initialize`), else `after`.
fn request(id: &Value, method: &str, initialized: bool, after: Answer) -> Answer {
    if !valid_id(id) {
        return Answer::Error(Value::Null, -32600);
    }
    if !initialized && method != "initialize" {
        return Answer::Error(id.clone(), -32600);
    }
    after
}

/// The code of a request to `method` whose params do not fit it: -32601 for methods kin does not
/// serve as requests, -32602 for the others.
fn bad_params(method: &str) -> i64 {
    match method {
        "initialize" | "session/new" | "session/prompt" | "session/load" | "session/list" => -32602,
        // A notification sent as a request is refused as such.
        "session/cancel" => -32600,
        "nope/x" | "" => -32601,
        other => panic!("no expectation for method {other:?}"),
    }
}

/// A hostile frame and the answer it must get.
fn hostile(rng: &mut fastrand::Rng, session: &str, initialized: bool) -> (Vec<u8>, Answer) {
    let ids = [json!(1), json!("str-id"), json!(null), json!(1.5), json!(true), json!([1]), json!({"a": 1}), json!(-7)];
    let methods =
        ["initialize", "session/new", "session/prompt", "session/load", "session/cancel", "session/list", "nope/x", ""];
    let id = ids[rng.usize(..ids.len())].clone();
    let method = methods[rng.usize(..methods.len())];
    // The id kin can answer with: the frame's when valid (null stays null), else null.
    let answer_id = if valid_id(&id) { id.clone() } else { Value::Null };
    let (frame, answer) = match rng.u8(..12) {
        0 => ("{not json".to_string(), Answer::Error(Value::Null, -32700)),
        1 => ("[]".to_string(), Answer::Error(Value::Null, -32600)),
        2 => (format!("{}{}", "[".repeat(5000), "]".repeat(5000)), Answer::Error(Value::Null, -32700)),
        3 => (
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": "x".repeat(rng.usize(1..200_000))})
                .to_string(),
            Answer::Error(matched_id(&id), if matched_id(&id).is_null() { -32600 } else { -32602 }),
        ),
        4 => (
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"sessionId": 42, "cwd": [], "prompt": "no"}})
                .to_string(),
            request(&id, method, initialized, Answer::Error(id.clone(), bad_params(method))),
        ),
        5 => (json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}).to_string(), Answer::Nothing),
        6 => (json!({"jsonrpc": "1.0", "id": id, "method": method}).to_string(), Answer::Error(matched_id(&id), -32600)),
        7 => (json!({"jsonrpc": "2.0", "id": id, "result": {"unexpected": true}}).to_string(), Answer::Nothing),
        8 => (
            json!({"jsonrpc": "2.0", "id": id, "method": "session/load", "params": {"sessionId": "../../../etc/passwd\u{0}", "cwd": "/", "mcpServers": []}}).to_string(),
            request(&id, "session/load", initialized, Answer::Error(id.clone(), -32602)),
        ),
        9 => {
            // An image prompt aimed at the session: only session/list takes such params.
            let after = match method {
                "session/list" => Answer::Result(id.clone()),
                other => Answer::Error(id.clone(), bad_params(other)),
            };
            (
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"sessionId": session, "prompt": [{"type": "image", "data": "AA", "mimeType": "image/png"}]}}).to_string(),
                request(&id, method, initialized, after),
            )
        }
        10 => {
            // Not UTF-8: a parse error, with the id when it comes before the bad bytes.
            let head = json!({"jsonrpc": "2.0", "id": id, "method": "session/list"}).to_string();
            let mut frame = head.as_bytes()[..head.len() - 1].to_vec();
            frame.extend_from_slice(b",\"params\":{\"cwd\":\"\xff\xfe\"}}");
            return (frame, Answer::Error(answer_id, -32700));
        }
        _ => {
            // Longer than the limit: refused with the id it starts with, and dropped.
            let size = MAX_FRAME + rng.usize(1..100_000);
            let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"text": "y".repeat(size)}});
            (frame.to_string(), Answer::Error(answer_id, -32600))
        }
    };
    (frame.into_bytes(), answer)
}

/// The fence after frame `n`: `session/list`, refused before `initialize`.
fn fence(n: usize) -> (u64, Value) {
    let id = 1_000_000 + n as u64;
    (id, json!({"jsonrpc": "2.0", "id": id, "method": "session/list", "params": {}}))
}

/// Sends `frame`, then a fence, and returns every response that is not the fence's: those that
/// arrive before the fence's answer, and the frame's own answer if it comes later (handlers that
/// load sessions answer from a task of their own).
fn exchange(kin: &mut Peer, n: usize, frame: &[u8], expected: &Answer) -> Vec<Value> {
    let stdin = kin.child.stdin.as_mut().unwrap();
    std::io::Write::write_all(stdin, frame).unwrap();
    std::io::Write::write_all(stdin, b"\n").unwrap();
    let (fence_id, fence) = fence(n);
    kin.send(fence);
    let mut answers = Vec::new();
    let mut fenced = false;
    let late_id = match expected {
        Answer::Error(id, _) | Answer::Result(id) => Some(id.clone()),
        Answer::Nothing => None,
    };
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let waiting_for_late = late_id.as_ref().is_some_and(|id| !answers.iter().any(|a: &Value| &a["id"] == id));
        if fenced && !waiting_for_late {
            return answers;
        }
        assert!(Instant::now() < deadline, "frame {n}: no complete answer within {TIMEOUT:?}: {answers:?}");
        let frame = kin.frame(TIMEOUT);
        assert_eq!(frame["jsonrpc"], "2.0", "stdout carries only JSON-RPC: {frame}");
        if frame.get("method").is_some() {
            continue;
        }
        if frame["id"] == json!(fence_id) {
            fenced = true;
        } else {
            answers.push(frame);
        }
    }
}

/// Checks what arrived for frame `n` against the answer it must get.
fn check(n: usize, frame: &[u8], expected: &Answer, answers: &[Value]) {
    let shown = String::from_utf8_lossy(&frame[..frame.len().min(160)]).into_owned();
    let got: Vec<Answer> = answers
        .iter()
        .map(|a| match a.get("error") {
            Some(error) => Answer::Error(a["id"].clone(), error["code"].as_i64().unwrap_or(0)),
            None => Answer::Result(a["id"].clone()),
        })
        .collect();
    let want: Vec<Answer> = match expected {
        Answer::Nothing => Vec::new(),
        other => vec![other.clone()],
    };
    assert_eq!(got, want, "frame {n} ({shown}…): {answers:?}");
}

#[test]
fn hostile_json_rpc_gets_exactly_its_answer_and_kin_keeps_serving() {
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
    let mut command = common::acp(&tmp.path().join("sessions"), Some(&replay));
    command.args(["--max-frame-bytes", &MAX_FRAME.to_string()]);
    // Requests of ours take ids from 1001 on, clear of the hostile frames' ids.
    let mut kin = Peer::spawn(&mut command).ids_after(1000);
    let mut n = 0;
    let mut storm = |kin: &mut Peer, rng: &mut fastrand::Rng, session: &str, initialized: bool| {
        for _ in 0..150 {
            let (frame, expected) = hostile(rng, session, initialized);
            let answers = exchange(kin, n, &frame, &expected);
            check(n, &frame, &expected, &answers);
            n += 1;
        }
    };
    // Hostile traffic before initialize, then a real session id to aim at, then more.
    storm(&mut kin, &mut rng, "no-session", false);
    assert!(
        kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), TIMEOUT)["result"].is_object()
    );
    let created = kin.call("session/new", json!({"cwd": tmp.path(), "mcpServers": []}), TIMEOUT);
    let session = created["result"]["sessionId"].as_str().expect("a session after the storm").to_string();
    storm(&mut kin, &mut rng, &session, true);
    // A 10 MB prompt is over the limit: refused with its id and dropped; a 3 MB one is served.
    let prompt = |text: String| json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
    let refused = kin.call("session/prompt", prompt("x".repeat(10 * 1024 * 1024)), TIMEOUT);
    assert_eq!(refused["error"]["code"], -32600, "{:.300}", refused.to_string());
    assert_eq!(refused["error"]["data"]["maxFrameBytes"], MAX_FRAME);
    let answered = kin.call("session/prompt", prompt("x".repeat(3 * 1024 * 1024)), TIMEOUT);
    assert_eq!(answered["result"]["stopReason"], "end_turn", "{:.300}", answered.to_string());
    let listed = kin.call("session/list", json!({}), TIMEOUT);
    assert!(listed["result"]["sessions"].is_array(), "{listed}");
    assert!(kin.child.try_wait().unwrap().is_none(), "kin is still running");
    kin.close_stdin();
    let status = kin.child.wait().unwrap();
    assert!(status.success(), "kin exited normally at EOF, every replayed answer used: {status:?}");
}
