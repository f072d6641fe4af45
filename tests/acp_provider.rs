//! The `acp` provider over real processes: kin itself as the child (replay mode), through the
//! service and through a parent turn's delegation tool; broken children (command missing, exits
//! at once, answers garbage, hangs after initialize, wrong protocol version), each a clear error
//! within its timeout with the process reaped; cancellation and the turn timeout reaching the
//! child's own log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kin::testkit::agent::TurnEnd;
use kin::testkit::model::script::ReplayEntry;
use kin::testkit::model::{ModelRoute, text_response, tool_call_response};
use kin::testkit::runtime::Runtime;
use kin::testkit::session::{Event, SessionHeader, SessionStore};
use kin::testkit::subagent::external::{AcpProvider, ExternalAgentConfig};
use kin::testkit::subagent::{ErrorCode, StartRequest, StopReason, SubagentError};
use kin::testkit::tools::Caller;
use serde_json::{Value, json};

#[allow(dead_code)]
mod common;
use common::{Quiet, runtime, start_request, until};

const KIN: &str = env!("CARGO_BIN_EXE_kin");

/// The session id the kin child mints (its replay log's header id).
const CHILD_ID: &str = "00000000-0000-4000-8000-000000000001";

/// The child's recorded scenario: one turn answering `CHILD_VIA_ACP` in two chunks.
const CHILD_LOG: &str = concat!(
    r#"{"type":"session","version":0,"id":"00000000-0000-4000-8000-000000000001","createdAt":0,"cwd":"{{cwd}}","delegationDepth":0}"#,
    "\n",
    r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1,"trigger":{"kind":"message","source":{"kind":"user"}}}}"#,
    "\n",
    r#"{"type":"user/message","seq":1,"time":0,"data":{"content":[{"type":"text","text":"Say it."}],"source":{"kind":"user"},"role":"user","id":"cdcf9bfe-8b4d-4cf2-8b62-695e86064a65"},"surfaceOp":"append"}"#,
    "\n",
    r#"{"type":"step/start","seq":2,"time":0,"data":{"turn":1,"step":1}}"#,
    "\n",
    r#"{"type":"assistant/chunk","seq":3,"time":0,"data":{"turn":1,"step":1,"chunk":{"type":"block-start","index":0,"blockType":"text"}}}"#,
    "\n",
    r#"{"type":"assistant/chunk","seq":4,"time":0,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"CHILD_"}}}"#,
    "\n",
    r#"{"type":"assistant/chunk","seq":5,"time":0,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"VIA_ACP"}}}"#,
    "\n",
    r#"{"type":"assistant/chunk","seq":6,"time":0,"data":{"turn":1,"step":1,"chunk":{"type":"block-end","index":0,"block":{"type":"text","text":"CHILD_VIA_ACP"}}}}"#,
    "\n",
    r#"{"type":"assistant/chunk","seq":7,"time":0,"data":{"turn":1,"step":1,"chunk":{"type":"finish","reason":{"kind":"stop"}}}}"#,
    "\n",
    r#"{"type":"step/end","seq":8,"time":0,"data":{"turn":1,"step":1}}"#,
    "\n",
    r#"{"type":"turn/end","seq":9,"time":0,"data":{"turn":1,"reason":{"kind":"completed"}}}"#,
    "\n",
);

/// A scenario directory for the kin child; `hang` makes its only model call hang.
fn replay_dir(root: &Path, name: &str, hang: bool) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("session.jsonl"), CHILD_LOG).unwrap();
    if hang {
        std::fs::write(dir.join("replay.override.json"), r#"[{"kind":"hang"}]"#).unwrap();
    }
    dir
}

/// `[acp_agents.KEY]` running the kin binary in replay mode with its own sessions directory.
fn kin_agent_toml(key: &str, replay: &Path, child_sessions: &Path, extra: &str) -> String {
    let quote = |s: &str| serde_json::to_string(s).unwrap();
    let args = ["acp", "--replay", replay.to_str().unwrap(), "--sessions", child_sessions.to_str().unwrap()];
    let mut args: Vec<String> = args.into_iter().map(quote).collect();
    args.extend([quote("--config"), quote("/dev/null")]);
    format!("[acp_agents.{key}]\ncommand = {}\nargs = [{}]\n{extra}", quote(KIN), args.join(", "))
}

/// The parent's workspace (the child's default cwd).
fn workspace(root: &Path) -> PathBuf {
    let cwd = root.join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    cwd
}

