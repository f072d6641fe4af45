//! A few tests of the real binary over pipes: stdin EOF mid-turn exits 0 with the log flushed,
//! stdout carries only JSON-RPC, and the `kin sessions` commands read what `kin acp` wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

#[allow(dead_code)]
mod common;
use common::{KIN, Peer};

/// A replay directory whose only model call streams a little text, then hangs.
fn hanging_replay(dir: &Path) {
    let header = json!({"type":"session","version":0,"id":"{{sessionId}}","createdAt":0,"delegationDepth":0});
    std::fs::write(dir.join("session.jsonl"), format!("{header}\n")).unwrap();
    let entry = json!([{"kind":"hang","readyFile":".ready","chunks":[{"type":"block-start","index":0,"blockType":"text"},{"type":"text-delta","index":0,"text":"thinking about it"}]}]);
    std::fs::write(dir.join("replay.override.json"), entry.to_string()).unwrap();
}

/// The replay, working and sessions directories of a test under `tmp`; the first two are made.
fn scratch(tmp: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (replay, cwd, sessions) = (tmp.join("replay"), tmp.join("cwd"), tmp.join("sessions"));
    std::fs::create_dir_all(&replay).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    (replay, cwd, sessions)
}

fn start(sessions: &Path, replay: &Path, cwd: &Path) -> Peer {
    Peer::spawn(common::acp(sessions, Some(replay)).current_dir(cwd))
}

/// Reads frames until the response with `id`; every line must be JSON-RPC.
fn response(kin: &Peer, id: u64) -> Value {
    kin.response(id, Duration::from_secs(20), |frame| assert_eq!(frame["jsonrpc"], "2.0", "{frame}"))
}

/// A kin under `tmp` whose one session is mid-turn (its model call streamed a little and hangs):
/// kin, its sessions directory, the session id and the prompt's request id.
fn mid_turn(tmp: &Path) -> (Peer, PathBuf, String, u64) {
    let (replay, cwd, sessions) = scratch(tmp);
    hanging_replay(&replay);
    let mut kin = start(&sessions, &replay, &cwd);
    kin.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    assert_eq!(response(&kin, 1)["result"]["agentInfo"]["name"], "kin");
    kin.send(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":cwd,"mcpServers":[]}}));
    let id = response(&kin, 2)["result"]["sessionId"].as_str().unwrap().to_string();
    kin.send(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"go"}]}}));
    common::until_blocking("the turn to start streaming", || cwd.join(".ready").exists());
    (kin, sessions, id, 3)
}

