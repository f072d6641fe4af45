//! A few tests of the real binary over pipes: stdin EOF mid-turn exits 0 with the log flushed,
//! stdout carries only JSON-RPC, and the `kin sessions` commands read what `kin acp` wrote.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const KIN: &str = env!("CARGO_BIN_EXE_kin");

/// A replay directory whose only model call streams a little text, then hangs.
fn hanging_replay(dir: &Path) {
    let header = json!({"type":"session","version":0,"id":"{{sessionId}}","createdAt":0,"delegationDepth":0});
    std::fs::write(dir.join("session.jsonl"), format!("{header}\n")).unwrap();
    let entry = json!([{"kind":"hang","readyFile":".ready","chunks":[{"type":"block-start","index":0,"blockType":"text"},{"type":"text-delta","index":0,"text":"thinking about it"}]}]);
    std::fs::write(dir.join("replay.override.json"), entry.to_string()).unwrap();
}

struct Kin {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Kin {
    fn start(sessions: &Path, replay: &Path, cwd: &Path) -> Kin {
        let mut child = Command::new(KIN)
            .args(["acp", "--sessions"])
            .arg(sessions)
            .arg("--replay")
            .arg(replay)
            .args(["--config", "/dev/null"])
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Kin { child, lines }
    }

    fn send(&mut self, frame: Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{frame}").unwrap();
        stdin.flush().unwrap();
    }

    /// Reads frames until the response with `id`; every line must be JSON-RPC.
    fn response(&self, id: u64) -> Value {
        loop {
            let line = self.lines.recv_timeout(Duration::from_secs(20)).expect("kin answered in time");
            let frame: Value =
                serde_json::from_str(&line).unwrap_or_else(|_| panic!("stdout carried a non-JSON line: {line}"));
            assert_eq!(frame["jsonrpc"], "2.0", "{line}");
            if frame["id"] == json!(id) && frame.get("method").is_none() {
                return frame;
            }
        }
    }
}

#[test]
fn stdin_eof_mid_turn_exits_zero_with_the_log_flushed() {
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = (tmp.path().join("replay"), tmp.path().join("cwd"), tmp.path().join("sessions"));
    std::fs::create_dir_all(&replay).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    hanging_replay(&replay);
    let mut kin = Kin::start(&sessions, &replay, &cwd);
    kin.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    assert_eq!(kin.response(1)["result"]["agentInfo"]["name"], "kin");
    kin.send(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":cwd,"mcpServers":[]}}));
    let id = kin.response(2)["result"]["sessionId"].as_str().unwrap().to_string();
    kin.send(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"go"}]}}));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cwd.join(".ready").exists() {
        assert!(Instant::now() < deadline, "the turn never started streaming");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(kin.child.stdin.take());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = kin.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "kin did not exit after stdin EOF");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "exit status {status:?}");
    let store = kin::session::SessionStore::new(&sessions);
    let scanned = store.inspect(&id).unwrap();
    assert!(scanned.torn.is_none());
    let last = scanned.events.last().unwrap();
    assert_eq!((last.kind.as_str(), &last.data["reason"]["kind"]), ("turn/end", &json!("disposed")));
    assert!(
        scanned.events.iter().any(|e| e.data["chunk"]["text"] == "thinking about it"),
        "streamed chunks are on disk"
    );
}

#[test]
fn sessions_commands_list_show_and_check_what_acp_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let sessions = tmp.path().join("sessions");
    let store = kin::session::SessionStore::new(&sessions);
    let mut s = store
        .create(kin::session::SessionHeader::new("cccccccc-0000-4000-8000-000000000001", 5, Some("/proj".into())))
        .unwrap();
    s.append("turn/start", json!({"turn":1,"trigger":{"kind":"message","source":{"kind":"user"}}}));
    s.append_surface(
        "user/message",
        json!({"content":[{"type":"text","text":"hello there"}],"source":{"kind":"user"},"role":"user","id":"m"}),
        None,
    );
    s.flush().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(KIN)
            .args(args)
            .arg("--sessions")
            .arg(&sessions)
            .arg("--config")
            .arg("/dev/null")
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (ok, listed) = run(&["sessions", "list"]);
    assert!(ok && listed.contains("cccccccc-0000-4000-8000-000000000001") && listed.contains("/proj"), "{listed}");
    let (ok, shown) = run(&["sessions", "show", "cccccccc-0000-4000-8000-000000000001"]);
    assert!(ok && shown.contains("user: hello there"), "{shown}");
    let (ok, checked) = run(&["sessions", "check"]);
    assert!(ok && checked.contains("last turn interrupted"), "{checked}");
    // A torn tail is reported by file and line, and the file is left as it was.
    let path = store.locate("cccccccc-0000-4000-8000-000000000001").unwrap().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(b"{\"type\":\"turn/e");
    std::fs::write(&path, &bytes).unwrap();
    let (ok, checked) = run(&["sessions", "check", "cccccccc-0000-4000-8000-000000000001"]);
    assert!(!ok && checked.contains("torn") && checked.contains(":4:"), "{checked}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "check changes nothing");
}

