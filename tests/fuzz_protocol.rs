//! Protocol fuzzing over real pipes: a seeded generator of malformed and hostile JSON-RPC (bad
//! JSON, wrong types, huge strings, deep nesting, unknown methods, ids of every JSON type,
//! requests before initialize, interleaved cancels). kin must answer or ignore each, never exit,
//! keep stdout pure JSON-RPC, and still serve a normal session afterwards.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

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
    let mut child = Command::new(env!("CARGO_BIN_EXE_kin"))
        .args(["acp", "--config", "/dev/null", "--sessions"])
        .arg(tmp.path().join("sessions"))
        .arg("--replay")
        .arg(&replay)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Hostile traffic before initialize, then a real session id to aim at, then more.
    for _ in 0..150 {
        writeln!(stdin, "{}", hostile(&mut rng, "no-session")).unwrap();
    }
    let mut next = 1000;
    let mut call = |stdin: &mut std::process::ChildStdin, method: &str, params: Value| -> Value {
        next += 1;
        writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": next, "method": method, "params": params})).unwrap();
        loop {
            let line = rx.recv_timeout(Duration::from_secs(60)).expect("kin is still answering");
            let frame: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("non-JSON on stdout: {line}"));
            if frame["id"] == json!(next) && frame.get("method").is_none() {
                return frame;
            }
        }
    };
    assert!(
        call(&mut stdin, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}))["result"].is_object()
    );
    let created = call(&mut stdin, "session/new", json!({"cwd": tmp.path(), "mcpServers": []}));
    let session = created["result"]["sessionId"].as_str().expect("a session after the storm").to_string();
    for _ in 0..150 {
        writeln!(stdin, "{}", hostile(&mut rng, &session)).unwrap();
    }
    // A 10 MB prompt is accepted (or refused cleanly) and the session still answers.
    let huge = "x".repeat(10 * 1024 * 1024);
    let answered =
        call(&mut stdin, "session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": huge}]}));
    assert!(answered.get("result").is_some() || answered.get("error").is_some());
    let listed = call(&mut stdin, "session/list", json!({}));
    assert!(listed["result"]["sessions"].is_array(), "{listed}");
    assert!(child.try_wait().unwrap().is_none(), "kin is still running");
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.code().is_some(), "kin exited normally at EOF: {status:?}");
}