#[test]
fn stdin_eof_mid_turn_exits_zero_with_the_log_flushed() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut kin, sessions, id, _) = mid_turn(tmp.path());
    let status = kin.exit();
    assert!(status.success(), "exit status {status:?}");
    let store = kin::testkit::session::SessionStore::new(&sessions);
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
    let store = kin::testkit::session::SessionStore::new(&sessions);
    let mut s = store
        .create(kin::testkit::session::SessionHeader::new(
            "cccccccc-0000-4000-8000-000000000001",
            5,
            Some("/proj".into()),
        ))
        .unwrap();
    s.append("turn/start", json!({"turn":1,"trigger":{"kind":"message","source":{"kind":"user"}}}));
    s.append_surface(
        "user/message",
        json!({"content":[{"type":"text","text":"hello there"}],"source":{"kind":"user"},"role":"user","id":"m"}),
        None,
    );
    s.append("session/title", json!({"title": "hello there", "messageSeqs": [1], "source": {"kind": "fallback"}}));
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
    assert!(listed.trim_end().ends_with("/proj  hello there"), "the title ends the line: {listed}");
    // `--cwd` keeps the sessions of one directory; a relative one is taken from the current
    // directory, as `kin run --cwd` takes it.
    let in_dir = |cwd: &str, from: &str| {
        let out = Command::new(KIN)
            .current_dir(from)
            .args(["sessions", "list", "--cwd", cwd, "--config", "/dev/null", "--sessions"])
            .arg(&sessions)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).contains("cccccccc-0000-4000-8000-000000000001")
    };
    assert!(in_dir("/proj", "/") && in_dir("proj", "/") && in_dir("./proj", "/"), "the session in /proj");
    assert!(!in_dir("/elsewhere", "/") && !in_dir("proj", "/tmp"), "no session there");
    // The title is kept in the catalog index beside the sessions directory; a newer one is read
    // from the log, not taken from the index.
    let index = kin::testkit::session::catalog_index::path(&sessions).unwrap();
    let indexed = std::fs::read_to_string(&index).unwrap();
    assert!(indexed.contains(r#""title":{"text":"hello there"}"#), "{indexed}");
    s.append("session/title", json!({"title": "hello again", "messageSeqs": [1], "source": {"kind": "fallback"}}));
    s.flush().unwrap();
    let (ok, listed) = run(&["sessions", "list"]);
    assert!(ok && listed.trim_end().ends_with("/proj  hello again"), "{listed}");
    assert!(std::fs::read_to_string(&index).unwrap().contains(r#""title":{"text":"hello again"}"#));
    let (ok, shown) = run(&["sessions", "show", "cccccccc-0000-4000-8000-000000000001"]);
    assert!(ok && shown.contains("user: hello there") && shown.contains("title: hello there (fallback)"), "{shown}");
    // This test's writer still holds the log, mid-turn: check says so, not "interrupted".
    let (ok, checked) = run(&["sessions", "check"]);
    assert!(ok && checked.contains("(open in a kin process, which is writing it)"), "{checked}");
    drop(s);
    let (ok, checked) = run(&["sessions", "check"]);
    assert!(ok && checked.contains("last turn interrupted"), "{checked}");
    // A torn tail is reported by file and line, and the file is left as it was.
    let path = store.locate("cccccccc-0000-4000-8000-000000000001").unwrap().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(b"{\"type\":\"turn/e");
    std::fs::write(&path, &bytes).unwrap();
    let (ok, checked) = run(&["sessions", "check", "cccccccc-0000-4000-8000-000000000001"]);
    assert!(!ok && checked.contains("torn") && checked.contains(":6:"), "{checked}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "check changes nothing");
}

/// `kin sessions check` says what it could not check, and holds a log to the id of the directory
/// it is filed under, as a load does; an id no session could have is bad usage.
#[test]
fn sessions_check_reports_what_it_cannot_read_and_a_header_filed_under_another_id() {
    let tmp = tempfile::tempdir().unwrap();
    let kin = |sessions: &Path, args: &[&str]| {
        let out = Command::new(KIN)
            .args(args)
            .arg("--sessions")
            .arg(sessions)
            .args(["--config", "/dev/null"])
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), text)
    };
    let missing = tmp.path().join("missing");
    let (code, said) = kin(&missing, &["sessions", "check"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("no session logs under"), "{said}");
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let (code, said) = kin(&file, &["sessions", "check"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("cannot read the sessions directory"), "{said}");
    let sessions = tmp.path().join("sessions");
    let store = kin::testkit::session::SessionStore::new(&sessions);
    let id = "dddddddd-0000-4000-8000-000000000001";
    store.create(kin::testkit::session::SessionHeader::new(id, 1, Some("/proj".into()))).unwrap().flush().unwrap();
    let path = store.locate(id).unwrap().unwrap();
    let moved = path.parent().unwrap().with_file_name("other-id");
    std::fs::rename(path.parent().unwrap(), &moved).unwrap();
    let (code, said) = kin(&sessions, &["sessions", "check"]);
    assert_eq!(code, Some(1), "{said}");
    let misfiled = format!(
        ":1: corrupt session log: header names session \"{id}\", not the one its directory \"other-id\" is for"
    );
    assert!(said.contains(&misfiled), "{said}");
    let (_, listed) = kin(&sessions, &["sessions", "list"]);
    assert!(
        !listed.lines().any(|line| line.starts_with(id)),
        "a log filed under another id is not listed under an id nothing opens: {listed}"
    );
    for bad in ["../../x", "", "a/b"] {
        let (code, said) = kin(&sessions, &["sessions", "show", bad]);
        assert_eq!(code, Some(2), "{bad:?}: {said}");
    }
}

const LIST_WAIT: Duration = Duration::from_secs(30);

/// A `kin acp`, initialized, over a sessions directory (in the returned temp dir) holding one
/// top-level session `id` in `/proj`, with `title` if given.
fn acp_over_one_session(id: &str, title: Option<&str>) -> (tempfile::TempDir, std::path::PathBuf, Peer) {
    let tmp = tempfile::tempdir().unwrap();
    let sessions = tmp.path().join("sessions");
    let store = kin::testkit::session::SessionStore::new(&sessions);
    let mut s = store.create(kin::testkit::session::SessionHeader::new(id, 5, Some("/proj".into()))).unwrap();
    if let Some(title) = title {
        s.append("session/title", json!({"title": title, "messageSeqs": [], "source": {"kind": "fallback"}}));
    }
    s.flush().unwrap();
    let mut peer = Peer::spawn(
        Command::new(KIN).args(["acp", "--config", "/dev/null", "--sessions"]).arg(&sessions).stderr(Stdio::null()),
    );
    peer.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), LIST_WAIT);
    (tmp, sessions, peer)
}

/// A `kin acp` that read titles for `session/list` has them in the catalog index when it exits:
/// the index is written after the answer, on the log watch's thread, and shutdown waits for it.
#[test]
fn kin_acp_leaves_the_titles_it_listed_in_the_catalog_index() {
    let (_tmp, sessions, mut peer) = acp_over_one_session("cccccccc-0000-4000-8000-000000000002", Some("listed title"));
    let listed = peer.call("session/list", json!({}), LIST_WAIT);
    assert_eq!(listed["result"]["sessions"][0]["title"], "listed title", "{listed}");
    assert!(peer.exit().success());
    let index = kin::testkit::session::catalog_index::path(&sessions).unwrap();
    let indexed = std::fs::read_to_string(&index).unwrap();
    assert!(indexed.contains(r#""title":{"text":"listed title"}"#), "{indexed}");
}

/// `session/list` refuses what it cannot honour, naming it, and goes on serving: a `cwd` that
/// is not absolute, and a `cursor` (kin answers whole and never sends `nextCursor`).
#[test]
fn session_list_refuses_a_relative_cwd_and_a_cursor_it_never_issued() {
    let id = "cccccccc-0000-4000-8000-000000000003";
    let (_tmp, _, mut peer) = acp_over_one_session(id, None);
    let t = LIST_WAIT;
    let relative = peer.call("session/list", json!({"cwd": "proj"}), t);
    assert_eq!(relative["error"]["code"], -32602, "{relative}");
    assert!(relative["error"].to_string().contains("cwd must be an absolute path: proj"), "{relative}");
    let paged = peer.call("session/list", json!({"cursor": "page-2"}), t);
    assert_eq!(paged["error"]["code"], -32602, "{paged}");
    assert!(paged["error"].to_string().contains("\\\"page-2\\\" is not one of its own"), "{paged}");
    for params in [json!({}), json!({"cwd": "/proj", "cursor": null})] {
        let listed = peer.call("session/list", params, t);
        assert_eq!(listed["result"]["sessions"][0]["sessionId"], id, "{listed}");
        assert!(listed["result"].get("nextCursor").is_none(), "{listed}");
    }
    assert!(peer.exit().success());
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
    let (replay, cwd, sessions) = scratch(tmp.path());
    hanging_replay(&replay);
    let mut first = start(&sessions, &replay, &cwd);
    first.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    response(&first, 1);
    first.send(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":cwd,"mcpServers":[]}}));
    let id = response(&first, 2)["result"]["sessionId"].as_str().unwrap().to_string();
    let mut second = start(&sessions, &replay, &cwd);
    second.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    response(&second, 1);
    second.send(
        json!({"jsonrpc":"2.0","id":2,"method":"session/load","params":{"sessionId":id,"cwd":cwd,"mcpServers":[]}}),
    );
    let refused = response(&second, 2);
    let message = refused["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("being written by another kin process"), "{refused}");
    // Once the first kin exits, the second may take the session over.
    first.close_stdin();
    // Exit 3: its replay call was (deliberately) never made.
    assert_eq!(first.child.wait().unwrap().code(), Some(3));
    second.send(
        json!({"jsonrpc":"2.0","id":3,"method":"session/load","params":{"sessionId":id,"cwd":cwd,"mcpServers":[]}}),
    );
    assert!(response(&second, 3).get("result").is_some());
    second.close_stdin();
    // Exit 3 as well: the replay's call was never made by this kin either.
    assert_eq!(second.child.wait().unwrap().code(), Some(3));
}

/// A replay directory whose model answers "fine" `n` times.
fn answering_replay(dir: &Path, n: usize) {
    let header = json!({"type":"session","version":0,"id":"{{sessionId}}","createdAt":0,"delegationDepth":0});
    std::fs::write(dir.join("session.jsonl"), format!("{header}\n")).unwrap();
    let answer = json!({"kind":"chunks","chunks":[{"type":"block-start","index":0,"blockType":"text"},{"type":"text-delta","index":0,"text":"fine"},{"type":"block-end","index":0,"block":{"type":"text","text":"fine"}},{"type":"finish","reason":{"kind":"stop"}}]});
    std::fs::write(dir.join("replay.override.json"), json!(vec![answer; n]).to_string()).unwrap();
}

/// `initialize` (id 1) and `session/new` (id 2) in `cwd`; returns the session id.
fn open_session(kin: &mut Peer, cwd: &Path) -> String {
    kin.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    response(kin, 1);
    kin.send(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":cwd,"mcpServers":[]}}));
    response(kin, 2)["result"]["sessionId"].as_str().unwrap().to_string()
}

/// A text prompt with request id `id`; returns its response.
fn prompt(kin: &mut Peer, id: u64, session: &str, text: &str) -> Value {
    kin.send(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":session,"prompt":[{"type":"text","text":text}]}}));
    response(kin, id)
}

/// kin under a file-size limit (`ulimit -f`): appends past it fail like a full disk (EFBIG).
fn start_limited(sessions: &Path, replay: &Path, cwd: &Path, blocks: Option<u32>) -> Peer {
    let limit = blocks.map_or(String::new(), |b| format!("ulimit -f {b}; "));
    let script = format!("{limit}exec \"$0\" acp --config /dev/null --sessions \"$1\" --replay \"$2\"");
    Peer::spawn(
        Command::new("sh").args(["-c", &script, KIN]).arg(sessions).arg(replay).current_dir(cwd).stderr(Stdio::null()),
    )
}

#[test]
fn a_full_disk_fails_the_turn_cleanly_and_the_session_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = scratch(tmp.path());
    answering_replay(&replay, 3);
    // 64 blocks of 512 bytes: room for the header and a small turn, not for a 100 KB prompt.
    let mut kin = start_limited(&sessions, &replay, &cwd, Some(64));
    let id = open_session(&mut kin, &cwd);
    assert_eq!(prompt(&mut kin, 3, &id, "small")["result"]["stopReason"], "end_turn");
    let store = kin::testkit::session::SessionStore::new(&sessions);
    let committed = store.inspect(&id).unwrap().events.len();
    kin.send(json!({"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"y".repeat(100_000)}]}}));
    let failed = response(&kin, 4);
    let message = failed["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("turn failed") && message.contains("could not persist the session log"), "{failed}");
    // The log is back at its last committed length: whole lines, the first turn intact.
    let after = store.inspect(&id).unwrap();
    assert!(after.torn.is_none(), "no half line was left behind");
    assert_eq!(after.events.len(), committed);
    kin.close_stdin();
    let _ = kin.child.wait();
    // Space returns: a kin without the limit loads the session and carries on.
    let mut kin = start_limited(&sessions, &replay, &cwd, None);
    kin.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    response(&kin, 1);
    kin.send(
        json!({"jsonrpc":"2.0","id":2,"method":"session/load","params":{"sessionId":id,"cwd":cwd,"mcpServers":[]}}),
    );
    assert!(response(&kin, 2).get("result").is_some());
    kin.send(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"again"}]}}));
    assert_eq!(response(&kin, 3)["result"]["stopReason"], "end_turn");
    kin.close_stdin();
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
    let (replay, cwd, sessions) = scratch(tmp.path());
    std::fs::create_dir_all(&sessions).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"]).arg(&sessions).status();
    if !mounted.is_ok_and(|s| s.success()) {
        eprintln!("skipping: cannot mount a tmpfs here (needs root); the file-size-limit test covers the same path");
        return;
    }
    let _mount = Mount(sessions.clone());
    answering_replay(&replay, 3);
    let mut kin = start_limited(&sessions, &replay, &cwd, None);
    let id = open_session(&mut kin, &cwd);
    assert_eq!(prompt(&mut kin, 3, &id, "small")["result"]["stopReason"], "end_turn");
    let store = kin::testkit::session::SessionStore::new(&sessions);
    let committed = store.inspect(&id).unwrap().events.len();
    kin.send(json!({"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"z".repeat(200_000)}]}}));
    let failed = response(&kin, 4);
    let message = failed["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("could not persist the session log") && message.contains("No space left"), "{failed}");
    let after = store.inspect(&id).unwrap();
    assert!(after.torn.is_none(), "no half line after ENOSPC");
    assert_eq!(after.events.len(), committed, "the log is back at its last committed length");
    // Space returns: the same kin, the same session, carries on; the failed turn lands too.
    let grown = Command::new("mount").args(["-o", "remount,size=8m"]).arg(&sessions).status().unwrap();
    assert!(grown.success());
    kin.send(json!({"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"again"}]}}));
    assert_eq!(response(&kin, 5)["result"]["stopReason"], "end_turn");
    let healed = store.inspect(&id).unwrap();
    assert!(healed.torn.is_none());
    let ends: Vec<&str> = healed
        .events
        .iter()
        .filter(|e| e.kind == "turn/end")
        .filter_map(|e| e.data["reason"]["kind"].as_str())
        .collect();
    assert_eq!(ends, ["completed", "completed", "completed"], "every turn is on disk, in order");
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// `kin sessions list | head` and `kin sessions show ID | head`: a reader that closes stdout
/// ends the command quietly and successfully. An error is said once on stderr.
#[test]
fn sessions_commands_end_quietly_when_their_reader_closes_stdout() {
    let tmp = tempfile::tempdir().unwrap();
    let sessions = tmp.path().join("sessions");
    let id = "cccccccc-0000-4000-8000-000000000002";
    let store = kin::testkit::session::SessionStore::new(&sessions);
    store.create(kin::testkit::session::SessionHeader::new(id, 5, Some("/proj".into()))).unwrap().flush().unwrap();
    let kin = |args: &[&str]| {
        let mut command = Command::new(KIN);
        command.args(args).args(["--config", "/dev/null", "--sessions"]).arg(&sessions);
        command
    };
    for args in [&["sessions", "list"][..], &["sessions", "show", id]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = kin(args).stdout(writer).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.is_empty(), "{args:?}: {:?}, stderr {err:?}", out.status);
    }
    let missing = "cccccccc-0000-4000-8000-0000000000ff";
    let out = kin(&["sessions", "show", missing]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.starts_with("kin: "), "{err}");
    assert_eq!(err.matches(missing).count(), 1, "said once: {err}");
}

/// A new user's first `kin sessions list`, before any session (no sessions directory, nor its
/// parent): nothing listed, nothing said, nothing written.
#[test]
fn sessions_list_before_any_session_says_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let sessions = tmp.path().join("state/kin/sessions");
    let out = Command::new(KIN)
        .args(["sessions", "list", "--config", "/dev/null", "--sessions"])
        .arg(&sessions)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none(), "nothing written");
}

/// A client that writes its first requests at once, without waiting for `initialize`'s answer,
/// and closes kin's stdin (a script piping them in), has each served in order and answered
/// before kin exits: the SDK alone would refuse those that arrive while initialization is under
/// way ("ACP initialization must complete"), and would end at the end of the input without the
/// answers still to come (the listing's).
#[test]
fn requests_piped_in_at_once_are_served_in_order_and_answered_before_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let (sessions, cwd) = (tmp.path().join("sessions"), tmp.path().join("cwd"));
    std::fs::create_dir_all(&cwd).unwrap();
    let mut kin = Peer::spawn(&mut common::acp(&sessions, None));
    let lines = [
        common::request(1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}})),
        common::request(2, "session/new", json!({"cwd": cwd, "mcpServers": []})),
        common::request(3, "session/list", json!({})),
    ];
    let all: String = lines.iter().map(|line| format!("{line}\n")).collect();
    kin.write_line(all.trim_end()).unwrap();
    kin.close_stdin();
    let answers = kin.responses(&[1, 2, 3], Duration::from_secs(20));
    for id in [1, 2, 3] {
        assert!(answers[&id].get("error").is_none(), "request {id}: {}", answers[&id]);
    }
    let created = answers[&2]["result"]["sessionId"].clone();
    assert!(answers[&3]["result"]["sessions"].as_array().unwrap().iter().any(|s| s["sessionId"] == created));
    assert!(kin.exit().success());
}

/// `--log-file`: a path that cannot be opened as a file is refused at start, naming it (status
/// 2, no panic); a missing directory is made.
#[test]
fn a_log_file_that_cannot_be_opened_is_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let kin = |log: &Path| {
        Command::new(KIN)
            .args(["acp", "--config", "/dev/null", "--sessions"])
            .arg(tmp.path().join("sessions"))
            .arg("--log-file")
            .arg(log)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = kin(tmp.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with(&format!("kin: cannot open the log file {}", tmp.path().display())), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let log = tmp.path().join("logs/today/kin.log");
    let out = kin(&log);
    assert!(out.status.success(), "{out:?}");
    assert!(log.is_file(), "the log file and its directories are made");
}

/// A prompt written right behind the `session/load` of its session (a script piping both) is
/// never refused as "unknown session": it is told the session is still being loaded, or, if the
/// load answered first, it runs (here until stdin closes, then it answers `cancelled`).
#[test]
fn a_prompt_behind_the_load_of_its_session_is_told_to_wait_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = scratch(tmp.path());
    hanging_replay(&replay);
    let mut kin = Peer::spawn(&mut common::acp(&sessions, None));
    kin.send(common::request(1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}})));
    response(&kin, 1);
    let id = kin.new_session(&cwd);
    assert!(kin.exit().success());
    let mut kin = start(&sessions, &replay, &cwd);
    let lines = [
        common::request(1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}})),
        common::request(2, "session/load", json!({"sessionId": id, "cwd": cwd, "mcpServers": []})),
        common::request(3, "session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "go"}]})),
    ];
    let all: String = lines.iter().map(|line| format!("{line}\n")).collect();
    kin.write_line(all.trim_end()).unwrap();
    kin.close_stdin();
    let answers = kin.responses(&[1, 2, 3], Duration::from_secs(20));
    assert!(answers[&2].get("result").is_some(), "{}", answers[&2]);
    let prompt = &answers[&3];
    let told = prompt["error"]["message"].as_str().is_some_and(|m| {
        m == format!(
            "Invalid params: session {id} is still being loaded or resumed; send this once that request has answered"
        )
    });
    assert!(told || prompt["result"]["stopReason"] == "cancelled", "{prompt}");
    // Its status tells whether the replayed answer was used, which depends on the order.
    kin.exit();
}

/// Requests written right behind a `session/close` (a script piping them) see the session
/// closed: a prompt is told the session is unknown (it was answered `cancelled`, its text never
/// written), a load waits for the close and then opens the session again (it was refused as
/// "being written by another kin process"), and a delete is refused as "being closed" or, if the
/// close was done by then, deletes it.
#[test]
fn requests_behind_a_close_see_the_session_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut kin, _, id, prompt) = mid_turn(tmp.path());
    assert_eq!(prompt, 3);
    let lines = [
        common::request(4, "session/close", json!({"sessionId": id})),
        common::request(5, "session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "lost?"}]})),
        common::request(6, "session/load", json!({"sessionId": id, "cwd": tmp.path().join("cwd"), "mcpServers": []})),
    ];
    let all: String = lines.iter().map(|line| format!("{line}\n")).collect();
    kin.write_line(all.trim_end()).unwrap();
    let answers = kin.responses(&[3, 4, 5, 6], Duration::from_secs(20));
    assert_eq!(answers[&3]["result"]["stopReason"], "cancelled", "{}", answers[&3]);
    assert!(answers[&4].get("result").is_some(), "{}", answers[&4]);
    assert_eq!(answers[&5]["error"]["code"], -32002, "unknown session: {}", answers[&5]);
    assert!(answers[&6].get("result").is_some(), "the load waited for the close: {}", answers[&6]);
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
    let log = std::fs::read_to_string(
        kin::testkit::session::SessionStore::new(tmp.path().join("sessions")).locate(&id).unwrap().unwrap(),
    )
    .unwrap();
    assert!(!log.contains("lost?"), "the refused prompt was not written");
}

/// The same for a session that is live and idle: the prompt behind its load does not start a
/// turn on the agent the load replaces (the load was then refused for the turn in flight).
#[test]
fn a_prompt_behind_the_load_of_a_live_session_does_not_get_ahead_of_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = scratch(tmp.path());
    hanging_replay(&replay);
    let mut kin = start(&sessions, &replay, &cwd);
    kin.send(common::request(1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}})));
    response(&kin, 1);
    let id = kin.new_session(&cwd);
    let lines = [
        common::request(2, "session/load", json!({"sessionId": id, "cwd": cwd, "mcpServers": []})),
        common::request(3, "session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "go"}]})),
    ];
    let all: String = lines.iter().map(|line| format!("{line}\n")).collect();
    kin.write_line(all.trim_end()).unwrap();
    kin.close_stdin();
    let answers = kin.responses(&[2, 3], Duration::from_secs(20));
    assert!(answers[&2].get("result").is_some(), "the load is not refused: {}", answers[&2]);
    let prompt = &answers[&3];
    let told = prompt["error"]["message"].as_str().is_some_and(|m| m.contains("is still being loaded or resumed"));
    assert!(told || prompt["result"]["stopReason"] == "cancelled", "{prompt}");
    kin.exit();
}

