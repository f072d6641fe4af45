//! The permission gate in the agent loop, with the real coding tools in a temporary workspace:
//! each mode end to end through a prompt that answers like an editor would, rejected calls that
//! never run, and the diff a write records for the editor; and with a sandbox, commands it
//! confines that need no question and escalations out of it that do.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::BoxFuture;
use kin::testkit::agent::{AgentDeps, AgentHandle, TurnEnd, spawn_agent};
use kin::testkit::model::script::{ReplayEntry, ScriptedModel};
use kin::testkit::model::{Model, ModelRoute, text_response, tool_call_response};
use kin::testkit::permission::{
    Decision, PermissionAnswer, PermissionMode, PermissionPrompt, PermissionRequest, Permissions,
};
use kin::testkit::sandbox::{SandboxPolicy, SandboxSettings, SessionSandbox, landlock_for_tests};
use kin::testkit::session::{Event, SessionHeader, SessionStore};
use kin::testkit::tools::bash::BashTool;
use kin::testkit::tools::builtin::register_coding_tools;
use kin::testkit::tools::fs::FileState;
use kin::testkit::tools::{Access, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
use serde_json::{Value, json};

/// Answers from a list (then dismisses), recording what it was asked.
#[derive(Default)]
struct Editor {
    answers: Mutex<Vec<PermissionAnswer>>,
    asked: Mutex<Vec<PermissionRequest>>,
}

impl PermissionPrompt for Editor {
    fn ask(&self, request: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
        self.asked.lock().unwrap().push(request);
        let mut answers = self.answers.lock().unwrap();
        let answer = if answers.is_empty() { PermissionAnswer::Dismissed } else { answers.remove(0) };
        async move { answer }.boxed()
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
    store: SessionStore,
    handle: AgentHandle,
    editor: Arc<Editor>,
    permissions: Arc<Permissions>,
    id: String,
}

/// A session in `ws/` (holding `notes.txt`) beside `outside/` (holding `secret.txt`), whose model
/// makes one tool call and then answers "done".
fn start(mode: PermissionMode, call: (&str, Value), answers: &[PermissionAnswer]) -> Fixture {
    start_with(mode, call, answers, None)
}

/// `start`, with one more tool registered beside the coding tools.
fn start_with(
    mode: PermissionMode,
    call: (&str, Value),
    answers: &[PermissionAnswer],
    extra: Option<Arc<dyn Tool>>,
) -> Fixture {
    build(mode, SandboxPolicy::OFF, call, answers, extra)
}

/// [`start`] with the session's commands in the sandbox `policy`.
fn start_in(mode: PermissionMode, policy: SandboxPolicy, call: (&str, Value), answers: &[PermissionAnswer]) -> Fixture {
    build(mode, policy, call, answers, None)
}

fn build(
    mode: PermissionMode,
    policy: SandboxPolicy,
    call: (&str, Value),
    answers: &[PermissionAnswer],
    extra: Option<Arc<dyn Tool>>,
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let ws = root.join("ws");
    let outside = root.join("outside");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(ws.join("notes.txt"), "hello\n").unwrap();
    std::fs::write(outside.join("secret.txt"), "secret\n").unwrap();
    let store = SessionStore::new(dir.path().join("sessions"));
    let id = "cccccccc-0000-4000-8000-000000000001".to_string();
    let session = store.create(SessionHeader::new(id.clone(), 1, Some(ws.display().to_string()))).unwrap();
    let (name, arguments) = call;
    let model = Arc::new(ScriptedModel::new(vec![
        ReplayEntry::Chunks(tool_call_response("c1", name, &arguments.to_string())),
        ReplayEntry::Chunks(text_response(&["done"])),
    ]));
    let mut tools = ToolRegistry::new();
    register_coding_tools(&mut tools, FileState::new());
    let settings = SandboxSettings { policy, ..Default::default() };
    let sandbox = Arc::new(SessionSandbox::restored(Arc::new(settings), None));
    tools.register(Arc::new(BashTool::with_sandbox(sandbox, Some(ws.clone()))));
    if let Some(tool) = extra {
        tools.register(tool);
    }
    let editor = Arc::new(Editor { answers: Mutex::new(answers.to_vec()), asked: Mutex::new(Vec::new()) });
    let permissions = Arc::new(Permissions::new(mode));
    let deps = AgentDeps {
        model: model as Arc<dyn Model>,
        tools,
        route: ModelRoute::parse("test/model").unwrap(),
        system: String::new(),
        max_steps: 5,
        max_parallel_tools: 4,
        depth: 0,
        permissions: Some(permissions.clone()),
        prompt: Some(editor.clone() as Arc<dyn PermissionPrompt>),
        file_access: None,
        retry: Default::default(),
        compaction: Default::default(),
    };
    let handle = spawn_agent(session, deps);
    Fixture { _dir: dir, ws, outside, store, handle, editor, permissions, id }
}

impl Fixture {
    /// Runs one prompt and returns the single tool result event.
    async fn run(&self) -> Event {
        let end = self
            .handle
            .followup(vec![json!({"type": "text", "text": "go"})], json!({"kind": "user"}))
            .unwrap()
            .await
            .unwrap();
        assert_eq!(end, TurnEnd::Completed);
        self.handle.flush().await.unwrap();
        let events = self.store.inspect(&self.id).unwrap().events;
        events.into_iter().find(|e| e.kind == "tool/result").expect("a tool result")
    }

    fn asked(&self) -> Vec<PermissionRequest> {
        self.editor.asked.lock().unwrap().clone()
    }
}

fn result_text(event: &Event) -> &str {
    event.data["message"]["content"][0]["content"][0]["text"].as_str().unwrap()
}

fn is_error(event: &Event) -> bool {
    event.data["message"]["content"][0]["isError"] == true
}

fn write_call(path: &str) -> (&'static str, Value) {
    ("write", json!({"file_path": path, "content": "new\n"}))
}

fn exists(path: &Path) -> bool {
    path.exists()
}

#[tokio::test]
async fn ask_mode_rejected_write_never_runs() {
    let f = start(PermissionMode::Ask, write_call("made.txt"), &[PermissionAnswer::RejectOnce]);
    let result = f.run().await;
    assert!(is_error(&result));
    assert_eq!(result_text(&result), "Error: the user rejected this write call");
    assert_eq!(result.data["error"]["code"], "PERMISSION_REJECTED");
    assert!(!exists(&f.ws.join("made.txt")), "the write did not run");
    let asked = f.asked();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].call_id, "c1");
    assert_eq!(asked[0].session_id, f.id);
    assert_eq!(asked[0].title, "Write made.txt");
}