fn request(cwd: &Path) -> StartRequest {
    let header = SessionHeader::new("parent-1", 1, Some(cwd.display().to_string()));
    let parent = Arc::new(Caller { header, depth: 0, route: ModelRoute::parse("p/m").unwrap(), history: None });
    StartRequest { label: Some("ask kin".into()), max_depth: None, ..start_request(&parent, "Say it.") }
}

/// The events of the kin child's only session (empty until it exists).
fn child_events(child_sessions: &Path) -> Vec<Event> {
    let store = SessionStore::new(child_sessions);
    let sessions = store.list();
    assert!(sessions.len() <= 1, "one child session at most");
    sessions.first().and_then(|s| store.inspect(&s.header.id).ok()).map(|s| s.events).unwrap_or_default()
}

/// Live processes whose command line mentions `marker`.
fn pids_mentioning(marker: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            pids.push(pid);
        }
    }
    pids
}

/// The process is gone: not running, and not a zombie either (reaped).
fn assert_reaped(pid: &str) {
    assert!(!Path::new("/proc").join(pid).exists(), "process {pid} is still there (running or an unreaped zombie)");
}

#[tokio::test]
async fn kin_as_the_child_answers_through_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let replay = replay_dir(dir.path(), "replay", false);
    let child_sessions = dir.path().join("child-sessions");
    let config = kin_agent_toml("kin", &replay, &child_sessions, "startup_timeout_secs = 30\n");
    let (rt, _) = runtime(dir.path(), vec![], &config);
    assert_eq!(rt.subagents().list(), ["spawn", "fork", "acp:kin"]);
    let run = rt.subagents().start("acp:kin", request(&workspace(dir.path()))).await.unwrap();
    assert!(run.id.starts_with("acp-") && !run.local && run.cwd.is_none(), "{}", run.id);
    let result = tokio::time::timeout(Duration::from_secs(30), run.result).await.unwrap().unwrap().unwrap();
    (run.dispose)().await.unwrap();
    assert_eq!((result.output.as_str(), result.stop_reason), ("CHILD_VIA_ACP", StopReason::Completed));
    let remote = result.remote.expect("a remote run");
    assert_eq!(
        (remote.provider.as_str(), remote.command.as_str(), remote.child_session_id.as_str()),
        ("acp:kin", "kin", CHILD_ID)
    );
    assert_eq!(remote.error, None);
    // The child kept its own log of the task, in the parent's cwd.
    let events = child_events(&child_sessions);
    let prompt = events.iter().find(|e| e.kind == "user/message").unwrap();
    assert_eq!(prompt.data["content"][0]["text"], "Say it.");
    assert_eq!(events.last().unwrap().data["reason"]["kind"], "completed");
    assert!(pids_mentioning(replay.to_str().unwrap()).is_empty(), "the child exited");
    // Remote runs have no local session.
    assert!(rt.store().list().is_empty());
    rt.shutdown().await;
}

#[tokio::test]
async fn a_parent_turn_delegates_to_kin_and_records_the_remote_run() {
    let dir = tempfile::tempdir().unwrap();
    let replay = replay_dir(dir.path(), "replay", false);
    let child_sessions = dir.path().join("child-sessions");
    let config = format!(
        "permission_mode = \"bypass\"\n{}",
        kin_agent_toml("kin", &replay, &child_sessions, "permission = \"allow-reads\"\n")
    );
    let entries = vec![
        ReplayEntry::Chunks(tool_call_response(
            "c1",
            "delegate_kin",
            r#"{"description":"ask kin","prompt":"Say it."}"#,
        )),
        ReplayEntry::Chunks(text_response(&["parent done"])),
    ];
    let (rt, model) = runtime(dir.path(), entries, &config);
    let cwd = workspace(dir.path());
    let id = rt.new_session(&cwd, Arc::new(Quiet)).unwrap();
    let turn = rt.prompt(&id, vec![json!({"type": "text", "text": "go"})]).unwrap();
    let end = tokio::time::timeout(Duration::from_secs(30), turn).await.unwrap().unwrap();
    assert_eq!(end, TurnEnd::Completed);
    let requests = model.requests();
    let tool = requests[0].tools.iter().find(|t| t.name == "delegate_kin").expect("the delegation tool is offered");
    assert!(tool.description.contains("it does not see this conversation"), "{}", tool.description);
    assert!(tool.description.contains("external agent `kin`"), "{}", tool.description);
    assert!(tool.parameters["properties"].get("run_in_background").is_none(), "no background mode");
    let log = rt.store().inspect(&id).unwrap().events;
    let remote = log.iter().find(|e| e.kind == "subagent/remote-run").expect("the run is recorded");
    assert!(remote.surface_op.is_none(), "log-only");
    assert!(remote.data["runId"].as_str().unwrap().starts_with("acp-"), "{}", remote.data);
    assert_eq!(
        (&remote.data["provider"], &remote.data["command"], &remote.data["childSessionId"]),
        (&json!("acp:kin"), &json!("kin"), &json!(CHILD_ID))
    );
    assert_eq!((&remote.data["output"], &remote.data["stopReason"]), (&json!("CHILD_VIA_ACP"), &json!("completed")));
    assert!(!remote.data.to_string().contains("--replay"), "no arguments are recorded");
    let result = log.iter().find(|e| e.kind == "tool/result").unwrap();
    assert!(remote.seq < result.seq);
    assert_eq!(result.data["message"]["content"][0]["content"][0]["text"], "CHILD_VIA_ACP");
    // The child's answer reached the parent's next model call; no local child session exists.
    assert_eq!(requests.len(), 2);
    assert_eq!(rt.store().list().len(), 1);
    rt.shutdown().await;
}

