//! The sandbox through the real `kin acp` binary (replay mode, over pipes): a command's
//! `setsid` and double-forked processes die when kin is killed with SIGKILL or exits; a kernel
//! without Landlock (or with an old ABI), simulated with `KIN_SANDBOX_TEST_ABI` in this debug
//! build, gives the fallback notice and behaviour; the editor's selector and its restore rule.
//! And children inherit it: an in-process background child, and an `acp` child that is kin.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{KIN, Peer};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);
const PROMPT: &str = "Run the command.";

/// A recorded session whose model runs `command` with bash, then answers "done".
fn replay(root: &Path, command: &str) -> PathBuf {
    replay_in(root, "replay", command)
}

/// [`replay`] in `root/name`.
fn replay_in(root: &Path, name: &str, command: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let arguments = json!({"command": command, "description": "Run it"}).to_string();
    let call = json!({"type": "tool-call", "id": "call_1", "name": "bash", "arguments": arguments});
    let chunk = |seq: u64, step: u64, chunk: Value| json!({"type": "assistant/chunk", "seq": seq, "time": 0, "data": {"turn": 1, "step": step, "chunk": chunk}});
    let lines = [
        json!({"type":"session","version":0,"id":"00000000-0000-4000-8000-000000000001","createdAt":0,"cwd":"{{cwd}}","delegationDepth":0}),
        json!({"type":"turn/start","seq":0,"time":0,"data":{"turn":1,"trigger":{"kind":"message","source":{"kind":"user"}}}}),
        json!({"type":"user/message","seq":1,"time":0,"data":{"content":[{"type":"text","text":PROMPT}],"source":{"kind":"user"},"role":"user","id":"u1"},"surfaceOp":"append"}),
        chunk(2, 1, json!({"type": "block-start", "index": 0, "blockType": "tool-call"})),
        chunk(3, 1, json!({"type": "block-end", "index": 0, "block": call})),
        chunk(4, 1, json!({"type": "finish", "reason": {"kind": "tool-calls"}})),
        chunk(5, 2, json!({"type": "block-start", "index": 0, "blockType": "text"})),
        chunk(6, 2, json!({"type": "text-delta", "index": 0, "text": "done"})),
        chunk(7, 2, json!({"type": "block-end", "index": 0, "block": {"type": "text", "text": "done"}})),
        chunk(8, 2, json!({"type": "finish", "reason": {"kind": "stop"}})),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("session.jsonl"), text).unwrap();
    dir
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ws: PathBuf,
    outside: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let (ws, outside) = (root.join("ws"), root.join("outside"));
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    Setup { _dir: dir, root, ws, outside }
}

/// `kin acp` in bypass mode replaying `command`, with the config file text `config`.
fn kin(s: &Setup, command: &str, config: &str, env: &[(&str, &str)]) -> Command {
    let config_path = s.root.join("config.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut kin = Command::new(KIN);
    kin.args(["acp", "--permission-mode", "bypass", "--config"])
        .arg(&config_path)
        .arg("--sessions")
        .arg(s.root.join("sessions"))
        .arg("--replay")
        .arg(replay(&s.root, command))
        .arg("--log-file")
        .arg(s.root.join("kin.log"))
        .stderr(Stdio::null());
    kin.env_remove("KIN_SANDBOX_TEST_ABI");
    // The sandbox's private temp dir is made under TMPDIR: here, inside the test's dir, so a kin
    // killed with SIGKILL (which cannot remove it) leaves nothing behind in the system's /tmp.
    let tmp = s.root.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    kin.env("TMPDIR", &tmp);
    for (k, v) in env {
        kin.env(k, v);
    }
    kin
}

/// Initializes, opens a session in the workspace and sends the prompt; returns the prompt's id.
fn start_turn(peer: &mut Peer, ws: &Path) -> (u64, String) {
    peer.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), T);
    let new = peer.call("session/new", json!({"cwd": ws, "mcpServers": []}), T);
    let id = new["result"]["sessionId"].as_str().unwrap().to_string();
    let prompt = peer.request("session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": PROMPT}]}));
    (prompt, id)
}

