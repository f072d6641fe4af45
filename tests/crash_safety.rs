//! Crash safety: kin is killed with SIGKILL at random points while it writes a session, over and
//! over (seeded; the seed is printed). After every kill the log loads, no acknowledged turn (a
//! prompt whose response arrived) is missing, and no line is glued to another.

use std::path::Path;
use std::time::Duration;

use kin::testkit::session::{Record, SessionStore};
use serde_json::{Value, json};

#[allow(dead_code)]
mod common;
use common::Peer;

const KILLS: usize = 200;

fn replay_dir(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("session.jsonl"),
        "{\"type\":\"session\",\"version\":0,\"id\":\"{{sessionId}}\",\"createdAt\":0,\"delegationDepth\":0}\n",
    )
    .unwrap();
    let entry = json!({"kind": "chunks", "chunks": [
        {"type": "block-start", "index": 0, "blockType": "text"},
        {"type": "text-delta", "index": 0, "text": "ok "},
        {"type": "text-delta", "index": 0, "text": "again"},
        {"type": "block-end", "index": 0, "block": {"type": "text", "text": "ok again"}},
        {"type": "finish", "reason": {"kind": "stop"}}
    ]});
    let entries: Vec<Value> = (0..64).map(|_| entry.clone()).collect();
    std::fs::write(dir.join("replay.override.json"), Value::Array(entries).to_string()).unwrap();
}

#[test]
fn sigkill_at_random_points_loses_nothing_acknowledged() {
    let seed: u64 = std::env::var("KIN_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xc0ffee);
    eprintln!("crash-safety seed: {seed} (set KIN_CRASH_SEED to replay); {KILLS} kills");
    let mut rng = fastrand::Rng::with_seed(seed);
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = (tmp.path().join("replay"), tmp.path().join("cwd"), tmp.path().join("sessions"));
    replay_dir(&replay);
    std::fs::create_dir_all(&cwd).unwrap();
    let store = SessionStore::new(&sessions);
    let mut session: Option<String> = None;
    let mut acknowledged = 0usize;
    let mut killed_mid_turn = 0usize;
    for kill in 0..KILLS {
        let mut kin = Peer::spawn(&mut common::acp(&sessions, Some(&replay)));
        // Writes may fail once kin is killed; that is expected here.
        let send = |kin: &mut Peer, id: u64, method: &str, params: Value| {
            let _ = kin.write_line(&common::request(id, method, params).to_string());
        };
        send(&mut kin, 1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
        kin.response_within(1, Duration::from_secs(20)).expect("initialize");
        let id = match &session {
            None => {
                send(&mut kin, 2, "session/new", json!({"cwd": cwd, "mcpServers": []}));
                let id = kin.response_within(2, Duration::from_secs(20)).expect("session/new")["result"]["sessionId"]
                    .as_str()
                    .unwrap()
                    .to_string();
                session = Some(id.clone());
                id
            }
            Some(id) => {
                send(&mut kin, 2, "session/load", json!({"sessionId": id, "cwd": cwd, "mcpServers": []}));
                let loaded = kin.response_within(2, Duration::from_secs(20)).expect("session/load");
                assert!(loaded.get("result").is_some(), "kill {kill}: the session did not load: {loaded}");
                id.clone()
            }
        };
        // A few prompts, one at a time (kin refuses a second prompt while one is in flight).
        // The first `awaited` are answered before the next is sent: the kill point is fenced by
        // their responses, so a slow machine moves it in time but not in order. If `awaited` is
        // short of `prompts`, one more prompt is sent and the kill lands while it runs (maybe
        // mid-write), after a random short wait in which its answer counts too.
        let prompts = rng.u64(1..4);
        let awaited = rng.u64(0..=prompts);
        let prompt = |kin: &mut Peer, n: u64| {
            let text = format!("p{kill}.{n}");
            send(kin, 10 + n, "session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": text}]}));
        };
        let answered = |frame: Value| assert_eq!(frame["result"]["stopReason"], "end_turn", "kill {kill}: {frame}");
        for n in 0..awaited {
            prompt(&mut kin, n);
            answered(kin.response_within(10 + n, Duration::from_secs(20)).expect("an awaited prompt is answered"));
            acknowledged += 1;
        }
        let grace = Duration::from_micros(rng.u64(0..3_000));
        if awaited < prompts {
            prompt(&mut kin, awaited);
            match kin.response_within(10 + awaited, grace) {
                Some(frame) => {
                    answered(frame);
                    acknowledged += 1;
                }
                None => killed_mid_turn += 1,
            }
        } else {
            // Every prompt answered: the kill lands at a random point after the last answer
            // (kin may still be writing what follows a turn); the wait is the randomness, no
            // event is missed by it.
            std::thread::sleep(grace);
        }
        kin.child.kill().unwrap();
        kin.child.wait().unwrap();
        // Every kill leaves a log that reads, whole lines only, with every acknowledged turn.
        let scanned = store.inspect(&id).unwrap_or_else(|e| panic!("kill {kill}: {e}"));
        let path = store.locate(&id).unwrap().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate().skip(1).take(scanned.events.len()) {
            assert!(Record::parse(line).is_ok(), "kill {kill}: line {} is glued or broken: {line}", n + 1);
        }
        let completed =
            scanned.events.iter().filter(|e| e.kind == "turn/end" && e.data["reason"]["kind"] == "completed").count();
        assert!(
            completed >= acknowledged,
            "kill {kill}: {acknowledged} turns acknowledged but {completed} completed on disk"
        );
    }
    eprintln!("{acknowledged} turns acknowledged across {KILLS} kills, {killed_mid_turn} kills with a turn unanswered");
    assert!(acknowledged >= 10, "the kills should land after acknowledgements");
    assert!(killed_mid_turn >= 10, "the kills should land before acknowledgements");
    let log = store.load(session.as_deref().unwrap()).expect("the final log loads (repairing)");
    assert!(log.events().len() > KILLS, "the session grew across {KILLS} kills");
}