#[tokio::test]
async fn ask_mode_allowed_write_runs_and_records_a_diff() {
    let f = start(PermissionMode::Ask, write_call("made.txt"), &[PermissionAnswer::AllowOnce]);
    let result = f.run().await;
    assert!(!is_error(&result), "{}", result_text(&result));
    assert_eq!(std::fs::read_to_string(f.ws.join("made.txt")).unwrap(), "new\n");
    let diff = &result.data["meta"]["diff"];
    assert_eq!(diff["path"], f.ws.join("made.txt").display().to_string());
    assert_eq!(diff["oldText"], Value::Null);
    assert_eq!(diff["newText"], "new\n");
}

#[tokio::test]
async fn a_dismissed_request_is_a_rejection() {
    let f = start(PermissionMode::Ask, write_call("made.txt"), &[]);
    let result = f.run().await;
    assert_eq!(result_text(&result), "Error: the user rejected this write call");
    assert!(!exists(&f.ws.join("made.txt")));
}

#[tokio::test]
async fn accept_edits_writes_without_asking_but_asks_for_bash() {
    let f = start(PermissionMode::AcceptEdits, write_call("made.txt"), &[]);
    let result = f.run().await;
    assert!(!is_error(&result), "{}", result_text(&result));
    assert!(f.asked().is_empty());
    let bash = ("bash", json!({"command": "echo ran > ran.txt", "description": "Write a marker"}));
    let f = start(PermissionMode::AcceptEdits, bash, &[PermissionAnswer::RejectOnce]);
    let result = f.run().await;
    assert_eq!(result_text(&result), "Error: the user rejected this bash call");
    assert!(!exists(&f.ws.join("ran.txt")), "the command did not run");
    assert_eq!(f.asked().len(), 1);
}

#[tokio::test]
async fn read_only_refuses_writes_and_commands_without_asking() {
    let f = start(PermissionMode::ReadOnly, write_call("made.txt"), &[]);
    let result = f.run().await;
    assert_eq!(result_text(&result), "Error: write is not allowed in read-only mode");
    assert_eq!(result.data["error"]["code"], "PERMISSION_DENIED");
    assert!(!exists(&f.ws.join("made.txt")));
    assert!(f.asked().is_empty());
    let read = ("read", json!({"file_path": "notes.txt"}));
    let f = start(PermissionMode::ReadOnly, read, &[]);
    let result = f.run().await;
    assert!(result_text(&result).contains("1: hello"), "reads still work");
}