/// An agent run by `sh -c SCRIPT` that first records its pid (`exec` keeps it).
fn sh_agent(key: &str, script: &str, pid_file: &Path) -> ExternalAgentConfig {
    let mut agent = ExternalAgentConfig::new(key, "sh");
    agent.args = vec!["-c".into(), format!("echo $$ > '{}'; {script}", pid_file.display())];
    agent.startup_timeout = Duration::from_secs(2);
    agent.cancel_grace = Duration::from_millis(500);
    agent.kill_grace = Duration::from_secs(2);
    agent
}

/// Starts a run that must fail; returns the error and how long it took.
async fn failed_start(dir: &Path, agent: ExternalAgentConfig) -> (SubagentError, Duration) {
    let (rt, _) = runtime(dir, vec![], "");
    let name = agent.name.clone();
    rt.subagents().register_provider(Arc::new(AcpProvider::new(agent, kin::testkit::acp::external_agents()))).unwrap();
    let started = Instant::now();
    let err = rt.subagents().start(&name, request(&workspace(dir))).await.err().expect("the start fails");
    let took = started.elapsed();
    rt.shutdown().await;
    (err, took)
}

fn recorded_pid(pid_file: &Path) -> String {
    std::fs::read_to_string(pid_file).unwrap().trim().to_string()
}

/// Reads one request line and answers it with `result`, echoing its numeric id.
fn answer_first_request(result: &str) -> String {
    format!(
        r#"read line; id=$(printf '%s' "$line" | sed 's/.*"id":\([0-9]*\).*/\1/'); printf '{{"jsonrpc":"2.0","id":%s,"result":{result}}}\n' "$id""#
    )
}

#[tokio::test]
async fn a_missing_command_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let agent = ExternalAgentConfig::new("missing", "/nonexistent/kin-acp-agent");
    let (err, _) = failed_start(dir.path(), agent).await;
    assert_eq!(err.code, ErrorCode::StartFailed);
    assert!(err.message.starts_with("subagent provider \"acp:missing\": cannot start the command"), "{}", err.message);
    assert!(err.message.contains("/nonexistent/kin-acp-agent"), "{}", err.message);
}

#[tokio::test]
async fn a_child_that_exits_at_once_is_a_clear_error_and_is_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let (err, took) = failed_start(dir.path(), sh_agent("exits", "echo dying >&2; exit 3", &pid_file)).await;
    assert_eq!(err.code, ErrorCode::StartFailed);
    assert!(
        err.message.starts_with("subagent provider \"acp:exits\": the child agent exited (exit code 3)"),
        "{}",
        err.message
    );
    assert!(err.message.contains("dying"), "its stderr is quoted: {}", err.message);
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_reaped(&recorded_pid(&pid_file));
}

#[tokio::test]
async fn a_child_answering_garbage_is_a_clear_error_and_is_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = "read x; echo garbage; exec sleep 30";
    let (err, took) = failed_start(dir.path(), sh_agent("garbage", script, &pid_file)).await;
    assert_eq!(err.code, ErrorCode::StartFailed);
    assert!(err.message.contains("wrote a line that is not JSON-RPC: \"garbage\""), "{}", err.message);
    assert!(took < Duration::from_secs(10), "killed after the grace, not after the sleep: {took:?}");
    assert_reaped(&recorded_pid(&pid_file));
}