/// A `setsid` grandchild and a double-forked daemon writing their pids to `a.pid` and `b.pid`,
/// then a long sleep.
const ESCAPEES: &str = "setsid sh -c 'echo $$ > a.pid; exec sleep 60' >/dev/null 2>&1 </dev/null & \
     ( setsid sh -c 'sh -c \"echo \\$\\$ > b.pid; exec sleep 60\" >/dev/null 2>&1 </dev/null &' & ) ; \
     while [ ! -s a.pid ] || [ ! -s b.pid ]; do sleep 0.02; done; sleep 60";

fn marker_pids(ws: &Path) -> Vec<String> {
    let read = |name: &str| std::fs::read_to_string(ws.join(name)).ok().filter(|p| p.ends_with('\n'));
    common::until_blocking("the marker processes to write their pids", || {
        read("a.pid").is_some() && read("b.pid").is_some()
    });
    let pids: Vec<String> = ["a.pid", "b.pid"].iter().map(|n| read(n).unwrap().trim().to_string()).collect();
    // A shell writes its pid just before it execs `sleep`: wait for the exec.
    let is_sleep = |pid: &String| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).starts_with("sleep\0")
    };
    common::until_blocking("the marker processes to exec sleep", || pids.iter().all(is_sleep));
    pids
}

fn gone(pids: &[String]) -> bool {
    pids.iter().all(|pid| !Path::new("/proc").join(pid).exists())
}

#[test]
fn after_kill_9_of_kin_no_command_process_survives() {
    for sandbox in ["off", "workspace-write"] {
        let s = setup();
        let mut peer = Peer::spawn(&mut kin(&s, ESCAPEES, &format!("sandbox = \"{sandbox}\"\n"), &[]));
        start_turn(&mut peer, &s.ws);
        let pids = marker_pids(&s.ws);
        peer.child.kill().unwrap();
        peer.child.wait().unwrap();
        common::until_blocking(&format!("the marker processes to die with kin ({sandbox})"), || gone(&pids));
    }
}

#[test]
fn kin_exiting_kills_a_running_command_and_its_escapees() {
    let s = setup();
    let mut peer = Peer::spawn(&mut kin(&s, ESCAPEES, "", &[]));
    start_turn(&mut peer, &s.ws);
    let pids = marker_pids(&s.ws);
    peer.exit();
    common::until_blocking("the marker processes to die when kin exits", || gone(&pids));
}

/// Runs one turn writing inside and outside the workspace; returns every frame kin sent.
fn write_turn(s: &Setup, config: &str, env: &[(&str, &str)]) -> Vec<Value> {
    let command = format!("echo x > inside; echo x > {}/o; echo ran", s.outside.display());
    let mut peer = Peer::spawn(&mut kin(s, &command, config, env));
    let (prompt, _) = start_turn(&mut peer, &s.ws);
    let mut frames = Vec::new();
    let response = peer.response(prompt, T, |f| frames.push(f.clone()));
    assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
    peer.close_stdin();
    let _ = peer.child.wait();
    frames
}

