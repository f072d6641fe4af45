//! The file tools against hostile files, in the real binary over pipes with a replayed model:
//! `read` of a huge file with no newline and `grep` over it stay within a bounded peak RSS of the
//! kin process (its `VmHWM`) and say what they cut; a FIFO in the workspace is refused at once
//! (by `read` and `write`) and kin still exits when stdin closes.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use kin::testkit::session::SessionStore;
use serde_json::{Value, json};

#[allow(dead_code)]
mod common;
use common::Peer;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A replay directory whose model calls each tool of `calls` in turn, then answers "done".
fn replay(dir: &Path, calls: &[(&str, Value)]) {
    std::fs::create_dir_all(dir).unwrap();
    let header = json!({"type":"session","version":0,"id":"{{sessionId}}","createdAt":0,"delegationDepth":0});
    std::fs::write(dir.join("session.jsonl"), format!("{header}\n")).unwrap();
    let mut entries: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            let (id, args) = (format!("call-{i}"), args.to_string());
            json!({"kind": "chunks", "chunks": [
                {"type": "block-start", "index": 0, "blockType": "tool-call"},
                {"type": "tool-call-delta", "index": 0, "id": id, "name": name, "argumentsDelta": args},
                {"type": "block-end", "index": 0, "block": {"type": "tool-call", "id": id, "name": name, "arguments": args}},
                {"type": "finish", "reason": {"kind": "tool-calls"}}
            ]})
        })
        .collect();
    entries.push(json!({"kind": "chunks", "chunks": [
        {"type": "block-start", "index": 0, "blockType": "text"},
        {"type": "text-delta", "index": 0, "text": "done"},
        {"type": "block-end", "index": 0, "block": {"type": "text", "text": "done"}},
        {"type": "finish", "reason": {"kind": "stop"}}
    ]}));
    std::fs::write(dir.join("replay.override.json"), Value::Array(entries).to_string()).unwrap();
}

/// Starts kin in `mode`, opens a session in `cwd` and runs one prompt to its end; returns kin
/// (still running) and the session id.
fn run_turn(tmp: &Path, cwd: &Path, mode: &str) -> (Peer, String) {
    let mut command = common::acp(&tmp.join("sessions"), Some(&tmp.join("replay")));
    command.args(["--permission-mode", mode]).current_dir(cwd);
    let mut kin = Peer::spawn(&mut command);
    let init = kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), TIMEOUT);
    assert!(init["result"].is_object(), "{init}");
    let created = kin.call("session/new", json!({"cwd": cwd, "mcpServers": []}), TIMEOUT);
    let id = created["result"]["sessionId"].as_str().expect("a session").to_string();
    let answered =
        kin.call("session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "go"}]}), TIMEOUT);
    assert_eq!(answered["result"]["stopReason"], "end_turn", "{answered}");
    (kin, id)
}

/// The text of each `tool/result` of the session, in order.
fn tool_results(tmp: &Path, id: &str) -> Vec<(bool, String)> {
    let scanned = SessionStore::new(tmp.join("sessions")).inspect(id).unwrap();
    scanned
        .events
        .iter()
        .filter(|e| e.kind == "tool/result")
        .map(|e| {
            let result = &e.data["message"]["content"][0];
            let text = result["content"][0]["text"].as_str().unwrap_or_default().to_string();
            (result["isError"] == true, text)
        })
        .collect()
}

/// The peak resident set of process `pid` in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/PID/status");
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Writes `bytes` (a whole number of MiB) of `x` to `to`, a MiB at a time.
fn write_xs(to: &mut impl Write, bytes: u64) {
    let block = vec![b'x'; 1 << 20];
    for _ in 0..bytes >> 20 {
        to.write_all(&block).unwrap();
    }
}

fn stop(mut kin: Peer) {
    let status = kin.exit();
    assert!(status.success(), "kin exited with {status:?}");
}