#[tokio::test]
async fn a_child_hanging_after_initialize_times_out_and_is_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!("{}; exec sleep 30", answer_first_request(r#"{"protocolVersion":1}"#));
    let (err, took) = failed_start(dir.path(), sh_agent("hangs", &script, &pid_file)).await;
    assert_eq!(err.code, ErrorCode::StartFailed);
    assert_eq!(
        err.message, "subagent provider \"acp:hangs\": the child agent did not answer session/new within 2s",
        "{took:?}"
    );
    assert!((Duration::from_secs(2)..Duration::from_secs(10)).contains(&took), "{took:?}");
    assert_reaped(&recorded_pid(&pid_file));
}

#[tokio::test]
async fn a_protocol_version_mismatch_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!("{}; exec cat > /dev/null", answer_first_request(r#"{"protocolVersion":2}"#));
    let (err, took) = failed_start(dir.path(), sh_agent("v2", &script, &pid_file)).await;
    assert_eq!(err.code, ErrorCode::StartFailed);
    assert_eq!(
        err.message,
        "subagent provider \"acp:v2\": the child agent speaks ACP protocol version 2; kin speaks version 1"
    );
    assert!(took < Duration::from_secs(5), "the child exits when its stdin closes: {took:?}");
    assert_reaped(&recorded_pid(&pid_file));
    // A version that is not a number is said as it came, not as missing.
    let script = format!("{}; exec cat > /dev/null", answer_first_request(r#"{"protocolVersion":"1"}"#));
    let (err, _) = failed_start(dir.path(), sh_agent("v2", &script, &pid_file)).await;
    assert_eq!(
        err.message,
        "subagent provider \"acp:v2\": the child agent's initialize answer gives protocolVersion \"1\", not a version number (kin speaks version 1)"
    );
}

#[tokio::test]
async fn cancelling_the_run_cancels_the_kin_child() {
    let dir = tempfile::tempdir().unwrap();
    let replay = replay_dir(dir.path(), "replay-hang", true);
    let child_sessions = dir.path().join("child-sessions");
    let extra = "startup_timeout_secs = 30\ncancel_grace_secs = 5\nkill_grace_secs = 2\n";
    let (rt, _) = runtime(dir.path(), vec![], &kin_agent_toml("kin", &replay, &child_sessions, extra));
    let req = request(&workspace(dir.path()));
    let cancel = req.cancel.clone();
    let run = rt.subagents().start("acp:kin", req).await.unwrap();
    common::until("the child's turn to start", || child_events(&child_sessions).iter().any(|e| e.kind == "step/start"))
        .await;
    let pids = pids_mentioning(replay.to_str().unwrap());
    assert_eq!(pids.len(), 1, "{pids:?}");
    cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(10), run.result).await.unwrap().unwrap().unwrap();
    (run.dispose)().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(result.remote.unwrap().child_session_id, CHILD_ID);
    assert_reaped(&pids[0].to_string());
    let events = child_events(&child_sessions);
    let end = events.iter().rev().find(|e| e.kind == "turn/end").expect("the child's turn ended");
    let reason = end.data["reason"]["kind"].as_str().unwrap().to_string();
    assert!(reason == "aborted" || reason == "disposed", "{reason}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_turn_past_its_timeout_is_an_error_and_the_child_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let replay = replay_dir(dir.path(), "replay-slow", true);
    let child_sessions = dir.path().join("child-sessions");
    let extra = "startup_timeout_secs = 30\nturn_timeout_secs = 1\ncancel_grace_secs = 5\n";
    let (rt, _) = runtime(dir.path(), vec![], &kin_agent_toml("slow", &replay, &child_sessions, extra));
    let run = rt.subagents().start("acp:slow", request(&workspace(dir.path()))).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(20), run.result).await.unwrap().unwrap().unwrap();
    (run.dispose)().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    let error = result.remote.unwrap().error.unwrap();
    assert_eq!(error, "the child agent did not finish its turn within 1s");
    assert!(pids_mentioning(replay.to_str().unwrap()).is_empty(), "the child exited");
    let events = child_events(&child_sessions);
    let end = events.iter().rev().find(|e| e.kind == "turn/end").expect("the child's turn ended");
    assert!(matches!(end.data["reason"]["kind"].as_str(), Some("aborted" | "disposed")), "{}", end.data);
    rt.shutdown().await;
}

/// `[acp_agents.KEY]` running `sh -c SCRIPT`.
fn sh_agent_toml(key: &str, script: &str, extra: &str) -> String {
    let script = serde_json::to_string(script).unwrap();
    format!("[acp_agents.{key}]\ncommand = \"sh\"\nargs = [\"-c\", {script}]\n{extra}")
}

/// The start of every scripted child: `reply LINE RESULT` answers a request, `update JSON`
/// sends a session update of session `s1`; `initialize` and `session/new` (session `s1`) are
/// answered, and the prompt request is read into `$prompt`.
macro_rules! script_child {
    ($rest:literal) => {
        concat!(
            r#"
reply() { id=$(printf '%s' "$1" | sed 's/.*"id":\([0-9]*\).*/\1/'); printf '{"jsonrpc":"2.0","id":%s,"result":%s}\n' "$id" "$2"; }
update() { printf '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":%s}}\n' "$1"; }
read init; reply "$init" '{"protocolVersion":1}'
read new; reply "$new" '{"sessionId":"s1"}'
read prompt
"#,
            $rest
        )
    };
}

/// A child that says `partial` and then refuses its turn.
const REFUSES: &str = script_child!(
    r#"update '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"partial"}}'
reply "$prompt" '{"stopReason":"refusal"}'
"#
);

/// Runs one parent turn that delegates once to `delegate_KEY` (the agent `[acp_agents.KEY]` is
/// `sh -c SCRIPT`) and returns the parent's log; kin is started in `bypass` (a delegation to an
/// external agent asks otherwise).
async fn delegate_once(key: &str, script: &str) -> Vec<Event> {
    delegate_once_in("bypass", key, script).await
}

/// [`delegate_once`], with kin started in permission mode `mode`.
async fn delegate_once_in(mode: &str, key: &str, script: &str) -> Vec<Event> {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![
        ReplayEntry::Chunks(tool_call_response(
            "c1",
            &format!("delegate_{key}"),
            r#"{"description":"the task","prompt":"Do it."}"#,
        )),
        ReplayEntry::Chunks(text_response(&["parent done"])),
    ];
    let config = format!("permission_mode = \"{mode}\"\n{}", sh_agent_toml(key, script, ""));
    let (rt, _) = runtime(dir.path(), entries, &config);
    let id = rt.new_session(&workspace(dir.path()), Arc::new(Quiet)).unwrap();
    let turn = rt.prompt(&id, vec![json!({"type": "text", "text": "go"})]).unwrap();
    assert_eq!(tokio::time::timeout(Duration::from_secs(20), turn).await.unwrap().unwrap(), TurnEnd::Completed);
    let log = rt.store().inspect(&id).unwrap().events;
    rt.shutdown().await;
    log
}

/// An external agent is a process kin cannot see into (its own writes and commands pass no gate
/// of kin's): delegating to it is asked about in `ask` (here with nobody to ask: refused) and
/// refused in `read-only`, and the agent never starts.
#[tokio::test]
async fn delegating_to_an_external_agent_is_asked_about_and_refused_in_read_only() {
    for (mode, code) in [("read-only", "PERMISSION_DENIED"), ("ask", "PERMISSION_REJECTED")] {
        let log = delegate_once_in(mode, "w", WORKS).await;
        let result = log.iter().find(|e| e.kind == "tool/result").expect("the call has a result");
        assert_eq!(result.data["error"]["code"], code, "{mode}: {}", result.data);
        assert!(!log.iter().any(|e| e.kind == "subagent/remote-run"), "{mode}: the agent ran");
    }
}

#[tokio::test]
async fn a_failed_remote_run_is_recorded_in_the_parent_log_too() {
    let log = delegate_once("no", REFUSES).await;
    let remote = log.iter().find(|e| e.kind == "subagent/remote-run").expect("the failed run is recorded");
    assert_eq!(
        (&remote.data["provider"], &remote.data["childSessionId"], &remote.data["output"], &remote.data["stopReason"]),
        (&json!("acp:no"), &json!("s1"), &json!("partial"), &json!("refusal"))
    );
    let result = log.iter().find(|e| e.kind == "tool/result").unwrap();
    assert!(remote.seq < result.seq);
    assert_eq!(result.data["message"]["content"][0]["isError"], true);
    assert_eq!(result.data["error"], json!({"name": "SubagentRunError", "code": "REFUSAL"}));
}

/// A child that asks to write `notes.txt` (an `edit` permission request), then writes it through
/// `fs/write_text_file` (once no file `hold` is left in its working directory), and reports
/// whether kin offered writes, the permission outcome and the write's answer as its output.
const ASKS_TO_WRITE: &str = script_child!(
    r#"say() { text=$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'); printf '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"%s"}}}}\n' "$text"; }
printf '%s\n' '{"jsonrpc":"2.0","id":"perm","method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t1","title":"Write notes.txt","kind":"edit","rawInput":{"path":"notes.txt"}},"options":[{"optionId":"yes","name":"Allow","kind":"allow_once"},{"optionId":"no","name":"Reject","kind":"reject_once"}]}}'
read perm
while [ -e hold ]; do sleep 0.05; done
printf '{"jsonrpc":"2.0","id":"w","method":"fs/write_text_file","params":{"sessionId":"s1","path":"%s/notes.txt","content":"hello"}}\n' "$(pwd -P)"
read wrote
case $init in *'"writeTextFile":true'*) offered=yes;; *) offered=no;; esac
say "writes offered: $offered | $perm | $wrote"
reply "$prompt" '{"stopReason":"end_turn"}'
"#
);

/// The editor of these tests: records each question and gives one answer to all.
struct Editor {
    answer: kin::testkit::permission::PermissionAnswer,
    asked: std::sync::Mutex<Vec<kin::testkit::permission::PermissionRequest>>,
}

impl kin::testkit::permission::PermissionPrompt for Editor {
    fn ask(
        &self,
        request: kin::testkit::permission::PermissionRequest,
    ) -> futures::future::BoxFuture<'static, kin::testkit::permission::PermissionAnswer> {
        self.asked.lock().unwrap().push(request);
        let answer = self.answer;
        Box::pin(async move { answer })
    }
}