#[test]
fn a_bad_config_file_is_a_clear_startup_error() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.toml");
    std::fs::write(&config, "[agent]\nmax_stepz = 3\n").unwrap();
    let out = Command::new(KIN).args(["acp", "--config"]).arg(&config).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing on the protocol channel");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&config.display().to_string()) && err.contains("max_stepz"), "{err}");
}

#[test]
fn a_session_written_by_one_kin_is_refused_by_another() {
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = (tmp.path().join("replay"), tmp.path().join("cwd"), tmp.path().join("sessions"));
    std::fs::create_dir_all(&replay).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    hanging_replay(&replay);
    let mut first = Kin::start(&sessions, &replay, &cwd);
    first.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    first.response(1);
    first.send(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":cwd,"mcpServers":[]}}));
    let id = first.response(2)["result"]["sessionId"].as_str().unwrap().to_string();
    let mut second = Kin::start(&sessions, &replay, &cwd);
    second.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    second.response(1);
    second.send(
        json!({"jsonrpc":"2.0","id":2,"method":"session/load","params":{"sessionId":id,"cwd":cwd,"mcpServers":[]}}),
    );
    let refused = second.response(2);
    let message = refused["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("being written by another kin process"), "{refused}");
    // Once the first kin exits, the second may take the session over.
    drop(first.child.stdin.take());
    // Exit 3: its replay call was (deliberately) never made.
    assert_eq!(first.child.wait().unwrap().code(), Some(3));
    second.send(
        json!({"jsonrpc":"2.0","id":3,"method":"session/load","params":{"sessionId":id,"cwd":cwd,"mcpServers":[]}}),
    );
    assert!(second.response(3).get("result").is_some());
    drop(second.child.stdin.take());
    assert!(second.child.wait().is_ok());
}

/// A replay directory whose model answers "fine" `n` times.
fn answering_replay(dir: &Path, n: usize) {
    let header = json!({"type":"session","version":0,"id":"{{sessionId}}","createdAt":0,"delegationDepth":0});
    std::fs::write(dir.join("session.jsonl"), format!("{header}\n")).unwrap();
    let answer = json!({"kind":"chunks","chunks":[{"type":"block-start","index":0,"blockType":"text"},{"type":"text-delta","index":0,"text":"fine"},{"type":"block-end","index":0,"block":{"type":"text","text":"fine"}},{"type":"finish","reason":{"kind":"stop"}}]});
    std::fs::write(dir.join("replay.override.json"), json!(vec![answer; n]).to_string()).unwrap();
}

impl Kin {
    /// `initialize` (id 1) and `session/new` (id 2) in `cwd`; returns the session id.
    fn open_session(&mut self, cwd: &Path) -> String {
        self.send(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}));
        self.response(1);
        self.send(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":cwd,"mcpServers":[]}}));
        self.response(2)["result"]["sessionId"].as_str().unwrap().to_string()
    }

    /// A text prompt with request id `id`; returns its response.
    fn prompt(&mut self, id: u64, session: &str, text: &str) -> Value {
        self.send(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":session,"prompt":[{"type":"text","text":text}]}}));
        self.response(id)
    }
}

/// kin under a file-size limit (`ulimit -f`): appends past it fail like a full disk (EFBIG).
fn start_limited(sessions: &Path, replay: &Path, cwd: &Path, blocks: Option<u32>) -> Kin {
    let limit = blocks.map_or(String::new(), |b| format!("ulimit -f {b}; "));
    let script = format!("trap '' XFSZ; {limit}exec \"$0\" acp --config /dev/null --sessions \"$1\" --replay \"$2\"");
    let mut child = Command::new("sh")
        .args(["-c", &script, KIN])
        .arg(sessions)
        .arg(replay)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Kin { child, lines }
}

#[test]
fn a_full_disk_fails_the_turn_cleanly_and_the_session_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = (tmp.path().join("replay"), tmp.path().join("cwd"), tmp.path().join("sessions"));
    std::fs::create_dir_all(&replay).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    answering_replay(&replay, 3);
    // 64 blocks of 512 bytes: room for the header and a small turn, not for a 100 KB prompt.
    let mut kin = start_limited(&sessions, &replay, &cwd, Some(64));
    let id = kin.open_session(&cwd);
    assert_eq!(kin.prompt(3, &id, "small")["result"]["stopReason"], "end_turn");
    let store = kin::session::SessionStore::new(&sessions);
    let committed = store.inspect(&id).unwrap().events.len();
    kin.send(json!({"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"y".repeat(100_000)}]}}));
    let failed = kin.response(4);
    let message = failed["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("turn failed") && message.contains("could not persist the session log"), "{failed}");
    // The log is back at its last committed length: whole lines, the first turn intact.
    let after = store.inspect(&id).unwrap();
    assert!(after.torn.is_none(), "no half line was left behind");
    assert_eq!(after.events.len(), committed);
    drop(kin.child.stdin.take());
    let _ = kin.child.wait();
    // Space returns: a kin without the limit loads the session and carries on.
    let mut kin = start_limited(&sessions, &replay, &cwd, None);
    kin.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    kin.response(1);
    kin.send(
        json!({"jsonrpc":"2.0","id":2,"method":"session/load","params":{"sessionId":id,"cwd":cwd,"mcpServers":[]}}),
    );
    assert!(kin.response(2).get("result").is_some());
    kin.send(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"again"}]}}));
    assert_eq!(kin.response(3)["result"]["stopReason"], "end_turn");
    drop(kin.child.stdin.take());
    let _ = kin.child.wait();
}