/// The texts of the tool call's updates (progress notes and the result), in order.
fn call_texts(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["params"]["update"]["sessionUpdate"] == "tool_call_update")
        .flat_map(|f| f["params"]["update"]["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["content"]["text"].as_str().map(str::to_string))
        .collect()
}

fn log(s: &Setup) -> String {
    std::fs::read_to_string(s.root.join("kin.log")).unwrap_or_default()
}

#[test]
fn without_landlock_kin_says_so_and_commands_run_unconfined() {
    let s = setup();
    let frames = write_turn(&s, "sandbox = \"workspace-write\"\n", &[("KIN_SANDBOX_TEST_ABI", "0")]);
    let texts = call_texts(&frames);
    assert!(
        texts[0].starts_with("not sandboxed: sandbox workspace-write requested, but this kernel has no Landlock"),
        "{texts:?}"
    );
    assert!(texts[0].contains("permission questions"), "{texts:?}");
    assert!(s.outside.join("o").exists(), "unconfined: the outside write went through");
    assert!(!texts.iter().any(|t| t.contains("blocked by the sandbox")), "{texts:?}");
    assert_eq!(log(&s).matches("this kernel has no Landlock").count(), 1, "said once: {}", log(&s));
}

#[test]
fn an_older_abi_refuses_to_count_as_sandboxed_unless_fallback_is_warn() {
    let s = setup();
    let frames = write_turn(&s, "sandbox = \"workspace-write\"\n", &[("KIN_SANDBOX_TEST_ABI", "3")]);
    let texts = call_texts(&frames);
    assert!(texts[0].starts_with("not sandboxed: "), "{texts:?}");
    assert!(
        texts[0].contains("ioctl on device files") && texts[0].contains("sandbox_fallback = \"warn\""),
        "{texts:?}"
    );
    assert!(s.outside.join("o").exists());

    let s = setup();
    let config = "sandbox = \"workspace-write\"\nsandbox_fallback = \"warn\"\n";
    let frames = write_turn(&s, config, &[("KIN_SANDBOX_TEST_ABI", "3")]);
    let texts = call_texts(&frames);
    assert!(texts[0].starts_with("sandboxed: workspace-write (the kernel does not enforce: ioctl"), "{texts:?}");
    assert!(!s.outside.join("o").exists(), "ABI 3 still confines writes");
    assert!(s.ws.join("inside").exists());
    let result = texts.last().unwrap();
    assert!(result.contains(&format!("blocked by the sandbox: {}", s.outside.join("o").display())), "{result}");
    assert!(log(&s).contains("runs without: ioctl on device files"), "{}", log(&s));
}

/// The sandbox option's current value in a response's `configOptions`.
fn sandbox_value(response: &Value) -> String {
    let options = response["result"]["configOptions"].as_array().unwrap_or_else(|| panic!("{response}"));
    let option = options.iter().find(|o| o["id"] == "sandbox").unwrap_or_else(|| panic!("{response}"));
    option["currentValue"].as_str().unwrap().to_string()
}

fn session_events(s: &Setup, id: &str) -> Vec<Value> {
    let store = kin::testkit::session::SessionStore::new(s.root.join("sessions"));
    store.inspect(id).unwrap().events.into_iter().map(|e| json!({"type": e.kind, "data": e.data})).collect()
}

#[test]
fn the_editor_selects_the_sandbox_and_a_restored_session_is_never_looser_than_the_start() {
    let s = setup();
    let start = |sandbox: &str| {
        let mut peer = Peer::spawn(&mut kin(&s, "true", &format!("sandbox = \"{sandbox}\"\n"), &[]));
        peer.call("initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}), T);
        peer
    };
    let mut peer = start("off");
    let new = peer.call("session/new", json!({"cwd": s.ws, "mcpServers": []}), T);
    assert_eq!(sandbox_value(&new), "off");
    let options = new["result"]["configOptions"][1]["options"].as_array().unwrap().clone();
    let ids: Vec<&str> = options.iter().map(|o| o["value"].as_str().unwrap()).collect();
    assert_eq!(ids, ["off", "read-only", "read-only+network", "workspace-write", "workspace-write+network"]);
    let id = new["result"]["sessionId"].as_str().unwrap().to_string();
    let set = |peer: &mut Peer, value: &str| {
        peer.call("session/set_config_option", json!({"sessionId": id, "configId": "sandbox", "value": value}), T)
    };
    let bad = set(&mut peer, "jail");
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert!(bad["error"]["message"].as_str().unwrap().contains("\"jail\""), "{bad}");
    let chosen = set(&mut peer, "workspace-write+network");
    assert_eq!(sandbox_value(&chosen), "workspace-write+network");
    peer.close_stdin();
    peer.child.wait().unwrap();
    let recorded: Vec<Value> = session_events(&s, &id).into_iter().filter(|e| e["type"] == "session/sandbox").collect();
    assert_eq!(recorded, [json!({"type": "session/sandbox", "data": {"level": "workspace-write", "network": true}})]);

    // Started stricter (no network): the loaded session loses the network, keeps workspace-write.
    let mut peer = start("workspace-write");
    let loaded = peer.call("session/load", json!({"sessionId": id, "cwd": s.ws, "mcpServers": []}), T);
    assert_eq!(sandbox_value(&loaded), "workspace-write");
    // A fork of it (its seed holds the choice) is restored under the same rule.
    let fork = peer.call("session/fork", json!({"sessionId": id, "cwd": s.ws, "mcpServers": []}), T);
    let fork_id = fork["result"]["sessionId"].as_str().unwrap().to_string();
    let model = json!({"sessionId": fork_id, "configId": "model", "value": "deepseek/deepseek-v4-pro"});
    assert_eq!(sandbox_value(&peer.call("session/set_config_option", model, T)), "workspace-write");
    peer.close_stdin();
    peer.child.wait().unwrap();

    // Started as loose as the choice: it is kept (resume, from disk).
    let mut peer = start("off");
    let resumed = peer.call("session/resume", json!({"sessionId": id, "cwd": s.ws, "mcpServers": []}), T);
    assert_eq!(sandbox_value(&resumed), "workspace-write+network");
    peer.close_stdin();
    peer.child.wait().unwrap();

    // Started with read-only: read-only, whatever was chosen.
    let mut peer = start("read-only");
    let loaded = peer.call("session/load", json!({"sessionId": id, "cwd": s.ws, "mcpServers": []}), T);
    assert_eq!(sandbox_value(&loaded), "read-only");
    peer.close_stdin();
    peer.child.wait().unwrap();
}

#[test]
fn the_editor_sees_the_sandbox_on_the_call() {
    let s = setup();
    let frames = write_turn(&s, "sandbox = \"workspace-write\"\n", &[]);
    let texts = call_texts(&frames);
    // Live (progress) and in the result, before the output the model reads.
    assert_eq!(texts[0], "sandboxed: workspace-write");
    assert_eq!(texts[texts.len() - 2], "sandboxed: workspace-write");
    let result = texts.last().unwrap();
    assert!(result.starts_with("ran\n"), "{result}");
    assert!(result.contains(&format!("blocked by the sandbox: {}", s.outside.join("o").display())), "{result}");
    assert!(s.ws.join("inside").exists() && !s.outside.join("o").exists());
}

// ---------------------------------------------------------------------------------------------
// children inherit the sandbox

fn bash_result(events: &[kin::testkit::session::Event]) -> String {
    let result = events.iter().find(|e| e.kind == "tool/result").expect("a bash result");
    result.data["message"]["content"][0]["content"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_child_runs_its_commands_in_the_parents_sandbox() {
    if !kin::testkit::sandbox::landlock_for_tests() {
        return;
    }
    use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
    use kin::testkit::model::{Model, text_response, tool_call_response};
    let s = setup();
    let command = format!("echo x > inside; echo x > {}/o; echo ran", s.outside.display());
    let args = json!({"command": command, "description": "write"}).to_string();
    let model = ScriptedModel::new([]).route(
        "write around",
        [ReplayEntry::Chunks(tool_call_response("b", "bash", &args)), ReplayEntry::Chunks(text_response(&["ok"]))],
    );
    let config_path = s.root.join("config.toml");
    std::fs::write(&config_path, "sandbox = \"workspace-write\"\npermission_mode = \"bypass\"\n").unwrap();
    let overrides = kin::testkit::config::Overrides {
        config: Some(config_path),
        sessions: Some(s.root.join("sessions")),
        ..Default::default()
    };
    let config = kin::testkit::config::Config::resolve(&overrides, &|_| None).unwrap();
    let mut tools = kin::testkit::tools::ToolRegistry::new();
    kin::testkit::tools::builtin::register_coding_tools(&mut tools, kin::testkit::tools::fs::FileState::new());
    let rt =
        kin::testkit::runtime::Runtime::new(config, std::sync::Arc::new(model) as std::sync::Arc<dyn Model>, tools)
            .unwrap();
    let parent = rt.new_session(&s.ws, std::sync::Arc::new(common::Quiet)).unwrap();
    let header = rt.store().inspect(&parent).unwrap().header;
    let route = kin::testkit::model::ModelRoute::parse("test/m").unwrap();
    let caller = std::sync::Arc::new(kin::testkit::tools::Caller { header, depth: 0, route, history: None });
    let manager = rt.continuation().clone();
    let (child, _) =
        manager.start("spawn", "writer".into(), common::start_request(&caller, "write around")).await.unwrap();
    common::until("the child to settle", || !manager.is_resident(&child)).await;
    let result = bash_result(&rt.store().inspect(&child).unwrap().events);
    assert!(result.starts_with("ran\n"), "{result}");
    assert!(result.contains(&format!("blocked by the sandbox: {}", s.outside.join("o").display())), "{result}");
    assert!(s.ws.join("inside").exists() && !s.outside.join("o").exists());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_child_that_is_kin_runs_in_its_configured_sandbox() {
    if !kin::testkit::sandbox::landlock_for_tests() {
        return;
    }
    let s = setup();
    let command = format!("echo x > inside; echo x > {}/o; echo ran", s.outside.display());
    let replay = replay_in(&s.root, "child-replay", &command);
    let child_sessions = s.root.join("child-sessions");
    std::fs::create_dir_all(&child_sessions).unwrap();
    let quote = |p: &Path| serde_json::to_string(p.to_str().unwrap()).unwrap();
    // The child kin confines nothing itself (no config): the sandbox it runs in is the one kin
    // started it in, with its own sessions directory writable.
    let config = format!(
        "[acp_agents.kin]\ncommand = {}\nargs = [\"acp\", \"--replay\", {}, \"--sessions\", {}, \"--config\", \
         \"/dev/null\", \"--permission-mode\", \"bypass\"]\nsandbox = \"workspace-write\"\n\
         sandbox_writable_roots = [{}]\n",
        quote(Path::new(KIN)),
        quote(&replay),
        quote(&child_sessions),
        quote(&child_sessions),
    );
    let (rt, _) = common::runtime(&s.root, vec![], &config);
    let header = kin::testkit::session::SessionHeader::new("parent-1", 1, Some(s.ws.display().to_string()));
    let route = kin::testkit::model::ModelRoute::parse("p/m").unwrap();
    let caller = std::sync::Arc::new(kin::testkit::tools::Caller { header, depth: 0, route, history: None });
    let request = kin::testkit::subagent::StartRequest { max_depth: None, ..common::start_request(&caller, PROMPT) };
    let run = rt.subagents().start("acp:kin", request).await.unwrap();
    let result = tokio::time::timeout(T, run.result).await.unwrap().unwrap().unwrap();
    (run.dispose)().await.unwrap();
    assert_eq!(result.output, "done");
    let store = kin::testkit::session::SessionStore::new(&child_sessions);
    let child = store.list().into_iter().next().expect("the child's session");
    let result = bash_result(&store.inspect(&child.header.id).unwrap().events);
    assert!(result.starts_with("ran\n"), "{result}");
    assert!(s.ws.join("inside").exists(), "{result}");
    assert!(!s.outside.join("o").exists(), "the child kin's command wrote outside: {result}");
    rt.shutdown().await;
}

#[test]
fn kin_run_with_a_sandbox_runs_commands_in_accept_edits_confined_to_the_workspace() {
    if !kin::testkit::sandbox::landlock_for_tests() {
        return;
    }
    let s = setup();
    let command = format!("echo x > inside; echo x > {}/o; echo ran", s.outside.display());
    let output = Command::new(KIN)
        .args(["run", "--config", "/dev/null", "--sessions"])
        .arg(s.root.join("sessions"))
        .arg("--replay")
        .arg(replay(&s.root, &command))
        .arg("--cwd")
        .arg(&s.ws)
        .args(["--permission-mode", "accept-edits", "--sandbox", "workspace-write", PROMPT])
        .env_remove("KIN_SANDBOX_TEST_ABI")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "done");
    assert!(s.ws.join("inside").exists(), "{stderr}");
    assert!(!s.outside.join("o").exists(), "{stderr}");
}