/// SIGTERM during a turn, stdin still open: the turn is stopped and its prompt answered
/// `cancelled` before kin exits 0 (before, kin ended without answering it).
#[test]
fn sigterm_mid_turn_answers_the_prompt_cancelled_before_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut kin, _, _, prompt) = mid_turn(tmp.path());
    let pid = kin.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert_eq!(response(&kin, prompt)["result"]["stopReason"], "cancelled");
    assert!(kin.child.wait().unwrap().success(), "SIGTERM is a clean exit");
}

/// SIGHUP (the terminal kin ran in closed) and SIGINT (Ctrl-C) end kin as SIGTERM does, the
/// running turn answered and the children stopped, instead of killing it on the spot (which left
/// an external agent child running on its own).
#[test]
fn sighup_and_sigint_end_kin_as_sigterm_does() {
    for signal in ["-HUP", "-INT"] {
        let tmp = tempfile::tempdir().unwrap();
        let (mut kin, _, _, prompt) = mid_turn(tmp.path());
        let pid = kin.child.id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
        assert_eq!(response(&kin, prompt)["result"]["stopReason"], "cancelled", "{signal}");
        assert!(kin.child.wait().unwrap().success(), "{signal} is a clean exit");
    }
}

/// A model answer: a tool call, or (`name` empty) the text `text`.
fn answer_chunks(name: &str, args: Value, text: &str) -> Value {
    let chunks = if name.is_empty() {
        json!([
            {"type":"block-start","index":0,"blockType":"text"},
            {"type":"text-delta","index":0,"text":text},
            {"type":"block-end","index":0,"block":{"type":"text","text":text}},
            {"type":"finish","reason":{"kind":"stop"}}
        ])
    } else {
        let args = args.to_string();
        json!([
            {"type":"block-start","index":0,"blockType":"tool-call"},
            {"type":"tool-call-delta","index":0,"id":text,"name":name,"argumentsDelta":args},
            {"type":"block-end","index":0,"block":{"type":"tool-call","id":text,"name":name,"arguments":args}},
            {"type":"finish","reason":{"kind":"tool-calls"}}
        ])
    };
    json!({"kind": "chunks", "chunks": chunks})
}