/// Unmounts the tiny tmpfs when the test ends, however it ends.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn enospc_on_a_full_tmpfs_fails_the_turn_and_the_session_resumes_when_space_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = (tmp.path().join("replay"), tmp.path().join("cwd"), tmp.path().join("sessions"));
    for dir in [&replay, &cwd, &sessions] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"]).arg(&sessions).status();
    if !mounted.is_ok_and(|s| s.success()) {
        eprintln!("skipping: cannot mount a tmpfs here (needs root); the file-size-limit test covers the same path");
        return;
    }
    let _mount = Mount(sessions.clone());
    answering_replay(&replay, 3);
    let mut kin = start_limited(&sessions, &replay, &cwd, None);
    let id = kin.open_session(&cwd);
    assert_eq!(kin.prompt(3, &id, "small")["result"]["stopReason"], "end_turn");
    let store = kin::session::SessionStore::new(&sessions);
    let committed = store.inspect(&id).unwrap().events.len();
    kin.send(json!({"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"z".repeat(200_000)}]}}));
    let failed = kin.response(4);
    let message = failed["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("could not persist the session log") && message.contains("No space left"), "{failed}");
    let after = store.inspect(&id).unwrap();
    assert!(after.torn.is_none(), "no half line after ENOSPC");
    assert_eq!(after.events.len(), committed, "the log is back at its last committed length");
    // Space returns: the same kin, the same session, carries on; the failed turn lands too.
    let grown = Command::new("mount").args(["-o", "remount,size=8m"]).arg(&sessions).status().unwrap();
    assert!(grown.success());
    kin.send(json!({"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"again"}]}}));
    assert_eq!(kin.response(5)["result"]["stopReason"], "end_turn");
    let healed = store.inspect(&id).unwrap();
    assert!(healed.torn.is_none());
    let ends: Vec<&str> = healed
        .events
        .iter()
        .filter(|e| e.kind == "turn/end")
        .filter_map(|e| e.data["reason"]["kind"].as_str())
        .collect();
    assert_eq!(ends, ["completed", "completed", "completed"], "every turn is on disk, in order");
    drop(kin.child.stdin.take());
    let _ = kin.child.wait();
}
