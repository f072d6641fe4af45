//! Session lifecycle over pipes against the real binary: `session/delete` (and `kin sessions
//! delete`) removes a closed top-level session with its children's logs and refuses a child id
//! and a live session; unknown and deleted ids answer `-32002` on every request; `session/fork`
//! and `session/resume` carry the model selector; a cancelled turn keeps its partial text for
//! `session/load`; a restored session never runs in a mode more permissive than kin's start
//! mode; a mode, model or sandbox is answered once it is on disk (also during a turn), and
//! refused, unchanged, when the log cannot be written; and a close whose last write fails says so.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[allow(dead_code)]
mod common;
use common::{KIN, Peer};

/// A scratch directory with `cwd/`, `replay/` and the sessions root.
struct Dirs {
    tmp: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("cwd")).unwrap();
        std::fs::create_dir_all(tmp.path().join("replay")).unwrap();
        Dirs { tmp }
    }
    fn cwd(&self) -> PathBuf {
        self.tmp.path().join("cwd")
    }
    fn replay(&self) -> PathBuf {
        self.tmp.path().join("replay")
    }
    fn sessions(&self) -> PathBuf {
        self.tmp.path().join("sessions")
    }
    fn store(&self) -> kin::testkit::session::SessionStore {
        kin::testkit::session::SessionStore::new(self.sessions())
    }
}

/// A replay directory whose model plays `entries` in order (override entries).
fn replay_of(dir: &Path, entries: Value) {
    let header = json!({"type":"session","version":0,"id":"{{sessionId}}","createdAt":0,"delegationDepth":0});
    std::fs::write(dir.join("session.jsonl"), format!("{header}\n")).unwrap();
    std::fs::write(dir.join("replay.override.json"), entries.to_string()).unwrap();
}

fn answer(text: &str) -> Value {
    json!({"kind":"chunks","chunks":[{"type":"block-start","index":0,"blockType":"text"},{"type":"text-delta","index":0,"text":text},{"type":"block-end","index":0,"block":{"type":"text","text":text}},{"type":"finish","reason":{"kind":"stop"}}]})
}

/// `kin acp --replay REPLAY` in `mode`, in the cwd, without the caller's `KIN_*` settings.
fn kin(dirs: &Dirs, replay: &Path, mode: &str) -> Peer {
    let mut command = common::acp(&dirs.sessions(), Some(replay));
    command.args(["--permission-mode", mode]).current_dir(dirs.cwd());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("KIN_") {
            command.env_remove(key);
        }
    }
    Peer::spawn(&mut command)
}

fn call(kin: &mut Peer, method: &str, params: Value) -> Value {
    kin.call(method, params, Duration::from_secs(20))
}

fn open(kin: &mut Peer, cwd: &Path) -> String {
    call(kin, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    let created = call(kin, "session/new", json!({"cwd": cwd, "mcpServers": []}));
    created["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{created}")).to_string()
}

fn prompt(kin: &mut Peer, id: &str, text: &str) -> Value {
    call(kin, "session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": text}]}))
}

