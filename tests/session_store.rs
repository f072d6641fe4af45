//! The JSONL store against real files: the format round trip over dsh's recorded logs, torn
//! tails at every byte offset, `inspect` never writing, and crash repair through `load`.

use std::path::{Path, PathBuf};

use kin::testkit::session::layout::log_path;
use kin::testkit::session::scan::scan_bytes;
use kin::testkit::session::{Record, SessionHeader, SessionStore, StoreError};
use serde_json::json;

/// Every recorded log of the dsh fixtures and of our scenarios. Each root must be there and
/// give logs (the dsh one may be skipped, saying so, with `KIN_SKIP_DSH_FIXTURES=1`).
fn fixture_logs() -> Vec<PathBuf> {
    let mut logs = Vec::new();
    let roots = [
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/dsh"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios"),
    ];
    for root in roots {
        if !root.is_dir() && std::env::var("KIN_SKIP_DSH_FIXTURES").is_ok_and(|v| v == "1") {
            eprintln!("SKIPPED: the logs under {} (absent, KIN_SKIP_DSH_FIXTURES=1)", root.display());
            continue;
        }
        let before = logs.len();
        let dirs = std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e} (link ../shared)", root.display()));
        for dir in dirs.flatten() {
            for file in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
                let name = file.file_name().to_string_lossy().into_owned();
                if name.starts_with("session") && name.ends_with(".jsonl") {
                    logs.push(file.path());
                }
            }
        }
        assert!(logs.len() > before, "no recorded session log under {}", root.display());
    }
    logs
}

#[test]
fn every_recorded_log_round_trips_line_for_line() {
    let logs = fixture_logs();
    assert!(logs.len() >= 9, "found only {} logs", logs.len());
    for path in logs {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        let header_line = lines.next().unwrap();
        let header = SessionHeader::parse(header_line).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(serde_json::to_string(&header).unwrap(), header_line, "{}", path.display());
        let mut next_seq = 0;
        for (i, line) in lines.enumerate() {
            let record = Record::parse(line).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 2));
            assert_eq!(record.to_line(), line, "{}:{}", path.display(), i + 2);
            for event in record.into_events() {
                assert_eq!(event.seq, next_seq, "{}:{}", path.display(), i + 2);
                next_seq += 1;
            }
        }
        // The scanner agrees: no torn tail, every event read.
        let scanned = scan_bytes(&path, text.as_bytes()).unwrap();
        assert!(scanned.torn.is_none(), "{}", path.display());
        assert_eq!(scanned.events.len() as u64, next_seq);
    }
}

/// A two-turn session written through the store, closed cleanly.
fn write_session(root: &Path) -> (String, PathBuf) {
    let store = SessionStore::new(root);
    let id = "aaaaaaaa-0000-4000-8000-000000000001".to_string();
    let mut s = store.create(SessionHeader::new(id.clone(), 1, Some("/work/p".into()))).unwrap();
    for turn in 1..=2 {
        s.append("turn/start", json!({"turn": turn, "trigger": {"kind": "message", "source": {"kind": "user"}}}));
        s.append_surface("user/message", json!({"content": [{"type": "text", "text": format!("q{turn}")}], "source": {"kind": "user"}, "role": "user", "id": "m"}), None);
        s.append("step/start", json!({"turn": turn, "step": 1}));
        s.append_surface("assistant/message", json!({"turn": turn, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": "a"}]}}), Some(vec![]));
        s.append("step/end", json!({"turn": turn, "step": 1}));
        s.append("turn/end", json!({"turn": turn, "reason": {"kind": "completed"}}));
    }
    s.flush().unwrap();
    (id, log_path(root, Some("/work/p"), "aaaaaaaa-0000-4000-8000-000000000001"))
}

#[test]
fn truncation_at_every_offset_of_the_last_two_lines_loads_or_reports_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (id, path) = write_session(dir.path());
    let full = std::fs::read(&path).unwrap();
    let text = String::from_utf8(full.clone()).unwrap();
    let line_starts: Vec<usize> = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
    let second_last_start = line_starts[line_starts.len() - 3];
    for cut in second_last_start..full.len() {
        std::fs::write(&path, &full[..cut]).unwrap();
        let store = SessionStore::new(dir.path());
        // inspect reads the valid prefix and changes nothing.
        let inspected = store.inspect(&id).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(std::fs::read(&path).unwrap(), &full[..cut], "inspect wrote at cut {cut}");
        assert!(inspected.committed_bytes <= cut as u64);
        // load repairs: the torn tail is gone, an open turn is closed `interrupted`, seqs contiguous.
        let mut session = store.load(&id).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        let events = session.events().to_vec();
        assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u64));
        assert_eq!(events.last().unwrap().kind, "turn/end", "cut {cut}");
        session.append("after/load", json!({}));
        session.flush().unwrap();
        let after = std::fs::read_to_string(&path).unwrap();
        assert!(after.ends_with('\n'));
        for (n, line) in after.lines().enumerate().skip(1) {
            Record::parse(line).unwrap_or_else(|e| panic!("cut {cut}, line {}: glued or broken: {e}", n + 1));
        }
        let reread = store.inspect(&id).unwrap();
        assert!(reread.torn.is_none());
        assert_eq!(reread.events.last().unwrap().kind, "after/load");
    }
}