#[test]
fn read_and_grep_of_a_huge_single_line_stay_bounded() {
    const SIZE: u64 = 300 * 1024 * 1024;
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let mut big = std::fs::File::create(cwd.join("big.txt")).unwrap();
    write_xs(&mut big, SIZE);
    big.sync_all().unwrap();
    replay(
        &tmp.path().join("replay"),
        &[("read", json!({"file_path": "big.txt"})), ("grep", json!({"pattern": "x{3}", "path": "big.txt"}))],
    );
    let (kin, id) = run_turn(tmp.path(), &cwd, "ask");
    let peak = peak_rss(kin.child.id());
    stop(kin);
    let results = tool_results(tmp.path(), &id);
    let [(false, read), (false, grep)] = &results[..] else { panic!("{results:?}") };
    assert!(read.len() < 10_000, "the read result is {} bytes", read.len());
    assert!(
        read.contains(&format!("1: {}... (line truncated to 2000 chars; it is {SIZE} bytes long)", "x".repeat(2000)))
    );
    assert!(read.contains("(End of file - total 1 lines)"), "{read:.300}");
    assert!(read.contains("Lines longer than 2000 characters were cut. To see more of one, use bash"), "{read:.300}");
    assert!(grep.len() < 2_000, "the grep result is {} bytes", grep.len());
    assert!(grep.contains("big.txt: a line is longer than 8 MiB"), "{grep}");
    // The file is 300 MB; neither tool may hold it (the limit leaves room for a debug build).
    assert!(peak < 120 * 1024 * 1024, "kin peaked at {} MB reading a {} MB line", peak >> 20, SIZE >> 20);
}

/// A session log with 300 MB of damage after its last event (no newline, or garbage up to a
/// newline) loads in bounded memory: the damage is cut as a torn tail without being held.
#[test]
fn a_huge_torn_tail_loads_without_being_held() {
    const SIZE: u64 = 300 * 1024 * 1024;
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    replay(&tmp.path().join("replay"), &[]);
    let (kin, id) = run_turn(tmp.path(), &cwd, "ask");
    stop(kin);
    let log = SessionStore::new(tmp.path().join("sessions")).locate(&id).unwrap().unwrap();
    let clean = std::fs::metadata(&log).unwrap().len();
    for ending in ["", "\n"] {
        let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        write_xs(&mut file, SIZE);
        file.write_all(ending.as_bytes()).unwrap();
        drop(file);
        // A load asks no model: no replay to consume.
        let mut command = common::acp(&tmp.path().join("sessions"), None);
        command.current_dir(&cwd);
        let mut kin = Peer::spawn(&mut command);
        let init = kin.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), TIMEOUT);
        assert!(init["result"].is_object(), "{init}");
        let loaded = kin.call("session/load", json!({"sessionId": id, "cwd": cwd, "mcpServers": []}), TIMEOUT);
        assert!(loaded["result"].is_object(), "{loaded}");
        let peak = peak_rss(kin.child.id());
        stop(kin);
        assert!(peak < 120 * 1024 * 1024, "kin peaked at {} MB loading a log with a 300 MB torn tail", peak >> 20);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), clean, "the torn tail is cut ({ending:?})");
    }
}

#[test]
fn a_fifo_in_the_workspace_is_refused_and_kin_still_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let fifo = cwd.join("pipe");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    replay(
        &tmp.path().join("replay"),
        &[
            ("read", json!({"file_path": "pipe"})),
            ("write", json!({"file_path": "pipe", "content": "x"})),
            ("grep", json!({"pattern": "x", "path": "pipe"})),
        ],
    );
    let (kin, id) = run_turn(tmp.path(), &cwd, "bypass");
    stop(kin);
    let results = tool_results(tmp.path(), &id);
    let [(true, read), (true, write), (false, grep)] = &results[..] else { panic!("{results:?}") };
    let refusal = format!("{} is a FIFO (named pipe), not a regular file", fifo.display());
    assert!(read.contains(&refusal), "{read}");
    assert!(write.contains(&refusal), "{write}");
    assert!(grep.starts_with("No matches"), "{grep}");
}