#[tokio::test]
async fn bypass_runs_commands_and_outside_reads() {
    let bash = ("bash", json!({"command": "echo BYPASS_OK", "description": "Say it"}));
    let f = start(PermissionMode::Bypass, bash, &[]);
    let result = f.run().await;
    assert!(result_text(&result).contains("BYPASS_OK"), "{}", result_text(&result));
    assert!(f.asked().is_empty());
    let read = ("read", json!({"file_path": "../outside/secret.txt"}));
    let f = start(PermissionMode::Bypass, read, &[]);
    let result = f.run().await;
    assert!(result_text(&result).contains("1: secret"), "{}", result_text(&result));
}

#[tokio::test]
async fn an_outside_read_asks_and_runs_once_allowed() {
    let read = ("read", json!({"file_path": "../outside/secret.txt"}));
    let f = start(PermissionMode::Ask, read, &[PermissionAnswer::AllowOnce]);
    let result = f.run().await;
    assert!(result_text(&result).contains("1: secret"), "{}", result_text(&result));
    let asked = f.asked();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].title.contains("outside the workspace"), "{}", asked[0].title);
    assert!(f.outside.join("secret.txt").exists());
    // A read inside the workspace never asks.
    let read = ("read", json!({"file_path": "notes.txt"}));
    let f = start(PermissionMode::Ask, read, &[]);
    f.run().await;
    assert!(f.asked().is_empty());
    assert_eq!(f.permissions.mode(), PermissionMode::Ask);
}

/// A tool kin has never heard of, as an MCP server would offer one: it says only that it does
/// something kin cannot see into, and counts how often it ran.
struct Unheard {
    runs: Arc<std::sync::atomic::AtomicUsize>,
}

impl Tool for Unheard {
    fn name(&self) -> &str {
        "launch_rockets"
    }
    fn description(&self) -> String {
        "Does something kin cannot see into.".into()
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"count": {"type": "number"}}})
    }
    fn access(&self, _arguments: &Value) -> Access {
        Access::External
    }
    fn execute(&self, _arguments: Value, _ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Ok(ToolOutput::text("launched")) }.boxed()
    }
}

#[tokio::test]
async fn a_new_tool_that_declares_external_access_is_asked_about_or_refused_and_never_runs_unallowed() {
    use PermissionAnswer::{AllowOnce, RejectOnce};
    // mode, the editor's answer, then: asked, ran, the result's error code.
    let cases = [
        (PermissionMode::ReadOnly, None, false, false, Some("PERMISSION_DENIED")),
        (PermissionMode::Ask, Some(RejectOnce), true, false, Some("PERMISSION_REJECTED")),
        (PermissionMode::Ask, Some(AllowOnce), true, true, None),
        (PermissionMode::AcceptEdits, Some(RejectOnce), true, false, Some("PERMISSION_REJECTED")),
        (PermissionMode::Bypass, None, false, true, None),
    ];
    for (mode, answer, asked, ran, code) in cases {
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tool: Arc<dyn Tool> = Arc::new(Unheard { runs: runs.clone() });
        let answers: Vec<PermissionAnswer> = answer.into_iter().collect();
        let f = start_with(mode, ("launch_rockets", json!({"count": 3})), &answers, Some(tool));
        let result = f.run().await;
        assert_eq!(result.data["error"]["code"].as_str(), code, "{mode:?}: {}", result_text(&result));
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), usize::from(ran), "{mode:?}: ran");
        let questions = f.asked();
        assert_eq!(questions.len(), usize::from(asked), "{mode:?}: asked");
        if let Some(question) = questions.first() {
            assert_eq!((question.tool.as_str(), question.title.as_str()), ("launch_rockets", "launch_rockets"));
            assert_eq!(question.access, Access::External);
        }
    }
    let f = start_with(
        PermissionMode::ReadOnly,
        ("launch_rockets", json!({})),
        &[],
        Some(Arc::new(Unheard { runs: Default::default() })),
    );
    assert_eq!(result_text(&f.run().await), "Error: launch_rockets is not allowed in read-only mode");
}

// ---------------------------------------------------------------------------------------------
// the sandbox: fewer questions, and escalations that ask