#[test]
fn damage_before_the_last_turn_end_is_an_error_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let (id, path) = write_session(dir.path());
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[3] = "{garbage";
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let store = SessionStore::new(dir.path());
    let err = store.load(&id).err().expect("corruption must not load");
    assert!(matches!(err, StoreError::Scan(_)));
    let message = err.to_string();
    assert!(message.contains(&format!("{}:4:", path.display())), "{message}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), lines.join("\n") + "\n", "a failed load writes nothing");
}

#[test]
fn load_closes_a_crashed_turn_with_synthetic_results() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = write_session(dir.path());
    let store = SessionStore::new(dir.path());
    let mut s = store.load(&id).unwrap();
    s.append("turn/start", json!({"turn": 3, "trigger": {"kind": "message", "source": {"kind": "user"}}}));
    s.append("step/start", json!({"turn": 3, "step": 1}));
    let message = json!({"role": "assistant", "content": [{"type": "tool-call", "id": "c1", "name": "bash", "arguments": "{}"}, {"type": "tool-call", "id": "c2", "name": "bash", "arguments": "{}"}]});
    s.append_surface("assistant/message", json!({"turn": 3, "step": 1, "message": message}), Some(vec![]));
    let call_seq =
        s.append("tool/call", json!({"turn": 3, "step": 1, "callId": "c1", "name": "bash", "arguments": "{}"}));
    s.flush().unwrap();
    drop(s); // the "crash": nothing closes the turn
    let loaded = store.load(&id).unwrap();
    let tail: Vec<_> = loaded.events().iter().rev().take(4).rev().collect();
    assert_eq!(tail[0].kind, "tool/result");
    assert_eq!(tail[0].data["error"]["code"], "TOOL_OUTCOME_UNKNOWN");
    assert_eq!(tail[0].source_event_seqs, Some(vec![call_seq]));
    assert_eq!(tail[1].data["error"]["code"], "TOOL_NOT_STARTED");
    assert_eq!(tail[2].kind, "step/end");
    assert_eq!(tail[3].data, json!({"turn": 3, "reason": {"kind": "interrupted"}}));
    // The repair is durable: inspect sees it without repairing anything itself.
    assert_eq!(store.inspect(&id).unwrap().events.len(), loaded.events().len());
    // The model history has a result for every call.
    let messages = loaded.messages();
    assert_eq!(messages.iter().filter(|m| m["content"][0]["type"] == "tool-result").count(), 2);
}

#[test]
fn hostile_ids_never_touch_a_path() {
    let dir = tempfile::tempdir().unwrap();
    let store = SessionStore::new(dir.path());
    for id in ["../../etc/passwd", "..", "a/b", "x\0y"] {
        assert!(matches!(store.load(id), Err(StoreError::InvalidId(_))), "{id:?}");
        assert!(matches!(store.inspect(id), Err(StoreError::InvalidId(_))), "{id:?}");
    }
    assert!(matches!(store.load("never-created"), Err(StoreError::NotFound(_))));
}

#[test]
fn list_reads_headers_and_skips_broken_logs() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = write_session(dir.path());
    let broken = dir.path().join("--x--/broken/session.jsonl");
    std::fs::create_dir_all(broken.parent().unwrap()).unwrap();
    std::fs::write(&broken, "not a header\n").unwrap();
    let listed = SessionStore::new(dir.path()).list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].header.id, id);
}