/// A runtime whose agent `acp:fw` runs `ASKS_TO_WRITE` under `permission = "forward"`, with an
/// editor giving `answer` connected, and a request to start it from the workspace on the
/// delegating call `call-7`.
struct Forwarding {
    rt: Arc<Runtime>,
    editor: Arc<Editor>,
    request: StartRequest,
    cwd: PathBuf,
    /// The delegating parent, when it is a live session of `rt`.
    parent: Option<String>,
}

/// [`Forwarding`] in `dir`. With `mode`, the delegating parent is a live top-level session in
/// that permission mode; without, a parent this runtime does not hold.
fn forwarding(
    dir: &Path,
    answer: kin::testkit::permission::PermissionAnswer,
    mode: Option<kin::testkit::permission::PermissionMode>,
) -> Forwarding {
    let (rt, _) = runtime(dir, vec![], &sh_agent_toml("fw", ASKS_TO_WRITE, "permission = \"forward\"\n"));
    let editor = Arc::new(Editor { answer, asked: Default::default() });
    rt.connect_client(kin::testkit::runtime::ClientLink {
        prompt: Some(editor.clone()),
        files: None,
        terminals: None,
        children: None,
    });
    let cwd = workspace(dir);
    let mut start = request(&cwd);
    start.call_id = Some("call-7".into());
    let parent = mode.map(|mode| {
        let id = rt.new_session(&cwd, Arc::new(Quiet)).unwrap();
        rt.set_permission_mode(&id, mode).unwrap();
        let header = rt.store().inspect(&id).unwrap().header;
        start.parent = Arc::new(Caller { header, ..(*start.parent).clone() });
        id
    });
    Forwarding { rt, editor, request: start, cwd, parent }
}