/// A replay directory serving `answers` in order.
fn replay_of(dir: &Path, answers: &[Value]) {
    std::fs::create_dir_all(dir).unwrap();
    let header = json!({"type":"session","version":0,"id":"{{sessionId}}","createdAt":0,"delegationDepth":0});
    std::fs::write(dir.join("session.jsonl"), format!("{header}\n")).unwrap();
    std::fs::write(dir.join("replay.override.json"), json!(answers).to_string()).unwrap();
}

/// The status and first text of the last `tool_call_update` of call `id` in `frames`.
fn call_outcome(frames: &[Value], id: &str) -> (String, String) {
    let update = frames
        .iter()
        .filter(|f| f["params"]["update"]["sessionUpdate"] == "tool_call_update")
        .map(|f| &f["params"]["update"])
        .rfind(|u| u["toolCallId"] == id && u["status"] != "in_progress")
        .unwrap_or_else(|| panic!("no outcome of {id}: {frames:#?}"));
    let text = update["content"][0]["content"]["text"].as_str().unwrap_or_default().to_string();
    (update["status"].as_str().unwrap_or_default().to_string(), text)
}

/// A file the session read before kin restarted may be edited after `session/load` without being
/// read again (the log records the read), and in a fork of it; one it never read still may not.
#[test]
fn a_loaded_session_may_edit_what_it_read_before_the_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, cwd, sessions) = scratch(tmp.path());
    std::fs::write(cwd.join("a.txt"), "one\n").unwrap();
    std::fs::write(cwd.join("b.txt"), "one\n").unwrap();
    let read = [answer_chunks("read", json!({"file_path": "a.txt"}), "r1"), answer_chunks("", json!(null), "seen")];
    let mut first = editing(&sessions, &cwd, &tmp.path().join("first"), &read);
    let id = open_session(&mut first, &cwd);
    assert_eq!(prompt(&mut first, 3, &id, "read a.txt")["result"]["stopReason"], "end_turn");
    finish(first);

    let edit = |file: &str| json!({"file_path": file, "old_string": "one", "new_string": "two"});
    let edits = [
        answer_chunks("edit", edit("a.txt"), "e1"),
        answer_chunks("edit", edit("b.txt"), "e2"),
        answer_chunks("", json!(null), "done"),
    ];
    let mut second = editing(&sessions, &cwd, &tmp.path().join("second"), &edits);
    reopen(&mut second, "session/load", &id, &cwd);
    let frames = prompt_frames(&mut second, &id, "edit both");
    assert_eq!(frames.last().unwrap()["result"]["stopReason"], "end_turn", "{frames:#?}");
    assert_eq!(call_outcome(&frames, "e1").0, "completed", "read before the restart");
    assert_eq!(std::fs::read_to_string(cwd.join("a.txt")).unwrap(), "two\n");
    let (status, text) = call_outcome(&frames, "e2");
    assert_eq!(status, "failed");
    assert!(text.contains("must be read with the read tool before it is edited"), "{text}");
    assert_eq!(std::fs::read_to_string(cwd.join("b.txt")).unwrap(), "one\n");
    finish(second);

    // A fork has read what its seed read.
    let again = json!({"file_path": "a.txt", "old_string": "two", "new_string": "three"});
    let again = [answer_chunks("edit", again, "e3"), answer_chunks("", json!(null), "done")];
    let mut third = editing(&sessions, &cwd, &tmp.path().join("third"), &again);
    let fork = reopen(&mut third, "session/fork", &id, &cwd);
    let frames = prompt_frames(&mut third, &fork, "again");
    assert_eq!(call_outcome(&frames, "e3").0, "completed", "{frames:#?}");
    assert_eq!(std::fs::read_to_string(cwd.join("a.txt")).unwrap(), "three\n");
    finish(third);
}