fn sandbox(id: &str) -> SandboxPolicy {
    SandboxPolicy::parse(id).unwrap()
}

fn bash_call(command: &str, description: &str, escalate: bool) -> (&'static str, Value) {
    let mut args = json!({"command": command, "description": description});
    if escalate {
        args["sandbox"] = json!("off");
    }
    ("bash", args)
}

#[tokio::test]
async fn a_command_the_sandbox_confines_runs_without_a_question_in_ask_and_accept_edits() {
    if !landlock_for_tests() {
        return;
    }
    for mode in [PermissionMode::Ask, PermissionMode::AcceptEdits] {
        let f = start_in(mode, sandbox("workspace-write"), bash_call("echo x > made.txt && echo ran", "d", false), &[]);
        let result = f.run().await;
        assert!(f.asked().is_empty(), "{mode:?}: {:?}", f.asked());
        assert_eq!(result_text(&result), "ran\n");
        assert!(exists(&f.ws.join("made.txt")));
    }
    // Read-only mode stays read-only, sandbox or not.
    let f = start_in(PermissionMode::ReadOnly, sandbox("workspace-write"), bash_call("true", "d", false), &[]);
    let result = f.run().await;
    assert!(f.asked().is_empty() && is_error(&result));
    assert_eq!(result.data["error"]["code"], "PERMISSION_DENIED");
}

/// An escalation is asked about every time: the editor is offered no "always" for it, and an
/// "Allow always" for bash given while no sandbox was on (every command asked then) does not let a
/// later command leave the sandbox unasked.
#[tokio::test]
async fn no_always_answer_lets_an_escalation_out_of_the_sandbox_unasked() {
    if !landlock_for_tests() {
        return;
    }
    let command = "echo x > ../outside/escaped && echo wrote";
    let call = bash_call(command, "Write the build cache", true);
    let f = start_in(PermissionMode::Ask, sandbox("workspace-write"), call, &[PermissionAnswer::RejectOnce]);
    // Before the sandbox was on, the user said "Allow always" to a plain command.
    let plain = Access::Execute { command: "make".into(), workdir: None };
    let Decision::Ask(question) = f.permissions.decide("bash", &plain, &f.ws) else {
        panic!("a command asks in ask mode")
    };
    f.permissions.answer(&question, PermissionAnswer::AllowAlways);
    let result = f.run().await;
    let asked = f.asked();
    assert_eq!(asked.len(), 1, "the escalation was asked about");
    assert!(!asked[0].keeps_always, "no \"always\" is offered for an escalation");
    assert_eq!(result.data["error"]["code"], "PERMISSION_REJECTED");
    assert!(!exists(&f.outside.join("escaped")), "the escalation ran unasked");
}

#[tokio::test]
async fn an_escalation_asks_with_its_reason_and_a_rejected_one_never_runs() {
    if !landlock_for_tests() {
        return;
    }
    let command = "echo x > ../outside/escaped && echo wrote";
    let call = bash_call(command, "Write the build cache", true);
    let f = start_in(PermissionMode::Ask, sandbox("workspace-write"), call, &[PermissionAnswer::RejectOnce]);
    let result = f.run().await;
    let asked = f.asked();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].title.contains("outside the sandbox (reason: Write the build cache)"), "{}", asked[0].title);
    assert_eq!(result.data["error"]["code"], "PERMISSION_REJECTED");
    assert!(!exists(&f.outside.join("escaped")), "a rejected escalation ran");
    // Allowed, it runs outside the sandbox.
    let call = bash_call(command, "Write the build cache", true);
    let f = start_in(PermissionMode::AcceptEdits, sandbox("workspace-write"), call, &[PermissionAnswer::AllowOnce]);
    let result = f.run().await;
    assert_eq!(f.asked().len(), 1);
    assert_eq!(result_text(&result), "wrote\n");
    assert!(exists(&f.outside.join("escaped")));
    assert_eq!(
        result.data["meta"]["sandbox"],
        "not sandboxed: the user allowed this command to run outside the sandbox"
    );
    // The same write inside the sandbox is refused by the kernel and named.
    let f = start_in(PermissionMode::Ask, sandbox("workspace-write"), bash_call(command, "d", false), &[]);
    let result = f.run().await;
    assert!(f.asked().is_empty());
    assert!(!exists(&f.outside.join("escaped")));
    let blocked = format!("blocked by the sandbox: {}", f.outside.join("escaped").display());
    assert!(result_text(&result).contains(&blocked), "{}", result_text(&result));
}