/// Runs `ASKS_TO_WRITE` as [`forwarding`] sets it up; returns the run's output, the editor's
/// questions and the workspace.
async fn forwarded(
    dir: &Path,
    answer: kin::testkit::permission::PermissionAnswer,
    mode: Option<kin::testkit::permission::PermissionMode>,
) -> (String, Vec<kin::testkit::permission::PermissionRequest>, PathBuf) {
    let Forwarding { rt, editor, request, cwd, .. } = forwarding(dir, answer, mode);
    let run = rt.subagents().start("acp:fw", request).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(20), run.result).await.unwrap().unwrap().unwrap();
    (run.dispose)().await.unwrap();
    rt.shutdown().await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    let asked = editor.asked.lock().unwrap().clone();
    (result.output, asked, cwd)
}

#[tokio::test]
async fn forward_asks_the_parent_editor_and_an_allowed_edit_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (output, asked, cwd) = forwarded(dir.path(), kin::testkit::permission::PermissionAnswer::AllowOnce, None).await;
    assert!(output.starts_with("writes offered: yes | "), "{output}");
    assert!(output.contains(r#""outcome":{"outcome":"selected","optionId":"yes"}"#), "{output}");
    assert!(output.contains(r#""id":"w","result":null"#), "{output}");
    assert_eq!(std::fs::read_to_string(cwd.join("notes.txt")).unwrap(), "hello");
    // One question (the write rode on the allowed edit), on the parent's session and the
    // delegating tool call, naming the provider.
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!((asked[0].session_id.as_str(), asked[0].call_id.as_str()), ("parent-1", "call-7"));
    assert_eq!(asked[0].title, "acp:fw: Write notes.txt");
    // The delegating call's own title, for the editor to show again once answered.
    let call = asked[0].on_behalf_of.clone().expect("the delegating call");
    assert_eq!((call.title.as_str(), call.tool.as_str()), ("delegate_fw: ask kin", "delegate_fw"));
    assert_eq!((asked[0].tool.as_str(), &asked[0].raw_input), ("edit", &json!({"path": "notes.txt"})));
}

/// An editor that never answers (the user is away); counts the questions.
struct Away(std::sync::atomic::AtomicUsize);

impl kin::testkit::permission::PermissionPrompt for Away {
    fn ask(
        &self,
        _: kin::testkit::permission::PermissionRequest,
    ) -> futures::future::BoxFuture<'static, kin::testkit::permission::PermissionAnswer> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(futures::future::pending())
    }
}

/// A child that asks permission, then dies while the question is open: the run ends at once,
/// saying how the child ended, instead of waiting for an answer nobody can use.
#[tokio::test]
async fn a_child_that_dies_while_its_question_is_open_ends_the_run() {
    const ASKS_THEN_DIES: &str = script_child!(
        r#"printf '%s\n' '{"jsonrpc":"2.0","id":"perm","method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t1","title":"Write notes.txt","kind":"edit","rawInput":{"path":"notes.txt"}},"options":[{"optionId":"yes","name":"Allow","kind":"allow_once"}]}}'
while [ ! -e asked ]; do sleep 0.02; done
echo "died on purpose" >&2
exit 9
"#
    );
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![], &sh_agent_toml("dies", ASKS_THEN_DIES, "permission = \"forward\"\n"));
    let away = Arc::new(Away(Default::default()));
    rt.connect_client(kin::testkit::runtime::ClientLink {
        prompt: Some(away.clone()),
        files: None,
        terminals: None,
        children: None,
    });
    let cwd = workspace(dir.path());
    let run = rt.subagents().start("acp:dies", request(&cwd)).await.unwrap();
    // The child dies only once its question reached the editor.
    common::until("the question to reach the editor", || away.0.load(std::sync::atomic::Ordering::SeqCst) == 1).await;
    std::fs::write(cwd.join("asked"), "").unwrap();
    let result =
        tokio::time::timeout(Duration::from_secs(20), run.result).await.expect("the run ends").unwrap().unwrap();
    (run.dispose)().await.unwrap();
    rt.shutdown().await;
    assert_eq!(result.stop_reason, StopReason::Error);
    let failure = result.failure.unwrap_or_default();
    assert!(failure.contains("exit code 9") && failure.contains("died on purpose"), "{failure}");
    assert!(
        failure.starts_with("subagent provider \"acp:dies\": the child agent exited"),
        "names the agent: {failure}"
    );
}

#[tokio::test]
async fn forward_passes_a_rejection_on_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (output, asked, cwd) =
        forwarded(dir.path(), kin::testkit::permission::PermissionAnswer::RejectOnce, None).await;
    assert!(output.contains(r#""outcome":{"outcome":"selected","optionId":"no"}"#), "{output}");
    assert!(output.contains("the user rejected writing"), "{output}");
    assert!(!cwd.join("notes.txt").exists());
    // The write without an allowed edit was asked about on its own.
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(asked[1].title, format!("acp:fw: Write {}/notes.txt", cwd.canonicalize().unwrap().display()));
}

#[tokio::test]
async fn forward_lets_the_parent_session_mode_answer_before_the_editor() {
    use kin::testkit::permission::{PermissionAnswer, PermissionMode};
    // The editor would reject everything: in bypass the mode allows the edit and the write
    // without asking; in read-only it rejects both without asking.
    for (mode, option, written) in [(PermissionMode::Bypass, "yes", true), (PermissionMode::ReadOnly, "no", false)] {
        let dir = tempfile::tempdir().unwrap();
        let (output, asked, cwd) = forwarded(dir.path(), PermissionAnswer::RejectOnce, Some(mode)).await;
        let outcome = format!(r#""outcome":{{"outcome":"selected","optionId":"{option}"}}"#);
        assert!(output.contains(&outcome), "{mode:?}: {output}");
        assert_eq!(cwd.join("notes.txt").exists(), written, "{mode:?}: {output}");
        assert!(asked.is_empty(), "{mode:?}: {asked:?}");
    }
}

#[tokio::test]
async fn read_only_refuses_a_write_the_editor_allowed_always_before() {
    use kin::testkit::permission::{PermissionAnswer, PermissionMode};
    // In `ask`, the editor allows the child's edit always; the session is switched to read-only
    // before the child writes.
    let dir = tempfile::tempdir().unwrap();
    let Forwarding { rt, editor, request, cwd, parent } =
        forwarding(dir.path(), PermissionAnswer::AllowAlways, Some(PermissionMode::Ask));
    std::fs::write(cwd.join("hold"), "").unwrap();
    let run = rt.subagents().start("acp:fw", request).await.unwrap();
    until("the editor is asked about the edit", || editor.asked.lock().unwrap().len() == 1).await;
    rt.set_permission_mode(&parent.unwrap(), PermissionMode::ReadOnly).unwrap();
    std::fs::remove_file(cwd.join("hold")).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(20), run.result).await.unwrap().unwrap().unwrap();
    (run.dispose)().await.unwrap();
    rt.shutdown().await;
    let output = result.output;
    assert!(output.contains(r#""outcome":{"outcome":"selected","optionId":"yes"}"#), "the edit was allowed: {output}");
    assert!(output.contains(r#""id":"w","error""#), "the write is refused: {output}");
    assert!(output.contains("the session's permission mode refuses writing"), "{output}");
    assert!(!cwd.join("notes.txt").exists(), "nothing is written");
    assert_eq!(editor.asked.lock().unwrap().len(), 1, "the write is not asked about");
}

#[tokio::test]
async fn allow_reads_offers_no_writes_and_rejects_the_edit_without_asking() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), vec![], &sh_agent_toml("ro", ASKS_TO_WRITE, "permission = \"allow-reads\"\n"));
    let editor =
        Arc::new(Editor { answer: kin::testkit::permission::PermissionAnswer::AllowOnce, asked: Default::default() });
    rt.connect_client(kin::testkit::runtime::ClientLink {
        prompt: Some(editor.clone()),
        files: None,
        terminals: None,
        children: None,
    });
    let cwd = workspace(dir.path());
    let run = rt.subagents().start("acp:ro", request(&cwd)).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(20), run.result).await.unwrap().unwrap().unwrap();
    (run.dispose)().await.unwrap();
    rt.shutdown().await;
    let output = result.output;
    assert!(output.starts_with("writes offered: no | "), "{output}");
    assert!(output.contains(r#""outcome":{"outcome":"selected","optionId":"no"}"#), "{output}");
    assert!(output.contains("writing files is refused"), "{output}");
    assert!(!cwd.join("notes.txt").exists());
    assert!(editor.asked.lock().unwrap().is_empty(), "allow-reads never asks the editor");
}

/// A child that starts one tool call of its own, then answers `done`.
const WORKS: &str = script_child!(
    r#"update '{"sessionUpdate":"tool_call","toolCallId":"t1","title":"Run cargo test","kind":"execute","status":"pending"}'
update '{"sessionUpdate":"tool_call","toolCallId":"t2","title":"","kind":"other","status":"pending"}'
update '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"done"}}'
reply "$prompt" '{"stopReason":"end_turn"}'
"#
);

#[tokio::test]
async fn the_child_tool_calls_show_as_progress_on_the_delegating_call() {
    let log = delegate_once("w", WORKS).await;
    let kinds: Vec<&str> = log.iter().map(|e| e.kind.as_str()).collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap_or_else(|| panic!("no {kind}: {kinds:?}"));
    assert!(at("tool/call") < at("tool/progress") && at("tool/progress") < at("tool/result"), "{kinds:?}");
    let progress: Vec<&Value> = log.iter().filter(|e| e.kind == "tool/progress").map(|e| e.data.value()).collect();
    // One report: the untitled call says nothing.
    assert_eq!(progress, [&json!({"turn": 1, "step": 1, "callId": "c1", "text": "acp:w: Run cargo test"})]);
    assert!(log.iter().find(|e| e.kind == "tool/progress").unwrap().surface_op.is_none(), "log-only");
}