/// A kin in `accept-edits` whose model serves `answers` (from the replay directory `replay`).
fn editing(sessions: &Path, cwd: &Path, replay: &Path, answers: &[Value]) -> Peer {
    replay_of(replay, answers);
    Peer::spawn(common::acp(sessions, Some(replay)).arg("--permission-mode").arg("accept-edits").current_dir(cwd))
}

/// `initialize` (id 1), then `method` (`session/load` or `session/fork`, id 2) of the stored
/// session `id`; returns the id of the session it opened.
fn reopen(kin: &mut Peer, method: &str, id: &str, cwd: &Path) -> String {
    kin.send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    response(kin, 1);
    kin.send(json!({"jsonrpc":"2.0","id":2,"method":method,"params":{"sessionId":id,"cwd":cwd,"mcpServers":[]}}));
    let answer = response(kin, 2);
    assert!(answer["result"].is_object(), "{answer}");
    answer["result"]["sessionId"].as_str().unwrap_or(id).to_string()
}

/// A text prompt (id 3) and every frame up to its response.
fn prompt_frames(kin: &mut Peer, session: &str, text: &str) -> Vec<Value> {
    kin.send(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":session,"prompt":[{"type":"text","text":text}]}}));
    kin.frames_to(3)
}

/// Closes kin's input; it must exit 0 (every replayed call made).
fn finish(mut kin: Peer) {
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

/// A call's permission question the user has not answered when the turn is cancelled is
/// withdrawn: kin sends the editor `$/cancel_request` for it (so the dialog can close), and the
/// prompt ends `cancelled` without the call running.
#[test]
fn a_cancelled_turn_withdraws_its_open_permission_question() {
    let tmp = tempfile::tempdir().unwrap();
    let (replay, cwd, sessions) = scratch(tmp.path());
    replay_of(&replay, &[answer_chunks("write", json!({"file_path": "x.txt", "content": "hi"}), "w1")]);
    let mut kin = start(&sessions, &replay, &cwd);
    let id = open_session(&mut kin, &cwd);
    kin.send(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":id,"prompt":[{"type":"text","text":"write x"}]}}));
    let asked = kin.frames_until(|f| f["method"] == "session/request_permission");
    let question = asked.last().unwrap()["id"].clone();
    kin.send(json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":id}}));
    let frames = kin.frames_to(3);
    assert_eq!(frames.last().unwrap()["result"]["stopReason"], "cancelled", "{frames:#?}");
    let withdrawn: Vec<&Value> = frames.iter().filter(|f| f["method"] == "$/cancel_request").collect();
    assert_eq!(withdrawn.len(), 1, "{frames:#?}");
    assert_eq!(withdrawn[0]["params"]["requestId"], question);
    assert!(!cwd.join("x.txt").exists(), "the call never ran");
    finish(kin);
}