/// Every session-scoped request kin answers, naming `id`.
fn requests_naming(id: &str, cwd: &Path) -> Vec<(&'static str, Value)> {
    vec![
        ("session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "hi"}]})),
        ("session/load", json!({"sessionId": id, "cwd": cwd, "mcpServers": []})),
        ("session/resume", json!({"sessionId": id, "cwd": cwd})),
        ("session/close", json!({"sessionId": id})),
        ("session/fork", json!({"sessionId": id, "cwd": cwd, "mcpServers": []})),
        ("session/set_mode", json!({"sessionId": id, "modeId": "ask"})),
        (
            "session/set_config_option",
            json!({"sessionId": id, "configId": "model", "value": "deepseek/deepseek-v4-pro"}),
        ),
        ("session/delete", json!({"sessionId": id})),
    ]
}

fn assert_not_found(kin: &mut Peer, id: &str, cwd: &Path) {
    for (method, params) in requests_naming(id, cwd) {
        let answer = call(kin, method, params);
        assert_eq!(answer["error"]["code"], -32002, "{method}: {answer}");
        assert_eq!(answer["error"]["data"], json!({"sessionId": id}), "{method}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(id), "{method}: {answer}");
    }
}

/// An id that cannot be a session id is a bad request on every method, not an unknown session.
#[test]
fn a_malformed_session_id_is_invalid_params_everywhere() {
    let dirs = Dirs::new();
    replay_of(&dirs.replay(), json!([answer("fine")]));
    let mut kin = kin(&dirs, &dirs.replay(), "bypass");
    open(&mut kin, &dirs.cwd());
    for id in ["../escape", ""] {
        for (method, params) in requests_naming(id, &dirs.cwd()) {
            let answer = call(&mut kin, method, params);
            assert_eq!(answer["error"]["code"], -32602, "{method} {id:?}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.starts_with("Invalid params: invalid session id: "), "{method} {id:?}: {answer}");
        }
    }
    kin.close_stdin();
    let _ = kin.child.wait();
}

#[test]
fn unknown_and_deleted_sessions_are_not_found_everywhere() {
    let dirs = Dirs::new();
    replay_of(&dirs.replay(), json!([answer("fine")]));
    let mut kin = kin(&dirs, &dirs.replay(), "bypass");
    let id = open(&mut kin, &dirs.cwd());
    assert_eq!(prompt(&mut kin, &id, "hello")["result"]["stopReason"], "end_turn");
    assert_not_found(&mut kin, "no-such-session", &dirs.cwd());
    // A malformed id is still a bad parameter, not a missing session.
    let bad = call(&mut kin, "session/load", json!({"sessionId": "../../etc", "cwd": dirs.cwd(), "mcpServers": []}));
    assert_eq!(bad["error"]["code"], -32602, "{bad}");

    // A live session is not deleted; once closed it is, and then it is gone for every request.
    let live = call(&mut kin, "session/delete", json!({"sessionId": id}));
    assert_eq!(live["error"]["code"], -32602, "{live}");
    assert!(live["error"]["message"].as_str().unwrap().contains("session/close"), "{live}");
    assert!(dirs.store().locate(&id).unwrap().is_some());
    assert_eq!(call(&mut kin, "session/close", json!({"sessionId": id}))["result"], json!({}));
    let deleted = call(&mut kin, "session/delete", json!({"sessionId": id}));
    assert_eq!(deleted["result"], json!({}), "{deleted}");
    assert!(dirs.store().locate(&id).unwrap().is_none(), "the log is gone when delete answers");
    assert_not_found(&mut kin, &id, &dirs.cwd());
    let listed = call(&mut kin, "session/list", json!({}));
    assert_eq!(listed["result"]["sessions"], json!([]), "{listed}");
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

/// A `session/list` that cannot read the store (kin out of file descriptors here) is an error
/// naming the cause, not an empty list that hides every stored session; once descriptors are
/// free again it lists them.
#[test]
fn a_listing_that_cannot_read_the_store_fails_instead_of_listing_nothing() {
    let dirs = Dirs::new();
    let replay = dirs.replay();
    replay_of(&replay, json!([answer("hi")]));
    let mut kin = kin(&dirs, &replay, "bypass");
    let id = open(&mut kin, &dirs.cwd());
    assert_eq!(prompt(&mut kin, &id, "hello")["result"]["stopReason"], "end_turn");
    let pid = kin.child.id().to_string();
    let open_fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    let limit = |nofile: String| {
        let set = Command::new("prlimit").args(["--pid", &pid, &format!("--nofile={nofile}")]).status();
        assert!(set.unwrap().success(), "prlimit sets kin's open-files limit");
    };
    // Room for what kin holds, and none for the listing's directories.
    limit(format!("{open_fds}:"));
    let failed = call(&mut kin, "session/list", json!({}));
    let said = failed["error"]["data"].as_str().unwrap_or_else(|| panic!("{failed}")).to_string();
    assert!(said.contains("Too many open files") && said.contains("nothing was listed"), "{said}");
    limit("4096:".into());
    let listed = call(&mut kin, "session/list", json!({}));
    assert_eq!(listed["result"]["sessions"][0]["sessionId"], id.as_str(), "{listed}");
    kin.close_stdin();
    assert!(kin.child.wait().unwrap().success());
}

#[test]
fn deleting_a_parent_removes_its_children_and_a_child_id_is_refused() {
    let dirs = Dirs::new();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/subagent-spawn");
    let mut kin = kin(&dirs, &scenario, "bypass");
    let init = call(&mut kin, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    assert_eq!(init["result"]["agentCapabilities"]["sessionCapabilities"]["delete"], json!({}), "{init}");
    let created = call(&mut kin, "session/new", json!({"cwd": dirs.cwd(), "mcpServers": []}));
    let parent = created["result"]["sessionId"].as_str().unwrap().to_string();
    let done = prompt(&mut kin, &parent, "Delegate: have a child reply CHILD_OK, then say PARENT_DONE.");
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let children: Vec<String> = dirs
        .store()
        .list()
        .into_iter()
        .filter(|s| s.header.parent_session.as_deref() == Some(parent.as_str()))
        .map(|s| s.header.id)
        .collect();
    assert_eq!(children.len(), 1, "the scenario made one child");
    let child = &children[0];
    let refused = call(&mut kin, "session/delete", json!({"sessionId": child}));
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("subagent session"), "{refused}");
    assert_eq!(call(&mut kin, "session/close", json!({"sessionId": parent}))["result"], json!({}));

    // `kin sessions delete` refuses a child id and a session another kin has open.
    let sessions = |args: &[&str]| {
        Command::new(KIN)
            .args(["sessions", "--config", "/dev/null", "--sessions"])
            .arg(dirs.sessions())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = sessions(&["delete", child]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("subagent session"));
    let load = call(&mut kin, "session/load", json!({"sessionId": parent, "cwd": dirs.cwd(), "mcpServers": []}));
    assert!(load["result"].is_object(), "{load}");
    let out = sessions(&["delete", &parent]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success() && said.contains("open in a kin process"), "{said}");
    assert!(dirs.store().locate(&parent).unwrap().is_some() && dirs.store().locate(child).unwrap().is_some());
    kin.close_stdin();
    let _ = kin.child.wait();

    let out = sessions(&["delete", &parent]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 subagent session"), "{out:?}");
    assert!(dirs.store().locate(&parent).unwrap().is_none());
    assert!(dirs.store().locate(child).unwrap().is_none(), "the child's log went with its parent");
    let out = sessions(&["delete", &parent]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unknown session"));
}

/// One workspace however the editor spells it: sessions opened in `<w>/`, `<w>/./` and
/// `<w>/sub/..` are recorded in `<w>` and listed by `session/list` for `<w>` (and for `<w>/`).
#[test]
fn a_workspace_spelled_three_ways_is_one() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(dirs.cwd().join("sub")).unwrap();
    replay_of(&dirs.replay(), json!([]));
    let mut kin = kin(&dirs, &dirs.replay(), "ask");
    let spelled = |tail: &str| format!("{}{tail}", dirs.cwd().display());
    let first = open(&mut kin, Path::new(&spelled("/")));
    let mut ids = vec![first];
    for tail in ["/./", "/sub/.."] {
        let created = call(&mut kin, "session/new", json!({"cwd": spelled(tail), "mcpServers": []}));
        ids.push(created["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{created}")).to_string());
    }
    for filter in [spelled(""), spelled("/")] {
        let listed = call(&mut kin, "session/list", json!({"cwd": filter}));
        let sessions = listed["result"]["sessions"].as_array().unwrap_or_else(|| panic!("{listed}"));
        let mut found: Vec<&str> = sessions.iter().map(|s| s["sessionId"].as_str().unwrap()).collect();
        found.sort();
        let mut expected: Vec<&str> = ids.iter().map(String::as_str).collect();
        expected.sort();
        assert_eq!(found, expected, "listed for {filter}");
        assert!(sessions.iter().all(|s| s["cwd"] == spelled("")), "{listed}");
    }
    assert!(kin.exit().success());
}

#[test]
fn fork_and_resume_answer_with_the_model_selector() {
    let dirs = Dirs::new();
    replay_of(&dirs.replay(), json!([answer("fine")]));
    let mut kin = kin(&dirs, &dirs.replay(), "bypass");
    let id = open(&mut kin, &dirs.cwd());
    let set = call(
        &mut kin,
        "session/set_config_option",
        json!({"sessionId": id, "configId": "model", "value": "deepseek/deepseek-v4-pro"}),
    );
    assert!(set["result"].is_object(), "{set}");
    assert_eq!(prompt(&mut kin, &id, "hello")["result"]["stopReason"], "end_turn");
    let model = |answer: &Value| answer["result"]["configOptions"][0].clone();
    let forked = call(&mut kin, "session/fork", json!({"sessionId": id, "cwd": dirs.cwd(), "mcpServers": []}));
    assert_eq!(model(&forked)["id"], "model", "{forked}");
    assert_eq!(model(&forked)["currentValue"], "deepseek/deepseek-v4-pro", "the fork keeps the chosen model");
    assert_eq!(call(&mut kin, "session/close", json!({"sessionId": id}))["result"], json!({}));
    let resumed = call(&mut kin, "session/resume", json!({"sessionId": id, "cwd": dirs.cwd()}));
    assert_eq!(model(&resumed)["currentValue"], "deepseek/deepseek-v4-pro", "{resumed}");
    kin.close_stdin();
    let _ = kin.child.wait();
}

#[test]
fn a_cancelled_turn_keeps_its_partial_text_for_load() {
    let dirs = Dirs::new();
    let streamed = "half an answer, then";
    replay_of(
        &dirs.replay(),
        json!([{"kind":"hang","readyFile":".ready","chunks":[{"type":"block-start","index":0,"blockType":"text"},{"type":"text-delta","index":0,"text":streamed}]}]),
    );
    let mut kin = kin(&dirs, &dirs.replay(), "bypass");
    let id = open(&mut kin, &dirs.cwd());
    let turn = kin.request("session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "go"}]}));
    common::until_blocking("the turn to start streaming", || dirs.cwd().join(".ready").exists());
    kin.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": id}}));
    let cancelled = kin.response(turn, Duration::from_secs(20), |_| {});
    assert_eq!(cancelled["result"]["stopReason"], "cancelled", "{cancelled}");
    assert_eq!(call(&mut kin, "session/close", json!({"sessionId": id}))["result"], json!({}));
    let load = kin.request("session/load", json!({"sessionId": id, "cwd": dirs.cwd(), "mcpServers": []}));
    let mut replayed = String::new();
    kin.response(load, Duration::from_secs(20), |frame| {
        let update = &frame["params"]["update"];
        if update["sessionUpdate"] == "agent_message_chunk" {
            replayed.push_str(update["content"]["text"].as_str().unwrap_or(""));
        }
    });
    assert_eq!(replayed, streamed, "load shows what the user saw");
    kin.close_stdin();
    let _ = kin.child.wait();
    // In the log: the partial message, then the step's end and the aborted turn.
    let log = std::fs::read_to_string(dirs.store().locate(&id).unwrap().unwrap()).unwrap();
    let kinds: Vec<String> = log
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["type"].as_str().unwrap().to_string())
        .collect();
    let end = kinds.iter().position(|k| k == "turn/end").unwrap();
    assert_eq!(kinds[end - 2..=end], ["assistant/message", "step/end", "turn/end"], "{kinds:?}");
    assert!(log.contains(r#""reason":{"kind":"aborted"}"#));
}

fn chat_sse(deltas: &[Value], finish: &str) -> ResponseTemplate {
    let chunk = |delta: &Value, finish: Option<&str>| json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    let mut body: String = deltas.iter().map(|d| format!("data: {}\n\n", chunk(d, None))).collect();
    body.push_str(&format!("data: {}\n\ndata: [DONE]\n\n", chunk(&json!({}), Some(finish))));
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

/// `kin acp --permission-mode MODE` against the mock as DeepSeek.
fn kin_http(dirs: &Dirs, server: &MockServer, mode: &str) -> Peer {
    let mut command = Command::new(KIN);
    command
        .args(["acp", "--config", "/dev/null", "--permission-mode", mode, "--sessions"])
        .arg(dirs.sessions())
        .current_dir(dirs.cwd())
        .env("DEEPSEEK_BASE_URL", server.uri())
        .env("DEEPSEEK_API_KEY", "sk-modes")
        .env_remove("KIN_MODEL")
        .env_remove("KIN_PERMISSION_MODE")
        .stderr(Stdio::null());
    Peer::spawn(&mut command)
}

fn current_mode(answer: &Value) -> &str {
    answer["result"]["modes"]["currentModeId"].as_str().unwrap_or_else(|| panic!("{answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_session_never_runs_in_a_mode_looser_than_the_start_mode() {
    let server = MockServer::start().await;
    let touch = json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"touch pwned\"}"}}]});
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(chat_sse(&[touch], "tool_calls"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(chat_sse(&[json!({"content": "done"})], "stop"))
        .mount(&server)
        .await;
    let dirs = Dirs::new();

    // A session set to bypass by its editor, in a kin started in ask.
    let mut first = kin_http(&dirs, &server, "ask");
    let id = open(&mut first, &dirs.cwd());
    assert!(call(&mut first, "session/set_mode", json!({"sessionId": id, "modeId": "bypass"}))["result"].is_object());
    let relaxed = open_then_set(&mut first, &dirs.cwd(), "read-only");
    first.close_stdin();
    assert!(first.child.wait().unwrap().success());

    // A kin started read-only loads, resumes and forks it read-only, and bash is refused unasked.
    let mut second = kin_http(&dirs, &server, "read-only");
    call(&mut second, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    let load = call(&mut second, "session/load", json!({"sessionId": id, "cwd": dirs.cwd(), "mcpServers": []}));
    assert_eq!(current_mode(&load), "read-only");
    let fork = call(&mut second, "session/fork", json!({"sessionId": id, "cwd": dirs.cwd(), "mcpServers": []}));
    assert_eq!(current_mode(&fork), "read-only");
    let turn = second.request("session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "go"}]}));
    let mut asked = false;
    let mut refused = false;
    let end = second.response(turn, Duration::from_secs(30), |frame| {
        asked |= frame["method"] == "session/request_permission";
        let update = &frame["params"]["update"];
        refused |= update["status"] == "failed" && update.to_string().contains("not allowed in read-only mode");
    });
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    assert!(refused && !asked, "bash is refused by read-only mode, without a question");
    assert!(!dirs.cwd().join("pwned").exists(), "bash never ran");
    assert_eq!(call(&mut second, "session/close", json!({"sessionId": id}))["result"], json!({}));
    let resume = call(&mut second, "session/resume", json!({"sessionId": id, "cwd": dirs.cwd()}));
    assert_eq!(current_mode(&resume), "read-only");
    second.close_stdin();
    assert!(second.child.wait().unwrap().success());

    // A recorded mode stricter than the start mode is kept.
    let mut third = kin_http(&dirs, &server, "bypass");
    call(&mut third, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    let load = call(&mut third, "session/load", json!({"sessionId": relaxed, "cwd": dirs.cwd(), "mcpServers": []}));
    assert_eq!(current_mode(&load), "read-only");
    let load = call(&mut third, "session/load", json!({"sessionId": id, "cwd": dirs.cwd(), "mcpServers": []}));
    assert_eq!(current_mode(&load), "bypass", "the recorded bypass comes back where kin allows it");
    third.close_stdin();
    assert!(third.child.wait().unwrap().success());
}

/// A second session (on an initialized peer) set to `mode`; returns its id.
fn open_then_set(kin: &mut Peer, cwd: &Path, mode: &str) -> String {
    let created = call(kin, "session/new", json!({"cwd": cwd, "mcpServers": []}));
    let id = created["result"]["sessionId"].as_str().unwrap().to_string();
    assert!(call(kin, "session/set_mode", json!({"sessionId": id, "modeId": mode}))["result"].is_object());
    id
}

/// [`kin`], on which a file-size limit set later ([`fill_disk`]) fails its writes with EFBIG, as
/// a full disk fails them with ENOSPC (the writer treats both alike): kin catches SIGXFSZ itself
/// (`signals`), so the limit does not kill it.
/// Without `replay` it serves the HTTP model (never called by the tests that use it that way),
/// and starts MCP servers, which a replay answers from its recording instead.
fn kin_on_a_disk_that_fills(dirs: &Dirs, replay: Option<&Path>, mode: &str) -> Peer {
    let mut command = Command::new(KIN);
    command.args(["acp", "--config", "/dev/null", "--sessions"]).arg(dirs.sessions());
    if let Some(replay) = replay {
        command.arg("--replay").arg(replay);
    }
    command
        .args(["--permission-mode", mode])
        .current_dir(dirs.cwd())
        .env("DEEPSEEK_API_KEY", "sk-placeholder-never-sent")
        .stderr(Stdio::null());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("KIN_") {
            command.env_remove(key);
        }
    }
    Peer::spawn(&mut command)
}

/// Fills kin's disk: its soft file-size limit drops to one byte (`prlimit --pid`), so that every
/// append to a log fails from now on.
fn fill_disk(kin: &Peer) {
    let status = Command::new("prlimit").args(["--pid", &kin.child.id().to_string(), "--fsize=1:"]).status();
    assert!(status.unwrap().success(), "prlimit lowers kin's soft file-size limit");
}

/// The `data` of every event of `kind` in session `id`'s log, as the file holds it now.
fn logged(dirs: &Dirs, id: &str, kind: &str) -> Vec<Value> {
    let log = std::fs::read_to_string(dirs.store().locate(id).unwrap().unwrap()).unwrap();
    log.lines()
        .skip(1)
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|event| event["type"] == kind)
        .map(|event| event["data"].clone())
        .collect()
}

#[test]
fn settings_are_answered_once_on_disk_and_refused_unchanged_when_the_log_cannot_be_written() {
    let dirs = Dirs::new();
    replay_of(&dirs.replay(), json!([answer("fine")]));
    let mut kin = kin_on_a_disk_that_fills(&dirs, Some(&dirs.replay()), "bypass");
    let id = open(&mut kin, &dirs.cwd());
    let set = |kin: &mut Peer, option: &str, value: &str| {
        call(kin, "session/set_config_option", json!({"sessionId": id, "configId": option, "value": value}))
    };

    // Between turns, each answer comes once its event is in the log (written and synced).
    let mode = call(&mut kin, "session/set_mode", json!({"sessionId": id, "modeId": "ask"}));
    assert!(mode["result"].is_object(), "{mode}");
    assert_eq!(logged(&dirs, &id, "session/mode"), [json!({"mode": "ask"})]);
    let model = set(&mut kin, "model", "deepseek/deepseek-v4-pro");
    assert!(model["result"].is_object(), "{model}");
    assert_eq!(logged(&dirs, &id, "session/model"), [json!({"provider": "deepseek", "model": "deepseek-v4-pro"})]);
    let sandbox = set(&mut kin, "sandbox", "read-only");
    assert!(sandbox["result"].is_object(), "{sandbox}");
    assert_eq!(logged(&dirs, &id, "session/sandbox"), [json!({"level": "read-only", "network": false})]);

    // Once the log cannot be written, each is refused naming the cause, and nothing changes.
    fill_disk(&kin);
    let refusals = [
        call(&mut kin, "session/set_mode", json!({"sessionId": id, "modeId": "read-only"})),
        set(&mut kin, "model", "deepseek/deepseek-v4-flash"),
        set(&mut kin, "sandbox", "workspace-write"),
    ];
    for refused in &refusals {
        assert_eq!(refused["error"]["code"], -32603, "{refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains("was not changed") && message.contains("File too large"), "{refused}");
    }
    let resumed = call(&mut kin, "session/resume", json!({"sessionId": id, "cwd": dirs.cwd()}));
    assert_eq!(current_mode(&resumed), "ask", "the mode is unchanged");
    let options = &resumed["result"]["configOptions"];
    assert_eq!(options[0]["currentValue"], "deepseek/deepseek-v4-pro", "the model is unchanged: {resumed}");
    assert_eq!(options[1]["currentValue"], "read-only", "the sandbox is unchanged: {resumed}");
    assert_eq!(logged(&dirs, &id, "session/mode").len(), 1);
    assert_eq!(logged(&dirs, &id, "session/model").len(), 1);
    assert_eq!(logged(&dirs, &id, "session/sandbox").len(), 1);

    // A turn that cannot be saved leaves events the close cannot write either: the close says so,
    // and the session is closed all the same.
    let turn = prompt(&mut kin, &id, "hello");
    assert_eq!(turn["error"]["code"], -32603, "{turn}");
    let closed = call(&mut kin, "session/close", json!({"sessionId": id}));
    assert_eq!(closed["error"]["code"], -32603, "{closed}");
    let message = closed["error"]["message"].as_str().unwrap();
    assert!(message.contains("is closed") && message.contains("could not write"), "{closed}");
    assert!(message.contains("File too large"), "{closed}");
    let again = call(&mut kin, "session/close", json!({"sessionId": id}));
    assert_eq!(again["error"]["code"], -32002, "{again}");
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// Loading a live session reads its log back: when the live session's last events cannot be
/// written, the load says so (they are lost) instead of showing the log as if nothing were
/// missing; once the disk has room, a load brings the session back as it was last written.
#[test]
fn a_load_over_a_live_session_whose_last_events_cannot_be_written_says_so() {
    let dirs = Dirs::new();
    replay_of(&dirs.replay(), json!([answer("fine")]));
    let mut kin = kin_on_a_disk_that_fills(&dirs, Some(&dirs.replay()), "bypass");
    let id = open(&mut kin, &dirs.cwd());
    fill_disk(&kin);
    let turn = prompt(&mut kin, &id, "hello");
    assert_eq!(turn["error"]["code"], -32603, "{turn}");
    let load = json!({"sessionId": id, "cwd": dirs.cwd(), "mcpServers": []});
    let refused = call(&mut kin, "session/load", load.clone());
    assert_eq!(refused["error"]["code"], -32603, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("not everything of it could be saved") && message.contains("File too large"), "{refused}");
    assert!(message.contains("load it again"), "{refused}");
    let status = Command::new("prlimit").args(["--pid", &kin.child.id().to_string(), "--fsize=unlimited:"]).status();
    assert!(status.unwrap().success(), "prlimit restores kin's soft file-size limit");
    let loaded = call(&mut kin, "session/load", load);
    assert!(loaded["result"].is_object(), "{loaded}");
    kin.close_stdin();
    let _ = kin.child.wait();
}

#[test]
fn a_mode_set_during_a_turn_is_on_disk_when_answered_while_the_turn_runs() {
    let dirs = Dirs::new();
    replay_of(
        &dirs.replay(),
        json!([{"kind":"hang","readyFile":".ready","chunks":[{"type":"block-start","index":0,"blockType":"text"},{"type":"text-delta","index":0,"text":"thinking"}]}]),
    );
    let mut kin = kin(&dirs, &dirs.replay(), "bypass");
    let id = open(&mut kin, &dirs.cwd());
    let turn = kin.request("session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "go"}]}));
    common::until_blocking("the turn to reach the model", || dirs.cwd().join(".ready").exists());
    let set = call(&mut kin, "session/set_mode", json!({"sessionId": id, "modeId": "read-only"}));
    assert!(set["result"].is_object(), "{set}");
    assert_eq!(logged(&dirs, &id, "session/mode"), [json!({"mode": "read-only"})], "written by the running turn");
    assert!(logged(&dirs, &id, "turn/end").is_empty(), "the turn still runs");
    kin.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": id}}));
    let cancelled = kin.response(turn, Duration::from_secs(20), |_| {});
    assert_eq!(cancelled["result"]["stopReason"], "cancelled", "{cancelled}");
    let resumed = call(&mut kin, "session/resume", json!({"sessionId": id, "cwd": dirs.cwd()}));
    assert_eq!(current_mode(&resumed), "read-only");
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// A session whose log cannot be created never existed: `session/new` says so, and none of the
/// MCP servers it named is started (they outlived the refused session, one more per retry).
#[test]
fn a_session_that_cannot_be_created_starts_no_mcp_server() {
    let dirs = Dirs::new();
    let mut kin = kin_on_a_disk_that_fills(&dirs, None, "bypass");
    call(&mut kin, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    fill_disk(&kin);
    let server = |marker: &Path| {
        let script = format!("touch '{}'; sleep 30", marker.display());
        json!({"name": "probe", "command": "sh", "args": ["-c", script], "env": []})
    };
    let (refused_marker, created_marker) = (dirs.cwd().join("refused-started"), dirs.cwd().join("created-started"));
    let refused = call(&mut kin, "session/new", json!({"cwd": dirs.cwd(), "mcpServers": [server(&refused_marker)]}));
    assert_eq!(refused["error"]["code"], -32603, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("cannot create the session log"), "{refused}");
    // With room again, a session is created and its server starts: by then the refused
    // session's would have started too, had it been.
    let status = Command::new("prlimit").args(["--pid", &kin.child.id().to_string(), "--fsize=unlimited:"]).status();
    assert!(status.unwrap().success());
    let created = call(&mut kin, "session/new", json!({"cwd": dirs.cwd(), "mcpServers": [server(&created_marker)]}));
    assert!(created["result"]["sessionId"].is_string(), "{created}");
    common::until_blocking("the created session's MCP server to start", || created_marker.exists());
    assert!(!refused_marker.exists(), "the MCP server of a session that was never created did not start");
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// What kin does not support is refused by name on `session/load` and `session/resume` as on
/// `session/new` and `session/fork`, never ignored: extra directories and a system prompt.
#[test]
fn load_and_resume_refuse_what_kin_does_not_support() {
    let dirs = Dirs::new();
    replay_of(&dirs.replay(), json!([answer("fine")]));
    let mut kin = kin(&dirs, &dirs.replay(), "bypass");
    let id = open(&mut kin, &dirs.cwd());
    let system_prompt = json!({"mode": "append", "content": [{"type": "text", "text": "be terse"}]});
    for method in ["session/load", "session/resume"] {
        let base = json!({"sessionId": id, "cwd": dirs.cwd(), "mcpServers": []});
        for (extra, message) in [
            (json!({"additionalDirectories": ["/tmp"]}), "Invalid params: additionalDirectories is not supported"),
            (json!({"systemPrompt": system_prompt}), "Invalid params: systemPrompt is not supported"),
        ] {
            let mut params = base.clone();
            params.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let answer = call(&mut kin, method, params);
            assert_eq!(answer["error"]["code"], -32602, "{method}: {answer}");
            assert_eq!(answer["error"]["message"], message, "{method}: {answer}");
        }
    }
    kin.close_stdin();
    let _ = kin.child.wait();
}

/// A session's working directory must exist: `session/new` and `session/fork` refuse a path that
/// is not a directory (every command, MCP server and file tool of the session would fail there).
#[test]
fn a_cwd_that_is_not_an_existing_directory_is_refused() {
    let dirs = Dirs::new();
    replay_of(&dirs.replay(), json!([answer("fine")]));
    let mut kin = kin(&dirs, &dirs.replay(), "bypass");
    let id = open(&mut kin, &dirs.cwd());
    let file = dirs.cwd().join("a-file");
    std::fs::write(&file, "").unwrap();
    for cwd in [dirs.cwd().join("not-there"), file] {
        let requests = [
            ("session/new", json!({"cwd": cwd, "mcpServers": []})),
            ("session/fork", json!({"sessionId": id, "cwd": cwd, "mcpServers": []})),
        ];
        for (method, params) in requests {
            let answer = call(&mut kin, method, params);
            assert_eq!(answer["error"]["code"], -32602, "{method}: {answer}");
            let expected = format!(
                "Invalid params: cwd {} is not an existing directory; give the absolute path of the workspace",
                cwd.display()
            );
            assert_eq!(answer["error"]["message"], expected.as_str(), "{method}");
        }
    }
    kin.close_stdin();
    let _ = kin.child.wait();
}
